"""What the node agent publishes on its Node, and what the scheduler reads back.

* **Labels** in GPU Feature Discovery's spellings (``nvidia.com/gpu.product``, ``.memory``, ``.count``,
  ``.family``, ``.compute.major`` / ``.minor``, ``nvidia.com/cuda.driver.major`` / ``.minor`` / ``.rev``,
  ``nvidia.com/cuda.driver-version.*``, ``nvidia.com/mig.strategy``, ``nvidia.com/mig-<profile>.count``,
  ``nvidia.com/gpu.clique``) plus ``gpupool.io/gpu-stack-ready``. The agent updates the labels it owns (listed
  in :data:`ANN_OWNED_LABELS`) and never touches labels others own: on a node where GFD already set a label,
  the agent leaves it.
* **Annotation** :data:`ANN_GPU_INVENTORY`: one JSON object (:func:`inventory_json`) with the per-GPU
  inventory: ``{"version": 1, "driver": str, "cudaDriver": str, "time": RFC 3339, "gpus": [{"index", "uuid",
  "minor", "product", "memoryMiB", "compute", "pciBusId", "numaNode", "mig": {"enabled", "instances":
  [{"profile", "start", "size", "uuid"}]}, "nvlinkDomain", "healthy", "reason"}]}``. The scheduler reads
  ``uuid``/``index`` and ``healthy`` (a GPU marked unhealthy is never chosen; its pods are rescheduled).
* **Conditions** ``GpuHealthy`` and ``GpuStackReady`` (:class:`Condition`), each with a CamelCase reason and a
  message a person can act on, written to the Node's status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANN_GPU_INVENTORY", "ANN_OWNED_LABELS", "COND_GPU_HEALTHY", "COND_STACK_READY", "LABEL_STACK_READY",
           "Condition", "GpuHealth", "NodeReport", "inventory_json", "read_inventory"]

ANN_GPU_INVENTORY = "gpupool.io/gpu-inventory"
ANN_OWNED_LABELS = "gpupool.io/agent-labels"  # comma-separated label keys the agent set (its to update or remove)
LABEL_STACK_READY = "gpupool.io/gpu-stack-ready"  # "true" / "false"
COND_GPU_HEALTHY = "GpuHealthy"
COND_STACK_READY = "GpuStackReady"


@dataclass(frozen=True, slots=True)
class GpuHealth:
    """One GPU's health: ``healthy``; ``reason`` CamelCase (``XidError``, ``EccUncorrectable``,
    ``RowRemapFailure``, ``FellOffTheBus``, ``ThermalThrottle``...); ``message`` for people; ``xid`` the last
    device-level XID (0 = none); ``since`` when it became what it is (seconds since the epoch)."""

    uuid: str
    healthy: bool = True
    reason: str = ""
    message: str = ""
    xid: int = 0
    since: float = 0.0


@dataclass(frozen=True, slots=True)
class Condition:
    """A Node condition as kube conventions have it: ``status`` "True"/"False"/"Unknown"."""

    type: str
    status: str
    reason: str
    message: str

    def to_api(self, now: str, previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The NodeCondition object; ``lastTransitionTime`` kept from ``previous`` while the status is unchanged."""
        keep = previous is not None and previous.get("status") == self.status
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": (previous or {}).get("lastTransitionTime") if keep else now}


@dataclass
class NodeReport:
    """Everything the agent publishes for its node at one time."""

    labels: dict[str, str] = field(default_factory=dict)
    inventory: dict[str, Any] = field(default_factory=dict)
    conditions: list[Condition] = field(default_factory=list)


def inventory_json(inventory: Mapping[str, Any]) -> str:
    """The annotation's value: compact, keys sorted (equal inventories give equal strings: no needless patch)."""
    return json.dumps(inventory, sort_keys=True, separators=(",", ":"))


def read_inventory(annotations: Mapping[str, str] | None) -> dict[str, Any] | None:
    """The inventory of a Node's annotations, or None when absent or unreadable (a scheduler ignores it then)."""
    raw = (annotations or {}).get(ANN_GPU_INVENTORY)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("gpus"), list):
        return None
    return doc
