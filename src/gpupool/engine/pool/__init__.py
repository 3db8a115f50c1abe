"""The pool scheduler: hierarchical queues with quotas and fair share, gangs, topology, reclaim and
preemption, elastic jobs, over the engine's cluster state. No I/O (the queue-file loader aside).

* :mod:`.queues`: queue tree, ``load_queues_yaml``; :mod:`.fairshare`: weighted DRF fair shares;
* :mod:`.ordering`: FIFO and Tiresias 2D-LAS; :mod:`.job`: the job (gang) spec;
* :mod:`.config`: :class:`PoolConfig`, the job-level policy presets and ``make_order``; :mod:`.result`:
  a cycle's :class:`CycleResult`; :mod:`.pending`: the waiting lists; :mod:`.scopes`: topology scopes;
* :mod:`.scheduler`: :class:`PoolScheduler` (books, driver calls, feasibility, fair share, the cycle);
  :mod:`.actions`: allocate, backfill, reservation, reclaim, preempt, consolidate, elastic (mixins of
  :class:`PoolScheduler`); :mod:`.victims`: victim selection; :mod:`.placement`: node scoping of the
  engine's picks.
"""

from gpupool.engine.pool.config import DEFAULT_JOB_POLICIES, JOB_POLICIES, PoolConfig, job_policy
from gpupool.engine.pool.job import NONPREEMPTIBLE_PRIORITY, PoolJob, split_gpus
from gpupool.engine.pool.queues import QueueConfigError, QueueSpec, QueueTree, load_queues_yaml
from gpupool.engine.pool.result import CycleResult
from gpupool.engine.pool.scheduler import PoolScheduler

__all__ = [
    "DEFAULT_JOB_POLICIES",
    "JOB_POLICIES",
    "NONPREEMPTIBLE_PRIORITY",
    "CycleResult",
    "PoolConfig",
    "PoolJob",
    "PoolScheduler",
    "QueueConfigError",
    "QueueSpec",
    "QueueTree",
    "job_policy",
    "load_queues_yaml",
    "split_gpus",
]
