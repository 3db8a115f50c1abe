"""The victim solver shared by reclaim, preempt and elastic shrink (KAI's single all-or-nothing solver).

:func:`select_victims` is the pure selection step: given the free GPUs per node and the candidate
victims (in order of preference, most evictable first), choose a set whose eviction lets ``n`` pods of
``g`` GPUs fit, or say that none does. It works on GPU counts only; the scheduler then *verifies* the
choice by releasing the victims and placing the job through the engine, and either commits (keeping
the victims that the placement did not need) or restores every victim exactly as it was. Nothing is
evicted unless the preemptor is placed: all or nothing.

Selection (greedy, node-aware so that multi-GPU pods get whole free slots rather than scattered GPUs):
while fewer than ``n`` pods fit, for every node take its not-yet-chosen candidates in preference order
until the node gains one more pod slot; among nodes, choose the one whose worst (least evictable)
needed victim ranks best, then the fewest GPUs evicted. Evicting a gang frees its pods on every node.
A budget guard may refuse candidates (e.g. those whose queue would drop below its fair share).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["select_victims", "top_up_victims"]


def select_victims(free_gpus: np.ndarray, g: int, n: int, holdings: Sequence[Sequence[tuple[int, int]]],
                   costs: Sequence[Sequence[tuple[int, float]]] | None = None,
                   budget: Sequence[float] | None = None) -> list[int] | None:
    """Indices of ``holdings`` to evict so that ``n`` pods of ``g`` GPUs fit, or None.

    ``free_gpus``: (n_nodes,) int, free whole GPUs per node that the job may use (0 on nodes it may not);
    ``holdings[i]``: ``(node, gpus)`` pairs that candidate ``i`` would free (only nodes the job may use);
    candidates are in preference order (index 0 most evictable). Optional guard: evicting candidate ``i``
    spends ``amount`` from ``budget[key]`` for each ``(key, amount)`` of ``costs[i]``; a candidate may be
    taken only while every budget it spends from is still positive (e.g. its queue is still above its
    fair share), so a budget ends at most one candidate below zero; a candidate that finds a budget
    spent is skipped, and a node's victims are taken together or not at all. Returns ``[]`` when the
    pods already fit.
    """
    if g <= 0:
        return []
    if isinstance(free_gpus, np.ndarray) and free_gpus.dtype.kind in "ib":  # the same Python ints, in one call
        arr = free_gpus.astype(np.int64, copy=False)
        pot = arr.tolist()
        fits = sum(pot) if g == 1 else int((arr // g).sum())  # integer floor division: the same count
    else:
        pot = [int(x) for x in free_gpus]
        fits = sum(x // g for x in pot)
    if fits >= n:
        return []
    added: dict[int, int] = {}  # upper bound: everything evicted (only the nodes victims free change)
    for hold in holdings:
        for node, gpus in hold:
            added[node] = added.get(node, 0) + gpus
    bound = fits
    for node, gpus in added.items():
        bound += (pot[node] + gpus) // g - pot[node] // g
    if bound < n:
        return None
    left = list(budget) if budget is not None else []
    if g == 1:  # any GPU will do: take candidates in order
        chosen: list[int] = []
        for i, hold in enumerate(holdings):
            gpus = sum(x for _, x in hold)
            if not gpus:
                continue
            if costs is not None:
                if any(left[key] <= 1e-9 for key, _ in costs[i]):
                    continue
                for key, amount in costs[i]:
                    left[key] -= amount
            chosen.append(i)
            fits += gpus
            if fits >= n:
                return chosen
        return None
    by_node: dict[int, list[tuple[int, int]]] = {}
    for i, hold in enumerate(holdings):
        for node, gpus in hold:
            by_node.setdefault(node, []).append((i, gpus))
    chosen = []
    taken: set[int] = set()
    refused: set[int] = set()
    while fits < n:
        best: tuple[int, int] | None = None
        best_picks: list[int] = []
        for node, cands in by_node.items():
            need = g - pot[node] % g
            got, worst, picks = 0, -1, []
            for i, gpus in cands:
                if i in taken or i in refused:
                    continue
                picks.append(i)
                got += gpus
                worst = i
                if got >= need:
                    break
            if got >= need:
                cost = (worst, got)
                if best is None or cost < best:
                    best, best_picks = cost, picks
        if best is None:
            return None
        if costs is not None:  # all of the node's picks within budget, or refuse the first that is not
            trial = list(left)
            bad = -1
            for i in best_picks:
                if any(trial[key] <= 1e-9 for key, _ in costs[i]):
                    bad = i
                    break
                for key, amount in costs[i]:
                    trial[key] -= amount
            if bad >= 0:
                refused.add(bad)
                continue
            left = trial
        for i in best_picks:
            taken.add(i)
            chosen.append(i)
            for node, gpus in holdings[i]:
                before = pot[node] // g
                pot[node] += gpus
                fits += pot[node] // g - before
    return chosen


def top_up_victims(chosen: list[int], gpus: Sequence[float], must_free: float,
                   costs: Sequence[Sequence[tuple[int, float]]] | None = None,
                   budget: Sequence[float] | None = None) -> list[int] | None:
    """``chosen`` (from :func:`select_victims`) with more candidates, in preference order, until together they give
    up at least ``must_free`` GPUs (``gpus[i]``: what candidate ``i`` gives up), under the same budget guard; None
    when the candidates cannot. Used where a queue limit, not room on the nodes, needs the evictions."""
    given = sum(gpus[i] for i in chosen)
    if given >= must_free - 1e-9:
        return chosen
    left = list(budget) if budget is not None else []
    if costs is not None:
        for i in chosen:
            for key, amount in costs[i]:
                left[key] -= amount
    out = list(chosen)
    taken = set(chosen)
    for i, amount in enumerate(gpus):
        if i in taken or amount <= 0:
            continue
        if costs is not None:
            if any(left[key] <= 1e-9 for key, _ in costs[i]):
                continue
            for key, spent in costs[i]:
                left[key] -= spent
        out.append(i)
        given += amount
        if given >= must_free - 1e-9:
            return out
    return None
