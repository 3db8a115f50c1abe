"""What a node's GPUs are, read once from a backend, and how the agent labels the node for it.

* :func:`discover`: driver, devices, topology and NVLink domains (:class:`Clique`) of a
  :class:`~gpupool.agent.backend.GpuBackend`.
* :func:`gfd_labels`: the node labels GPU Feature Discovery would set, in its exact spellings and value
  formats (NVIDIA k8s-device-plugin ``internal/lm``: ``nvml.go`` version labels, ``resource.go`` product /
  count / memory / family / compute, ``mig-strategy.go`` MIG strategies, ``machine-type.go``,
  ``imex.go`` clique), plus ``nvidia.com/gpu.present`` (the label the GPU Operator's NFD rule sets).
* :func:`inventory_doc`: the per-GPU inventory annotation (:data:`gpupool.k8s.objects.agent_report.ANN_GPU_INVENTORY`).

Where gpupool differs from GFD, on purpose:

* GFD labels ``nvidia.com/gpu.clique`` with ``<fabric cluster UUID>.<clique id>`` on multi-node NVLink
  (GB200 NVL) fabrics only. gpupool has no fabric ids from its backend; it labels the node's NVLink domain
  when the node has exactly one (GFD too sets nothing when the clique ids are not unique), with the value
  ``nvl-<12 hex digits>`` (a hash of the member GPUs' UUIDs): ``<cluster>.<clique>`` never appears, so a
  value cannot be mistaken for a fabric clique. A node where GFD runs keeps GFD's label (the publisher never
  touches labels others own).
* GFD reads MIG engine counts (``engines.copy`` / ``decoder`` / ...) from the MIG device; the backend contract
  does not carry them, so ``mig-<profile>.engines.*`` are not set.
* With several GPU models on one node GFD's choice of ``gpu.product`` depends on Go map order; gpupool takes
  the model with most GPUs (ties: the first name in sort order).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..k8s.objects.agent_report import GpuHealth
from .backend import DriverInfo, GpuBackend, GpuDevice, MigInstance, architecture_from_compute

__all__ = ["Clique", "Discovery", "LOST_REASON", "MIG_STRATEGIES", "MISSING_REASON", "discover", "gfd_labels",
           "inventory_doc", "inventory_faults", "mig_resource", "nvlink_cliques", "remember_lost", "sanitise"]

MIG_STRATEGIES = ("none", "single", "mixed")
LOST_REASON = "FellOffTheBus"
"""Inventory reason of a GPU the driver counts but that answers ``NVML_ERROR_GPU_IS_LOST`` (the health tracker's)."""
MISSING_REASON = "GpuMissing"
"""Inventory reason of a GPU the last published inventory named and the driver no longer counts."""
_NV = "nvidia.com/"


@dataclass(frozen=True, slots=True)
class Clique:
    """An NVLink domain: GPUs joined by NVLink, directly or through others. ``id``: ``nvl-`` + 12 hex digits
    of a hash of the sorted member UUIDs (stable across restarts and index changes)."""

    id: str
    indices: tuple[int, ...]
    uuids: tuple[str, ...]


@dataclass(frozen=True)
class Discovery:
    """A node's GPUs at discovery: ``topology`` ``(i, j) -> level`` for ``i < j``; ``cliques`` NVLink domains
    of two GPUs or more."""

    driver: DriverInfo
    devices: tuple[GpuDevice, ...]
    topology: dict[tuple[int, int], str] = field(default_factory=dict)
    cliques: tuple[Clique, ...] = ()

    def clique_of(self, uuid: str) -> str | None:
        """The NVLink domain id of a GPU, None when it has no NVLink peer."""
        for c in self.cliques:
            if uuid in c.uuids:
                return c.id
        return None

    def device(self, uuid: str) -> GpuDevice | None:
        """The GPU of that UUID."""
        return next((d for d in self.devices if d.uuid == uuid), None)


def nvlink_cliques(devices: list[GpuDevice] | tuple[GpuDevice, ...],
                   topology: Mapping[tuple[int, int], str]) -> tuple[Clique, ...]:
    """Connected components of the NVLink graph (edges: ``NVLINK`` in the topology, or a peer bus id in
    ``nvlink_peers``), components of two GPUs or more, ordered by their lowest index."""
    parent = {d.index: d.index for d in devices}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a: int, b: int) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    for (i, j), level in topology.items():
        if level == "NVLINK" and i in parent and j in parent:
            union(i, j)
    by_bus = {d.pci_bus_id.lower(): d.index for d in devices if d.pci_bus_id}
    for d in devices:
        for peer in d.nvlink_peers:
            j = by_bus.get(peer.lower())
            if j is not None:
                union(d.index, j)
    groups: dict[int, list[GpuDevice]] = {}
    for d in sorted(devices, key=lambda d: d.index):
        groups.setdefault(find(d.index), []).append(d)
    out = []
    for members in groups.values():
        if len(members) < 2:
            continue
        uuids = tuple(m.uuid for m in members)
        digest = hashlib.sha256(",".join(sorted(uuids)).encode()).hexdigest()[:12]
        out.append(Clique(id=f"nvl-{digest}", indices=tuple(m.index for m in members), uuids=uuids))
    return tuple(sorted(out, key=lambda c: c.indices[0]))


def discover(backend: GpuBackend) -> Discovery:
    """Read the driver, devices and topology once (BackendError when the driver cannot answer)."""
    driver = backend.driver()
    devices = tuple(backend.devices())
    topology = backend.topology()
    return Discovery(driver=driver, devices=devices, topology=topology, cliques=nvlink_cliques(devices, topology))


# -- GFD labels ----------------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9-_. ]")


def sanitise(text: str) -> str:
    """GFD's ``sanitise``: drop characters other than letters, digits, ``-_.`` and space; runs of spaces -> ``-``
    (``"NVIDIA H100 80GB HBM3"`` -> ``"NVIDIA-H100-80GB-HBM3"``)."""
    return "-".join(_UNSAFE.sub("", text).split())


def mig_resource(profile: str) -> str:
    """The device plugin's name of a MIG profile: ``+`` -> ``.`` (``"1g.18gb+me"`` -> ``"1g.18gb.me"``)."""
    return profile.replace("+", ".")


def _version_labels(driver: DriverInfo) -> dict[str, str]:
    parts = driver.driver.split(".")
    major, minor = parts[0], parts[1] if len(parts) > 1 else ""
    rev = parts[2] if len(parts) > 2 else ""
    out = {"cuda.driver.major": major, "cuda.driver.minor": minor, "cuda.driver.rev": rev,
           "cuda.driver-version.major": major, "cuda.driver-version.minor": minor,
           "cuda.driver-version.revision": rev, "cuda.driver-version.full": driver.driver}
    if driver.cuda_driver:
        cmaj, _, cmin = driver.cuda_driver.partition(".")
        cmin = cmin.split(".")[0] or "0"
        out |= {"cuda.runtime.major": cmaj, "cuda.runtime.minor": cmin, "cuda.runtime-version.major": cmaj,
                "cuda.runtime-version.minor": cmin, "cuda.runtime-version.full": f"{cmaj}.{cmin}"}
    return out


def _gpu_resource_labels(prefix: str, product: str, count: int, replicas: int, memory_mib: int,
                         compute: tuple[int, int] | None) -> dict[str, str]:
    out = {f"{prefix}.product": product, f"{prefix}.count": str(count), f"{prefix}.replicas": str(replicas),
           f"{prefix}.sharing-strategy": "none"}
    if memory_mib:
        out[f"{prefix}.memory"] = str(memory_mib)
    if compute and compute[0]:
        out |= {f"{prefix}.family": architecture_from_compute(*compute),
                f"{prefix}.compute.major": str(compute[0]), f"{prefix}.compute.minor": str(compute[1])}
    return out


def _mig_attribute_labels(prefix: str, d: GpuDevice, m: MigInstance) -> dict[str, str]:
    p = next((p for p in d.mig_profiles if p.name == m.profile), None)
    memory = m.memory_mib or (p.memory_mib if p else 0)
    slices = p.slices if p else m.size  # compute slices of the profile (3g: 3), not the placement's size
    out = {f"{prefix}.memory": str(memory), f"{prefix}.slices.gi": str(slices), f"{prefix}.slices.ci": str(slices)}
    if p and p.sms:
        out[f"{prefix}.multiprocessors"] = str(p.sms)
    return out


def gfd_labels(discovery: Discovery, mig_strategy: str = "mixed", machine: str | None = None) -> dict[str, str]:
    """The labels GFD sets for these GPUs (``nvidia.com/...``), plus ``nvidia.com/gpu.present=true`` and
    ``nvidia.com/gpu.clique`` (see the module docstring). ``machine``: the machine type (GFD reads
    ``/sys/class/dmi/id/product_name``); ``gpu.machine`` is only set when given. No GPUs: no labels.

    Full GPUs: ``gpu.product`` (sanitised NVML name), ``gpu.count``, ``gpu.replicas`` (1; 0 where every GPU of
    the model is in MIG mode, as GFD), ``gpu.sharing-strategy`` ``none``, ``gpu.memory`` (MiB),
    ``gpu.family``, ``gpu.compute.major/minor``; versions: ``cuda.driver.major/minor/rev`` (the kernel
    driver's, deprecated by GFD), ``cuda.driver-version.major/minor/revision/full``, ``cuda.runtime.*`` and
    ``cuda.runtime-version.major/minor/full`` (the CUDA version the driver supports); ``mig.capable``.
    MIG (strategy not ``none``): ``mig.strategy``; ``mixed``: per profile of existing MIG devices
    ``mig-<profile>.count/.product/.replicas/.sharing-strategy/.memory/.multiprocessors/.slices.gi/.slices.ci``;
    ``single``: the same under ``gpu.*`` when every GPU is in MIG mode with MIG devices of one profile, else
    GFD's invalid set (``gpu.product`` ``<model>-MIG-INVALID``, count/replicas/memory 0).
    """
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(f"mig_strategy {mig_strategy!r}: one of {MIG_STRATEGIES}")
    devices = tuple(d for d in discovery.devices if not d.lost)  # a lost GPU has no model to label
    if not devices:
        return {}
    labels: dict[str, str] = {"gpu.present": "true"}
    labels |= _version_labels(discovery.driver)
    labels["mig.capable"] = str(any(d.mig_profiles for d in devices)).lower()
    if machine is not None:
        labels["gpu.machine"] = sanitise(machine)
    # Full GPUs (newGPULabelers): one labeller per model; full GPUs override MIG-enabled ones of that model.
    counts = Counter(d.name for d in devices)
    full = {d.name for d in devices if not d.mig_enabled}
    first = {}
    for d in devices:
        first.setdefault(d.name, d)
    order = sorted(sorted(counts, reverse=True), key=lambda n: counts[n])  # the winner (most GPUs) comes last
    for name in order:
        d = first[name]
        labels |= _gpu_resource_labels("gpu", sanitise(name), counts[name], 1 if name in full else 0,
                                       d.memory_mib, d.compute)
    if mig_strategy != "none":
        labels["mig.strategy"] = mig_strategy
        migs = [(d, m) for d in devices if d.mig_enabled for m in d.mig_instances]
        if mig_strategy == "mixed":
            by_profile: dict[str, list[tuple[GpuDevice, MigInstance]]] = {}
            for d, m in migs:
                by_profile.setdefault(mig_resource(m.profile), []).append((d, m))
            for res, items in sorted(by_profile.items()):
                d, m = items[0]
                prefix = f"mig-{res}"
                labels |= {f"{prefix}.product": f"{sanitise(d.name)}-MIG-{sanitise(res)}",
                           f"{prefix}.count": str(len(items)), f"{prefix}.replicas": "1",
                           f"{prefix}.sharing-strategy": "none"}
                labels |= _mig_attribute_labels(prefix, d, m)
        else:
            labels |= _single_strategy(devices, migs)
    if len(discovery.cliques) == 1:
        labels["gpu.clique"] = discovery.cliques[0].id
    return {_NV + k: v for k, v in labels.items()}


def _single_strategy(devices: tuple[GpuDevice, ...], migs: list[tuple[GpuDevice, MigInstance]]) -> dict[str, str]:
    enabled = [d for d in devices if d.mig_enabled]
    if not enabled:
        return {}
    profiles = {mig_resource(m.profile) for _, m in migs}
    if any(not d.mig_instances for d in enabled) or len(enabled) != len(devices) or len(profiles) != 1:
        return {"gpu.product": f"{sanitise(enabled[0].name)}-MIG-INVALID", "gpu.count": "0",
                "gpu.replicas": "0", "gpu.sharing-strategy": "", "gpu.memory": "0"}
    d, m = migs[0]
    res = profiles.pop()
    out = {"gpu.product": f"{sanitise(d.name)}-MIG-{sanitise(res)}", "gpu.count": str(len(migs)),
           "gpu.replicas": "1", "gpu.sharing-strategy": "none"}
    return out | _mig_attribute_labels("gpu", d, m)


# -- inventory -----------------------------------------------------------------------------------------
def _rfc3339(now: float | datetime | str) -> str:
    if isinstance(now, str):
        return now
    if not isinstance(now, datetime):
        now = datetime.fromtimestamp(float(now), tz=UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def inventory_doc(discovery: Discovery, health: Mapping[str, GpuHealth] | None = None,
                  now: float | datetime | str = 0.0) -> dict[str, Any]:
    """The inventory annotation's document (:mod:`gpupool.agent.report` gives the shape): one entry per GPU
    by index; ``healthy``/``reason`` from ``health`` by UUID (a GPU without an entry is healthy); a GPU lost
    before it was read (``GpuDevice.lost``) is listed unhealthy with reason :data:`LOST_REASON` (and its UUID
    only when it could be read); ``time`` RFC 3339 UTC of ``now`` (seconds since the epoch, a datetime, or
    an RFC 3339 string as is)."""
    health = health or {}
    gpus = []
    for d in sorted(discovery.devices, key=lambda d: d.index):
        h = health.get(d.uuid) if d.uuid else None
        if d.lost and (h is None or h.healthy):
            h = GpuHealth(d.uuid, False, LOST_REASON)
        gpus.append({
            "index": d.index, "uuid": d.uuid, "minor": d.minor, "product": d.name, "memoryMiB": d.memory_mib,
            "compute": f"{d.compute[0]}.{d.compute[1]}", "pciBusId": d.pci_bus_id, "numaNode": d.numa_node,
            "mig": {"enabled": d.mig_enabled,
                    "instances": [{"profile": m.profile, "start": m.start, "size": m.size, "uuid": m.uuid}
                                  for m in d.mig_instances]},
            "nvlinkDomain": discovery.clique_of(d.uuid),
            "healthy": True if h is None else h.healthy,
            "reason": "" if h is None else h.reason,
        })
    return {"version": 1, "driver": discovery.driver.driver, "cudaDriver": discovery.driver.cuda_driver,
            "time": _rfc3339(now), "gpus": gpus}


def remember_lost(inventory: Mapping[str, Any], previous: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``inventory`` (of :func:`inventory_doc`) completed from ``previous``, the GPU entries of the inventory
    published before (the Node's annotation when the agent started, then each one it built), so that a GPU
    that failed while no agent watched is named, never left out:

    * an entry of a GPU lost before it was read (no UUID) takes the UUID, model and placement of the previous
      entry with the same PCI bus id (else the same index) whose GPU is not otherwise present; it stays
      unhealthy (:data:`LOST_REASON`);
    * every previous GPU (by UUID) that is neither present nor so matched, and whose PCI bus id no present GPU
      has (a replaced board), is listed unhealthy with reason :data:`MISSING_REASON` (the driver no longer
      counts it), at its old index when free, else after the last.

    A GPU taken out on purpose stays listed until the annotation is removed and the agent restarted."""
    doc = dict(inventory)
    gpus = [dict(g) for g in doc.get("gpus") or [] if isinstance(g, Mapping)]
    old = [dict(g) for g in previous if isinstance(g, Mapping) and isinstance(g.get("uuid"), str) and g.get("uuid")]
    present = {g["uuid"] for g in gpus if g.get("uuid")}
    buses = {str(g.get("pciBusId") or "").lower() for g in gpus if g.get("uuid") and g.get("pciBusId")}
    left = [g for g in old if g["uuid"] not in present]
    for g in gpus:
        if g.get("uuid"):
            continue
        bus = str(g.get("pciBusId") or "").lower()
        match = next((p for p in left if bus and str(p.get("pciBusId") or "").lower() == bus), None)
        if match is None and not bus:
            match = next((p for p in left if p.get("index") == g.get("index")), None)
        if match is not None:
            left.remove(match)
            keep = {k: g[k] for k in ("index", "healthy", "reason")}
            g.update({k: v for k, v in match.items() if k not in keep}, **keep)
            present.add(match["uuid"])
    taken = {g.get("index") for g in gpus}
    for p in left:
        if p["uuid"] in present or str(p.get("pciBusId") or "").lower() in buses - {""}:
            continue
        index = p.get("index")
        if not isinstance(index, int) or isinstance(index, bool) or index in taken:
            index = max([i for i in taken if isinstance(i, int) and not isinstance(i, bool)], default=-1) + 1
        taken.add(index)
        present.add(p["uuid"])
        gpus.append({**p, "index": index, "healthy": False, "reason": MISSING_REASON})
    doc["gpus"] = sorted(gpus, key=lambda g: g.get("index") if isinstance(g.get("index"), int) else 1 << 30)
    return doc


def inventory_faults(inventory: Mapping[str, Any], health: Mapping[str, GpuHealth]) -> dict[str, GpuHealth]:
    """``health`` plus an unhealthy entry for each GPU of ``inventory`` that is lost or missing
    (:data:`LOST_REASON`, :data:`MISSING_REASON`) and that ``health`` does not already hold by UUID, so
    that the ``GpuHealthy`` condition names it too. A GPU without a UUID is keyed ``"(UUID unknown) at index
    <index>"``; the tracker's entry for samples without a UUID (``""``) is dropped."""
    out = {u: h for u, h in health.items() if u}
    for g in inventory.get("gpus") or []:
        if not isinstance(g, Mapping) or g.get("reason") not in (LOST_REASON, MISSING_REASON):
            continue
        key = str(g.get("uuid") or f"(UUID unknown) at index {g.get('index')}")
        if key in out and not out[key].healthy:
            continue
        if g.get("reason") == MISSING_REASON:
            message = (f"GPU {g.get('index')} was in this node's last inventory but the driver no longer counts "
                       "it (fallen off the bus, or removed)")
        else:
            message = (f"GPU {g.get('index')} is counted by the driver but answers GPU_IS_LOST (fallen off the "
                       "bus before the agent could read it)")
        out[key] = GpuHealth(key, False, str(g["reason"]), message, 79 if g["reason"] == LOST_REASON else 0)
    return out
