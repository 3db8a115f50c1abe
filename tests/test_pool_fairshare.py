"""Fair shares: quotas first, then idle capacity by weighted DRF water-filling (hand-checked tables)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.engine.pool.fairshare import divide, dominant_share, fair_shares, jain_index
from gpupool.engine.pool.queues import QueueSpec, QueueTree

CPU, MEM = 1000.0, 1000.0  # milli-CPU and MiB per GPU in these cases: the GPU is every queue's dominant resource


def tree(*specs: dict) -> QueueTree:
    return QueueTree([QueueSpec(**s) for s in specs])


def gpu_rows(*gpus: float) -> np.ndarray:
    return np.array([[g, g * CPU, g * MEM] for g in gpus])


def cap(gpus: float) -> np.ndarray:
    return np.array([gpus, gpus * CPU, gpus * MEM])


CASES = [
    # name, queues, GPU demand per queue, cluster GPUs, expected GPU fair share
    # equal weights rise together; B is met at 2, A takes the rest
    ("demand caps the share", [dict(name="A"), dict(name="B")], (10, 2), 8, (6, 2)),
    # weights 3:1, both want everything: 8 x 3/4 = 6, 8 x 1/4 = 2
    ("weights split idle capacity", [dict(name="A", weight=3), dict(name="B")], (10, 10), 8, (6, 2)),
    # quota first (A 4), then the remaining 4 split 1:1
    ("quota then weight", [dict(name="A", quota=4), dict(name="B")], (10, 10), 8, (6, 2)),
    # A may hold at most 3
    ("limit", [dict(name="A", limit=3), dict(name="B")], (10, 10), 8, (3, 5)),
    # quotas add up to 16 on 8 GPUs: the higher priority gets its quota, the lower nothing
    ("priority under oversubscribed quotas", [dict(name="hi", quota=8, priority=1), dict(name="lo", quota=8)],
     (8, 8), 8, (8, 0)),
    # same priority: quotas scaled down in proportion
    ("oversubscribed quotas, same priority", [dict(name="A", quota=8), dict(name="B", quota=8)], (8, 8), 8, (4, 4)),
    # idle capacity goes to the higher-priority queue first (KAI), quotas are kept
    ("over quota by priority", [dict(name="hi", quota=2, priority=1), dict(name="lo", quota=2)], (10, 10), 8,
     (6, 2)),
    # nobody asks: nothing assigned
    ("no demand", [dict(name="A", quota=4), dict(name="B")], (0, 0), 8, (0, 0)),
    # total demand below capacity: everyone gets its demand
    ("underloaded", [dict(name="A", quota=1), dict(name="B", weight=5)], (3, 2), 8, (3, 2)),
]


@pytest.mark.parametrize(("name", "specs", "demand", "gpus", "expected"), CASES, ids=[c[0] for c in CASES])
def test_flat_fair_shares(name, specs, demand, gpus, expected):
    t = tree(*specs)
    fs = fair_shares(t, cap(gpus), gpu_rows(*demand), t.quota_vectors(CPU, MEM))
    assert fs[:, 0] == pytest.approx(expected, abs=1e-9)
    assert fs.sum(axis=0)[0] <= gpus + 1e-9


def test_hierarchy_divides_the_parent_share():
    # 10 GPUs. Top level: P (quota 6) and c (quota 2) -> quotas, then the 2 left split 1:1: P 7, c 3.
    # Inside P: a (quota 2) and b -> a 2, then P's 5 left split 1:1: a 4.5, b 2.5.
    t = tree(dict(name="P", quota=6), dict(name="a", parent="P", quota=2), dict(name="b", parent="P"),
             dict(name="c", quota=2))
    fs = fair_shares(t, cap(10), gpu_rows(0, 10, 10, 10), t.quota_vectors(CPU, MEM))
    assert fs[:, 0] == pytest.approx([7.0, 4.5, 2.5, 3.0])


def test_inner_limit_caps_children():
    t = tree(dict(name="P", limit=4), dict(name="a", parent="P"), dict(name="b", parent="P"), dict(name="c"))
    fs = fair_shares(t, cap(10), gpu_rows(0, 10, 10, 10), t.quota_vectors(CPU, MEM))
    assert fs[:, 0] == pytest.approx([4.0, 2.0, 2.0, 6.0])


def test_inner_limit_keeps_the_childrens_quotas_whole():
    """Kueue #5289: a and b (quota 2 each) under ab (quota 4, limit 4) on 16 GPUs; a asks 4 GPUs, b 2, their pods
    one core each (so CPU is not in proportion to quota). ab's demand is capped at 4 GPUs; its CPU stays the
    children's 3 cores, so each child gets its quota: 2 + 2. Scaling ab's CPU down with its GPUs (to 2 cores) cut
    both quotas by 2/3 (1.33 + 1.33, 1.33 GPUs of ab's 4 given to no one)."""
    t = tree(dict(name="ab", quota=4, limit=4), dict(name="a", parent="ab", quota=2),
             dict(name="b", parent="ab", quota=2))
    demand = np.array([[0.0, 0.0, 0.0], [4.0, 2000.0, 0.0], [2.0, 1000.0, 0.0]])
    fs = fair_shares(t, np.array([16.0, 64000.0, 1e6]), demand, t.quota_vectors(16000.0, 65536.0))
    assert fs[:, 0] == pytest.approx([4.0, 2.0, 2.0])


def test_drf_equalizes_dominant_shares_across_resources():
    # 10 GPUs and 100 CPU units. A asks 10 GPUs + 10 CPU (dominant: GPU); B asks 100 CPU (dominant: CPU).
    # At water level t: A holds (10t GPU, 10t CPU), B (0, 100t CPU); CPU runs out at 10t + 100t = 100,
    # t = 10/11: both end with a dominant share of 10/11.
    out = divide(np.array([10.0, 100.0, 1e9]), np.zeros((2, 3)), np.array([[10.0, 10.0, 0.0], [0.0, 100.0, 0.0]]),
                 np.ones(2), np.zeros(2, dtype=int))
    t = 10 / 11
    assert out == pytest.approx(np.array([[10 * t, 10 * t, 0.0], [0.0, 100 * t, 0.0]]))
    shares = dominant_share(out, np.array([10.0, 100.0, 1e9]))
    assert shares[0] == pytest.approx(shares[1])


def test_a_resource_nobody_else_needs_keeps_filling():
    # GPUs run out for A (GPU-heavy) but B only needs CPU: B keeps growing until its demand is met
    out = divide(np.array([4.0, 100.0, 1e9]), np.zeros((2, 3)), np.array([[10.0, 10.0, 0.0], [0.0, 50.0, 0.0]]),
                 np.ones(2), np.zeros(2, dtype=int))
    assert out[0] == pytest.approx([4.0, 4.0, 0.0])
    assert out[1] == pytest.approx([0.0, 50.0, 0.0])


@pytest.mark.parametrize(("x", "expected"), [
    ([1.0, 1.0, 1.0], 1.0),  # everyone at its entitlement
    ([1.0, 0.0], 0.5),  # one of two starves
    ([2.0, 1.0, 1.0], 16 / 18),  # (4)^2 / (3 * 6)
    ([], math.nan),
])
def test_jain_index(x, expected):
    got = jain_index(np.array(x))
    assert (math.isnan(got) and math.isnan(expected)) or got == pytest.approx(expected)
