"""Victim candidates (:class:`VictimCandidates`, a mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`):
which running jobs may be evicted and in what order, victim lists kept across cycles, the backoff of failed
searches, queue pairs for reclaim. Never imports the scheduler."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from gpupool.engine.pool.job import PoolJob

__all__ = ["VictimCandidates"]


class _VictimKeep:
    """A queue's victim list kept across cycles: valid while the queue's running books are at ``version``
    and ``built <= now < until`` (the earliest minimum-runtime or protection end among the others)."""

    __slots__ = ("version", "built", "until", "jobs", "agg", "multi", "seqs")

    def __init__(self, version: int, built: float, until: float, jobs: list[PoolJob]) -> None:
        self.version = version
        self.built = built
        self.until = until
        self.jobs = jobs
        self.agg: np.ndarray | None = None  # (max GPUs per node + 1, n_nodes): GPUs of single-pod victims
        self.multi: list[PoolJob] = []
        self.seqs: frozenset[int] | None = None  # seq of every job of ``jobs`` (built when first asked)


class VictimCandidates:
    """Victims of the eviction actions and the lists kept of them (mixin; see the module docstring)."""

    def _held_back(self, job: PoolJob, now: float) -> bool:
        """``job`` was evicted in this very cycle and may not start again in it (``restart_evicted`` False: a
        driver whose evictions take time, such as Kubernetes, where its pods are still being deleted), so it may
        not evict others either."""
        return job.evicted_at >= now and not self.cfg.restart_evicted

    def _victim_ok(self, v: PoolJob, now: float, min_run_s: float) -> bool:
        """May ``v`` be evicted now? Preemptible and past ``min_run_s`` (else a wake-up is noted)."""
        if not v.preemptible:
            return False
        if v.protected_until > now + 1e-9:  # the driver could not evict it (a PodDisruptionBudget)
            self._wake_at = min(self._wake_at, v.protected_until)
            return False
        ready = v.run_since + min_run_s
        if ready > now + 1e-9:
            self._wake_at = min(self._wake_at, ready)
            return False
        return True

    def _victim_rank(self, job: PoolJob) -> tuple:
        """Sort key of a running job as a victim: lowest priority, highest level, latest submitted,
        most recently started first."""
        k = job.key
        return (-k[0], -k[1], -k[2], -job.run_since)

    def _queue_victims(self, q: int, now: float, reclaim: bool = False) -> list[PoolJob]:
        """Evictable running jobs of leaf queue ``q``, most evictable first (cached for the cycle); past
        ``reclaim_min_run_s`` for a reclaim, else past ``min_run_s``."""
        key = (q, reclaim)
        got = self._victim_cache.get(key)
        if got is not None:
            return got
        min_run = self.cfg.reclaim_min_run_s if reclaim else self.cfg.min_run_s
        if not self._keep_victims():
            got = sorted((v for v in self.running[q].values() if self._victim_ok(v, now, min_run)),
                         key=self._victim_rank)
            self._victim_cache[key] = got
            return got
        # Kept across cycles (VictimKeep): the same list, and the same wake-up note, as computing it again,
        # while no running job of the queue changed and no job crossed its minimum runtime or protection.
        ent = self._victim_keep.get(key)
        if ent is not None and ent.version == self._run_ver[q] and ent.built <= now and now + 1e-9 < ent.until:
            self._wake_at = min(self._wake_at, ent.until)
            self._victim_cache[key] = ent.jobs
            return ent.jobs
        lim = now + 1e-9
        nxt = math.inf
        got = []
        for v in self.running[q].values():  # _victim_ok, with the earliest time a verdict changes
            if not v.preemptible:
                continue
            if v.protected_until > lim:
                nxt = min(nxt, v.protected_until)
                continue
            ready = v.run_since + min_run
            if ready > lim:
                nxt = min(nxt, ready)
                continue
            got.append(v)
        got.sort(key=self._victim_rank)
        self._wake_at = min(self._wake_at, nxt)
        self._victim_keep[key] = _VictimKeep(self._run_ver[q], now, nxt, got)
        self._victim_cache[key] = got
        return got

    def _keep_victims(self) -> bool:
        """Victim lists may be kept across cycles: the driver said it never changes ``protected_until``
        between cycles (``victims_across_cycles``) and victims are chosen and ranked the default way."""
        return self.victims_across_cycles and "_victim_ok" not in self.__dict__ and "_victim_rank" not in self.__dict__

    def _mover_room(self, q: int, now: float) -> _VictimKeep | None:
        """The kept victim list of ``q`` (for moves) with its GPUs per node summed by GPUs per pod (single-pod
        jobs; ``agg``) and its multi-pod jobs (``multi``), or None when lists are not kept."""
        if not self._keep_victims():
            return None
        self._queue_victims(q, now)
        ent = self._victim_keep.get((q, False))
        if ent is None or ent.version != self._run_ver[q]:
            return None
        if ent.agg is None:
            n_nodes = self.state.n_nodes
            rows = int(self.state.gpu_count.max()) + 1 if n_nodes else 1
            agg = np.zeros((rows, n_nodes), dtype=np.int64)
            multi = []
            for v in ent.jobs:
                placed = v.placed
                if len(placed) == 1 and v.gpus_per_pod < rows:
                    a = placed[0]
                    agg[v.gpus_per_pod, a.node] += len(a.gpus)
                else:
                    multi.append(v)
            ent.agg, ent.multi = agg, multi
        return ent

    def _failed_search(self, job: PoolJob, now: float) -> None:
        """Back off: no new victim search for ``job`` for 30 s, doubling up to 480 s (simulated time),
        or until it starts; the next search happens at the first cycle after that. Like kube-scheduler's
        backoff of unschedulable pods, it bounds the work of retrying a search that failed while
        nothing much changed."""
        job.backoff = min(480.0, max(30.0, 2 * job.backoff))
        job.retry_at = now + job.backoff

    def _searchable(self, plist_jobs: Sequence[PoolJob], now: float, limit: int) -> list[PoolJob]:
        out = []
        for job in plist_jobs:
            if len(out) >= limit:
                break
            if job.retry_at <= now + 1e-9:
                out.append(job)
        return out

    def _path_below_lca(self, r: int, q: int) -> list[int]:
        """Queues from leaf ``r`` up to, not including, its lowest common ancestor with ``q`` (cached)."""
        key = (r, q)
        got = self._lca_paths.get(key)
        if got is None:
            above_q = set(self.paths[q])
            got = self._lca_paths[key] = [b for b in self.paths[r] if b not in above_q]
        return got

    def _reclaim_pairs(self, q: int) -> list[tuple[int, list[int], list[int], bool]]:
        """For leaf ``q``: every other leaf ``r`` with its path below their lowest common ancestor, ``q``'s path
        below it (the two sibling subtrees where their paths meet, each from its leaf up) and whether ``r``'s
        priority is below ``q``'s (fixed by the queue tree; cached)."""
        pairs = self._lca_pairs.get(q)
        if pairs is None:
            pairs = self._lca_pairs[q] = [(r, self._path_below_lca(r, q), self._path_below_lca(q, r),
                                           self.qprio[r] < self.qprio[q])
                                          for r in self.tree.leaves.tolist() if r != q]
        return pairs

    def _own_path(self, q: int) -> list[int]:
        """The queues of leaf ``q``'s path below its lowest common ancestor with every other leaf: those a reclaim
        by ``q`` always adds to, whichever leaf gives (all of the path when ``q`` is the only leaf of its top-level
        subtree, as in a flat tree; cached)."""
        got = self._own_paths.get(q)
        if got is None:
            sides = [side for _, _, side, _ in self._reclaim_pairs(q)]
            got = self._own_paths[q] = min(sides, key=len) if sides else list(self.paths[q])
        return got
