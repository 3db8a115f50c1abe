"""Preempt (:class:`PreemptAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`): within a
queue, a waiting job evicts preemptible jobs of strictly lower order. Never imports the scheduler."""

from __future__ import annotations

import bisect
from collections import Counter

from gpupool.engine.pool.job import RUNNING
from gpupool.engine.pool.result import CycleResult

__all__ = ["PreemptAction"]


class PreemptAction:
    """The preempt action (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ preempt
    def _preempt(self, now: float, res: CycleResult) -> bool:
        """Within a queue: a waiting job evicts running preemptible jobs of strictly lower order (lower
        priority; with Tiresias, a higher level); elastic extras go first."""
        acted = False
        extras_all = self._extras(now)
        for grp in range(self.n_groups):
            plist = self.pending[grp]
            if not plist.n_jobs:
                continue
            extras = [c for c in extras_all if c[0].status == RUNNING and c[1][0] in c[0].placed] if extras_all else []
            extra_gpus = sum(len(p) * j.gpus_per_pod for j, p, _ in extras) if extras else 0
            top = self._worst_running(grp)
            if not extras and (top is None or not self._outranks(plist.jobs[0].key, top)):
                continue
            levels = self.level_gpus[grp] if self.cfg.fair_share else sum(self.level_gpus, Counter())
            attempts = 0
            # the first 4 x max_attempts jobs not backing off (_searchable), taken as the loop reaches them: the
            # loop changes no other waiting job, and leaves it once a job started. Without extras it ends at the
            # first job that does not outrank the worst running one (later jobs rank no better): the jobs are
            # sorted by key, and a key outranks ``top`` exactly when it sorts before ``top`` (the (priority,
            # level) pair) or, when levels do not count, before ``top[:1]``
            limit = 4 * self.cfg.max_attempts
            due = now + 1e-9
            searched = 0
            jobs = plist.jobs
            stop = len(jobs) if extras else bisect.bisect_left(plist.keys, top if self.preemptive_order else top[:1])
            for k in range(stop):
                job = jobs[k]
                if job.retry_at > due or self._held_back(job, now):
                    continue
                if searched >= limit:
                    break
                searched += 1
                if attempts >= self.cfg.max_attempts:
                    break
                if not self._admissible(job, job.min_pods):
                    continue
                bound = self.free_gpus + extra_gpus + sum(g for k, g in levels.items() if self._outranks(job.key, k))
                queues = [grp] if self.cfg.fair_share else range(len(self.running))
                allowed = self._allowed_for(job)
                if bound < job.min_pods * job.gpus_per_pod or not self._node_bound(
                        list(queues), job.gpus_per_pod, job.min_pods, extra_gpus, allowed, outranked=job.key):
                    self._failed_search(job, now)
                    continue
                # every victim list is sorted most evictable first, by (priority, level) before anything else
                # (_victim_rank and its variants): the victims this job outranks are a prefix of each list
                worse = []
                for q in queues:
                    for v in self._queue_victims(q, now):
                        if not self._outranks(job.key, v.key):
                            break
                        worse.append(v)
                if not self.cfg.fair_share:
                    worse.sort(key=self._victim_rank)
                cands = extras + [(v, v.placed, False) for v in worse]
                if not cands:
                    continue
                attempts += 1
                self.stats["preempt_attempts"] += 1
                if self._solve(job, cands, None, allowed, now, res, "preempted"):
                    acted = True
                    self._victim_cache.clear()
                    break  # the running set changed; the next pass starts afresh
                self._failed_search(job, now)
        return acted

    def _outranks(self, a: tuple, b: tuple) -> bool:
        """Does a job of key ``a`` outrank one of key ``b`` enough to preempt it?"""
        if self.preemptive_order:
            return (a[0], a[1]) < (b[0], b[1])
        return a[0] < b[0]
