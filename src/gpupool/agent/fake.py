"""A :class:`~gpupool.agent.backend.GpuBackend` without a GPU: driven by a description, faults injected by tests.

Three ways in:

* :meth:`FakeBackend.from_nvml_recording` reads a recording of NVML answers (the H200 of
  ``../shared/reference/nvml-h200/nvml.json``) and reproduces it exactly: the same devices, MIG profiles and
  readings the real :class:`~gpupool.agent.nvml.NvmlBackend` gives on that machine.
* :meth:`FakeBackend.from_file` (YAML or JSON) / :meth:`FakeBackend.from_dict` read the compact description
  format below, for demos (``examples/agent/dgx-h100.yaml``: 8 x H100 80GB, NVLink all-to-all, one GPU in MIG
  mode) and tests. A file whose top level has ``gpus`` entries with ``cuda_cc`` (an NVML recording) is read as
  a recording.
* :func:`nvml_standin` builds a stand-in ``pynvml`` module that answers from a recording, so the real
  ``NvmlBackend`` code runs on machines without a GPU (tests, ``scripts/gpu-check.sh --dry-run``).

Description format (every key optional except ``gpus``; units as in :mod:`gpupool.agent.backend`)::

    driver: "570.124.06"           # kernel driver version
    cuda_driver: "12.8"            # CUDA version the driver supports ("12.8" or NVML's 12080)
    nvml: "12.570.124.06"
    node: dgx-01                   # seeds the generated UUIDs (default "fake")
    defaults:                      # merged into every GPU entry
      name: NVIDIA H100 80GB HBM3
      memory_mib: 81559
      compute: [9, 0]              # architecture derived from it ("hopper") unless given
      power_limit_w: 700
      mig_profiles:                # what the GPU offers (nvidia-smi mig -lgip)
        - {id: 19, name: 1g.10gb, slices: 1, instances: 7, memory_mib: 9984, sms: 16}
    gpus:
      - count: 4                   # this entry stands for 4 GPUs (indices follow on)
        numa_node: 0
      - index: 4                   # explicit fields: index, uuid, minor, pci_bus_id, numa_node, serial, vbios
        numa_node: 1
        mig:                       # MIG mode and the MIG devices that exist
          enabled: true
          instances:
            - {profile: 3g.40gb, start: 0, size: 4}     # uuid / memory_mib filled in when absent
        sample: {util_gpu: 35, temperature_c: 41}      # any GpuSample field (see below for defaults)
    nvlink: all                    # "all" (all-to-all), or groups of indices: [[0, 1, 2, 3], [4, 5, 6, 7]]
    topology:                      # overrides of the generated matrix ((i, j) -> TOPOLOGY_LEVELS)
      - {gpus: [0, 1], level: SINGLE}

Generated values: UUIDs ``GPU-<uuid5(node/index)>``; PCI bus ids ``00000000:<0x18 + 0x10*index>:00.0``; minor =
index; topology NVLINK inside an NVLink group, else NODE on the same NUMA node, else SYSTEM; samples idle
(0 % utilisation, no memory used, 10 % of the power limit, 35 C, no ECC errors, rows remapped (0, 0, 0, 0),
retired pages None, no throttling).

Test hooks: :meth:`~FakeBackend.inject` (an event), :meth:`~FakeBackend.set_sample`, :meth:`~FakeBackend.lose`
(fell off the bus), :meth:`~FakeBackend.reset` (a ``reset`` event; clears loss, volatile ECC counts and pending
row remaps), :meth:`~FakeBackend.set_mig`, :meth:`~FakeBackend.fail_driver` / :meth:`~FakeBackend.heal_driver`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import threading
import time
import types
import uuid as uuidlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..model import MAX_GPUS_PER_NODE, MAX_MEMORY_MIB
from .backend import (
    TOPOLOGY_LEVELS,
    BackendError,
    DriverInfo,
    GpuDevice,
    GpuEvent,
    GpuSample,
    MigInstance,
    MigProfile,
)

__all__ = ["ARCHITECTURES", "FakeBackend", "architecture_from_compute", "cuda_version", "nvml_standin"]

MIB = 1 << 20

ARCHITECTURES: dict[int, str] = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
                                 8: "ada-lovelace", 9: "hopper", 10: "blackwell", 13: "rubin"}
"""NVML ``nvmlDeviceArchitecture_t`` values (``NVML_DEVICE_ARCH_*``) -> the family names GFD uses."""


def architecture_from_compute(major: int, minor: int) -> str:
    """The GPU family from the compute capability, as GPU Feature Discovery's ``getArchFamily`` has it
    (k8s-device-plugin ``internal/lm/resource.go``): 9.x -> ``hopper``, 8.9 -> ``ada-lovelace``..."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
            12: "blackwell", 13: "rubin"}.get(major, "undefined" if major else "")


def cuda_version(value: int | float | str) -> str:
    """The CUDA driver version as ``"major.minor"``: NVML's integer form (``13000``, i.e. 1000 * major + 10 *
    minor) -> ``"13.0"``; a small integer is a major version (``12`` -> ``"12.0"``); a float (an unquoted YAML
    ``12.8``) or a string ``"12.8"`` is major.minor as written; ``""`` (unknown) passes. ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
        if value >= 1000 and value.is_integer():
            return cuda_version(int(value))
        text = repr(value)
        if not re.fullmatch(r"\d+\.\d+", text):
            raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
        return text
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"CUDA version {value!r}: must not be negative")
        return f"{value // 1000}.{(value % 1000) // 10}" if value >= 1000 else f"{value}.0"
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d{1,9}", text):
            return cuda_version(int(text))
        if text == "" or re.fullmatch(r"\d{1,9}(\.\d{1,9}){1,2}", text):
            return text
    raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")


def _is_error(value: Any) -> bool:
    return isinstance(value, Mapping) and "error" in value


def _ok(value: Any) -> Any:
    """A recorded answer, or None where the recording holds ``{"error": ...}`` (NotSupported)."""
    return None if _is_error(value) else value


def _profile_name(raw: str | bytes) -> str:
    name = raw.decode() if isinstance(raw, bytes) else str(raw)
    return name.removeprefix("MIG ").strip()


class FakeBackend:
    """A node's GPUs from a description; every :class:`GpuBackend` method, plus hooks to change them.

    ``clock``: time source for sample and event times (seconds since the epoch, ``time.time``).
    """

    def __init__(self, driver: DriverInfo, devices: Iterable[GpuDevice],
                 topology: Mapping[tuple[int, int], str] | None = None,
                 samples: Mapping[int, Mapping[str, Any]] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._driver = driver
        self._devices = {d.index: d for d in sorted(devices, key=lambda d: d.index)}
        self._topology = dict(topology) if topology is not None else _default_topology(list(self._devices.values()))
        self._samples: dict[int, dict[str, Any]] = {i: _default_sample(d) for i, d in self._devices.items()}
        for i, fields in (samples or {}).items():
            self._samples[int(i)].update(_sample_fields(fields))
        self._clock = clock
        self._events: list[GpuEvent] = []
        self._cv = threading.Condition()
        self._failure: str | None = None
        self.closed = False

    # -- constructors ----------------------------------------------------------------------------------
    @classmethod
    def from_file(cls, path: str | Path, clock: Callable[[], float] = time.time) -> FakeBackend:
        """A description (``.yaml``/``.yml``/``.json``) or an NVML recording (see the module docstring)."""
        where = f"{path}: not a fake GPU description"
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{where}: not UTF-8 text ({exc})") from None
        try:
            if str(path).endswith((".yaml", ".yml")):
                import yaml

                try:
                    doc = yaml.safe_load(text)
                except yaml.YAMLError as exc:
                    raise ValueError(f"YAML syntax error: {exc}") from None
            else:
                doc = json.loads(text, parse_constant=_no_constant)
        except RecursionError:
            raise ValueError(f"{where}: nested too deeply") from None
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}: expected a mapping with 'gpus', got {type(doc).__name__}")
        try:
            if _looks_recorded(doc):
                return cls.from_recording(doc, clock=clock)
            return cls.from_dict(doc, clock=clock)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        except (KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as exc:
            raise ValueError(f"{where}: {type(exc).__name__}: {exc}") from None

    @classmethod
    def from_nvml_recording(cls, path: str | Path, clock: Callable[[], float] = time.time) -> FakeBackend:
        """The GPUs of an NVML recording (``nvml.json``), as NVML reported them."""
        return cls.from_recording(json.loads(Path(path).read_text()), clock=clock)

    @classmethod
    def from_recording(cls, doc: Mapping[str, Any], clock: Callable[[], float] = time.time) -> FakeBackend:
        """As :meth:`from_nvml_recording`, from the parsed document."""
        driver = DriverInfo(driver=str(doc["driver"]), cuda_driver=cuda_version(doc["cuda_driver"]),
                            nvml=str(doc.get("nvml", "")))
        devices, samples = [], {}
        bus_ids = {g["pci"]["busId"] for g in doc["gpus"]}
        for g in doc["gpus"]:
            devices.append(device_from_recording(g, bus_ids))
            samples[int(g["index"])] = sample_fields_from_recording(g)
        topology = {tuple(map(int, k.split("-"))): v for k, v in (doc.get("topology") or {}).items()}
        fake = cls(driver, devices, topology or None, clock=clock)
        for i, fields in samples.items():
            fake._samples[i] = fields
        return fake

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any], clock: Callable[[], float] = time.time) -> FakeBackend:
        """The compact description format of the module docstring. Every field is checked: ValueError names
        the field (``gpus[2].memory_mib: ...``) on a wrong type, a negative or absurd number (more than
        :data:`~gpupool.model.MAX_GPUS_PER_NODE` GPUs, memory above :data:`~gpupool.model.MAX_MEMORY_MIB`), a
        duplicate index or UUID."""
        if not isinstance(doc, Mapping):
            raise ValueError(f"GPU description: expected a mapping with 'gpus', got {type(doc).__name__}")
        if "gpus" not in doc:
            raise ValueError("GPU description: 'gpus' is required")
        gpus = doc["gpus"]
        if not isinstance(gpus, list | tuple):
            raise ValueError(f"gpus: expected a list of GPU entries, got {_kind(gpus)}")
        node = _text_field(doc.get("node", "fake"), "node")
        defaults = doc.get("defaults")
        if defaults is None:
            defaults = {}
        if not isinstance(defaults, Mapping):
            raise ValueError(f"defaults: expected a mapping of GPU fields, got {_kind(defaults)}")
        entries: list[tuple[dict[str, Any], dict[str, str]]] = []
        for n, raw in enumerate(gpus):
            if not isinstance(raw, Mapping):
                raise ValueError(f"gpus[{n}]: expected a mapping of GPU fields, got {_kind(raw)}")
            entry = {**defaults, **raw}
            names = {k: (f"gpus[{n}].{k}" if k in raw else f"defaults.{k}") for k in entry}
            count = _int(entry.pop("count", 1), names.get("count", "count"), 0, MAX_GPUS_PER_NODE)
            if len(entries) + count > MAX_GPUS_PER_NODE:
                raise ValueError(f"gpus[{n}]: more than {MAX_GPUS_PER_NODE} GPUs in all (the most a node may "
                                 "have)")
            if count > 1 and "uuid" in entry:
                raise ValueError(f"{names['uuid']}: one UUID for {count} GPUs (count)")
            entries.extend((dict(entry), names) for _ in range(count))
        devices, samples = [], {}
        next_index = 0
        seen_index: set[int] = set()
        seen_uuid: dict[str, str] = {}
        for entry, names in entries:
            index = _int(entry.get("index", next_index), names.get("index", "index"), 0, _MAX_INDEX)
            if index in seen_index:
                raise ValueError(f"GPU description: two GPUs with the same index {index}")
            seen_index.add(index)
            next_index = index + 1
            d = _device_from_entry(node, index, entry, names)
            for u, what in [(d.uuid, f"GPU {index}")] + [(m.uuid, f"GPU {index} MIG device") for m in
                                                          d.mig_instances]:
                if u in seen_uuid:
                    raise ValueError(f"gpus: UUID {u!r} of {what} is already that of {seen_uuid[u]}")
                seen_uuid[u] = what
            devices.append(d)
            sample = entry.get("sample")
            if sample is not None:
                samples[index] = _sample_fields(sample, names.get("sample", "sample"))
        by_index = {d.index: d for d in devices}
        groups = _nvlink_groups(doc.get("nvlink"), sorted(by_index))
        for group in groups:
            for i in group:
                peers = tuple(by_index[j].pci_bus_id for j in group if j != i)
                by_index[i] = dataclasses.replace(by_index[i], nvlink_peers=peers)
        topology = _default_topology(list(by_index.values()))
        overrides = doc.get("topology") or []
        if not isinstance(overrides, list | tuple):
            raise ValueError(f"topology: expected a list of {{gpus: [i, j], level: ...}}, got {_kind(overrides)}")
        for n, override in enumerate(overrides):
            where = f"topology[{n}]"
            if not isinstance(override, Mapping):
                raise ValueError(f"{where}: expected a mapping {{gpus: [i, j], level: ...}}, got {_kind(override)}")
            pair = override.get("gpus")
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise ValueError(f"{where}.gpus: expected two GPU indices, got {pair!r}")
            i, j = sorted(_int(x, f"{where}.gpus", 0, _MAX_INDEX) for x in pair)
            if i == j or i not in by_index or j not in by_index:
                raise ValueError(f"{where}.gpus: {list(pair)} are not two GPUs of this description")
            level = str(_text_field(override.get("level"), f"{where}.level")).upper()
            if level not in TOPOLOGY_LEVELS:
                raise ValueError(f"GPU description: topology level {level!r} is not one of {TOPOLOGY_LEVELS}")
            topology[(i, j)] = level
        try:
            cuda = cuda_version(doc.get("cuda_driver", "12.8"))
        except ValueError as exc:
            raise ValueError(f"cuda_driver: {exc}") from None
        driver = DriverInfo(driver=_text_field(doc.get("driver", "570.124.06"), "driver"), cuda_driver=cuda,
                            nvml=_text_field(doc.get("nvml", ""), "nvml"))
        return cls(driver, by_index.values(), topology, samples, clock=clock)

    # -- GpuBackend ------------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._failure is not None:
            raise BackendError(self._failure)
        if self.closed:
            raise BackendError("NVML is shut down (FakeBackend closed)")

    def driver(self) -> DriverInfo:
        self._check()
        return self._driver

    def devices(self) -> list[GpuDevice]:
        self._check()
        return list(self._devices.values())

    def topology(self) -> dict[tuple[int, int], str]:
        self._check()
        return dict(self._topology)

    def sample(self) -> list[GpuSample]:
        self._check()
        now = self._clock()
        out = []
        for i, d in self._devices.items():
            fields = self._samples[i]
            if fields.get("lost"):
                out.append(GpuSample(index=i, uuid=d.uuid, time=now, lost=True))
            else:
                out.append(GpuSample(index=i, uuid=d.uuid, time=now, **fields))
        return out

    def events(self, timeout_s: float) -> list[GpuEvent]:
        self._check()
        with self._cv:
            if not self._events and timeout_s > 0:
                self._cv.wait(timeout_s)
            self._check()
            out, self._events = self._events, []
        return out

    def close(self) -> None:
        self.closed = True

    # -- test hooks ------------------------------------------------------------------------------------
    def device(self, index: int) -> GpuDevice:
        """The GPU of that index (KeyError if none)."""
        return self._devices[index]

    def inject(self, event: GpuEvent) -> None:
        """Queue a driver event (``time`` filled from the clock when 0); wakes a waiting :meth:`events`."""
        if not event.time:
            event = dataclasses.replace(event, time=self._clock())
        with self._cv:
            self._events.append(event)
            self._cv.notify_all()

    def xid(self, index: int, code: int, detail: str = "") -> None:
        """Shorthand: inject XID ``code`` on GPU ``index``."""
        self.inject(GpuEvent(uuid=self._devices[index].uuid, kind="xid", code=code, detail=detail))

    def set_sample(self, index: int, **fields: Any) -> None:
        """Change GPU ``index``'s readings (any :class:`GpuSample` field but index/uuid/time)."""
        self._samples[index].update(_sample_fields(fields))

    def lose(self, index: int) -> None:
        """GPU ``index`` fell off the bus: its samples read ``lost=True`` until :meth:`reset`."""
        self._samples[index]["lost"] = True

    def reset(self, index: int) -> None:
        """GPU ``index`` was reset: found again, volatile ECC counts and pending row remaps cleared, and a
        ``reset`` event queued."""
        s = self._samples[index]
        s["lost"] = False
        if s.get("ecc_volatile_uncorrected") is not None:
            s["ecc_volatile_uncorrected"] = 0
        rows = s.get("remapped_rows")
        if rows is not None:
            s["remapped_rows"] = (rows[0], rows[1], 0, rows[3])
        if s.get("retired_pages_pending") is not None:
            s["retired_pages_pending"] = False
        self.inject(GpuEvent(uuid=self._devices[index].uuid, kind="reset"))

    def set_mig(self, index: int, enabled: bool,
                instances: Iterable[MigInstance | Mapping[str, Any]] = ()) -> None:
        """Switch GPU ``index``'s MIG mode and set its MIG devices (profile names among its ``mig_profiles``)."""
        d = self._devices[index]
        made = _mig_instances(d, instances) if enabled else ()
        self._devices[index] = dataclasses.replace(d, mig_enabled=enabled, mig_instances=made)

    def fail_driver(self, message: str = "NVML: Driver Not Loaded") -> None:
        """From now on every call raises :class:`BackendError` with ``message`` (a wait in events() too)."""
        self._failure = message
        with self._cv:
            self._cv.notify_all()

    def heal_driver(self) -> None:
        """Undo :meth:`fail_driver`."""
        self._failure = None


# -- description helpers -------------------------------------------------------------------------------
_SAMPLE_FIELDS = {f.name for f in dataclasses.fields(GpuSample)} - {"index", "uuid", "time"}


_MAX_INDEX = 1023
"""Largest GPU index (or minor number) a description may give."""

_SAMPLE_KINDS: dict[str, tuple[str, float, float]] = {
    "util_gpu": ("float", 0, 100), "util_memory": ("float", 0, 100),
    "memory_used_mib": ("int", 0, MAX_MEMORY_MIB), "memory_free_mib": ("int", 0, MAX_MEMORY_MIB),
    "power_w": ("float", 0, 1e6), "temperature_c": ("float", -273.15, 1000),
    "ecc_volatile_uncorrected": ("int", 0, 2**63), "remapped_rows": ("rows", 0, 2**31),
    "retired_pages_pending": ("bool", 0, 0), "throttle_reasons": ("int", 0, 2**64 - 1), "lost": ("bool", 0, 0),
}
"""How each :class:`GpuSample` field is checked: kind, lowest, highest."""


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "a number",
            float: "a number", type(None): "nothing"}.get(type(value), type(value).__name__) + \
        (f" ({value!r})" if isinstance(value, bool | int | float | str | list) and len(repr(value)) < 40 else "")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a GPU description may hold")


def _int(value: Any, where: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``; a whole finite float or a string of digits is accepted."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{where}: expected a whole number, got {_kind(value)}")
    if isinstance(value, str):
        if not re.fullmatch(r"\s*-?\d{1,20}\s*", value):
            raise ValueError(f"{where}: expected a whole number, got {_kind(value)}")
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
        raise ValueError(f"{where}: expected a number, got {_kind(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    if not low <= value <= high:
        raise ValueError(f"{where}: {value:g} is out of range ({low:g} .. {high:g})")
    return value


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {_kind(value)}")
    return value


def _text_field(value: Any, where: str, max_len: int = 1024) -> str:
    """A scalar as text (a YAML number or string); a mapping, list or nothing is refused."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError(f"{where}: expected text, got {_kind(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: expected text, got {value!r}")
    text = str(value)
    if len(text) > max_len:
        raise ValueError(f"{where}: longer than {max_len} characters")
    return text


def _sample_fields(fields: Mapping[str, Any], where: str = "sample") -> dict[str, Any]:
    """GpuSample fields, checked (type and range; None where the field may be unsupported)."""
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: expected a mapping of GpuSample fields, got {_kind(fields)}")
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
            out[key] = _int(value, w, int(low), int(high))
        elif kind == "bool":
            out[key] = _bool(value, w)
        elif kind == "rows":
            if not isinstance(value, list | tuple) or len(value) != 4:
                raise ValueError(f"{w}: expected [correctable, uncorrectable, pending, failed], got {_kind(value)}")
            out[key] = tuple(_int(x, w, int(low), int(high)) for x in value)
        else:
            out[key] = value
    return out


def _default_sample(d: GpuDevice) -> dict[str, Any]:
    return {"util_gpu": 0.0, "util_memory": 0.0, "memory_used_mib": 0, "memory_free_mib": d.memory_mib,
            "power_w": round(d.power_limit_w * 0.1, 3), "temperature_c": 35.0, "ecc_volatile_uncorrected": 0,
            "remapped_rows": (0, 0, 0, 0), "retired_pages_pending": None, "throttle_reasons": 0, "lost": False}


def _looks_recorded(doc: Mapping[str, Any]) -> bool:
    gpus = doc.get("gpus")
    return isinstance(gpus, list) and bool(gpus) and isinstance(gpus[0], Mapping) and "cuda_cc" in gpus[0]


def _profiles(raw: Any, where: str = "mig_profiles") -> tuple[MigProfile, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{where}: expected a list of profiles, got {_kind(raw)}")
    out = []
    for n, p in enumerate(raw):
        if isinstance(p, MigProfile):
            out.append(p)
            continue
        w = f"{where}[{n}]"
        if not isinstance(p, Mapping):
            raise ValueError(f"{w}: expected a mapping {{id, name, slices, instances, memory_mib}}, got {_kind(p)}")
        for key in ("id", "name", "slices", "instances", "memory_mib"):
            if key not in p:
                raise ValueError(f"{w}.{key}: required")
        out.append(MigProfile(id=_int(p["id"], f"{w}.id", 0, 2**31),
                              name=_profile_name(_text_field(p["name"], f"{w}.name")),
                              slices=_int(p["slices"], f"{w}.slices", 1, 64),
                              instances=_int(p["instances"], f"{w}.instances", 0, 64),
                              memory_mib=_int(p["memory_mib"], f"{w}.memory_mib", 0, MAX_MEMORY_MIB),
                              sms=_int(p.get("sms", 0), f"{w}.sms", 0, 1 << 20)))
    return tuple(out)


def _mig_instances(d: GpuDevice, raw: Iterable[MigInstance | Mapping[str, Any]],
                   where: str = "mig.instances") -> tuple[MigInstance, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise ValueError(f"{where}: expected a list of MIG devices, got {_kind(raw)}")
    profiles = {p.name: p for p in d.mig_profiles}
    out = []
    for n, m in enumerate(raw):
        if not isinstance(m, MigInstance):
            w = f"{where}[{n}]"
            if not isinstance(m, Mapping):
                raise ValueError(f"{w}: expected a mapping {{profile, start, size}}, got {_kind(m)}")
            if "profile" not in m:
                raise ValueError(f"{w}.profile: required")
            name = _text_field(m["profile"], f"{w}.profile")
            p = profiles.get(name)
            uuid = m.get("uuid", "")
            m = MigInstance(profile=name, start=_int(m.get("start", 0), f"{w}.start", 0, 63),
                            size=_int(m.get("size", p.slices if p else 1), f"{w}.size", 1, 64),
                            uuid=_text_field(uuid, f"{w}.uuid") if uuid is not None else "",
                            memory_mib=_int(m.get("memory_mib", p.memory_mib if p else 0), f"{w}.memory_mib", 0,
                                            MAX_MEMORY_MIB))
        if m.profile not in profiles and profiles:
            raise ValueError(f"GPU {d.index}: MIG profile {m.profile!r} not among {sorted(profiles)}")
        if not m.uuid:
            m = dataclasses.replace(m, uuid=f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'{d.uuid}/{n}/{m.start}')}")
        if not m.memory_mib and m.profile in profiles:
            m = dataclasses.replace(m, memory_mib=profiles[m.profile].memory_mib)
        out.append(m)
    return tuple(out)


def _device_from_entry(node: str, index: int, e: Mapping[str, Any],
                       names: Mapping[str, str] | None = None) -> GpuDevice:
    names = names or {}

    def w(key: str) -> str:
        return names.get(key, key)

    compute_raw = e.get("compute", (0, 0))
    if not isinstance(compute_raw, list | tuple) or len(compute_raw) != 2:
        raise ValueError(f"{w('compute')}: expected [major, minor] (such as [9, 0]), got {_kind(compute_raw)}")
    compute = (_int(compute_raw[0], w("compute"), 0, 99), _int(compute_raw[1], w("compute"), 0, 99))
    mig = e.get("mig")
    if mig is None:
        mig = {}
    if not isinstance(mig, Mapping):
        raise ValueError(f"{w('mig')}: expected a mapping {{enabled: true, instances: [...]}}, got {_kind(mig)}")
    uuid = e.get("uuid")
    if uuid is not None:
        uuid = _text_field(uuid, w("uuid"))
        if not uuid.strip():
            raise ValueError(f"{w('uuid')}: empty")
    numa = e.get("numa_node")
    numa = None if numa is None else _int(numa, w("numa_node"), -1, _MAX_INDEX)
    arch = e.get("architecture")
    d = GpuDevice(
        index=index,
        uuid=uuid or f"GPU-{uuidlib.uuid5(uuidlib.NAMESPACE_URL, f'gpupool/{node}/{index}')}",
        name=_text_field(e.get("name", "NVIDIA H100 80GB HBM3"), w("name")),
        memory_mib=_int(e.get("memory_mib", 81559), w("memory_mib"), 0, MAX_MEMORY_MIB),
        minor=_int(e.get("minor", index), w("minor"), -1, _MAX_INDEX),
        compute=compute,
        architecture=_text_field(arch, w("architecture")) if arch else architecture_from_compute(*compute),
        pci_bus_id=_text_field(e.get("pci_bus_id") or f"00000000:{0x18 + 0x10 * index:02X}:00.0", w("pci_bus_id")),
        numa_node=None if numa is None or numa < 0 else numa,
        mig_enabled=_bool(mig.get("enabled", False), f"{w('mig')}.enabled"),
        mig_profiles=_profiles(e.get("mig_profiles"), w("mig_profiles")),
        power_limit_w=_float(e.get("power_limit_w", 0.0), w("power_limit_w"), 0, 1e6),
        serial=_text_field(e.get("serial", ""), w("serial")),
        vbios=_text_field(e.get("vbios", ""), w("vbios")),
    )
    if d.mig_enabled:
        d = dataclasses.replace(d, mig_instances=_mig_instances(d, mig.get("instances") or (),
                                                                f"{w('mig')}.instances"))
    return d


def _nvlink_groups(spec: Any, indices: list[int]) -> list[list[int]]:
    if not spec:
        return []
    if spec == "all":
        return [indices] if len(indices) > 1 else []
    if not isinstance(spec, list | tuple) or not all(isinstance(g, list | tuple) for g in spec):
        raise ValueError(f"nvlink: expected \"all\" or groups of GPU indices ([[0, 1], [2, 3]]), got {_kind(spec)}")
    groups = [[_int(i, f"nvlink[{n}]", 0, _MAX_INDEX) for i in g] for n, g in enumerate(spec)]
    for g in groups:
        if set(g) - set(indices):
            raise ValueError(f"GPU description: nvlink group {g} names GPUs that do not exist")
    return groups


def _default_topology(devices: list[GpuDevice]) -> dict[tuple[int, int], str]:
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
        if _is_error(p):
            continue
        profiles.append(MigProfile(id=int(p["id"]), name=_profile_name(p["name"]), slices=int(p["sliceCount"]),
                                   instances=int(p["instanceCount"]), memory_mib=int(p["memorySizeMB"]),
                                   sms=int(p.get("multiprocessorCount", 0))))
    instances = tuple(MigInstance(profile=_profile_name(m["profile"]), start=int(m["start"]), size=int(m["size"]),
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


def nvml_standin(recording: Mapping[str, Any] | str | Path, base: types.ModuleType | None = None
                 ) -> types.ModuleType:
    """A module that answers like ``pynvml`` from an NVML recording, for running
    :class:`~gpupool.agent.nvml.NvmlBackend` without a GPU.

    Constants and the ``NVMLError*`` classes are those of the real ``pynvml`` (``base``, imported when not
    given), so error handling is exercised as on a GPU: a recorded ``{"error": "NVMLError_NotSupported..."}``
    raises ``NVMLError_NotSupported``. The event set answers ``NVMLError_Timeout`` (the recording's 200 ms poll
    saw none) unless events are queued on ``module.queued_events`` as ``(index, event_type, event_data)``.
    Failures can be forced per function with ``module.fail[name] = error_code``; ``gpus[i]["lost"] = True``
    on ``module.gpus`` makes GPU i answer ``NVMLError_GpuIsLost``.

    Beyond what ``nvml.json`` records, a recording may hold (for multi-GPU and MIG tests): ``gpus[].minor``;
    ``gpus[].mig_instances``: ``[{"profile", "profile_id", "start", "size", "uuid", "memory_mib"}]``;
    ``gpus[].nvlinks``: ``[{"link", "active", "remote_bus_id"}]``; top-level ``topology``:
    ``{"0-1": "NVLINK" | "SINGLE" | ...}`` (what ``nvmlDeviceGetTopologyCommonAncestor`` answers).
    """
    if not isinstance(recording, Mapping):
        recording = json.loads(Path(recording).read_text())
    if base is None:
        import pynvml as base  # noqa: PLC0415 - the real bindings, for their constants and error classes
    nv = types.ModuleType("pynvml_standin")
    for name in dir(base):
        value = getattr(base, name)
        if name.startswith(("NVML_", "nvmlClocks", "nvmlEventType", "NVMLError")) and not callable(value) \
                or name.startswith("NVMLError"):
            setattr(nv, name, value)
    gpus = [dict(g) for g in recording["gpus"]]
    nv.gpus = gpus
    nv.recording = recording
    nv.fail = {}
    nv.queued_events = []
    nv.initialized = 0
    err = base.NVMLError

    def _answer(name: str, value: Any) -> Any:
        if name in nv.fail:
            raise err(nv.fail[name])
        if _is_error(value):
            text = str(value["error"])
            cls_name = text.split(":", 1)[0].strip()
            raise getattr(base, cls_name, None)() if hasattr(base, cls_name) else err(base.NVML_ERROR_UNKNOWN)
        return value

    class Handle:
        def __init__(self, g: dict[str, Any]) -> None:
            self.g = g

    class Pci:
        def __init__(self, busId: str) -> None:  # noqa: N803 - pynvml's field name
            self.busId = busId

    class Struct(types.SimpleNamespace):
        pass

    def fn(name: str):
        def wrap(f):
            def call(*args):
                if name in nv.fail:
                    raise err(nv.fail[name])
                if name not in ("nvmlInit", "nvmlInitWithFlags") and nv.initialized <= 0:
                    raise err(base.NVML_ERROR_UNINITIALIZED)
                return f(*args)
            call.__name__ = name
            setattr(nv, name, call)
            return call
        return wrap

    @fn("nvmlInit")
    def _init():
        nv.initialized += 1

    @fn("nvmlShutdown")
    def _shutdown():
        nv.initialized -= 1

    fn("nvmlSystemGetDriverVersion")(lambda: _answer("driver", recording["driver"]))
    fn("nvmlSystemGetNVMLVersion")(lambda: _answer("nvml", recording.get("nvml", "")))
    fn("nvmlSystemGetCudaDriverVersion")(lambda: _answer("cuda", recording["cuda_driver"]))
    fn("nvmlSystemGetCudaDriverVersion_v2")(lambda: _answer("cuda", recording["cuda_driver"]))
    fn("nvmlDeviceGetCount")(lambda: len(gpus))

    @fn("nvmlDeviceGetHandleByIndex")
    def _handle(i):
        if not 0 <= i < len(gpus):
            raise err(base.NVML_ERROR_INVALID_ARGUMENT)
        if gpus[i].get("lost"):
            raise err(base.NVML_ERROR_GPU_IS_LOST)
        return Handle(gpus[i])

    def dev(name: str, key: str, convert: Callable[[Any], Any] = lambda v: v) -> None:
        def get(h, *_):
            if h.g.get("lost"):
                raise err(base.NVML_ERROR_GPU_IS_LOST)
            if key not in h.g:
                raise err(base.NVML_ERROR_NOT_SUPPORTED)
            return convert(_answer(name, h.g[key]))
        fn(name)(get)

    dev("nvmlDeviceGetName", "name")
    dev("nvmlDeviceGetUUID", "uuid")
    dev("nvmlDeviceGetSerial", "serial")
    dev("nvmlDeviceGetVbiosVersion", "vbios")
    dev("nvmlDeviceGetIndex", "index")
    dev("nvmlDeviceGetMemoryInfo", "memory", lambda m: Struct(total=m["total"], free=m["free"], used=m["used"]))
    dev("nvmlDeviceGetCudaComputeCapability", "cuda_cc", tuple)
    dev("nvmlDeviceGetArchitecture", "arch")
    dev("nvmlDeviceGetPciInfo", "pci", lambda p: Pci(p["busId"].encode()))
    dev("nvmlDeviceGetPciInfo_v3", "pci", lambda p: Pci(p["busId"].encode()))
    dev("nvmlDeviceGetNumaNodeId", "numa")
    dev("nvmlDeviceGetMigMode", "mig_mode", list)
    dev("nvmlDeviceGetMaxMigDeviceCount", "max_mig_devices")
    dev("nvmlDeviceGetEnforcedPowerLimit", "power_limit_mw")
    dev("nvmlDeviceGetPowerManagementLimit", "power_limit_mw")
    dev("nvmlDeviceGetPowerUsage", "power_usage_mw")
    dev("nvmlDeviceGetUtilizationRates", "utilization", lambda u: Struct(gpu=u["gpu"], memory=u["memory"]))
    dev("nvmlDeviceGetRemappedRows", "remapped_rows", tuple)
    dev("nvmlDeviceGetRetiredPagesPendingStatus", "retired_pages_pending")
    dev("nvmlDeviceGetCurrentClocksEventReasons", "throttle_reasons")
    dev("nvmlDeviceGetCurrentClocksThrottleReasons", "throttle_reasons")
    dev("nvmlDeviceGetSupportedEventTypes", "supported_event_types")

    @fn("nvmlDeviceGetMinorNumber")
    def _minor(h):
        return int(h.g.get("minor", h.g["index"]))

    @fn("nvmlDeviceGetTemperature")
    def _temp(h, sensor):
        return _answer("nvmlDeviceGetTemperature", h.g["temperature_c"])

    @fn("nvmlDeviceGetTotalEccErrors")
    def _ecc(h, error_type, counter_type):
        if "ecc_volatile_total" not in h.g:
            raise err(base.NVML_ERROR_NOT_SUPPORTED)
        return _answer("nvmlDeviceGetTotalEccErrors", h.g["ecc_volatile_total"])

    @fn("nvmlDeviceGetGpuInstanceProfileInfo")
    def _profile(h, profile, version=2):
        p = (h.g.get("gpu_instance_profiles") or {}).get(str(profile))
        if p is None:
            raise err(base.NVML_ERROR_NOT_SUPPORTED)
        p = _answer("nvmlDeviceGetGpuInstanceProfileInfo", p)
        return Struct(**{**p, "name": str(p["name"]).encode()})

    def _link(h, link):
        links = {int(x["link"]): x for x in h.g.get("nvlinks") or ()}
        if link not in links:
            raise err(base.NVML_ERROR_NOT_SUPPORTED if not links else base.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    fn("nvmlDeviceGetNvLinkState")(lambda h, link: int(bool(_link(h, link).get("active"))))
    fn("nvmlDeviceGetNvLinkRemotePciInfo")(lambda h, link: Pci(str(_link(h, link)["remote_bus_id"]).encode()))

    @fn("nvmlDeviceGetTopologyCommonAncestor")
    def _common(a, b):
        key = "-".join(str(i) for i in sorted((a.g["index"], b.g["index"])))
        level = (recording.get("topology") or {}).get(key)
        if level is None:
            raise err(base.NVML_ERROR_NOT_SUPPORTED)
        return getattr(base, f"NVML_TOPOLOGY_{'INTERNAL' if level == 'SAME' else level}")

    def _mig(h, i):
        ms = h.g.get("mig_instances") or ()
        if not 0 <= i < len(ms):
            raise err(base.NVML_ERROR_NOT_FOUND)
        m = ms[i]
        mem = int(m.get("memory_mib", 0)) * MIB
        return Handle({"index": h.g["index"], "uuid": m.get("uuid", ""), "mig": m, "gi_id": i + 1,
                       "memory": {"total": mem, "free": mem, "used": 0}})

    fn("nvmlDeviceGetMigDeviceHandleByIndex")(_mig)
    fn("nvmlDeviceGetGpuInstanceId")(lambda m: m.g["gi_id"])

    @fn("nvmlDeviceGetGpuInstanceById")
    def _gi(h, gi_id):
        ms = h.g.get("mig_instances") or ()
        if not 1 <= gi_id <= len(ms):
            raise err(base.NVML_ERROR_NOT_FOUND)
        return Struct(mig=ms[gi_id - 1])

    @fn("nvmlGpuInstanceGetInfo")
    def _gi_info(gi):
        m = gi.mig
        return Struct(id=0, profileId=int(m.get("profile_id", 0)),
                      placement=Struct(start=int(m["start"]), size=int(m["size"])))

    @fn("nvmlEventSetCreate")
    def _es_create():
        return Struct(registered={})

    @fn("nvmlDeviceRegisterEvents")
    def _register(h, types_, es):
        supported = int(h.g.get("supported_event_types", 0))
        if types_ & ~supported:
            raise err(base.NVML_ERROR_NOT_SUPPORTED)
        es.registered[h.g["index"]] = types_

    @fn("nvmlEventSetWait_v2")
    def _wait(es, timeout_ms):
        while nv.queued_events:
            index, etype, edata = nv.queued_events.pop(0)
            if es.registered.get(index, 0) & etype:
                return Struct(device=Handle(gpus[index]), eventType=etype, eventData=edata,
                              gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
        raise err(base.NVML_ERROR_TIMEOUT)

    fn("nvmlEventSetWait")(_wait)
    fn("nvmlEventSetFree")(lambda es: None)
    return nv
