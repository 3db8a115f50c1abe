"""Tests of gpupool.sim.failures: seeded failure events, their statistics, health replay, checkpoint math."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.model import NodeSpec
from gpupool.sim.failures import (
    LLAMA3_GPU_MTBF_H,
    LLAMA3_NODE_MTBF_H,
    FailureEvent,
    FailureModel,
    HealthTracker,
    job_mtbf_h,
    restart_point,
    work_lost,
    young_daly_interval,
)

H = 3600.0


def nodes(k: int, gpus: int = 8) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", 32000, 65536, gpus, "V100M16" if gpus else "") for i in range(k)]


def up_times(events: list[FailureEvent], kind: str, node: int, gpu: int | None = None) -> np.ndarray:
    """Durations (s) from start or repair to the next failure of one component."""
    mine = [e for e in events if e.node == node and e.gpu == gpu and e.kind.startswith(kind)]
    out, last_up = [], 0.0
    for e in mine:
        if e.is_failure:
            out.append(e.time_s - last_up)
        else:
            last_up = e.time_s
    return np.array(out)


def test_reproducible_and_seed_dependent() -> None:
    model = FailureModel(node_mtbf_h=50.0, gpu_mtbf_h=400.0, repair_h=2.0, seed=7)
    a = model.events(nodes(4), 1000 * H)
    b = FailureModel(node_mtbf_h=50.0, gpu_mtbf_h=400.0, repair_h=2.0, seed=7).events(nodes(4), 1000 * H)
    c = FailureModel(node_mtbf_h=50.0, gpu_mtbf_h=400.0, repair_h=2.0, seed=8).events(nodes(4), 1000 * H)
    assert a == b and a != c
    assert len(a) > 50


def test_node_streams_do_not_depend_on_cluster_size() -> None:
    model = FailureModel(node_mtbf_h=20.0, gpu_mtbf_h=100.0, repair_h=1.0, seed=3)
    small = model.events(nodes(2), 500 * H)
    large = model.events(nodes(5), 500 * H)
    assert small == [e for e in large if e.node < 2]


def test_sorted_paired_and_within_horizon() -> None:
    horizon = 300 * H
    model = FailureModel(node_mtbf_h=10.0, gpu_mtbf_h=40.0, repair_h=3.0, seed=1)
    events = model.events(nodes(3, gpus=4), horizon)
    assert events == sorted(events, key=FailureEvent.sort_key)
    fails = [e for e in events if e.is_failure]
    repairs = [e for e in events if not e.is_failure]
    assert len(fails) == len(repairs)
    assert all(0 <= e.time_s < horizon for e in fails)
    # every failure's repair comes exactly repair_h later, even past the horizon
    want = sorted((e.kind.split("_")[0], e.node, e.gpu, round(e.time_s + 3 * H, 6)) for e in fails)
    got = sorted((e.kind.split("_")[0], e.node, e.gpu, round(e.time_s, 6)) for e in repairs)
    assert want == got
    assert all((e.gpu is None) == e.kind.startswith("node") for e in events)
    assert {e.gpu for e in events if e.gpu is not None} <= {0, 1, 2, 3}


def test_mean_node_up_time_and_failure_count() -> None:
    # 1 node, mean up time 2 h, repair 0.5 h, 20,000 h: about 20,000 / 2.5 = 8,000 failures.
    model = FailureModel(node_mtbf_h=2.0, gpu_mtbf_h=None, repair_h=0.5, seed=11)
    events = model.events(nodes(1), 20_000 * H)
    ups = up_times(events, "node", 0)
    assert abs(len(ups) - 8000) < 5 * math.sqrt(8000)  # count of a renewal process, ~5 sigma
    # mean of ~8,000 exponentials: relative standard error 1/sqrt(8000) = 1.1 %; allow 5 %
    assert ups.mean() / H == pytest.approx(2.0, rel=0.05)
    assert np.std(ups) / H == pytest.approx(2.0, rel=0.08)  # exponential: std == mean
    assert {e.kind for e in events} == {"node_fail", "node_repair"}


def test_mean_gpu_up_time() -> None:
    model = FailureModel(node_mtbf_h=None, gpu_mtbf_h=10.0, repair_h=0.0, seed=5)
    events = model.events(nodes(2, gpus=8), 5_000 * H)  # 16 GPUs x ~500 failures
    ups = np.concatenate([up_times(events, "gpu", i, g) for i in range(2) for g in range(8)])
    assert len(ups) > 7000
    assert ups.mean() / H == pytest.approx(10.0, rel=0.05)
    assert model.expected_failures(nodes(2, gpus=8), 5_000 * H) == pytest.approx(8000)


def test_exponential_repairs() -> None:
    model = FailureModel(node_mtbf_h=1.0, gpu_mtbf_h=None, repair_h=4.0, seed=2, repair_dist="exponential")
    events = model.events(nodes(1), 20_000 * H)
    fails = [e.time_s for e in events if e.kind == "node_fail"]
    repairs = [e.time_s for e in events if e.kind == "node_repair"]
    downs = np.array(repairs) - np.array(fails)
    assert len(downs) > 3000
    assert downs.mean() / H == pytest.approx(4.0, rel=0.06)


def test_no_failures() -> None:
    assert FailureModel(None, None, 1.0, 0).events(nodes(10), 1e9) == []
    assert FailureModel(1.0, 1.0, 1.0, 0).events(nodes(3), 0.0) == []
    assert FailureModel(None, 1.0, 1.0, 0).events(nodes(3, gpus=0), 1e6) == []


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"node_mtbf_h": 0.0}, "node_mtbf_h must be a positive"),
        ({"gpu_mtbf_h": -1.0}, "gpu_mtbf_h must be a positive"),
        ({"node_mtbf_h": math.inf}, "node_mtbf_h must be a positive"),
        ({"repair_h": -1.0}, "repair_h must be >= 0"),
        ({"repair_dist": "weibull"}, "repair_dist must be"),
    ],
)
def test_model_validation(kwargs: dict, message: str) -> None:
    args = {"node_mtbf_h": 1.0, "gpu_mtbf_h": 1.0, "repair_h": 1.0, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        FailureModel(**args)


def test_event_validation() -> None:
    with pytest.raises(ValueError, match="unknown failure event kind"):
        FailureEvent(0.0, "rack_fail", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="gpu_fail event needs gpu set"):
        FailureEvent(0.0, "gpu_fail", 0)
    with pytest.raises(ValueError, match="node_fail event needs gpu None"):
        FailureEvent(0.0, "node_fail", 0, 3)
    with pytest.raises(ValueError, match="horizon_s"):
        FailureModel(1.0, None, 1.0, 0).events(nodes(1), -1.0)
    # simultaneous events: by node, the node's own before its GPUs'
    evs = [FailureEvent(5.0, "gpu_fail", 1, 1), FailureEvent(5.0, "node_repair", 1), FailureEvent(5.0, "node_fail", 0)]
    assert sorted(evs, key=FailureEvent.sort_key) == [evs[2], evs[1], evs[0]]


def test_zero_repair_time_keeps_failure_before_repair() -> None:
    cluster = nodes(2, gpus=2)
    events = FailureModel(node_mtbf_h=1.0, gpu_mtbf_h=1.0, repair_h=0.0, seed=4).events(cluster, 50 * H)
    assert len(events) > 100
    t = HealthTracker(cluster)
    t.apply_all(events)  # raises if a repair came before its failure
    assert t.usable_gpus() == 4


def test_health_tracker_by_hand() -> None:
    t = HealthTracker(nodes(2, gpus=2))
    assert t.usable_gpus() == 4
    assert t.apply(FailureEvent(1.0, "gpu_fail", 0, 1)) == [(0, 1, False)]
    assert t.apply(FailureEvent(2.0, "node_fail", 0)) == [(0, 0, False)]  # GPU 1 was already unusable
    assert t.usable_gpus() == 2
    assert t.apply(FailureEvent(3.0, "gpu_repair", 0, 1)) == []  # node still down
    assert t.apply(FailureEvent(4.0, "node_repair", 0)) == [(0, 0, True), (0, 1, True)]
    assert t.usable_gpus() == 4
    with pytest.raises(ValueError, match="node_repair of node 0, which is already up"):
        t.apply(FailureEvent(5.0, "node_repair", 0))
    with pytest.raises(ValueError, match="GPU 2 of node 1, which has 2 GPUs"):
        t.apply(FailureEvent(5.0, "gpu_fail", 1, 2))
    with pytest.raises(ValueError, match="node 7 outside"):
        t.apply(FailureEvent(5.0, "node_fail", 7))


def test_generated_events_replay_consistently() -> None:
    cluster = nodes(6, gpus=4)
    events = FailureModel(node_mtbf_h=5.0, gpu_mtbf_h=8.0, repair_h=2.0, seed=9).events(cluster, 400 * H)
    t = HealthTracker(cluster)
    usable = 24
    for ev in events:
        for _, _, ok in t.apply(ev):
            usable += 1 if ok else -1
        assert usable == t.usable_gpus()
    assert t.usable_gpus() == 24  # every failure was repaired


def test_job_mtbf() -> None:
    assert job_mtbf_h(2, 16, 1000.0, 8000.0) == pytest.approx(1 / (2 / 1000 + 16 / 8000))  # 250 h
    assert job_mtbf_h(1, 8, None, None) == math.inf
    assert job_mtbf_h(4, 0, 100.0, None) == 25.0
    assert LLAMA3_NODE_MTBF_H == pytest.approx(6334.63, abs=0.01)  # 2048 * 1296 / 419
    assert LLAMA3_GPU_MTBF_H == pytest.approx(96516.65, abs=0.01)  # 16384 * 1296 / 220


@pytest.mark.parametrize(
    ("progress", "interval", "restart", "lost"),
    [
        (7300.0, 3600.0, 7200.0, 100.0),
        (7200.0, 3600.0, 7200.0, 0.0),  # failed just after a checkpoint
        (3599.0, 3600.0, 0.0, 3599.0),
        (0.0, 3600.0, 0.0, 0.0),
        (0.3, 0.1, 0.3, 0.0),  # 0.3 / 0.1 = 2.9999999999999996 in floating point
        (500.0, 0.0, 0.0, 500.0),  # no checkpoints
        (500.0, math.inf, 0.0, 500.0),
        (500.0, -10.0, 0.0, 500.0),
    ],
)
def test_checkpoint_math(progress: float, interval: float, restart: float, lost: float) -> None:
    assert restart_point(progress, interval) == pytest.approx(restart)
    assert work_lost(progress, interval) == pytest.approx(lost, abs=1e-9)
    assert restart_point(progress, interval) + work_lost(progress, interval) == pytest.approx(progress)


def test_checkpoint_math_errors_and_young_daly() -> None:
    with pytest.raises(ValueError):
        work_lost(-1.0, 10.0)
    with pytest.raises(ValueError):
        restart_point(math.nan, 10.0)
    assert young_daly_interval(60.0, 86400.0) == pytest.approx(math.sqrt(2 * 60 * 86400))  # ~3220 s
    with pytest.raises(ValueError):
        young_daly_interval(60.0, 0.0)
