"""Bad input gets a clear error and loses nothing: regression tests from a QA pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.model import MAX_GPUS_PER_NODE, AllocationError, InvalidRequestError, NodeSpec, PodRequest
from gpupool.policies import make_policy
from gpupool.sim.inflation import build_inflation_workload
from gpupool.sim.replay import run_replay
from gpupool.traces import TraceFormatError, load_openb_nodes, load_openb_pods

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli"


def write(tmp_path: Path, name: str, *lines: str) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("row, column", [
    ("p,99999999999999999999999999,1,0,0", "cpu_milli"),
    ("p,1,99999999999999999999,0,0", "memory_mib"),
    ("p,1,1,100000000,1000", "num_gpu"),
])
def test_huge_pod_numbers_name_line_and_column(tmp_path: Path, row: str, column: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        load_openb_pods(write(tmp_path, "pods.csv", POD_HEADER, "ok,1,1,0,0", row))
    assert info.value.line == 3 and info.value.column == column and "range" in str(info.value)


@pytest.mark.parametrize("row, column", [
    ("n,1000,1,100000000,T4", "gpu"),
    ("n,1000,1,1, V100M16", "model"),
    ("n,1000,1,1,V100M16|T4", "model"),
])
def test_absurd_or_malformed_nodes_are_refused(tmp_path: Path, row: str, column: str) -> None:
    with pytest.raises(TraceFormatError) as info:
        load_openb_nodes(write(tmp_path, "nodes.csv", NODE_HEADER, row))
    assert info.value.line == 2 and info.value.column == column


@pytest.mark.parametrize("kwargs, match", [
    ({"cpu_milli": 0.5}, "cpu_milli must be an integer"),
    ({"memory_mib": float("nan")}, "memory_mib must be an integer"),
    ({"num_gpu": 1.5, "gpu_milli": 1000}, "num_gpu must be an integer"),
    ({"num_gpu": 1, "gpu_milli": 500.5}, "gpu_milli must be an integer"),
    ({"gpu_spec": "T4", "num_gpu": 1, "gpu_milli": 1000}, "gpu_spec must be a tuple"),
    ({"gpu_spec": ("",), "num_gpu": 1, "gpu_milli": 1000}, "GPU model"),
    ({"gpu_memory_mib": 100}, "without num_gpu"),
    ({"creation_time": 5.0, "deletion_time": 1.0}, "deletion_time before"),
])
def test_pod_request_rejects_impossible_values(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        PodRequest("p", **kwargs)


def test_pod_request_needs_a_name() -> None:
    with pytest.raises(InvalidRequestError, match="name"):
        PodRequest("")


def test_node_spec_rejects_fractional_or_absurd_gpus() -> None:
    with pytest.raises(ValueError, match="gpu_count must be an integer"):
        NodeSpec("n", 1000, 1000, 1.5, "T4")
    with pytest.raises(ValueError, match="outside"):
        NodeSpec("n", 1000, 1000, MAX_GPUS_PER_NODE + 1, "T4")
    with pytest.raises(ValueError, match="surrounding spaces"):
        NodeSpec("n", 1000, 1000, 1, " T4")


def test_placing_a_placed_pod_is_a_decision_not_a_crash() -> None:
    state = ClusterState([NodeSpec("n", 8000, 8000, 1, "T4")])
    engine = Engine(state, make_policy("best-fit"))
    pod = PodRequest("p", 1000, 1000, 1, 500)
    assert engine.place(pod).scheduled
    again = engine.place(pod)
    assert not again.scheduled and "already placed on n" in again.reason
    state.check_invariants()


def test_set_gpu_health_bad_node_index() -> None:
    state = ClusterState([NodeSpec("n", 8000, 8000, 1, "T4")])
    for node in (99, -1):
        with pytest.raises(AllocationError, match="out of range"):
            state.set_gpu_health(node, 0, False)


@pytest.mark.parametrize("ratio", [float("inf"), float("nan"), 0.0, -1.0])
def test_inflation_ratio_must_be_finite_and_positive(ratio: float) -> None:
    with pytest.raises(ValueError, match=r"ratio must be within \(0, 10\], got"):
        build_inflation_workload([PodRequest("p", 1, 1, 1, 1000)], 1000, ratio, 0)


def test_replay_reports_pods_that_never_ran() -> None:
    nodes = [NodeSpec("n", 8000, 8000, 2, "T4")]
    pods = [
        PodRequest("ok", 1000, 1000, 1, 1000, creation_time=0.0, deletion_time=10.0),
        PodRequest("huge", 1000, 1000, 16, 1000, creation_time=1.0),  # never fits, no deletion time
        PodRequest("wrong-model", 1000, 1000, 1, 1000, gpu_spec=("H100",), creation_time=2.0),
    ]
    res = run_replay(nodes, pods, "best-fit")
    pending = {p["pod"]: p["reason"] for p in res.still_pending}
    assert set(pending) == {"huge", "wrong-model"}
    assert "Insufficient GPU share" in pending["huge"] and "H100" in pending["wrong-model"]
