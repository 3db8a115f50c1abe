"""Elastic grow (:class:`GrowAction`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`): when
nothing waits, elastic jobs grow into idle GPUs. Never imports the scheduler."""

from __future__ import annotations

import numpy as np

from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.placement import Vetoed
from gpupool.engine.pool.result import CycleResult

__all__ = ["GrowAction"]


class GrowAction:
    """The elastic grow action (mixin; see the module docstring)."""

    # ------------------------------------------------------------------ elastic
    def _required_scope(self, job: PoolJob) -> np.ndarray | None:
        """(n_nodes,) bool: where a running job whose topology is required may place more workers, by its tier:
        its node (``node``, or ``nvlink`` on a node outside a multi-node NVLink domain), its NVLink domain, its
        leaf switch (``switch`` and ``spine``; its node when the node hangs under no known switch, for ``switch``);
        None: anywhere (``spine`` without a switch)."""
        node = job.placed[0].node
        tier = job.topology_tier
        if tier in ("switch", "spine"):
            sw = self.switch[node]
            if sw >= 0:
                return self.switch == sw
            if tier == "spine":
                return None
        elif tier == "nvlink":
            dom = self.multi_dom[node]
            if dom >= 0:
                return self.multi_dom == dom
        mask = np.zeros(self.state.n_nodes, dtype=bool)
        mask[node] = True
        return mask

    def _grow(self, now: float, res: CycleResult) -> None:
        """Give idle GPUs to elastic jobs, one worker at a time, lowest allocation / fair share first."""
        jobs = sorted(self.elastic_running.values(), key=lambda j: (self._qkey(j.q), j.seq))
        before = {j.seq: len(j.placed) for j in jobs}
        progress = True
        cpu = any(not j.gpus_per_pod for j in jobs)  # workers without GPUs need no free GPU
        while progress and (self.free_gpus > 0 or cpu):
            progress = False
            for job in jobs:
                if len(job.placed) >= job.max_pods or self.free_gpus < job.gpus_per_pod:
                    continue
                if job.run_since > now:  # held by a driver while its victims terminate (run_since inf): its run
                    continue  # has not begun; a worker grown now would be bound before the rest of it
                if not self._admissible(job, 1):
                    continue
                req = job.pods[len(job.placed)]
                if self.cfg.topology_aware and job.placed and job.topology != "none":
                    if job.topology == "required":  # a required scope holds for the workers it grows too
                        self.picker.allowed = self._required_scope(job)
                    else:
                        sw = self.switch[job.placed[0].node]
                        self.picker.preferred = (self.switch == sw) if sw >= 0 else None
                try:
                    d = self.engine.place(req)
                except Vetoed:
                    continue
                finally:
                    self.picker.preferred = None
                    self.picker.allowed = None
                if d.assignment is None:
                    continue
                self._fold_service(job, now)
                self._lv_add(job, -1)
                job.placed.append(d.assignment)
                self._qnode_add(job, [d.assignment], 1)
                self._lv_add(job, 1)
                self._add(self.alloc, job, 1, 1.0)
                self._np_add(job, 1)
                self.free_gpus -= job.gpus_per_pod
                self._fs_dirty = True
                progress = True
        for job in jobs:
            if len(job.placed) != before[job.seq]:
                res.resized.append((job, before[job.seq], len(job.placed)))
