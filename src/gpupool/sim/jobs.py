"""Event-driven job simulator: a driver that feeds the pool scheduler and carries out its decisions.

Events (counted in ``events`` and ``events_per_second``): job **arrival**, **start**, **finish**,
**preempt**, **fail** (a node or GPU under one of its pods failed) and **resize** (an elastic job grew or
shrank). Node/GPU failures and repairs, Tiresias wake-ups and metric samples are processed too but not
counted. At one instant, finishes go first, then failures and repairs, then arrivals; then the
scheduler runs one cycle (:meth:`~gpupool.engine.pool.scheduler.PoolScheduler.cycle`).

Jobs: a trace job of ``N`` GPUs becomes a gang of pods of at most the largest node's GPUs each
(:func:`~gpupool.engine.pool.job.split_gpus`), with ``cpu_per_gpu`` milli-CPU and ``mem_per_gpu`` MiB per
GPU (default: half of the smallest CPU and memory per GPU of any GPU node). Its trace ``duration`` is the work it needs
at full speed on the reference GPU model. A running job progresses at

    rate = speed(GPU model) x speed(topology tier) x (pods / nominal pods, for elastic jobs)

* GPU model (``gpu_speed``): ``"none"`` (default) keeps the trace's durations on every model: the
  traces do not say which GPU a job ran on. ``"catalog"`` scales by the catalog's
  ``relative_throughput`` relative to ``reference_gpu`` (default: the cluster's most common model;
  unknown models count 1.0); a gang runs at its slowest GPU. The catalog's figures are datasheet
  tensor-core peak ratios, an ordering rather than measured speedups (P100 at 0.15 of a V100 is far
  below what real training shows), so use ``"catalog"`` to weigh energy against completion time on
  mixed clusters, not to predict JCT.
* topology: :func:`gpupool.topology.speed_factor` of the tier the placement crosses
  (:func:`gpupool.topology.placement_tier`); factors and their sources are documented there.

Restarts: every start after the first stalls ``restart_overhead_s`` (container start, checkpoint load)
before progressing. A preempted job checkpoints on eviction (``checkpoint_on_preempt``, graceful
termination as in Tiresias and Gandiva) and loses nothing; a job killed by a failure restarts from its
last checkpoint (every ``checkpoint_interval_s`` of progress, :func:`gpupool.sim.failures.restart_point`)
and the work since is reported as lost GPU-hours.

Energy (:mod:`gpupool.energy`): GPUs held by a job draw ``power_w(model, gpu_utilization)``, every other
GPU (failed ones included) its idle power, over the makespan.

No job is lost: every job ends ``finished``, or ``unfinished`` with a reason (it can never fit the
cluster, or the run stopped while it waited).
"""

from __future__ import annotations

import gc
import heapq
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from gpupool.catalog import get_model
from gpupool.cluster import ClusterState
from gpupool.energy import JOULES_PER_KWH, power_figures
from gpupool.engine.pool.fairshare import jain_index
from gpupool.engine.pool.job import RUNNING, PoolJob, split_gpus
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import JOB_POLICIES, PoolConfig, PoolScheduler, job_policy
from gpupool.model import Assignment, NodeSpec, PodRequest
from gpupool.policies import make_policy
from gpupool.sim.failures import FailureEvent, FailureModel, HealthTracker, restart_point
from gpupool.sim.migration import MigrationConfig, MoveCandidate, plan_moves
from gpupool.sim.placement import hetero_placement, job_classes
from gpupool.sim.throughput import ThroughputTable
from gpupool.topology import TopologyConfig, placement_tier, speed_factor
from gpupool.traces.jobs import JobRecord

__all__ = ["JobSimConfig", "JobSimResult", "JobSpec", "default_queues", "run_jobs", "JOB_POLICY_NAMES"]

JOB_POLICY_NAMES = tuple(JOB_POLICIES)

_SAMPLES_PER_STEP = 20_000
"""Queue-share samples taken at each sampling period before the period doubles (a year of hourly samples
is 8,760)."""

# event kinds, in processing order at equal times
_FINISH, _FAILURE, _ARRIVAL, _WAKE, _SAMPLE = 0, 1, 2, 3, 4


@dataclass(frozen=True)
class JobSpec:
    """A job with everything a trace row cannot say (for scenarios and tests); a
    :class:`~gpupool.traces.jobs.JobRecord` is a JobSpec with the defaults.

    ``n_pods``: pods of the gang (None: :func:`~gpupool.engine.pool.job.split_gpus`; ``num_gpu`` must
    then divide evenly); ``priority`` (>= 100: non-preemptible, in quota only); ``min_pods`` /
    ``max_pods``: elastic bounds (0: not elastic); ``topology`` / ``topology_tier``: see
    :class:`~gpupool.engine.pool.job.PoolJob`. Times in seconds.
    """

    job_id: str
    submit_time: float
    duration: float
    num_gpu: int
    queue: str = ""
    n_pods: int | None = None
    priority: int = 0
    min_pods: int = 0
    max_pods: int = 0
    topology: str = "preferred"
    topology_tier: str = "switch"
    line: int = 0
    job_type: str = ""


@dataclass(frozen=True)
class JobSimConfig:
    """Parameters of one simulated run (units: seconds, hours for MTBF, GPUs).

    * ``policy``: a job-level policy of :data:`~gpupool.engine.pool.scheduler.JOB_POLICIES`; ``pool``
      overrides its scheduler config (e.g. for ablations and tests).
    * ``checkpoint_interval_s``: progress between periodic checkpoints (inf: none);
      ``checkpoint_on_preempt``; ``restart_overhead_s``.
    * ``node_mtbf_h``, ``gpu_mtbf_h``, ``repair_h``: failure injection (None: no failures), seeded with
      ``seed`` (:class:`gpupool.sim.failures.FailureModel`); ``failure_events``: explicit failures and
      repairs instead (e.g. for a scenario), each failure with its repair.
    * ``gpu_utilization``: utilization (0..1) of a GPU held by a running job, for power.
    * ``cpu_per_gpu``, ``mem_per_gpu``: milli-CPU and MiB each job asks per GPU (None: half of the
      smallest per-GPU share of any GPU node, so host resources never block a GPU).
    * ``elastic_fraction``: share of multi-GPU jobs made elastic (min = half its pods, max = double),
      drawn with the seed.
    * ``topology``: slowdown factors (None: :data:`gpupool.topology.DEFAULT_SPEED_FACTORS`).
    * ``sample_interval_s``: period of the queue-share samples (fair share, Jain index, plots); it
      doubles after every 20,000 samples, so that a very long run keeps a bounded number of them.
    * ``gpu_speed``: ``"none"`` or ``"catalog"`` (see the module docstring); ``reference_gpu``: the model
      on which trace durations were measured (None: the most common model).
    * ``max_gpus_per_pod``: at most this many GPUs per pod when a job is split into pods (None: a node's
      GPUs, so a job spans the fewest nodes); 1 places a job's GPUs anywhere, one per pod, as a scheduler
      that only counts free GPUs does (the Tiresias simulator's ``--scheme=count``).
    * ``size_estimate_error``: None (default): jobs carry no size estimate. A number ``sigma >= 0``: every job
      carries an estimate of its size (:attr:`PoolJob.size_estimate`, which the ``gittins`` and ``remaining``
      orders use): its trace duration x GPUs x ``exp(sigma * N(0, 1))``, drawn from its own generator seeded
      with ``seed`` (other draws are unchanged). ``0.0`` gives every job its trace size (its work): with no
      restart overhead, no failures and a checkpoint at every eviction (the Tiresias-matched model of
      ``benchmarks/bench_job_order.py``) that is exactly the service it will attain, a clairvoyant bound for
      what job-size knowledge can win, not a policy; with the shipped model, service lost to restarts comes on
      top and an evicted job may overrun it. ``1.0`` is an estimate typically off by a factor up to e, as
      users' run-time limits are. Estimates are used once any job size is known (see
      :attr:`PoolJob.size_estimate`). ValueError for a negative or non-finite sigma.
    * ``objective``: ``"jct"``, ``"energy"`` or ``"balanced"``: heterogeneity-aware placement with
      ``gpu_speed="catalog"`` on a cluster whose models differ in speed
      (:func:`gpupool.sim.placement.hetero_placement`); None or ``"none"``: speed-blind (the
      default). No effect elsewhere.
    * ``throughputs``: per-job-type speeds (:mod:`gpupool.sim.throughput`; a JobSpec's ``job_type`` picks the
      row): a job's rate uses its type's speed on the slowest model of its placement, and heterogeneity-aware
      placement (``objective``) ranks models by it (a model where the type's speed is 0 is never used). Its
      ``""`` row, where given, replaces ``gpu_speed``'s per-model speeds. None: one speed per model.
    * ``las_work``: attained service (LAS levels, learned sizes) counts work done (GPU-seconds x the speed of
      the job's GPUs), not GPU-seconds; off by default.
    * ``migration``: move running jobs to faster GPUs (:mod:`gpupool.sim.migration`); None: never.
    """

    policy: str = "gpupool"
    seed: int = 42
    pool: PoolConfig | None = None
    checkpoint_interval_s: float = 1800.0
    checkpoint_on_preempt: bool = True
    restart_overhead_s: float = 30.0
    node_mtbf_h: float | None = None
    gpu_mtbf_h: float | None = None
    repair_h: float = 4.0
    failure_events: tuple[FailureEvent, ...] | None = None
    gpu_utilization: float = 1.0
    cpu_per_gpu: int | None = None
    mem_per_gpu: int | None = None
    elastic_fraction: float = 0.0
    topology: TopologyConfig | None = None
    sample_interval_s: float = 3600.0
    gpu_speed: str = "none"
    reference_gpu: str | None = None
    max_gpus_per_pod: int | None = None
    objective: str | None = None
    size_estimate_error: float | None = None
    throughputs: ThroughputTable | None = None
    las_work: bool = False
    migration: MigrationConfig | None = None


class _SimJob:
    __slots__ = ("rec", "pj", "work", "done", "rate", "seg_start", "stall_until", "ckpt", "version",
                 "first_start", "end", "busy_gpu_s", "energy_j", "lost_gpu_s", "restarts", "preemptions",
                 "failures", "tier", "status", "reason", "gpus_now", "base_pods", "seg_busy_w", "seg_idle_w",
                 "nodes", "cls", "moves", "moving")

    def __init__(self, rec: JobRecord, pj: PoolJob) -> None:
        self.rec = rec
        self.pj = pj
        self.work = float(rec.duration)
        self.done = 0.0
        self.rate = 0.0
        self.seg_start = math.nan
        self.stall_until = math.nan
        self.ckpt = 0.0
        self.version = 0
        self.first_start = math.nan
        self.end = math.nan
        self.busy_gpu_s = 0.0
        self.energy_j = 0.0
        self.lost_gpu_s = 0.0
        self.restarts = 0
        self.preemptions = 0
        self.failures = 0
        self.tier = ""
        self.status = "waiting"
        self.reason = ""
        self.gpus_now = 0
        self.base_pods = pj.n_pods
        self.seg_busy_w = 0.0
        self.seg_idle_w = 0.0
        self.nodes: tuple[str, ...] = ()
        self.cls: str = getattr(rec, "job_type", "")
        self.moves = 0
        self.moving = 0.0  # while a move is under way: the speed of the GPUs it left


class _Figures(NamedTuple):
    """Per-placement figures of :meth:`JobSimulator._placement_figures`: topology ``tier``, ``speed`` of
    the slowest GPU model, ``topo_factor`` (:func:`~gpupool.topology.speed_factor` of the tier for its
    GPUs), one node name per pod, and the busy / idle power (W) of its GPUs."""

    tier: str
    speed: float
    topo_factor: float
    node_names: tuple[str, ...]
    busy_w: float
    idle_w: float


@dataclass
class JobSimResult:
    """One policy's run. Times in seconds, energy in kWh, ratios 0..1; NaN where nothing was measured.

    ``jobs``: one dict per job (``job_id, queue, num_gpu, submit, start, end, jct, queueing_delay,
    status, reason, preemptions, failures, energy_kwh, tier, lost_gpu_hours, nodes``; ``nodes``: one
    node name per pod of its last placement). ``queues``: per-queue metrics.
    ``share_times`` (k,), ``share_alloc`` / ``share_fair`` (k, n_leaf_queues): GPU allocation and fair
    share sampled every ``sample_interval_s``; ``queue_names`` the leaf queues in that column order.
    """

    policy: str
    seed: int
    n_jobs: int
    metrics: dict[str, Any]
    queues: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]] = field(default_factory=list, repr=False)
    unfinished: list[dict[str, Any]] = field(default_factory=list)
    share_times: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)
    share_alloc: np.ndarray = field(default_factory=lambda: np.empty((0, 0)), repr=False)
    share_fair: np.ndarray = field(default_factory=lambda: np.empty((0, 0)), repr=False)
    queue_names: tuple[str, ...] = ()
    jct: np.ndarray = field(default_factory=lambda: np.empty(0), repr=False)

    def __getattr__(self, name: str) -> Any:
        metrics = self.__dict__.get("metrics")
        if metrics is not None and name in metrics:
            return metrics[name]
        raise AttributeError(name)

    def to_dict(self, with_jobs: bool = False) -> dict[str, Any]:
        out = {"policy": self.policy, "seed": self.seed, "n_jobs": self.n_jobs, **self.metrics,
               "queues": self.queues, "unfinished": self.unfinished}
        if with_jobs:
            out["jobs"] = self.jobs
        return out


def default_queues(jobs: Sequence[JobRecord], capacity_gpus: int) -> QueueTree:
    """One queue per trace queue (Philly virtual cluster), quota proportional to its GPU-time demand.

    ``quota_q = floor(capacity x demand_q / total demand)`` GPUs (so quotas add up to at most the
    cluster), ``weight = max(quota, 1)``. A trace without queues (ITP) gets one queue ``default`` with
    the whole cluster as quota. Raises ValueError for an empty trace.
    """
    if not jobs:
        raise ValueError("the job trace is empty")
    demand: Counter = Counter()
    for r in jobs:
        demand[r.queue or "default"] += r.duration * r.num_gpu
    total = sum(demand.values())
    specs = []
    for name in sorted(demand, key=lambda n: (-demand[n], n)):
        quota = math.floor(capacity_gpus * demand[name] / total) if total > 0 else 0
        specs.append(QueueSpec(name=name, quota=quota, weight=max(quota, 1)))
    return QueueTree(specs, "default queues")


class _Meter:
    """Exact per-queue integrals of GPU allocation and of the quota deficit, updated at each change.

    Quota deficit of a queue: the GPU-time by which its allocation fell short of ``min(demand, quota)``.
    ``deficit_raw`` counts all of it; ``deficit`` only while one of its waiting jobs fits within what
    is left of its quota (``smallest waiting job <= quota - held``): a quota guarantees room for
    jobs that fit in it, not for an 8-GPU job in a queue with 6 GPUs of quota. For ``deficit``, the
    queue holds its allocation plus the idle GPUs reserved for its own waiting gang (set aside for it,
    usable by no other queue; :meth:`PoolScheduler.reserved_gpus`).
    """

    def __init__(self, n: int, quota: np.ndarray) -> None:
        self.alloc = [0.0] * n
        self.demand = [0.0] * n
        self.waiting: list[Counter] = [Counter() for _ in range(n)]  # GPUs of each waiting job
        self.quota = quota.tolist()
        self.last = [0.0] * n
        self.alloc_int = [0.0] * n
        self.deficit_int = [0.0] * n
        self.deficit_raw_int = [0.0] * n
        self.want_int = [0.0] * n  # integral of min(demand, quota)
        self.held = [0.0] * n  # idle GPUs reserved for the queue's own waiting gang
        self.holder: int | None = None
        self.short_since: list[float | None] = [None] * n  # start of the current in-quota shortfall
        self.short_s = [0.0] * n  # time in an in-quota shortfall
        self.longest_short_s = [0.0] * n

    def touch(self, q: int, now: float) -> None:
        dt = now - self.last[q]
        if dt > 0:
            a, d = self.alloc[q], self.demand[q]
            want = min(d, self.quota[q])
            self.alloc_int[q] += a * dt
            self.want_int[q] += want * dt
            if want > a + 1e-9:
                self.deficit_raw_int[q] += (want - a) * dt
                h = a + self.held[q]
                waiting = self.waiting[q]
                if want > h + 1e-9 and waiting and min(waiting) <= self.quota[q] - h + 1e-9:
                    self.deficit_int[q] += (want - h) * dt
                    self.short_s[q] += dt
                    if self.short_since[q] is None:
                        self.short_since[q] = self.last[q]
                    self.last[q] = now
                    return
            self.end_shortfall(q)
        self.last[q] = now

    def end_shortfall(self, q: int) -> None:
        """Close queue ``q``'s current in-quota shortfall (if any) at the last time it was measured."""
        since = self.short_since[q]
        if since is not None:
            self.longest_short_s[q] = max(self.longest_short_s[q], self.last[q] - since)
            self.short_since[q] = None

    def reserve(self, now: float, held: tuple[int, int] | None) -> None:
        """The scheduler now holds ``held = (queue, GPUs)`` idle for a reserved gang (None: nothing)."""
        q, gpus = held if held is not None else (None, 0)
        old = self.holder
        if old is not None and (old != q or self.held[old] != gpus):
            self.touch(old, now)
            self.held[old] = 0.0
        if q is not None and self.held[q] != gpus:
            self.touch(q, now)
            self.held[q] = float(gpus)
        self.holder = q

    def change(self, q: int, now: float, d_alloc: float = 0.0, d_demand: float = 0.0,
               wait: int = 0, d_wait: int = 0) -> None:
        """Allocation / demand moved by ``d_alloc`` / ``d_demand`` GPUs; a waiting job of ``wait`` GPUs
        came (``d_wait=1``) or went (``-1``)."""
        self.touch(q, now)
        self.alloc[q] += d_alloc
        self.demand[q] += d_demand
        if d_wait:
            w = self.waiting[q]
            w[wait] += d_wait
            if w[wait] <= 0:
                del w[wait]


def _pct(values: np.ndarray, q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else math.nan


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if len(values) else math.nan


class JobSimulator:
    """One run; see :func:`run_jobs`."""

    def __init__(self, nodes: Sequence[NodeSpec], jobs: Sequence[JobRecord | JobSpec], queues: QueueTree | None,
                 config: JobSimConfig) -> None:
        self.cfg = config
        self.nodes = list(nodes)
        self.state = ClusterState(self.nodes)
        st = self.state
        if st.total_gpus == 0:
            raise ValueError("the job simulator needs a cluster with GPUs")
        self.records = sorted(jobs, key=lambda r: (r.submit_time, r.line))
        self.tree = queues if queues is not None else default_queues(self.records, st.total_gpus)
        placement, pool = job_policy(config.policy)
        pool = config.pool or pool
        self.gpn = int(st.gpu_count.max())
        gpu_nodes = st.gpu_count > 0
        ratio_cpu = float((st.cpu_cap[gpu_nodes] / st.gpu_count[gpu_nodes]).min())
        ratio_mem = float((st.mem_cap[gpu_nodes] / st.gpu_count[gpu_nodes]).min())
        self.cpu_per_gpu = int(config.cpu_per_gpu if config.cpu_per_gpu is not None else ratio_cpu // 2)
        self.mem_per_gpu = int(config.mem_per_gpu if config.mem_per_gpu is not None else ratio_mem // 2)
        self.topo = config.topology
        # typical pods for placement policies that learn from the workload (FGD / gpupool)
        shapes: Counter = Counter()
        for r in self.records:
            _, g = split_gpus(r.num_gpu, self.gpn)
            shapes[g] += 1
        workload = [PodRequest(f"typical-{g}-{i}", cpu_milli=self.cpu_per_gpu * g, memory_mib=self.mem_per_gpu * g,
                               num_gpu=g, gpu_milli=1000)
                    for g, c in shapes.items() for i in range(max(1, round(1000 * c / max(1, len(self.records)))))]
        # per-node figures: speed of its GPU model, busy and idle power
        models = [s.gpu_model for s in self.nodes]
        ref = config.reference_gpu or Counter(m for s in self.nodes for m in [s.gpu_model] * s.gpu_count
                                              ).most_common(1)[0][0]
        ref_tp = get_model(ref).relative_throughput or 0.0
        if config.gpu_speed not in ("none", "catalog"):
            raise ValueError(f"gpu_speed must be 'none' or 'catalog', got {config.gpu_speed!r}")
        speeds = []
        for m in models:
            tp = get_model(m).relative_throughput if m else 0.0
            speeds.append(tp / ref_tp if (tp and ref_tp and config.gpu_speed == "catalog") else 1.0)
        self.table = config.throughputs
        if self.table is not None:
            speeds = self.table.node_speeds("", models, speeds).tolist()
        self.node_speed = speeds
        idle, peak, known = power_figures([m or "none" for m in models])
        u = config.gpu_utilization
        self.node_busy_w = (idle + (peak - idle) * u).tolist()
        self.node_idle_w = idle.tolist()
        placement = hetero_placement(placement, self.nodes, config.gpu_speed, config.objective,  # sim/placement.py
                                     config.reference_gpu, config.gpu_utilization,
                                     None if self.table is None else np.array(speeds))
        self.job_cls: dict[str, str] = {r.job_id: getattr(r, "job_type", "") for r in self.records}
        if self.table is not None:  # per-job-type rows for placement (sim/placement.py)
            placement = job_classes(placement, self.table, self.records, models, speeds, self.node_busy_w,
                                    self.node_idle_w, st.gpu_count.tolist(), self.job_cls)
        self.sched = PoolScheduler(st, make_policy(placement) if isinstance(placement, str) else placement, self.tree,
                                   pool, seed=config.seed, workload=workload)
        self.sched.victims_across_cycles = True  # no job here is ever protected from eviction (protected_until)
        if config.las_work:  # attained service in work done: the speed of the job's slowest GPU
            self.sched.service_rate_of = lambda pj: self._placement_figures(pj.placed, self.job_cls[pj.name]).speed
        self.move_lost_gpu_s = 0.0  # GPU-seconds of moved jobs' restarts
        self.moves_faster = 0  # moves that landed on faster GPUs (else the gang did not fit there after all)
        self.models = models
        self.leaf_names = tuple(self.tree.names[i] for i in self.tree.leaves.tolist())
        self.leaf_col = {int(q): k for k, q in enumerate(self.tree.leaves.tolist())}
        self.meter = _Meter(len(self.tree), self.tree.quota_gpu)
        self.gpu_count = st.gpu_count.tolist()
        self.opaque_models = sorted({m for m, k in zip(models, known, strict=True) if m and not k})
        sigma = config.size_estimate_error
        if sigma is not None and not (math.isfinite(sigma) and sigma >= 0):
            raise ValueError(f"size_estimate_error must be a finite number >= 0, got {sigma}")
        self.rng = np.random.default_rng(config.seed)
        self._figures: dict[tuple[tuple[int, int], ...], _Figures] = {}  # by (node, GPUs) of each pod

    # ------------------------------------------------------------------ helpers
    def _make_job(self, rec: JobRecord | JobSpec, elastic: bool) -> _SimJob:
        n_pods = getattr(rec, "n_pods", None)
        if n_pods is None:
            n, g = split_gpus(rec.num_gpu, min(self.gpn, self.cfg.max_gpus_per_pod or self.gpn))
        else:
            if n_pods < 1 or rec.num_gpu % n_pods:
                raise ValueError(f"job {rec.job_id}: {rec.num_gpu} GPUs do not split into {n_pods} equal pods")
            n, g = n_pods, rec.num_gpu // n_pods
        queue = rec.queue or "default"
        if queue not in self.tree.index and "default" in self.tree.index:
            queue = "default"
        kwargs: dict[str, Any] = {
            "priority": getattr(rec, "priority", 0), "min_pods": getattr(rec, "min_pods", 0),
            "max_pods": getattr(rec, "max_pods", 0), "topology": getattr(rec, "topology", "preferred"),
            "topology_tier": getattr(rec, "topology_tier", "switch"),
        }
        if elastic and n > 1 and not kwargs["min_pods"] and not kwargs["max_pods"]:
            kwargs.update(min_pods=max(1, n // 2), max_pods=2 * n)
        pj = PoolJob(rec.job_id, queue, g, n, rec.submit_time, cpu_per_pod=self.cpu_per_gpu * g,
                     mem_per_pod=self.mem_per_gpu * g, **kwargs)
        return _SimJob(rec, pj)

    def _placement_figures(self, placed: Sequence[Assignment], cls: str = "") -> _Figures:
        """What a placement's rate and power depend on (see :class:`_Figures`), memoized by the
        placement's (node, GPUs) per pod (and job class, with a throughput table): placements repeat, and each
        figure is a pure function of them."""
        key = tuple([(a.node, len(a.gpus)) for a in placed])
        if cls and self.table is not None:
            key += (cls,)
        fig = self._figures.get(key)
        if fig is None:
            nodes = [self.nodes[a.node] for a in placed]
            gpus = [len(a.gpus) for a in placed]
            tier = placement_tier(nodes, gpus)
            by_node = self.node_speed if not cls or self.table is None else self.table.node_speeds(
                cls, [n.gpu_model for n in self.nodes], self.node_speed)
            speed = float(min(by_node[a.node] for a in placed)) if placed else 1.0
            fig = self._figures[key] = _Figures(
                tier, speed, speed_factor(tier, sum(gpus), self.topo), tuple(a.node_name for a in placed),
                sum(len(a.gpus) * self.node_busy_w[a.node] for a in placed),
                sum(len(a.gpus) * self.node_idle_w[a.node] for a in placed))
        return fig

    def _begin_segment(self, sj: _SimJob, now: float, restart: bool) -> None:
        placed = sj.pj.placed
        fig = self._placement_figures(placed, sj.cls)
        sj.rate = fig.speed * fig.topo_factor * (len(placed) / sj.base_pods)  # the rate of the module docstring
        sj.tier = fig.tier
        sj.seg_start = now
        sj.stall_until = now + (self.cfg.restart_overhead_s if restart else 0.0)
        sj.gpus_now = len(placed) * sj.pj.gpus_per_pod  # PoolJob.running_gpus
        if sj.moving and self.cfg.migration is not None:  # restarted after a move: its own restart cost
            self.moves_faster += fig.speed > sj.moving
            sj.moving = 0.0
            sj.stall_until = now + self.cfg.migration.restart_s
            self.move_lost_gpu_s += self.cfg.migration.restart_s * sj.gpus_now
        sj.nodes = fig.node_names
        sj.seg_busy_w = fig.busy_w
        sj.seg_idle_w = fig.idle_w
        sj.version += 1
        sj.status = "running"
        remaining = max(0.0, sj.work - sj.done)
        finish = sj.stall_until + remaining / sj.rate if sj.rate > 0 else math.inf
        if math.isfinite(finish):
            self._push(finish, _FINISH, (sj, sj.version))

    def _end_segment(self, sj: _SimJob, now: float) -> None:
        """Fold the running segment into progress, busy time and energy."""
        dt = max(0.0, now - sj.seg_start)
        productive = max(0.0, now - max(sj.seg_start, sj.stall_until))
        sj.done = min(sj.work, sj.done + sj.rate * productive)
        sj.busy_gpu_s += sj.gpus_now * dt
        sj.energy_j += sj.seg_busy_w * dt
        self.busy_gpu_s += sj.gpus_now * dt
        self.busy_energy_j += sj.seg_busy_w * dt
        self.idle_credit_j += sj.seg_idle_w * dt
        sj.version += 1

    def _push(self, when: float, kind: int, payload: Any) -> None:
        self.seqno += 1
        heapq.heappush(self.heap, (when, kind, self.seqno, payload))

    # ------------------------------------------------------------------ run
    def run(self, progress: Callable[[int, int], None] | None = None) -> JobSimResult:
        """Simulate the trace (see :func:`run_jobs`). Python's cyclic garbage collector (process-wide) is paused
        meanwhile and resumed after, if it was on: a run makes next to no cyclic garbage (a few hundred objects on
        30,000 Philly jobs), while the collector's full passes over its live objects took 0.4-0.6 s of such a run
        (fifo, an event loop of about 3 s)."""
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress)
        finally:
            if was_enabled:
                gc.enable()

    def _run(self, progress: Callable[[int, int], None] | None) -> JobSimResult:
        cfg = self.cfg
        sched = self.sched
        self.heap: list[tuple] = []
        heap = self.heap
        heappop = heapq.heappop
        meter = self.meter
        self.seqno = 0
        self.busy_gpu_s = 0.0
        self.busy_energy_j = 0.0
        self.idle_credit_j = 0.0
        events: Counter = Counter()
        sims: list[_SimJob] = []
        by_name: dict[str, _SimJob] = {}
        unfinished: list[dict[str, Any]] = []
        elastic_draw = self.rng.random(len(self.records)) < cfg.elastic_fraction
        for i, rec in enumerate(self.records):
            sj = self._make_job(rec, bool(elastic_draw[i]))
            sims.append(sj)
            by_name[sj.pj.name] = sj
        if len(by_name) != len(sims):
            raise ValueError("job ids in the trace are not unique")
        if cfg.size_estimate_error is not None:  # users' size estimates, from a generator of their own
            noise = np.random.default_rng([cfg.seed, 1]).standard_normal(len(sims))
            for sj, z in zip(sims, np.exp(cfg.size_estimate_error * noise).tolist(), strict=True):
                sj.pj.size_estimate = float(sj.rec.duration) * sj.rec.num_gpu * z
        last_arrival = self.records[-1].submit_time if self.records else 0.0
        horizon = last_arrival + 10 * max((r.duration for r in self.records), default=0.0) + 86400.0
        tracker = None
        failures: Sequence[FailureEvent] = ()
        if cfg.failure_events is not None:
            failures = sorted(cfg.failure_events, key=FailureEvent.sort_key)
        elif cfg.node_mtbf_h is not None or cfg.gpu_mtbf_h is not None:
            failures = FailureModel(cfg.node_mtbf_h, cfg.gpu_mtbf_h, cfg.repair_h, cfg.seed).events(self.nodes, horizon)
        if failures:
            tracker = HealthTracker(self.nodes)
            for ev in failures:
                self._push(ev.time_s, _FAILURE, ev)
        n_failure_events = 0
        if cfg.sample_interval_s > 0:
            self._push(0.0, _SAMPLE, None)
        samples_t: list[float] = []
        samples_a: list[list[float]] = []
        samples_f: list[list[float]] = []
        leaves = self.tree.leaves.tolist()
        deadlocks = 0
        preempt_reasons: Counter = Counter()
        lost_gpu_s = 0.0
        wake_at = math.inf
        ai = 0
        n = len(sims)
        finished = 0
        removed = 0
        now = 0.0
        submit_times = [sj.rec.submit_time for sj in sims]
        def apply(res: Any, now: float) -> None:
            """Carry out one cycle's decisions (preemptions, starts, resizes)."""
            nonlocal deadlocks
            for pj, why in res.preempted:
                sj = by_name[pj.name]
                self._stop_job(sj, now, failed=False)
                events["preempt"] += 1
                preempt_reasons[why.split(" by ", 1)[0]] += 1
            for pj in res.started:
                sj = by_name[pj.name]
                restart = not math.isnan(sj.first_start)
                if not restart:
                    sj.first_start = now
                else:
                    sj.restarts += 1
                meter.change(pj.q, now, pj.running_gpus, wait=pj.min_pods * pj.gpus_per_pod, d_wait=-1)
                self._begin_segment(sj, now, restart)
                events["start"] += 1
            for pj, _old, _new in res.resized:
                sj = by_name[pj.name]
                if pj.status != RUNNING:
                    continue
                delta = pj.running_gpus - sj.gpus_now  # 0 for a job started (at its new size) just now
                events["resize"] += 1
                if delta == 0:
                    continue
                self._end_segment(sj, now)
                sj.ckpt = sj.done  # elastic frameworks checkpoint at a membership change
                meter.change(pj.q, now, delta)
                self._begin_segment(sj, now, restart=False)
            meter.reserve(now, sched.reserved_gpus())
            if sched.n_running == 0 and sched.n_pending > 0:
                deadlocks += self._idle_deadlock()

        t0 = time.perf_counter()
        next_tick = 0
        while True:
            t_arr = submit_times[ai] if ai < n else math.inf
            t_evt = heap[0][0] if heap else math.inf
            if t_arr == math.inf and t_evt == math.inf:
                break
            if finished + removed >= n and ai >= n:
                break
            now = min(t_arr, t_evt)
            need_cycle = False
            # ---- heap events at this instant (finishes, failures/repairs, wake-ups, samples)
            while heap and heap[0][0] <= now:
                when, kind, _, payload = heappop(heap)
                if kind == _FINISH:
                    sj, version = payload
                    if version != sj.version or sj.pj.status != RUNNING:
                        continue
                    self._end_segment(sj, now)
                    q = sj.pj.q
                    gpus = sj.pj.running_gpus
                    sched.finish(sj.pj, now)
                    meter.change(q, now, -gpus, -sj.pj.min_pods * sj.pj.gpus_per_pod)
                    sj.status = "finished"
                    sj.end = now
                    finished += 1
                    events["finish"] += 1
                    need_cycle = True
                elif kind == _FAILURE:
                    assert tracker is not None
                    n_failure_events += 1
                    for node, gpu, usable in tracker.apply(payload):
                        killed = sched.set_gpu_health(node, gpu, usable, now)
                        for pj in killed:
                            sj = by_name[pj.name]
                            lost_gpu_s += self._stop_job(sj, now, failed=True)
                            events["fail"] += 1
                        need_cycle = True
                elif kind == _WAKE:
                    if when >= wake_at - 1e-9:
                        wake_at = math.inf
                    need_cycle = True
                else:  # sample
                    fs = sched.fair_share() if self.cfg.sample_interval_s > 0 else None
                    samples_t.append(now)
                    samples_a.append([meter.alloc[q] for q in leaves])
                    samples_f.append([float(fs[q, 0]) for q in leaves] if fs is not None else [])
                    if finished + removed < n:
                        # the period doubles every _SAMPLES_PER_STEP samples: bounded memory on long runs
                        step = cfg.sample_interval_s * 2.0 ** (len(samples_t) // _SAMPLES_PER_STEP)
                        self._push(now + step, _SAMPLE, None)
            # ---- arrivals at this instant
            while ai < n and submit_times[ai] <= now:
                sj = sims[ai]
                ai += 1
                events["arrival"] += 1
                try:
                    # asked before submit, which makes every pod of the job: a row asking 10**9 GPUs is refused
                    # here, not built into 10**8 pod requests first
                    sched.tree.leaf_index(sj.pj.queue)  # an unknown queue first (KeyError), as submit says it
                    reason = sched.infeasible_reason(sj.pj)
                    if not reason:
                        sched.submit(sj.pj, now)
                except KeyError as exc:
                    sj.status, sj.reason = "unfinished", f"unknown queue: {exc.args[0]}"
                    removed += 1
                    unfinished.append(self._unfinished(sj))
                    continue
                if reason:
                    sj.status, sj.reason = "unfinished", reason
                    removed += 1
                    unfinished.append(self._unfinished(sj))
                    continue
                size = sj.pj.min_pods * sj.pj.gpus_per_pod
                meter.change(sj.pj.q, now, 0.0, size, wait=size, d_wait=1)
                need_cycle = True
            # ---- one scheduling cycle (then moves to faster GPUs, with a second cycle that places them)
            if need_cycle:
                apply(sched.cycle(now), now)
                if cfg.migration is not None and self._move_jobs(now, by_name, events):
                    apply(sched.cycle(now), now)
                w = sched.next_wakeup(now)
                if w < wake_at:
                    wake_at = w
                    self._push(w, _WAKE, None)
            if progress is not None:
                done = finished + removed
                if done >= next_tick:
                    progress(done, n)
                    next_tick = done + max(1, n // 200)
            # stuck: nothing runs, nothing will arrive or change
            if ai >= n and sched.n_running == 0 and sched.n_pending > 0:
                pending_change = any(k in (_FINISH, _FAILURE, _WAKE) for _, k, _, _ in heap)
                if not pending_change:
                    for pj in sched.pending_jobs():
                        sj = by_name[pj.name]
                        why = sched.infeasible_reason(pj) or "the scheduler never started it (deadlock)"
                        if "deadlock" in why:
                            deadlocks += 1
                        sched.remove(pj, now, why)
                        sj.status, sj.reason = "unfinished", why
                        removed += 1
                        unfinished.append(self._unfinished(sj))
                    break
        wall = time.perf_counter() - t0
        if progress is not None:
            progress(n, n)
        # jobs still running or waiting when the loop ended (only if stopped early)
        for sj in sims:
            if sj.status in ("running", "waiting") and sj.pj.status in (RUNNING, "pending"):
                if sj.pj.status == RUNNING:
                    self._end_segment(sj, now)
                sj.status, sj.reason = "unfinished", "simulation ended before it finished"
                unfinished.append(self._unfinished(sj))
        return self._result(sims, events, wall, deadlocks, lost_gpu_s, preempt_reasons, unfinished,
                            samples_t, samples_a, samples_f, n_failure_events, now)

    def _move_jobs(self, now: float, by_name: dict[str, _SimJob], events: Counter) -> bool:
        """Moves to faster GPUs (:mod:`gpupool.sim.migration`): each job planned is checkpointed and its gang placed
        again on the faster nodes (:meth:`PoolScheduler.move`), restarting after the move's restart cost. True if any
        moved (its old GPUs are free: another cycle may use them). Non-preemptible and elastic jobs stay."""
        cfg = self.cfg.migration
        assert cfg is not None
        sched = self.sched
        default = np.asarray(self.node_speed)
        cands = []
        for running in sched.running:
            for pj in running.values():
                sj = by_name[pj.name]
                if not pj.preemptible or pj.elastic or sj.rate <= 0 or sj.moving:
                    continue
                speed = self._placement_figures(pj.placed, sj.cls).speed
                done = sj.done + sj.rate * max(0.0, now - max(sj.seg_start, sj.stall_until))
                rest = max(0.0, sj.work - done) * speed / sj.rate  # so that rest / speed is the time left here
                node_speed = default if self.table is None else self.table.node_speeds(sj.cls, self.models,
                                                                                       self.node_speed)
                cands.append(MoveCandidate(sj, speed, rest, now - sj.seg_start, pj.n_pods, pj.gpus_per_pod,
                                           node_speed))
        if not cands:
            return False

        def move(c: MoveCandidate, target: float) -> bool:
            sj = c.key
            assert isinstance(sj, _SimJob)
            self._end_segment(sj, now)
            landed = sched.move(sj.pj, c.node_speed == target, now)  # the level the planner found room on
            sj.moves += 1
            sj.restarts += 1
            sj.ckpt = sj.done  # checkpointed to move
            sj.moving = c.speed
            self._begin_segment(sj, now, restart=True)
            events["move"] += 1
            return landed

        moves = plan_moves(cands, lambda c: sched.fits_per_node(c.key.pj, None), cfg, move)
        return bool(moves)

    def _stop_job(self, sj: _SimJob, now: float, failed: bool) -> float:
        """A running job was preempted (already requeued by the scheduler) or killed by a failure.
        Returns the GPU-seconds of work lost."""
        gpus = sj.gpus_now
        self._end_segment(sj, now)
        lost = 0.0
        if failed:
            sj.failures += 1
            keep = max(sj.ckpt, restart_point(sj.done, self.cfg.checkpoint_interval_s))
            lost_work = max(0.0, sj.done - keep)
            lost = lost_work / sj.rate * gpus if sj.rate > 0 else 0.0
            sj.done = keep
            sj.lost_gpu_s += lost
        else:
            sj.preemptions += 1
            if self.cfg.checkpoint_on_preempt:
                sj.ckpt = sj.done
            else:
                keep = max(sj.ckpt, restart_point(sj.done, self.cfg.checkpoint_interval_s))
                lost = max(0.0, sj.done - keep) / sj.rate * gpus if sj.rate > 0 else 0.0
                sj.done = keep
                sj.lost_gpu_s += lost
        sj.status = "waiting"
        self.meter.change(sj.pj.q, now, -gpus, wait=sj.pj.min_pods * sj.pj.gpus_per_pod, d_wait=1)
        return lost

    def _idle_deadlock(self) -> int:
        """1 if the cluster is idle but some waiting job would fit it now (a scheduler deadlock), else 0.
        A job whose required topology scope cannot hold it (e.g. while GPUs of its switch are down)
        waits for hardware, not for the scheduler."""
        sched = self.sched
        for pj in sched.pending_jobs():
            f = sched.fits_per_node(pj, None)
            if int(f.sum()) < pj.min_pods or not sched._admissible(pj, pj.min_pods):
                continue
            if (pj.topology == "required" and sched.cfg.topology_aware and pj.min_pods > 1
                    and not sched.scopes(pj, f, pj.min_pods)):
                continue
            return 1
        return 0

    def _unfinished(self, sj: _SimJob) -> dict[str, Any]:
        return {"job_id": sj.rec.job_id, "queue": sj.pj.queue, "num_gpu": sj.rec.num_gpu,
                "submit": sj.rec.submit_time, "reason": sj.reason}

    # ------------------------------------------------------------------ metrics
    def _result(self, sims: list[_SimJob], events: Counter, wall: float, deadlocks: int, lost_gpu_s: float,
                preempt_reasons: Counter, unfinished: list[dict[str, Any]], samples_t: list[float],
                samples_a: list[list[float]], samples_f: list[list[float]], n_failure_events: int,
                now: float) -> JobSimResult:
        cfg = self.cfg
        done = [s for s in sims if s.status == "finished"]
        submit = np.array([s.rec.submit_time for s in done])
        end = np.array([s.end for s in done])
        start = np.array([s.first_start for s in done])
        jct = end - submit
        delay = start - submit
        t_first = min((s.rec.submit_time for s in sims), default=0.0)
        t_last = max((s.end for s in done), default=t_first)
        makespan = max(0.0, t_last - t_first)
        total_gpus = self.state.total_gpus
        capacity_gpu_s = total_gpus * makespan
        for q in range(len(self.tree)):
            self.meter.touch(q, t_last)
            self.meter.end_shortfall(q)
        idle_w_total = sum(c * w for c, w in zip(self.gpu_count, self.node_idle_w, strict=True))
        idle_j = idle_w_total * makespan - self.idle_credit_j
        energy_kwh = (self.busy_energy_j + max(0.0, idle_j)) / JOULES_PER_KWH
        n_events = sum(events.values())
        # queue shares
        times = np.array(samples_t)
        alloc = np.array(samples_a) if samples_a else np.empty((0, len(self.leaf_names)))
        fair = np.array(samples_f) if samples_f and samples_f[0] else np.empty((0, len(self.leaf_names)))
        jain = jain_capped = math.nan
        ratios = {}
        if len(fair):
            fs_sum = fair.sum(axis=0)
            a_sum = alloc.sum(axis=0)
            ok = fs_sum > 1e-9
            x = a_sum[ok] / fs_sum[ok]
            jain = jain_index(x)
            jain_capped = jain_index(np.minimum(x, 1.0))
            ratios = {self.leaf_names[k]: float(a_sum[k] / fs_sum[k]) for k in np.flatnonzero(ok)}
        queues: dict[str, dict[str, Any]] = {}
        by_q: dict[str, list[_SimJob]] = {}
        for s in sims:
            by_q.setdefault(s.pj.queue, []).append(s)
        for name in self.leaf_names:
            q = self.tree.index[name]
            members = by_q.get(name, [])
            fin = [s for s in members if s.status == "finished"]
            qj = np.array([s.end - s.rec.submit_time for s in fin])
            qd = np.array([s.first_start - s.rec.submit_time for s in fin])
            want = self.meter.want_int[q]
            queues[name] = {
                "quota_gpus": float(self.tree.quota_gpu[q]),
                "weight": float(self.tree.weight[q]),
                "jobs": len(members),
                "finished": len(fin),
                "mean_jct_s": _mean(qj),
                "p95_jct_s": _pct(qj, 95),
                "mean_queueing_delay_s": _mean(qd),
                "gpu_hours": sum(s.busy_gpu_s for s in members) / 3600.0,
                "mean_gpus": self.meter.alloc_int[q] / makespan if makespan > 0 else math.nan,
                "share_vs_fair_share": ratios.get(name, math.nan),
                "quota_deficit": self.meter.deficit_int[q] / want if want > 0 else 0.0,
                "quota_deficit_raw": self.meter.deficit_raw_int[q] / want if want > 0 else 0.0,
                "quota_shortfall_time_share": self.meter.short_s[q] / makespan if makespan > 0 else 0.0,
                "quota_shortfall_longest_s": self.meter.longest_short_s[q],
                "preemptions": sum(s.preemptions for s in members),
            }
        worst_deficit = max((v["quota_deficit"] for v in queues.values()), default=0.0)
        worst_raw = max((v["quota_deficit_raw"] for v in queues.values()), default=0.0)
        objective = getattr(self.sched.picker.inner, "objective", None)  # set where placement is by GPU model
        metrics = {
            "protocol": "jobs",
            "mean_jct_s": _mean(jct),
            "p95_jct_s": _pct(jct, 95),
            "p50_jct_s": _pct(jct, 50),
            "mean_queueing_delay_s": _mean(delay),
            "p95_queueing_delay_s": _pct(delay, 95),
            "makespan_s": makespan,
            "gpu_utilization": self.busy_gpu_s / capacity_gpu_s if capacity_gpu_s > 0 else math.nan,
            "jain_fairness": jain,
            "jain_fairness_capped": jain_capped,
            "preemptions": int(events["preempt"]),
            "preemptions_by_action": dict(preempt_reasons),
            "deadlocks": int(deadlocks),
            "energy_kwh": energy_kwh,
            "energy_opaque_models": self.opaque_models,
            "events": n_events,
            "events_by_kind": dict(events),
            "failure_events": n_failure_events,
            "wall_seconds": wall,
            "events_per_second": n_events / wall if wall > 0 else math.nan,
            "finished_jobs": len(done),
            "unfinished_jobs": len(unfinished),
            "job_failures": int(events["fail"]),
            "lost_gpu_hours": lost_gpu_s / 3600.0,
            "restarts": sum(s.restarts for s in sims),
            "worst_quota_deficit": worst_deficit,
            "worst_quota_deficit_raw": worst_raw,
            "longest_quota_shortfall_s": max((v["quota_shortfall_longest_s"] for v in queues.values()), default=0.0),
            "capacity_gpus": total_gpus,
            "nodes": self.state.n_nodes,
            "scheduler_stats": dict(self.sched.stats),
            "config": {"checkpoint_interval_s": cfg.checkpoint_interval_s, "restart_overhead_s": cfg.restart_overhead_s,
                       "node_mtbf_h": cfg.node_mtbf_h, "gpu_mtbf_h": cfg.gpu_mtbf_h, "repair_h": cfg.repair_h,
                       "gpu_utilization": cfg.gpu_utilization, "elastic_fraction": cfg.elastic_fraction,
                       "gpu_speed": cfg.gpu_speed,
                       **({"objective": objective} if objective else {}),  # heterogeneity-aware placement
                       **({"size_estimate_error": cfg.size_estimate_error}  # jobs carry size estimates
                          if cfg.size_estimate_error is not None else {}),
                       **({"throughput_rows": len(cfg.throughputs.rows)} if cfg.throughputs is not None else {}),
                       **({"las_work": True} if cfg.las_work else {}),
                       **({"migration": vars(cfg.migration)} if cfg.migration is not None else {})},
        }
        if cfg.migration is not None:
            metrics.update(moves=int(events["move"]), moves_to_faster=self.moves_faster,
                           move_lost_gpu_hours=self.move_lost_gpu_s / 3600.0)
        jobs = [{
            "job_id": s.rec.job_id, "queue": s.pj.queue, "num_gpu": s.rec.num_gpu, "submit": s.rec.submit_time,
            "start": s.first_start, "end": s.end,
            "jct": s.end - s.rec.submit_time if s.status == "finished" else math.nan,
            "queueing_delay": s.first_start - s.rec.submit_time, "status": s.status, "reason": s.reason,
            "preemptions": s.preemptions, "failures": s.failures, "energy_kwh": s.energy_j / JOULES_PER_KWH,
            "tier": s.tier, "lost_gpu_hours": s.lost_gpu_s / 3600.0, "nodes": list(s.nodes),
        } for s in sims]
        return JobSimResult(cfg.policy, cfg.seed, len(sims), metrics, queues, jobs, unfinished, times, alloc, fair,
                            self.leaf_names, jct)


def run_jobs(nodes: Sequence[NodeSpec], jobs: Sequence[JobRecord | JobSpec], policy: str = "gpupool", seed: int = 42,
             queues: QueueTree | None = None, config: JobSimConfig | None = None,
             progress: Callable[[int, int], None] | None = None) -> JobSimResult:
    """Simulate ``jobs`` on ``nodes`` with job-level ``policy`` (``fifo``, ``round-robin``, ``gpupool``).

    ``queues``: the queue tree (None: :func:`default_queues`); ``config``: everything else (its ``policy``
    and ``seed`` are replaced by the arguments). ``progress(done, total)`` is called as jobs end.

    Raises ValueError for a cluster without GPUs, an empty trace, or duplicate job ids; KeyError for an
    unknown policy.
    """
    cfg = replace(config or JobSimConfig(), policy=policy, seed=seed)
    job_policy(policy)
    return JobSimulator(nodes, jobs, queues, cfg).run(progress)
