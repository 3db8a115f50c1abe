"""Per-GPU health from a backend's samples and events, and the node condition ``GpuHealthy``.

:class:`HealthTracker` turns :class:`~gpupool.agent.backend.GpuSample` readings and
:class:`~gpupool.agent.backend.GpuEvent` driver events into one :class:`~gpupool.k8s.objects.agent_report.GpuHealth` per
GPU. Rules (sources: NVIDIA "XID Errors" catalogue, docs.nvidia.com/deploy/xid-errors; "GPU Memory Error
Management" / row remapping, docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt; the k8s-device-plugin's health
check, which marks a GPU unhealthy on every critical XID except the application ones):

* **XID** (an ``xid`` event) other than ``ignore_xids`` (default
  :data:`gpupool.k8s.telemetry.APPLICATION_XIDS` = 13, 31, 43, 45, 68: caused by the application, the GPU is
  fine) -> unhealthy, reason ``XidError`` (``FellOffTheBus`` for XID 79), message ``XID <n>: <meaning>``.
  Sticky until a ``reset`` event.
* **Double-bit ECC** (an ``ecc_dbe`` event) or the volatile uncorrectable ECC count above its baseline ->
  ``EccUncorrectable``, sticky until a reset. The baseline is 0 (NVML's volatile counters start at 0 when the
  driver loads or the GPU resets, so a count left from before the agent started still counts); after a reset
  event the baseline is the next reading.
* **Row remapping** (Ampere and later): ``failed`` > 0 -> ``RowRemapFailure`` (the GPU needs service: NVIDIA
  advises field diagnostics / RMA); ``pending`` > 0 -> ``RowRemapPending`` (a remap waits for a GPU reset).
  Both read from each sample: they end when the GPU reports them cleared. Older GPUs: retired pages pending ->
  ``RetiredPagesPending``.
* **Lost** (``lost`` in a sample, NVML ``GPU_IS_LOST``) -> ``FellOffTheBus``, sticky until a reset.
* **Throttling**: hardware slowdown, hardware thermal slowdown, software thermal slowdown or hardware power
  brake (``nvmlClocksEventReason*`` bits 0x8, 0x40, 0x20, 0x80) -> the GPU stays **healthy** with reason
  ``ThermalThrottle`` and a message naming the bits: it is slow, not broken, and a scheduler that excluded
  throttled GPUs would empty a hot rack. Software power capping (0x4) and idle (0x1) are normal, not noted.
* A ``reset`` event clears what is sticky; the next samples decide afresh.
* **Events for GPUs not on this node** are ignored (logged once per UUID): the tracker knows the node's GPUs
  from :meth:`HealthTracker.set_devices` (the agent calls it after each discovery; ``devices=`` at
  construction) and from the samples it has seen. An event naming a MIG device counts for its GPU. A tracker
  that knows no GPU yet (never told, never sampled) takes events as they come.

The first fault found wins the reason; ``since`` is when the GPU's (healthy, reason) last changed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from ..k8s.objects.agent_report import COND_GPU_HEALTHY, Condition, GpuHealth
from ..k8s.telemetry import APPLICATION_XIDS
from .backend import GpuDevice, GpuEvent, GpuSample

__all__ = ["THROTTLE_BITS", "THROTTLE_NOTED", "XID_MEANINGS", "HealthTracker", "condition", "driver_failure_condition",
           "throttle_names", "xid_message"]

XID_MEANINGS: dict[int, str] = {
    13: "graphics engine exception (usually the application)",
    31: "GPU memory page fault (usually the application)",
    43: "GPU stopped processing (the application)",
    45: "preemptive cleanup after a previous error",
    48: "double-bit ECC error",
    61: "internal micro-controller breakpoint/warning",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded (reset the GPU to apply it)",
    64: "ECC page retirement or row remapping failed",
    68: "video processor exception (NVDEC)",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained uncorrectable ECC error (the affected application must restart)",
    95: "uncontained uncorrectable ECC error (every application on the GPU is affected; reset the GPU)",
    109: "context switch timeout",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
"""What NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors) says the common XIDs mean, shortened."""

log = logging.getLogger("gpupool.agent.health")

THROTTLE_BITS: dict[int, str] = {
    0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "SW power cap", 0x8: "HW slowdown",
    0x10: "sync boost", 0x20: "SW thermal slowdown", 0x40: "HW thermal slowdown", 0x80: "HW power brake slowdown",
    0x100: "display clock setting",
}
"""``nvmlClocksEventReason*`` bits (``nvml.h``) and their names."""

THROTTLE_NOTED = 0x8 | 0x20 | 0x40 | 0x80
"""Bits noted as ``ThermalThrottle``: HW slowdown, SW/HW thermal slowdown, HW power brake."""


def xid_message(code: int) -> str:
    """``"XID 79: GPU has fallen off the bus"``."""
    meaning = XID_MEANINGS.get(code)
    return f"XID {code}: {meaning}" if meaning else f"XID {code} (see NVIDIA's XID catalogue)"


def throttle_names(mask: int) -> list[str]:
    """Names of the set bits of a clock-event reasons mask."""
    return [name for bit, name in THROTTLE_BITS.items() if mask & bit]


@dataclass
class _State:
    index: int = -1
    sticky: GpuHealth | None = None  # fault kept until a reset event
    ecc_baseline: int | None = 0
    current: GpuHealth | None = None


class HealthTracker:
    """Keeps each GPU's health across observations. ``clock``: seconds since the epoch (``time.time``), used
    where an event or sample carries no time; ``ignore_xids``: XIDs that leave a GPU healthy; ``devices``:
    the node's GPUs (:class:`GpuDevice` objects or UUIDs; see :meth:`set_devices`)."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 ignore_xids: Iterable[int] = APPLICATION_XIDS,
                 devices: Iterable[GpuDevice | str] | None = None) -> None:
        self.clock = clock
        self.ignore_xids = frozenset(ignore_xids)
        self._gpus: dict[str, _State] = {}
        self._devices: set[str] = set()  # GPU UUIDs of this node (discovery)
        self._parent: dict[str, str] = {}  # MIG device UUID -> its GPU's UUID
        self._warned: set[str] = set()
        self.ignored_events = 0  # events for a UUID not on this node
        if devices is not None:
            self.set_devices(devices)

    def set_devices(self, devices: Iterable[GpuDevice | str]) -> None:
        """The node's GPUs as discovered (:class:`GpuDevice` objects, whose MIG devices count for them, or
        GPU UUIDs): events for other UUIDs are ignored from now on."""
        uuids: set[str] = set()
        parent: dict[str, str] = {}
        for d in devices:
            if isinstance(d, str):
                uuids.add(d)
                continue
            uuids.add(d.uuid)
            for m in getattr(d, "mig_instances", ()) or ():
                if m.uuid:
                    parent[m.uuid] = d.uuid
        self._devices, self._parent = uuids, parent

    def _state(self, uuid: str) -> _State:
        return self._gpus.setdefault(uuid, _State())

    def _event_uuid(self, uuid: str, known: set[str]) -> str | None:
        """The GPU an event's UUID names, or None (logged once) when it is not on this node."""
        uuid = self._parent.get(uuid, uuid)
        if not known or uuid in known:
            return uuid
        self.ignored_events += 1
        if uuid not in self._warned:
            self._warned.add(uuid)
            log.warning("event for GPU %s ignored: not a GPU of this node (%d known)", uuid, len(known))
        return None

    def observe(self, samples: Iterable[GpuSample] = (), events: Iterable[GpuEvent] = ()) -> dict[str, GpuHealth]:
        """Apply events (in time order) then samples; the health of every GPU seen so far, by UUID. Events for
        a UUID that is not among the node's GPUs (:meth:`set_devices`, the samples seen) are ignored."""
        now = self.clock()
        reset: set[str] = set()
        sampled: set[str] = set()
        samples = list(samples)
        known = self._devices | {u for u, st in self._gpus.items() if st.index >= 0} | {s.uuid for s in samples
                                                                                        if s.uuid}
        for ev in sorted(events, key=lambda e: e.time):
            if not ev.uuid:
                continue
            uuid = self._event_uuid(ev.uuid, known)
            if uuid is None:
                continue
            if uuid != ev.uuid:
                ev = GpuEvent(uuid, ev.kind, ev.code, ev.time, ev.detail)
            st = self._state(ev.uuid)
            t = ev.time or now
            if ev.kind == "reset":
                st.sticky = None
                st.ecc_baseline = None  # the next reading
                reset.add(ev.uuid)
            elif ev.kind == "xid":
                if ev.code in self.ignore_xids or st.sticky is not None:
                    continue
                reason = "FellOffTheBus" if ev.code == 79 else "XidError"
                st.sticky = GpuHealth(ev.uuid, False, reason, xid_message(ev.code), ev.code, t)
            elif ev.kind == "ecc_dbe":
                if st.sticky is None:
                    st.sticky = GpuHealth(ev.uuid, False, "EccUncorrectable",
                                          "double-bit (uncorrectable) ECC error event", 0, t)
        for s in samples:
            st = self._state(s.uuid)
            st.index = s.index
            sampled.add(s.uuid)
            t = s.time or now
            if s.lost:
                if st.sticky is None:
                    st.sticky = GpuHealth(s.uuid, False, "FellOffTheBus",
                                          "GPU is lost: NVML answers GPU_IS_LOST (fallen off the bus)", 79, t)
                self._settle(st, s.uuid, None, t)
                continue
            ecc = s.ecc_volatile_uncorrected
            if ecc is not None:
                if st.ecc_baseline is None:
                    st.ecc_baseline = ecc
                elif ecc > st.ecc_baseline and st.sticky is None:
                    st.sticky = GpuHealth(s.uuid, False, "EccUncorrectable",
                                          f"volatile uncorrectable ECC errors: {ecc} (was {st.ecc_baseline})",
                                          0, t)
            self._settle(st, s.uuid, s, t)
        for uuid, st in self._gpus.items():  # GPUs without a reading in this call: events decide
            if uuid not in sampled:
                self._settle(st, uuid, None, now, after_reset=uuid in reset)
        return {uuid: st.current for uuid, st in self._gpus.items() if st.current is not None}

    def _settle(self, st: _State, uuid: str, s: GpuSample | None, t: float, after_reset: bool = False) -> None:
        if st.sticky is not None:
            new = st.sticky
        else:
            new = GpuHealth(uuid, True, "", "", 0, t)
            if s is not None:
                new = _sample_health(uuid, s, t) or new
            elif st.current is not None and not after_reset:
                new = st.current  # no reading and no reset: what the last sample said stands
        old = st.current
        if old is not None and (old.healthy, old.reason, old.message) == (new.healthy, new.reason, new.message):
            return
        if old is not None and (old.healthy, old.reason) == (new.healthy, new.reason):
            new = GpuHealth(new.uuid, new.healthy, new.reason, new.message, new.xid, old.since)
        st.current = new

    def health(self) -> dict[str, GpuHealth]:
        """The last health of every GPU, by UUID."""
        return {uuid: st.current for uuid, st in self._gpus.items() if st.current is not None}

    def indices(self) -> dict[str, int]:
        """UUID -> NVML index, from the samples seen."""
        return {uuid: st.index for uuid, st in self._gpus.items() if st.index >= 0}

    def condition(self) -> Condition:
        """:func:`condition` of the current health."""
        return condition(self.health(), self.indices())


def _sample_health(uuid: str, s: GpuSample, t: float) -> GpuHealth | None:
    rows = s.remapped_rows
    if rows is not None and rows[3] > 0:
        return GpuHealth(uuid, False, "RowRemapFailure",
                         f"row remapping failed ({rows[1]} uncorrectable rows remapped): the GPU needs service", 0, t)
    if rows is not None and rows[2] > 0:
        return GpuHealth(uuid, False, "RowRemapPending", "a row remap is pending: reset the GPU to apply it", 0, t)
    if s.retired_pages_pending:
        return GpuHealth(uuid, False, "RetiredPagesPending", "page retirement pending: reset the GPU", 0, t)
    if s.throttle_reasons & THROTTLE_NOTED:
        names = ", ".join(throttle_names(s.throttle_reasons & THROTTLE_NOTED))
        return GpuHealth(uuid, True, "ThermalThrottle", f"clocks reduced: {names}", 0, t)
    return None


def condition(health: Mapping[str, GpuHealth], index_of: Mapping[str, int] | None = None) -> Condition:
    """Node condition ``GpuHealthy``: True/``AllGpusHealthy`` (throttled GPUs named in the message),
    False/``GpuUnhealthy`` naming each unhealthy GPU by index and UUID with its reason, Unknown/``NoGpus``
    when there is none."""
    index_of = index_of or {}
    if not health:
        return Condition(COND_GPU_HEALTHY, "Unknown", "NoGpus", "no GPU found on this node")

    def name(uuid: str) -> str:
        i = index_of.get(uuid)
        return f"GPU {i} ({uuid})" if i is not None else f"GPU {uuid}"

    order = sorted(health.values(), key=lambda h: (index_of.get(h.uuid, 1 << 30), h.uuid))
    bad = [h for h in order if not h.healthy]
    if bad:
        parts = "; ".join(f"{name(h.uuid)} {h.reason}: {h.message}" for h in bad)
        return Condition(COND_GPU_HEALTHY, "False", "GpuUnhealthy",
                         f"{len(bad)} of {len(health)} GPUs unhealthy: {parts}. The scheduler no longer places "
                         "work on them; reset the GPU (nvidia-smi -r) or reboot, and drain the node if it recurs")
    noted = [h for h in order if h.reason]
    msg = f"all {len(health)} GPUs healthy"
    if noted:
        msg += "; " + "; ".join(f"{name(h.uuid)} {h.reason}: {h.message}" for h in noted)
    return Condition(COND_GPU_HEALTHY, "True", "AllGpusHealthy", msg)


def driver_failure_condition(message: str) -> Condition:
    """``GpuHealthy`` Unknown/``NvmlUnavailable`` when the driver cannot be read (the backend's message)."""
    return Condition(COND_GPU_HEALTHY, "Unknown", "NvmlUnavailable", f"cannot read the GPUs: {message}")
