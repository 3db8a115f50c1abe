"""The pool scheduler: queues, fair share, gangs, reservations, reclaim, preemption, elastic resize. No I/O.

A driver (the job simulator, or a Kubernetes controller) calls :meth:`PoolScheduler.submit`,
:meth:`~PoolScheduler.finish`, :meth:`~PoolScheduler.set_gpu_health` as things happen and
:meth:`~PoolScheduler.cycle` to let the scheduler act; each cycle returns a :class:`CycleResult` (jobs
started, preempted, resized) for the driver to carry out. The cluster's resources live in the
:class:`~gpupool.cluster.ClusterState` arrays; every pod is placed by the :class:`~gpupool.engine.core.Engine`
and its placement policy (wrapped in :class:`~gpupool.engine.pool.placement.ScopedPolicy`, which only
narrows the nodes a pick may use), gangs through a :class:`~gpupool.engine.statement.Statement`.

A cycle runs the actions in the order Volcano and KAI use:

1. **allocate** (with **backfill**): queues in order (below fair share first, then higher priority, then
   lowest allocation / fair share: KAI's proportion queue order), jobs within a queue by the job order
   (priority, then FIFO or Tiresias 2D-LAS level, then submission). A gang is placed all or nothing.
   A job that does not fit is passed over and later jobs may run (backfill), unless ``backfill`` is off
   (strict FIFO: nothing passes a blocked job). Topology: a gang is kept on one node, else one
   multi-node NVLink domain, else one leaf switch when one can hold it (``preferred``), or must be
   (``required``); multi-GPU pods prefer nodes with NVLink.
2. **reservation**: the first blocked job that has waited ``reserve_after_s`` gets nodes reserved (the
   nodes of one switch, if possible, with the most free GPUs); no other job may start there, so small
   jobs backfill only on resources the starving gang does not need, and the gang starts as soon as the
   jobs running there end. In-quota work of another queue is not held back by a reservation for a
   gang that would take its own queue above quota: guaranteed quota comes before borrowing.
3. **reclaim**: a queue below its fair share takes GPUs back from queues above theirs, up to its fair
   share (not only its quota, KAI #1934), evicting only preemptible jobs, and only from a queue that is
   still above its own fair share when the victim is taken (it may end below it by less than that one
   job: KAI #374 relaxes the same rule so that a small queue holding one large job can be reclaimed).
   No preemption loop (Kueue #3779): the reclaimer ends at or below its share, so it is no victim
   afterwards, and every reclaim strictly lowers the total excess of the queues above their shares,
   which cannot go on forever while the shares stay put. A queue of higher priority still within its
   quota may also evict *preemptible* in-quota work of strictly lower-priority queues (KAI #2064), so
   lower-priority queues cannot starve it. In a queue tree the rule holds where the two queues' paths meet:
   the sibling subtrees under their lowest common ancestor are compared (KAI's queue hierarchy, Kueue's cohorts).
4. **preempt**: within a queue, a waiting job evicts preemptible jobs of strictly lower order (lower
   priority, or a higher Tiresias level: more attained service); elastic jobs' extra workers are taken
   first from anyone.
5. **consolidate** (when neither reclaim nor preempt acted): a waiting job that does not fit although
   enough GPUs are free, scattered over nodes, moves running preemptible jobs to other nodes to make
   room (KAI's consolidation): all or nothing, every moved job placed again at once; queues keep
   their allocation.
6. **elastic grow**: when nothing waits, elastic jobs grow into idle GPUs, one worker at a time.

A job that no nodes could ever hold, whatever runs (:meth:`PoolScheduler.unplaceable_reason`: host resources, the
placement policy's ``static`` filters such as node selectors, taints and GPU models, GPU counts, a required
topology), waits out of its queue's order (``unschedulable``, kube-scheduler's unschedulable queue) and in no books
of waiting work until the nodes change (:meth:`PoolScheduler.nodes_changed`); the jobs behind it go on. Jobs whose
pods ask no GPU start whether or not a GPU is free.

Non-preemptible jobs (``priority >= PoolConfig.nonpreemptible_priority``, 100) are never victims and run only
within the quota of each queue on their path that has one; in a queue without a quota (0: the default queue)
they take free capacity, as any job, but cannot be taken back.
Evicted jobs return to their queue and, when the driver checkpoints on eviction, lose no progress.

All victims are chosen by one solver (:func:`~gpupool.engine.pool.victims.select_victims`) and the
eviction is all or nothing: the preemptor is placed through the engine before anything is committed.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.core import Engine, Policy
from gpupool.engine.pool.actions import AllocateAction, EvictionActions, PlaceAction, ReserveAction
from gpupool.engine.pool.config import DEFAULT_JOB_POLICIES, JOB_POLICIES, PoolConfig, job_policy, make_order
from gpupool.engine.pool.fairshare import fair_shares, fair_shares_compiled, fairshare_mirror_current
from gpupool.engine.pool.feasibility import FeasibilityMixin
from gpupool.engine.pool.gittins import SizeModel
from gpupool.engine.pool.job import DONE, PENDING, REMOVED, RUNNING, PoolJob
from gpupool.engine.pool.ordering import SIZE_ORDERS, TiresiasOrder
from gpupool.engine.pool.pending import Pending, Reservation
from gpupool.engine.pool.placement import ScopedPolicy
from gpupool.engine.pool.queues import QueueTree
from gpupool.engine.pool.result import CycleResult
from gpupool.engine.pool.scopes import TopologyIndex
from gpupool.model import MILLI, Assignment, PodRequest

__all__ = ["CycleResult", "PoolConfig", "PoolScheduler", "DEFAULT_JOB_POLICIES", "JOB_POLICIES", "job_policy"]

_EPS = 1e-6


class PoolScheduler(PlaceAction, AllocateAction, ReserveAction, EvictionActions, TopologyIndex, FeasibilityMixin):
    """Job scheduler over one cluster and one queue tree (see the module docstring).

    ``placement``: a placement policy instance, names resolved by the caller (``make_policy``; every pod goes
    through ``Engine(state, policy)``);
    ``workload``: typical pods for policies that learn from them (FGD / gpupool); ``seed``: tie-breaks;
    ``sizes``: the job sizes a previous scheduler learned (Gittins / remaining orders; keyed by queue name),
    for a driver that rebuilds the scheduler over a new state.
    """

    def __init__(self, state: ClusterState, placement: Policy, queues: QueueTree,
                 config: PoolConfig | None = None, seed: int = 0,
                 workload: Sequence[PodRequest] | None = None, engine: Engine | None = None,
                 sizes: SizeModel | None = None) -> None:
        self.state = state
        self.cfg = config or PoolConfig()
        if engine is not None:  # a driver's engine (its filters, caches and policy state are shared)
            if engine.state is not state:
                raise ValueError("engine must be built over the same ClusterState")
            if not isinstance(engine.policy, ScopedPolicy):
                engine.policy = ScopedPolicy(engine.policy)
            self.picker = engine.policy
            self.engine = engine
        else:
            self.picker = ScopedPolicy(placement)
            self.engine = Engine(state, self.picker, seed=seed, workload=workload)
        self._preemptor: PoolJob | None = None  # the job an eviction makes room for (CycleResult.evictions)
        # free share that makes a GPU a free slot for a whole-GPU pod: MILLI, or (n_nodes, 1) int64 of one
        # time-slicing replica's share per node (a driver of a cluster with time-sliced GPUs sets it)
        self.slot_milli: int | np.ndarray = MILLI
        self.tree = queues
        self._leaves: list[int] = queues.leaves.tolist()  # leaf queue indices (the tree is fixed)
        # the fair-share division: its compiled copy (the same floats) where the kernels are on and it copies
        # the current Python code, else fairshare.fair_shares
        self._fair_shares = (fair_shares_compiled if kernels.enabled() and fairshare_mirror_current()
                             else fair_shares)
        self.sizes: SizeModel | None = None  # job sizes learned online (Gittins / remaining orders)
        if self.cfg.order in SIZE_ORDERS:  # ``sizes``: a driver that rebuilds the scheduler keeps what it learned
            self.sizes = sizes if sizes is not None else SizeModel(self.cfg.size_prior, self.cfg.size_min_samples)
            self.order = make_order(self.cfg.order, self.cfg.thresholds, self.cfg.promote_knob,
                                    delta=self.cfg.gittins_delta, model=self.sizes)
            self._sizes_keyed = self.sizes.version
            self._set_key = self._set_score_key  # type: ignore[method-assign]
            if self.cfg.victims_by_score:
                self._victim_rank = self._score_victim_rank  # type: ignore[method-assign]
            else:
                self._victim_rank = self._fifo_victim_rank  # type: ignore[method-assign]
        else:
            self.order = make_order(self.cfg.order, self.cfg.thresholds, self.cfg.promote_knob)
        if self.cfg.max_preemptions is not None or self.cfg.protect_after_s is not None:
            self._victim_ok = self._bounded_victim_ok  # type: ignore[method-assign]
        self._now = 0.0
        npp = self.cfg.nonpreemptible_priority
        self._np_from = npp if npp is not None else 2**63  # jobs at or above this priority are not preemptible
        self.preemptive_order = isinstance(self.order, TiresiasOrder) and self.cfg.preempt
        nq = len(queues)
        self.paths = [queues.ancestors(i) for i in range(nq)]
        gpus = max(1, state.total_gpus)
        self.cpu_per_gpu = float(state.cpu_cap.sum()) / gpus
        self.mem_per_gpu = float(state.mem_cap.sum()) / gpus
        self.quota = queues.quota_vectors(self.cpu_per_gpu, self.mem_per_gpu)
        self.quota_g = queues.quota_gpu.tolist()
        self.limit_g = queues.limit_gpu.tolist()
        self.qprio = queues.priority.tolist()
        self.alloc = [[0.0, 0.0, 0.0] for _ in range(nq)]  # running (GPUs, milli-CPU, MiB), inner queues too
        self.pend = [[0.0, 0.0, 0.0] for _ in range(nq)]  # waiting jobs' minimum asks
        self.np_alloc = [0.0] * nq  # GPUs of non-preemptible running jobs
        self.np_outside = [0.0] * nq  # GPUs of non-preemptible work the pool does not run (set_outside_nonpreemptible)
        self.n_groups = nq if self.cfg.fair_share else 1
        self.pending: list[Pending] = [Pending() for _ in range(self.n_groups)]
        self.shapes: list[Counter] = [Counter() for _ in range(self.n_groups)]  # pending (g, n, tier) per group
        self.running: list[dict[int, PoolJob]] = [{} for _ in range(nq)]
        self.levels: list[Counter] = [Counter() for _ in range(self.n_groups)]  # running (-prio, level) per group
        self.level_gpus: list[Counter] = [Counter() for _ in range(self.n_groups)]  # their GPUs
        self.n_pending = 0
        self.n_running = 0
        self.seq = 0
        self.free_gpus = int(((state.gpu_free >= MILLI) & state.gpu_healthy).sum())
        self.reservation: Reservation | None = None
        self._reserved_memo: tuple | None = None  # reserved_gpus' last answer
        # service counted per GPU-second of a job placed on job.placed (None: 1.0, GPU-seconds); e.g. the speed of
        # its GPUs against the reference model, so that LAS and sizes count work done (gpupool.sim.throughput)
        self.service_rate_of: Callable[[PoolJob], float] | None = None
        self._free_memo: tuple[int, np.ndarray] | None = None  # _free_whole's last answer
        self._fs_cap: tuple[int, np.ndarray] | None = None  # fair_share's healthy capacity, kept
        self._gangs: list[tuple[float, int, PoolJob]] = []  # (pending_since, seq, job): reservation candidates
        self._fs: np.ndarray | None = None
        self._fs_g: list[float] = [0.0] * nq
        self._fs_dirty = True
        self._fs_time = -math.inf
        self._fs_inputs: tuple[bytes, bytes] = (b"", b"")  # (capacity, demand) the last shares were computed for
        self._active: list[bool] = [False] * nq  # queue has demand, as of the last fair-share computation
        self._demote: list[tuple[float, int, float, PoolJob]] = []  # (time, seq, run_since, job) level crossings
        self._promote: list[tuple[float, int, PoolJob]] = []
        self._wake_at = math.inf
        self.elastic_running: dict[int, PoolJob] = {}
        self._victim_cache: dict[tuple[int, bool], list[PoolJob]] = {}
        self._lca_paths: dict[tuple[int, int], list[int]] = {}
        self._lca_pairs: dict[int, list[tuple[int, list[int], list[int], bool]]] = {}  # for _reclaim_pairs
        self._own_paths: dict[int, list[int]] = {}  # EvictionActions._own_path
        self.qnode = np.zeros((nq, state.n_nodes), dtype=np.int64)  # GPUs of preemptible running jobs per node
        self.knode: list[dict[tuple, np.ndarray]] = [{} for _ in range(nq)]  # the same per order class (-prio, level)
        self.jobs_by_name: dict[str, PoolJob] = {}
        self._fail_ver = 0  # counts the failed-shape memos written by _try_place (_allocate skips re-checks)
        # a driver that never sets a job's protected_until between cycles (the job simulator) may let the
        # victim lists live across cycles: each is kept while its queue's running books stay put
        self.victims_across_cycles = False
        self._run_ver = [0] * nq  # changes of each queue's running jobs (membership, size, level, run_since)
        self._victim_keep: dict[tuple[int, bool], object] = {}
        self._failed_place: tuple | None = None  # (job, pods, min_pods, state.changes) of a failed _place
        self._infeasible: dict[tuple, str] = {}  # infeasible_reason by job shape, pod classes, queue and priority
        self._unplaceable: dict[tuple, str] = {}  # unplaceable_reason by job shape and pod classes
        self._static_fit: dict[tuple, np.ndarray] = {}  # static_fit by pod classes
        # waiting jobs that no node can ever take (unplaceable_reason): out of their queue's order, in no books of
        # waiting work, until the nodes change (nodes_changed); by job.seq
        self.unschedulable: dict[int, PoolJob] = {}
        self.n_pending_cpu = 0  # waiting jobs (in their queues) whose pods ask no GPU
        self._topology_setup()
        self.stats = {"cycles": 0, "reclaim_attempts": 0, "preempt_attempts": 0, "victim_restores": 0,
                      "reservations": 0, "fair_share_updates": 0, "consolidation_attempts": 0, "moved_jobs": 0,
                      "failed_moves": 0}

    # topology (scopes.TopologyIndex): the old private names, kept as aliases
    _fits_per_node = TopologyIndex.fits_per_node
    _scopes = TopologyIndex.scopes

    # ------------------------------------------------------------------ bookkeeping
    def _add(self, table: list[list[float]], job: PoolJob, pods: int, sign: float) -> None:
        g = sign * pods * job.gpus_per_pod
        c = sign * pods * job.cpu_per_pod
        m = sign * pods * job.mem_per_pod
        for a in self.paths[job.q]:
            row = table[a]
            row[0] += g
            row[1] += c
            row[2] += m

    def _np_add(self, job: PoolJob, pods: int) -> None:
        """Count ``pods`` more (or fewer) pods of ``job`` in the non-preemptible books, if it is so."""
        if not job.preemptible:
            for a in self.paths[job.q]:
                self.np_alloc[a] += pods * job.gpus_per_pod

    def _group(self, job: PoolJob) -> int:
        return job.q if self.cfg.fair_share else 0

    def _shape(self, job: PoolJob) -> tuple:
        tier = job.topology_tier if (job.topology == "required" and self.cfg.topology_aware) else None
        return (job.gpus_per_pod, job.min_pods, tier)

    def _set_key(self, job: PoolJob) -> None:
        job.key = (-job.priority, job.level, job.submit_time, job.seq)

    def _set_score_key(self, job: PoolJob) -> None:
        """Gittins / remaining orders: the job's score (from its service so far) after its level."""
        job.key = (-job.priority, job.level, self._score(job, job.attained, job.run_s), job.submit_time, job.seq)

    def _score(self, job: PoolJob, attained: float, run_s: float) -> float:
        """Order score of ``job`` after ``attained`` GPU-seconds in ``run_s`` seconds of run: expected service
        (inverse Gittins index or expected remaining; for a job with a ``size_estimate`` above ``attained``, the
        estimate less ``attained``, once any size is known: before, every job scores alike, FIFO) plus
        ``aging`` x (submission + run time), which at any one moment ranks jobs as ``aging`` x the time they
        waited would (subtracted): waiting jobs age."""
        if self.cfg.scored_levels is not None and job.level >= self.cfg.scored_levels:
            return 0.0
        one = self.cfg.size_dims == 1
        per = max(job.num_gpu, 1)  # per-GPU service (size_dims 1); a 0-GPU job's is its whole service
        gpus = job.num_gpu if self.cfg.size_by_gpus else None
        if (job.size_estimate is not None and job.size_estimate > attained  # its own estimate, not yet overrun,
                and self.order.model.table(job.queue, gpus).n):  # once sizes are known: else all score alike
            rest = job.size_estimate - attained
            score = rest / per if one else rest
        else:
            score = self.order.score(job.queue, attained / per if one else attained, gpus)
        if self.cfg.aging:
            score += self.cfg.aging * (job.submit_time + run_s) * (1 if one else job.num_gpu)
        return score

    def _score_victim_rank(self, job: PoolJob) -> tuple:
        """Victim order under Gittins / remaining: lowest priority, highest level, worst score *now* (lowest
        Gittins index), latest submitted, most recently started first."""
        k = job.key
        run_s = job.run_s + max(0.0, self._now - job.run_since)
        return (-k[0], -k[1], -self._score(job, job.attained_at(self._now), run_s), -k[3], -job.run_since)

    def _fifo_victim_rank(self, job: PoolJob) -> tuple:
        """Victim order of Tiresias-L under a scored order: lowest priority, highest level, latest submitted."""
        k = job.key
        return (-k[0], -k[1], -k[3], -job.run_since)

    def _bounded_victim_ok(self, v: PoolJob, now: float, min_run_s: float) -> bool:
        """``_victim_ok``, evicted fewer than ``max_preemptions`` times and run less than ``protect_after_s``."""
        cfg = self.cfg
        if cfg.max_preemptions is not None and v.preemptions >= cfg.max_preemptions:
            return False
        if cfg.protect_after_s is not None and v.run_s + max(0.0, now - v.run_since) >= cfg.protect_after_s:
            return False
        return EvictionActions._victim_ok(self, v, now, min_run_s)

    def _rekey_pending(self) -> None:
        """The learned sizes changed: recompute the waiting jobs' keys and re-sort every queue."""
        for plist in self.pending:
            for job in plist.jobs:
                self._set_key(job)
            plist.resort(self._shape)
        self._sizes_keyed = self.sizes.version

    def submit(self, job: PoolJob, now: float, waiting_since: float | None = None) -> None:
        """Add ``job`` to its leaf queue (waiting). ``waiting_since``: when it began waiting, if before ``now`` (a
        driver that learns of a job late: its wait, for reservations, counts from then). KeyError for an unknown
        or non-leaf queue."""
        job.q = self.tree.leaf_index(job.queue)
        job.nonpreemptible_from = self._np_from
        job.seq = self.seq
        self.seq += 1
        job.make_pods()
        self.jobs_by_name[job.name] = job
        self._enqueue(job, now, waiting_since)

    def _enqueue(self, job: PoolJob, now: float, waiting_since: float | None = None) -> None:
        job.status = PENDING
        job.pending_since = now if waiting_since is None or not waiting_since < now else waiting_since
        job.level = self.order.level(job.attained - job.las_base)
        self._set_key(job)
        why = self.unplaceable_reason(job)
        if why:  # no node can ever take it: it waits out of its queue's order (kube-scheduler's unschedulable queue)
            job.reason = why
            self.unschedulable[job.seq] = job
            return
        if not job.gpus_per_pod:
            self.n_pending_cpu += 1
        grp = self._group(job)
        shape = self._shape(job)
        self.pending[grp].insert(job, shape)
        self.shapes[grp][shape] += 1
        self._add(self.pend, job, job.min_pods, 1.0)
        self.n_pending += 1
        self._fs_dirty = True
        if job.min_pods * job.gpus_per_pod > 1 and self.cfg.reserve_after_s is not None:
            heapq.heappush(self._gangs, (job.pending_since, job.seq, job))
        if isinstance(self.order, TiresiasOrder) and job.level > 0 and self.order.promote_knob is not None:
            wait = max(self.order.promote_knob * job.run_s, self.order.promote_min_s)
            heapq.heappush(self._promote, (now + wait, job.seq, job))

    def _dequeue(self, job: PoolJob) -> None:
        if self.unschedulable.pop(job.seq, None) is not None:  # set aside: in no list, no books
            return
        if not job.gpus_per_pod:
            self.n_pending_cpu -= 1
        grp = self._group(job)
        shape = self._shape(job)
        self.pending[grp].remove(job, shape)
        self.shapes[grp][shape] -= 1
        if not self.shapes[grp][shape]:
            del self.shapes[grp][shape]
        self._add(self.pend, job, job.min_pods, -1.0)
        self.n_pending -= 1
        self._fs_dirty = True
        if self.reservation is not None and self.reservation.job is job:
            self.reservation = None

    def _start(self, job: PoolJob, placed: list[Assignment], now: float, res: CycleResult) -> None:
        self._dequeue(job)
        job.placed = placed
        job.status = RUNNING
        job.run_since = now
        job.retry_at, job.backoff = -math.inf, 0.0
        self._book_running(job, now)
        self.free_gpus -= len(placed) * job.gpus_per_pod
        res.started.append(job)

    def _book_running(self, job: PoolJob, now: float) -> None:
        """Books of a job that now runs on ``job.placed`` (its level, queue allocation, victim indexes)."""
        if self.service_rate_of is not None:  # attained service in work done (opt-in)
            job.service_rate = self.service_rate_of(job)
        job.level = self.order.level(job.las_at(now) + 1e-6)
        self._set_key(job)
        self._add(self.alloc, job, len(job.placed), 1.0)
        self._np_add(job, len(job.placed))
        self._qnode_add(job, job.placed, 1)
        self.running[job.q][job.seq] = job
        self._lv_add(job, 1)
        self.n_running += 1
        if job.elastic:
            self.elastic_running[job.seq] = job
        if self.preemptive_order:
            self._push_demotion(job, now)

    def _push_demotion(self, job: PoolJob, now: float) -> None:
        gpus = job.running_gpus
        if gpus <= 0:
            return
        att = job.las_at(now)
        boundary = self.order.next_boundary(att)
        if math.isfinite(boundary):
            # strictly after now: far out (now ~1e10 s) now + 1e-6 == now, and a crossing rounded just short of the
            # boundary would be pushed at now again and again (_roll_levels never ending)
            when = max(now + (boundary - att) / (gpus * job.service_rate), math.nextafter(now, math.inf))
            heapq.heappush(self._demote, (when, job.seq, job.run_since, job))

    def _release_pods(self, job: PoolJob, pods: Sequence[Assignment]) -> None:
        for a in pods:
            self.engine.release(a.pod)
        self.free_gpus += sum(len(a.gpus) for a in pods if a.gpu_milli >= MILLI)

    def _account_stop(self, job: PoolJob, now: float) -> None:
        """Books of a running job that stops (its pods already released)."""
        pods = len(job.placed)
        self._add(self.alloc, job, pods, -1.0)
        self._np_add(job, -pods)
        job.attained += pods * job.gpus_per_pod * job.service_rate * max(0.0, now - job.run_since)
        job.last_run_s = max(0.0, now - job.run_since)
        job.run_s += job.last_run_s
        self._qnode_add(job, job.placed, -1)
        job.placed = []
        self.running[job.q].pop(job.seq, None)
        self._lv_add(job, -1, pods * job.gpus_per_pod)
        self.elastic_running.pop(job.seq, None)
        self.n_running -= 1
        self._fs_dirty = True

    def finish(self, job: PoolJob, now: float) -> None:
        """``job`` completed: release its pods. ValueError if it is not running."""
        if job.status != RUNNING:
            raise ValueError(f"job {job.name} is {job.status}, not running")
        self._release_pods(job, job.placed)
        self._account_stop(job, now)
        job.status = DONE
        self.jobs_by_name.pop(job.name, None)
        self._learn_size(job)

    def _learn_size(self, job: PoolJob) -> None:
        """A job left after ``job.attained`` GPU-seconds of service: a size for the size-ranked orders."""
        if self.sizes is not None:
            one = self.cfg.size_dims == 1  # per GPU; a 0-GPU job's size is its whole service
            self.sizes.observe(job.queue, job.attained / max(job.num_gpu, 1) if one else job.attained,
                               job.num_gpu if self.cfg.size_by_gpus else None)

    def remove(self, job: PoolJob, now: float, reason: str) -> None:
        """Take ``job`` out for good (cancelled, or it can never run): release or dequeue it."""
        if job.status == RUNNING:
            self._release_pods(job, job.placed)
            self._account_stop(job, now)
        elif job.status == PENDING:
            self._dequeue(job)
        job.status = REMOVED
        job.reason = reason
        self.jobs_by_name.pop(job.name, None)

    def kill(self, job: PoolJob, now: float, reason: str) -> None:
        """Stop a running job (e.g. its node failed) and put it back in its queue."""
        if job.status != RUNNING:
            return
        self._release_pods(job, job.placed)
        self._account_stop(job, now)
        job.reason = reason
        self._enqueue(job, now)

    def attach(self, job: PoolJob, placed: Sequence[Assignment], now: float, run_since: float | None = None) -> None:
        """Count ``job`` as running on ``placed``, pods that already hold their devices in the state (a
        driver adopts work it finds running: a restart, a leader change, pods bound before). A pending job
        leaves its queue. ``run_since``: when the run began (default ``now``; minimum runtime counts from
        it). KeyError for an unknown or non-leaf queue; ValueError if ``job`` is running already."""
        if job.status == RUNNING:
            raise ValueError(f"job {job.name} is running already")
        if job.status == PENDING and job.seq >= 0 and job.q >= 0:
            self._dequeue(job)
        else:
            job.q = self.tree.leaf_index(job.queue)
            job.nonpreemptible_from = self._np_from
            if job.seq < 0:
                job.seq = self.seq
                self.seq += 1
            job.make_pods()
        self.jobs_by_name[job.name] = job
        job.placed = list(placed)
        job.status = RUNNING
        job.run_since = now if run_since is None else run_since
        job.started_once = True
        self._book_running(job, now)
        self._fs_dirty = True

    def begin_run(self, job: PoolJob, now: float) -> None:
        """``job`` (running) really begins its run at ``now``: a driver held its pods while preemption victims
        terminated (``job.run_since`` inf meanwhile: no service, protected as within its minimum runtime). Its service
        and minimum runtime count from ``now``; its level and demotion follow. ValueError unless running."""
        if job.status != RUNNING:
            raise ValueError(f"job {job.name} is {job.status}, not running")
        self._relevel(job, now, run_since=now)
        if self.preemptive_order:
            self._push_demotion(job, now)

    def detach(self, job: PoolJob, now: float, requeue: bool, finished: bool = False) -> None:
        """A running ``job`` whose pods the driver already released from the state (they finished, were
        deleted, or their binding failed): update the books only; back to its queue if ``requeue``, else
        done. A pending job is taken out of its queue (``requeue`` False) or left there. ``finished`` (with
        ``requeue`` False): the job left for good on its own, and its attained service is a job size the
        Gittins / remaining orders learn from (as :meth:`finish`)."""
        if job.status == PENDING:
            if not requeue:
                self._dequeue(job)
                job.status = REMOVED
                self.jobs_by_name.pop(job.name, None)
            return
        if job.status != RUNNING:
            return
        self._account_stop(job, now)
        if requeue:
            self._enqueue(job, now)
        else:
            job.status = DONE
            self.jobs_by_name.pop(job.name, None)
            if finished:
                self._learn_size(job)

    def set_outside_nonpreemptible(self, gpus: Mapping[str, float]) -> None:
        """GPUs (fractional) held by non-preemptible work that is no job of the pool (a driver's GPU shares), by
        queue name: counted with each queue's, and its parents', non-preemptible GPUs in the quota check. Replaces
        the figures of the last call; names not in the tree are ignored."""
        out = [0.0] * len(self.np_outside)
        for name, g in gpus.items():
            i = self.tree.index.get(name)
            if i is not None and g:
                for a in self.paths[i]:
                    out[a] += g
        self.np_outside = out

    def resync_free(self) -> None:
        """Recount the free whole healthy GPUs from the state (a driver that also places or counts pods
        the scheduler does not know calls this before each cycle)."""
        self.free_gpus = int(self._free_slots().sum())
        self._failed_place = None

    def set_gpu_health(self, node: int, gpu: int, healthy: bool, now: float) -> list[PoolJob]:
        """Mark a GPU (un)healthy; returns the running jobs that had a pod on it (killed and requeued).

        An unhealthy GPU is never chosen again until it is marked healthy.
        """
        st = self.state
        killed: list[PoolJob] = []
        if not healthy:
            owners = {a.pod.rsplit("/", 1)[0] for a in st.assignments.values() if a.node == node and gpu in a.gpus}
            for name in sorted(owners):
                job = self.jobs_by_name.get(name)
                if job is not None and job.status == RUNNING:
                    killed.append(job)
            for job in killed:
                self.kill(job, now, f"GPU {gpu} of node {st.node_names[node]} failed")
        was_free = bool(st.gpu_healthy[node, gpu] and st.gpu_free[node, gpu] >= MILLI)
        st.set_gpu_health(node, gpu, healthy)
        is_free = bool(st.gpu_healthy[node, gpu] and st.gpu_free[node, gpu] >= MILLI)
        self.free_gpus += int(is_free) - int(was_free)
        self._fs_dirty = True
        self._fs_time = -math.inf  # capacity changed: recompute at once
        if self.reservation is not None and not healthy and self.reservation.mask[node]:
            self.reservation = None  # chosen again on the next cycle
        return killed

    # ------------------------------------------------------------------ fair share
    def fair_share(self, now: float | None = None) -> np.ndarray:
        """(n_queues, 3) fair share (GPUs, milli-CPU, MiB) for the current demand and healthy capacity.

        With ``now`` and ``fair_share_refresh_s`` > 0, a share computed less than that long ago is
        reused unless a queue's demand appeared or vanished since.
        """
        if self._fs is not None and not self._fs_dirty:
            return self._fs
        refresh = self.cfg.fair_share_refresh_s
        if self._fs is not None and now is not None and refresh > 0 and now - self._fs_time < refresh:
            # only whether each queue has demand matters here (GPUs of running plus waiting jobs)
            active = [ra[0] + rp[0] > _EPS for ra, rp in zip(self.alloc, self.pend, strict=True)]
            if active == self._active:
                return self._fs
        demand = [[a + p for a, p in zip(ra, rp, strict=True)] for ra, rp in zip(self.alloc, self.pend, strict=True)]
        active = [d[0] > _EPS for d in demand]
        st = self.state
        kept = self._fs_cap  # (health_changes, cap): the healthy capacity moves only with a GPU's health
        if kept is None or kept[0] != st.health_changes:
            kept = self._fs_cap = (st.health_changes, np.array([float(self.healthy_gpus()), float(st.cpu_cap.sum()),
                                                                float(st.mem_cap.sum())]))
        cap = kept[1]
        dem = np.array(demand)
        inputs = (cap.tobytes(), dem.tobytes())
        if self._fs is None or inputs != self._fs_inputs:  # the same inputs, bit for bit: the same shares
            self._fs = self._fair_shares(self.tree, cap, dem, self.quota)
            self._fs_g = self._fs[:, 0].tolist()
            self._fs_inputs = inputs
            self.stats["fair_share_updates"] += 1
        self._fs_dirty = False
        self._fs_time = -math.inf if now is None else now
        self._active = active
        return self._fs

    def healthy_gpus(self) -> int:
        return int(self.state.gpu_healthy.sum())

    def _qkey(self, grp: int) -> tuple:
        """Queue order (KAI proportion): below fair share first, higher priority, lower allocation / share."""
        if not self.cfg.fair_share:
            return (0,)
        a = self.alloc[grp][0]
        fs = self._fs_g[grp]
        ratio = a / fs if fs > _EPS else (math.inf if a > 0 else 0.0)
        return (ratio >= 1.0 - 1e-9, -self.qprio[grp], ratio, grp)

    # ------------------------------------------------------------------ the cycle
    def cycle(self, now: float) -> CycleResult:
        """Run allocate, reserve, reclaim, preempt and elastic grow at time ``now`` (seconds)."""
        res = CycleResult(now)
        self.stats["cycles"] += 1
        self._wake_at = math.inf
        self._victim_cache = {}
        self._now = now
        if self.sizes is not None and self.sizes.version != self._sizes_keyed:
            self._rekey_pending()
        if self._promote:
            self._promote_starved(now)
        if self._demote:
            self._roll_levels(now)
        if self.n_pending:
            if self.cfg.fair_share:
                self.fair_share(now)
            self._allocate(now, res)
            for _ in range(4):
                if not self.n_pending:
                    break
                acted = False
                if self.cfg.reclaim:
                    acted |= self._reclaim(now, res)
                if self.cfg.preempt:
                    acted |= self._preempt(now, res)
                if self.cfg.consolidate and not acted:
                    acted |= self._consolidate(now, res)
                if not acted:
                    break
                self._allocate(now, res)
            if self.cfg.reserve_after_s is not None and self.n_pending:
                self._maybe_reserve(now)
        if self.cfg.elastic and self.elastic_running and not self.n_pending and (
                self.free_gpus > 0 or any(not j.gpus_per_pod for j in self.elastic_running.values())):
            self._grow(now, res)  # (workers without GPUs grow whatever GPUs are free)
        return res

    def _promote_starved(self, now: float) -> None:
        """Tiresias starvation rule: a job that waited ``promote_knob`` x the time it has run goes to
        level 0 (its level counts service from here)."""
        assert isinstance(self.order, TiresiasOrder)
        while self._promote and self._promote[0][0] <= now + 1e-9:
            _, _, job = heapq.heappop(self._promote)
            if job.status != PENDING or job.level == 0 or job.seq in self.unschedulable:
                continue
            if not self.order.promoted(now - job.pending_since, job.run_s):
                continue
            plist = self.pending[self._group(job)]
            shape = self._shape(job)
            plist.remove(job, shape)
            job.level = 0
            job.las_base = job.attained
            self._set_key(job)
            plist.insert(job, shape)

    def _stale(self, entry: tuple) -> bool:
        job = entry[3]
        return job.status != RUNNING or job.run_since != entry[2]

    def _roll_levels(self, now: float) -> None:
        """Running jobs whose Tiresias level changed by ``now`` move down a level."""
        while self._demote and self._demote[0][0] <= now + 1e-6:
            entry = heapq.heappop(self._demote)
            if self._stale(entry):
                continue
            job = entry[3]
            self._relevel(job, now)
            self._push_demotion(job, now + 1e-6)

    def _relevel(self, job: PoolJob, now: float, run_since: float | None = None) -> None:
        """A running job's level from its service at ``now`` (its run starting at ``run_since`` if given), with
        its key and the books keyed by (priority, level) moved along."""
        self._lv_add(job, -1)
        self._qnode_add(job, job.placed, -1)
        if run_since is not None:
            job.run_since = run_since
        job.level = self.order.level(job.las_at(now) + 1e-6)
        self._set_key(job)
        self._lv_add(job, 1)
        self._qnode_add(job, job.placed, 1)

    def _qnode_add(self, job: PoolJob, pods: Sequence[Assignment], sign: int) -> None:
        if job.preemptible:
            row = self.qnode[job.q]
            krow = self.knode[job.q].get(job.key[:2])
            if krow is None:
                krow = self.knode[job.q][job.key[:2]] = np.zeros(self.state.n_nodes, dtype=np.int64)
            for a in pods:
                row[a.node] += sign * len(a.gpus)
                krow[a.node] += sign * len(a.gpus)

    def _node_bound(self, queues: Sequence[int], g: int, n: int, extra: int, allowed: np.ndarray | None,
                    outranked: tuple | None = None, budget: float = math.inf) -> bool:
        """Could ``n`` pods of ``g`` GPUs fit if preemptible jobs of ``queues`` were evicted (only those of
        an order class ``outranked`` by the given key, if one is given; at most ``budget`` GPUs in all),
        with ``extra`` more GPUs anywhere? A cheap upper bound checked before any victim search."""
        if g <= 1 or extra:
            return True
        free = self._free_whole()
        pot = free
        for q in queues:
            if outranked is None:
                pot = pot + self.qnode[q]
            else:
                for key, row in self.knode[q].items():
                    if self._outranks(outranked, key):
                        pot = pot + row
        if allowed is not None:
            pot = np.where(allowed, pot, 0)
            free = np.where(allowed, free, 0)
        slots = pot // g
        if int(slots.sum()) < n:
            return False
        if math.isfinite(budget):  # the n cheapest pod slots must not need more evictions than the budget
            slot_costs: list[int] = []
            for node in np.flatnonzero(slots).tolist():
                f = int(free[node])
                for k in range(min(int(slots[node]), n)):
                    slot_costs.append(max(0, (k + 1) * g - f) - max(0, k * g - f))
            if sum(sorted(slot_costs)[:n]) > budget + 1e-6:
                return False
        return True

    def _lv_add(self, job: PoolJob, sign: int, gpus: int | None = None) -> None:
        """Count ``job`` (+1) or not (-1) in its group's running (priority, level) books."""
        key = job.key[:2]
        grp = self._group(job)
        self._run_ver[job.q] += 1  # every change of a running job passes here (kept victim lists)
        lv, lg = self.levels[grp], self.level_gpus[grp]
        lv[key] += sign
        lg[key] += sign * (job.running_gpus if gpus is None else gpus)
        if not lv[key]:
            del lv[key]
            del lg[key]

    def _worst_running(self, grp: int) -> tuple | None:
        lv = self.levels[grp] if self.cfg.fair_share else sum(self.levels, Counter())
        return max(lv) if lv else None

    def next_wakeup(self, now: float) -> float:
        """Earliest time (s) after ``now`` at which the scheduler wants a cycle without any event (a
        Tiresias level crossing while jobs wait, a promotion, a reservation or a minimum runtime coming
        due); ``inf`` if none."""
        best = self._wake_at
        if self.n_pending:
            while self._demote and self._stale(self._demote[0]):
                heapq.heappop(self._demote)
            if self._demote:
                best = min(best, self._demote[0][0])
            if self._promote:
                best = min(best, self._promote[0][0])
        return best if best > now + 1e-9 else math.inf

    # ------------------------------------------------------------------ views
    def reserved_gpus(self) -> tuple[int, int] | None:
        """(leaf queue index, GPUs) held idle for the reservation's waiting gang: the healthy free whole
        GPUs on the reserved nodes, at most what the gang needs; None when nothing is reserved."""
        r = self.reservation
        if r is None or r.job.status != PENDING:
            return None
        st = self.state
        memo = self._reserved_memo  # (reservation, state.changes, answer): the answer reads nothing else
        if memo is not None and memo[0] is r and memo[1] == st.changes:
            return memo[2]
        free = int(self._free_whole()[r.mask].sum())  # free whole healthy GPUs per node (kept per state change)
        held = r.job.q, min(free, r.job.min_pods * r.job.gpus_per_pod)
        self._reserved_memo = (r, st.changes, held)
        return held

    def fair_shares_by_name(self) -> dict[str, float]:
        """Fair share in GPUs per queue name (the last computed; every queue, inner ones too)."""
        fs = self._fs if self._fs is not None else self.fair_share()
        return {name: float(fs[i, 0]) for i, name in enumerate(self.tree.names)}

    def queue_allocation(self) -> np.ndarray:
        """(n_queues, 3) resources held by running jobs (GPUs, milli-CPU, MiB)."""
        return np.array(self.alloc)

    def queue_demand(self) -> np.ndarray:
        """(n_queues, 3) running plus waiting (minimum) asks."""
        return np.array(self.alloc) + np.array(self.pend)

    def pending_jobs(self) -> list[PoolJob]:
        """Every waiting job: in its queue, then those set aside (:attr:`unschedulable`)."""
        return [j for p in self.pending for j in p.jobs] + list(self.unschedulable.values())

    def running_jobs(self) -> list[PoolJob]:
        return [j for r in self.running for j in r.values()]
