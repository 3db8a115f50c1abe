"""The description format of :class:`~gpupool.agent.fake.FakeBackend` (see the package docstring) and its
hand-written validators. Imports :mod:`gpupool.agent.fake.recording` within the package."""

from __future__ import annotations

import dataclasses
import math
import re
import uuid as uuidlib
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from gpupool.agent.backend import (
    GpuDevice,
    GpuSample,
    MigInstance,
    MigProfile,
    architecture_from_compute,
)
from gpupool.agent.fake.recording import profile_name
from gpupool.model import MAX_MEMORY_MIB

# -- description helpers -------------------------------------------------------------------------------
_SAMPLE_FIELDS = {f.name for f in dataclasses.fields(GpuSample)} - {"index", "uuid", "time"}


MAX_INDEX = 1023
"""Largest GPU index (or minor number) a description may give."""

_SAMPLE_KINDS: dict[str, tuple[str, float, float]] = {
    "util_gpu": ("float", 0, 100), "util_memory": ("float", 0, 100),
    "memory_used_mib": ("int", 0, MAX_MEMORY_MIB), "memory_free_mib": ("int", 0, MAX_MEMORY_MIB),
    "power_w": ("float", 0, 1e6), "temperature_c": ("float", -273.15, 1000),
    "ecc_volatile_uncorrected": ("int", 0, 2**63), "remapped_rows": ("rows", 0, 2**31),
    "retired_pages_pending": ("bool", 0, 0), "throttle_reasons": ("int", 0, 2**64 - 1), "lost": ("bool", 0, 0),
}
"""How each :class:`GpuSample` field is checked: kind, lowest, highest."""


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid")


_SampleKeys = create_model("_SampleKeys", __base__=_Keys, **{k: (Any, None) for k in sorted(_SAMPLE_FIELDS)})


class _MigProfileKeys(_Keys):
    id: Any = None
    name: Any = None
    slices: Any = None
    instances: Any = None
    memory_mib: Any = None
    sms: Any = None


class _MigInstanceKeys(_Keys):
    profile: Any = None
    start: Any = None
    size: Any = None
    uuid: Any = None
    memory_mib: Any = None


class _MigKeys(_Keys):
    enabled: Any = None
    instances: list[_MigInstanceKeys] | None = None


class _GpuKeys(_Keys):
    """The fields of a GPU entry (``gpus[i]`` and ``defaults``), as :func:`device_from_entry` reads them."""

    count: Any = None
    index: Any = None
    uuid: Any = None
    name: Any = None
    memory_mib: Any = None
    minor: Any = None
    compute: Any = None
    architecture: Any = None
    pci_bus_id: Any = None
    numa_node: Any = None
    power_limit_w: Any = None
    serial: Any = None
    vbios: Any = None
    lost: Any = None  # fell off the bus before it was read (FakeBackend)
    mig: _MigKeys | None = None
    mig_profiles: list[_MigProfileKeys] | None = None
    sample: _SampleKeys | None = None  # type: ignore[valid-type]


class _TopologyKeys(_Keys):
    gpus: Any = None
    level: Any = None


class DescriptionKeys(_Keys):
    """The key schema of the description format (:func:`gpupool.inputs.unknown_keys`): a key not listed here
    (``memory_mb`` for ``memory_mib``) is refused with its line and column and the closest known key. The
    values are checked by the validators of this module."""

    driver: Any = None
    cuda_driver: Any = None
    nvml: Any = None
    node: Any = None
    defaults: _GpuKeys | None = None
    gpus: list[_GpuKeys] | None = None
    nvlink: Any = None
    topology: list[_TopologyKeys] | None = None


def kind_of(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__) + \
        (f" ({value!r})" if isinstance(value, bool | int | float | str | list) and len(repr(value)) < 40 else "")


def no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a GPU description may hold")


def int_value(value: Any, where: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; a whole finite float or a string of digits is accepted."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: expected a whole number, got {kind_of(value)}")
    if isinstance(value, str):
        if not re.fullmatch(r"\s*-?\d{1,20}\s*", value):
            raise ValueError(f"{where}: expected a whole number, got {kind_of(value)}")
        value = int(value)
    elif isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError(f"{where}: expected a whole number, got {value!r}")
        value = int(value)
    if not low <= value <= high:
        raise ValueError(f"{where}: {value} is out of range ({low} .. {high})")
    return value


def _float(value: Any, where: str, low: float, high: float) -> float:
    """``value`` as a finite float in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where}: expected a number, got {kind_of(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    if not low <= value <= high:
        raise ValueError(f"{where}: {value:g} is out of range ({low:g} .. {high:g})")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {kind_of(value)}")
    return value


def text_field(value: Any, where: str, max_len: int = 1024) -> str:
    """A scalar as text (a YAML number or string); a mapping, list or nothing is refused."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{where}: expected text, got {kind_of(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected text, got {value!r}")
    text = str(value)
    if len(text) > max_len:
        raise ValueError(f"{where}: longer than {max_len} characters")
    return text


def sample_fields(fields: Mapping[str, Any], where: str = "sample") -> dict[str, Any]:
    """GpuSample fields, checked (type and range; None where the field may be unsupported)."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a mapping of GpuSample fields, got {kind_of(fields)}")
    unknown = set(fields) - _SAMPLE_FIELDS
    if unknown:
        raise ValueError(f"unknown GpuSample field(s): {sorted(map(str, unknown))}")
    out: dict[str, Any] = {}
    for key, value in fields.items():
        kind, low, high = _SAMPLE_KINDS.get(key, ("any", 0, 0))
        w = f"{where}.{key}"
        if value is None and key not in ("throttle_reasons", "lost"):
            out[key] = None
        elif kind == "float":
            out[key] = _float(value, w, low, high)
        elif kind == "int":
            out[key] = int_value(value, w, int(low), int(high))
        elif kind == "bool":
            out[key] = _bool(value, w)
        elif kind == "rows":
            if not isinstance(value, list | tuple) or len(value) != 4:
                raise ValueError(f"{w}: expected [correctable, uncorrectable, pending, failed], got {kind_of(value)}")
            out[key] = tuple(int_value(x, w, int(low), int(high)) for x in value)
        else:
            out[key] = value
    return out


def default_sample(d: GpuDevice) -> dict[str, Any]:
    return {"util_gpu": 0.0, "util_memory": 0.0, "memory_used_mib": 0, "memory_free_mib": d.memory_mib,
            "power_w": round(d.power_limit_w * 0.1, 3), "temperature_c": 35.0, "ecc_volatile_uncorrected": 0,
            "remapped_rows": (0, 0, 0, 0), "retired_pages_pending": None, "throttle_reasons": 0, "lost": False}


def looks_recorded(doc: Mapping[str, Any]) -> bool:
    gpus = doc.get("gpus")
    return isinstance(gpus, list) and bool(gpus) and isinstance(gpus[0], Mapping) and "cuda_cc" in gpus[0]


def _profiles(raw: Any, where: str = "mig_profiles") -> tuple[MigProfile, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{where}: expected a list of profiles, got {kind_of(raw)}")
    out = []
    for n, p in enumerate(raw):
        if isinstance(p, MigProfile):
            out.append(p)
            continue
        w = f"{where}[{n}]"
        if not isinstance(p, Mapping):
            raise ValueError(f"{w}: expected a mapping {{id, name, slices, instances, memory_mib}}, got {kind_of(p)}")
        for key in ("id", "name", "slices", "instances", "memory_mib"):
            if key not in p:
                raise ValueError(f"{w}.{key}: required")
        out.append(MigProfile(id=int_value(p["id"], f"{w}.id", 0, 2**31),
                              name=profile_name(text_field(p["name"], f"{w}.name")),
                              slices=int_value(p["slices"], f"{w}.slices", 1, 64),
                              instances=int_value(p["instances"], f"{w}.instances", 0, 64),
                              memory_mib=int_value(p["memory_mib"], f"{w}.memory_mib", 0, MAX_MEMORY_MIB),
                              sms=int_value(p.get("sms", 0), f"{w}.sms", 0, 1 << 20)))
    return tuple(out)


def build_mig_instances(d: GpuDevice, raw: Iterable[MigInstance | Mapping[str, Any]],
                        where: str = "mig.instances") -> tuple[MigInstance, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{where}: expected a list of MIG devices, got {kind_of(raw)}")
    profiles = {p.name: p for p in d.mig_profiles}
    out = []
    for n, m in enumerate(raw):
        if not isinstance(m, MigInstance):
            w = f"{where}[{n}]"
            if not isinstance(m, Mapping):
                raise ValueError(f"{w}: expected a mapping {{profile, start, size}}, got {kind_of(m)}")
            if "profile" not in m:
                raise ValueError(f"{w}.profile: required")
            name = text_field(m["profile"], f"{w}.profile")
            p = profiles.get(name)
            uuid = m.get("uuid", "")
            m = MigInstance(profile=name, start=int_value(m.get("start", 0), f"{w}.start", 0, 63),
                            size=int_value(m.get("size", p.slices if p else 1), f"{w}.size", 1, 64),
                            uuid=text_field(uuid, f"{w}.uuid") if uuid is not None else "",
                            memory_mib=int_value(m.get("memory_mib", p.memory_mib if p else 0), f"{w}.memory_mib", 0,
                                                 MAX_MEMORY_MIB))
        if m.profile not in profiles and profiles:
            raise ValueError(f"GPU {d.index}: MIG profile {m.profile!r} not among {sorted(profiles)}")
        if not m.uuid:
            m = dataclasses.replace(m, uuid=f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'{d.uuid}/{n}/{m.start}')}")
        if not m.memory_mib and m.profile in profiles:
            m = dataclasses.replace(m, memory_mib=profiles[m.profile].memory_mib)
        out.append(m)
    return tuple(out)


def device_from_entry(node: str, index: int, e: Mapping[str, Any],
                      names: Mapping[str, str] | None = None) -> GpuDevice:
    names = names or {}

    def w(key: str) -> str:
        return names.get(key, key)

    compute_raw = e.get("compute", (0, 0))
    if not isinstance(compute_raw, list | tuple) or len(compute_raw) != 2:
        raise ValueError(f"{w('compute')}: expected [major, minor] (such as [9, 0]), got {kind_of(compute_raw)}")
    compute = (int_value(compute_raw[0], w("compute"), 0, 99), int_value(compute_raw[1], w("compute"), 0, 99))
    mig = e.get("mig")
    if mig is None:
        mig = {}
    if not isinstance(mig, Mapping):
        raise ValueError(f"{w('mig')}: expected a mapping {{enabled: true, instances: [...]}}, got {kind_of(mig)}")
    uuid = e.get("uuid")
    if uuid is not None:
        uuid = text_field(uuid, w("uuid"))
        if not uuid.strip():
            raise ValueError(f"{w('uuid')}: empty")
    numa = e.get("numa_node")
    numa = None if numa is None else int_value(numa, w("numa_node"), -1, MAX_INDEX)
    arch = e.get("architecture")
    d = GpuDevice(
        index=index,
        uuid=uuid or f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpupool/{node}/{index}')}",
        name=text_field(e.get("name", "NVIDIA H100 80GB HBM3"), w("name")),
        memory_mib=int_value(e.get("memory_mib", 81559), w("memory_mib"), 0, MAX_MEMORY_MIB),
        minor=int_value(e.get("minor", index), w("minor"), -1, MAX_INDEX),
        compute=compute,
        architecture=text_field(arch, w("architecture")) if arch else architecture_from_compute(*compute),
        pci_bus_id=text_field(e.get("pci_bus_id") or f"00000000:{0x18 + 0x10 * index:02X}:00.0", w("pci_bus_id")),
        numa_node=None if numa is None or numa < 0 else numa,
        mig_enabled=_bool(mig.get("enabled", False), f"{w('mig')}.enabled"),
        mig_profiles=_profiles(e.get("mig_profiles"), w("mig_profiles")),
        power_limit_w=_float(e.get("power_limit_w", 0.0), w("power_limit_w"), 0, 1e6),
        serial=text_field(e.get("serial", ""), w("serial")),
        vbios=text_field(e.get("vbios", ""), w("vbios")),
    )
    if d.mig_enabled:
        d = dataclasses.replace(d, mig_instances=build_mig_instances(d, mig.get("instances") or (),
                                                                     f"{w('mig')}.instances"))
    return d


def nvlink_groups(spec: Any, indices: list[int]) -> list[list[int]]:
    if not spec:
        return []
    if spec == "all":
        return [indices] if len(indices) > 1 else []
    if not isinstance(spec, list | tuple) or not all(isinstance(g, list | tuple) for g in spec):
        raise ValueError(f"nvlink: expected \"all\" or groups of GPU indices ([[0, 1], [2, 3]]), got {kind_of(spec)}")
    groups = [[int_value(i, f"nvlink[{n}]", 0, MAX_INDEX) for i in g] for n, g in enumerate(spec)]
    for g in groups:
        if set(g) - set(indices):
            raise ValueError(f"GPU description: nvlink group {g} names GPUs that do not exist")
    return groups


def default_topology(devices: list[GpuDevice]) -> dict[tuple[int, int], str]:
    out = {}
    for a in devices:
        for b in devices:
            if a.index >= b.index:
                continue
            if b.pci_bus_id and b.pci_bus_id in a.nvlink_peers:
                level = "NVLINK"
            elif a.numa_node is not None and a.numa_node == b.numa_node:
                level = "NODE"
            else:
                level = "SYSTEM"
            out[(a.index, b.index)] = level
    return out


