"""Helpers of the end-to-end suite: a real etcd + kube-apiserver on loopback, fake GPU nodes, pods, checks.

The control plane comes from the workplace's shared tool ``../shared/tools/kube-control-plane`` (``start.sh``
prints a kubeconfig; ``stop.sh DIR --rm`` ends exactly what it started). What the tool does not offer is
done here, on the state directory it writes:

* :meth:`ControlPlane.kill_apiserver` / :meth:`ControlPlane.start_apiserver`: end only the kube-apiserver
  (etcd and its data stay) and run it again with the very command line it had (read from
  ``/proc/PID/cmdline`` before the kill), same port, certificates and token file; the ``pids`` file is
  updated so that ``stop.sh`` still ends it;
* :meth:`ControlPlane.compact_etcd`: compact etcd to its current revision through etcd's v3 JSON gateway
  (``POST /v3/kv/compaction`` on the loopback client port), no ``etcdctl`` needed.

Nothing here listens on anything but 127.0.0.1 (start.sh binds etcd and the apiserver to loopback; the
scheduler subprocesses run with ``--metrics-bind-address 0``, i.e. no metrics server).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import ssl
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.wire import drain

REPO = Path(__file__).resolve().parents[2]
KCP_TOOLS = Path(os.environ.get("KCP_TOOLS") or REPO / ".." / "shared" / "tools" / "kube-control-plane")
E2E_LABEL = "gpupool-e2e"
SCHEDULER_NAME = "gpupool"
SA_NAMESPACE = "gpupool-system"
SA_NAME = "gpupool-scheduler"
LEASE_NAME = "gpupool-scheduler"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}
A100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
MERGE = "application/merge-patch+json"
RESULTS: dict[str, Any] = {}  # figures the tests measured: the run's summary and e2e_live.json


class TimeoutExpired(AssertionError):
    pass


def wait_for(fn: Callable[[], Any], timeout: float, what: str, interval: float = 0.1,
             detail: Callable[[], str] | None = None) -> Any:
    """Poll ``fn`` until it returns something truthy; AssertionError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while True:
        try:
            value = fn()
            if value:
                return value
        except Exception as exc:  # API down, connection reset: keep polling
            last_exc = exc
        if time.monotonic() > deadline:
            extra = detail() if detail is not None else ""
            raise TimeoutExpired(f"timed out after {timeout:g}s waiting for {what}"
                                 + (f" (last error: {last_exc!r})" if last_exc else "")
                                 + (f"\n{extra}" if extra else ""))
        time.sleep(interval)


# ------------------------------------------------------------------ the control plane
class ControlPlane:
    """One etcd + kube-apiserver started by the shared tool's start.sh."""

    def __init__(self, kubeconfig: Path, startup_s: float) -> None:
        self.kubeconfig = kubeconfig
        self.dir = kubeconfig.parent
        env = dict(line.strip().split("=", 1) for line in (self.dir / "env").read_text().splitlines() if "=" in line)
        self.server = env["KCP_SERVER"]
        self.token = env["KCP_TOKEN"]
        self.etcd = env["KCP_ETCD"]
        self.startup_s = startup_s
        self._ssl = ssl._create_unverified_context()  # noqa: S323 - self-signed loopback apiserver
        self._argv: list[str] | None = None
        self._proc: subprocess.Popen | None = None  # the apiserver started by start_apiserver
        self._log_from = 0  # where its output begins in apiserver.log
        self.restarts = 0

    @classmethod
    def start(cls, with_parts: str | None = None) -> ControlPlane:
        """start.sh; ``with_parts``: its ``KCP_WITH`` (default: the environment's)."""
        t0 = time.monotonic()
        env = {**os.environ, **({"KCP_WITH": with_parts} if with_parts is not None else {})}
        proc = subprocess.run([str(KCP_TOOLS / "start.sh")], capture_output=True, text=True, timeout=240,
                              env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"start.sh exited {proc.returncode}: {proc.stderr[-2000:]}")
        sys.stderr.write(proc.stderr)
        return cls(Path(proc.stdout.strip().splitlines()[-1]), time.monotonic() - t0)

    def stop(self, remove: bool = True) -> None:
        subprocess.run([str(KCP_TOOLS / "stop.sh"), str(self.dir)] + (["--rm"] if remove else []),
                       capture_output=True, timeout=60, check=False)

    # -- raw HTTP (what the wire says, without the client's interpretation)
    def http(self, method: str, path: str, body: Any = None, timeout: float = 5.0,
             token: str | None = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.token}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def ready(self) -> bool:
        try:
            return self.http("GET", "/readyz", timeout=2) == (200, "ok")
        except OSError:
            return False

    def version(self) -> dict[str, Any]:
        return json.loads(self.http("GET", "/version")[1])

    # -- the apiserver process
    def _pids(self) -> list[tuple[int, str]]:
        return [(int(p), n) for p, n in (line.split() for line in (self.dir / "pids").read_text().splitlines()
                                          if line.strip())]

    def runs(self, part: str) -> bool:
        """Whether start.sh started ``part`` (``kube-controller-manager``, ``kube-scheduler``...: ``KCP_WITH``)."""
        return any(n == part for _, n in self._pids())

    def apiserver_pid(self) -> int:
        return next(p for p, n in self._pids() if n == "kube-apiserver")

    def _ours(self, pid: int) -> bool:
        try:
            return str(self.dir) in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False

    def kill_apiserver(self, sig: int = signal.SIGKILL) -> float:
        """End only the kube-apiserver (default SIGKILL: a crash); returns the monotonic time of the kill."""
        pid = self.apiserver_pid()
        assert self._ours(pid), f"pid {pid} is not this control plane's apiserver"
        self._argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        t = time.monotonic()
        os.kill(pid, sig)
        wait_for(lambda: not self._alive(pid), 60, f"kube-apiserver pid {pid} to exit", interval=0.02)
        return t

    @staticmethod
    def _alive(pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    def start_apiserver(self) -> float:
        """Run the apiserver again with its previous command line (same port, certs, etcd); returns at once."""
        assert self._argv, "kill_apiserver first"
        self._spawn_apiserver()
        self.restarts += 1
        return time.monotonic()

    def _spawn_apiserver(self) -> None:
        log_path = self.dir / "apiserver.log"
        self._log_from = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self._proc = subprocess.Popen(self._argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                          start_new_session=True)
        lines = [f"{p} {n}" for p, n in self._pids() if n != "kube-apiserver"] + [f"{self._proc.pid} kube-apiserver"]
        (self.dir / "pids").write_text("\n".join(lines) + "\n")

    def _ready_or_respawn(self) -> bool:
        """``ready()``; a restarted apiserver that exited because its port was still taken (the killed one's
        socket not yet released: seen once in four e2e runs) is started again, as an operator's restart would be."""
        if self.ready():
            return True
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            with open(self.dir / "apiserver.log", "rb") as f:
                f.seek(self._log_from)
                tail = f.read().decode(errors="replace")
            if "address already in use" in tail:
                time.sleep(0.2)
                self._spawn_apiserver()
        return False

    def wait_ready(self, timeout: float = 60) -> None:
        wait_for(self._ready_or_respawn, timeout, "kube-apiserver /readyz", interval=0.05,
                 detail=lambda: (self.dir / "apiserver.log").read_text(errors="replace")[-2000:])

    # -- etcd
    def _etcd(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(self.etcd + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def etcd_revision(self) -> int:
        return int(self._etcd("/v3/kv/range", {"key": "Zg=="})["header"]["revision"])

    def compact_etcd(self) -> int:
        rev = self.etcd_revision()
        self._etcd("/v3/kv/compaction", {"revision": rev, "physical": True})
        return rev


def write_leader_config(path: Path, lease: dict[str, float]) -> Path:
    """A scheduler configuration file with leader election on the suite's Lease (``lease``: duration, renew and
    retry seconds)."""
    path.write_text(textwrap.dedent(f"""\
        apiVersion: gpupool.io/v1alpha1
        kind: GpupoolSchedulerConfiguration
        leaderElection:
          leaderElect: true
          resourceNamespace: {SA_NAMESPACE}
          resourceName: {LEASE_NAME}
          leaseDuration: {lease['duration']}s
          renewDeadline: {lease['renew']}s
          retryPeriod: {lease['retry']}s
        profiles:
          - schedulerName: {SCHEDULER_NAME}
        """))
    return path


def admin_client(cp: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cp.kubeconfig))


def token_kubeconfig(cp: ControlPlane, token: str, path: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "kcp", "cluster": {"server": cp.server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "sa", "user": {"token": token}}],
        "contexts": [{"name": "sa", "context": {"cluster": "kcp", "user": "sa"}}],
        "current-context": "sa",
    }))
    path.chmod(0o600)
    return path


# ------------------------------------------------------------------ deploy/
def deploy_objects() -> list[dict[str, Any]]:
    """The objects of deploy/kustomization.yaml, rendered as kustomize would (namespace, image)."""
    kust = yaml.safe_load((REPO / "deploy" / "kustomization.yaml").read_text())
    ns = kust.get("namespace")
    images = {i["name"]: f"{i.get('newName', i['name'])}:{i.get('newTag', 'latest')}" for i in kust.get("images") or []}
    out: list[dict[str, Any]] = []
    for res in kust["resources"]:
        for doc in yaml.safe_load_all((REPO / "deploy" / res).read_text()):
            if not doc:
                continue
            kind = doc["kind"]
            if ns and kind not in ("Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"):
                doc["metadata"]["namespace"] = ns
            if kind in ("RoleBinding", "ClusterRoleBinding") and ns:
                for s in doc.get("subjects") or []:
                    if s.get("kind") == "ServiceAccount":
                        s["namespace"] = ns
            if kind == "Deployment":
                for c in doc["spec"]["template"]["spec"].get("containers") or []:
                    if c.get("image", "").split(":")[0] in images:
                        c["image"] = images[c["image"].split(":")[0]]
            out.append(doc)
    return out


def apply_objects(api: client.ApiClient, objs: Iterable[dict[str, Any]]) -> list[str]:
    """Create each object (kubernetes.utils.create_from_dict); one that exists already is left as it is."""
    from kubernetes import utils

    done = []
    for obj in objs:
        try:
            utils.create_from_dict(api, obj)
        except utils.FailToCreateError as exc:
            if not all(getattr(e, "status", None) == 409 for e in exc.api_exceptions):
                raise
        done.append(f"{obj['kind']}/{obj['metadata']['name']}")
    return done


def crd_established(api: client.ApiClient, name: str) -> bool:
    crd = json.loads(client.ApiextensionsV1Api(api).read_custom_resource_definition(
        name, _preload_content=False).data)
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def service_account_token(api: client.ApiClient, seconds: int = 7200) -> str:
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds}}
    resp = client.CoreV1Api(api).create_namespaced_service_account_token(SA_NAME, SA_NAMESPACE, body,
                                                                         _preload_content=False)
    return json.loads(resp.data)["status"]["token"]


# ------------------------------------------------------------------ objects
def make_node(api: client.ApiClient, name: str, gpus: int = 8, labels: dict[str, str] | None = None,
              extra: dict[str, str] | None = None, cpu: str = "96", memory: str = "1Ti") -> None:
    """A Node as a GPU node's kubelet + device plugin + GFD would leave it: labels, allocatable, Ready."""
    core = client.CoreV1Api(api)
    lab = {E2E_LABEL: "1", "kubernetes.io/hostname": name, **H100, "nvidia.com/gpu.count": str(gpus),
           **(labels or {})}
    drain(core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab},
                            "spec": {}}, _preload_content=False))
    res = {"cpu": cpu, "memory": memory, "pods": "110", "nvidia.com/gpu": str(gpus), **(extra or {})}
    now = "2026-01-01T00:00:00Z"
    status = {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (gpupool e2e)",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    drain(core.patch_node_status(name, status, _content_type=MERGE, _preload_content=False))
    # The TaintNodesByCondition admission plugin puts node.kubernetes.io/not-ready:NoSchedule on every new
    # Node; the node lifecycle controller (not running here) lifts it once the node is Ready. Do its part.
    drain(core.patch_node(name, {"spec": {"taints": None}}, _content_type=MERGE, _preload_content=False))


def make_nodes(api: client.ApiClient, prefix: str, count: int, gpus: int = 8, workers: int = 8, **kw: Any) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    names = [f"{prefix}-{i:03d}" for i in range(count)]
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda n: make_node(api, n, gpus=gpus, **kw), names))
    return names


def pod_body(name: str, ns: str, gpus: int | None = 1, limits: dict[str, str] | None = None,
             annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None,
             cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    lim = dict(limits or {})
    if gpus:
        lim["nvidia.com/gpu"] = str(gpus)
    res: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if lim:
        res["limits"] = lim
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": {E2E_LABEL: "1", **(labels or {})},
                         "annotations": dict(annotations or {})},
            "spec": {"schedulerName": SCHEDULER_NAME, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox", "resources": res}]}}


def create_pod(api: client.ApiClient, body: dict[str, Any], retry_s: float = 0) -> None:
    """Create a pod; with ``retry_s``, retry connection errors and 429/5xx for that long (apiserver starting)."""
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + retry_s
    while True:
        try:
            # read the answer: an unread response keeps its connection out of the pool, and every create then
            # opens a new TLS connection (38 creates/s instead of hundreds)
            drain(core.create_namespaced_pod(body["metadata"]["namespace"], body, _preload_content=False,
                                             _request_timeout=10))
            return
        except ApiException as exc:
            if exc.status == 409:
                return
            if time.monotonic() > deadline or not (exc.status == 429 or (exc.status or 0) >= 500):
                raise
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.05)


def create_pods(api: client.ApiClient, bodies: list[dict[str, Any]], workers: int = 8) -> None:
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda b: create_pod(api, b), bodies))


def list_pods(api: client.ApiClient, ns: str | None = None, label_selector: str | None = None,
              timeout: float = 10) -> list[dict[str, Any]]:
    core = client.CoreV1Api(api)
    kw: dict[str, Any] = {"_preload_content": False, "_request_timeout": timeout}
    if label_selector:
        kw["label_selector"] = label_selector
    resp = core.list_namespaced_pod(ns, **kw) if ns else core.list_pod_for_all_namespaces(**kw)
    return json.loads(resp.data)["items"]


def list_nodes(api: client.ApiClient) -> list[dict[str, Any]]:
    return json.loads(client.CoreV1Api(api).list_node(_preload_content=False).data)["items"]


def bound(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if (p.get("spec") or {}).get("nodeName")]


def unbound(pods: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not (p.get("spec") or {}).get("nodeName")]


def names(pods: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def condition(pod: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == ctype), None)


def events_for(api: client.ApiClient, ns: str, reason: str | None = None) -> list[dict[str, Any]]:
    items = json.loads(client.CoreV1Api(api).list_namespaced_event(ns, _preload_content=False).data)["items"]
    return [e for e in items if reason is None or e.get("reason") == reason]


def create_queue(api: client.ApiClient, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    body = {"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "labels": {E2E_LABEL: "1"}}, "spec": spec}
    return client.CustomObjectsApi(api).create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", body)


def create_pod_group(api: client.ApiClient, ns: str, name: str, min_member: int) -> None:
    body = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "labels": {E2E_LABEL: "1"}}, "spec": {"minMember": min_member}}
    client.CustomObjectsApi(api).create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups",
                                                                 body)


def delete_workloads(api: client.ApiClient, ns: str) -> None:
    """Delete every Deployment, StatefulSet, DaemonSet, ReplicaSet and Job of ``ns`` (background propagation: the
    garbage collector, where kube-controller-manager runs, removes what they own), so that no controller makes
    pods there again."""
    apps, batch = client.AppsV1Api(api), client.BatchV1Api(api)
    for delete in (apps.delete_collection_namespaced_deployment, apps.delete_collection_namespaced_stateful_set,
                   apps.delete_collection_namespaced_daemon_set, apps.delete_collection_namespaced_replica_set,
                   batch.delete_collection_namespaced_job):
        drain(delete(ns, propagation_policy="Background", _preload_content=False))


# ------------------------------------------------------------------ the invariant
def gpu_violations(api: client.ApiClient) -> tuple[list[str], dict[str, Any]]:
    """Every way the bound pods over-commit a GPU, from the API's own view (all namespaces).

    Pods that finished (``Succeeded``/``Failed``) hold nothing. Per (node, GPU index): the sum of
    ``gpupool.io/gpu-milli`` <= 1000 and the sum of ``gpu-memory`` <= the
    node's ``nvidia.com/gpu.memory``; indices < the node's GPU count; MIG devices per profile <= allocatable;
    a pod bound by gpupool carries annotations whose ``gpupool.io/node`` is its ``spec.nodeName``.
    Returns (violations, usage summary).
    """
    nodes = {n["metadata"]["name"]: n for n in list_nodes(api)}
    milli: dict[tuple[str, int], int] = defaultdict(int)
    mem: dict[tuple[str, int], int] = defaultdict(int)
    holders: dict[tuple[str, int], list[str]] = defaultdict(list)
    mig: dict[tuple[str, str], int] = defaultdict(int)
    bad: list[str] = []
    for pod in bound(list_pods(api)):
        if pod["spec"].get("schedulerName") != SCHEDULER_NAME:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # its containers ended: it holds no device (the kubelet and every scheduler agree)
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        node = pod["spec"]["nodeName"]
        ann = meta.get("annotations") or {}
        if ann.get("gpupool.io/node") != node:
            bad.append(f"{key}: bound to {node} but gpupool.io/node={ann.get('gpupool.io/node')!r}")
            continue
        idx = [int(x) for x in (ann.get("gpupool.io/gpu-index") or "").split(",") if x != ""]
        m = int(ann.get("gpupool.io/gpu-milli") or 0)
        gm = int(ann.get("gpupool.io/gpu-memory") or 0)
        n_gpus = int(((nodes.get(node) or {}).get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", 0))
        for g in idx:
            if g >= n_gpus:
                bad.append(f"{key}: GPU index {g} on {node}, which has {n_gpus} GPUs")
            milli[(node, g)] += m
            mem[(node, g)] += gm
            holders[(node, g)].append(key)
        for part in (ann.get("gpupool.io/mig") or "").split(","):
            if "=" in part:
                prof, cnt = part.split("=")
                mig[(node, prof)] += int(cnt)
    for (node, g), total in sorted(milli.items()):
        if total > 1000:
            bad.append(f"{node} GPU {g}: {total} milli-GPU allocated by {holders[(node, g)]}")
        cap = int(((nodes.get(node) or {}).get("metadata") or {}).get("labels", {}).get("nvidia.com/gpu.memory", 0))
        if cap and mem[(node, g)] > cap:
            bad.append(f"{node} GPU {g}: {mem[(node, g)]} MiB reserved of {cap} by {holders[(node, g)]}")
    for (node, prof), total in sorted(mig.items()):
        cap = int(((nodes.get(node) or {}).get("status") or {}).get("allocatable", {}).get(f"nvidia.com/mig-{prof}", 0))
        if total > cap:
            bad.append(f"{node}: {total} MIG {prof} devices allocated, {cap} exist")
    summary = {"gpus_in_use": len(milli), "milli_total": sum(milli.values())}
    return bad, summary


# ------------------------------------------------------------------ schedulers
def gpupool_exe() -> list[str]:
    exe = Path(sys.executable).parent / "gpupool"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from gpupool.cli import main; main()"]


class SchedulerProcess:
    """``gpupool scheduler`` as a subprocess (its own session, so signals reach only it)."""

    def __init__(self, kubeconfig: Path, identity: str, log_dir: Path, extra: list[str] | None = None) -> None:
        self.identity = identity
        self.log_path = log_dir / f"scheduler-{identity}.log"
        extra = list(extra or [])
        if not any(a.startswith(("--leader-elect", "--no-leader-elect")) for a in extra):
            extra.append("--no-leader-elect")  # election is on by default; scenarios that want it say so
        self.argv = gpupool_exe() + ["scheduler", "--kubeconfig", str(kubeconfig), "--identity", identity,
                                     "--metrics-bind-address", "0", "--log-format", "json", "--log-level", "info",
                                     # the suite places GPU shares; no share mechanism runs on the simulated nodes
                                     "--share-enforcement", "trust", *extra]
        self.proc: subprocess.Popen | None = None

    def start(self) -> SchedulerProcess:
        log = open(self.log_path, "ab")  # noqa: SIM115 - kept open by the child
        env = {**os.environ, "PYTHONWARNINGS": "ignore:Unverified HTTPS request"}  # loopback, self-signed
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, cwd=REPO, env=env)
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL: no Lease release, no cleanup (a crash or an OOM kill)."""
        if self.alive():
            os.kill(self.pid, signal.SIGCONT)
            os.kill(self.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 15) -> None:
        """SIGTERM and wait; SIGKILL if it does not exit."""
        if not self.alive():
            return
        os.kill(self.pid, signal.SIGCONT)
        os.kill(self.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {"raw": line}
            out.append(rec if isinstance(rec, dict) else {"raw": line})
        return out

    def log_events(self, *wanted: str) -> list[dict[str, Any]]:
        return [r for r in self.log_lines() if r.get("event") in wanted or r.get("msg") in wanted
                or r.get("message") in wanted]

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return f"--- last {min(n, len(lines))} lines of {self.log_path} ---\n" + "\n".join(lines[-n:])


class Monitor(threading.Thread):
    """Polls the API every ``interval`` s and records, per poll, how many pods matching ``selector`` are bound."""

    def __init__(self, api: client.ApiClient, ns: str, selector: str, interval: float = 0.1) -> None:
        super().__init__(daemon=True, name="e2e-monitor")
        self.api, self.ns, self.selector, self.interval = api, ns, selector, interval
        self.samples: list[tuple[float, int]] = []
        self.errors = 0
        self.error_kinds: dict[str, int] = defaultdict(int)
        self._halt = threading.Event()

    def run(self) -> None:
        t0 = time.monotonic()
        while not self._halt.wait(self.interval):
            try:
                pods = list_pods(self.api, self.ns, self.selector, timeout=2)
            except ApiException as exc:
                self.errors += 1
                self.error_kinds[f"HTTP {exc.status}"] += 1
                continue
            except Exception as exc:
                self.errors += 1
                self.error_kinds[type(exc).__name__] += 1
                continue
            self.samples.append((round(time.monotonic() - t0, 2), len(bound(pods))))

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    @property
    def max_bound(self) -> int:
        return max((n for _, n in self.samples), default=0)


def wait_bound(api: client.ApiClient, ns: str, want: Iterable[str], timeout: float,
               extra: Callable[[], str] | None = None) -> list[dict[str, Any]]:
    want = set(want)

    def check() -> list[dict[str, Any]] | None:
        pods = {p["metadata"]["name"]: p for p in list_pods(api, ns)}
        if all(n in pods and pods[n]["spec"].get("nodeName") for n in want):
            return [pods[n] for n in sorted(want)]
        return None

    def detail() -> str:
        try:
            pods = {p["metadata"]["name"]: p for p in list_pods(api, ns)}
            missing = sorted(n for n in want if not (pods.get(n) or {}).get("spec", {}).get("nodeName"))
            msgs = {n: (condition(pods[n], "PodScheduled") or {}).get("message") for n in missing[:5] if n in pods}
            text = f"not bound: {missing[:20]} ({len(missing)} of {len(want)}); PodScheduled messages: {msgs}"
        except Exception as exc:
            text = f"(could not list pods: {exc!r})"
        return text + ("\n" + extra() if extra else "")

    return wait_for(check, timeout, f"{len(want)} pods in {ns} to be bound", interval=0.1, detail=detail)


# ------------------------------------------------------------------ one test's context
class _LogCapture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def events(self, *wanted: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "event", r.getMessage()) in wanted]

    def tail(self, n: int = 40) -> str:
        lines = []
        for r in self.records[-n:]:
            extra = {k: v for k, v in r.__dict__.items() if k not in logging.LogRecord(
                "", 0, "", 0, "", (), None).__dict__ and k not in ("message", "asctime")}
            lines.append(f"{r.levelname} {r.getMessage()} {json.dumps(extra, default=str)}")
        return f"--- last {len(lines)} in-process scheduler log records ---\n" + "\n".join(lines)


@dataclasses.dataclass
class Plane:
    """A control plane with deploy/ applied: its admin client and deploy/'s ServiceAccount (kubeconfig, client)."""

    cp: ControlPlane
    admin: client.ApiClient
    sa_kubeconfig: Path
    sa_client: client.ApiClient


@dataclasses.dataclass
class E2E:
    """One test's view: its namespace, clients, the schedulers it started (ended at teardown)."""

    cp: ControlPlane
    admin: client.ApiClient
    sa_kubeconfig: Path
    sa_client: client.ApiClient
    ns: str
    log_dir: Path
    procs: list[SchedulerProcess] = dataclasses.field(default_factory=list)
    inproc: list[Any] = dataclasses.field(default_factory=list)
    logs: _LogCapture = dataclasses.field(default_factory=_LogCapture)

    def scheduler_process(self, identity: str, extra: list[str] | None = None) -> SchedulerProcess:
        proc = SchedulerProcess(self.sa_kubeconfig, identity, self.log_dir, extra)
        self.procs.append(proc)
        return proc.start()

    def scheduler_inprocess(self, identity: str = "e2e-inproc", **overrides: Any) -> Any:
        """gpupool.k8s.scheduler.Scheduler on this process's threads, with the ServiceAccount's credentials."""
        from gpupool.k8s.scheduler import Scheduler, SchedulerConfig

        known = {f.name for f in dataclasses.fields(SchedulerConfig)}
        wanted = {"scheduler_name": SCHEDULER_NAME, "identity": identity, "backoff_max_s": 2.0,
                  "share_enforcement": "trust", **overrides}  # the suite places GPU shares
        sched = Scheduler(self.sa_client, SchedulerConfig(**{k: v for k, v in wanted.items() if k in known}))
        self.inproc.append(sched)
        sched.start()
        return sched

    def diagnostics(self) -> str:
        parts = [p.tail() for p in self.procs]
        if self.inproc:
            parts.append(self.logs.tail())
        return "\n".join(parts)
