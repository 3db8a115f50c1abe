"""Fair share of every queue: quotas first, then idle capacity by weighted DRF water-filling. No I/O.

Resources are the columns ``(GPUs, milli-CPU, MiB of memory)`` (:data:`RESOURCES`); every vector below
is ``(3,)`` and every per-queue array ``(n_queues, 3)`` float64.

Division among the children of one parent (the top-level queues share the cluster), following KAI's
"resource division algorithm" and Kueue's fair sharing:

1. **Demand** of a queue: what its running and pending jobs ask for, capped by its ``limit`` (GPUs; the
   whole vector is scaled down so its GPU part meets the limit). An inner queue's demand is the sum of
   its children's; above its own limit, it is what its children would get of the limit's GPUs (with the
   cluster's CPU and memory), by the division below: the sum of their shares. Scaling the sum down instead
   took CPU and memory in the proportion of the whole demand, not of the pods that fit, and the division
   among the children then cut their quotas for want of it (children of quota 2 + 2 under a limit of 4, one
   asking 4 GPUs: 1.33 + 1.33 GPUs instead of 2 + 2, Kueue #5289).
2. **Quota phase**: each queue gets ``min(quota, demand)``, higher ``priority`` first. When what is left
   cannot cover every quota of one priority level (e.g. failures shrank the cluster), that level is
   scaled down proportionally (by the tightest resource) and lower levels get nothing.
3. **Over-quota phase** (higher priority first): what is left is water-filled among queues whose demand
   is not met, by *weighted dominant resource fairness* (Ghodsi et al., NSDI'11): each queue's extra
   allocation grows along its unmet demand vector so that its *dominant share* above quota (largest
   ratio extra_r / capacity_r) rises in proportion to its ``weight``, until its demand is met or a
   resource it needs runs out (progressive filling). Capacity the queues cannot use stays unassigned.

The result is the queue's *fair share* (KAI "fair share", Kueue "share"): reclaim and queue order use it.
A parent's fair share is then divided among its children the same way.

With numba, :func:`fair_shares_compiled` gives the same floats in one compiled call (the kernel copy in
:mod:`gpupool.engine.kernels.fairshare`, used while :data:`FAIRSHARE_FINGERPRINT` matches this code).
"""

from __future__ import annotations

import math

import numpy as np

from gpupool.engine.kernels import fairshare as fairshare_kernels
from gpupool.engine.kernels import source_hash
from gpupool.engine.pool.queues import QueueTree

__all__ = ["RESOURCES", "dominant_share", "divide", "fair_shares", "jain_index", "FAIRSHARE_FINGERPRINT",
           "fair_shares_compiled", "fairshare_fingerprint", "fairshare_mirror_current"]

RESOURCES = ("gpu", "cpu_milli", "memory_mib")
_EPS = 1e-9


def dominant_share(alloc: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Dominant share of each row of ``alloc`` (k, 3) over ``capacity`` (3,): (k,) max_r alloc_r / cap_r."""
    cap = np.maximum(np.asarray(capacity, dtype=np.float64), _EPS)
    return (np.asarray(alloc, dtype=np.float64) / cap).max(axis=-1)


def _waterfill(alloc: list[list[float]], demand: list[list[float]], weight: list[float], rem: list[float],
               members: list[int], norm: list[float]) -> None:
    """Progressive filling in place: grow ``alloc[i]`` toward ``demand[i]`` for ``i`` in ``members``
    so that each queue's dominant share above its start rises in proportion to its weight.

    At water level ``t`` queue ``i`` has received ``weight_i * min(t, t_i) * unit_i`` where ``unit_i`` is
    its unmet demand scaled to a dominant share of 1 and ``t_i`` the level that meets it; the level
    rises until every queue is met or a resource runs out (breakpoints visited in order of ``t_i``). A
    resource that runs out freezes the queues that need it; the others go on (outer loop, at most once
    per resource).
    """
    active = [i for i in members if _dom([d - a for d, a in zip(demand[i], alloc[i], strict=True)], norm) > _EPS]
    for _ in range(4):
        if not active:
            return
        unit: dict[int, list[float]] = {}
        t_q: dict[int, float] = {}
        rate = [0.0, 0.0, 0.0]
        for i in active:
            need = [max(d - a, 0.0) for d, a in zip(demand[i], alloc[i], strict=True)]
            dom = _dom(need, norm)
            unit[i] = [x / dom for x in need]
            t_q[i] = dom / weight[i]
            w = weight[i]
            for r in range(3):
                rate[r] += w * unit[i][r]
        order = sorted(active, key=t_q.__getitem__)
        used = [0.0, 0.0, 0.0]
        t_prev = 0.0
        level = t_q[order[-1]]
        exhausted = -1
        for i in order:
            hit, r_hit = math.inf, -1
            for r in range(3):
                if rate[r] > _EPS:
                    t_r = t_prev + (rem[r] - used[r]) / rate[r]
                    if t_r < hit:
                        hit, r_hit = t_r, r
            if hit < t_q[i] - 1e-12:
                level, exhausted = max(hit, t_prev), r_hit
                break
            for r in range(3):
                used[r] += rate[r] * (t_q[i] - t_prev)
                rate[r] -= weight[i] * unit[i][r]
            t_prev = t_q[i]
        for i in active:
            grow = weight[i] * min(level, t_q[i])
            row = alloc[i]
            for r in range(3):
                row[r] += grow * unit[i][r]
                rem[r] -= grow * unit[i][r]
        for r in range(3):
            rem[r] = max(0.0, rem[r])
        if exhausted < 0:
            return
        active = [i for i in active if t_q[i] > level + 1e-12 and unit[i][exhausted] <= _EPS]


def _dom(x: list[float], norm: list[float]) -> float:
    a, b, c = x[0] / norm[0], x[1] / norm[1], x[2] / norm[2]
    return a if (a >= b and a >= c) else (b if b >= c else c)


def _divide(capacity: list[float], quota: list[list[float]], demand: list[list[float]], weight: list[float],
            priority: list[int], norm: list[float]) -> list[list[float]]:
    k = len(demand)
    demand = [[max(x, 0.0) for x in row] for row in demand]
    quota = [[min(q, d) for q, d in zip(qr, dr, strict=True)] for qr, dr in zip(quota, demand, strict=True)]
    alloc = [[0.0, 0.0, 0.0] for _ in range(k)]
    rem = [max(x, 0.0) for x in capacity]
    levels = sorted(set(priority), reverse=True)
    for level in levels:
        members = [i for i in range(k) if priority[i] == level]
        total = [sum(quota[i][r] for i in members) for r in range(3)]
        scale = min([1.0] + [rem[r] / total[r] for r in range(3) if total[r] > _EPS])
        for i in members:
            for r in range(3):
                alloc[i][r] += quota[i][r] * scale
        for r in range(3):
            rem[r] = max(0.0, rem[r] - total[r] * scale)
    for level in levels:
        _waterfill(alloc, demand, weight, rem, [i for i in range(k) if priority[i] == level], norm)
    return alloc


def divide(capacity: np.ndarray, quota: np.ndarray, demand: np.ndarray, weight: np.ndarray,
           priority: np.ndarray, norm: np.ndarray | None = None) -> np.ndarray:
    """Fair shares (k, 3) of ``k`` sibling queues sharing ``capacity`` (3,).

    ``quota``, ``demand``: (k, 3); ``weight``: (k,) > 0; ``priority``: (k,) (higher first); ``norm``:
    (3,) capacity used to compute dominant shares (default ``capacity``; the fair-share tree passes the
    cluster's so that shares are comparable at every level). See the module docstring for the steps.
    (Plain Python on purpose: queue trees are small and NumPy's per-call overhead dominates there.)
    """
    cap = [float(x) for x in np.asarray(capacity, dtype=np.float64)]
    nrm = cap if norm is None else [float(x) for x in np.asarray(norm, dtype=np.float64)]
    nrm = [max(x, _EPS) for x in nrm]
    out = _divide(cap, np.asarray(quota, dtype=np.float64).tolist(), np.asarray(demand, dtype=np.float64).tolist(),
                  [float(w) for w in np.asarray(weight, dtype=np.float64)], [int(p) for p in np.asarray(priority)],
                  nrm)
    return np.array(out, dtype=np.float64).reshape(len(out), 3)


def _cap_row(row: list[float], limit: float) -> list[float]:
    if row[0] > limit:
        scale = limit / row[0] if row[0] > 0 else 1.0
        return [x * scale for x in row]
    return row


def fair_shares(tree: QueueTree, capacity: np.ndarray, leaf_demand: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """Fair share (n, 3) of every queue of ``tree`` (inner queues included).

    ``capacity``: (3,) what the cluster can give (healthy GPUs, CPU, memory); ``leaf_demand``: (n, 3)
    running plus pending requests per queue (rows of inner queues are ignored); ``quota``: (n, 3), e.g.
    :meth:`QueueTree.quota_vectors`.
    """
    n = len(tree)
    cap = [float(x) for x in np.asarray(capacity, dtype=np.float64)]
    norm = [max(x, _EPS) for x in cap]
    raw = np.asarray(leaf_demand, dtype=np.float64).tolist()
    limit = tree.limit_gpu.tolist()
    weight = tree.weight.tolist()
    prio = tree.priority.tolist()
    quota_l = np.asarray(quota, dtype=np.float64).tolist()
    is_leaf = tree.is_leaf.tolist()
    demand = [_cap_row(raw[i], limit[i]) if is_leaf[i] else [0.0, 0.0, 0.0] for i in range(n)]
    for i in reversed(tree.order):  # children before parents
        kids = tree.children[i]
        if kids:
            row = [sum(demand[c][r] for c in kids) for r in range(3)]
            if row[0] > limit[i]:  # what the children would get of the limit's GPUs
                rows = _divide([limit[i], cap[1], cap[2]], [quota_l[c] for c in kids], [demand[c] for c in kids],
                               [weight[c] for c in kids], [prio[c] for c in kids], norm)
                row = [sum(x[r] for x in rows) for r in range(3)]
            demand[i] = row
    share = [[0.0, 0.0, 0.0] for _ in range(n)]

    def split(members: list[int], budget: list[float]) -> None:
        rows = _divide(budget, [quota_l[m] for m in members], [demand[m] for m in members],
                       [weight[m] for m in members], [prio[m] for m in members], norm)
        for m, row in zip(members, rows, strict=True):
            share[m] = row

    split(list(tree.top), cap)
    for i in tree.order:
        kids = list(tree.children[i])
        if kids:
            split(kids, share[i])
    return np.array(share, dtype=np.float64).reshape(n, 3)


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)`` of the values ``x`` (1 = equal; NaN if empty or all 0)."""
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) == 0 or not (x**2).sum() > 0:
        return float("nan")
    return float(x.sum() ** 2 / (len(x) * (x**2).sum()))


FAIRSHARE_FINGERPRINT = "9087dbc3621ce928"
"""Hash of the source of the fair-share code :func:`_fair_shares_kernel` copies (``fairshare.fair_shares``,
``_divide``, ``_waterfill``, ``_dom``, ``_cap_row``); when it does not match, the Python code runs."""

_fairshare_ok: bool | None = None


def fairshare_fingerprint() -> str:
    return source_hash(fair_shares, _divide, _waterfill, _dom, _cap_row)


def fairshare_mirror_current() -> bool:
    """True when the fair-share code :func:`_fair_shares_kernel` copies is the one it was written for."""
    global _fairshare_ok
    if _fairshare_ok is None:
        try:
            _fairshare_ok = fairshare_fingerprint() == FAIRSHARE_FINGERPRINT and _EPS == fairshare_kernels.FS_EPS
        except (OSError, TypeError):
            _fairshare_ok = False
    return _fairshare_ok


def fair_shares_compiled(tree, cap: np.ndarray, leaf_demand: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """``fairshare.fair_shares(tree, cap, leaf_demand, quota)`` in one compiled call: (n, 3) float64, the same
    floats. The tree's child lists are packed once (``tree._fs_packed``)."""
    packed = getattr(tree, "_fs_packed", None)
    if packed is None:
        ptr = np.zeros(len(tree) + 1, dtype=np.int64)
        for i, kids in enumerate(tree.children):
            ptr[i + 1] = ptr[i] + len(kids)
        idx = np.array([c for kids in tree.children for c in kids], dtype=np.int64)
        packed = (np.array(tree.order, dtype=np.int64), ptr, idx, np.array(tree.top, dtype=np.int64),
                  np.ascontiguousarray(tree.is_leaf), np.ascontiguousarray(tree.limit_gpu, dtype=np.float64),
                  np.ascontiguousarray(tree.weight, dtype=np.float64),
                  np.ascontiguousarray(tree.priority, dtype=np.int64))
        tree._fs_packed = packed
    n = len(tree)
    q = np.ascontiguousarray(quota, dtype=np.float64)
    c = np.ascontiguousarray(cap, dtype=np.float64)
    d = np.ascontiguousarray(leaf_demand, dtype=np.float64)
    if q.shape != (n, 3) or c.shape != (3,) or d.shape != (n, 3):  # the kernel does not check bounds
        return _fairshare_python(tree, cap, leaf_demand, quota)
    out = np.empty((n, 3))
    fairshare_kernels.fair_shares_kernel(*packed, q, c, d, out)
    if not np.isfinite(out).all():  # a NaN sort key or NaN sign: Python's sorted() and NaN rules, not the copy's
        return _fairshare_python(tree, cap, leaf_demand, quota)
    return out


def _fairshare_python(tree, cap, leaf_demand, quota):
    return fair_shares(tree, cap, leaf_demand, quota)
