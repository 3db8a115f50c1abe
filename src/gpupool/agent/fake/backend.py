"""``FakeBackend``: a :class:`~gpupool.agent.backend.GpuBackend` without a GPU, faults injected by tests.
Imports :mod:`gpupool.agent.fake.description` and :mod:`gpupool.agent.fake.recording` within the package."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpupool.agent.backend import (
    TOPOLOGY_LEVELS,
    BackendError,
    DriverInfo,
    GpuDevice,
    GpuEvent,
    GpuSample,
    MigInstance,
    cuda_version,
)
from gpupool.agent.fake.description import (
    MAX_INDEX,
    DescriptionKeys,
    build_mig_instances,
    default_sample,
    default_topology,
    device_from_entry,
    int_value,
    kind_of,
    looks_recorded,
    no_constant,
    nvlink_groups,
    sample_fields,
    text_field,
)
from gpupool.agent.fake.recording import device_from_recording, sample_fields_from_recording
from gpupool.inputs import load_yaml, unknown_keys
from gpupool.model import MAX_GPUS_PER_NODE


class FakeBackend:
    """A node's GPUs from a description; every :class:`GpuBackend` method, plus hooks to change them.

    ``clock``: time source for sample and event times (seconds since the epoch, ``time.time``);
    ``unreadable``: indices of GPUs that fell off the bus before the agent first read them (see :meth:`lose`).
    """

    def __init__(self, driver: DriverInfo, devices: Iterable[GpuDevice],
                 topology: Mapping[tuple[int, int], str] | None = None,
                 samples: Mapping[int, Mapping[str, Any]] | None = None,
                 clock: Callable[[], float] = time.time, unreadable: Iterable[int] = ()) -> None:
        self._driver = driver
        self._devices = {d.index: d for d in sorted(devices, key=lambda d: d.index)}
        self._topology = dict(topology) if topology is not None else default_topology(list(self._devices.values()))
        self._samples: dict[int, dict[str, Any]] = {i: default_sample(d) for i, d in self._devices.items()}
        for i, fields in (samples or {}).items():
            self._samples[int(i)].update(sample_fields(fields))
        self._clock = clock
        self._unreadable: set[int] = set()
        for i in unreadable:
            self.lose(int(i), unreadable=True)
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
        if str(path).endswith((".yaml", ".yml")):
            doc = load_yaml(text, str(path), ValueError)  # one line: FILE:LINE:COLUMN: invalid YAML: what
        else:
            try:
                doc = json.loads(text, parse_constant=no_constant)
            except RecursionError:
                raise ValueError(f"{where}: nested too deeply") from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        if not isinstance(doc, Mapping):
            raise ValueError(f"{where}: expected a mapping with 'gpus', got {type(doc).__name__}")
        if not looks_recorded(doc):
            unknown_keys(doc, DescriptionKeys, str(path), text, ValueError)
        try:
            if looks_recorded(doc):
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
        unknown_keys(doc, DescriptionKeys, "GPU description", error=ValueError)
        if "gpus" not in doc:
            raise ValueError("GPU description: 'gpus' is required")
        gpus = doc["gpus"]
        if not isinstance(gpus, list | tuple):
            raise ValueError(f"gpus: expected a list of GPU entries, got {kind_of(gpus)}")
        node = text_field(doc.get("node", "fake"), "node")
        defaults = doc.get("defaults")
        if defaults is None:
            defaults = {}
        if not isinstance(defaults, Mapping):
            raise ValueError(f"defaults: expected a mapping of GPU fields, got {kind_of(defaults)}")
        entries: list[tuple[dict[str, Any], dict[str, str]]] = []
        for n, raw in enumerate(gpus):
            if not isinstance(raw, Mapping):
                raise ValueError(f"gpus[{n}]: expected a mapping of GPU fields, got {kind_of(raw)}")
            entry = {**defaults, **raw}
            names = {k: (f"gpus[{n}].{k}" if k in raw else f"defaults.{k}") for k in entry}
            count = int_value(entry.pop("count", 1), names.get("count", "count"), 0, MAX_GPUS_PER_NODE)
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
        unreadable: set[int] = set()
        for entry, names in entries:
            index = int_value(entry.get("index", next_index), names.get("index", "index"), 0, MAX_INDEX)
            if index in seen_index:
                raise ValueError(f"GPU description: two GPUs with the same index {index}")
            seen_index.add(index)
            next_index = index + 1
            lost = entry.pop("lost", False)
            if not isinstance(lost, bool):
                raise ValueError(f"{names.get('lost', 'lost')}: expected true or false, got {kind_of(lost)}")
            if lost:
                unreadable.add(index)
            d = device_from_entry(node, index, entry, names)
            for u, what in [(d.uuid, f"GPU {index}")] + [(m.uuid, f"GPU {index} MIG device") for m in
                                                          d.mig_instances]:
                if u in seen_uuid:
                    raise ValueError(f"gpus: UUID {u!r} of {what} is already that of {seen_uuid[u]}")
                seen_uuid[u] = what
            devices.append(d)
            sample = entry.get("sample")
            if sample is not None:
                samples[index] = sample_fields(sample, names.get("sample", "sample"))
        by_index = {d.index: d for d in devices}
        groups = nvlink_groups(doc.get("nvlink"), sorted(by_index))
        for group in groups:
            for i in group:
                peers = tuple(by_index[j].pci_bus_id for j in group if j != i)
                by_index[i] = dataclasses.replace(by_index[i], nvlink_peers=peers)
        topology = default_topology(list(by_index.values()))
        overrides = doc.get("topology") or []
        if not isinstance(overrides, list | tuple):
            raise ValueError(f"topology: expected a list of {{gpus: [i, j], level: ...}}, got {kind_of(overrides)}")
        for n, override in enumerate(overrides):
            where = f"topology[{n}]"
            if not isinstance(override, Mapping):
                raise ValueError(f"{where}: expected a mapping {{gpus: [i, j], level: ...}}, got {kind_of(override)}")
            pair = override.get("gpus")
            if not isinstance(pair, list | tuple) or len(pair) != 2:
                raise ValueError(f"{where}.gpus: expected two GPU indices, got {pair!r}")
            i, j = sorted(int_value(x, f"{where}.gpus", 0, MAX_INDEX) for x in pair)
            if i == j or i not in by_index or j not in by_index:
                raise ValueError(f"{where}.gpus: {list(pair)} are not two GPUs of this description")
            level = str(text_field(override.get("level"), f"{where}.level")).upper()
            if level not in TOPOLOGY_LEVELS:
                raise ValueError(f"GPU description: topology level {level!r} is not one of {TOPOLOGY_LEVELS}")
            topology[(i, j)] = level
        try:
            cuda = cuda_version(doc.get("cuda_driver", "12.8"))
        except ValueError as exc:
            raise ValueError(f"cuda_driver: {exc}") from None
        driver = DriverInfo(driver=text_field(doc.get("driver", "570.124.06"), "driver"), cuda_driver=cuda,
                            nvml=text_field(doc.get("nvml", ""), "nvml"))
        return cls(driver, by_index.values(), topology, samples, clock=clock, unreadable=unreadable)

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
        """Every GPU; one lost before it was read (:meth:`lose` with ``unreadable``) as NVML gives it then:
        ``lost=True``, its index only."""
        self._check()
        return [GpuDevice(index=i, uuid="", name="", memory_mib=0, lost=True) if i in self._unreadable else d
                for i, d in self._devices.items()]

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
                out.append(GpuSample(index=i, uuid="" if i in self._unreadable else d.uuid, time=now, lost=True))
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
        self._samples[index].update(sample_fields(fields))

    def lose(self, index: int, unreadable: bool = False) -> None:
        """GPU ``index`` fell off the bus: its samples read ``lost=True`` until :meth:`reset`. ``unreadable``:
        it fell off before the agent first read it (a restart, a reboot with the GPU dead): the driver still
        counts it, but :meth:`devices` gives only its index (``lost=True``, no UUID) and its samples no UUID,
        as :class:`~gpupool.agent.nvml.NvmlBackend` does for a GPU that answers ``NVML_ERROR_GPU_IS_LOST``.
        A description says so with ``lost: true`` in the GPU's entry."""
        self._samples[index]["lost"] = True
        if unreadable:
            self._unreadable.add(index)

    def reset(self, index: int) -> None:
        """GPU ``index`` was reset: found again, volatile ECC counts and pending row remaps cleared, and a
        ``reset`` event queued."""
        s = self._samples[index]
        s["lost"] = False
        self._unreadable.discard(index)
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
        made = build_mig_instances(d, instances) if enabled else ()
        self._devices[index] = dataclasses.replace(d, mig_enabled=enabled, mig_instances=made)

    def fail_driver(self, message: str = "NVML: Driver Not Loaded") -> None:
        """From now on every call raises :class:`BackendError` with ``message`` (a wait in events() too)."""
        self._failure = message
        with self._cv:
            self._cv.notify_all()

    def heal_driver(self) -> None:
        """Undo :meth:`fail_driver`."""
        self._failure = None


