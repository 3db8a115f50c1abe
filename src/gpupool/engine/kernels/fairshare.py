"""Compiled fair-share division: a copy of :mod:`gpupool.engine.pool.fairshare`'s (same floats), called by its
:func:`~gpupool.engine.pool.fairshare.fair_shares_compiled`. Pure array code."""

from __future__ import annotations

import math

import numpy as np

from gpupool.engine.kernels.registry import jit as _jit

# A copy of gpupool.engine.pool.fairshare (fair_shares, _divide, _waterfill, _dom, _cap_row), operation for
# operation in the same order, so that every share is the same float: Python's float is an IEEE double as
# numba's is, and each builtin is spelled out as CPython evaluates it (max(x, 0.0) keeps x unless 0.0 > x;
# min(a, b) keeps a unless b < a; sum() adds left to right from 0; sorted() is stable). The pool scheduler
# calls it once per change of demand (about 50,000 times on the whole Philly trace, where the Python code
# was about 7% of the simulator's time). FAIRSHARE_FINGERPRINT holds the Python code it copies.
_FS_EPS = 1e-9


@_jit
def _fs_dom(x0, x1, x2, n0, n1, n2):  # pragma: no cover - compiled
    a, b, c = x0 / n0, x1 / n1, x2 / n2
    if a >= b and a >= c:
        return a
    return b if b >= c else c


@_jit
def _fs_waterfill(alloc, demand, weight, rem, members, norm):  # pragma: no cover - compiled
    n0, n1, n2 = norm[0], norm[1], norm[2]
    k = alloc.shape[0]
    active = np.empty(k, dtype=np.int64)
    na = 0
    for i in members:
        if _fs_dom(demand[i, 0] - alloc[i, 0], demand[i, 1] - alloc[i, 1], demand[i, 2] - alloc[i, 2],
                   n0, n1, n2) > _FS_EPS:
            active[na] = i
            na += 1
    unit = np.zeros((k, 3))
    t_q = np.zeros(k)
    rate = np.zeros(3)
    used = np.zeros(3)
    for _ in range(4):
        if na == 0:
            return
        rate[:] = 0.0
        for j in range(na):
            i = active[j]
            need0 = demand[i, 0] - alloc[i, 0]
            need1 = demand[i, 1] - alloc[i, 1]
            need2 = demand[i, 2] - alloc[i, 2]
            need0 = 0.0 if 0.0 > need0 else need0
            need1 = 0.0 if 0.0 > need1 else need1
            need2 = 0.0 if 0.0 > need2 else need2
            dom = _fs_dom(need0, need1, need2, n0, n1, n2)
            unit[i, 0] = need0 / dom
            unit[i, 1] = need1 / dom
            unit[i, 2] = need2 / dom
            t_q[i] = dom / weight[i]
            w = weight[i]
            for r in range(3):
                rate[r] += w * unit[i, r]
        keys = np.empty(na)
        for j in range(na):
            keys[j] = t_q[active[j]]
        order = np.argsort(keys, kind="mergesort")
        used[:] = 0.0
        t_prev = 0.0
        level = t_q[active[order[na - 1]]]
        exhausted = -1
        for jj in range(na):
            i = active[order[jj]]
            hit = math.inf
            r_hit = -1
            for r in range(3):
                if rate[r] > _FS_EPS:
                    t_r = t_prev + (rem[r] - used[r]) / rate[r]
                    if t_r < hit:
                        hit = t_r
                        r_hit = r
            if hit < t_q[i] - 1e-12:
                level = t_prev if t_prev > hit else hit
                exhausted = r_hit
                break
            for r in range(3):
                used[r] += rate[r] * (t_q[i] - t_prev)
                rate[r] -= weight[i] * unit[i, r]
            t_prev = t_q[i]
        for j in range(na):
            i = active[j]
            grow = weight[i] * (t_q[i] if t_q[i] < level else level)
            for r in range(3):
                alloc[i, r] += grow * unit[i, r]
                rem[r] -= grow * unit[i, r]
        for r in range(3):
            rem[r] = rem[r] if rem[r] > 0.0 else 0.0
        if exhausted < 0:
            return
        nb = 0
        for j in range(na):
            i = active[j]
            if t_q[i] > level + 1e-12 and unit[i, exhausted] <= _FS_EPS:
                active[nb] = i
                nb += 1
        na = nb


@_jit
def _fs_divide(members, budget, quota_all, demand_all, weight_all, prio_all, norm, out):  # pragma: no cover
    k = members.shape[0]
    demand = np.empty((k, 3))
    quota = np.empty((k, 3))
    weight = np.empty(k)
    prio = np.empty(k, dtype=np.int64)
    for j in range(k):
        m = members[j]
        weight[j] = weight_all[m]
        prio[j] = prio_all[m]
        for r in range(3):
            d = demand_all[m, r]
            d = 0.0 if 0.0 > d else d
            demand[j, r] = d
            q = quota_all[m, r]
            quota[j, r] = d if d < q else q
    alloc = np.zeros((k, 3))
    rem = np.empty(3)
    for r in range(3):
        rem[r] = 0.0 if 0.0 > budget[r] else budget[r]
    levels = np.unique(prio)[::-1]
    total = np.empty(3)
    for level in levels:
        for r in range(3):
            s = 0.0
            for j in range(k):
                if prio[j] == level:
                    s += quota[j, r]
            total[r] = s
        scale = 1.0
        for r in range(3):
            if total[r] > _FS_EPS:
                v = rem[r] / total[r]
                if v < scale:
                    scale = v
        for j in range(k):
            if prio[j] == level:
                for r in range(3):
                    alloc[j, r] += quota[j, r] * scale
        for r in range(3):
            v = rem[r] - total[r] * scale
            rem[r] = v if v > 0.0 else 0.0
    for level in levels:
        at = np.empty(k, dtype=np.int64)
        na = 0
        for j in range(k):
            if prio[j] == level:
                at[na] = j
                na += 1
        _fs_waterfill(alloc, demand, weight, rem, at[:na], norm)
    for j in range(k):
        for r in range(3):
            out[members[j], r] = alloc[j, r]


@_jit
def _fs_cap_row(demand, i, limit):  # pragma: no cover - compiled
    if demand[i, 0] > limit:
        scale = limit / demand[i, 0] if demand[i, 0] > 0 else 1.0
        for r in range(3):
            demand[i, r] = demand[i, r] * scale


@_jit
def _fair_shares_kernel(order, child_ptr, child_idx, top, is_leaf, limit, weight, prio, quota, cap, raw,
                        out):  # pragma: no cover - compiled
    n = raw.shape[0]
    norm = np.empty(3)
    for r in range(3):
        norm[r] = _FS_EPS if _FS_EPS > cap[r] else cap[r]
    demand = np.zeros((n, 3))
    for i in range(n):
        if is_leaf[i]:
            for r in range(3):
                demand[i, r] = raw[i, r]
            _fs_cap_row(demand, i, limit[i])
    within = np.zeros((n, 3))  # the children's division of a limit's GPUs
    vbudget = np.empty(3)
    for jj in range(order.shape[0] - 1, -1, -1):
        i = order[jj]
        if child_ptr[i + 1] > child_ptr[i]:
            kids = child_idx[child_ptr[i]:child_ptr[i + 1]]
            for r in range(3):
                s = 0.0
                for c in kids:
                    s += demand[c, r]
                demand[i, r] = s
            if demand[i, 0] > limit[i]:  # what the children would get of the limit's GPUs
                vbudget[0] = limit[i]
                vbudget[1] = cap[1]
                vbudget[2] = cap[2]
                _fs_divide(kids, vbudget, quota, demand, weight, prio, norm, within)
                for r in range(3):
                    s = 0.0
                    for c in kids:
                        s += within[c, r]
                    demand[i, r] = s
    out[:, :] = 0.0
    _fs_divide(top, cap, quota, demand, weight, prio, norm, out)
    budget = np.empty(3)
    for i in order:
        if child_ptr[i + 1] > child_ptr[i]:
            for r in range(3):
                budget[r] = out[i, r]
            _fs_divide(child_idx[child_ptr[i]:child_ptr[i + 1]], budget, quota, demand, weight, prio, norm, out)


# public names read by gpupool.engine.pool.fairshare (the kernel through this module at each call:
# :func:`gpupool.engine.kernels.enabled` rebinds it with the kernel's own name)
FS_EPS = _FS_EPS
fair_shares_kernel = _fair_shares_kernel
