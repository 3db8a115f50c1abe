"""Facade: moved to :mod:`gpupool.k8s.api.leader` (kept for one release)."""

from gpupool.k8s.api.leader import (  # noqa: F401
    LeaderElector,
    LeaseRecord,
)

__all__ = ["LeaderElector", "LeaseRecord"]
