"""What the pool scheduler does: :class:`PoolConfig`, the named job-level presets (:data:`JOB_POLICIES`) and
the job order factory :func:`make_order`. Imports the job orders (ordering, gittins) only."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpupool.engine.pool.gittins import DEFAULT_DELTA, GittinsOrder
from gpupool.engine.pool.ordering import DEFAULT_THRESHOLDS, ORDERS, SIZE_ORDERS, FifoOrder, TiresiasOrder

__all__ = ["DEFAULT_JOB_POLICIES", "JOB_POLICIES", "PoolConfig", "job_policy", "make_order"]


@dataclass(frozen=True)
class PoolConfig:
    """What the scheduler does; :data:`JOB_POLICIES` holds the named presets.

    * ``order``: ``"fifo"`` or ``"tiresias"`` (job order within a queue); ``thresholds``: Tiresias
      levels (GPU-seconds).
    * ``fair_share``: order queues by fair share (else one global order over every queue's jobs).
    * ``backfill``: later jobs may start when an earlier one is blocked (False: strict FIFO).
    * ``reserve_after_s``: wait (s) after which a blocked job gets a reservation (None: never).
    * ``reclaim``, ``preempt``, ``elastic``, ``topology_aware``, ``consolidate``: turn the actions on.
    * ``max_attempts``: reclaim / preempt attempts per queue per cycle (bounds the work of a cycle).
    * ``min_run_s``: a job that has run less than this since it (re)started is not a victim (KAI's
      minimum runtime protection; keeps preemption from thrashing); ``reclaim_min_run_s``: the same for
      victims of a reclaim across queues (KAI sets the two apart too).
    * ``fair_share_refresh_s``: fair shares are recomputed when demand changes, at most once per this
      many seconds (0: at every change), and at once when a queue's demand appears or vanishes. A stale
      share is off by the jobs that arrived or ended since, which moves queue order and reclaim by at
      most that much; it bounds the cost of a cycle on long traces.
    * ``restart_evicted``: a job evicted in a cycle may start again in the same cycle (elsewhere). A driver
      whose evictions take time (Kubernetes: the pods are deleted and re-created) turns it off.
    * ``promote_knob``: Tiresias' starvation knob (a waiting job goes back to level 0 after waiting this
      many times its run time; None: never).
    * ``order="gittins"`` / ``"remaining"`` (:mod:`gpupool.engine.pool.gittins`): ``gittins_delta``, the
      index's quantum (GPU-seconds); ``size_prior``, job sizes (GPU-seconds) known before the run;
      ``size_min_samples``, finished jobs a queue needs before its own size distribution is used;
      ``size_by_gpus``: learn sizes per (queue, GPU count) too (used once it has ``size_min_samples``);
      ``size_dims``: 2 (a size is GPU-seconds, Tiresias' 2D) or 1 (seconds of run time); ``aging``: expected
      service (s, or GPU-s in 2D per GPU) a job gains per second it waits (0: none; see ``_score``);
      ``scored_levels``: only the first this many levels are ordered by score, the others stay FIFO as
      in Tiresias-L (None: every level); ``victims_by_score``: evict the running jobs of worst score first
      (else, within a level, the latest submitted first, as Tiresias-L).
    * ``nonpreemptible_priority``: jobs at or above this priority are never evicted (KAI: 100, its ``build`` and
      ``inference`` classes) and start only within the quota of every queue on their path that has one (quota
      above 0); in a queue without a quota (the default queue) they take free capacity like any job, so a
      cluster whose PriorityClasses are 1000 or ``system-cluster-critical`` runs them. None: every job is
      preemptible.
    * ``max_preemptions``: a job evicted this many times (preempt, reclaim or consolidate) is no victim any
      more (None: no bound); ``protect_after_s``: nor is a job that has run this many seconds in all (it
      finishes undisturbed; None: no bound); with ``min_run_s`` they bound how often and how soon a job is
      preempted.
    """

    order: str = "tiresias"
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    fair_share: bool = True
    backfill: bool = True
    reserve_after_s: float | None = 3600.0
    reclaim: bool = True
    preempt: bool = True
    elastic: bool = True
    topology_aware: bool = True
    consolidate: bool = True
    max_attempts: int = 2
    min_run_s: float = 600.0
    reclaim_min_run_s: float = 600.0
    fair_share_refresh_s: float = 60.0
    restart_evicted: bool = True
    promote_knob: float | None = 8.0
    gittins_delta: float = DEFAULT_DELTA
    size_prior: tuple[float, ...] = ()
    size_min_samples: int = 50
    size_by_gpus: bool = False
    size_dims: int = 2
    aging: float = 0.0
    max_preemptions: int | None = None
    protect_after_s: float | None = None
    scored_levels: int | None = None
    victims_by_score: bool = True
    nonpreemptible_priority: int | None = 100


JOB_POLICIES: dict[str, tuple[str, PoolConfig, str]] = {
    "fifo": ("gpupool", PoolConfig(order="fifo", fair_share=False, backfill=False, reserve_after_s=None,
                                   reclaim=False, preempt=False, elastic=False, topology_aware=False,
                                   consolidate=False),
             "baseline: one FIFO over all jobs, head-of-line blocking (no backfill), no preemption"),
    "round-robin": ("round-robin", PoolConfig(order="fifo", fair_share=False, backfill=False,
                                              reserve_after_s=None, reclaim=False, preempt=False,
                                              elastic=False, topology_aware=False, consolidate=False),
                    "baseline: FIFO as `fifo`, pods placed round-robin over the nodes"),
    "gpupool": ("gpupool", PoolConfig(),
                "default: Tiresias 2D-LAS + DRF fair share + gang reservation/backfill + reclaim + "
                "topology-aware gpupool placement"),
    "gittins": ("gpupool", PoolConfig(order="gittins", promote_knob=1.0),
                "gpupool with Tiresias-G's job order: Gittins index within the 2D-LAS levels, job sizes "
                "learned online from finished jobs; a job that waited as long as it ran goes back to level 0"),
    "lowest-power": ("lowest-power", PoolConfig(),
                     "gpupool's scheduling, pods on the lowest-power GPU model first (energy vs JCT studies)"),
}
"""Job-level policies: name -> (placement policy, scheduler config, description)."""

DEFAULT_JOB_POLICIES = ("fifo", "round-robin", "gpupool")
"""What ``gpupool compare --jobs`` compares when no ``--policies`` is given."""


def job_policy(name: str) -> tuple[str, PoolConfig]:
    """(placement policy name, config) of a job-level policy; KeyError listing the known names."""
    try:
        placement, config, _ = JOB_POLICIES[name]
    except KeyError:
        raise KeyError(f"unknown job policy {name!r}; known: {', '.join(JOB_POLICIES)}") from None
    return placement, config


def make_order(name: str, thresholds: Sequence[float] | None = None, promote_knob: float | None = 8.0,
               **options: object) -> FifoOrder | TiresiasOrder:
    """``"fifo"``, ``"tiresias"`` (alias ``"las"``), or ``"gittins"`` / ``"remaining"`` (Tiresias levels,
    within a level by Gittins index or shortest expected remaining service:
    :class:`gpupool.engine.pool.gittins.GittinsOrder`, which takes ``options``: ``delta``, ``model``).
    ``promote_knob``: Tiresias' starvation knob (None: no promotion). ValueError for an unknown name."""
    if name == "fifo":
        return FifoOrder()
    t = thresholds if thresholds is not None else DEFAULT_THRESHOLDS
    if name in ("tiresias", "las"):
        return TiresiasOrder(t, promote_knob)
    if name in SIZE_ORDERS:
        return GittinsOrder(t, promote_knob, metric=name, **options)  # type: ignore[arg-type]
    raise ValueError(f"unknown job order {name!r} (known: {', '.join(ORDERS)})")
