"""The compiled fair-share division (``compiled.fair_shares``) gives the very floats of ``fairshare.fair_shares``,
bit for bit, on random queue trees (nesting, priorities, weights, limits, quotas below and above capacity) and
demands (zeros, tiny, huge, one resource only), and the scheduler uses it only while it copies the current code."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.engine import kernels
from gpupool.engine.pool import fairshare
from gpupool.engine.pool.queues import QueueConfigError, QueueSpec, QueueTree

pytestmark = pytest.mark.skipif(not kernels.enabled(), reason="numba not installed or GPUPOOL_NO_NUMBA set")


def random_tree(rng: np.random.Generator) -> QueueTree:
    n = int(rng.integers(1, 14))
    specs = []
    for i in range(n):
        parent = None
        if i and rng.random() < 0.6:
            parent = f"q{int(rng.integers(0, i))}"
        quota = float(rng.choice([0.0, 0.0, 1.0, 2.5, 8.0, 40.0]))
        limit = None if rng.random() < 0.7 else quota + float(rng.choice([0.0, 1.0, 3.5, 10.0, 64.0]))
        specs.append(QueueSpec(name=f"q{i}", parent=parent, quota=quota, limit=limit,
                               weight=float(rng.choice([0.5, 1.0, 1.0, 2.0, 3.0])),
                               priority=int(rng.choice([0, 0, 1, -1, 5]))))
    # a child may not be guaranteed more than its parent: drop quotas that the tree refuses
    try:
        return QueueTree(specs)
    except QueueConfigError:
        return QueueTree([QueueSpec(name=s.name, parent=s.parent, limit=s.limit, weight=s.weight,
                                    priority=s.priority) for s in specs])


@pytest.mark.parametrize("seed", range(40))
def test_compiled_fair_shares_are_the_python_floats(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(25):
        tree = random_tree(rng)
        n = len(tree)
        cap = np.array([float(rng.choice([0.0, 1.0, 16.0, 512.0, 1e6])), float(rng.choice([0.0, 8e3, 5e5])),
                        float(rng.choice([0.0, 6e4, 4e6]))])
        demand = rng.choice([0.0, 0.0, 1e-12, 0.5, 1.0, 3.0, 17.25, 300.0, 1e7], size=(n, 3)) * rng.random((n, 3))
        if rng.random() < 0.3:
            demand[:, 1:] = 0.0  # GPUs only
        quota = tree.quota_vectors(float(rng.choice([0.0, 4000.0])), float(rng.choice([0.0, 16384.0])))
        try:
            want = fairshare.fair_shares(tree, cap, demand, quota)
        except ZeroDivisionError:  # a resource the cluster lacks and queues ask for: the copy fails alike
            with pytest.raises(ZeroDivisionError):
                fairshare.fair_shares_compiled(tree, cap, demand, quota)
            continue
        got = fairshare.fair_shares_compiled(tree, cap, demand, quota)
        assert got.shape == want.shape
        assert got.tobytes() == want.tobytes(), (want, got)


def test_the_kernel_copies_the_current_python_code() -> None:
    """A change to fairshare.py's division must come with the kernel's (and a new FAIRSHARE_FINGERPRINT):
    until then the scheduler runs the Python code."""
    assert fairshare.fairshare_mirror_current(), fairshare.fairshare_fingerprint()


# found by a review (non-finite inputs, wrong shapes, the tolerance constant): the copy falls back to the
# Python code, so that it raises and rounds as the reference does
def test_nan_sort_key_same_shares_as_python() -> None:
    # an infinite memory demand makes a queue's t_q NaN in the second water-filling round; Python's sorted()
    # leaves it in place, np.argsort(kind="mergesort") puts it last, so `level` differs
    tree = QueueTree([QueueSpec(name=f"q{i}") for i in range(3)])
    cap = np.zeros(3)
    demand = np.array([[0.0, 1.0, 1.0], [math.inf, 2.0, math.inf], [2.0, 2.0, 0.0]])
    quota = np.zeros((3, 3))
    want = fairshare.fair_shares(tree, cap, demand, quota)
    got = fairshare.fair_shares_compiled(tree, cap, demand, quota)
    assert got.tobytes() == want.tobytes(), (want, got)


def test_nan_sign_same_as_python() -> None:
    tree = QueueTree([QueueSpec(name="a")])
    args = (tree, np.array([16.0, 0.0, 16.0]), np.array([[1.0, math.nan, 1.0]]), np.array([[0.0, math.inf, 0.0]]))
    assert fairshare.fair_shares_compiled(*args).tobytes() == fairshare.fair_shares(*args).tobytes()


def test_short_demand_raises_like_python() -> None:
    tree = QueueTree([QueueSpec(name="a"), QueueSpec(name="b"), QueueSpec(name="c", parent="a")])
    args = (tree, np.array([8.0, 8e3, 8e3]), np.ones((2, 3)), np.zeros((3, 3)))  # one row short
    with pytest.raises(IndexError):
        fairshare.fair_shares(*args)
    with pytest.raises(IndexError):  # the kernel (boundscheck=False) reads past the array instead
        fairshare.fair_shares_compiled(*args)


def test_mirror_check_sees_eps(monkeypatch) -> None:
    monkeypatch.setattr(fairshare, "_EPS", 1e-6)
    monkeypatch.setattr(fairshare, "_fairshare_ok", None)
    assert not fairshare.fairshare_mirror_current()  # the kernel still uses _FS_EPS = 1e-9
