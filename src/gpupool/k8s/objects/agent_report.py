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
* **Annotation** :data:`ANN_POD_DEVICES`: where the kubelet put each pod's whole GPUs, read from the kubelet's
  PodResources API (``v1.PodResourcesLister/List`` on ``/var/lib/kubelet/pod-resources/kubelet.sock``; the NVIDIA
  device plugin's ``nvidia.com/gpu`` device IDs, GPU UUIDs or ``UUID::replica`` under time-slicing, resolved to the
  GPU's UUID by the agent): ``{"version": 1, "time": RFC 3339, "resource": "nvidia.com/gpu", "pods":
  {"namespace/name": ["GPU-...", ...]}, "truncated": int}`` (:func:`pod_devices_doc`). One UUID per device the
  kubelet gave (a GPU twice when a pod holds two replicas of it); only pods holding such devices are listed; at
  most :data:`MAX_POD_ENTRIES` pods and :data:`MAX_POD_DEVICES_BYTES` bytes (``truncated``: how many pods were left
  out, 0 when none). Absent when the agent has no map (no socket): the scheduler then reads nothing from it.
  Readers ignore keys they do not know; a change of shape gets a new annotation name, not a new ``version``.
* **Conditions** ``GpuHealthy`` and ``GpuStackReady`` (:class:`Condition`), each with a CamelCase reason and a
  message a person can act on, written to the Node's status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ANN_GPU_INVENTORY", "ANN_OWNED_LABELS", "ANN_POD_DEVICES", "COND_GPU_HEALTHY", "COND_STACK_READY",
           "LABEL_STACK_READY", "MAX_POD_DEVICES_BYTES", "MAX_POD_ENTRIES", "POD_DEVICES_RESOURCE", "Condition",
           "GpuHealth", "NodeReport", "inventory_json", "pod_devices_doc", "read_inventory", "read_pod_devices"]

ANN_GPU_INVENTORY = "gpupool.io/gpu-inventory"
ANN_OWNED_LABELS = "gpupool.io/agent-labels"  # comma-separated label keys the agent set (its to update or remove)
ANN_POD_DEVICES = "gpupool.io/pod-devices"  # pod -> GPU UUIDs, as the kubelet's PodResources API reports them
POD_DEVICES_RESOURCE = "nvidia.com/gpu"  # the device plugin's resource whose devices the map names
MAX_POD_ENTRIES = 512  # pods per map: a node runs at most a few hundred (110 by default)
MAX_POD_DEVICES_BYTES = 64 * 1024  # the annotation's JSON; all of a Node's annotations share 256 KiB
MAX_DEVICES_PER_POD = 256  # device IDs per pod kept (16 GPUs x 16 replicas)
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
    pod_devices: dict[str, Any] | None = None  # :func:`pod_devices_doc`; None: no map (the annotation is removed)


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


def pod_devices_doc(pods: Mapping[str, Sequence[str]], now: str) -> dict[str, Any]:
    """The :data:`ANN_POD_DEVICES` document of ``pods`` (``namespace/name`` -> GPU UUIDs, one per device the
    kubelet gave) at ``now`` (RFC 3339). Pods are kept in name order up to :data:`MAX_POD_ENTRIES` entries and
    :data:`MAX_POD_DEVICES_BYTES` bytes of JSON; a pod with more than :data:`MAX_DEVICES_PER_POD` devices is left
    out whole (a partial list would book too few GPUs). ``truncated`` counts the pods left out: the scheduler
    treats those as not yet reported."""
    kept: dict[str, list[str]] = {}
    size = len(inventory_json({"version": 1, "time": now, "resource": POD_DEVICES_RESOURCE, "pods": {},
                               "truncated": 999_999}))
    left = 0
    for key in sorted(pods):
        ids = [str(u) for u in pods[key]]
        entry = len(json.dumps({key: ids}, separators=(",", ":"))) - 1  # '"key":[...]' plus a comma
        if len(ids) > MAX_DEVICES_PER_POD or len(kept) >= MAX_POD_ENTRIES or size + entry > MAX_POD_DEVICES_BYTES:
            left += 1
            continue
        kept[key] = ids
        size += entry
    return {"version": 1, "time": now, "resource": POD_DEVICES_RESOURCE, "pods": kept, "truncated": left}


def read_pod_devices(annotations: Mapping[str, str] | None) -> dict[str, tuple[str, ...]] | None:
    """``namespace/name`` -> GPU UUIDs from a Node's :data:`ANN_POD_DEVICES`, or None when the annotation is
    absent, unreadable, of another resource or not version 1 or later (the scheduler then knows nothing from
    the kubelet). An entry that is not a list of strings is left out (that pod counts as not reported)."""
    raw = (annotations or {}).get(ANN_POD_DEVICES)
    if not raw or len(raw) > 2 * MAX_POD_DEVICES_BYTES:
        return None
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("pods"), dict):
        return None
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        return None
    if doc.get("resource", POD_DEVICES_RESOURCE) != POD_DEVICES_RESOURCE:
        return None
    out: dict[str, tuple[str, ...]] = {}
    for key, ids in doc["pods"].items():
        if isinstance(key, str) and "/" in key and isinstance(ids, list) and ids \
                and all(isinstance(u, str) and u for u in ids):
            out[key] = tuple(ids)
    return out
