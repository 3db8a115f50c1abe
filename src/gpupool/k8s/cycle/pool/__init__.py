"""Pool mode of the live scheduler: :class:`PoolDriver` runs the pool scheduler over the cluster cache
(:mod:`.driver` and its mixins). Imports engine.pool, k8s.objects and k8s.snapshot; no I/O."""

from gpupool.k8s.cycle.pool.driver import DEFAULT_QUEUE, PoolDriver, live_config
from gpupool.k8s.cycle.pool.records import EVICTED_BOOKS_S

__all__ = ["DEFAULT_QUEUE", "EVICTED_BOOKS_S", "PoolDriver", "live_config"]
