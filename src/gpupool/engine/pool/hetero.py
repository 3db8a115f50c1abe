"""Heterogeneity-aware job placement: put each job on the GPU model where it gets the most out of the
cluster, with completion time and energy as the two objectives (after Gavel, Narayanan et al., OSDI'20,
"Heterogeneity-Aware Cluster Scheduling Policies for Deep Learning Workloads").

Gavel places each job on the accelerator type that gives it the most throughput (per job type, from a
throughput matrix). The job traces here carry no job type, so every job shares one row of that matrix: the
catalog's ``relative_throughput`` of each model (:mod:`gpupool.catalog`; datasheet FP16 tensor peak
ratios), as the job simulator's ``gpu_speed="catalog"`` uses it. A ``speeds`` row per job class can be
given where a trace has classes (:func:`model_cost`'s arguments are per node, so a caller can pass the
row of the job's class).

Per GPU model, with ``s`` its speed (reference model = 1), ``P`` its busy and ``I`` its idle power (W)
(:func:`gpupool.energy.power_figures`), the cost of one unit of reference work placed there is

* ``jct``: ``1 / s`` (time: Gavel's max-throughput placement);
* ``energy``: ``(P - I) / s`` (the marginal energy: a GPU draws ``I`` whether or not it runs the job,
  so only the busy draw above idle is the job's doing; J per reference-second);
* ``balanced``: ``(P - I) / s**2``, the energy-delay product per unit of work (energy x time, the
  usual single figure that weighs both, Gonzalez and Horowitz, IEEE JSSC 1996).

On ``examples/clusters/mixed-models.yaml`` the orders are: jct H100 > L40S > A100 > V100 > L4 > T4;
energy L4 > H100 > L40S > T4 > A100 > V100; balanced H100 > L40S > A100 > L4 > T4 > V100.

:class:`HeteroPolicy` wraps a placement policy: among the feasible nodes the scheduler allows (its
topology scope included), it keeps those of the cheapest model and lets the inner policy choose among
them (fragmentation, tie-break). The first pod of a gang picks the model; the rest of the gang follows
its node, NVLink domain or switch (:meth:`PoolScheduler._place`), so a gang lands on one model where one
can hold it (a gang runs at its slowest GPU). The scheduler's topology scope for the first pod only
contains nodes whose switch / domain can hold the whole gang, so the model chosen can.

The policy is only worth wrapping where models differ in speed: :func:`heterogeneous` says when. With one
model (or ``gpu_speed="none"``) every node has the same cost and the wrapper would pick as the inner
policy does; the simulator does not wrap then, so homogeneous outcomes stay bit-identical. It is opt-in
(``JobSimConfig.objective``, ``--objective``): without one, placement stays speed-blind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest
from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.placement import DelegatingPolicy, Vetoed
from gpupool.model import PodRequest

__all__ = ["OBJECTIVES", "HeteroPolicy", "heterogeneous", "model_cost"]

OBJECTIVES = ("jct", "energy", "balanced")
"""What heterogeneity-aware placement minimizes per unit of work: time, marginal energy, or their product."""


def model_cost(objective: str, speed: Sequence[float] | np.ndarray, busy_w: Sequence[float] | np.ndarray,
               idle_w: Sequence[float] | np.ndarray) -> np.ndarray:
    """(n,) float64 cost of one unit of reference work on each of ``n`` nodes (lower is better).

    ``speed``: relative throughput of the node's GPU model (reference = 1, > 0 where the node has GPUs);
    ``busy_w`` / ``idle_w``: one GPU's power (W) busy and idle. Nodes with speed <= 0 (no GPU, unknown
    model) cost +inf. Raises ValueError for an unknown objective or arrays of different lengths.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    s = np.asarray(speed, dtype=np.float64)
    busy = np.asarray(busy_w, dtype=np.float64)
    idle = np.asarray(idle_w, dtype=np.float64)
    if not (s.shape == busy.shape == idle.shape):
        raise ValueError(f"speed, busy_w and idle_w differ in length: {s.shape}, {busy.shape}, {idle.shape}")
    with np.errstate(divide="ignore", invalid="ignore"):
        if objective == "jct":
            cost = 1.0 / s
        elif objective == "energy":
            cost = np.maximum(busy - idle, 0.0) / s
        else:
            cost = np.maximum(busy - idle, 0.0) / (s * s)
    return np.where(s > 0, cost, np.inf)


def _ranks(cost: Sequence[float] | np.ndarray) -> np.ndarray:
    """(n,) int64 rank of each node's cost: 0 for the cheapest distinct cost (rounded to 6 decimals), ...;
    +inf costs last."""
    c = np.round(np.asarray(cost, dtype=np.float64), 6)
    finite = np.isfinite(c)
    levels = np.unique(c[finite])
    rank = np.full(len(c), len(levels), dtype=np.int64)
    rank[finite] = np.searchsorted(levels, c[finite])
    return rank


def heterogeneous(speed: Sequence[float] | np.ndarray, gpu_count: Sequence[int] | np.ndarray) -> bool:
    """True when the GPU nodes (``gpu_count > 0``) do not all have the same speed."""
    s = np.asarray(speed, dtype=np.float64)[np.asarray(gpu_count) > 0]
    return bool(len(s) and s.min() != s.max())


class HeteroPolicy(DelegatingPolicy):
    """Wraps ``inner``: each pick is restricted to the feasible candidates of the lowest ``cost``
    ((n_nodes,) float64, e.g. :func:`model_cost`); the inner policy scores and chooses among them.

    Gangs (:meth:`begin_gang`, called by the pool scheduler before it places a job): a gang runs at its
    slowest GPU, so its pods go to one model where one can hold the whole gang now (the cheapest such
    model); where none can, to the fastest *set* of models that can (every node of speed >= v, for the
    largest such v), slowest of that set first, so that no faster GPU is spent on a gang that runs at
    ``v`` anyway. ``speed``: (n_nodes,) relative speed per node (needed for gangs; None: cost only).

    Costs are compared after rounding to 6 decimals, so nodes of one model always tie. Everything but
    :meth:`pick` is the inner policy's (filters, scores and their caches stay valid).
    """

    def __init__(self, inner: Policy, cost: np.ndarray, objective: str = "",
                 speed: np.ndarray | None = None, mixed_after_s: float = 3600.0) -> None:
        super().__init__(inner)
        self.objective = objective
        rank = _ranks(cost)
        self.rank = rank
        self.speed = None if speed is None else np.asarray(speed, dtype=np.float64)
        self._base = (self.rank, self.speed)
        self._classes: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # job class -> (rank, speed) per node
        self.job_class: Callable[[PoolJob], str] | None = None
        self._by_class = False  # the plan in force is a job class's: its +inf nodes (cannot run there) are vetoed
        self._gang = ""  # the job whose pods the plan below is for
        self._order: np.ndarray | None = None  # (n_nodes,) key to minimize for that gang's pods
        self.plans = {"single-model": 0, "mixed": 0, "waited": 0}
        self._veto = False
        self.mixed_after_s = mixed_after_s

    def set_job_classes(self, job_class: Callable[[PoolJob], str],
                        classes: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """Per-job-class costs (Gavel's throughput matrix, one row per job type): ``job_class(job)`` names a
        job's class (``""`` or a class not in ``classes``: the policy's own cost and speed); ``classes[c]`` =
        ``(cost, speed)``, (n_nodes,) float64 each, the class's cost of a unit of reference work and its speed
        on each node. A node of +inf cost (speed 0: the class cannot run on that model) is never picked for a
        job of that class: :meth:`pick` raises :class:`Vetoed` when only such nodes are feasible."""
        self.job_class = job_class
        self._classes = {c: (_ranks(cost), np.asarray(speed, dtype=np.float64)) for c, (cost, speed) in classes.items()}

    @property
    def per_job(self) -> bool:
        """Whether the nodes a job may use depend on more than its shape (job classes are set): the scheduler
        then does not infer one job's failure to place from another's of the same shape."""
        return self.job_class is not None

    def usable_nodes(self, job: PoolJob) -> np.ndarray | None:
        """(n_nodes,) bool: the nodes whose GPU model ``job``'s class can run on (speed > 0); None: every node
        (no classes, or a job without one). The scheduler reserves only these for it."""
        if self.job_class is None:
            return None
        plan = self._classes.get(self.job_class(job))
        return None if plan is None else plan[1] > 0

    def begin_gang(self, job: PoolJob, pods: int, fits: Callable[[], np.ndarray], now: float,
                   capacity: Callable[[], np.ndarray] | None = None) -> None:
        """Plan where the ``pods`` pods of ``job`` go; ``fits()``: (n_nodes,) int pods of the job each
        node could take now (the scheduler's ``_fits_per_node``); ``now``: the scheduler's clock (s);
        ``capacity()``: (n_nodes,) int pods of the job each node could hold empty (None: unknown). One pod
        needs no plan (the cost decides). A wait for one model happens only while one model could hold the
        gang but is busy, so some running job ends (an event, a new plan) before or after it: no wake-up of its
        own (the wait ends at the first cycle after ``mixed_after_s``)."""
        self._gang, self._order, self._veto = job.name, None, False
        if self.job_class is not None:
            plan = self._classes.get(self.job_class(job))
            self._by_class = plan is not None
            self.rank, self.speed = plan if plan is not None else self._base
        if pods <= 1 or self.speed is None:
            return
        f = fits()
        if int(f.sum()) < pods:
            return
        ranks = np.unique(self.rank[f > 0])
        for r in ranks.tolist():  # cheapest model that holds the gang alone
            if self._by_class and not (self.speed[self.rank == r] > 0).any():
                continue  # a model the job's class cannot run on
            if int(f[self.rank == r].sum()) >= pods:
                self._order = np.where(self.rank == r, 0, 1 + self.rank)
                self.plans["single-model"] += 1
                return
        # wait for one model rather than run at the slowest, unless no model could ever hold the gang alone
        # (then the wait is for nothing, and on an idle cluster nothing would end it)
        if now - job.submit_time < self.mixed_after_s and (capacity is None or self._one_model_could(capacity(),
                                                                                                     pods)):
            self._veto = True
            self.plans["waited"] += 1
            return
        for v in np.unique(self.speed[f > 0])[::-1].tolist():  # fastest bottleneck speed that holds it
            if v <= 0:  # a model the job's class cannot run on
                break
            ok = self.speed >= v
            if int(f[ok].sum()) >= pods:  # slowest of the allowed models first; the rest after
                self._order = np.where(ok, self.speed, np.inf)
                self.plans["mixed"] += 1
                return

    def _one_model_could(self, cap: np.ndarray, pods: int) -> bool:
        """Whether the nodes of one cost rank (one GPU model) could hold ``pods`` pods, emptied (``cap``)."""
        ok = self.speed > 0 if self._by_class and self.speed is not None else np.ones(len(cap), dtype=bool)
        return any(int(cap[(self.rank == r) & ok].sum()) >= pods for r in np.unique(self.rank[ok]).tolist())

    def effective(self, req: PodRequest) -> EffectiveRequest:
        if self._order is not None and req.name.rpartition("/")[0] != self._gang:
            self._gang, self._order, self._veto = "", None, False  # a pod of another job: the gang's plan is over
        return self.inner.effective(req)

    def pick(self, state: ClusterState, candidates: np.ndarray, scores: np.ndarray,
             rng: np.random.Generator) -> int:
        if self._veto:
            raise Vetoed
        if self._by_class and self.speed is not None:
            runs = self.speed[candidates] > 0
            if not runs.any():
                raise Vetoed  # only models the job's class cannot run on
            if not runs.all():
                candidates, scores = candidates[runs], scores[runs]
        key = self.rank[candidates] if self._order is None else self._order[candidates]
        keep = key == key.min()
        if not keep.all():
            candidates, scores = candidates[keep], scores[keep]
        return self.inner.pick(state, candidates, scores, rng)
