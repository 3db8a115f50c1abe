"""DRA claims side by side: a scheduler under test allocating an openb-shaped stream of ResourceClaims on the
real control plane, against an offline best fit of the same stream.

    python benchmarks/bench_dra.py [--scheduler default-scheduler|gpupool] [--seed 42] [--load 1.3]
                                   [--settle 20] [--timeout 240] [--out benchmarks/results]

Starts ``shared/tools/kube-control-plane`` with ``KCP_WITH=controller-manager,scheduler,kubelet-sim`` (the
resourceclaim controller makes each pod's claim from its template; kubelet-sim makes the nodes Ready and runs
bound pods) and kube-scheduler with ``--kube-api-qps=5000 --kube-api-burst=10000`` (its README: the default
50 QPS client caps it at 55 binds/s). Creates the namespace, NVIDIA's DeviceClasses, the 20 nodes (awaited
Ready), their ResourceSlices (owned by the Nodes, as the driver's plugin does), the claim templates, then the
pods one by one in the stream's order (benchmarks/dra_stream.py), with ``schedulerName`` = ``--scheduler``. With
``gpupool`` it also runs ``gpupool scheduler --scheduler-name gpupool`` on the same kubeconfig.

Measured, from watches of the pods and claims (times from the first pod created): GPUs allocated (whole-GPU
equivalents of the devices in the claims' ``status.allocation``) when the first pod that never gets bound is
first reported unschedulable, and at the end; claims allocated and pods bound per second; every over-allocation
(an exclusive device in two claims, a MIG counter set overdrawn, a shared GPU's memory over capacity). The run
ends when every pod is bound or unschedulable and nothing changed for ``--settle`` s, or at ``--timeout``.
Results go to ``dra_vs_kube_scheduler.json`` (one entry per scheduler; the machine named).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import dra_offline
import dra_stream
from _common import json_safe, machine_info

ROOT = Path(__file__).resolve().parents[1]
TOOL = Path(os.environ.get("KCP_TOOLS", ROOT.parent / "shared" / "tools" / "kube-control-plane"))
SCHEDULER_FLAGS = "--kube-api-qps=5000 --kube-api-burst=10000"
CONTROLLER_MANAGER_FLAGS = "--kube-api-qps=5000 --kube-api-burst=10000"
GROUP, VERSION = "resource.k8s.io", "v1"


def lscpu() -> dict[str, str]:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keep = ("Model name", "CPU(s)", "Core(s) per socket", "Socket(s)", "Thread(s) per core")
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines()) if k in keep}


class Recorder:
    """Watches the namespace's pods and claims; keeps when each pod was bound / first unschedulable and when
    each claim was first seen allocated (seconds on the monotonic clock)."""

    def __init__(self, api: Any) -> None:
        self.api = api
        self.lock = threading.Lock()
        self.bound: dict[str, float] = {}
        self.unschedulable: dict[str, tuple[float, str]] = {}
        self.allocated: dict[str, float] = {}
        self.last_change = time.monotonic()
        self.stop = threading.Event()
        self.errors: list[str] = []

    def _watch(self, lister: Any, args: tuple, on_object: Any) -> None:
        from kubernetes import watch

        rv = None
        while not self.stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(lister, *args, resource_version=rv, timeout_seconds=30, deserialize=False):
                    obj = ev["object"] if isinstance(ev["object"], dict) else json.loads(ev["raw_object"])
                    rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                    if ev["type"] in ("ADDED", "MODIFIED"):
                        on_object(obj)
                    if self.stop.is_set():
                        break
            except Exception as e:  # a dropped stream or 410: relist from scratch
                self.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                rv = None
            finally:
                w.stop()

    def on_pod(self, pod: dict) -> None:
        name, now = pod["metadata"]["name"], time.monotonic()
        with self.lock:
            if pod["spec"].get("nodeName") and name not in self.bound:
                self.bound[name] = now
                self.last_change = now
            for c in (pod.get("status") or {}).get("conditions") or ():
                if c.get("type") == "PodScheduled" and c.get("status") == "False" and \
                        c.get("reason") == "Unschedulable" and name not in self.unschedulable:
                    self.unschedulable[name] = (now, str(c.get("message", ""))[:300])

    def on_claim(self, claim: dict) -> None:
        name, now = claim["metadata"]["name"], time.monotonic()
        with self.lock:
            if (claim.get("status") or {}).get("allocation") and name not in self.allocated:
                self.allocated[name] = now
                self.last_change = now

    def start(self) -> None:
        from kubernetes import client

        core, custom = client.CoreV1Api(self.api), client.CustomObjectsApi(self.api)
        for target in ((core.list_namespaced_pod, (dra_stream.NAMESPACE,), self.on_pod),
                       (custom.list_namespaced_custom_object, (GROUP, VERSION, dra_stream.NAMESPACE,
                                                               "resourceclaims"), self.on_claim)):
            threading.Thread(target=self._watch, args=target, daemon=True).start()


def _create(fn: Any, *args: Any) -> None:
    fn(*args, _preload_content=False).read()


def setup_cluster(api: Any, st: dra_stream.Stream, timeout: float) -> dict:
    """Namespace, classes, nodes (awaited Ready with allocatable), slices owned by their Node, templates."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    t0 = time.monotonic()
    _create(core.create_namespace, {"apiVersion": "v1", "kind": "Namespace",
                                    "metadata": {"name": dra_stream.NAMESPACE}})
    for c in st.classes:
        custom.create_cluster_custom_object(GROUP, VERSION, "deviceclasses", c)
    for n in st.nodes:
        _create(core.create_node, n)
    deadline = time.monotonic() + timeout
    while True:
        nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
        ready = [n for n in nodes if any(c["type"] == "Ready" and c["status"] == "True"
                                         for c in (n.get("status") or {}).get("conditions") or ())
                 and (n.get("status") or {}).get("allocatable", {}).get("cpu")
                 and not any(t["key"] == "node.kubernetes.io/not-ready" for t in n["spec"].get("taints") or ())]
        if len(ready) == len(st.nodes):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(ready)}/{len(st.nodes)} nodes Ready after {timeout:.0f} s")
        time.sleep(0.2)
    uids = {n["metadata"]["name"]: n["metadata"]["uid"] for n in nodes}
    for s in st.slices:
        node = s["spec"]["nodeName"]
        s = {**s, "metadata": {**s["metadata"], "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uids[node], "controller": True}]}}
        custom.create_cluster_custom_object(GROUP, VERSION, "resourceslices", s)
    for t in st.templates:
        custom.create_namespaced_custom_object(GROUP, VERSION, dra_stream.NAMESPACE, "resourceclaimtemplates", t)
    for c in st.claims:
        custom.create_namespaced_custom_object(GROUP, VERSION, dra_stream.NAMESPACE, "resourceclaims", c)
    return {"setup_s": round(time.monotonic() - t0, 2)}


def run_stream(api: Any, st: dra_stream.Stream, settle: float, timeout: float) -> dict:
    """Create the pods in order, wait until settled, measure."""
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    rec = Recorder(api)
    rec.start()
    time.sleep(1.0)  # let both watches open before the first pod (events before it are not missed either way)
    t0 = time.monotonic()
    for p in st.pods:
        _create(core.create_namespaced_pod, dra_stream.NAMESPACE, p)
    created_s = time.monotonic() - t0
    names = [p["metadata"]["name"] for p in st.pods]
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        with rec.lock:
            done = all(n in rec.bound or n in rec.unschedulable for n in names)
            quiet = time.monotonic() - rec.last_change
        if done and quiet >= settle:
            break
        time.sleep(0.25)
    timed_out = time.monotonic() >= deadline
    rec.stop.set()
    claims = json.loads(custom.list_namespaced_custom_object(GROUP, VERSION, dra_stream.NAMESPACE, "resourceclaims",
                                                             _preload_content=False).data)["items"]
    pods = json.loads(core.list_namespaced_pod(dra_stream.NAMESPACE, _preload_content=False).data)["items"]
    audit = dra_offline.audit(st.slices, claims)
    if os.environ.get("BENCH_DRA_DUMP"):  # the claims as the API server holds them at the end, for inspection
        Path(os.environ["BENCH_DRA_DUMP"]).write_text(json.dumps(claims, indent=1))
    claim_of_pod = {}
    for c in claims:
        for ref in c["metadata"].get("ownerReferences") or ():
            if ref.get("kind") == "Pod":
                claim_of_pod[ref["name"]] = c["metadata"]["name"]
    for p in st.pods:  # direct claims are named after their pod
        claim_of_pod.setdefault(p["metadata"]["name"], p["metadata"]["name"])
    bound_final = {p["metadata"]["name"] for p in pods if p["spec"].get("nodeName")}
    never = [n for n in names if n not in bound_final]
    fails = sorted((rec.unschedulable[n][0], n) for n in never if n in rec.unschedulable)
    t_fail = fails[0][0] if fails else None
    per_claim = {k.split("/", 1)[1]: v for k, v in audit["per_claim"].items()}
    at_fail = sum(v for c, v in per_claim.items() if t_fail is not None and rec.allocated.get(c, 1e18) <= t_fail)
    alloc_times = sorted(rec.allocated.values())
    bind_times = sorted(rec.bound.values())
    span_claims = (alloc_times[-1] - t0) if alloc_times else None
    span_binds = (bind_times[-1] - t0) if bind_times else None
    unallocated_bound = [n for n in bound_final if claim_of_pod.get(n) not in rec.allocated]
    messages: dict[str, int] = {}
    for n in never:
        if n in rec.unschedulable:
            m = rec.unschedulable[n][1]
            messages[m] = messages.get(m, 0) + 1
    kind_of_pod = {p["metadata"]["name"]: dra_stream.ask_of(p).kind for p in st.pods}
    pod_of_claim = {c: p for p, c in claim_of_pod.items()}
    by_kind: dict[str, float] = {}
    for c, v in per_claim.items():
        kind = kind_of_pod.get(pod_of_claim.get(c, ""), "?")
        by_kind[kind] = round(by_kind.get(kind, 0.0) + v, 3)
    # In stream order: the GPUs held by the pods before the first one never bound. The offline best fit's figure
    # is this one; a scheduler that takes pods one at a time in order (kube-scheduler) reaches the same figure
    # by time, but one that plans the pending pods together reports a later pod's failure before it has written
    # the allocations of the earlier ones, so the time-based figure undercounts it.
    first_never = next((i for i, n in enumerate(names) if n not in bound_final), None)
    before = set(names[:first_never]) if first_never is not None else set(names)
    in_order = sum(per_claim.get(claim_of_pod.get(n, ""), 0.0) for n in before)
    return {
        "pods": len(names), "pods_created_s": round(created_s, 2), "timed_out": timed_out,
        "gpus_before_first_failure_in_order": round(in_order, 3),
        "first_failure_in_order": names[first_never] if first_never is not None else None,
        "gpus_at_end_by_kind": by_kind,
        "pods_bound": len(bound_final), "pods_never_bound": len(never),
        "pods_bound_without_allocated_claim": len(unallocated_bound),
        "claims_allocated": audit["claims_allocated"],
        "gpus_at_first_failure": round(at_fail, 3) if t_fail is not None else audit["gpus_allocated"],
        "first_failure": {"pod": fails[0][1], "t_s": round(t_fail - t0, 2),
                          "ask": dra_stream.ask_of(next(p for p in st.pods if p["metadata"]["name"] == fails[0][1]))
                          .template, "message": rec.unschedulable[fails[0][1]][1]} if fails else None,
        "gpus_at_end": audit["gpus_allocated"],
        "claims_per_s": round(len(alloc_times) / span_claims, 2) if span_claims else 0.0,
        "pods_bound_per_s": round(len(bind_times) / span_binds, 2) if span_binds else 0.0,
        "last_allocation_s": round(span_claims, 2) if span_claims else None,
        "last_binding_s": round(span_binds, 2) if span_binds else None,
        "claims_allocated_by_s": {f"{x}s": sum(1 for a in alloc_times if a - t0 <= x) for x in (2, 5, 10, 20, 40, 80)},
        "over_allocations": audit["over_allocations"],
        "unschedulable_messages": dict(sorted(messages.items(), key=lambda kv: -kv[1])[:8]),
        "watch_errors": rec.errors[:5],
    }


def start_gpupool(kubeconfig: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    cmd = [sys.executable, "-c", "from gpupool.cli import main; main()", "scheduler", "--kubeconfig", kubeconfig,
           "--scheduler-name", "gpupool", "--no-leader-elect", "--metrics-bind-address", "0"]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scheduler", choices=("default-scheduler", "gpupool"), default="default-scheduler")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--load", type=float, default=1.3)
    ap.add_argument("--claims", choices=("template", "direct"), default="template")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds without change that end the run")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds allowed from the first pod created")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--controller-manager-flags", default=CONTROLLER_MANAGER_FLAGS,
                    help="extra kube-controller-manager flags ('' = its defaults: 20 QPS, burst 30, which throttle "
                         "the resourceclaim controller's claim creates)")
    ap.add_argument("--keep-state", action="store_true", help="keep the control plane's state dir (logs)")
    args = ap.parse_args(argv)
    if not (TOOL / "start.sh").exists():
        print(f"bench_dra.py: {TOOL}/start.sh not found (set KCP_TOOLS)", file=sys.stderr)
        return 3
    st = dra_stream.build(args.seed, args.scheduler, args.load, args.claims)
    t = time.monotonic()
    offline = dra_offline.best_fit(st.asks, st.nodes, st.slices)
    offline["compute_s"] = round(time.monotonic() - t, 2)
    env = {**os.environ, "KCP_WITH": "controller-manager,scheduler,kubelet-sim", "KCP_SCHEDULER_FLAGS": SCHEDULER_FLAGS,
           "KCP_CONTROLLER_MANAGER_FLAGS": args.controller_manager_flags}
    started = subprocess.run(["bash", str(TOOL / "start.sh")], capture_output=True, text=True, env=env, timeout=300)
    if started.returncode != 0:
        print(f"bench_dra.py: start.sh exit {started.returncode}: {started.stderr.strip()[-500:]}", file=sys.stderr)
        return 3 if started.returncode == 3 else 1
    kubeconfig = started.stdout.strip().splitlines()[-1]
    gp = None
    try:
        import urllib3
        from kubernetes import client, config

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # loopback, self-signed
        api = config.new_client_from_config(config_file=kubeconfig)
        version = client.VersionApi(api).get_code()
        setup = setup_cluster(api, st, timeout=60)
        if args.scheduler == "gpupool":
            gp = start_gpupool(kubeconfig, Path(kubeconfig).parent / "gpupool-scheduler.log")
        result = run_stream(api, st, args.settle, args.timeout)
        result.update(setup)
        if gp is not None:
            result["gpupool_exit"] = gp.poll()
            result["gpupool_log_tail"] = (Path(kubeconfig).parent / "gpupool-scheduler.log").read_text()[-1500:]
    finally:
        if gp is not None and gp.poll() is None:
            gp.terminate()
            try:
                gp.wait(timeout=10)
            except subprocess.TimeoutExpired:
                gp.kill()
        subprocess.run(["bash", str(TOOL / "stop.sh"), kubeconfig] + ([] if args.keep_state else ["--rm"]),
                       capture_output=True, timeout=120)
        if args.keep_state:
            print(f"state kept in {Path(kubeconfig).parent}", file=sys.stderr)
    import resource

    result["harness_cpu_s"] = round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1)
    result["vs_offline_at_first_failure"] = round(result["gpus_at_first_failure"] / offline["gpus_at_first_failure"], 3)
    result["vs_offline_at_end"] = round(result["gpus_at_end"] / offline["gpus_at_end"], 3)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "dra_vs_kube_scheduler.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report.update({
        "what": "openb-shaped DRA claim stream (benchmarks/dra_stream.py) on kube-control-plane v1.36 with "
                "controller-manager and kubelet-sim",
        "stream": {"seed": args.seed, "load": args.load, "claims": args.claims, "nodes": len(st.nodes),
                   "gpus": st.capacity_gpus, "pods": len(st.pods),
                   "gpus_asked": round(sum(a.gpus for a in st.asks), 2),
                   "asks": {k: sum(1 for a in st.asks if a.template == k) for k in sorted({a.template
                                                                                           for a in st.asks})}},
        "offline_best_fit": offline,
    })
    report.setdefault("runs", {})[args.scheduler] = {
        **result, "kube_version": f"{version.major}.{version.minor} ({version.git_version})",
        "kube_scheduler_flags": SCHEDULER_FLAGS, "kube_controller_manager_flags": args.controller_manager_flags,
        "machine": {**machine_info(), "lscpu": lscpu()}}
    path.write_text(json.dumps(json_safe(report), indent=1, sort_keys=True) + "\n")
    keys = ("gpus_at_first_failure", "gpus_before_first_failure_in_order", "gpus_at_end", "claims_per_s",
            "pods_bound_per_s", "pods_bound",
            "pods_never_bound", "over_allocations")
    print(json.dumps({"scheduler": args.scheduler, **{k: result[k] for k in keys},
                      "offline": {k: offline[k] for k in ("gpus_at_first_failure", "gpus_at_end")}}, indent=1))
    print(f"-> {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
