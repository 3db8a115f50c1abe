"""Facade: moved to :mod:`gpupool.k8s.api.status` (kept for one release)."""

from gpupool.k8s.api.status import (  # noqa: F401
    OWNED_FIELDS,
    STATUS_PATHS,
    StatusWriter,
    pod_group_statuses,
    queue_statuses,
    scheduler_plugins_phase,
    volcano_phase,
)

__all__ = ["StatusWriter", "queue_statuses", "pod_group_statuses", "scheduler_plugins_phase",
           "volcano_phase", "OWNED_FIELDS", "STATUS_PATHS"]
