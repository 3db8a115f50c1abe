"""A stand-in ``pynvml`` module that answers from an NVML recording (:func:`nvml_standin`).
Imports :mod:`gpupool.agent.fake.recording` within the package."""

from __future__ import annotations

import json
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpupool.agent.backend import MIB
from gpupool.agent.fake.recording import is_error


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
        if is_error(value):
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
