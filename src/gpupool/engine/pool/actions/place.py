"""Gang placement (:class:`PlaceAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`): a job's
pods placed through the engine, all or nothing (a :class:`~gpupool.engine.statement.Statement`), in the best
topology scope. Never imports the scheduler."""

from __future__ import annotations

import numpy as np

from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.placement import Vetoed
from gpupool.engine.statement import Statement
from gpupool.model import Assignment

__all__ = ["PlaceAction"]


class PlaceAction:
    """Gang placement (mixin; see the module docstring)."""

    def move(self, job: PoolJob, allowed: np.ndarray, now: float) -> bool:
        """Move a running ``job`` (its whole gang, all or nothing) onto nodes where ``allowed`` ((n_nodes,) bool,
        e.g. a faster GPU model's nodes) is True: its pods are released and placed again there at ``now``, its
        run restarting (the driver checkpoints and restarts it; gpupool.sim.migration). Where the gang does not
        fit there, it goes back where it fits (its old nodes are free again) and False is returned. Service up
        to ``now`` is counted as at a stop. ValueError unless the job is running and not elastic."""
        if job.status != "running" or job.elastic:
            raise ValueError(f"job {job.name}: only a running, non-elastic job can move (it is {job.status})")
        self._release_pods(job, job.placed)
        self._account_stop(job, now)
        placed = self._place(job, allowed)
        moved = placed is not None
        if placed is None:
            placed = self._place(job, None)
        if placed is None:  # pragma: no cover - its own GPUs were just released
            raise RuntimeError(f"job {job.name}: could not be placed again after a move")
        job.placed = placed
        job.run_since = now
        self._book_running(job, now)
        self.free_gpus -= len(placed) * job.gpus_per_pod
        return moved

    # ------------------------------------------------------------------ placement
    def _place(self, job: PoolJob, allowed: np.ndarray | None, pods: int | None = None,
               min_pods: int | None = None) -> list[Assignment] | None:
        """Place ``pods`` (default ``n_pods``) members through the engine, at least ``min_pods``, all or
        nothing (a :class:`Statement`), in the best topology scope. None if it does not fit."""
        n = job.n_pods if pods is None else pods
        nmin = job.min_pods if min_pods is None else min_pods
        # A failure decided by the cluster's resources alone (no node fits, before any pod was tried or
        # with a single pod that no node passes) repeats as long as no node changed: skip the retry.
        # Failures with a node mask or after a gang member was placed are not remembered (a gang's
        # tentative placements may move the policy's own state or draw tie-breaks).
        key = (job, n, nmin, self.state.changes) if allowed is None else None
        if key is not None and key == self._failed_place:
            return None
        members = job.pods[:n]
        picker = self.picker
        gang = getattr(picker.inner, "begin_gang", None)  # heterogeneity-aware placement (hetero.py)
        if gang is not None:
            gang(job, n, lambda: self._fits_per_node(job, allowed), self._now,
                 capacity=lambda: self._healthy_capacity(job))
        if n == 1 and (not self.cfg.topology_aware or job.gpus_per_pod <= 1 or not self.mixed_nvlink):
            if job.gpus_per_pod > 1 or allowed is not None:  # cheap cached check: no failed engine call
                mask = self.engine.feasible_mask(picker.effective(members[0]))
                if not (mask.any() if allowed is None else (mask & allowed).any()):
                    self._failed_place = key
                    return None
            picker.allowed = allowed
            try:
                d = self.engine.place(members[0])
            except Vetoed:
                return None
            finally:
                picker.allowed = None
            if d.assignment is None:  # no feasible node: the engine changed nothing
                self._failed_place = key
                return None
            return [d.assignment]
        f = self._fits_per_node(job, allowed)
        if int(f.sum()) < nmin:
            self._failed_place = key
            return None
        scopes: list[tuple[str, np.ndarray]] = []
        if self.cfg.topology_aware and job.topology != "none":
            scopes = self._scopes(job, f, n) or (self._scopes(job, f, nmin) if nmin < n else [])
            if not scopes and job.topology == "required":
                self._failed_place = key
                return None
        level, scope = scopes[0] if scopes else ("", None)
        hard = job.topology == "required"
        st = Statement(self.engine)
        try:
            for k, req in enumerate(members):
                if scope is not None and hard:
                    picker.allowed = scope if allowed is None else (scope & allowed)
                    picker.preferred = None
                else:
                    picker.allowed = allowed
                    picker.preferred = scope
                try:
                    d = st.place(req)
                except Vetoed:
                    d = None
                if d is None or d.assignment is None:
                    if len(st.placed) >= nmin:
                        break
                    st.discard()
                    return None
                if k == 0 and scope is not None:  # the rest of the gang follows the first pod
                    node = d.assignment.node
                    if level == "node":
                        scope = np.zeros(self.state.n_nodes, dtype=bool)
                        scope[node] = True
                    elif level == "nvlink":
                        scope = self.multi_dom == self.multi_dom[node]
                    else:
                        scope = self.switch == self.switch[node]
        finally:
            picker.allowed = None
            picker.preferred = None
        return st.commit()
