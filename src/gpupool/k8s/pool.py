"""Facade (for one release): pool mode moved to :mod:`gpupool.k8s.cycle.pool` (the driver) and
:mod:`gpupool.k8s.objects.jobs` (what it reads from Kubernetes objects)."""

from gpupool.k8s.cycle.pool import DEFAULT_QUEUE, EVICTED_BOOKS_S, PoolDriver, live_config  # noqa: F401
from gpupool.k8s.objects.jobs import (  # noqa: F401
    ANN_KUEUE_PREFERRED,
    ANN_KUEUE_REQUIRED,
    ANN_MAX_MEMBER,
    ANN_TOPOLOGY,
    ANN_TOPOLOGY_TIER,
    LABEL_KUEUE_MAX_EXEC,
    is_whole_gpu,
    job_identity,
    job_topology,
    max_member,
    run_time_limit,
)

__all__ = ["ANN_KUEUE_PREFERRED", "ANN_KUEUE_REQUIRED", "ANN_MAX_MEMBER", "ANN_TOPOLOGY", "ANN_TOPOLOGY_TIER",
           "DEFAULT_QUEUE", "EVICTED_BOOKS_S", "LABEL_KUEUE_MAX_EXEC", "PoolDriver", "is_whole_gpu", "job_identity",
           "job_topology", "live_config", "max_member", "run_time_limit"]
