"""Reservation (:class:`ReserveAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`): nodes
held for the gang that has waited longest, and the nodes other jobs may use meanwhile. Never imports the
scheduler."""

from __future__ import annotations

import heapq

import numpy as np

from gpupool.engine.pool.job import PENDING, PoolJob
from gpupool.engine.pool.pending import Reservation

__all__ = ["ReserveAction"]

_EPS = 1e-6


class ReserveAction:
    """The reservation action (mixin; see the module docstring)."""

    def _maybe_reserve(self, now: float) -> None:
        """Reserve nodes for the job (of more than one GPU) that has waited longest, once it has waited
        ``reserve_after_s``; otherwise note when that will be."""
        if self.reservation is not None and self.reservation.job.status == PENDING:
            return
        self.reservation = None
        while self._gangs:
            since, _, job = self._gangs[0]
            if job.status != PENDING or job.pending_since != since:
                heapq.heappop(self._gangs)
                continue
            due = since + (self.cfg.reserve_after_s or 0.0)
            if due > now + 1e-9:
                self._wake_at = min(self._wake_at, due)
                return
            heapq.heappop(self._gangs)
            if (self._admissible(job, job.min_pods) and self.infeasible_reason(job) == ""
                    and self._reserve(job, now)):
                return

    def _reserve(self, job: PoolJob, now: float) -> bool:
        """Reserve nodes for a starving ``job``: those where it fits soonest (most free GPUs), within one
        switch if one can hold it, among the nodes its pods may use (selectors, taints, GPU models:
        ``static_fit``; and the placement policy's ``usable_nodes(job)`` where it has one, e.g. the GPU models a
        job type can run on, :class:`~gpupool.engine.pool.hetero.HeteroPolicy`). False if even the whole healthy
        cluster could not."""
        st = self.state
        cap = np.minimum(self._healthy_capacity(job), self.static_fit(job))  # only nodes its pods may use
        usable = getattr(self.picker.inner, "usable_nodes", None)  # a placement that rules out models per job
        mask = usable(job) if usable is not None else None
        if mask is not None:
            cap = np.where(mask, cap, 0)
        n = job.min_pods
        if int(cap.sum()) < n:
            return False
        free = self._free_whole()
        candidates = np.ones(st.n_nodes, dtype=bool)
        if self.cfg.topology_aware and n > 1 and (self.switch >= 0).any():
            valid = self.switch >= 0
            sums = np.bincount(self.switch[valid], weights=cap[valid])
            good = np.flatnonzero(sums >= n)
            if len(good):
                frees = np.bincount(self.switch[valid], weights=free[valid], minlength=len(sums))
                candidates = self.switch == good[np.argmax(frees[good])]
            elif job.topology == "required":
                return False
        order = np.lexsort((np.arange(st.n_nodes), -free, ~candidates))
        mask = np.zeros(st.n_nodes, dtype=bool)
        got = 0
        for node in order.tolist():
            if cap[node] <= 0:
                continue
            mask[node] = True
            got += int(cap[node])
            if got >= n:
                break
        if got < n:
            return False
        self.reservation = Reservation(job, mask, now)
        self.stats["reservations"] += 1
        return True

    def _in_quota(self, job: PoolJob, pods: int | None = None) -> bool:
        """Would ``job`` (``pods`` pods, default its minimum) keep its leaf queue within its quota?"""
        need = (job.min_pods if pods is None else pods) * job.gpus_per_pod
        return self.alloc[job.q][0] + need <= self.quota_g[job.q] + _EPS

    def _allowed_for(self, job: PoolJob) -> np.ndarray | None:
        """(n_nodes,) bool mask of the nodes ``job`` may use, or None for all: the reserved nodes are off
        limits, except to in-quota work of another queue while the reservation's holder would borrow
        (take its own queue above quota)."""
        r = self.reservation
        if r is None or r.job is job or r.job.status != PENDING:
            return None
        if job.q != r.job.q and self._in_quota(job) and not self._in_quota(r.job):
            return None
        return ~r.mask
