"""Facade: moved to :mod:`gpupool.k8s.api.events` (kept for one release)."""

from gpupool.k8s.api.events import (  # noqa: F401
    EventRecorder,
    object_reference,
)

__all__ = ["EventRecorder", "object_reference"]
