"""The node agent reads where the kubelet put each pod's GPUs (the kubelet's PodResources gRPC API, issue 28 part 2)
and publishes it as ``gpupool.io/pod-devices``: against :class:`~gpupool.agent.fake.podresources.FakeKubelet`,
a real gRPC server on a Unix socket speaking the vendored ``v1.PodResourcesLister``."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import grpc
import pytest

from gpupool.agent import publisher as pub
from gpupool.agent.exporter import GpuExporter
from gpupool.agent.fake import FakeBackend
from gpupool.agent.fake.podresources import FakeKubelet
from gpupool.agent.health import HealthTracker
from gpupool.agent.kubelet import api_pb2, api_pb2_grpc
from gpupool.agent.podresources import PodResourcesReader, gpu_of, list_pod_devices
from gpupool.agent.publisher import NodePublisher, plan_patches
from gpupool.agent.run import Agent, FakeClock
from gpupool.k8s.objects.agent_report import (
    ANN_POD_DEVICES,
    MAX_POD_DEVICES_BYTES,
    NodeReport,
    pod_devices_doc,
    read_pod_devices,
)
from test_agent_publisher import FakeApi, node

GPU = "nvidia.com/gpu"


@pytest.fixture
def sock():
    """A socket path short enough for AF_UNIX (108 bytes), whatever pytest's tmp_path is."""
    d = tempfile.mkdtemp(prefix="pr-", dir="/tmp")
    yield str(Path(d) / "kubelet.sock")
    shutil.rmtree(d, ignore_errors=True)


def backend(n: int = 4) -> FakeBackend:
    return FakeBackend.from_dict({"node": "gpu-1", "gpus": [{"count": n}]})


def uuids(b: FakeBackend) -> list[str]:
    return [d.uuid for d in sorted(b.devices(), key=lambda d: d.index)]


# ---------------------------------------------------------------------- the fake answers as the kubelet
def test_fake_kubelet_speaks_the_kubelet_service_name(sock):
    with FakeKubelet(sock, allocatable={GPU: ["GPU-a", "GPU-b"]}) as kubelet:
        kubelet.set_pod("ml", "train-0", {"main": {GPU: ["GPU-b"]}, "sidecar": {}})
        kubelet.set_pod("web", "nginx", {"nginx": {}})
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            # the full method name the kubelet serves, called without the generated stub
            raw = ch.unary_unary("/v1.PodResourcesLister/List",
                                 request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                                 response_deserializer=api_pb2.ListPodResourcesResponse.FromString)
            answer = raw(api_pb2.ListPodResourcesRequest(), timeout=5)
            stub = api_pb2_grpc.PodResourcesListerStub(ch)
            alloc = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)
            with pytest.raises(grpc.RpcError) as err:
                stub.Get(api_pb2.GetPodResourcesRequest(pod_name="gone", pod_namespace="ml"), timeout=5)
    pods = {(p.namespace, p.name): p for p in answer.pod_resources}
    assert set(pods) == {("ml", "train-0"), ("web", "nginx")}  # pods without devices are listed too
    train = pods[("ml", "train-0")]
    assert [(c.name, [(d.resource_name, list(d.device_ids)) for d in c.devices]) for c in train.containers] == [
        ("main", [(GPU, ["GPU-b"])]), ("sidecar", [])]
    assert sorted(d.device_ids[0] for d in alloc.devices) == ["GPU-a", "GPU-b"]
    assert all(len(d.device_ids) == 1 for d in alloc.devices)  # one entry per device, as the kubelet sends them
    assert err.value.code() == grpc.StatusCode.UNKNOWN and "pod gone in namespace ml not found" in err.value.details()


def test_a_device_listed_once_per_numa_node_counts_once(sock):
    """The kubelet sends one ContainerDevices per device and NUMA node of its topology: a GPU on NUMA nodes 0 and 1
    comes twice, with the same ID; a time-slicing replica of the same GPU has its own ID and counts on its own."""
    with FakeKubelet(sock, numa={"GPU-1": [0, 1], "GPU-2::0": [1], "GPU-2::1": [1]}) as kubelet:
        kubelet.set_pod("ml", "p", {"c": {GPU: ["GPU-1"]}})
        kubelet.set_pod("ml", "q", {"c": {GPU: ["GPU-2::0", "GPU-2::1"]}})
        with grpc.insecure_channel(f"unix://{sock}") as ch:
            raw = api_pb2_grpc.PodResourcesListerStub(ch).List(api_pb2.ListPodResourcesRequest(), timeout=5)
        got = list_pod_devices(sock)
    p = next(x for x in raw.pod_resources if x.name == "p")
    assert [(list(d.device_ids), [n.ID for n in d.topology.nodes]) for d in p.containers[0].devices] == [
        (["GPU-1"], [0]), (["GPU-1"], [1])]
    assert got == {"ml/p": ("GPU-1",), "ml/q": ("GPU-2::0", "GPU-2::1")}


def test_list_pod_devices_reads_only_gpu_devices_of_every_container(sock):
    with FakeKubelet(sock) as kubelet:
        kubelet.set_pod("ml", "train-0", {"a": {GPU: ["GPU-1"]}, "b": {GPU: ["GPU-2"], "example.com/nic": ["n0"]}})
        kubelet.set_pod("web", "nginx", {"nginx": {}})
        kubelet.set_pod("ml", "nic-only", {"c": {"example.com/nic": ["n1"]}})
        got = list_pod_devices(sock)
    assert got == {"ml/train-0": ("GPU-1", "GPU-2")}


# ---------------------------------------------------------------------- device IDs -> GPUs
def test_time_sliced_and_index_ids_map_to_their_gpu():
    ids = {"GPU-a", "GPU-b"}
    by_index = {"0": "GPU-a", "1": "GPU-b"}
    assert gpu_of("GPU-b", ids, by_index) == "GPU-b"
    assert gpu_of("GPU-b::3", ids, by_index) == "GPU-b"  # AnnotatedID of replica 3 (time-slicing, MPS)
    assert gpu_of("1", ids, by_index) == "GPU-b"  # DEVICE_ID_STRATEGY=index
    assert gpu_of("0::1", ids, by_index) == "GPU-a"
    assert gpu_of("MIG-9f1c", ids, by_index) == "MIG-9f1c"  # names no whole GPU: left as it is


def test_agent_publishes_the_kubelets_map_with_replicas_resolved(sock, monkeypatch):
    b = backend(4)
    u = uuids(b)
    api = FakeApi(node())
    monkeypatch.setattr(pub.wire, "call", api.call)
    clock = FakeClock()
    agent = Agent(b, NodePublisher(api, "gpu-1", sleep=lambda s: None, clock=clock.now), HealthTracker(clock=clock.now),
                  clock=clock, pod_resources=PodResourcesReader(sock))
    with FakeKubelet(sock) as kubelet:
        kubelet.set_pod("ml", "train-0", {"main": {GPU: [u[2], u[3]]}})
        kubelet.set_pod("ml", "slice", {"main": {GPU: [f"{u[1]}::0", f"{u[1]}::5"]}})
        kubelet.set_pod("ml", "cpu-only", {"main": {}})
        report = agent.round()
        assert kubelet.calls["List"] == 1
    assert report.pod_devices["pods"] == {"ml/train-0": [u[2], u[3]], "ml/slice": [u[1], u[1]]}
    written = json.loads(api.node["metadata"]["annotations"][ANN_POD_DEVICES])
    assert written["version"] == 1 and written["resource"] == GPU and written["truncated"] == 0
    assert read_pod_devices(api.node["metadata"]["annotations"]) == {
        "ml/train-0": (u[2], u[3]), "ml/slice": (u[1], u[1])}
    assert agent.pod_resources_up is True


def test_socket_missing_publishes_no_map_says_so_once_and_the_agent_goes_on(sock, monkeypatch, caplog):
    b = backend(2)
    api = FakeApi(node(annotations={ANN_POD_DEVICES: json.dumps(pod_devices_doc({"ml/old": ["GPU-x"]}, "t"))}))
    monkeypatch.setattr(pub.wire, "call", api.call)
    clock = FakeClock()
    exporter = GpuExporter(hostname="gpu-1", clock=clock.now)
    agent = Agent(b, NodePublisher(api, "gpu-1", sleep=lambda s: None, clock=clock.now), HealthTracker(clock=clock.now),
                  exporter=exporter, clock=clock, pod_resources=PodResourcesReader(sock))
    with caplog.at_level(logging.WARNING, logger="gpupool.agent.podresources"):
        for _ in range(3):
            report = agent.round()
    assert report.pod_devices is None and agent.errors == 0 and agent.rounds == 3
    assert ANN_POD_DEVICES not in api.node["metadata"]["annotations"]  # a map from before is not left to go stale
    assert len([r for r in caplog.records if "socket missing" in r.getMessage()]) == 1
    assert "gpupool_agent_pod_resources_up 0.0" in exporter.text()
    # the socket appears: the next round publishes the map
    with FakeKubelet(sock) as kubelet:
        kubelet.set_pod("ml", "p", {"c": {GPU: [uuids(b)[0]]}})
        report = agent.round()
    assert report.pod_devices["pods"] == {"ml/p": [uuids(b)[0]]}
    assert "gpupool_agent_pod_resources_up 1.0" in exporter.text()


def test_a_failed_call_keeps_the_last_map(sock):
    b = backend(2)
    u = uuids(b)
    agent = Agent(b, None, HealthTracker(), clock=FakeClock(), pod_resources=PodResourcesReader(sock, timeout_s=2))
    with FakeKubelet(sock) as kubelet:
        kubelet.set_pod("ml", "p", {"c": {GPU: [u[1]]}})
        assert agent.round().pod_devices["pods"] == {"ml/p": [u[1]]}
    Path(sock).touch()  # a file that is no socket: the read fails, the last map stays
    report = agent.round()
    assert agent.pod_resources.last.status == "missing"
    assert report.pod_devices is None
    # a socket nobody answers on: an error, the map is kept
    Path(sock).unlink()
    import socket as pysocket

    s = pysocket.socket(pysocket.AF_UNIX)
    s.bind(sock)  # bound, never listening: connect is refused
    try:
        agent.pod_devices = {"ml/p": [u[1]]}
        report = agent.round()
        assert agent.pod_resources.last.status == "error"
        assert report.pod_devices["pods"] == {"ml/p": [u[1]]}
    finally:
        s.close()


# ---------------------------------------------------------------------- the annotation contract
def test_doc_is_size_bounded_and_left_out_pods_are_counted():
    pods = {f"ns/pod-{i:04d}": [f"GPU-{i:036d}"] for i in range(2000)}
    doc = pod_devices_doc(pods, "2026-12-02T00:00:00Z")
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    assert len(text) <= MAX_POD_DEVICES_BYTES
    assert len(doc["pods"]) + doc["truncated"] == 2000 and doc["truncated"] > 0
    assert read_pod_devices({ANN_POD_DEVICES: text}) == {k: tuple(v) for k, v in doc["pods"].items()}


@pytest.mark.parametrize("raw", ["", "nope", "[]", '{"version": 1}', '{"version": 0, "pods": {}}',
                                 '{"version": true, "pods": {}}', '{"version": 1, "resource": "x", "pods": {}}'])
def test_unreadable_map_is_no_map(raw):
    assert read_pod_devices({ANN_POD_DEVICES: raw}) is None


def test_newer_version_and_bad_entries_are_read_as_far_as_they_go():
    raw = json.dumps({"version": 2, "extra": 1, "pods": {"ml/a": ["GPU-1"], "ml/b": "GPU-2", "nokey": ["GPU-3"],
                                                          "ml/c": [], "ml/d": [1]}})
    assert read_pod_devices({ANN_POD_DEVICES: raw}) == {"ml/a": ("GPU-1",)}


def test_publisher_writes_the_map_once_and_ignores_a_new_time():
    doc = pod_devices_doc({"ml/a": ["GPU-1"]}, "2026-12-02T00:00:00Z")
    plan = plan_patches(node(), NodeReport(pod_devices=doc), 0.0)
    text = plan.metadata["metadata"]["annotations"][ANN_POD_DEVICES]
    later = pod_devices_doc({"ml/a": ["GPU-1"]}, "2026-12-02T01:00:00Z")
    again = plan_patches(node(annotations={ANN_POD_DEVICES: text}), NodeReport(pod_devices=later), 0.0)
    assert again.metadata is None or ANN_POD_DEVICES not in again.metadata["metadata"].get("annotations", {})
    gone = plan_patches(node(annotations={ANN_POD_DEVICES: text}), NodeReport(), 0.0)
    assert gone.metadata["metadata"]["annotations"][ANN_POD_DEVICES] is None


# ---------------------------------------------------------------------- agent -> Node -> scheduler
def test_what_the_agent_publishes_the_scheduler_books(sock, monkeypatch):
    """The whole path: the kubelet (fake) put ml/train on GPUs 3 and 1 while gpupool had booked 0 and 1; the agent
    publishes its inventory and the map on the Node; the scheduler's books then hold GPUs 1 and 3 for the pod and
    leave 0 and 2 free."""
    from gpupool.k8s.cache.model import build_state
    from test_k8s_booking import pod

    b = backend(4)
    u = uuids(b)
    obj = node()
    obj["status"]["allocatable"].update({"nvidia.com/gpu": "4", "memory": "64Gi"})
    api = FakeApi(obj)
    monkeypatch.setattr(pub.wire, "call", api.call)
    clock = FakeClock()
    agent = Agent(b, NodePublisher(api, "gpu-1", sleep=lambda s: None, clock=clock.now), HealthTracker(clock=clock.now),
                  clock=clock, pod_resources=PodResourcesReader(sock))
    with FakeKubelet(sock) as kubelet:
        kubelet.set_pod("ml", "train", {"main": {GPU: [u[3], u[1]]}})
        agent.round()
    train = pod("train", {GPU: "2"}, annotations={"gpupool.io/node": "gpu-1", "gpupool.io/gpu-index": "0,1"},
                node_name="gpu-1")
    state, info = build_state([api.node], [train])
    assert info["assignments"]["ml/train"].gpus == (1, 3) and not info["skipped_pods"]
    assert [int(x) for x in state.gpu_free[0][:4]] == [1000, 0, 1000, 0]
