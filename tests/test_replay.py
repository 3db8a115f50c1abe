"""Tests of gpupool.sim.replay: hand-computed tiny runs, a brute-force reference, the real openb trace."""

from __future__ import annotations

import heapq
import json
import time
from pathlib import Path

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy
from gpupool.sim.replay import MAX_POINTS, ReplayResult, run_replay
from gpupool.traces import load_openb_nodes, load_openb_pods

OPENB = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"


def node(name: str = "n0", gpus: int = 2, cpu: int = 64_000, mem: int = 256_000, model: str = "V100M16") -> NodeSpec:
    return NodeSpec(name, cpu, mem, gpus, model if gpus else "")


def pod(name: str, start: float | None, end: float | None, gpus: int = 1, milli: int = 1000,
        cpu: int = 1000, mem: int = 1024, priority: int = 0) -> PodRequest:
    return PodRequest(name, cpu_milli=cpu, memory_mib=mem, num_gpu=gpus, gpu_milli=milli if gpus else 0,
                      priority=priority, creation_time=start, deletion_time=end)


def starts(result: ReplayResult) -> list[float]:
    return sorted(result.pending_times.tolist())


def check_books(result: ReplayResult) -> None:
    assert result.state is not None
    result.state.check_invariants()
    assert result.n_failed + result.n_finished + result.n_running + result.n_pending + result.n_not_arrived \
        == result.n_pods
    assert len(result.state.assignments) == result.n_running
    assert len(result.pending_times) == result.n_finished + result.n_running
    assert ((result.allocation >= 0) & (result.allocation <= 1 + 1e-12)).all()
    assert (result.pending >= 0).all()
    assert (np.diff(result.times) > 0).all()
    assert (result.pending_times >= 0).all()


# ---------------------------------------------------------------------------------------------- tiny cases
def test_pending_pod_starts_when_resources_are_released() -> None:
    pods = [pod("A", 0, 10), pod("B", 0, 10), pod("C", 5, 20)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert r.times.tolist() == [0, 5, 10, 20]
    assert r.allocation.tolist() == [1.0, 1.0, 0.5, 0.0]
    assert r.pending.tolist() == [0, 1, 0, 0]
    assert r.pending_times.tolist() == [0, 0, 5]
    assert r.failed == []
    assert (r.n_finished, r.n_running, r.n_pending, r.n_not_arrived) == (3, 0, 0, 0)
    assert r.mean_allocation == pytest.approx((1.0 * 10 + 0.5 * 10) / 20)
    assert r.peak_allocation == 1.0
    assert r.mean_pending_s == pytest.approx(5 / 3)
    assert r.p95_pending_s == pytest.approx(np.percentile([0, 0, 5], 95))
    assert r.decisions == 4  # A, B, C on arrival, C again at t=10
    assert r.decisions_per_second > 0
    # metrics: just after the last arrival (t=5): A and B run, C waits
    assert r.metrics is not None
    assert r.metrics.placed_pods == 2
    assert r.metrics.gpu_allocation_ratio == 1.0
    assert r.state is not None and r.state.assignments == {}


def test_pod_whose_deletion_passes_while_pending_fails_with_reason() -> None:
    pods = [pod("big", 0, 10, gpus=2), pod("late", 2, 5), pod("ok", 3, 30)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert [(f["pod"], f["time"]) for f in r.failed] == [("late", 5)]
    assert "Insufficient GPU share" in r.failed[0]["reason"]
    assert r.failed[0]["reason"].startswith("0/1 nodes are available")
    assert r.failed[0]["creation_time"] == 2
    assert r.pending_times.tolist() == [0, 7]  # big at 0, ok waits from 3 to 10
    assert r.times.tolist() == [0, 2, 3, 5, 10, 30]
    assert r.pending.tolist() == [0, 1, 2, 1, 0, 0]
    assert r.allocation.tolist() == [1.0, 1.0, 1.0, 1.0, 0.5, 0.0]
    assert r.n_finished == 2


def test_departures_go_before_arrivals_at_equal_times() -> None:
    pods = [pod("first", 0, 10, gpus=2), pod("second", 10, 20, gpus=2)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert r.pending_times.tolist() == [0, 0]
    assert r.pending.tolist() == [0, 0, 0]
    assert r.allocation.tolist() == [1.0, 1.0, 0.0]
    assert r.decisions == 2


def test_deadline_and_release_at_the_same_time() -> None:
    # "wait" is pending when "hold" leaves at 10, the same instant its own deletion comes: it fails
    pods = [pod("hold", 0, 10, gpus=2), pod("wait", 1, 10)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert [f["pod"] for f in r.failed] == ["wait"]
    assert r.n_finished == 1


def test_zero_duration_pod() -> None:
    pods = [pod("blip", 0, 0, gpus=2), pod("next", 0, 5, gpus=2)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert r.pending_times.tolist() == [0, 0]
    assert r.n_finished == 2 and r.failed == []


def test_higher_priority_pending_pod_goes_first() -> None:
    pods = [
        pod("A", 0, 10, gpus=2),
        pod("low", 1, 100, gpus=2, priority=0),
        pod("high", 2, 20, gpus=2, priority=2),
    ]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    # high starts at 10 (waited 8), low when high leaves at 20 (waited 19)
    assert r.pending_times.tolist() == [0, 8, 19]
    assert r.pending.tolist() == [0, 1, 2, 1, 0, 0]


def test_fifo_among_equal_priorities() -> None:
    pods = [pod("A", 0, 10, gpus=2), pod("first", 1, 100, gpus=2), pod("second", 2, 20, gpus=2)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    # first starts at 10 and holds the node until 100; second's deletion (20) comes while it waits
    assert r.pending_times.tolist() == [0, 9]
    assert [(f["pod"], f["time"]) for f in r.failed] == [("second", 20)]


def test_smaller_pod_is_not_blocked_by_a_bigger_one_ahead() -> None:
    pods = [
        pod("A", 0, 10), pod("X", 0, 50),
        pod("big", 1, 100, gpus=2),
        pod("small", 2, 100),
    ]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    # at 10 A leaves: big still does not fit (X holds a GPU), small does and keeps it until 100
    assert r.pending_times.tolist() == [0, 0, 8]
    assert [(f["pod"], f["time"]) for f in r.failed] == [("big", 100)]


def test_class_skip_calls_the_engine_only_when_a_pod_can_fit() -> None:
    pods = [
        pod("A", 0, 10), pod("X", 0, 100),
        pod("B1", 1, 200, gpus=2), pod("B2", 2, 200, gpus=2), pod("B3", 3, 200, gpus=2),
    ]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    # 5 arrivals; at 10 the released GPU is not enough for a B: no call; at 100 B1 is placed (1 call),
    # then B2 and B3 are skipped without a call; at 200 B2 and B3 fail
    assert r.decisions == 6
    assert r.pending_times.tolist() == [0, 0, 99]
    assert sorted(f["pod"] for f in r.failed) == ["B2", "B3"]
    assert all("Insufficient GPU share" in f["reason"] for f in r.failed)


def test_fractional_allocation_curve() -> None:
    pods = [pod("a", 0, 10, milli=500), pod("b", 5, 15, milli=250, gpus=1)]
    r = run_replay([node()], pods, "fgd")
    check_books(r)
    assert r.allocation.tolist() == [0.25, 0.375, 0.125, 0.0]
    assert r.times.tolist() == [0, 5, 10, 15]
    assert r.mean_allocation == pytest.approx((0.25 * 5 + 0.375 * 5 + 0.125 * 5) / 15)


def test_pods_without_deletion_stay_until_the_end() -> None:
    pods = [pod("forever", 0, None, gpus=2), pod("waits", 1, None), pod("short", 2, 3)]
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert (r.n_running, r.n_pending, r.n_failed) == (1, 1, 1)
    assert r.failed[0]["pod"] == "short"
    assert r.pending.tolist()[-1] == 1
    assert r.allocation.tolist()[-1] == 1.0
    assert set(r.state.assignments) == {"forever"}


def test_pod_without_creation_time_is_rejected_by_name() -> None:
    with pytest.raises(ValueError, match="timeless.*inflation"):
        run_replay([node()], [pod("ok", 0, 1), pod("timeless", None, None)], "best-fit")


def test_duplicate_pods_are_rejected() -> None:
    with pytest.raises(ValueError, match="duplicate pod name"):
        run_replay([node()], [pod("p", 0, 1), pod("p", 1, 2)], "best-fit")


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("back", 5, 1), "back: deletion_time before creation_time"),
        (("nan", float("nan"), 1), "nan: creation_time"),
        (("inf", 0, float("inf")), "inf: deletion_time"),
    ],
)
def test_bad_times_are_rejected_when_the_pod_is_made(args: tuple, match: str) -> None:
    # PodRequest itself refuses impossible times, so no replay ever sees them
    with pytest.raises(ValueError, match=match):
        pod(*args)


def test_empty_workload() -> None:
    r = run_replay([node()], [], "best-fit")
    assert r.n_pods == 0 and len(r.times) == 0
    assert np.isnan(r.mean_allocation) and np.isnan(r.peak_allocation) and np.isnan(r.mean_pending_s)
    d = r.to_dict()
    assert d["mean_allocation"] is None and d["mean_pending_s"] is None
    json.dumps(d, allow_nan=False)


def test_gpu_less_cluster_has_zero_allocation() -> None:
    r = run_replay([node(gpus=0)], [pod("cpu", 0, 5, gpus=0)], "best-fit")
    check_books(r)
    assert r.allocation.tolist() == [0.0, 0.0]


def test_max_events_truncates_and_books_balance() -> None:
    pods = [pod(f"p{i}", i, i + 3) for i in range(10)]
    r = run_replay([node()], pods, "best-fit", max_events=7)
    check_books(r)
    assert r.truncated and r.events == 7
    assert r.n_not_arrived > 0
    full = run_replay([node()], pods, "best-fit")
    assert not full.truncated and full.events == 20
    with pytest.raises(ValueError, match="max_events"):
        run_replay([node()], pods, "best-fit", max_events=-1)


def test_progress_and_to_dict() -> None:
    pods = [pod(f"p{i}", i, i + 1.5, milli=300) for i in range(400)]
    calls: list[tuple[int, int]] = []
    r = run_replay([node()], pods, make_policy("spread"), seed=3, progress=lambda d, t: calls.append((d, t)))
    check_books(r)
    assert calls[-1] == (800, 800)
    assert [c[0] for c in calls[:-1]] == [250, 500, 750]
    d = r.to_dict()
    text = json.dumps(d, allow_nan=False)
    assert json.loads(text)["n_pods"] == 400
    assert d["policy"] == "spread" and d["seed"] == 3 and d["protocol"] == "replay"
    assert len(d["times"]) == len(d["allocation"]) == len(d["pending"])
    assert "state" not in d


def test_curves_are_downsampled_but_summaries_use_every_event() -> None:
    n = 3 * MAX_POINTS
    pods = [pod(f"p{i}", float(i), float(i) + 0.5, milli=100) for i in range(n)]
    pods.append(pod("spike", n + 0.25, n + 0.75, gpus=2))
    r = run_replay([node()], pods, "best-fit")
    check_books(r)
    assert len(r.times) <= MAX_POINTS
    assert r.times[0] == 0 and r.times[-1] == n + 0.75
    assert r.peak_allocation == 1.0
    expected = (n * 0.05 * 0.5 + 1.0 * 0.5) / (n + 0.75)
    assert r.mean_allocation == pytest.approx(expected)


# --------------------------------------------------------------------------- brute-force reference
def reference_replay(nodes: list[NodeSpec], pods: list[PodRequest], policy: str, seed: int):
    """Naive replay: after each batch of releases, try *every* pending pod, in order, with the engine."""
    state = ClusterState(nodes)
    engine = Engine(state, make_policy(policy), seed=seed, workload=pods)
    heap = [(p.creation_time, 1, i, i) for i, p in enumerate(pods)]
    heapq.heapify(heap)
    seq = len(pods)
    pending: list[tuple[int, int, int]] = []  # (-priority, arrival, index)
    running: set[int] = set()
    waits: dict[str, float] = {}
    failed: list[tuple[str, float]] = []
    curve: list[tuple[float, int, int]] = []
    arrival = 0
    released = False
    while heap:
        now, kind, _, i = heapq.heappop(heap)
        p = pods[i]
        if kind == 1:
            if engine.place(p).scheduled:
                running.add(i)
                waits[p.name] = now - p.creation_time
            else:
                pending.append((-p.priority, arrival, i))
            arrival += 1
            if p.deletion_time is not None:
                heapq.heappush(heap, (p.deletion_time, 0, seq, i))
                seq += 1
        elif i in running:
            engine.release(p.name)
            running.discard(i)
            released = True
        elif any(e[2] == i for e in pending):
            pending = [e for e in pending if e[2] != i]
            failed.append((p.name, now))
        if released and not (heap and heap[0][0] == now and heap[0][1] == 0):
            released = False
            for entry in sorted(pending):
                q = pods[entry[2]]
                if engine.place(q).scheduled:
                    pending.remove(entry)
                    running.add(entry[2])
                    waits[q.name] = now - q.creation_time
        held = sum(pods[j].total_gpu_milli for j in running)
        if curve and curve[-1][0] == now:
            curve.pop()
        curve.append((now, held, len(pending)))
    state.check_invariants()
    return waits, failed, curve, state


def random_workload(rng: np.random.Generator, n: int) -> list[PodRequest]:
    pods = []
    for i in range(n):
        kind = rng.integers(4)
        if kind == 0:
            gpus, milli = 0, 0
        elif kind == 1:
            gpus, milli = 1, int(rng.choice([100, 250, 500, 700]))
        else:
            gpus, milli = int(rng.choice([1, 2, 4])), 1000
        start = float(rng.integers(0, 200))
        end = None if rng.random() < 0.05 else start + float(rng.integers(0, 60))
        pods.append(pod(f"p{i}", start, end, gpus=gpus, milli=milli, cpu=int(rng.choice([1000, 4000, 16000])),
                        mem=int(rng.choice([1024, 8192])), priority=int(rng.integers(3))))
    return pods


@pytest.mark.parametrize("policy", ["best-fit", "fgd", "spread", "round-robin", "k8s-default", "gpupool"])
@pytest.mark.parametrize("seed", [0, 1])
def test_matches_brute_force_reference(policy: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    nodes = [node(f"n{k}", gpus=int(rng.choice([1, 2, 4, 8])), cpu=32_000) for k in range(4)]
    pods = random_workload(rng, 150)
    r = run_replay(nodes, pods, policy, seed=seed)
    check_books(r)
    waits, failed, curve, ref_state = reference_replay(nodes, pods, policy, seed)
    assert [(f["pod"], f["time"]) for f in r.failed] == failed
    assert len(failed) > 0  # the workload does contend
    assert sorted(r.pending_times.tolist()) == sorted(waits.values())
    assert r.times.tolist() == [c[0] for c in curve]
    capacity = sum(n.gpu_count for n in nodes) * 1000
    assert r.allocation.tolist() == pytest.approx([c[1] / capacity for c in curve])
    assert r.pending.tolist() == [c[2] for c in curve]
    assert r.state.assignments == ref_state.assignments


# --------------------------------------------------------------------------------------- real trace
@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason="shared openb trace absent")
def test_openb_default_best_fit() -> None:
    nodes = load_openb_nodes(OPENB / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(OPENB / "openb_pod_list_default.csv")
    t0 = time.perf_counter()
    r = run_replay(nodes, pods, "best-fit", seed=42)
    assert time.perf_counter() - t0 < 20
    check_books(r)
    assert r.n_pods == len(pods) == 8152
    assert not r.truncated and r.n_not_arrived == 0
    assert r.n_failed + r.n_finished + r.n_running == len(pods)  # every openb pod has a deletion_time
    assert 0 < r.peak_allocation <= 1 and 0 < r.mean_allocation <= r.peak_allocation
    assert 0 < len(r.times) <= MAX_POINTS
    assert r.metrics is not None and r.metrics.placed_pods > 0
    json.dumps(r.to_dict(), allow_nan=False)


@pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason="shared openb trace absent")
def test_openb_pods_on_a_small_cluster_contend() -> None:
    """The openb pods (first 1,500) on 12 of its nodes: the queue fills and the books still balance."""
    nodes = load_openb_nodes(OPENB / "openb_node_list_gpu_node.csv")[:12]
    pods = load_openb_pods(OPENB / "openb_pod_list_default.csv")[:1500]
    r = run_replay(nodes, pods, "fgd", seed=1)
    check_books(r)
    assert r.pending.max() > 0
    assert r.n_failed + r.n_finished + r.n_running == len(pods)
    assert r.mean_pending_s > 0
