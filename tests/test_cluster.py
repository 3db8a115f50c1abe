"""ClusterState bookkeeping: allocate/release, every AllocationError, health, invariants, GPU memory."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import cluster, node, pod
from gpupool.cluster import ClusterState
from gpupool.model import AllocationError, InvalidRequestError, NodeSpec, PodRequest

# V100M16 has 16160 MiB in the catalog, T4 15360 MiB; "G2" is opaque (0 MiB: unknown).
V100_MIB = 16160
T4_MIB = 15360


def small() -> ClusterState:
    # n0: 4 x V100M16, 32 cores, 64 GiB; n1: 2 x T4, 8 cores, 16 GiB; n2: CPU only; n3: 2 x opaque G2
    return cluster(
        node("n0", cpu=32000, mem=65536, gpus=4, model="V100M16"),
        node("n1", cpu=8000, mem=16384, gpus=2, model="T4"),
        node("n2", cpu=16000, mem=32768),
        node("n3", cpu=16000, mem=32768, gpus=2, model="G2"),
    )


# ------------------------------------------------------------------------------------------ layout


def test_construction_arrays() -> None:
    s = small()
    assert s.n_nodes == 4 and s.max_gpus == 4
    assert s.model_names == ("G2", "T4", "V100M16")  # sorted
    assert s.node_model.tolist() == [2, 1, -1, 0]
    assert s.gpu_exists.tolist() == [
        [True, True, True, True],
        [True, True, False, False],
        [False, False, False, False],
        [True, True, False, False],
    ]
    assert s.gpu_free.tolist() == [[1000] * 4, [1000, 1000, 0, 0], [0] * 4, [1000, 1000, 0, 0]]
    # GPU memory from the catalog; opaque G2 and absent slots: 0
    assert s.gpu_mem_cap.tolist() == [[V100_MIB] * 4, [T4_MIB, T4_MIB, 0, 0], [0] * 4, [0] * 4]
    assert s.gpu_healthy.tolist() == s.gpu_exists.tolist()
    assert s.total_gpus == 8 and s.total_gpu_milli == 8000
    assert s.version.tolist() == [0, 0, 0, 0]
    s.check_invariants()


@pytest.mark.parametrize(
    "nodes, message",
    [
        ([], "at least one node"),
        ([node("a"), node("a")], "duplicate node name 'a'"),
    ],
)
def test_bad_cluster(nodes, message) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterState(nodes)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(name="", cpu_milli=1, memory_mib=1),
        dict(name="x", cpu_milli=-1, memory_mib=1),
        dict(name="x", cpu_milli=1, memory_mib=1, gpu_count=2),  # GPUs without a model
    ],
)
def test_bad_node_spec(kwargs) -> None:
    with pytest.raises(ValueError):
        NodeSpec(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(num_gpu=1, gpu_milli=0),
        dict(num_gpu=1, gpu_milli=1001),
        dict(num_gpu=0, gpu_milli=500),
        dict(num_gpu=-1),
        dict(cpu_milli=-1),
    ],
)
def test_invalid_requests(kwargs) -> None:
    with pytest.raises(InvalidRequestError):
        PodRequest("bad", **kwargs)


# ------------------------------------------------------------------------------- allocate / release


def test_allocate_and_release_bookkeeping() -> None:
    s = small()
    a = s.allocate(pod("a", cpu=4000, mem=8192, gpus=2), 0, [1, 3])
    assert (a.node, a.node_name, a.gpus, a.gpu_milli, a.requested_gpu_milli) == (0, "n0", (1, 3), 1000, 1000)
    assert a.gpu_memory_mib == V100_MIB  # whole GPU: all of its memory
    assert s.cpu_free[0] == 28000 and s.mem_free[0] == 65536 - 8192
    assert s.gpu_free[0].tolist() == [1000, 0, 1000, 0]
    assert s.gpu_mem_free[0].tolist() == [V100_MIB, 0, V100_MIB, 0]
    assert s.version.tolist() == [1, 0, 0, 0]

    b = s.allocate(pod("b", cpu=500, gpus=1, milli=250), 0, [0])
    # proportional memory: 16160 * 250 // 1000 = 4040 MiB
    assert b.gpu_memory_mib == 4040
    assert s.gpu_free[0].tolist() == [750, 0, 1000, 0]
    assert s.gpu_mem_free[0, 0] == V100_MIB - 4040
    assert s.allocated_gpu_milli() == 2250
    assert s.version[0] == 2
    s.check_invariants()

    assert s.release("a") is a
    assert s.cpu_free[0] == 31500 and s.mem_free[0] == 65536
    assert s.gpu_free[0].tolist() == [750, 1000, 1000, 1000]
    assert s.gpu_mem_free[0].tolist() == [V100_MIB - 4040, V100_MIB, V100_MIB, V100_MIB]
    assert s.version[0] == 3
    s.release("b")
    assert s.gpu_free[0].tolist() == [1000] * 4 and s.cpu_free[0] == 32000
    assert s.assignments == {}
    s.check_invariants()


def test_cpu_pod_on_cpu_node() -> None:
    s = small()
    a = s.allocate(pod("c", cpu=16000, mem=32768), 2, [])
    assert a.gpus == () and a.gpu_milli == 0 and a.gpu_memory_mib == 0
    assert s.cpu_free[2] == 0 and s.mem_free[2] == 0
    s.check_invariants()


@pytest.mark.parametrize(
    "model, milli, expected_mib",
    [
        ("V100M16", 1000, 16160),
        ("V100M16", 500, 8080),
        ("V100M16", 333, 5381),  # 16160 * 333 // 1000 = 5381.28 -> 5381 (floor)
        ("T4", 250, 3840),  # 15360 / 4
        ("V100M32", 100, 3251),  # 32510 * 100 // 1000
        ("G2", 500, 0),  # opaque model: memory unknown, nothing booked
    ],
)
def test_gpu_memory_proportional_to_share(model, milli, expected_mib) -> None:
    s = cluster(node("n", gpus=1, model=model))
    a = s.allocate(pod("p", gpus=1, milli=milli), 0, [0])
    assert a.gpu_memory_mib == expected_mib
    assert s.gpu_mem_free[0, 0] == s.gpu_mem_cap[0, 0] - expected_mib
    s.check_invariants()


def test_explicit_gpu_memory_overrides_share() -> None:
    s = cluster(node("n", gpus=1))
    a = s.allocate(pod("p", gpus=1, milli=100, gpu_mem=12000), 0, [0])
    assert a.gpu_memory_mib == 12000 and s.gpu_mem_free[0, 0] == V100_MIB - 12000
    # 900 milli of share are free but only 4160 MiB: a proportional 500-milli pod needs 8080 -> refused
    with pytest.raises(AllocationError, match="lacks 8080 MiB"):
        s.allocate(pod("q", gpus=1, milli=500), 0, [0])
    s.release("p")
    assert s.gpu_mem_free[0, 0] == V100_MIB


def test_k8s_style_whole_gpu_for_a_fraction() -> None:
    s = cluster(node("n", gpus=2))
    a = s.allocate(pod("p", gpus=1, milli=300), 0, [1], gpu_milli=1000)
    assert (a.gpu_milli, a.requested_gpu_milli, a.gpu_memory_mib) == (1000, 300, V100_MIB)
    assert (a.allocated_gpu_milli, a.used_gpu_milli) == (1000, 300)
    assert s.gpu_free[0].tolist() == [1000, 0]


# Every AllocationError case; each starts from small() with "x" (600 milli on n0 GPU 0) already placed.
ERRORS = [
    # (case, pod, node, gpus, gpu_milli, message)
    ("double placement", pod("x", gpus=1, milli=100), 0, [1], None, "already placed"),
    ("node index out of range", pod("p"), 4, [], None, "out of range"),
    ("negative node index", pod("p"), -1, [], None, "out of range"),
    ("too few devices", pod("p", gpus=2), 0, [1], None, r"asks for 2 GPU\(s\)"),
    ("devices for a CPU pod", pod("p"), 0, [1], None, r"asks for 0 GPU\(s\)"),
    ("repeated GPU", pod("p", gpus=2), 0, [1, 1], None, "repeats a GPU"),
    ("share below the ask", pod("p", gpus=1, milli=500), 0, [1], 400, "share 400 outside 500..1000"),
    ("share above a GPU", pod("p", gpus=1, milli=500), 0, [1], 1001, "outside"),
    ("cpu over-allocation", pod("p", cpu=32001), 0, [], None, "insufficient cpu on n0"),
    ("memory over-allocation", pod("p", mem=65537), 0, [], None, "insufficient memory on n0"),
    ("absent GPU (slot past count)", pod("p", gpus=1), 1, [2], None, "has no GPU 2"),
    ("absent GPU (past max_gpus)", pod("p", gpus=1), 0, [4], None, "has no GPU 4"),
    ("negative GPU index", pod("p", gpus=1), 0, [-1], None, "has no GPU -1"),
    ("GPU on a CPU-only node", pod("p", gpus=1), 2, [0], None, "has no GPU 0"),
    ("unhealthy GPU", pod("p", gpus=1, milli=100), 0, [3], None, "GPU 3 on n0 is unhealthy"),
    # GPU 0 of n0 holds 600: 400 free
    ("GPU share over-allocation", pod("p", gpus=1, milli=500), 0, [0], None, "has 400 milli free, needs 500"),
    ("whole GPU on a shared one", pod("p", gpus=2), 0, [1, 0], None, "GPU 0 on n0 has 400 milli free"),
    # share fits (400 free) but explicit memory does not: 16160 - 9696 (600 milli) = 6464 MiB left
    ("GPU memory over-allocation", pod("p", gpus=1, milli=300, gpu_mem=7000), 0, [0], None, "lacks 7000 MiB"),
    ("explicit memory on an opaque GPU", pod("p", gpus=1, milli=100, gpu_mem=10), 3, [0], None,
     "unknown memory size"),
]


@pytest.mark.parametrize("case, req, node_i, gpus, milli, message", ERRORS, ids=[e[0] for e in ERRORS])
def test_allocation_errors_leave_state_unchanged(case, req, node_i, gpus, milli, message) -> None:
    s = small()
    s.allocate(pod("x", gpus=1, milli=600), 0, [0])
    s.set_gpu_health(0, 3, False)
    before = {k: getattr(s, k).copy() for k in ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free", "version")}
    with pytest.raises(AllocationError, match=message):
        s.allocate(req, node_i, gpus, milli)
    for k, v in before.items():
        assert np.array_equal(getattr(s, k), v), f"{case}: {k} changed"
    assert list(s.assignments) == ["x"]
    s.check_invariants()


def test_release_unknown_and_twice() -> None:
    s = small()
    with pytest.raises(AllocationError, match="pod ghost is not placed"):
        s.release("ghost")
    s.allocate(pod("p", gpus=1), 0, [0])
    s.release("p")
    with pytest.raises(AllocationError, match="not placed"):
        s.release("p")
    s.check_invariants()


def test_name_can_be_reused_after_release() -> None:
    s = small()
    s.allocate(pod("p", gpus=1), 0, [0])
    s.release("p")
    a = s.allocate(pod("p", gpus=1), 1, [1])
    assert (a.node_name, a.gpus) == ("n1", (1,))


# ------------------------------------------------------------------------------------------ health


def test_set_gpu_health() -> None:
    s = small()
    s.allocate(pod("p", gpus=1, milli=500), 0, [2])
    s.set_gpu_health(0, 2, False)
    assert s.version[0] == 2  # allocate + health change
    assert not s.gpu_healthy[0, 2]
    # the pod stays; usable free hides the unhealthy GPU, raw books do not change
    assert "p" in s.assignments and s.gpu_free[0, 2] == 500
    assert s.usable_gpu_free()[0].tolist() == [1000, 1000, 0, 1000]
    with pytest.raises(AllocationError, match="unhealthy"):
        s.allocate(pod("q", gpus=1, milli=100), 0, [2])
    s.release("p")  # releasing from an unhealthy GPU is fine
    assert s.gpu_free[0, 2] == 1000
    s.set_gpu_health(0, 2, True)
    assert s.version[0] == 4
    s.allocate(pod("q", gpus=1, milli=100), 0, [2])
    s.check_invariants()


@pytest.mark.parametrize("node_i, gpu", [(1, 2), (2, 0)])  # past T4 node's count; CPU-only node
def test_set_gpu_health_absent_gpu(node_i, gpu) -> None:
    s = small()
    with pytest.raises(AllocationError, match="has no GPU"):
        s.set_gpu_health(node_i, gpu, False)
    assert s.version.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("gpu", [-1, 4])
def test_set_gpu_health_out_of_range_index(gpu) -> None:
    s = small()  # n0 has 4 GPUs = max_gpus, so slot -1 is GPU 3
    with pytest.raises(AllocationError):
        s.set_gpu_health(0, gpu, False)
    assert s.gpu_healthy[0].all()


# -------------------------------------------------------------------------------------- invariants


def test_check_invariants_catches_tampering() -> None:
    s = small()
    s.allocate(pod("p", cpu=1000, gpus=1, milli=500), 0, [0])
    s.check_invariants()
    cases = [
        ("cpu_free", (0,), 5000, "cpu books"),  # in range but does not balance
        ("cpu_free", (0,), -1, "cpu out of range"),
        ("mem_free", (0,), 70000, "memory out of range"),
        ("gpu_free", (0, 0), 1001, "gpu share out of range"),
        ("gpu_free", (0, 1), 900, "gpu share books"),
        ("gpu_free", (2, 0), 5, "absent GPU has capacity"),
        ("gpu_mem_free", (0, 0), V100_MIB + 1, "gpu memory"),
        ("gpu_mem_free", (0, 1), 1, "gpu memory books"),
    ]
    for attr, idx, value, message in cases:
        arr = getattr(s, attr)
        old = arr[idx]
        arr[idx] = value
        with pytest.raises(AssertionError, match=message):
            s.check_invariants()
        arr[idx] = old
        s.check_invariants()


def test_time_sliced_and_plain_nodes_side_by_side() -> None:
    # allocate asks share_on only on time-sliced nodes (a per-node flag): a whole-GPU ask takes one replica's
    # share there and a whole GPU elsewhere, in either order; release gives back exactly what was taken, GPU
    # memory and an unhealthy GPU's usable share (0) included
    s = ClusterState([
        NodeSpec("plain", cpu_milli=32000, memory_mib=65536, gpu_count=4, gpu_model="V100M16"),
        NodeSpec("sliced", cpu_milli=32000, memory_mib=65536, gpu_count=4, gpu_model="V100M16", gpu_replicas=4),
    ])
    whole = PodRequest("w", cpu_milli=1000, memory_mib=1000, num_gpu=2, gpu_milli=1000)
    a = s.allocate(whole, 1, [0, 2])
    assert (a.gpu_milli, a.requested_gpu_milli, a.gpu_memory_mib) == (250, 250, V100_MIB // 4)
    assert s.gpu_free[1].tolist() == [750, 1000, 750, 1000]
    b = s.allocate(PodRequest("w2", num_gpu=2, gpu_milli=1000), 0, (1, 3))
    assert (b.gpu_milli, b.gpu_memory_mib) == (1000, V100_MIB)
    assert s.gpu_free[0].tolist() == [1000, 0, 1000, 0]
    assert s.usable_gpu_free().tolist() == [[1000, 0, 1000, 0], [750, 1000, 750, 1000]]
    assert s.gpu_mem_free[0].tolist() == [V100_MIB, 0, V100_MIB, 0]
    s.set_gpu_health(1, 2, False)
    s.release("w")
    assert s.gpu_free[1].tolist() == [1000] * 4
    assert s.usable_gpu_free()[1].tolist() == [1000, 1000, 0, 1000]
    assert s.gpu_mem_free[1].tolist() == [V100_MIB] * 4
    s.release("w2")
    assert s.usable_gpu_free()[0].tolist() == [1000] * 4
    assert s.gpu_mem_free[0].tolist() == [V100_MIB] * 4
    s.check_invariants()
