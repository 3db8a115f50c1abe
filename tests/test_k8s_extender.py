"""kube-scheduler extender: real HTTP to the extender on 127.0.0.1, kmock as the Kubernetes API.

The extender's cache lists nodes and pods from kmock, filter/prioritize answer from it, bind writes the
device annotations and POSTs the pods/binding subresource to kmock, as kube-scheduler would see it.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import kmock
import pytest
import yaml
from aiohttp.test_utils import TestServer
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.extender import Extender, NodeCache, field_of
from gpupool.k8s.extender_http import make_app
from gpupool.k8s.extender_wire import scale_scores as _scale
from gpupool.k8s.metrics import SchedulerMetrics
from gpupool.k8s.telemetry import GpuSample, GpuTelemetry

NODES = kmock.resource("", "v1", "nodes")
PODS = kmock.resource("", "v1", "pods")


def node(name: str, gpus: int = 0, product: str = "", cpu: str = "64", memory: str = "512Gi") -> dict:
    labels = {"kubernetes.io/hostname": name}
    alloc = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        labels |= {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": str(gpus)}
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": alloc, "capacity": alloc,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, *, ns: str = "default", gpus: int = 0, fraction: str | None = None, model: str | None = None,
        node_name: str | None = None, annotations: dict | None = None, uid: str | None = None) -> dict:
    ann = dict(annotations or {})
    if fraction is not None:
        ann["gpu-fraction"] = fraction
    if model is not None:
        ann["gpupool.io/gpu-model"] = model
    limits = {"memory": "8Gi"} | ({"nvidia.com/gpu": str(gpus)} if gpus else {})
    spec = {"schedulerName": "default-scheduler",
            "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                            "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": limits}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}", "annotations": ann,
                         "creationTimestamp": "2025-05-01T12:00:00Z"},
            "spec": spec, "status": {"phase": "Running" if node_name else "Pending"}}


def seed(api) -> None:
    """gpu-a: 2 x A100-80GB, GPU 0 taken whole, GPU 1 half used; gpu-b: 4 x H100 idle; gpu-c: 1 x T4 idle."""
    for n in (node("gpu-a", 2, "NVIDIA-A100-SXM4-80GB"), node("gpu-b", 4, "NVIDIA-H100-80GB-HBM3"),
              node("gpu-c", 1, "Tesla-T4"), node("cpu-0", cpu="16", memory="64Gi")):
        api.objects[NODES, None, n["metadata"]["name"]] = n
    running = [
        pod("train-0", ns="team-a", gpus=1, node_name="gpu-a",
            annotations={ANN_NODE: "gpu-a", ANN_GPU_INDEX: "0", ANN_GPU_MILLI: "1000"}),
        pod("nb-0", ns="team-b", fraction="0.5", node_name="gpu-a",
            annotations={ANN_NODE: "gpu-a", ANN_GPU_INDEX: "1", ANN_GPU_MILLI: "500"}),
        pod("done-0", ns="team-a", gpus=1, node_name="gpu-c") | {"status": {"phase": "Succeeded"}},
    ]
    for p in running:
        api.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p


def serve_bindings(api, before=None) -> list[dict]:
    """Answer POST .../pods/NAME/binding as kube-apiserver does (``BindingREST.Create`` -> ``assignPod`` ->
    ``setPodNodeAndMetadata``): 409 if the pod is bound already or the UID precondition fails; else, in one
    update, spec.nodeName and the Binding's annotations merged over the pod's. ``before``: awaited with the
    Binding before it is served (a hook to hold it)."""
    bindings: list[dict] = []

    async def bind(request):
        if before is not None:
            await before(request.data)
        stored = api.objects[PODS, request.namespace, request.name]
        meta = request.data.get("metadata") or {}
        if meta.get("uid") and meta["uid"] != stored["metadata"].get("uid"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message="Precondition failed: UID")
        if stored["spec"].get("nodeName"):
            raise kmock.KubernetesError(status=409, reason="Conflict",
                                        message=f"pod {request.name} is already assigned to node "
                                                f"\"{stored['spec']['nodeName']}\"")
        bindings.append(request.data)
        stored.patch({"metadata": {"annotations": dict(meta.get("annotations") or {})},
                      "spec": {"nodeName": request.data["target"]["name"]}, "status": {"phase": "Running"}})
        return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201, "metadata": {}}

    api["post", PODS, kmock.subresource("binding")] << bind
    return bindings


def core_api(api) -> client.CoreV1Api:
    config = client.Configuration(host=str(api.url).rstrip("/"))
    config.retries = 0
    return client.CoreV1Api(client.ApiClient(config))


class Harness:
    def __init__(self, api, policy: str = "gpupool", prefix: str = "", telemetry=None, load_weight=0.0,
                 share_enforcement: str = "trust"):  # the tests place fractional pods: something enforces them
        self.api = api
        self.metrics = SchedulerMetrics()
        self.core = core_api(api)
        self.cache = NodeCache(self.core, policy=policy, metrics=self.metrics, telemetry=telemetry,
                               share_enforcement=share_enforcement)
        self.extender = Extender(self.cache, self.core, metrics=self.metrics, telemetry=telemetry,
                                 load_weight=load_weight)
        self.server = TestServer(make_app(self.extender, url_prefix=prefix, metrics=self.metrics), host="127.0.0.1")
        self.prefix = prefix

    async def __aenter__(self):
        await self.server.start_server()
        self.session = aiohttp.ClientSession(base_url=str(self.server.make_url("/")))
        return self

    async def __aexit__(self, *exc):
        await self.session.close()
        await self.server.close()

    async def refresh(self) -> None:
        await asyncio.to_thread(self.cache.refresh)  # the API (kmock) runs on this loop: never block it

    async def post(self, verb: str, body) -> tuple[int, object]:
        async with self.session.post(f"{self.prefix}/{verb}", data=json.dumps(body),
                                     headers={"Content-Type": "application/json"}) as resp:
            return resp.status, await resp.json()

    async def get(self, path: str) -> tuple[int, str]:
        async with self.session.get(path) as resp:
            return resp.status, await resp.text()


def args_for(p: dict, names: list[str]) -> dict:
    """ExtenderArgs as kube-scheduler sends them with nodeCacheCapable: true."""
    return {"Pod": p, "Nodes": None, "NodeNames": names}


ALL = ["gpu-a", "gpu-b", "gpu-c", "cpu-0", "ghost"]


@pytest.mark.asyncio
async def test_filter_answers_in_kube_scheduler_shapes(kmock):
    seed(kmock)
    async with Harness(kmock) as h:
        status, body = await h.post("filter", args_for(pod("q", fraction="0.25"), ALL))
        assert status == 200 and body["Error"] == "gpupool extender: node cache not synced yet"
        assert (await h.get("/readyz"))[0] == 503
        await h.refresh()
        assert (await h.get("/readyz"))[0] == 200

        status, body = await h.post("filter", args_for(pod("q", fraction="0.25"), ALL))
        assert status == 200
        assert set(body) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
        assert body["Nodes"] is None and body["Error"] == ""
        assert body["NodeNames"] == ["gpu-a", "gpu-b", "gpu-c"]
        assert body["FailedNodes"] == {"cpu-0": "Insufficient GPU share", "ghost": "node is not in gpupool's cache yet"}
        assert body["FailedAndUnresolvableNodes"] == {}

        # A whole GPU no longer fits gpu-a (GPU 0 taken, GPU 1 half used); the finished pod frees gpu-c.
        _, body = await h.post("filter", args_for(pod("w", gpus=1), ALL))
        assert body["NodeNames"] == ["gpu-b", "gpu-c"]
        assert body["FailedNodes"]["gpu-a"] == "Insufficient GPU share"

        # A GPU model no node offers is unresolvable: preemption must not try those nodes.
        _, body = await h.post("filter", args_for(pod("t4", gpus=1, model="T4"), ["gpu-a", "gpu-b", "gpu-c"]))
        assert body["NodeNames"] == ["gpu-c"]
        assert body["FailedAndUnresolvableNodes"] == {"gpu-a": "GPU model not in gpu_spec",
                                                      "gpu-b": "GPU model not in gpu_spec"}

        # A request gpupool cannot read fails every node, unresolvably, with a message naming the field.
        _, body = await h.post("filter", args_for(pod("bad", fraction="1.5"), ["gpu-a", "gpu-b"]))
        assert body["NodeNames"] == [] and set(body["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-b"}
        assert "gpu-fraction" in body["FailedAndUnresolvableNodes"]["gpu-a"]

        # Without nodeCacheCapable the NodeList comes and goes whole; lower-case keys are accepted too.
        node_list = {"metadata": {}, "items": [node("gpu-a", 2, "NVIDIA-A100-SXM4-80GB"), node("cpu-0")]}
        _, body = await h.post("filter", {"pod": pod("q2", fraction="0.25"), "nodes": node_list})
        assert body["NodeNames"] is None
        assert [n["metadata"]["name"] for n in body["Nodes"]["items"]] == ["gpu-a"]
        assert body["Nodes"]["items"][0] == node_list["items"][0]

        status, body = await h.post("filter", ["not", "args"])
        assert status == 400 and body["error"] == "request body is not ExtenderArgs (a JSON object)"


@pytest.mark.asyncio
async def test_prioritize_scores_zero_to_ten(kmock):
    seed(kmock)
    async with Harness(kmock, policy="best-fit") as h:
        await h.refresh()
        status, body = await h.post("prioritize", args_for(pod("q", fraction="0.25"), ALL))
        assert status == 200
        assert [e["Host"] for e in body] == ALL and all(set(e) == {"Host", "Score"} for e in body)
        scores = {e["Host"]: e["Score"] for e in body}
        assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
        assert scores["cpu-0"] == 0 and scores["ghost"] == 0
        # best-fit: the half-used A100 is the tightest fit for a quarter GPU.
        assert scores["gpu-a"] == 10 and scores["gpu-a"] > scores["gpu-b"]
        status, _ = await h.post("prioritize", "garbage")
        assert status == 400


@pytest.mark.asyncio
async def test_load_aware_score_from_telemetry(kmock):
    seed(kmock)
    tel = GpuTelemetry(max_age=60)
    now = time.time()
    tel.update([GpuSample("gpu-b", g, now, utilization=0.8) for g in range(4)]
               + [GpuSample("gpu-c", 0, now, utilization=0.0)])
    async with Harness(kmock, policy="spread", telemetry=tel, load_weight=1.0) as h:
        await h.refresh()
        _, body = await h.post("prioritize", args_for(pod("w", gpus=1), ["gpu-b", "gpu-c"]))
        scores = {e["Host"]: e["Score"] for e in body}
        assert scores == {"gpu-b": 2, "gpu-c": 10}  # only idleness counts at weight 1
        # An XID error takes the GPU out: the T4 node's only GPU is unhealthy after the next refresh.
        tel.update([GpuSample("gpu-c", 0, now + 1, utilization=0.0, xid=79)])
        await h.refresh()
        _, body = await h.post("filter", args_for(pod("w", gpus=1), ["gpu-b", "gpu-c"]))
        assert body["NodeNames"] == ["gpu-b"] and body["FailedNodes"] == {"gpu-c": "Insufficient GPU share"}
    with pytest.raises(ValueError):
        Extender(NodeCache(None), load_weight=2)


@pytest.mark.asyncio
async def test_bind_annotates_and_posts_binding(kmock):
    seed(kmock)
    first = {}  # pod name -> node: someone else binds it there between gpupool's read and its Binding

    async def someone_else_first(binding):
        node = first.pop(binding["metadata"]["name"], None)
        if node:
            kmock.objects[PODS, binding["metadata"]["namespace"], binding["metadata"]["name"]].patch(
                {"spec": {"nodeName": node}})

    bindings = serve_bindings(kmock, before=someone_else_first)
    for p in (pod("w1", ns="team-a", gpus=1), pod("w2", ns="team-a", gpus=1), pod("q1", fraction="0.25")):
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p
    async with Harness(kmock, prefix="/gpupool") as h:
        await h.refresh()
        # kube-scheduler: filter, prioritize, then bind on the node it chose.
        _, f = await h.post("filter", args_for(pod("w1", ns="team-a", gpus=1), ["gpu-c"]))
        assert f["NodeNames"] == ["gpu-c"]
        status, body = await h.post("bind", {"PodName": "w1", "PodNamespace": "team-a", "PodUID": "uid-w1",
                                             "Node": "gpu-c"})
        assert (status, body) == (200, {"Error": ""})
        stored = kmock.objects[PODS, "team-a", "w1"]
        assert stored["spec"]["nodeName"] == "gpu-c"
        ann = stored["metadata"]["annotations"]
        assert (ann[ANN_NODE], ann[ANN_GPU_INDEX], ann[ANN_GPU_MILLI]) == ("gpu-c", "0", "1000")
        assert int(ann[ANN_GPU_MEMORY]) > 0
        assert bindings[-1]["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-c"}
        assert bindings[-1]["metadata"]["uid"] == "uid-w1"

        # Before any re-list, the T4 is known to be taken: a second whole-GPU pod cannot bind there.
        status, body = await h.post("bind", {"PodName": "w2", "PodNamespace": "team-a", "PodUID": "uid-w2",
                                             "Node": "gpu-c"})
        assert status == 200 and "Insufficient GPU share" in body["Error"]
        assert "nodeName" not in kmock.objects[PODS, "team-a", "w2"]["spec"]
        _, f = await h.post("filter", args_for(pod("w2", ns="team-a", gpus=1), ["gpu-c"]))
        assert f["NodeNames"] == []

        # After a re-list the binding is read back from the pod (annotations), no longer "assumed".
        await h.refresh()
        assert h.cache.assumed == {} and h.cache.state.assignments["team-a/w1"].gpus == (0,)

        # A quarter GPU read back from the API (bind without a prior filter call).
        status, body = await h.post("bind", {"PodName": "q1", "PodNamespace": "default", "Node": "gpu-a"})
        assert body == {"Error": ""}
        ann = kmock.objects[PODS, "default", "q1"]["metadata"]["annotations"]
        assert (ann[ANN_GPU_INDEX], ann[ANN_GPU_MILLI]) == ("1", "250")  # the half-used GPU, not a new one

        # Binding a pod the API shows bound is refused before anything is reserved or written.
        status, body = await h.post("bind", {"PodName": "w1", "PodNamespace": "team-a", "Node": "gpu-b"})
        assert body["Error"] == "pod team-a/w1 is already bound to gpu-c (spec.nodeName)"

        # Someone else binds w2 between gpupool's read and its Binding: the API refuses (409), the error comes
        # back, the reservation is released, and nothing of gpupool's is on the pod (the annotations ride on
        # the Binding, which did not happen).
        first["w2"] = "gpu-b"
        free_before = int(h.cache.state.gpu_free[h.cache.state.node_index["gpu-b"]].sum())
        status, body = await h.post("bind", {"PodName": "w2", "PodNamespace": "team-a", "Node": "gpu-b"})
        assert "already assigned" in body["Error"]
        assert int(h.cache.state.gpu_free[h.cache.state.node_index["gpu-b"]].sum()) == free_before
        assert "team-a/w2" not in h.cache.assumed
        assert ANN_GPU_INDEX not in (kmock.objects[PODS, "team-a", "w2"]["metadata"].get("annotations") or {})
        assert len(kmock["patch"]) == 0  # the Binding is the one write

        status, body = await h.post("bind", {"PodName": "nope", "PodNamespace": "default", "Node": "gpu-b"})
        assert body["Error"]
        kmock.objects[PODS, "default", "g1"] = pod("g1", gpus=1)
        status, body = await h.post("bind", {"PodName": "g1", "PodNamespace": "default", "Node": "ghost"})
        assert "not in gpupool's cache" in body["Error"]

        status, text = await h.get("/metrics")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(text) for s in f.samples}
        assert samples[("gpupool_schedule_attempts_total", (("result", "scheduled"),))] == 2
        assert samples[("gpupool_schedule_attempts_total", (("result", "error"),))] == 2
        assert samples[("gpupool_gpu_allocation_ratio", (("model", "T4"), ("node", "gpu-c")))] == 1.0
        assert (await h.get("/healthz"))[0] == 200
        assert (await h.get("/filter"))[0] in (404, 405)  # the verbs live under the prefix only


def test_scale_and_field_helpers():
    import numpy as np

    assert _scale(np.array([1.0, 3.0, 2.0])).tolist() == [0.0, 10.0, 5.0]
    assert _scale(np.array([4.0, 4.0])).tolist() == [10.0, 10.0]
    assert _scale(np.array([-np.inf, 1.0, np.inf])).tolist() == [0.0, 5.0, 10.0]
    assert _scale(np.array([np.nan, 2.0, 3.0])).tolist() == [0.0, 5.0, 10.0]
    assert field_of({"nodenames": [1]}, "NodeNames") == [1] and field_of(None, "Pod") is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.asyncio
async def test_cli_serves_against_the_api(kmock, tmp_path: Path):
    """`gpupool extender` as a process: kubeconfig pointing at kmock, HTTP on a free port."""
    seed(kmock)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(kmock.url).rstrip("/")}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "u"}}],
    }))
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "extender", "--host", "127.0.0.1", "--port", str(port),
         "--kubeconfig", str(kubeconfig), "--url-prefix", "/gpupool", "--resync", "0.5", "--log-format", "kv",
         "--share-enforcement", "trust"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession() as session:
            deadline = time.monotonic() + 20
            ready = False
            while time.monotonic() < deadline and proc.poll() is None and not ready:
                try:
                    async with session.get(f"http://127.0.0.1:{port}/readyz") as resp:
                        ready = resp.status == 200
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
            assert ready, "extender did not become ready"
            async with session.post(f"http://127.0.0.1:{port}/gpupool/filter",
                                    json=args_for(pod("q", fraction="0.25"), ["gpu-b", "cpu-0"])) as resp:
                body = await resp.json()
            assert body["NodeNames"] == ["gpu-b"] and body["FailedNodes"] == {"cpu-0": "Insufficient GPU share"}
    finally:
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, 10)
        except subprocess.TimeoutExpired:
            proc.kill()
        output = proc.stdout.read().decode() if proc.stdout else ""
        proc.stdout and proc.stdout.close()
    assert "extender serving" in output, output


@pytest.mark.asyncio
async def test_bind_whose_outcome_is_unknown_keeps_the_devices(kmock):
    """Issue 33 item 1 on the extender: the Binding commits but its answer is a 504 (the API server timed out
    after etcd took it) and the read-back fails too. The extender used to release the reservation and take the
    device annotations off a pod that is bound: the next pod got its GPU. Now it keeps both until it knows; a
    read-back that answers "bound there" is a success."""
    import kmock as km

    seed(kmock)
    down = {"on": False}

    def bind(request):  # commits, then the API server goes down before it answers
        stored = kmock.objects[PODS, request.namespace, request.name]
        stored.patch({"metadata": {"annotations": request.data["metadata"]["annotations"]},
                      "spec": {"nodeName": request.data["target"]["name"]}, "status": {"phase": "Running"}})
        down["on"] = request.name == "w1"
        raise km.KubernetesError(status=504, reason="Timeout", message="request did not complete in time")

    def read(request):
        if down["on"]:
            raise km.KubernetesError(status=503, reason="ServiceUnavailable", message="apiserver restarting")
        return dict(kmock.objects[PODS, request.namespace, request.name].raw)

    kmock["post", PODS, km.subresource("binding")] << bind
    kmock["get", PODS, km.name("w1")] << read
    kmock["get", PODS, km.name("w3")] << read
    for p in (pod("w1", ns="team-a", gpus=1), pod("w2", ns="team-a", gpus=1), pod("w3", ns="team-a", gpus=1)):
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p
    async with Harness(kmock) as h:
        await h.refresh()
        for name, where in (("w1", "gpu-c"), ("w3", "gpu-b")):  # kube-scheduler filters first
            _, f = await h.post("filter", args_for(pod(name, ns="team-a", gpus=1), [where]))
            assert f["NodeNames"] == [where]
        status, body = await h.post("bind", {"PodName": "w1", "PodNamespace": "team-a", "Node": "gpu-c"})
        assert status == 200 and "outcome unknown" in body["Error"]
        assert "team-a/w1" in h.cache.assumed  # the T4 stays taken ...
        assert kmock.objects[PODS, "team-a", "w1"]["metadata"]["annotations"][ANN_GPU_INDEX] == "0"  # ... and named
        status, body = await h.post("bind", {"PodName": "w2", "PodNamespace": "team-a", "Node": "gpu-c"})
        assert "Insufficient GPU share" in body["Error"]  # not given to w2
        # the API answers again: the next unknown outcome is read back and taken as the binding it was
        down["on"] = False
        status, body = await h.post("bind", {"PodName": "w3", "PodNamespace": "team-a", "Node": "gpu-b"})
        assert body == {"Error": ""} and "team-a/w3" in h.cache.assumed


@pytest.mark.asyncio
async def test_two_concurrent_binds_of_one_pod_bind_it_once_with_its_devices(kmock):
    """Issue 33 item 3: two binds of one pod at the same time (to two nodes). The second used to release the
    first one's reservation, write its own annotations and bind; the first, refused with 409, then released the
    pod's reservation again and took the annotations off: 10 of 10 pods bound with no GPU annotations and no
    GPU counted. Now the second bind is refused while the first is in flight, and each pod is bound once, on
    the node its annotations and the cache name. Each first Binding is held at the API until the second bind
    has answered, so the two always overlap."""
    seed(kmock)
    for n in (node("gpu-d", 10, "NVIDIA-H100-80GB-HBM3"), node("gpu-e", 10, "NVIDIA-H100-80GB-HBM3")):
        kmock.objects[NODES, None, n["metadata"]["name"]] = n
    reached: dict[str, asyncio.Event] = {}
    release: dict[str, asyncio.Event] = {}

    async def hold_the_first(binding):
        name = binding["metadata"]["name"]
        if name not in reached:
            return  # a Binding after the first one of this pod is served at once
        if not reached[name].is_set():
            reached[name].set()
            await release[name].wait()

    serve_bindings(kmock, before=hold_the_first)
    names = [f"p{i}" for i in range(10)]
    for name in names:
        kmock.objects[PODS, "team-a", name] = pod(name, ns="team-a", gpus=1)
    async with Harness(kmock) as h:
        await h.refresh()
        answers = {}
        for name in names:
            reached[name], release[name] = asyncio.Event(), asyncio.Event()
            first = asyncio.create_task(h.post("bind", {"PodName": name, "PodNamespace": "team-a",
                                                        "PodUID": f"uid-{name}", "Node": "gpu-d"}))
            await asyncio.wait_for(reached[name].wait(), 30)  # the first Binding is at the API now
            second = await h.post("bind", {"PodName": name, "PodNamespace": "team-a", "PodUID": f"uid-{name}",
                                           "Node": "gpu-e"})
            release[name].set()
            answers[name] = (await first, second)
        for name in names:
            (s1, b1), (s2, b2) = answers[name]
            assert (s1, b1) == (200, {"Error": ""}), (name, b1)
            assert s2 == 200 and "another bind of this pod is in progress" in b2["Error"], (name, b2)
            stored = kmock.objects[PODS, "team-a", name]
            ann = stored["metadata"].get("annotations") or {}
            assert stored["spec"]["nodeName"] == "gpu-d" == ann.get(ANN_NODE), (name, stored["spec"], ann)
            assert ann.get(ANN_GPU_INDEX) and ann.get(ANN_GPU_MILLI) == "1000", (name, ann)
            a = h.cache.state.assignments[f"team-a/{name}"]
            assert (a.node_name, ",".join(map(str, a.gpus))) == ("gpu-d", ann[ANN_GPU_INDEX])
        # nothing reserved on gpu-e; gpu-d holds exactly the 10 pods, each on its own GPU
        state = h.cache.state
        assert int(state.gpu_free[state.node_index["gpu-e"]].sum()) == 10 * 1000
        assert int(state.gpu_free[state.node_index["gpu-d"]].sum()) == 0
        assert sorted(h.cache.assumed) == sorted(f"team-a/{n}" for n in names)
        assert all(a.bound for a in h.cache.assumed.values())


@pytest.mark.asyncio
async def test_bind_only_pods_of_its_schedulers_and_namespaces(kmock):
    """Issue 33 item 3: the extender bound another scheduler's pod in another namespace to an arbitrary node.
    It binds only pods whose spec.schedulerName is one it serves (the kube-scheduler profile that calls it)
    and, when given, only in its namespaces; pods bound, being deleted or replaced (UID) are refused too.
    Nothing is written for a refused pod."""
    seed(kmock)
    bindings = serve_bindings(kmock)
    theirs = pod("theirs", ns="team-a", gpus=1)
    theirs["spec"]["schedulerName"] = "gpupool"
    deleting = pod("leaving", ns="team-a", gpus=1)
    deleting["metadata"]["deletionTimestamp"] = "2025-05-01T12:01:00Z"
    unset = pod("plain", ns="team-a", gpus=1)
    del unset["spec"]["schedulerName"]  # the API server defaults it to default-scheduler
    for p in (theirs, deleting, unset, pod("other-ns", ns="kube-system", gpus=1), pod("mine", ns="team-a", gpus=1)):
        kmock.objects[PODS, p["metadata"]["namespace"], p["metadata"]["name"]] = p
    async with Harness(kmock) as h:
        h.extender.namespaces = frozenset({"team-a"})
        await h.refresh()

        async def bind(name, ns="team-a", uid=None, node_="gpu-b"):
            _, body = await h.post("bind", {"PodName": name, "PodNamespace": ns, "PodUID": uid or f"uid-{name}",
                                            "Node": node_})
            return body["Error"]

        assert "spec.schedulerName 'gpupool' is not served by this extender (it binds for default-scheduler)" \
            in await bind("theirs")
        assert "namespace not one this extender may bind in (team-a)" in await bind("other-ns", ns="kube-system")
        assert "being deleted" in await bind("leaving")
        assert "not the PodUID uid-old asked to bind (the pod was replaced)" in await bind("mine", uid="uid-old")
        assert await bind("plain") == ""
        assert await bind("mine") == ""
        assert [b["metadata"]["name"] for b in bindings] == ["plain", "mine"]
        assert sorted(h.cache.assumed) == ["team-a/mine", "team-a/plain"]
        # malformed ExtenderBindingArgs: one line naming the field, nothing bound
        _, body = await h.post("bind", {"PodName": {"x": 1}, "Node": "gpu-b"})
        assert body["Error"] == "ExtenderBindingArgs.PodName: expected a string, got \"{'x': 1}\""
        _, body = await h.post("bind", {"PodName": "mine", "PodNamespace": "team-a"})
        assert body["Error"] == "ExtenderBindingArgs.Node: required"
