"""The eviction actions' shared solver (:class:`VictimSolver`, a mixin of
:class:`~gpupool.engine.pool.scheduler.PoolScheduler`): choose victims, give them up, place the preemptor, put
back the victims it did not need; all or nothing. Never imports the scheduler."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.result import CycleResult
from gpupool.engine.pool.victims import select_victims, top_up_victims
from gpupool.model import MILLI, AllocationError, Assignment

__all__ = ["SCAN", "Candidate", "VictimSolver"]

SCAN = 64
"""Waiting jobs per queue that reclaim and consolidation look at in a cycle (the first, in job order)."""

Candidate = tuple[PoolJob, Sequence[Assignment], bool]
"""(job, the pods it would give up, True for an elastic shrink / False for an eviction)."""


class VictimSolver:
    """The shared eviction solver and the eviction bookkeeping (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ the shared solver
    @staticmethod
    def _holdings(pods: Sequence[Assignment], allowed: np.ndarray | list[bool] | None) -> list[tuple[int, int]]:
        """(node, GPUs) a victim's pods would free on nodes the preemptor may use (running pods sit on
        healthy GPUs: a failure kills its pods at once)."""
        if allowed is None and len(pods) == 1:
            a = pods[0]
            return [(a.node, len(a.gpus))]
        out: dict[int, int] = {}
        for a in pods:
            if allowed is not None and not allowed[a.node]:
                continue
            out[a.node] = out.get(a.node, 0) + len(a.gpus)
        return list(out.items())

    def _solve(self, job: PoolJob, cands: list[Candidate], guard: tuple[list, list] | None,
               allowed: np.ndarray | None, now: float, res: CycleResult, reason: str, must_free: float = 0.0) -> bool:
        """Evict a subset of ``cands`` so that ``job`` starts now; all or nothing. True if it started.

        ``must_free``: GPUs the evictions must give up together even when the job would fit without them (a limit
        of a queue above the job's that every candidate is under: the job may start only within it)."""
        if not cands:
            return False
        g = job.gpus_per_pod
        free = self._free_whole()
        if allowed is not None:
            free = np.where(allowed, free, 0)
        holdings = [self._holdings(p, allowed) for _, p, _ in cands]
        costs, budget = guard if guard is not None else (None, None)
        chosen = select_victims(free, max(g, 1), job.min_pods, holdings, costs, budget)
        if chosen is not None and must_free > 0:
            chosen = top_up_victims(chosen, [len(p) * v.gpus_per_pod for v, p, _ in cands], must_free, costs, budget)
        if not chosen:
            return False
        # an elastic job's extra workers are candidates of their own and part of the job's candidate:
        # when the whole job goes, its workers go with it (release each pod once)
        whole = {cands[i][0].seq for i in chosen if not cands[i][2]}
        chosen = [i for i in chosen if not (cands[i][2] and cands[i][0].seq in whole)]
        placed = self._trial(job, cands, chosen, allowed)
        if placed is None:
            return False
        evicted = []
        given = sum(len(cands[i][1]) * cands[i][0].gpus_per_pod for i in chosen)
        for i in reversed(chosen):  # keep the victims the placement did not need (and must_free does not)
            gpus = len(cands[i][1]) * cands[i][0].gpus_per_pod
            if given - gpus >= must_free - 1e-9 and self._restore(cands[i][0], cands[i][1], quiet=True):
                self.stats["victim_restores"] += 1
                given -= gpus
            else:
                evicted.append(i)
        self._give_up(job, cands, list(reversed(evicted)), (), now, res, reason)
        self._start(job, placed, now, res)
        return True

    def _give_up(self, job: PoolJob, cands: Sequence[Candidate], take: Sequence[int],
                 moved: Sequence[tuple[PoolJob, list[Assignment]]], now: float, res: CycleResult,
                 reason: str) -> None:
        """Books of the candidates ``take`` (their pods already released) that make room for ``job``, in that
        order: each is evicted, or, for an elastic job's extra worker, its job shrinks (once per job); then each
        of ``moved`` (a job and its new pods) is evicted and started again. Every eviction names ``job`` as its
        preemptor (``CycleResult.evictions``)."""
        shrunk: dict[int, tuple[PoolJob, list[Assignment]]] = {}
        self._preemptor = job
        try:
            for i in take:
                victim, pods, shrink = cands[i]
                if shrink:  # the job runs on with fewer workers
                    shrunk.setdefault(victim.seq, (victim, []))[1].extend(pods)
                else:
                    self._evict(victim, now, res, f"{reason} by {job.name}")
            for victim, pods in shrunk.values():
                self._shrink(victim, pods, now, res)
            for v, got in moved:
                self._evict(v, now, res, f"consolidated by {job.name}")
                self._start(v, got, now, res)
                self.stats["moved_jobs"] += 1
        finally:
            self._preemptor = None

    def _trial(self, job: PoolJob, cands: Sequence[Candidate], chosen: Sequence[int],
               allowed: np.ndarray | None) -> list[Assignment] | None:
        """Release the ``chosen`` candidates and place ``job``; if it does not fit, put every candidate
        back exactly as it was and return None."""
        for i in chosen:
            self._release_pods(cands[i][0], cands[i][1])
        placed = self._place(job, allowed, self._admissible_pods(job), job.min_pods)
        if placed is None:
            for i in chosen:
                self._restore(cands[i][0], cands[i][1])
        return placed

    def _evict(self, victim: PoolJob, now: float, res: CycleResult, reason: str) -> None:
        """Books of a running job whose pods were released: back to its queue, reported as evicted. A job
        that also started in this very cycle (possible with a minimum runtime of 0) never ran: it leaves
        ``started`` instead, so that the driver, which carries out ``preempted`` before ``started``,
        sees one consistent change."""
        pods = list(victim.placed)
        victim.evicted_at = now
        self._account_stop(victim, now)
        self._enqueue(victim, now)
        res.evictions.append((victim, pods, reason.split(" ", 1)[0], self._preemptor))
        for k, j in enumerate(res.started):
            if j is victim:
                del res.started[k]
                return
        victim.preemptions += 1
        res.preempted.append((victim, reason))

    def _restore(self, job: PoolJob, pods: Sequence[Assignment], quiet: bool = False) -> bool:
        """Put ``pods`` back on exactly their devices, all or none; True on success."""
        done: list[Assignment] = []
        try:
            reqs = {r.name: r for r in job.pods}
            for a in pods:
                req = reqs[a.pod]
                b = self.state.allocate(req, a.node, a.gpus, a.gpu_milli if a.gpus else None)
                self.picker.on_allocate(self.state, b)
                done.append(b)
        except AllocationError:
            for b in done:
                self.engine.release(b.pod)
            if not quiet:
                raise
            return False
        self.free_gpus -= sum(len(a.gpus) for a in pods if a.gpu_milli >= MILLI)
        return True

    def _shrink(self, job: PoolJob, pods: Sequence[Assignment], now: float, res: CycleResult) -> None:
        """Books of an elastic job that gave up ``pods`` (already released)."""
        old = len(job.placed)
        gone = {a.pod for a in pods}
        self._fold_service(job, now)
        self._lv_add(job, -1)
        self._qnode_add(job, [a for a in job.placed if a.pod in gone], -1)
        job.placed = [a for a in job.placed if a.pod not in gone]
        self._lv_add(job, 1)
        self._add(self.alloc, job, old - len(job.placed), -1.0)
        self._np_add(job, len(job.placed) - old)
        self._fs_dirty = True
        res.resized.append((job, old, len(job.placed)))
        res.evictions.append((job, list(pods), "shrunk", self._preemptor))

    def _fold_service(self, job: PoolJob, now: float) -> None:
        """Move the current run's service into ``attained`` (before the job's size changes)."""
        job.attained += len(job.placed) * job.gpus_per_pod * max(0.0, now - job.run_since)
        job.run_s += max(0.0, now - job.run_since)
        job.run_since = now

    def _extras(self, now: float) -> list[Candidate]:
        """Elastic workers above their job's minimum, one candidate per worker (the newest first):
        opportunistic, the first to go (not those that grew or started in this very cycle)."""
        return [(j, [a], True) for j in self.elastic_running.values()
                if len(j.placed) > j.min_pods and j.run_since < now and j.protected_until <= now
                for a in reversed(j.placed[j.min_pods:])]
