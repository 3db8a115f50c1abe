"""What HAMi's device plugin reads on a pod to hand over the GPUs its scheduler chose, written by gpupool instead.

HAMi (github.com/Project-HAMi/HAMi, release v2.9.0, read at commit 3a006c6) splits the work in two: its scheduler
extender picks the devices and writes them on the pod; its device plugin, called by the kubelet for a container
asking ``nvidia.com/gpu``, reads them back, hands over exactly those GPUs and sets the memory and SM caps that
its in-container library (HAMi-core) enforces. With ``--share-enforcement hami`` gpupool takes the scheduler's
part. The contract, from HAMi's source:

* ``pkg/scheduler/scheduler.go`` ``Filter``: ``hami.io/vgpu-node`` (the node), ``hami.io/vgpu-time`` (Unix
  seconds) and, through ``pkg/device/nvidia/device.go`` ``PatchAnnotations``, the same device string under
  ``hami.io/vgpu-devices-to-allocate`` (consumed by the plugin, one container at a time) and
  ``hami.io/vgpu-devices-allocated`` (kept: what the pod holds);
* ``Bind``: ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time`` (Unix seconds), and the node lock
  ``hami.io/mutex.lock`` on the Node (``pkg/util/nodelock/nodelock.go``: ``RFC3339,namespace,name``), which
  tells the plugin which pod the kubelet is admitting (``pkg/util/util.go`` ``GetPendingPod``) and which the
  plugin releases once the pod's containers are served (``bind-phase`` then ``success`` or ``failed``);
* the device string (``pkg/device/devices.go`` ``EncodePodSingleDevice`` / ``EncodeContainerDevices``): one entry
  per container, init containers first and then the app containers (``Resourcereqs``; the plugin maps entry i
  back to a container the same way, ``GetNextDeviceRequest``), each entry ending with ``;``; an entry is
  ``UUID,NVIDIA,usedmem,usedcores:`` per device (MiB, percent of the SMs), empty for a container without GPUs.
  Examples from HAMi's tests: ``GPU-abc123,NVIDIA,1000,30:;`` (one container), ``GPU-init1,NVIDIA,500,10:;;``
  (an init container with a GPU, an app container without), ``;;GPU-main1,NVIDIA,2000,50:;``.

A container's ask is read as ``pkg/device/nvidia/device.go`` ``GenerateResourceRequests`` and ``fitInDevices``
read it: ``nvidia.com/gpu`` cards, each with ``nvidia.com/gpumem`` MiB, else ``nvidia.com/gpumem-percentage`` of
the card's registered memory, else all of it (HAMi's chart sets ``defaultMemory: 0``: 100 %); cores
``nvidia.com/gpucores`` (chart ``defaultCores: 0``: no SM cap), at most 100. HAMi's ``memoryFactor`` scaling is
not applied (its chart leaves it at 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gpupool.k8s import (
    ANN_HAMI_BIND_PHASE,
    ANN_HAMI_BIND_TIME,
    ANN_HAMI_DEVICES_ALLOCATED,
    ANN_HAMI_DEVICES_TO_ALLOCATE,
    ANN_HAMI_NODE,
    ANN_HAMI_TIME,
    RES_GPU,
    RES_HAMI_GPUCORES,
    RES_HAMI_GPUMEM,
    RES_HAMI_GPUMEM_PERCENT,
)
from gpupool.k8s.objects.fields import RequestParseError, container_requests, expect_list, expect_mapping, whole
from gpupool.k8s.objects.nodes import RegisteredGpu

HAMI_DEVICE_TYPE = "NVIDIA"
"""The device type HAMi writes in each device entry for NVIDIA GPUs (``nvidia.NvidiaGPUDevice``)."""
HAMI_LOCK_SEP = ","
HAMI_LOCK_EXPIRE_S = 300.0
"""HAMi's node lock expires after 5 minutes (``nodelock.NodeLockTimeout``; ``HAMI_NODELOCK_EXPIRE``)."""


@dataclass(frozen=True, slots=True)
class HamiContainerAsk:
    """One container's ask as HAMi reads it: ``count`` cards, each with ``memory_mib`` MiB (0: use
    ``memory_percent`` of the card), ``cores`` percent of its SMs (0: no cap). ``init``: an init container that
    runs before the app containers (a sidecar, ``restartPolicy: Always``, runs beside them: ``init`` False)."""

    count: int = 0
    memory_mib: int = 0
    memory_percent: int = 100
    cores: int = 0
    init: bool = False


def hami_container_asks(pod: Mapping[str, Any]) -> list[HamiContainerAsk]:
    """Every container's ask in HAMi's order (``spec.initContainers`` then ``spec.containers``); a container
    without ``nvidia.com/gpu`` asks ``count`` 0. Raises :class:`RequestParseError` naming the field."""
    spec = expect_mapping(pod.get("spec"), "spec")
    out: list[HamiContainerAsk] = []
    for kind in ("initContainers", "containers"):
        for i, c in enumerate(expect_list(spec.get(kind), f"spec.{kind}")):
            where = f"spec.{kind}[{i}]"
            res: dict[str, Decimal] = container_requests(c, where)
            init = kind == "initContainers" and c.get("restartPolicy") != "Always"
            if RES_GPU not in res:
                out.append(HamiContainerAsk(init=init))
                continue
            def num(key: str, default: int) -> int:
                return whole(res[key], f'{where}.resources["{key}"]') if key in res else default  # noqa: B023

            n, mem, pct, cores = (num(RES_GPU, 0), num(RES_HAMI_GPUMEM, 0), num(RES_HAMI_GPUMEM_PERCENT, 100),
                                  num(RES_HAMI_GPUCORES, 0))
            out.append(HamiContainerAsk(n, mem, pct, min(cores, 100), init))
    return out


def encode_pod_devices(containers: Sequence[Sequence[tuple[str, int, int]]]) -> str:
    """HAMi's device string: per container (HAMi's order) its devices ``(uuid, usedmem MiB, usedcores %)``, as
    ``EncodePodSingleDevice`` writes it (every entry, empty ones too, followed by ``;``)."""
    return "".join("".join(f"{u},{HAMI_DEVICE_TYPE},{mem},{cores}:" for u, mem, cores in devs) + ";"
                   for devs in containers)


def hami_devices_for(pod: Mapping[str, Any], gpus: Sequence[int], registered: Sequence[RegisteredGpu]) -> str:
    """The device string for ``pod`` placed on the devices ``gpus`` of a node with HAMi's registration
    ``registered`` (gpupool's device ``i`` is the ``i``-th healthy registered GPU, as
    :func:`~gpupool.k8s.objects.nodes.node_spec_from_node` counts them; each card's memory from there); "" when no
    container asks ``nvidia.com/gpu`` (HAMi's plugin is then never called for the pod).

    App containers and sidecars take consecutive cards of ``gpus`` in order (they run together, each on its own
    cards, as gpupool booked them); an init container takes the first cards (it runs before them). Raises
    :class:`ValueError` when the placement holds fewer cards than the containers ask or a card has no UUID
    or registration (the pod must then not be bound through HAMi)."""
    asks = hami_container_asks(pod)
    if not any(a.count for a in asks):
        return ""
    ids = [g.uuid for g in registered if g.healthy]
    memory = {g.uuid: g.memory_mib for g in registered}
    beside = sum(a.count for a in asks if not a.init)
    before = max((a.count for a in asks if a.init), default=0)
    if max(beside, before) > len(gpus):
        raise ValueError(f"the containers ask {max(beside, before)} card(s), the placement holds {len(gpus)}")
    out: list[list[tuple[str, int, int]]] = []
    nxt = 0
    for a in asks:
        start = 0 if a.init else nxt
        cards = list(gpus[start:start + a.count])
        if not a.init:
            nxt += a.count
        devs = []
        for g in cards:
            uuid = ids[g] if 0 <= g < len(ids) else ""
            if not uuid or uuid not in memory:
                raise ValueError(f"device {g} has no UUID in HAMi's registration of the node")
            mem = a.memory_mib or memory[uuid] * a.memory_percent // 100
            devs.append((uuid, mem, a.cores))
        out.append(devs)
    return encode_pod_devices(out)


def hami_pod_annotations(node: str, devices: str, now: float) -> dict[str, str]:
    """What HAMi's scheduler writes on a pod it places and binds (``Filter`` then ``Bind``), for ``node`` and the
    device string ``devices`` (:func:`hami_devices_for`); ``now``: Unix seconds."""
    t = str(int(now))
    return {ANN_HAMI_NODE: node, ANN_HAMI_TIME: t, ANN_HAMI_DEVICES_TO_ALLOCATE: devices,
            ANN_HAMI_DEVICES_ALLOCATED: devices, ANN_HAMI_BIND_PHASE: "allocating", ANN_HAMI_BIND_TIME: t}


def node_lock_value(namespace: str, name: str, now: float) -> str:
    """HAMi's node lock value for a pod: ``RFC3339 time,namespace,name`` (``GenerateNodeLockKeyByPod``)."""
    when = datetime.fromtimestamp(int(now), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return HAMI_LOCK_SEP.join((when, namespace, name))


def parse_node_lock(value: str) -> tuple[float, str, str]:
    """(Unix seconds, namespace, name) of a node lock value (``ParseNodeLock``: ``namespace`` and ``name`` are ""
    for a bare time). Raises :class:`RequestParseError` for a malformed value, naming it."""
    parts = value.split(HAMI_LOCK_SEP)
    if len(parts) not in (1, 3):
        raise RequestParseError(f"node lock {value!r}: expected 'time,namespace,name'")
    try:
        when = datetime.fromisoformat(parts[0].replace("Z", "+00:00"))
    except ValueError:
        raise RequestParseError(f"node lock {value!r}: {parts[0]!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp(), (parts[1] if len(parts) == 3 else ""), (parts[2] if len(parts) == 3 else "")
