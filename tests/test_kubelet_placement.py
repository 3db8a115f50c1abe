"""Device-plugin nodes (issue 28 part 2): whole GPUs booked where the kubelet put them.

The node agent publishes the kubelet's PodResources map (``gpupool.io/pod-devices``, pod -> GPU UUIDs). The
scheduler counts a device-plugin GPU pod the map names on exactly those GPUs (UUID -> index through the agent's
inventory), whatever gpupool's own ``gpupool.io/gpu-index`` says; while the map does not name such a pod, the node
takes no GPU share (any of its free GPUs may be the pod's), whole-GPU asks still go there."""

from __future__ import annotations

import json
import logging

import pytest

from gpupool.engine.pool import PoolConfig
from gpupool.k8s import ANN_GPU_INDEX, ANN_KAI_FRACTION, ANN_NODE
from gpupool.k8s.cache.model import ClusterModel, build_state
from gpupool.k8s.cycle.planner import plan, run_cycle
from gpupool.k8s.objects.agent_report import ANN_GPU_INVENTORY, ANN_POD_DEVICES, inventory_json, pod_devices_doc
from gpupool.k8s.snapshot import snapshot_from_objects
from gpupool.model import MILLI
from test_k8s_booking import node, placements, plan_of, pod

GPUS = [f"GPU-{i}" for i in range(4)]


def gpu_node(name: str = "gpu-4", pods: dict[str, list[str]] | None = None, replicas: int = 1,
             rv: str = "1") -> dict:
    """A 4-GPU node with the agent's inventory (UUIDs GPU-0..3) and, when ``pods`` is given, its kubelet map."""
    inv = {"version": 1, "gpus": [{"index": i, "uuid": u, "healthy": True} for i, u in enumerate(GPUS)]}
    ann = {ANN_GPU_INVENTORY: inventory_json(inv)}
    if pods is not None:
        ann[ANN_POD_DEVICES] = inventory_json(pod_devices_doc(pods, "2026-12-02T08:00:00Z"))
    labels = ({"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
              if replicas > 1 else {})
    n = node(name, 4 * replicas, annotations=ann, labels=labels)
    n["metadata"]["resourceVersion"] = rv
    return n


def booked_by_gpupool(name: str, gpus: str, node_name: str = "gpu-4", n: int = 1, ts: int = 0) -> dict:
    """A whole-GPU pod gpupool bound, with its device annotation (which the kubelet need not have followed)."""
    return pod(name, {"nvidia.com/gpu": str(n)}, annotations={ANN_NODE: node_name, ANN_GPU_INDEX: gpus},
               node_name=node_name, ts=ts)


def share(name: str, fraction: str = "0.5", ts: int = 10) -> dict:
    return pod(name, annotations={ANN_KAI_FRACTION: fraction}, ts=ts)


# ---------------------------------------------------------------------- counted where the kubelet put it
def test_scheduler_books_the_kubelets_gpus_not_gpupools_annotation(caplog):
    n = gpu_node(pods={"ml/a": ["GPU-2"], "ml/b": ["GPU-0", "GPU-3"]})
    a = booked_by_gpupool("a", "0")  # gpupool booked GPU 0; the kubelet gave GPU 2
    b = booked_by_gpupool("b", "0,1", n=2)  # booked 0,1; the kubelet gave 0 and 3
    with caplog.at_level(logging.WARNING, logger="gpupool.k8s"):
        state, info = build_state([n], [a, b])
        build_state([n], [a, b])  # a second read logs nothing new
    assert info["assignments"]["ml/a"].gpus == (2,) and info["assignments"]["ml/b"].gpus == (0, 3)
    assert list(state.gpu_free[0][:4]) == [0, MILLI, 0, 0]
    elsewhere = [r for r in caplog.records if getattr(r, "event", "") == "kubelet_placed_elsewhere"]
    assert sorted(r.pod for r in elsewhere) == ["ml/a", "ml/b"]
    # a share goes on the one GPU nobody uses: GPU 1 (gpupool's annotations alone would have said GPU 2 or 3)
    got = plan_of(n, a, b, share("s"))
    assert got["ml/s"].node == "gpu-4" and got["ml/s"].gpus == (1,)


def test_kubelet_pods_are_counted_before_annotated_ones():
    """A pod whose gpupool annotation names GPU 2 but the kubelet put on GPU 1, and another the kubelet put on GPU
    2 whose annotation says GPU 1: each is counted on its kubelet GPU, no conflict."""
    n = gpu_node(pods={"ml/x": ["GPU-1"], "ml/y": ["GPU-2"]})
    x, y = booked_by_gpupool("x", "2", ts=0), booked_by_gpupool("y", "1", ts=1)
    _, info = build_state([n], [x, y])
    assert info["assignments"]["ml/x"].gpus == (1,) and info["assignments"]["ml/y"].gpus == (2,)
    assert not info["skipped_pods"]


def test_time_sliced_replicas_are_counted_on_their_gpu():
    """4 replicas per GPU: a pod with nvidia.com/gpu: 2 that the kubelet gave replicas ::0 and ::3 of GPU 1 (the
    agent resolved both to GPU-1) holds half of GPU 1, nothing else."""
    n = gpu_node(pods={"ml/s": ["GPU-1", "GPU-1"], "ml/t": ["GPU-3"]}, replicas=4)
    s = pod("s", {"nvidia.com/gpu": "2"}, node_name="gpu-4")
    t = pod("t", {"nvidia.com/gpu": "1"}, node_name="gpu-4")
    state, info = build_state([n], [s, t])
    assert info["assignments"]["ml/s"].gpus == (1,) and info["assignments"]["ml/s"].gpu_milli == 500
    assert info["assignments"]["ml/t"].gpus == (3,) and info["assignments"]["ml/t"].gpu_milli == 250
    assert list(state.gpu_free[0][:4]) == [MILLI, 500, MILLI, 750]


# ---------------------------------------------------------------------- until the kubelet names the pod
@pytest.mark.parametrize("pool", [False, True], ids=["placement", "pool"])
def test_unreported_whole_gpu_pod_keeps_shares_off_the_node_not_whole_gpus(pool):
    n = gpu_node(pods={})  # the agent's map names no pod yet
    a = booked_by_gpupool("a", "0")
    got = placements(plan(snapshot_from_objects([n, a, share("s"), pod("w", {"nvidia.com/gpu": "1"}, ts=11)]),
                          pool=PoolConfig() if pool else None))
    assert got["ml/s"].node is None and "kubelet has not reported" in got["ml/s"].reason
    assert got["ml/w"].node == "gpu-4"  # the kubelet enforces the whole-GPU count itself
    # another node with nothing unknown takes the share
    other = gpu_node("gpu-b", pods={})
    got = plan_of(n, other, a, share("s"))
    assert got["ml/s"].node == "gpu-b"


@pytest.mark.parametrize("pool", [False, True], ids=["placement", "pool"])
def test_a_whole_gpu_pod_placed_in_this_cycle_keeps_shares_off_its_node_too(pool):
    """gpupool books GPU 0 for ``w`` but the kubelet will pick: a share planned after it, in the same cycle, does not
    go on that node (it would be the same as booking a GPU the kubelet may give ``w``)."""
    n = gpu_node(pods={})
    objs = [n, pod("w", {"nvidia.com/gpu": "1"}, ts=0), share("s", ts=10)]
    got = placements(plan(snapshot_from_objects(objs), pool=PoolConfig() if pool else None))
    assert got["ml/w"].node == "gpu-4"
    assert got["ml/s"].node is None and "kubelet has not reported" in got["ml/s"].reason


def test_live_model_adopts_a_bound_pod_the_kubelet_put_elsewhere():
    model = ClusterModel(scheduler_name="gpupool")
    model.replace("nodes", [gpu_node(pods={}, rv="1")])
    model.replace("pods", [pod("w", {"nvidia.com/gpu": "1"})])
    placed = {p.pod: p for p in run_cycle(model).placements}
    assert placed["ml/w"].gpus == (0,)
    assert model.elig.unsettled == {0}  # assumed: the kubelet has not picked yet
    # the kubelet admitted it on GPU 2 before the watch showed the binding
    model.apply("nodes", "MODIFIED", gpu_node(pods={"ml/w": ["GPU-2"]}, rv="2"))
    bound = booked_by_gpupool("w", "0")
    bound["metadata"]["resourceVersion"] = "5"
    model.apply("pods", "MODIFIED", bound)
    assert model.state.assignments["ml/w"].gpus == (2,) and model.elig.unsettled == set()


def test_without_a_map_nothing_changes():
    n = gpu_node(pods=None)
    a = booked_by_gpupool("a", "0")
    _, info = build_state([n], [a])
    assert info["assignments"]["ml/a"].gpus == (0,)
    assert plan_of(n, a, share("s"))["ml/s"].node == "gpu-4"


def test_a_map_naming_devices_the_node_does_not_have_counts_the_pod_as_unreported():
    n = gpu_node(pods={"ml/a": ["MIG-5a1e"]})
    a = booked_by_gpupool("a", "1")
    _, info = build_state([n], [a])
    assert info["assignments"]["ml/a"].gpus == (1,)  # its annotation, as before
    assert plan_of(n, a, share("s"))["ml/s"].node is None


def test_one_gpu_named_twice_on_a_node_without_time_slicing_is_not_trusted():
    n = gpu_node(pods={"ml/a": ["GPU-2", "GPU-2"]})
    a = booked_by_gpupool("a", "0,1", n=2)
    state, info = build_state([n], [a])
    assert info["assignments"]["ml/a"].gpus == (0, 1)  # both GPUs counted, as booked
    assert plan_of(n, a, share("s"))["ml/s"].node is None  # and the node waits for a map that makes sense


# ---------------------------------------------------------------------- the live model, incrementally
def test_live_model_moves_the_pod_and_lifts_the_share_block_when_the_map_arrives():
    model = ClusterModel(scheduler_name="gpupool")
    model.replace("nodes", [gpu_node(pods={}, rv="1")])
    model.replace("pods", [booked_by_gpupool("a", "0")])
    state = model.refresh()
    assert state.assignments["ml/a"].gpus == (0,)
    assert model.elig.unsettled == {0}
    model.apply("nodes", "MODIFIED", gpu_node(pods={"ml/a": ["GPU-3"]}, rv="2"))
    assert model.state is state  # no rebuild: the node's pods were counted again in place
    assert state.assignments["ml/a"].gpus == (3,) and model.elig.unsettled == set()
    assert list(state.gpu_free[0][:4]) == [MILLI, MILLI, MILLI, 0]
    # a relist rebuilds from scratch and finds the same books (no drift)
    model.replace("nodes", [gpu_node(pods={"ml/a": ["GPU-3"]}, rv="2")])
    model.replace("pods", [booked_by_gpupool("a", "0")])
    state = model.refresh()
    assert model.stats["drift"] == 0 and model.stats["rebuilds"] == 2
    assert state.assignments["ml/a"].gpus == (3,) and model.elig.unsettled == set()
    # the pod goes from the map again (a stale map is not trusted): the block is back, the pod stays counted
    model.apply("nodes", "MODIFIED", gpu_node(pods={}, rv="3"))
    assert model.elig.unsettled == {0} and "ml/a" in state.assignments
    # the pod ends: nothing is unknown any more
    gone = booked_by_gpupool("a", "0")
    gone["status"]["phase"] = "Succeeded"
    gone["metadata"]["resourceVersion"] = "9"
    model.apply("pods", "MODIFIED", gone)
    assert model.elig.unsettled == set() and "ml/a" not in state.assignments


def test_map_annotation_is_readable_json():
    n = gpu_node(pods={"ml/a": ["GPU-2"]})
    doc = json.loads(n["metadata"]["annotations"][ANN_POD_DEVICES])
    assert doc["pods"] == {"ml/a": ["GPU-2"]} and doc["version"] == 1
