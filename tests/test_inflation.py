"""The inflation protocol (FGD paper, Sec. 6.1): workload building and run invariants on tiny clusters."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from conftest import node, pod
from gpupool.sim.inflation import InflationResult, build_inflation_workload, run_inflation

MIXED = (
    [pod(f"w{i}", cpu=1000, gpus=1) for i in range(3)]
    + [pod(f"h{i}", cpu=500, gpus=1, milli=500) for i in range(4)]
    + [pod(f"q{i}", cpu=500, gpus=1, milli=250) for i in range(2)]
    + [pod("two", cpu=2000, gpus=2)]
    + [pod(f"c{i}", cpu=1000) for i in range(2)]
)  # GPU demand: 3000 + 2000 + 500 + 2000 = 7500 milli


def demand(pods) -> int:
    return sum(p.total_gpu_milli for p in pods)


# ------------------------------------------------------------------------------------------ building


def test_build_is_seeded() -> None:
    a = build_inflation_workload(MIXED, 8000, 1.3, seed=1)
    b = build_inflation_workload(MIXED, 8000, 1.3, seed=1)
    c = build_inflation_workload(MIXED, 8000, 1.3, seed=2)
    assert [p.name for p in a] == [p.name for p in b]
    assert [p.name for p in a] != [p.name for p in c]


def test_build_whole_gpus_by_hand() -> None:
    # 3 whole-GPU pods (3000) on 4000 milli at 1.3: target 5200. Resampled copies are appended while they fit:
    # 4000, 5000; the next copy (1000) would make 6000 > 5200 -> stop at 5000 with 5 pods.
    trace = [pod(f"p{i}", gpus=1) for i in range(3)]
    out = build_inflation_workload(trace, 4000, 1.3, seed=0)
    assert len(out) == 5 and demand(out) == 5000
    assert sorted(p.name for p in out[:3]) == ["p0", "p1", "p2"]  # the shuffled trace first
    assert [p.name.split("-tuned-")[1] for p in out[3:]] == ["0", "1"]
    assert all(p.name.split("-tuned-")[0] in {"p0", "p1", "p2"} for p in out[3:])


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ratio", [1.0, 1.3, 2.0])
def test_build_stops_just_below_target(seed, ratio) -> None:
    capacity = 8000
    out = build_inflation_workload(MIXED, capacity, ratio, seed=seed)
    target = ratio * capacity
    total = demand(out)
    biggest = max(p.total_gpu_milli for p in MIXED)
    # it stops at the first resampled pod that would pass the target: the demand is at most the target and
    # less than one pod (at most the biggest, 2000) below it
    assert target - biggest < total <= target
    # the whole trace comes first, shuffled; then only renamed copies of trace pods
    names = {p.name for p in MIXED}
    assert sorted(p.name for p in out[: len(MIXED)]) == sorted(names)
    copies = out[len(MIXED):]
    assert all(p.name.rsplit("-tuned-", 1)[0] in names for p in copies)
    assert [int(p.name.rsplit("-tuned-", 1)[1]) for p in copies] == list(range(len(copies)))
    assert len({p.name for p in out}) == len(out)


def test_build_thins_a_trace_that_asks_for_more() -> None:
    # 10 whole-GPU pods (10000) on 4000 milli at 1.3 (target 5200): random pods are removed until the demand
    # is at most 5200: 10000 -> ... -> 6000 -> 5000; 5 pods left, all from the trace, none renamed
    trace = [pod(f"p{i}", gpus=1) for i in range(10)]
    out = build_inflation_workload(trace, 4000, 1.3, seed=3)
    assert len(out) == 5 and demand(out) == 5000
    assert {p.name for p in out} <= {p.name for p in trace}
    assert out == build_inflation_workload(trace, 4000, 1.3, seed=3)


def test_build_thinning_mixed_stays_below_target() -> None:
    out = build_inflation_workload(MIXED, 4000, 1.0, seed=7)  # 7500 asked, 4000 allowed
    assert demand(out) <= 4000
    assert 4000 - 2000 < demand(out)  # each removal takes at most 2000 off a demand above 4000
    assert Counter(p.name for p in out).most_common(1)[0][1] == 1
    assert all("-tuned-" not in p.name for p in out)


def test_build_cpu_only_trace_is_only_shuffled() -> None:
    trace = [pod(f"c{i}", cpu=1000) for i in range(5)]
    out = build_inflation_workload(trace, 4000, 1.3, seed=0)
    assert sorted(p.name for p in out) == sorted(p.name for p in trace)


@pytest.mark.parametrize("pods, ratio, message", [
    ([], 1.3, "empty"), (MIXED, 0.0, r"within \(0, 10\]"), (MIXED, -1.0, r"within \(0, 10\]"),
    (MIXED, 1e9, r"10\], got 1e\+09"),
])
def test_build_errors(pods, ratio, message) -> None:
    with pytest.raises(ValueError, match=message):
        build_inflation_workload(pods, 4000, ratio)


# ------------------------------------------------------------------------------------------- running

NODES = [node("n0", gpus=4), node("n1", cpu=8000, gpus=2, model="T4"), node("n2", cpu=16000)]  # 6000 milli


@pytest.mark.parametrize("policy", ["random", "best-fit", "k8s-default", "fgd", "gpupool"])
def test_run_inflation_invariants(policy) -> None:
    calls = []
    r = run_inflation(NODES, MIXED, policy, seed=5, ratio=1.3, progress=lambda d, t: calls.append((d, t)))
    workload = build_inflation_workload(MIXED, 6000, 1.3, seed=5)
    assert r.policy == policy and r.seed == 5 and r.n_pods == len(workload)
    assert r.arrived.shape == r.allocation.shape == (r.n_pods,)
    # arrived: cumulative demand / capacity, monotone, ends at the workload's demand (<= 1.3)
    assert np.allclose(r.arrived, np.cumsum([p.total_gpu_milli for p in workload]) / 6000)
    assert (np.diff(r.arrived) >= 0).all() and r.arrived[-1] <= 1.3 + 1e-12
    # allocation: pods never leave, so it never drops; never above the demand nor the capacity
    assert (np.diff(r.allocation) >= 0).all()
    assert (r.allocation <= r.arrived + 1e-12).all() and (r.allocation <= 1.0 + 1e-12).all()
    # allocation rises exactly by the failed pods' demand less than arrived does
    lost = sum(f["num_gpu"] * f["gpu_milli"] for f in r.failed) / 6000
    assert r.arrived[-1] - r.allocation[-1] == pytest.approx(lost)
    for f in r.failed:
        assert f["reason"].startswith("0/3 nodes are available: ")
    if r.failed:
        assert r.first_failure_arrived == r.failed[0]["arrived"]
    assert r.metrics is not None
    assert r.metrics.placed_pods == r.n_pods - len(r.failed)
    assert r.metrics.gpu_allocation_ratio == pytest.approx(r.allocation[-1])
    # allocation_at_100: allocation when arrived first reaches 1.0
    hit = np.flatnonzero(r.arrived >= 1.0 - 1e-12)
    if len(hit):
        assert r.allocation_at_100 == r.allocation[hit[0]]
    else:  # the inflated demand may stop short of 100% (up to one pod below 1.3 x capacity)
        assert math.isnan(r.allocation_at_100)
    assert calls[0] == (1, r.n_pods) and calls[-1] == (r.n_pods, r.n_pods)
    assert r.decision_seconds > 0 and r.decisions_per_second > 0
    # seeded: the same run again gives the same curve
    again = run_inflation(NODES, MIXED, policy, seed=5, ratio=1.3)
    assert np.array_equal(again.arrived, r.arrived) and np.array_equal(again.allocation, r.allocation)


def test_run_inflation_k8s_counts_requested_share() -> None:
    # two 500-milli pods on one 1-GPU node: k8s-default gives the first a whole GPU, the second fails;
    # allocation counts what was asked: 0.5 (not 1.0), arrived 1.0 after both
    trace = [pod("a", gpus=1, milli=500), pod("b", gpus=1, milli=500)]
    r = run_inflation([node("n0", gpus=1)], trace, "k8s-default", seed=0, ratio=1.0)
    assert r.n_pods == 2
    assert r.arrived.tolist() == [0.5, 1.0] and r.allocation.tolist() == [0.5, 0.5]
    assert r.allocation_at_100 == 0.5 and r.first_failure_arrived == 1.0
    assert r.metrics.reserved_gpu_ratio == 1.0
    r2 = run_inflation([node("n0", gpus=1)], trace, "best-fit", seed=0, ratio=1.0)
    assert r2.allocation.tolist() == [0.5, 1.0] and r2.failed == [] and math.isnan(r2.first_failure_arrived)


def test_allocation_at_100_definition() -> None:
    def res(arrived, allocation):
        return InflationResult("x", 0, len(arrived), np.array(arrived), np.array(allocation))

    assert res([0.5, 0.99, 1.0, 1.2], [0.5, 0.9, 0.95, 0.97]).allocation_at_100 == 0.95
    assert res([0.5, 1.0 - 1e-13, 1.1], [0.5, 0.8, 0.9]).allocation_at_100 == 0.8  # float tolerance
    assert res([0.5, 1.05, 1.2], [0.5, 0.7, 0.8]).allocation_at_100 == 0.7  # the first step past 100%
    assert math.isnan(res([0.3, 0.9], [0.3, 0.9]).allocation_at_100)
    r = res([0.5], [0.5])
    assert math.isnan(r.first_failure_arrived) and math.isnan(r.decisions_per_second)
