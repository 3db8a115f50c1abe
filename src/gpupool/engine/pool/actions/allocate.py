"""Allocate and backfill (:class:`AllocateAction`, a mixin of
:class:`~gpupool.engine.pool.scheduler.PoolScheduler`): waiting jobs placed in queue order, blocked ones passed
over unless strict FIFO. Never imports the scheduler."""

from __future__ import annotations

import heapq

import numpy as np

from gpupool.engine.pool.job import PENDING, PoolJob
from gpupool.engine.pool.pending import fails_like
from gpupool.engine.pool.result import CycleResult

__all__ = ["AllocateAction"]

_EPS = 1e-6


class AllocateAction:
    """The allocate action with backfill (mixin; see the module docstring)."""

    def _dominated(self, grp: int, failed: dict, known: dict) -> bool:
        """True when every pending shape of ``grp`` is at least as big as one that already failed. ``known``:
        the verdict per shape for these memos, filled as computed (the caller drops it when a memo changes)."""
        for shape in self.shapes[grp]:  # _shape_failed inlined (a hot loop: no generator, no call per shape)
            dom = known.get(shape)
            if dom is None:
                memo = failed.get(shape[2])
                dom = known[shape] = fails_like(memo, shape[0], shape[1]) if memo else False
            if not dom:
                return False
        return True

    @staticmethod
    def _shape_failed(shape: tuple, failed: dict, known: dict) -> bool:
        """Whether a job of ``shape`` fails as one in ``failed`` did (``fails_like``), remembered in ``known``."""
        dom = known.get(shape)
        if dom is None:
            dom = known[shape] = fails_like(failed.get(shape[2]), shape[0], shape[1])
        return dom

    def _allocate(self, now: float, res: CycleResult) -> bool:
        """Place waiting jobs in queue order; pass over blocked ones (backfill) unless strict FIFO."""
        placed_any = False
        allowed = None
        r = self.reservation
        if r is not None:
            if r.job.status != PENDING:
                self.reservation = r = None
            elif self._try_place(r.job, None, {}, now, res):
                placed_any = True
                r = None
            else:
                allowed = ~r.mask
        if self.free_gpus <= 0 and not self.n_pending_cpu:  # jobs without GPUs may still start
            return placed_any
        # other queues' in-quota work is not held back by a reservation for a gang that would borrow
        lender = r is not None and not self._in_quota(r.job)
        failed: dict = {}  # shapes that failed with the reservation's nodes off limits
        failed_any: dict = {}  # ... and with every node (in-quota jobs while the holder borrows)
        heap = [(self._qkey(g), g) for g in range(self.n_groups) if self.pending[g].n_jobs]
        heapq.heapify(heap)
        cursor = [0] * self.n_groups
        topo = self.cfg.topology_aware
        fair = self.cfg.fair_share
        known_ver, known, known_any = self._fail_ver, {}, {}  # _dominated's verdicts for the current memos
        while heap:
            _, grp = heapq.heappop(heap)
            exempt = lender and (not fair or (
                grp != r.job.q and self.alloc[grp][0] < self.quota_g[grp] - _EPS))
            if known_ver != self._fail_ver:
                known_ver, known, known_any = self._fail_ver, {}, {}
            if failed and self._dominated(grp, failed, known) and (
                    not exempt or self._dominated(grp, failed_any, known_any)):
                continue
            plist = self.pending[grp]
            # the list under plist.jobs, read from offset base (Pending counts jobs that left its front off
            # without moving the others): no job leaves it before the loop ends
            base = plist._head
            jobs = plist._jobs
            i = cursor[grp] + base
            placed = False
            checked = self._fail_ver  # _dominated is False for these memos (or the loop would have ended)
            if exempt and fair:  # _in_quota of this group's jobs (job.q == grp != r.job.q): alloc moves only
                held, quota = self.alloc[grp][0], self.quota_g[grp] + _EPS  # when a job starts, ending the loop
            while i < len(jobs):
                job = jobs[i]
                if r is not None and r.job is job:
                    i += 1
                    continue
                if exempt and (held + job.min_pods * job.gpus_per_pod <= quota if fair
                               else job.q != r.job.q and self._in_quota(job)):
                    memo_for, allowed_for = failed_any, None
                else:
                    memo_for, allowed_for = failed, allowed
                # _try_place's failed-shape test, first: a job at least as big as a shape that failed fails
                # the same way (changing nothing), without the call
                tier = job.topology_tier if (job.topology == "required" and topo) else None  # _shape(job)[2]
                skipped = fails_like(memo_for.get(tier), job.gpus_per_pod, job.min_pods)
                ok = not skipped and self._try_place(job, allowed_for, memo_for, now, res)
                if ok:
                    placed = placed_any = True
                    break
                if not self.cfg.backfill or (self.free_gpus <= 0 and not self.n_pending_cpu):
                    return placed_any
                if checked != self._fail_ver:  # the pending shapes are unchanged until a job starts
                    checked = known_ver = self._fail_ver
                    known, known_any = {}, {}
                    if self._dominated(grp, failed, known) and (
                            not exempt or self._dominated(grp, failed_any, known_any)):
                        break
                if skipped and (fair or not exempt):  # pass over every job of a failed shape at once (the
                    if known_ver != self._fail_ver:  # same jobs this loop would skip one by one, changing nothing)
                        known_ver, known, known_any = self._fail_ver, {}, {}
                    if not exempt:
                        i = plist._next_live(i, lambda shape, k=known: self._shape_failed(shape, failed, k))
                    else:  # the memo a job reads depends on its shape only (its GPUs against the quota left)
                        i = plist._next_live(i, lambda shape, k=known, ka=known_any, h=held, top=quota: (
                            self._shape_failed(shape, failed_any, ka) if h + shape[1] * shape[0] <= top
                            else self._shape_failed(shape, failed, k)))
                    continue
                i += 1
            cursor[grp] = i - base  # an index into plist.jobs: a job that started here left it (the next one's)
            if placed:
                heapq.heappush(heap, (self._qkey(grp), grp))
        return placed_any

    def _try_place(self, job: PoolJob, allowed: np.ndarray | None, failed: dict, now: float,
                   res: CycleResult) -> bool:
        if self._held_back(job, now):
            return False
        g, nmin = job.gpus_per_pod, job.min_pods
        if not self._admissible(job, nmin):
            return False
        shape = self._shape(job)
        if fails_like(failed.get(shape[2]), g, nmin):
            return False
        placed = self._place(job, allowed, self._admissible_pods(job), nmin) if self.free_gpus >= nmin * g else None
        if placed is None:
            if not g:  # no GPU asked: its host CPU or memory, not GPUs, failed; no GPU shape fails like it
                return False
            if getattr(self.picker.inner, "per_job", False):  # where a job may go depends on more than its shape
                return False  # (its type's GPU models, HeteroPolicy.set_job_classes): a failure says nothing of others
            memo = failed.setdefault(shape[2], {})
            memo[g] = min(memo.get(g, 1 << 30), nmin)
            self._fail_ver += 1
            return False
        self._start(job, placed, now, res)
        return True
