"""NVML recordings (``nvml.json``): a recorded GPU as :class:`~gpupool.agent.backend.GpuDevice` and its sample.
Imports no other module of :mod:`gpupool.agent.fake`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpupool.agent.backend import (
    ARCHITECTURES,
    MIB,
    GpuDevice,
    MigInstance,
    MigProfile,
    architecture_from_compute,
)


def is_error(value: Any) -> bool:
    return isinstance(value, Mapping) and "error" in value


def _ok(value: Any) -> Any:
    """A recorded answer, or None where the recording holds ``{"error": ...}`` (NotSupported)."""
    return None if is_error(value) else value


def profile_name(raw: str | bytes) -> str:
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    return name.removeprefix("MIG ").strip()


# -- NVML recordings -----------------------------------------------------------------------------------
def device_from_recording(g: Mapping[str, Any], bus_ids: Iterable[str] = ()) -> GpuDevice:
    """One GPU of a recording (``nvml.json``'s ``gpus[]``) as :class:`GpuDevice`. A recording without
    ``minor`` gives minor = index (``nvidia-smi -q`` of the H200 reads minor number 0 for GPU 0)."""
    cc = tuple(int(x) for x in g["cuda_cc"])
    arch = _ok(g.get("arch"))
    numa = _ok(g.get("numa"))
    mig_mode = _ok(g.get("mig_mode"))
    profiles = []
    for _key, p in sorted((g.get("gpu_instance_profiles") or {}).items(), key=lambda kv: int(kv[0])):
        if is_error(p):
            continue
        profiles.append(MigProfile(id=int(p["id"]), name=profile_name(p["name"]), slices=int(p["sliceCount"]),
                                   instances=int(p["instanceCount"]), memory_mib=int(p["memorySizeMB"]),
                                   sms=int(p.get("multiprocessorCount", 0))))
    instances = tuple(MigInstance(profile=profile_name(m["profile"]), start=int(m["start"]), size=int(m["size"]),
                                  uuid=str(m.get("uuid", "")), memory_mib=int(m.get("memory_mib", 0)))
                      for m in g.get("mig_instances") or ())
    peers = tuple(str(link["remote_bus_id"]) for link in g.get("nvlinks") or ()
                  if link.get("active") and link.get("remote_bus_id"))
    peers = tuple(dict.fromkeys(peers))  # several links to one peer: once
    limit = _ok(g.get("power_limit_mw"))
    return GpuDevice(
        index=int(g["index"]), uuid=str(g["uuid"]), name=str(g["name"]),
        memory_mib=int(g["memory"]["total"]) // MIB,
        minor=int(g.get("minor", g["index"])),
        compute=(cc[0], cc[1]),
        architecture=ARCHITECTURES.get(int(arch), "") if arch is not None else architecture_from_compute(*cc),
        pci_bus_id=str(g["pci"]["busId"]),
        numa_node=None if numa is None else int(numa),
        mig_enabled=bool(mig_mode and int(mig_mode[0]) == 1),
        mig_profiles=tuple(profiles), mig_instances=instances, nvlink_peers=peers,
        power_limit_w=(limit / 1000.0) if limit is not None else 0.0,
        serial=str(_ok(g.get("serial")) or ""), vbios=str(_ok(g.get("vbios")) or ""),
    )


def sample_fields_from_recording(g: Mapping[str, Any]) -> dict[str, Any]:
    """The readings of one recorded GPU as :class:`GpuSample` fields (NotSupported -> None)."""
    util = _ok(g.get("utilization")) or {}
    mem = g.get("memory") or {}
    power = _ok(g.get("power_usage_mw"))
    rows = _ok(g.get("remapped_rows"))
    retired = _ok(g.get("retired_pages_pending"))
    ecc = _ok(g.get("ecc_volatile_total"))
    temp = _ok(g.get("temperature_c"))
    return {
        "util_gpu": None if util.get("gpu") is None else float(util["gpu"]),
        "util_memory": None if util.get("memory") is None else float(util["memory"]),
        "memory_used_mib": None if mem.get("used") is None else int(mem["used"]) // MIB,
        "memory_free_mib": None if mem.get("free") is None else int(mem["free"]) // MIB,
        "power_w": None if power is None else power / 1000.0,
        "temperature_c": None if temp is None else float(temp),
        "ecc_volatile_uncorrected": None if ecc is None else int(ecc),
        "remapped_rows": None if rows is None else tuple(int(x) for x in rows),
        "retired_pages_pending": None if retired is None else bool(retired),
        "throttle_reasons": int(_ok(g.get("throttle_reasons")) or 0),
        "lost": False,
    }

