"""Facade: moved to :mod:`gpupool.k8s.objects.agent_report` (kept for one release)."""

from gpupool.k8s.objects.agent_report import (  # noqa: F401
    ANN_GPU_INVENTORY,
    ANN_OWNED_LABELS,
    COND_GPU_HEALTHY,
    COND_STACK_READY,
    LABEL_STACK_READY,
    Condition,
    GpuHealth,
    NodeReport,
    inventory_json,
    read_inventory,
)

__all__ = ["ANN_GPU_INVENTORY", "ANN_OWNED_LABELS", "COND_GPU_HEALTHY", "COND_STACK_READY",
           "LABEL_STACK_READY", "Condition", "GpuHealth", "NodeReport", "inventory_json", "read_inventory"]
