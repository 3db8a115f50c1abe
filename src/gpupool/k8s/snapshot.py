"""Facade for one release: the snapshot file format moved to :mod:`gpupool.k8s.objects.snapshots`, queue books to
:mod:`gpupool.k8s.cache.queues`, the plan to :mod:`gpupool.k8s.cycle.plan`, units to :mod:`gpupool.k8s.cycle.units`
and :func:`plan` (the dry run) to :mod:`gpupool.k8s.cycle.planner`."""

from gpupool.k8s.cache.queues import QueueBook, queue_book
from gpupool.k8s.cache.queues import gpus as _gpus  # noqa: F401 - gpupool.k8s.pool imports it by this name
from gpupool.k8s.cycle.plan import Placement, Plan, Preemption, format_plan
from gpupool.k8s.cycle.planner import plan
from gpupool.k8s.cycle.units import Unit as _Unit  # noqa: F401 - gpupool.k8s.pool reads snapshot._Unit
from gpupool.k8s.cycle.units import place_unit as _place_unit  # noqa: F401 - and snapshot._place_unit
from gpupool.k8s.cycle.units import success_reason as _success_reason  # noqa: F401 - and snapshot._success_reason
from gpupool.k8s.cycle.units import unsupported_constraint
from gpupool.k8s.objects.snapshots import ClusterSnapshot, SnapshotError, load_snapshot, snapshot_from_objects

__all__ = ["ClusterSnapshot", "SnapshotError", "Placement", "Plan", "Preemption", "QueueBook", "load_snapshot",
           "snapshot_from_objects", "plan", "format_plan", "queue_book", "unsupported_constraint"]
