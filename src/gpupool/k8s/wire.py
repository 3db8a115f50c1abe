"""Facade: moved to :mod:`gpupool.k8s.api.wire` (kept for one release)."""

from gpupool.k8s.api.wire import (  # noqa: F401
    JSON,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    Outage,
    call,
    configure,
    drain,
    ensure_pool,
    pool_maxsize,
    quiet_urllib3_retries,
)

__all__ = ["call", "drain", "configure", "ensure_pool", "pool_maxsize", "quiet_urllib3_retries", "Outage",
           "JSON", "MERGE_PATCH", "STRATEGIC_PATCH"]
