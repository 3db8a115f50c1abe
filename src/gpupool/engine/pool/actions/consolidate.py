"""Consolidate (:class:`ConsolidateAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`):
running preemptible jobs move to other nodes to make room for a waiting job that does not fit although enough
GPUs are free. Never imports the scheduler."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.engine.pool.actions.solver import SCAN, Candidate
from gpupool.engine.pool.job import PENDING, PoolJob
from gpupool.engine.pool.result import CycleResult
from gpupool.engine.pool.victims import select_victims
from gpupool.model import Assignment

__all__ = ["ConsolidateAction"]


class ConsolidateAction:
    """The consolidate action (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ consolidate
    def _consolidate(self, now: float, res: CycleResult) -> bool:
        """KAI's consolidation: a waiting job that does not fit although enough GPUs are free (free, but
        scattered over nodes) moves running preemptible jobs to other nodes to make room for it.

        Jobs are tried in queue order (below fair share first), then job order, skipping those that need
        more GPUs than are free and those of a shape (GPUs per pod, pods) that already failed in this
        cycle, at most ``max_attempts`` per cycle. A move is all or nothing: the waiting job is placed
        and every moved job is placed again elsewhere at once, or nothing changes. A moved job keeps its
        queue's allocation (no quota or fair-share effect, so no reclaim loop), restarts from the
        checkpoint it takes on eviction, and is not moved again before ``min_run_s``. Reported as an
        eviction with reason ``consolidated``.
        """
        if self.free_gpus <= 1:
            return False
        acted = False
        attempts = 0
        order = sorted((self._qkey(grp), grp) for grp in range(self.n_groups) if self.pending[grp].n_jobs)
        for _, grp in order:
            # a queue whose every waiting job needs more GPUs than are free (or none) is only passed over
            if all(g < 1 or g * n > self.free_gpus for g, n, _ in self.shapes[grp]):
                continue
            tried: set[tuple[int, int]] = set()
            for job in list(self.pending[grp].jobs[:SCAN]):
                if attempts >= self.cfg.max_attempts:
                    return acted
                need = job.min_pods * job.gpus_per_pod
                if (job.gpus_per_pod < 1 or need > self.free_gpus or job.status != PENDING
                        or job.retry_at > now + 1e-9 or self._held_back(job, now)):
                    continue
                shape = (job.gpus_per_pod, job.min_pods)
                if shape in tried or not self._admissible(job, job.min_pods):
                    continue
                attempts += 1
                self.stats["consolidation_attempts"] += 1
                if self._make_room(job, now, res):
                    acted = True
                    self._victim_cache.clear()
                else:
                    self._failed_search(job, now)
                    tried.add(shape)
        return acted

    def _make_room(self, job: PoolJob, now: float, res: CycleResult, evict: Sequence[Candidate] = (),
                   costs: list[list[tuple[int, float]]] | None = None, budget: Sequence[float] | None = None,
                   reason: str = "reclaimed") -> bool:
        """Start ``job`` now by evicting some of ``evict`` (guarded by ``costs`` / ``budget`` as in
        :func:`~gpupool.engine.pool.victims.select_victims`) and moving other running preemptible jobs
        to other nodes. All or nothing: the job is placed and every moved job placed again at once, or
        nothing changes. True if the job started."""
        g, n = job.gpus_per_pod, job.min_pods
        allowed = self._allowed_for(job)
        free = self._free_whole()
        if allowed is not None:
            free = np.where(allowed, free, 0)
        room = int(free.sum()) + sum(c[0].running_gpus for c in evict)
        if room < n * g:
            return False
        # An upper bound first: if even every preemptible running job (a superset of the candidates and
        # movers below) and every candidate left could not free room, the search below fails at its first
        # bound. Only the victim lists' wake-up notes of that search are kept (_queue_victims, cached).
        sup = free + self.qnode.sum(axis=0)
        for c in evict:
            for a in c[1]:
                sup[a.node] += len(a.gpus)
        if allowed is not None:
            sup = np.where(allowed, sup, 0)
        if int((sup // max(g, 1)).sum()) < n:
            for q in range(len(self.running)):
                self._queue_victims(q, now)
            return False
        # movable: preemptible, past their minimum runtime, with a node elsewhere that has (or could get,
        # evicting every candidate on it) room for one of its pods
        pot = free.copy()
        for c in evict:
            for a in c[1]:
                if allowed is None or allowed[a.node]:
                    pot[a.node] += len(a.gpus)
        top = np.argsort(-pot, kind="stable")[:4].tolist()
        pot_l = pot.tolist()
        top_pot = [(k, pot_l[k]) for k in top]
        allowed_l = None if allowed is None else allowed.tolist()
        if self._movers_cannot_help(pot, top_pot, room, allowed, max(g, 1), n, now, evict):
            return False
        taken = {c[0].seq for c in evict}
        keyed: list[tuple[int, float, int, PoolJob]] = []  # (GPUs, -run_since, seq, mover): the order of moves
        bound = list(pot_l)  # free GPUs per node with every candidate evicted and every mover moved
        homes: dict[int, tuple[int, ...]] = {}  # top nodes with room for a pod of that many GPUs
        for q in range(len(self.running)):
            for v in self._queue_victims(q, now):
                placed = v.placed
                gpp = v.gpus_per_pod
                rg = len(placed) * gpp  # v.running_gpus
                if rg >= room or v.seq in taken:
                    continue
                if len(placed) == 1:
                    a = placed[0]
                    home = a.node
                    if allowed_l is not None and not allowed_l[home]:
                        continue
                    ok = homes.get(gpp)
                    if ok is None:
                        ok = homes[gpp] = tuple(k for k, p in top_pot if p >= gpp)
                    if len(ok) > 1 or (ok and ok[0] != home):  # a top node other than its own has room
                        keyed.append((rg, -v.run_since, v.seq, v))
                        bound[home] += len(a.gpus)
                    continue
                if allowed_l is not None and not all(allowed_l[a.node] for a in placed):
                    continue
                for k, p in top_pot:
                    if p >= gpp and all(a.node != k for a in placed):
                        keyed.append((rg, -v.run_since, v.seq, v))
                        for a in placed:
                            bound[a.node] += len(a.gpus)
                        break
        if not evict and not keyed:
            return False
        gg = max(g, 1)
        if sum(x // gg for x in bound) < n:  # select_victims' first bound: it would choose nothing
            return False
        keyed.sort(key=lambda t: t[:3])  # seq is unique: the order of sorting the movers by these keys
        movers: list[Candidate] = [(t[3], t[3].placed, False) for t in keyed]
        cands = list(evict) + movers
        n_evict = len(evict)
        # a mover's pods are all on allowed nodes: its holdings need no mask
        holdings = [self._holdings(p, allowed_l) for _, p, _ in evict] + [self._holdings(p, None) for _, p, _ in movers]
        all_costs = None if costs is None else list(costs) + [[] for _ in movers]
        for _ in range(8):  # choose; make room for the movers, or drop those that find none; choose again
            chosen = select_victims(free, max(g, 1), n, holdings, all_costs, budget)
            if not chosen:
                return False
            homeless = self._homeless(cands, chosen, n_evict, holdings, free)
            if homeless and n_evict:
                extra = self._room_for_movers(cands, chosen, homeless, n_evict, holdings, free, costs, budget)
                if extra:
                    target = {node for i in chosen for node, _ in holdings[i]}
                    chosen = chosen + extra
                    homeless = self._homeless(cands, chosen, n_evict, holdings, free, target)
            if not homeless:
                break
            for i in homeless:
                holdings[i] = []
        else:
            return False
        # an elastic job's extra workers are candidates of their own and part of the job's candidate (as in
        # _solve): when the whole job goes, its workers go with it (each pod released once)
        whole = {cands[i][0].seq for i in chosen if not cands[i][2]}
        chosen = [i for i in chosen if not (cands[i][2] and cands[i][0].seq in whole)]
        placed = self._trial(job, cands, chosen, allowed)
        if placed is None:
            return False
        # movers the placement did not displace stay; the others find a new home (the biggest first,
        # in the room the evictions made); only then do victims that still fit go back
        to_move = [i for i in reversed(chosen) if i >= n_evict and not self._restore(cands[i][0], cands[i][1],
                                                                                      quiet=True)]
        to_move.sort(key=lambda i: -cands[i][0].running_gpus)
        moved: list[tuple[PoolJob, list[Assignment]]] = []
        for i in to_move:
            v, pods, _ = cands[i]
            got = self._place(v, self._allowed_for(v), len(pods), len(pods))
            if got is None:  # undo: new homes, the job, then the movers and victims on their old devices
                for _, new in moved:
                    for a in new:
                        self.engine.release(a.pod)
                for a in placed:
                    self.engine.release(a.pod)
                for k in to_move + [i for i in chosen if i < n_evict]:
                    self._restore(cands[k][0], cands[k][1])
                self.stats["failed_moves"] += 1
                return False
            moved.append((v, got))
        needed = [i for i in reversed(chosen) if i < n_evict and not self._restore(cands[i][0], cands[i][1],
                                                                                     quiet=True)]
        self._give_up(job, cands, needed, moved, now, res, reason)
        self._start(job, placed, now, res)
        return True

    def _movers_cannot_help(self, pot: np.ndarray, top_pot: list[tuple[int, int]], room: int,
                            allowed: np.ndarray | None, g: int, n: int, now: float,
                            evict: Sequence[Candidate] = ()) -> bool:
        """The room the mover scan of :meth:`_make_room` counts (its ``bound``), from the kept victim lists:
        True when it leaves fewer than ``n`` slots of ``g`` GPUs (the scan would fail at select_victims' first
        bound). A single-pod job of ``gpp`` GPUs moves only when a top node other than its own has ``gpp`` free:
        surely when the second top node has, else only off the first top node; the jobs of ``evict`` are not
        movers; a multi-pod job moves when a top node without any of its pods has room for one of them."""
        ents = []
        for q in range(len(self.running)):
            ent = self._mover_room(q, now)
            if ent is None:
                return False
            ents.append(ent)
        p1 = top_pot[0][1] if top_pot else -1
        p2 = top_pot[1][1] if len(top_pot) > 1 else -1
        hi = min(p1, room - 1)  # rows (GPUs per pod) that may move at all: room for it, and rg < room
        bound = pot.copy()
        if hi >= 0:
            total = ents[0].agg.copy()
            for ent in ents[1:]:
                total += ent.agg
            lo = min(p2, hi)  # rows that move wherever they are
            if lo >= 0:
                bound += total[: lo + 1].sum(axis=0)
            if hi > lo:
                part = total[max(lo, -1) + 1: hi + 1].sum(axis=0)
                part[top_pot[0][0]] = 0
                bound += part
        # the scan passes over the jobs of ``evict`` (their GPUs are in ``pot`` already): take back what the
        # rows above counted for those of them in the kept lists, exactly as they were counted
        taken: set[int] = set()
        rows = len(ents[0].agg) if ents else 0
        for c in evict:
            v = c[0]
            if v.seq in taken:
                continue
            taken.add(v.seq)
            ent = ents[v.q]
            if ent.seqs is None:
                ent.seqs = frozenset(j.seq for j in ent.jobs)
            placed = v.placed
            if v.seq in ent.seqs and len(placed) == 1 and v.gpus_per_pod < rows:
                gpp, a = v.gpus_per_pod, placed[0]
                if hi >= 0 and (gpp <= lo or (gpp <= hi and a.node != top_pot[0][0])):
                    bound[a.node] -= len(a.gpus)
        for ent in ents:  # the other jobs, as the scan counts them
            for v in ent.multi:
                placed = v.placed
                gpp = v.gpus_per_pod
                if len(placed) * gpp >= room or v.seq in taken:
                    continue
                if allowed is not None and not all(allowed[a.node] for a in placed):
                    continue
                if len(placed) == 1:
                    ok = [k for k, p in top_pot if p >= gpp]
                    moves = len(ok) > 1 or (ok and ok[0] != placed[0].node)
                else:
                    moves = any(p >= gpp and all(a.node != k for a in placed) for k, p in top_pot)
                if moves:
                    for a in placed:
                        bound[a.node] += len(a.gpus)
        if allowed is not None:
            bound = np.where(allowed, bound, 0)
        return int((bound // g).sum()) < n

    @staticmethod
    def _room_for_movers(cands: Sequence[Candidate], chosen: Sequence[int], homeless: Sequence[int], n_evict: int,
                         holdings: Sequence[Sequence[tuple[int, int]]], free: np.ndarray,
                         costs: Sequence[Sequence[tuple[int, float]]] | None,
                         budget: Sequence[float] | None) -> list[int]:
        """More evictions (among the first ``n_evict`` candidates, within what is left of the budget),
        off the nodes the choice clears, so that the ``homeless`` movers find room: indices to add to
        ``chosen``, or [] when there are none."""
        target = {node for i in chosen for node, _ in holdings[i]}
        pot = np.array(free, dtype=np.int64)
        for node in target:
            pot[node] = 0
        for i in chosen:
            if i < n_evict:
                for a in cands[i][1]:
                    if a.node not in target:
                        pot[a.node] += len(a.gpus)
        left = list(budget) if budget is not None else None
        if left is not None and costs is not None:
            for i in chosen:
                if i < n_evict:
                    for key, amount in costs[i]:
                        left[key] -= amount
        picked = set(chosen)
        pool = [i for i in range(n_evict) if i not in picked]
        extra: list[int] = []
        for m in homeless:
            mover = cands[m][0]
            sub = [[(node, x) for node, x in holdings[i] if node not in target] for i in pool]
            got = select_victims(pot, max(1, mover.gpus_per_pod), len(cands[m][1]), sub,
                                 None if costs is None else [costs[i] for i in pool], left)
            if got is None:
                return []
            for k in got:
                i = pool[k]
                extra.append(i)
                for node, x in sub[k]:
                    pot[node] += x
                if left is not None and costs is not None:
                    for key, amount in costs[i]:
                        left[key] -= amount
            pool = [i for i in pool if i not in set(extra)]
            # the mover's pods now take their room (first fit, as _homeless does)
            for a in cands[m][1]:
                need = len(a.gpus)
                home = next((k for k in np.flatnonzero(pot >= need).tolist()), None)
                if home is None:
                    return []
                pot[home] -= need
        return extra

    @staticmethod
    def _homeless(cands: Sequence[Candidate], chosen: Sequence[int], n_evict: int,
                  holdings: Sequence[Sequence[tuple[int, int]]], free: np.ndarray,
                  target: set[int] | None = None) -> list[int]:
        """Chosen movers (index >= ``n_evict``) whose pods fit in no free GPUs off the ``target`` nodes
        (default: every node the choice clears; first fit, biggest pods first, counting GPUs freed
        elsewhere by the evictions): a cheap check before the engine tries the move."""
        if target is None:
            target = {node for i in chosen for node, _ in holdings[i]}
        spare = {k: int(x) for k, x in enumerate(free.tolist()) if x > 0 and k not in target}
        for i in chosen:
            if i < n_evict:
                for a in cands[i][1]:
                    if a.node not in target:
                        spare[a.node] = spare.get(a.node, 0) + len(a.gpus)
        pods = sorted(((len(a.gpus), i) for i in chosen if i >= n_evict for a in cands[i][1]), reverse=True)
        out: list[int] = []
        for gpus, i in pods:
            if i in out:
                continue
            home = next((k for k, x in spare.items() if x >= gpus), None)
            if home is None:
                out.append(i)
            else:
                spare[home] -= gpus
        return out
