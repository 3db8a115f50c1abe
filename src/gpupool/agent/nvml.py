"""The real :class:`~gpupool.agent.backend.GpuBackend`: NVML through ``nvidia-ml-py`` (the ``pynvml`` module).

Every NVML call goes through :meth:`NvmlBackend._call`: ``NVMLError_NotSupported`` (and, for optional
queries, ``FunctionNotFound`` of an older driver) gives None / nothing; ``NVMLError_GpuIsLost`` marks the GPU
lost in a sample; any other NVML error raises :class:`~gpupool.agent.backend.BackendError` naming the call,
except in a sample's optional readings (temperature, power, ECC...): there an error of one GPU's call gives
None for that field (logged once), and only a driver failure (uninitialised, driver not loaded, library
missing or mismatched) fails the sample. An event whose device's UUID cannot be read is attributed through
``nvmlDeviceGetIndex`` to the UUID discovered for that index.

NVML calls used (``nvml.h``; NVIDIA NVML API reference, "Device Queries", "MIG", "Event Handling"):
``nvmlInit`` / ``nvmlShutdown``, ``nvmlSystemGetDriverVersion`` / ``GetCudaDriverVersion`` /
``GetNVMLVersion``, ``nvmlDeviceGetCount`` / ``GetHandleByIndex`` / ``GetUUID`` / ``GetMinorNumber`` /
``GetName`` / ``GetMemoryInfo`` (bytes) / ``GetCudaComputeCapability`` / ``GetArchitecture`` / ``GetPciInfo`` /
``GetNumaNodeId`` / ``GetEnforcedPowerLimit`` (mW) / ``GetSerial`` / ``GetVbiosVersion``; MIG:
``nvmlDeviceGetMigMode``, ``nvmlDeviceGetGpuInstanceProfileInfo`` (profiles 0 ..
``NVML_GPU_INSTANCE_PROFILE_COUNT``-1), ``nvmlDeviceGetMaxMigDeviceCount`` / ``GetMigDeviceHandleByIndex`` /
``GetGpuInstanceId`` / ``GetGpuInstanceById`` + ``nvmlGpuInstanceGetInfo`` (profile and placement); NVLink:
``nvmlDeviceGetNvLinkState`` / ``GetNvLinkRemotePciInfo`` / ``GetNvLinkRemoteDeviceType`` (links to an
NVSwitch join every switch-attached GPU); topology: ``nvmlDeviceGetTopologyCommonAncestor``; samples:
``GetUtilizationRates`` (%), ``GetPowerUsage`` (mW), ``GetTemperature(NVML_TEMPERATURE_GPU)`` (C),
``GetTotalEccErrors(UNCORRECTED, VOLATILE)``, ``GetRemappedRows``, ``GetRetiredPagesPendingStatus``,
``GetCurrentClocksEventReasons`` (``GetCurrentClocksThrottleReasons`` on older bindings); events:
``nvmlEventSetCreate``, ``nvmlDeviceRegisterEvents(XidCriticalError | DoubleBitEccError)``,
``nvmlEventSetWait_v2`` (``NVMLError_Timeout`` = no event, not an error).
"""

from __future__ import annotations

import importlib
import logging
import time
import types
from collections.abc import Callable
from typing import Any

from .backend import (
    ARCHITECTURES,
    MIB,
    BackendError,
    DriverInfo,
    GpuDevice,
    GpuEvent,
    GpuSample,
    MigInstance,
    MigProfile,
    architecture_from_compute,
    cuda_version,
)

__all__ = ["NvmlBackend", "load_pynvml"]

_TOPOLOGY = {0: "SAME", 10: "SINGLE", 20: "MULTIPLE", 30: "HOSTBRIDGE", 40: "NODE", 50: "SYSTEM"}
"""``nvmlGpuTopologyLevel_t`` -> :data:`~gpupool.agent.backend.TOPOLOGY_LEVELS` (INTERNAL = the same board)."""

_INVALID_GI = 0xFFFFFFFF

_NODE_ERRORS = ("NVML_ERROR_UNINITIALIZED", "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_LIBRARY_NOT_FOUND",
                "NVML_ERROR_LIB_RM_VERSION_MISMATCH")
"""NVML errors that mean the driver, not one GPU's sensor, cannot be read: a sample fails on them."""

log = logging.getLogger("gpupool.agent.nvml")


class _Missing(Exception):
    """NotSupported (or an optional call absent): the caller substitutes None."""


def load_pynvml() -> types.ModuleType:
    """The ``pynvml`` module of ``nvidia-ml-py``; BackendError when not installed."""
    try:
        return importlib.import_module("pynvml")
    except ImportError as e:  # pragma: no cover - a dependency of the package
        raise BackendError(f"nvidia-ml-py (pynvml) is not installed: {e}") from e


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlBackend:
    """NVML on this machine. ``nvml``: the ``pynvml`` module, or a stand-in with the same functions
    (:func:`gpupool.agent.fake.nvml_standin`); ``clock``: time of samples and events (``time.time``).

    Construction runs ``nvmlInit`` (BackendError when no driver / library: the message says which);
    :meth:`close` runs ``nvmlShutdown``.
    """

    def __init__(self, nvml: types.ModuleType | None = None, clock: Callable[[], float] = time.time) -> None:
        self.nv = nvml if nvml is not None else load_pynvml()
        self._clock = clock
        self._uuids: dict[int, str] = {}
        self._known: dict[int, GpuDevice] = {}  # last read of each GPU, kept for one that is lost later
        self._event_set: Any = None
        self._registered: set[int] = set()
        self._field_errors: set[tuple[int, str]] = set()  # (index, call) whose error was logged
        self._lost_warned: set[int] = set()  # GPUs found lost before they were read (logged once)
        self._open = False
        self._call("nvmlInit")
        self._open = True

    # -- calls -----------------------------------------------------------------------------------------
    def _call(self, name: str, *args: Any, optional: bool = False) -> Any:
        """``pynvml.<name>(*args)``; when ``optional``, NotSupported / FunctionNotFound / a missing binding
        raise :class:`_Missing`; any other NVML error (NotSupported of a required call too) raises
        BackendError naming the call."""
        nv = self.nv
        fn = getattr(nv, name, None)
        if fn is None:
            if optional:
                raise _Missing(name)
            raise BackendError(f"{name}: not in this pynvml")
        try:
            return fn(*args)
        except nv.NVMLError as e:
            value = getattr(e, "value", None)
            if optional and value in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                raise _Missing(name) from e
            raise BackendError(f"{name}: {e.__class__.__name__}: {e}") from e

    def _maybe(self, name: str, *args: Any) -> Any:
        """As :meth:`_call`, None where NotSupported."""
        try:
            return self._call(name, *args, optional=True)
        except _Missing:
            return None

    def _is(self, exc: BaseException, code_name: str) -> bool:
        cause = exc.__cause__
        return isinstance(cause, self.nv.NVMLError) and getattr(cause, "value", None) == getattr(self.nv, code_name)

    def _handle(self, index: int) -> Any:
        return self._call("nvmlDeviceGetHandleByIndex", index)

    # -- GpuBackend ------------------------------------------------------------------------------------
    def driver(self) -> DriverInfo:
        driver = _text(self._call("nvmlSystemGetDriverVersion"))
        cuda = self._maybe("nvmlSystemGetCudaDriverVersion")
        nvml = self._maybe("nvmlSystemGetNVMLVersion")
        return DriverInfo(driver=driver, cuda_driver=cuda_version(int(cuda)) if cuda is not None else "",
                          nvml=_text(nvml) if nvml is not None else "")

    def count(self) -> int:
        """How many GPUs NVML sees."""
        return int(self._call("nvmlDeviceGetCount"))

    def devices(self) -> list[GpuDevice]:
        """Every GPU the driver counts, by index; a GPU lost since an earlier read is listed as then read, one
        lost before it was ever read as ``lost=True`` with what can still be read of it (:meth:`_unreadable`):
        never left out, so that the node's report names it."""
        out = []
        switch_attached: set[int] = set()
        for i in range(self.count()):
            try:
                dev, via_switch = self._device(i)
            except BackendError as e:
                if not self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                    raise
                if i not in self._known:
                    out.append(self._unreadable(i))  # counted by the driver, never read: lost, not absent
                    continue
                dev, via_switch = self._known[i], False  # as last read; its samples say lost
            self._known[i] = dev
            self._lost_warned.discard(i)
            out.append(dev)
            if via_switch:
                switch_attached.add(i)
        if len(switch_attached) > 1:  # NVSwitch fabric: every switch-attached GPU reaches every other
            bus = {d.index: d.pci_bus_id for d in out}
            out = [d if d.index not in switch_attached else _with_peers(
                d, tuple(dict.fromkeys(d.nvlink_peers + tuple(bus[j] for j in sorted(switch_attached)
                                                             if j != d.index))))
                   for d in out]
        return out

    def _unreadable(self, index: int) -> GpuDevice:
        """GPU ``index`` as far as a lost GPU answers: its UUID and PCI bus id when its handle still gives
        them, else ``""``; ``lost=True``."""
        uuid = bus = ""
        try:
            h = self._handle(index)
        except BackendError:
            h = None
        if h is not None:
            try:
                uuid = _text(self._call("nvmlDeviceGetUUID", h))
            except BackendError:
                pass
            try:
                pci = self._maybe("nvmlDeviceGetPciInfo", h)
                bus = _text(pci.busId) if pci is not None else ""
            except BackendError:
                pass
        if uuid:
            self._uuids[index] = uuid
        if index not in self._lost_warned:
            self._lost_warned.add(index)
            log.warning("GPU %d is counted by the driver but lost (NVML_ERROR_GPU_IS_LOST) before it was read%s",
                        index, f" ({uuid})" if uuid else "")
        return GpuDevice(index=index, uuid=uuid, name="", memory_mib=0, pci_bus_id=bus, lost=True)

    def _device(self, index: int) -> tuple[GpuDevice, bool]:
        nv = self.nv
        h = self._handle(index)
        uuid = _text(self._call("nvmlDeviceGetUUID", h))
        self._uuids[index] = uuid
        mem = self._call("nvmlDeviceGetMemoryInfo", h)
        cc = self._maybe("nvmlDeviceGetCudaComputeCapability", h) or (0, 0)
        arch = self._maybe("nvmlDeviceGetArchitecture", h)
        arch_name = ARCHITECTURES.get(int(arch), "") if arch is not None else ""
        pci = self._maybe("nvmlDeviceGetPciInfo", h)
        mig_mode = self._maybe("nvmlDeviceGetMigMode", h)
        mig_enabled = bool(mig_mode) and int(mig_mode[0]) == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1)
        profiles = self._mig_profiles(h)
        limit = self._maybe("nvmlDeviceGetEnforcedPowerLimit", h)
        peers, via_switch = self._nvlinks(h)
        numa = self._maybe("nvmlDeviceGetNumaNodeId", h)
        minor = self._maybe("nvmlDeviceGetMinorNumber", h)
        dev = GpuDevice(
            index=index, uuid=uuid, name=_text(self._call("nvmlDeviceGetName", h)),
            memory_mib=int(mem.total) // MIB, minor=-1 if minor is None else int(minor),
            compute=(int(cc[0]), int(cc[1])),
            architecture=arch_name or architecture_from_compute(int(cc[0]), int(cc[1])),
            pci_bus_id=_text(pci.busId) if pci is not None else "",
            numa_node=None if numa is None or int(numa) < 0 else int(numa),
            mig_enabled=mig_enabled, mig_profiles=profiles,
            mig_instances=self._mig_instances(h, profiles) if mig_enabled else (),
            nvlink_peers=peers, power_limit_w=(int(limit) / 1000.0) if limit is not None else 0.0,
            serial=_text(self._maybe("nvmlDeviceGetSerial", h) or ""),
            vbios=_text(self._maybe("nvmlDeviceGetVbiosVersion", h) or ""),
        )
        return dev, via_switch

    def _mig_profiles(self, h: Any) -> tuple[MigProfile, ...]:
        nv = self.nv
        out: dict[int, MigProfile] = {}
        for p in range(int(getattr(nv, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
            try:
                info = self._call("nvmlDeviceGetGpuInstanceProfileInfo", h, p, optional=True)
            except _Missing:
                continue
            except BackendError as e:  # a profile index this GPU does not know
                if self._is(e, "NVML_ERROR_INVALID_ARGUMENT") or self._is(e, "NVML_ERROR_NOT_FOUND"):
                    continue
                raise
            if int(info.id) in out:
                continue
            out[int(info.id)] = MigProfile(id=int(info.id), name=_text(info.name).removeprefix("MIG ").strip(),
                                           slices=int(info.sliceCount), instances=int(info.instanceCount),
                                           memory_mib=int(info.memorySizeMB), sms=int(info.multiprocessorCount))
        return tuple(out.values())

    def _mig_instances(self, h: Any, profiles: tuple[MigProfile, ...]) -> tuple[MigInstance, ...]:
        by_id = {p.id: p for p in profiles}
        n = self._maybe("nvmlDeviceGetMaxMigDeviceCount", h) or 0
        out = []
        for i in range(int(n)):
            try:
                m = self._call("nvmlDeviceGetMigDeviceHandleByIndex", h, i, optional=True)
            except _Missing:
                continue
            except BackendError as e:
                if self._is(e, "NVML_ERROR_NOT_FOUND") or self._is(e, "NVML_ERROR_INVALID_ARGUMENT"):
                    continue  # no MIG device in this slot
                raise
            uuid = _text(self._call("nvmlDeviceGetUUID", m))
            gi_id = self._call("nvmlDeviceGetGpuInstanceId", m)
            info = self._call("nvmlGpuInstanceGetInfo", self._call("nvmlDeviceGetGpuInstanceById", h, gi_id))
            p = by_id.get(int(info.profileId))
            memory = p.memory_mib if p else int(self._call("nvmlDeviceGetMemoryInfo", m).total) // MIB
            out.append(MigInstance(profile=p.name if p else f"profile-{int(info.profileId)}",
                                   start=int(info.placement.start), size=int(info.placement.size),
                                   uuid=uuid, memory_mib=memory))
        return tuple(out)

    def _nvlinks(self, h: Any) -> tuple[tuple[str, ...], bool]:
        nv = self.nv
        peers: list[str] = []
        via_switch = False
        for link in range(int(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                active = self._call("nvmlDeviceGetNvLinkState", h, link, optional=True)
            except _Missing:
                break  # no NVLink on this GPU
            except BackendError as e:
                if self._is(e, "NVML_ERROR_INVALID_ARGUMENT") or self._is(e, "NVML_ERROR_NOT_FOUND"):
                    break  # past its last link
                raise
            if not active:
                continue
            kind = self._maybe("nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
            if kind is not None and int(kind) == getattr(nv, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2):
                via_switch = True
                continue
            remote = self._maybe("nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            if remote is not None:
                bus = _text(remote.busId)
                if bus not in peers:
                    peers.append(bus)
        return tuple(peers), via_switch

    def topology(self) -> dict[tuple[int, int], str]:
        """NVLINK where the GPUs share an NVLink, else ``nvmlDeviceGetTopologyCommonAncestor``'s level
        (SYSTEM where NVML does not say or a GPU is lost). Reads the devices again."""
        devs = self.devices()
        handles = {}
        for d in devs:
            try:
                handles[d.index] = self._handle(d.index)
            except BackendError as e:
                if not self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                    raise
        out = {}
        for a in devs:
            for b in devs:
                if a.index >= b.index:
                    continue
                if b.pci_bus_id and b.pci_bus_id in a.nvlink_peers:
                    out[(a.index, b.index)] = "NVLINK"
                    continue
                if a.index not in handles or b.index not in handles:
                    out[(a.index, b.index)] = "SYSTEM"
                    continue
                level = self._maybe("nvmlDeviceGetTopologyCommonAncestor", handles[a.index], handles[b.index])
                out[(a.index, b.index)] = "SYSTEM" if level is None else _TOPOLOGY.get(int(level), "SYSTEM")
        return out

    def sample(self) -> list[GpuSample]:
        now = self._clock()
        out = []
        for i in range(self.count()):
            try:
                out.append(self._sample(i, now))
            except BackendError as e:
                if not self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                    raise
                out.append(GpuSample(index=i, uuid=self._uuids.get(i, ""), time=now, lost=True))
        return out

    def _sample(self, i: int, now: float) -> GpuSample:
        nv = self.nv
        h = self._handle(i)
        uuid = self._uuids.get(i) or _text(self._call("nvmlDeviceGetUUID", h))
        self._uuids[i] = uuid
        util = self._reading(i, "nvmlDeviceGetUtilizationRates", h)
        mem = self._reading(i, "nvmlDeviceGetMemoryInfo", h)
        power = self._reading(i, "nvmlDeviceGetPowerUsage", h)
        temp = self._reading(i, "nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
        ecc = self._reading(i, "nvmlDeviceGetTotalEccErrors", h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                            nv.NVML_VOLATILE_ECC)
        rows = self._reading(i, "nvmlDeviceGetRemappedRows", h)
        retired = self._reading(i, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        reasons = self._reading(i, "nvmlDeviceGetCurrentClocksEventReasons", h) \
            if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons") \
            else self._reading(i, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        return GpuSample(
            index=i, uuid=uuid, time=now,
            util_gpu=None if util is None else float(util.gpu),
            util_memory=None if util is None else float(util.memory),
            memory_used_mib=None if mem is None else int(mem.used) // MIB,
            memory_free_mib=None if mem is None else int(mem.free) // MIB,
            power_w=None if power is None else int(power) / 1000.0,
            temperature_c=None if temp is None else float(temp),
            ecc_volatile_uncorrected=None if ecc is None else int(ecc),
            remapped_rows=None if rows is None else tuple(int(x) for x in rows),  # type: ignore[arg-type]
            retired_pages_pending=None if retired is None else bool(retired),
            throttle_reasons=int(reasons or 0),
        )

    def _reading(self, index: int, name: str, *args: Any) -> Any:
        """An optional reading of GPU ``index`` for a sample: None where NotSupported, and None (logged once
        until it answers again) on any other error of that one call; only a lost GPU
        (``NVML_ERROR_GPU_IS_LOST``) or a driver failure (:data:`_NODE_ERRORS`) raises, failing the sample."""
        try:
            value = self._maybe(name, *args)
        except BackendError as e:
            if any(hasattr(self.nv, code) and self._is(e, code) for code in ("NVML_ERROR_GPU_IS_LOST", *_NODE_ERRORS)):
                raise
            if (index, name) not in self._field_errors:
                self._field_errors.add((index, name))
                log.warning("GPU %d: %s (the reading is left out until it answers)", index, e)
            return None
        self._field_errors.discard((index, name))
        return value

    def _events_ready(self) -> Any:
        nv = self.nv
        if self._event_set is None:
            self._event_set = self._call("nvmlEventSetCreate")
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        for i in range(self.count()):
            if i in self._registered:
                continue
            try:
                h = self._handle(i)
                supported = self._maybe("nvmlDeviceGetSupportedEventTypes", h)
                kinds = wanted if supported is None else wanted & int(supported)
                if kinds:
                    self._call("nvmlDeviceRegisterEvents", h, kinds, self._event_set, optional=True)
            except _Missing:
                pass
            except BackendError as e:
                if self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                    continue  # a lost GPU: its loss shows in samples; try again next time
                raise
            self._registered.add(i)
        return self._event_set

    def events(self, timeout_s: float) -> list[GpuEvent]:
        """XID and double-bit ECC events: waits up to ``timeout_s`` for the first, then takes what else is
        queued. A timeout is no error; a GPU lost while waiting gives no event (its samples say ``lost``)."""
        nv = self.nv
        es = self._events_ready()
        out: list[GpuEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = self._call("nvmlEventSetWait_v2", es, wait_ms)
            except BackendError as e:
                if self._is(e, "NVML_ERROR_TIMEOUT") or self._is(e, "NVML_ERROR_GPU_IS_LOST"):
                    return out
                raise
            wait_ms = 0
            uuid = self._event_uuid(data.device)
            etype = int(data.eventType)
            gi = int(getattr(data, "gpuInstanceId", _INVALID_GI))
            detail = f"gpu instance {gi}" if gi != _INVALID_GI else ""
            if etype & nv.nvmlEventTypeXidCriticalError:
                out.append(GpuEvent(uuid=uuid, kind="xid", code=int(data.eventData), time=self._clock(),
                                    detail=detail))
            elif etype & nv.nvmlEventTypeDoubleBitEccError:
                out.append(GpuEvent(uuid=uuid, kind="ecc_dbe", time=self._clock(), detail=detail))

    def _event_uuid(self, handle: Any) -> str:
        """The UUID of an event's device; where it cannot be read (the GPU is failing), the UUID discovered
        for its index (``nvmlDeviceGetIndex``); ``""`` when neither answers."""
        try:
            return _text(self._call("nvmlDeviceGetUUID", handle))
        except BackendError as e:
            error = str(e)
        try:
            index = int(self._call("nvmlDeviceGetIndex", handle))
        except (BackendError, TypeError, ValueError) as e:
            log.warning("event on a device whose UUID and index cannot be read: %s; %s", error, e)
            return ""
        uuid = self._uuids.get(index) or (self._known[index].uuid if index in self._known else "")
        if not uuid:
            log.warning("event on GPU %d, whose UUID was never read: %s", index, error)
        return uuid

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        if self._event_set is not None:
            try:
                self._call("nvmlEventSetFree", self._event_set)
            except BackendError:
                pass
            self._event_set = None
        self._call("nvmlShutdown")

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _with_peers(d: GpuDevice, peers: tuple[str, ...]) -> GpuDevice:
    import dataclasses

    return dataclasses.replace(d, nvlink_peers=peers)
