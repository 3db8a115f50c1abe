"""Reclaim (:class:`ReclaimAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`): a queue below
its fair share takes GPUs back from queues above theirs. Never imports the scheduler.

In a queue tree the rule holds at every level, as in KAI's queue hierarchy and Kueue's cohorts: leaf ``q`` may
take from leaf ``r`` where their paths meet, i.e. comparing the sibling subtrees under their lowest common
ancestor. Every queue of ``q``'s path below that ancestor must stay within its fair share with the job (the
reclaimer ends at or below its share), and every queue of ``r``'s path below it must be above its share when a
victim is taken (the victim's subtree is not pushed below its share by more than that one job). The common
ancestors keep their allocation (GPUs move inside their subtree), so only their limits count: a reclaim may
take a job past an ancestor's limit only by evicting enough under that ancestor to stay within it.
"""

from __future__ import annotations

import math

from gpupool.engine.pool.actions.solver import SCAN, Candidate
from gpupool.engine.pool.job import PENDING, RUNNING, PoolJob
from gpupool.engine.pool.result import CycleResult

__all__ = ["ReclaimAction"]

_EPS = 1e-6


class ReclaimAction:
    """The reclaim action (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ reclaim
    def _reclaim_blocked(self, q: int, fs: list[float]) -> bool:
        """Leaf ``q`` (with waiting jobs) cannot reclaim now: it holds its fair share ``fs[q]`` and its quota, or
        its smallest waiting job would take it above its quota and some queue on its path above its fair
        share. The in-share and in-quota tests of :meth:`_reclaim` only fail more as a job's GPUs grow (alloc
        + need rises with need): when the smallest waiting job fails both, every job does."""
        alloc_q = self.alloc[q][0]
        if alloc_q >= fs[q] - _EPS and alloc_q >= self.quota_g[q] - _EPS:
            return True
        least = math.inf  # plain loops: this runs for every queue with waiting jobs, every reclaim call
        for g, n, _ in self.shapes[q]:
            if g * n < least:
                least = g * n
        if alloc_q + least <= self.quota_g[q] + _EPS:
            return False
        alloc = self.alloc
        for a in self._own_path(q):  # on every pair's path of q below the common ancestor
            if not alloc[a][0] + least <= fs[a] + _EPS:
                return True
        return False

    def _reclaim(self, now: float, res: CycleResult) -> bool:
        """Cross-queue reclaim up to fair share, and in-quota reclaim by priority (scheduler docstring)."""
        if not self.cfg.fair_share or len(self.tree.leaves) <= 1:
            return False
        fs = self._fs_g
        leaves = self._leaves
        pending = self.pending
        # Most cycles no queue can reclaim (each fails _reclaim_blocked): then the loop below would pass over
        # every queue, changing nothing. Only an action inside the loop moves allocations, so that test, made
        # once for every queue before it, is the loop's own answer (a shortcut, no other effect).
        blocked = self._reclaim_blocked
        for q in leaves:  # a plain loop (no generator): the test is made on most cycles
            if pending[q].n_jobs and not blocked(q, fs):
                break
        else:
            return False
        nq = len(self.tree)
        over = [self.alloc[b][0] - fs[b] for b in range(nq)]
        any_over = any(x > _EPS for x in over)
        acted = False
        order = sorted((self._qkey(q), q) for q in leaves if pending[q].n_jobs)
        extras_all = self._extras(now) if self.elastic_running else []
        due = now + 1e-9
        running = self.running
        for _, q in order:
            if self._reclaim_blocked(q, fs):
                continue
            path_q = self.paths[q]
            scan = self.pending[q].jobs[:SCAN]  # the first jobs that may reclaim, one per shape
            if not any(job.retry_at <= due for job in scan):
                continue  # every one is backing off: nothing below can act (a shortcut, no other effect)
            # queues that may give GPUs: by priority (to an in-quota job), by fair share (to an in-share job)
            # (r, r's path below the common ancestor, and the length of q's: an index into paths[q])
            by_prio: list[tuple[int, int]] = []
            by_fs: list[tuple[int, list[int], int]] = []
            for r, path_r, side_q, lower in self._reclaim_pairs(q):
                if not running[r]:
                    continue
                if lower:
                    by_prio.append((r, len(side_q)))
                if any_over:
                    for b in path_r:
                        if over[b] <= _EPS:
                            break
                    else:
                        by_fs.append((r, path_r, len(side_q)))
            if not by_prio and not by_fs:
                continue
            attempts = 0
            tried: set[tuple[int, int]] = set()
            # within-share test per (GPU count, length of q's path below the common ancestor): q's path up to there
            # stays within its share with the job (until an action moves alloc)
            in_fs_by_need: dict[tuple[int, int], bool] = {}
            for job in scan:
                if attempts >= self.cfg.max_attempts:
                    break
                if job.status != PENDING or job.retry_at > due or self._held_back(job, now):
                    continue
                need = job.min_pods * job.gpus_per_pod
                in_quota = bool(by_prio) and self.alloc[q][0] + need <= self.quota_g[q] + _EPS
                shape = (job.gpus_per_pod, job.min_pods)
                if shape in tried:
                    continue
                room = self._reclaim_room(job, need)
                if room is None:
                    continue
                under, must_free = room  # victims must come from under paths[q][under] and free must_free GPUs
                # eligible queues (guarded by their share unless taken by priority), and an O(1) bound
                eligible: list[tuple[int, list[int]]] = [(r, []) for r, k in by_prio if k <= under] if in_quota else []
                seen = {r for r, _ in eligible}
                for r, path_r, k in by_fs:
                    if k > under or r in seen:
                        continue
                    in_fs = in_fs_by_need.get((need, k))
                    if in_fs is None:
                        in_fs = in_fs_by_need[(need, k)] = all(self.alloc[a][0] + need <= fs[a] + _EPS
                                                                for a in path_q[:k])
                    if in_fs:
                        eligible.append((r, path_r))
                if not eligible:
                    continue
                budget = sum(self.alloc[r][0] for r, _ in eligible)  # victims only need their queue above its share
                if self.free_gpus + budget < need - _EPS or budget < must_free - _EPS:
                    self._failed_search(job, now)
                    tried.add(shape)
                    continue
                allowed = self._allowed_for(job)
                bound = self._node_bound([r for r, _ in eligible], job.gpus_per_pod, job.min_pods, 0, allowed,
                                         budget=budget)
                if not bound and not self.cfg.consolidate:
                    self._failed_search(job, now)
                    tried.add(shape)
                    continue
                cands: list[Candidate] = []
                costs: list[list[tuple[int, float]]] = []
                ranks: list[tuple] = []
                for r, guard in eligible:
                    ratio = self.alloc[r][0] / fs[r] if fs[r] > _EPS else math.inf
                    for v, pods, _ in extras_all:  # elastic extra workers first: the job keeps running
                        if v.q == r and v.status == RUNNING and pods[0] in v.placed:
                            cands.append((v, pods, True))
                            costs.append([(b, float(len(pods) * v.gpus_per_pod)) for b in guard])
                            ranks.append((0, -ratio) + self._victim_rank(v))
                    for v in self._queue_victims(r, now, reclaim=True):
                        cands.append((v, v.placed, False))
                        costs.append([(b, float(v.running_gpus)) for b in guard])
                        ranks.append((1, -ratio) + self._victim_rank(v))
                if not cands:
                    continue
                idx = sorted(range(len(cands)), key=ranks.__getitem__)
                cands = [cands[i] for i in idx]
                costs = [costs[i] for i in idx]
                attempts += 1
                done = False
                if bound:
                    self.stats["reclaim_attempts"] += 1
                    done = self._solve(job, cands, (costs, over), allowed, now, res, "reclaimed", must_free)
                if not done and self.cfg.consolidate and must_free <= 0:  # evict and move others aside (node shapes)
                    self.stats["consolidation_attempts"] += 1
                    done = self._make_room(job, now, res, cands, costs, over, "reclaimed")
                if done:
                    acted = True
                    self._victim_cache.clear()
                    in_fs_by_need.clear()
                    over = [self.alloc[b][0] - fs[b] for b in range(nq)]
                    any_over = any(x > _EPS for x in over)
                else:
                    self._failed_search(job, now)
                    tried.add(shape)  # a job of the same shape would fail the same way
        return acted

    def _reclaim_room(self, job: PoolJob, need: float) -> tuple[int, float] | None:
        """Where victims must come from for ``job`` (``need`` GPUs) to start within the limits of its queue's path:
        ``(k, gpus)``: evictions under ``paths[q][k]`` must give up at least ``gpus`` GPUs (``(len(path), 0.0)``:
        none needed, any victim will do), or None when no reclaim can admit it (a limit of its own leaf, or, for
        a non-preemptible job, a quota: evicting preemptible work frees neither)."""
        path = self.paths[job.q]
        under, must_free = len(path), 0.0
        alloc = self.alloc
        for k in range(len(path) - 1, -1, -1):  # from the top, so that ``under`` ends at the lowest ancestor
            a = path[k]
            if not job.preemptible and self.np_alloc[a] + need > self.quota_g[a] + _EPS:
                return None
            excess = alloc[a][0] + need - self.limit_g[a]
            if excess > _EPS:
                if k == 0:
                    return None
                under, must_free = k, max(must_free, excess)
        return under, must_free
