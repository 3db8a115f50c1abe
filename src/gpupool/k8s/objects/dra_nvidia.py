"""ResourceSlices and DeviceClasses as NVIDIA's DRA driver for GPUs (driver ``gpu.nvidia.com``) publishes them.

Builds the API objects (``resource.k8s.io/v1`` dicts) that the driver's GPU kubelet plugin would publish for a
node, for tests, benchmarks and dry runs on machines without GPUs. Every spelling below is the driver's, read in
its public repository kubernetes-sigs/dra-driver-nvidia-gpu (formerly NVIDIA/k8s-dra-driver-gpu; commit 9593204
of 2026-08-07), ``cmd/gpu-kubelet-plugin/``:

- ``deviceinfo.go`` ``GpuInfo.Attributes``/``GetDevice``: a full GPU is named ``gpu-<minor>`` and carries the
  attributes ``type`` (``gpu``), ``uuid``, ``productName``, ``brand``, ``architecture`` (strings),
  ``cudaComputeCapability``, ``driverVersion``, ``cudaDriverVersion`` (versions, normalised by
  Masterminds/semver: ``580.159.04`` -> ``580.159.4``, ``13.0`` -> ``13.0.0``), the standard
  ``resource.kubernetes.io/pciBusID`` and ``resource.kubernetes.io/pcieRoot`` (k8s.io/dynamic-resource-allocation
  ``deviceattribute``) and ``resource.kubernetes.io/numaNode`` (int, where sysfs knows it); capacity ``memory``
  (bytes). No ``index`` attribute. No NVLink clique attribute (cliques belong to the ComputeDomain driver,
  ``compute-domain.nvidia.com``); ``gpuModuleID``/``partitionN`` only with the alpha FabricManagerPartitioning gate.
- ``mig.go`` ``CommonAttributesMig``/``CommonCapacitiesMig``/``ToCanonicalName``: a MIG device is named
  ``gpu-<minor>-mig-<profile without dots, RFC 1123>-<GI profile id>-<placement start>`` (``gpu-0-mig-1g18gb-19-0``,
  ``gpu-0-mig-1g18gb-me-20-0``); attributes ``type`` (``mig``), ``parentUUID``, ``profile`` (``1g.18gb``) and the
  parent's product/brand/architecture/versions/PCI attributes; capacities ``multiprocessors``, ``copyEngines``,
  ``decoders``, ``encoders``, ``jpegEngines``, ``ofaEngines`` and ``memory`` (the GI profile's MiB x 2^20).
- ``partitions.go`` + ``driver.go`` (DynamicMIG feature gate, KEP 4815 partitionable devices): one counter set
  per GPU, ``gpu-<minor>-counter-set``, with one counter per capacity (names made DNS-like: ``copy-engines``,
  ``jpeg-engines``, ``ofa-engines``, ...; values the maximum over all MIG profiles) plus ``memory-slice-<i>``
  (value 1) per memory slice; every possible MIG profile x placement is a device consuming its capacities and
  its memory slices from that set, and the full GPU consumes all of it (its capacity is then the maximum over
  the profiles, e.g. 140Gi on an H200). On Kubernetes >= 1.35 the pool has G+1 slices: first one with only the
  ``sharedCounters`` of all GPUs, then one slice of devices per GPU (ordered by PCI bus ID, devices sorted by
  name). An Ampere GPU with MIG mode on publishes only its partitions (no reset-less MIG toggle); Hopper and
  newer also publish the full GPU. Without DynamicMIG (or on GPUs without MIG) the pool is one slice of full
  GPUs with ``memory`` capacity only.
- ``consumable_shares.go`` (alpha ConsumableShares gate, ``--consumable-shares``): devices get
  ``allowMultipleAllocations: true`` and a ``requestPolicy`` on ``memory`` (step 1Mi; ``memory``: default = all,
  min 1Mi; ``unlimited``: default 0, min 0; an integer N: default 0 plus a ``shares`` capacity N, default 1).
- ``vendor/k8s.io/dynamic-resource-allocation/resourceslice``: slices are named
  ``<index, 5 hex digits>-gpu.nvidia.com-<node>-<random>``, owned by the Node, pool named after the node.
- ``deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-*.yaml``: the DeviceClasses.

GPU models: the H200's figures are the real GPU's in ``shared/reference/nvml-h200`` (nvml.json, mig-lgip.txt);
the others are ``nvidia-smi mig -lgip`` outputs published in NVIDIA's MIG user guide and public captures (H100
80GB HBM3 SXM, A100-SXM4-40GB, A100-SXM4-80GB); MIG placements are ``nvidia-smi mig -lgipp``'s, the same on all
of them. Imports nothing of gpupool.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

DRIVER = "gpu.nvidia.com"
API_VERSION = "resource.k8s.io/v1"
GIB = 1 << 30
MIB = 1 << 20


@dataclass(frozen=True)
class MigProfile:
    """One GPU-instance profile as NVML reports it (``nvmlDeviceGetGpuInstanceProfileInfo``) with its
    placements (``nvmlDeviceGetGpuInstancePossiblePlacements``: start indices on the memory-slice axis)."""

    profile_id: int  # the GI profile id nvidia-smi -lgip prints (19, 20, 15, 14, 9, 5, 0)
    compute_slices: int  # G of "Ng.Mgb"
    memory_mib: int
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    placements: tuple[int, ...]
    placement_size: int  # memory slices consumed
    suffix: str = ""  # "+me" for the media-extension variant


@dataclass(frozen=True)
class GpuModel:
    """What NVML says of one GPU product."""

    product_name: str
    architecture: str  # go-nvlib GetArchitectureAsString
    compute_capability: str  # "9.0"
    memory_bytes: int  # nvmlDeviceGetMemoryInfo().total
    mig_profiles: tuple[MigProfile, ...] = ()
    brand: str = "Nvidia"  # go-nvlib GetBrandAsString for NVML_BRAND_NVIDIA (14)

    @property
    def mig_capable(self) -> bool:
        return bool(self.mig_profiles)

    @property
    def mig_toggle_without_reset(self) -> bool:
        """Hopper and newer (nvlib.go supportsMIGModeToggle)."""
        return self.architecture not in ("Ampere",)


def _hopper_profiles(mem: dict[int, int], sm_1g: int = 16, sm_1g_rev2: int = 26) -> tuple[MigProfile, ...]:
    """The Hopper MIG profile set (H100 SXM, H200); ``mem`` maps GI profile id -> MiB."""
    return (
        MigProfile(19, 1, mem[19], sm_1g, 1, 1, 0, 1, 0, (0, 1, 2, 3, 4, 5, 6), 1),
        MigProfile(20, 1, mem[19], sm_1g, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, "+me"),
        MigProfile(15, 1, mem[15], sm_1g_rev2, 1, 1, 0, 1, 0, (0, 2, 4, 6), 2),
        MigProfile(14, 2, mem[14], 32, 2, 2, 0, 2, 0, (0, 2, 4), 2),
        MigProfile(9, 3, mem[9], 60, 3, 3, 0, 3, 0, (0, 4), 4),
        MigProfile(5, 4, mem[5], 64, 4, 4, 0, 4, 0, (0,), 4),
        MigProfile(0, 7, mem[0], 132, 8, 7, 0, 7, 1, (0,), 8),
    )


def _ampere_profiles(mem: dict[int, int], dec: tuple[int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """The A100 MIG profile set; ``dec`` = decoders of the 1g.REV2, 2g, 3g, 4g and 7g profiles."""
    return (
        MigProfile(19, 1, mem[19], 14, 1, 0, 0, 0, 0, (0, 1, 2, 3, 4, 5, 6), 1),
        MigProfile(20, 1, mem[19], 14, 1, 1, 0, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, "+me"),
        MigProfile(15, 1, mem[15], 14, 1, dec[0], 0, 0, 0, (0, 2, 4, 6), 2),
        MigProfile(14, 2, mem[14], 28, 2, dec[1], 0, 0, 0, (0, 2, 4), 2),
        MigProfile(9, 3, mem[9], 42, 3, dec[2], 0, 0, 0, (0, 4), 4),
        MigProfile(5, 4, mem[5], 56, 4, dec[3], 0, 0, 0, (0,), 4),
        MigProfile(0, 7, mem[0], 98, 7, dec[4], 0, 1, 1, (0,), 8),
    )


MODELS: dict[str, GpuModel] = {
    # shared/reference/nvml-h200: nvml.json (memory.total, gpu_instance_profiles) and mig-lgip.txt
    "NVIDIA H200": GpuModel("NVIDIA H200", "Hopper", "9.0", 150_754_820_096,
                            _hopper_profiles({19: 16384, 15: 33280, 14: 33280, 9: 71424, 5: 71424, 0: 143360})),
    # nvidia-smi -lgip on an H100 80GB HBM3 (SXM5): 9.75 / 19.62 / 39.50 / 79.25 GiB; 81559 MiB total
    "NVIDIA H100 80GB HBM3": GpuModel("NVIDIA H100 80GB HBM3", "Hopper", "9.0", 81559 * MIB,
                                      _hopper_profiles({19: 9984, 15: 20096, 14: 20096, 9: 40448, 5: 40448,
                                                        0: 81152})),
    # MIG user guide, A100-SXM4-40GB: 4.75 / 9.62 / 19.50 / 39.25 GiB
    "NVIDIA A100-SXM4-40GB": GpuModel("NVIDIA A100-SXM4-40GB", "Ampere", "8.0", 40960 * MIB,
                                      _ampere_profiles({19: 4864, 15: 9856, 14: 9856, 9: 19968, 5: 19968,
                                                        0: 40192}, (1, 1, 2, 2, 5))),
    # nvidia-smi -lgip on an A100-SXM4-80GB (R570-era driver): 9.50 / 19.50 / 39.25 / 79.00 GiB
    "NVIDIA A100-SXM4-80GB": GpuModel("NVIDIA A100-SXM4-80GB", "Ampere", "8.0", 81920 * MIB,
                                      _ampere_profiles({19: 9728, 15: 19968, 14: 19968, 9: 40192, 5: 40192,
                                                        0: 80896}, (1, 2, 3, 4, 5))),
    "NVIDIA L40S": GpuModel("NVIDIA L40S", "Ada Lovelace", "8.9", 46068 * MIB),
}


def mig_profile_name(profile: MigProfile, device_memory_bytes: int) -> str:
    """go-nvlib's ``MigProfileInfo.String`` (``getMigMemorySizeGB``): the profile's share of the GPU's memory
    rounded up to 1/8, times the GPU's memory in whole GiB rounded up, rounded half away from zero."""
    frac = math.ceil(profile.memory_mib * MIB / device_memory_bytes * 8) / 8
    gb = math.floor(frac * ((device_memory_bytes + GIB - 1) // GIB) + 0.5)
    return f"{profile.compute_slices}g.{gb}gb{profile.suffix}"


def _rfc1123(name: str) -> str:
    """mig.go ``toRFC1123Compliant``."""
    return re.sub(r"[^a-z0-9-.]", "-", name.lower()).strip("-").rstrip(".")[:253]


def _dns_counter(name: str) -> str:
    """mig.go ``camelToDNSName``: ``copyEngines`` -> ``copy-engines``."""
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1-\2", name)
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1-\2", s)
    return _rfc1123(s)


def quantity(value: int) -> str:
    """A non-negative integer as Kubernetes prints a BinarySI quantity (``143771Mi``, ``140Gi``, ``16``)."""
    if value < 0:
        raise ValueError(f"quantity {value} is negative")
    for suffix, power in (("Ei", 60), ("Pi", 50), ("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)):
        if value and value % (1 << power) == 0:
            return f"{value >> power}{suffix}"
    return str(value)


def semver(text: str) -> str:
    """Masterminds/semver ``NewVersion(...).String()`` with leading zeros coerced: ``580.159.04`` -> ``580.159.4``."""
    m = re.fullmatch(r"v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", text.strip())
    if not m:
        raise ValueError(f"version {text!r} is not major[.minor[.patch]]")
    return ".".join(str(int(p or 0)) for p in m.groups())


def _profile_caps(p: MigProfile) -> dict[str, int]:
    return {"multiprocessors": p.multiprocessors, "copyEngines": p.copy_engines, "decoders": p.decoders,
            "encoders": p.encoders, "jpegEngines": p.jpeg_engines, "ofaEngines": p.ofa_engines,
            "memory": p.memory_mib * MIB}


@dataclass(frozen=True)
class GpuSpec:
    """One physical GPU of a node: its minor number and where it sits."""

    minor: int
    uuid: str
    pci_bus_id: str  # "0000:1b:00.0"
    pcie_root: str | None = None  # "pci0000:15"
    numa_node: int | None = None


def _uuid(node: str, minor: int) -> str:
    h = hashlib.sha256(f"{node}/{minor}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _suffix(*parts: object) -> str:
    """A deterministic stand-in for the 5 characters the API server appends to a generateName."""
    alphabet = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
    h = int(hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest(), 16)
    out = []
    for _ in range(5):
        h, r = divmod(h, len(alphabet))
        out.append(alphabet[r])
    return "".join(out)


def _attr(value: str | int | bool, kind: str = "string") -> dict[str, Any]:
    return {kind: value}


def _gpu_attributes(model: GpuModel, gpu: GpuSpec, driver_version: str, cuda_version: str) -> dict[str, Any]:
    attrs: dict[str, Any] = {
        "type": _attr("gpu"), "uuid": _attr(gpu.uuid), "productName": _attr(model.product_name),
        "brand": _attr(model.brand), "architecture": _attr(model.architecture),
        "cudaComputeCapability": _attr(semver(model.compute_capability), "version"),
        "driverVersion": _attr(semver(driver_version), "version"),
        "cudaDriverVersion": _attr(semver(cuda_version), "version"),
        "resource.kubernetes.io/pciBusID": _attr(gpu.pci_bus_id),
    }
    if gpu.pcie_root:
        attrs["resource.kubernetes.io/pcieRoot"] = _attr(gpu.pcie_root)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs["resource.kubernetes.io/numaNode"] = _attr(gpu.numa_node, "int")
    return attrs


def _mig_attributes(gpu_attrs: dict[str, Any], profile_name: str) -> dict[str, Any]:
    attrs = {k: v for k, v in gpu_attrs.items() if k not in ("type", "uuid")}
    attrs.update({"type": _attr("mig"), "parentUUID": gpu_attrs["uuid"], "profile": _attr(profile_name)})
    return attrs


def _apply_consumable_shares(dev: dict[str, Any], mode: str | None) -> None:
    """consumable_shares.go ``applyConsumableShares``."""
    if not mode or mode == "disabled":
        return
    dev["allowMultipleAllocations"] = True
    mem = dev.get("capacity", {}).get("memory")
    if mem is None:
        return
    max_mem = (mem.pop("_bytes") // MIB) * MIB
    mem["value"] = quantity(max_mem)
    if mode == "unlimited":
        mem["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": quantity(max_mem), "step": "1Mi"}}
    elif mode == "memory":
        mem["requestPolicy"] = {"default": quantity(max_mem),
                                "validRange": {"min": "1Mi", "max": quantity(max_mem), "step": "1Mi"}}
    else:
        shares = int(mode)
        if shares <= 0:
            raise ValueError(f"consumable_shares {mode!r} is not disabled, memory, unlimited or a positive integer")
        mem["requestPolicy"] = {"default": "0", "validRange": {"min": "0", "max": quantity(max_mem), "step": "1Mi"}}
        dev["capacity"]["shares"] = {"value": str(shares), "requestPolicy": {
            "default": "1", "validRange": {"min": "1", "max": str(shares), "step": "1"}}}


def _caps(values: dict[str, int]) -> dict[str, Any]:
    return {k: ({"value": quantity(v), "_bytes": v} if k == "memory" else {"value": quantity(v)})
            for k, v in values.items()}


def _strip(dev: dict[str, Any]) -> dict[str, Any]:
    for c in dev.get("capacity", {}).values():
        c.pop("_bytes", None)
    return dev


def gpu_devices(model: GpuModel, gpu: GpuSpec, *, dynamic_mig: bool, mig_enabled: bool,
                driver_version: str, cuda_version: str, consumable_shares: str | None = None,
                memory_bytes: int | None = None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """The devices one GPU contributes (sorted by name, as driver.go emits them) and its counter set
    (None without partitions)."""
    mem_total = memory_bytes or model.memory_bytes
    attrs = _gpu_attributes(model, gpu, driver_version, cuda_version)
    if not (dynamic_mig and model.mig_capable):
        dev = {"name": f"gpu-{gpu.minor}", "attributes": attrs, "capacity": _caps({"memory": mem_total})}
        _apply_consumable_shares(dev, consumable_shares)
        return [_strip(dev)], None
    maxcap: dict[str, int] = {}
    mem_slices = 0
    specs = []
    for p in model.mig_profiles:
        for start in p.placements:
            specs.append((p, start))
            mem_slices = max(mem_slices, p.placement_size)
            for k, v in _profile_caps(p).items():
                maxcap[k] = max(maxcap.get(k, 0), v)
    set_name = _rfc1123(f"gpu-{gpu.minor}-counter-set")
    all_counters = {_dns_counter(k): {"value": quantity(v)} for k, v in maxcap.items()}
    all_counters.update({f"memory-slice-{i}": {"value": "1"} for i in range(mem_slices)})
    devices = []
    if not mig_enabled or model.mig_toggle_without_reset:
        full = {"name": f"gpu-{gpu.minor}", "attributes": attrs, "capacity": _caps(maxcap),
                "consumesCounters": [{"counterSet": set_name, "counters": dict(all_counters)}]}
        _apply_consumable_shares(full, consumable_shares)
        devices.append(_strip(full))
    for p, start in specs:
        pname = mig_profile_name(p, mem_total)
        counters = {_dns_counter(k): {"value": quantity(v)} for k, v in _profile_caps(p).items()}
        counters.update({f"memory-slice-{i}": {"value": "1"} for i in range(start, start + p.placement_size)})
        dev = {"name": f"gpu-{gpu.minor}-mig-{_rfc1123(pname.replace('.', ''))}-{p.profile_id}-{start}",
               "attributes": _mig_attributes(attrs, pname), "capacity": _caps(_profile_caps(p)),
               "consumesCounters": [{"counterSet": set_name, "counters": counters}]}
        _apply_consumable_shares(dev, consumable_shares)
        devices.append(_strip(dev))
    devices.sort(key=lambda d: d["name"])
    return devices, {"name": set_name, "counters": all_counters}


@dataclass(frozen=True)
class NodePreset:
    """A server shape: GPU model, count and PCI layout, and the node's CPU and memory for pods."""

    name: str
    product: str
    gpus: int
    bus_ids: tuple[str, ...] = ()
    numa_nodes: tuple[int, ...] = ()
    pcie_roots: tuple[str, ...] = ()
    cpu: str = "96"
    memory: str = "384Gi"
    dynamic_mig: bool = True
    mig_enabled: bool = True  # matters on Ampere only: MIG mode on -> partitions only
    consumable_shares: str | None = None


# Layouts: 8 GPUs over two NUMA nodes, a PCIe root per pair of GPUs, bus IDs as a DGX H100/H200 lists them
# (a modeled layout, not read from a machine); CPU and memory as openb's dominant 8-GPU node (96 cores, 384 GiB).
_DGX_BUS = ("0000:1b:00.0", "0000:43:00.0", "0000:52:00.0", "0000:61:00.0",
            "0000:9d:00.0", "0000:c3:00.0", "0000:d1:00.0", "0000:df:00.0")
_DGX_ROOT = ("pci0000:15", "pci0000:15", "pci0000:48", "pci0000:48",
             "pci0000:97", "pci0000:97", "pci0000:c8", "pci0000:c8")
_NUMA = (0, 0, 0, 0, 1, 1, 1, 1)
PRESETS: dict[str, NodePreset] = {
    "dgx-h100": NodePreset("dgx-h100", "NVIDIA H100 80GB HBM3", 8, _DGX_BUS, _NUMA, _DGX_ROOT),
    "dgx-h200": NodePreset("dgx-h200", "NVIDIA H200", 8, _DGX_BUS, _NUMA, _DGX_ROOT),
    "a100-40gb": NodePreset("a100-40gb", "NVIDIA A100-SXM4-40GB", 8, _DGX_BUS, _NUMA, _DGX_ROOT),
    "a100-80gb": NodePreset("a100-80gb", "NVIDIA A100-SXM4-80GB", 8, _DGX_BUS, _NUMA, _DGX_ROOT),
    "l40s": NodePreset("l40s", "NVIDIA L40S", 8, _DGX_BUS, _NUMA, _DGX_ROOT, dynamic_mig=False),
}


def nvidia_slices(node_name: str, gpus: int, product: str = "NVIDIA H200", memory_mib: int | None = None,
                  mig_profiles: bool = True, generation: int = 1, *, mig_enabled: bool = True,
                  consumable_shares: str | None = None, driver_version: str = "580.159.04",
                  cuda_driver_version: str = "13.0", bus_ids: Sequence[str] = (),
                  numa_nodes: Sequence[int] = (), pcie_roots: Sequence[str] = (),
                  node_uid: str | None = None, split_counters: bool = True) -> list[dict[str, Any]]:
    """The ResourceSlices (``resource.k8s.io/v1`` dicts) of ``node_name``'s pool, as the GPU kubelet plugin
    publishes them for ``gpus`` GPUs of ``product`` (a key of :data:`MODELS`).

    ``mig_profiles``: the DynamicMIG feature gate (every MIG profile x placement as a partitionable device with
    shared counters; ignored for GPUs without MIG). ``mig_enabled``: MIG mode of Ampere GPUs (on: only their
    partitions are published). ``consumable_shares``: the ``--consumable-shares`` flag (None = disabled).
    ``memory_mib``: overrides the model's total memory. ``split_counters``: the 1.35+ layout (a first slice of
    counter sets, then a slice per GPU); False = the 1.34 layout (a slice per GPU holding its counters).
    ``node_uid``: the Node's uid, to set the owner reference the plugin sets. Defaults for driver and CUDA
    versions are the reference H200's. Raises ValueError for an unknown product or a bad count.
    """
    if product not in MODELS:
        raise ValueError(f"product {product!r}: unknown; one of {sorted(MODELS)}")
    if gpus < 1:
        raise ValueError(f"gpus {gpus}: must be at least 1")
    model = MODELS[product]
    mem = memory_mib * MIB if memory_mib else None
    dynamic = mig_profiles and model.mig_capable
    per_gpu = []
    for i in range(gpus):
        spec = GpuSpec(
            minor=i, uuid=_uuid(node_name, i),
            pci_bus_id=bus_ids[i] if i < len(bus_ids) else f"0000:{0x10 + 0x10 * i:02x}:00.0",
            pcie_root=pcie_roots[i] if i < len(pcie_roots) else None,
            numa_node=numa_nodes[i] if i < len(numa_nodes) else None)
        per_gpu.append((spec.pci_bus_id, gpu_devices(
            model, spec, dynamic_mig=dynamic, mig_enabled=mig_enabled, driver_version=driver_version,
            cuda_version=cuda_driver_version, consumable_shares=consumable_shares, memory_bytes=mem)))
    per_gpu.sort(key=lambda t: t[0])  # driver.go: slices.Sorted(maps.Keys(allocatablesMap)) by PCI bus ID
    specs: list[dict[str, Any]] = []
    if not dynamic:
        specs.append({"devices": [d for _, (devs, _) in per_gpu for d in devs]})
    elif split_counters:
        specs.append({"sharedCounters": [cs for _, (_, cs) in per_gpu if cs]})
        specs.extend({"devices": devs} for _, (devs, _) in per_gpu)
    else:
        specs.extend({"devices": devs, "sharedCounters": [cs]} for _, (devs, cs) in per_gpu if cs)
    width = max(5, len(f"{len(specs) - 1:x}"))
    out = []
    for i, extra in enumerate(specs):
        meta: dict[str, Any] = {"name": f"{i:0{width}x}-{DRIVER}-{node_name}-{_suffix(node_name, generation, i)}"}
        if node_uid:
            meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid,
                                        "controller": True}]
        spec = {"driver": DRIVER, "nodeName": node_name,
                "pool": {"name": node_name, "generation": generation, "resourceSliceCount": len(specs)}}
        spec.update(extra)
        out.append({"apiVersion": API_VERSION, "kind": "ResourceSlice", "metadata": meta, "spec": spec})
    return out


def preset_slices(preset: str | NodePreset, node_name: str, generation: int = 1, **overrides: Any) -> list[dict]:
    """:func:`nvidia_slices` for a node of ``preset`` (a key of :data:`PRESETS` or a :class:`NodePreset`);
    ``overrides`` replace the preset's fields (``consumable_shares="memory"``, ``mig_enabled=False``...)."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    extra = {k: overrides.pop(k) for k in ("node_uid", "driver_version", "cuda_driver_version", "memory_mib",
                                           "split_counters") if k in overrides}
    p = replace(p, **overrides)
    return nvidia_slices(node_name, p.gpus, p.product, mig_profiles=p.dynamic_mig, generation=generation,
                         mig_enabled=p.mig_enabled, consumable_shares=p.consumable_shares, bus_ids=p.bus_ids,
                         numa_nodes=p.numa_nodes, pcie_roots=p.pcie_roots, **extra)


def _class(name: str, expression: str, extended: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": expression}}]}
    if extended:
        spec["extendedResourceName"] = extended
    return {"apiVersion": API_VERSION, "kind": "DeviceClass", "metadata": {"name": name}, "spec": spec}


def nvidia_device_classes(gpus: bool = True, compute_domains: bool = True) -> list[dict[str, Any]]:
    """The DeviceClasses of the driver's Helm chart with its default values (``resources.gpus.enabled`` and
    ``resources.computeDomains.enabled`` both true), rendered for ``resource.k8s.io/v1`` (where the GPU class
    also names the extended resource ``nvidia.com/gpu``)."""
    out = []
    if gpus:
        out += [
            _class("gpu.nvidia.com",
                   "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
                   "nvidia.com/gpu"),
            _class("mig.nvidia.com",
                   "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"),
            _class("vfio.gpu.nvidia.com",
                   "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'vfio'"),
        ]
    if compute_domains:
        out += [
            _class("compute-domain-daemon.nvidia.com",
                   "device.driver == 'compute-domain.nvidia.com' && "
                   "device.attributes['compute-domain.nvidia.com'].type == 'daemon'"),
            _class("compute-domain-default-channel.nvidia.com",
                   "device.driver == 'compute-domain.nvidia.com' && "
                   "device.attributes['compute-domain.nvidia.com'].type == 'channel' && "
                   "device.attributes['compute-domain.nvidia.com'].id == 0"),
        ]
    return out
