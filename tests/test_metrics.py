"""Cluster metrics against hand-computed values."""

from __future__ import annotations

import math

import pytest

from conftest import cluster, engine, node, occupy, pod
from gpupool.metrics import ClusterMetrics, cluster_metrics, fragmented_gpus, gpu_allocation_ratio, load_imbalance

# typical GPU pods of this workload: 500-milli x3, whole GPU x1 (95% of 4 = 3.8 -> both kept: p = 0.75, 0.25);
# the CPU pod is ignored by the fragmentation metric
WORKLOAD = [pod(f"h{i}", gpus=1, milli=500) for i in range(3)] + [pod("w", gpus=1), pod("c", cpu=1000)]


def example():
    # n0: 4 x V100, n1: 2 x T4, n2: CPU only -> 6 GPUs = 6000 milli
    s = cluster(node("n0", gpus=4), node("n1", gpus=2, model="T4"), node("n2"))
    s.allocate(pod("a", gpus=2), 0, [0, 1])  # 2000 held and used
    s.allocate(pod("b", gpus=1, milli=500), 0, [2])  # 500 held and used
    s.allocate(pod("c", gpus=1, milli=300), 1, [0], gpu_milli=1000)  # k8s-style: 1000 held, 300 used
    s.allocate(pod("d", cpu=4000), 2, [])
    return s


def test_example_metrics_by_hand() -> None:
    s = example()
    m = cluster_metrics(s, WORKLOAD)
    # allocation: (2000 + 500 + 300) / 6000; reserved: (2000 + 500 + 1000) / 6000
    assert m.gpu_allocation_ratio == pytest.approx(2800 / 6000)
    assert m.reserved_gpu_ratio == pytest.approx(3500 / 6000)
    # free: n0 [0, 0, 500, 1000] + n1 [0, 1000] = 2500 milli
    assert m.unallocated_gpus == pytest.approx(2.5)
    # fragmented: n0: 500-shape can use GPU 2 (500) and 3 -> 0; whole-GPU shape cannot use GPU 2's 500
    #   -> 0.25 * 500 = 125; n1: both shapes use GPU 1, nothing else free -> 0. Total 125 milli = 0.125 GPU
    assert m.fragmented_gpus == pytest.approx(0.125)
    # per-node GPU allocation: n0 2500/4000 = 0.625, n1 1000/2000 = 0.5 (CPU node excluded)
    # mean 0.5625, population std 0.0625 -> CV 0.1111
    assert m.load_imbalance == pytest.approx(0.0625 / 0.5625)
    assert m.placed_pods == 4
    assert m.to_dict() == {
        "gpu_allocation_ratio": m.gpu_allocation_ratio, "reserved_gpu_ratio": m.reserved_gpu_ratio,
        "unallocated_gpus": m.unallocated_gpus, "fragmented_gpus": m.fragmented_gpus,
        "load_imbalance": m.load_imbalance, "placed_pods": 4,
    }
    assert isinstance(m, ClusterMetrics)


def test_unallocated_counts_healthy_gpus_only() -> None:
    s = example()
    s.set_gpu_health(1, 1, False)  # n1's free GPU is unhealthy: 1500 milli usable
    assert cluster_metrics(s, WORKLOAD).unallocated_gpus == pytest.approx(1.5)
    # the unhealthy GPU also leaves the fragmentation (no usable share there): still 0.125
    assert fragmented_gpus(s, WORKLOAD) == pytest.approx(0.125)


@pytest.mark.parametrize(
    "policy, alloc, reserved",
    [
        # three 300-milli pods on 2 nodes x 2 V100 (4000 milli):
        ("k8s-default", 900 / 4000, 3000 / 4000),  # each holds a whole GPU
        ("best-fit", 900 / 4000, 900 / 4000),  # they share one GPU
    ],
)
def test_reserved_ratio_with_k8s_default(policy, alloc, reserved) -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=2))
    eng = engine(s, policy)
    for i in range(3):
        assert eng.place(pod(f"p{i}", gpus=1, milli=300)).scheduled
    m = cluster_metrics(s, [pod("x", gpus=1, milli=300)])
    assert m.gpu_allocation_ratio == pytest.approx(alloc)
    assert m.reserved_gpu_ratio == pytest.approx(reserved)
    assert m.unallocated_gpus == pytest.approx(4 - reserved * 4)


def test_fragmented_gpus_cpu_starved_node() -> None:
    # typical pod: 8 cores + 1 whole GPU. n0 has 4 cores left: its 2 free GPUs are fragments; n1 has 32
    s = cluster(node("n0", cpu=12000, gpus=2), node("n1", gpus=2))
    s.allocate(pod("hog", cpu=8000), 0, [])
    assert fragmented_gpus(s, [pod("t", cpu=8000, gpus=1)]) == pytest.approx(2.0)


def test_fragmented_gpus_zero_cases() -> None:
    s = cluster(node("n0", gpus=2))
    assert fragmented_gpus(s, WORKLOAD) == 0.0  # empty cluster: every typical GPU pod fits everywhere
    assert fragmented_gpus(s, [pod("c", cpu=1)]) == 0.0  # no GPU pods in the workload
    assert fragmented_gpus(s, []) == 0.0
    assert fragmented_gpus(cluster(node("c")), WORKLOAD) == 0.0  # no GPUs


@pytest.mark.parametrize(
    "loads, expected",
    [
        # held milli per GPU node (each 2 GPUs = 2000): per-node fraction, CV = std / mean (population std)
        ([[0, 0], [0, 0]], 0.0),  # all idle
        ([[1000, 0], [500, 500]], 0.0),  # 0.5 and 0.5: perfectly even
        ([[1000, 1000], [0, 0]], 1.0),  # 1.0 and 0.0: mean 0.5, std 0.5
        ([[1000, 0], [250, 0]], 0.375 / 0.625),  # 0.5 and 0.125: mean 0.3125, std 0.1875 -> 0.6
    ],
)
def test_load_imbalance(loads, expected) -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=2), node("cpu"))
    for i, shares in enumerate(loads):
        occupy(s, i, shares)
    assert load_imbalance(s) == pytest.approx(expected)


def test_load_imbalance_unequal_node_sizes() -> None:
    # n0: 1 of 4 GPUs held (0.25); n1: 1 of 1 (1.0): mean 0.625, std 0.375 -> 0.6
    s = cluster(node("n0", gpus=4), node("n1", gpus=1))
    occupy(s, 0, [1000])
    occupy(s, 1, [1000])
    assert load_imbalance(s) == pytest.approx(0.6)


def test_gpu_less_cluster() -> None:
    s = cluster(node("a"), node("b"))
    s.allocate(pod("c", cpu=1000), 0, [])
    m = cluster_metrics(s, [pod("c", cpu=1000)])
    assert (m.gpu_allocation_ratio, m.reserved_gpu_ratio, m.unallocated_gpus, m.fragmented_gpus,
            m.load_imbalance, m.placed_pods) == (0.0, 0.0, 0.0, 0.0, 0.0, 1)
    assert gpu_allocation_ratio(s) == 0.0 and not math.isnan(load_imbalance(s))
