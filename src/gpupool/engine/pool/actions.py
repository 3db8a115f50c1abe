"""The pool scheduler's eviction actions: reclaim, preempt, elastic grow/shrink, and the shared victim
solver's verification. A mixin of :class:`gpupool.engine.pool.scheduler.PoolScheduler` (it uses that
class's books); split out so that each file stays readable. No I/O.

Every eviction goes through :meth:`EvictionActions._solve`: choose victims with
:func:`~gpupool.engine.pool.victims.select_victims`, release them, place the preemptor through the engine,
then put back (on exactly their old devices) the victims the placement did not need; if the preemptor
cannot be placed, every victim is put back and nothing happened (all or nothing).
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from gpupool.engine.pool.job import PENDING, RUNNING, PoolJob
from gpupool.engine.pool.placement import Vetoed
from gpupool.engine.pool.victims import select_victims
from gpupool.model import MILLI, AllocationError, Assignment

if TYPE_CHECKING:  # pragma: no cover
    from gpupool.engine.pool.scheduler import CycleResult

_EPS = 1e-6
_SCAN = 64
"""Waiting jobs per queue that reclaim and consolidation look at in a cycle (the first, in job order)."""

Candidate = tuple[PoolJob, Sequence[Assignment], bool]
"""(job, the pods it would give up, True for an elastic shrink / False for an eviction)."""


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


class EvictionActions:
    """Reclaim, preempt and elastic actions (mixin; see the module docstring)."""

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
               allowed: np.ndarray | None, now: float, res: CycleResult, reason: str) -> bool:
        """Evict a subset of ``cands`` so that ``job`` starts now; all or nothing. True if it started."""
        if not cands:
            return False
        g = job.gpus_per_pod
        free = self._free_whole()
        if allowed is not None:
            free = np.where(allowed, free, 0)
        holdings = [self._holdings(p, allowed) for _, p, _ in cands]
        costs, budget = guard if guard is not None else (None, None)
        chosen = select_victims(free, max(g, 1), job.min_pods, holdings, costs, budget)
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
        for i in reversed(chosen):  # keep the victims the placement did not need
            if self._restore(cands[i][0], cands[i][1], quiet=True):
                self.stats["victim_restores"] += 1
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

    def _reclaim_pairs(self, q: int) -> list[tuple[int, list[int], bool]]:
        """For leaf ``q``: every other leaf ``r`` with its path below their lowest common ancestor and
        whether ``r``'s priority is below ``q``'s (fixed by the queue tree; cached)."""
        pairs = self._lca_pairs.get(q)
        if pairs is None:
            pairs = self._lca_pairs[q] = [(r, self._path_below_lca(r, q), self.qprio[r] < self.qprio[q])
                                          for r in self.tree.leaves.tolist() if r != q]
        return pairs

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
        for a in self.paths[q]:
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
            scan = self.pending[q].jobs[:_SCAN]  # the first jobs that may reclaim, one per shape
            if not any(job.retry_at <= due for job in scan):
                continue  # every one is backing off: nothing below can act (a shortcut, no other effect)
            # queues that may give GPUs: by priority (to an in-quota job), by fair share (to an in-share job)
            by_prio: list[int] = []
            by_fs: list[tuple[int, list[int]]] = []
            for r, path_r, lower in self._reclaim_pairs(q):
                if not running[r]:
                    continue
                if lower:
                    by_prio.append(r)
                if any_over:
                    for b in path_r:
                        if over[b] <= _EPS:
                            break
                    else:
                        by_fs.append((r, path_r))
            if not by_prio and not by_fs:
                continue
            attempts = 0
            tried: set[tuple[int, int]] = set()
            in_fs_by_need: dict[int, bool] = {}  # within-share test per GPU count (until an action moves alloc)
            for job in scan:
                if attempts >= self.cfg.max_attempts:
                    break
                if job.status != PENDING or job.retry_at > due or self._held_back(job, now):
                    continue
                need = job.min_pods * job.gpus_per_pod
                in_fs = in_fs_by_need.get(need)
                if in_fs is None:
                    in_fs = in_fs_by_need[need] = bool(by_fs) and all(
                        self.alloc[a][0] + need <= fs[a] + _EPS for a in path_q)
                in_quota = bool(by_prio) and self.alloc[q][0] + need <= self.quota_g[q] + _EPS
                shape = (job.gpus_per_pod, job.min_pods)
                if not (in_fs or in_quota) or shape in tried or not self._admissible(job, job.min_pods):
                    continue
                # eligible queues (guarded by their share unless taken by priority), and an O(1) bound
                eligible: list[tuple[int, list[int]]] = [(r, []) for r in by_prio] if in_quota else []
                if in_fs:
                    seen = {r for r, _ in eligible}
                    eligible += [(r, path_r) for r, path_r in by_fs if r not in seen]
                budget = sum(self.alloc[r][0] for r, _ in eligible)  # victims only need their queue above its share
                if self.free_gpus + budget < need - _EPS:
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
                    done = self._solve(job, cands, (costs, over), allowed, now, res, "reclaimed")
                if not done and self.cfg.consolidate:  # evict and move others aside (node shapes)
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
            for job in list(self.pending[grp].jobs[:_SCAN]):
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
        while progress and self.free_gpus > 0:
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
