"""Health transitions on the fake backend: XID 79 and back after a reset, application XIDs ignored, ECC,
row remapping, a lost GPU, throttling, and the GpuHealthy condition."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.agent.backend import GpuEvent
from gpupool.agent.fake import FakeBackend
from gpupool.agent.health import HealthTracker, condition, driver_failure_condition, throttle_names, xid_message
from gpupool.agent.report import GpuHealth
from gpupool.k8s.telemetry import APPLICATION_XIDS

ROOT = Path(__file__).parents[1]
REFERENCE = ROOT / "../shared/reference/nvml-h200/nvml.json"
RECORDING = REFERENCE if REFERENCE.exists() else ROOT / "tests/data/agent/nvml-h200.json"
DGX = ROOT / "examples/agent/dgx-h100.yaml"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def node(clock):
    return FakeBackend.from_file(DGX, clock=clock)


@pytest.fixture
def h200(clock):
    return FakeBackend.from_nvml_recording(RECORDING, clock=clock)


def step(tracker: HealthTracker, backend: FakeBackend) -> dict[str, GpuHealth]:
    return tracker.observe(backend.sample(), backend.events(0))


def test_defaults_ignore_application_xids():
    assert HealthTracker().ignore_xids == APPLICATION_XIDS == frozenset({13, 31, 43, 45, 68})


def test_recorded_h200_is_healthy(h200, clock):
    t = HealthTracker(clock)
    [h] = step(t, h200).values()
    assert h == GpuHealth("GPU-00000000-1111-2222-3333-444444444444", True, "", "", 0, 1000.0)
    assert t.condition().status == "True"


def test_xid79_unhealthy_then_reset_healthy(node, clock):
    t = HealthTracker(clock)
    uuid = node.device(3).uuid
    assert all(h.healthy for h in step(t, node).values())
    clock.t = 1010.0
    node.xid(3, 79)
    health = step(t, node)
    assert health[uuid] == GpuHealth(uuid, False, "FellOffTheBus", "XID 79: GPU has fallen off the bus", 79, 1010.0)
    assert sum(not h.healthy for h in health.values()) == 1
    cond = t.condition()
    assert (cond.type, cond.status, cond.reason) == ("GpuHealthy", "False", "GpuUnhealthy")
    assert f"GPU 3 ({uuid}) FellOffTheBus" in cond.message and "XID 79" in cond.message
    clock.t = 1020.0
    assert not step(t, node)[uuid].healthy  # sticky: no reset yet
    assert t.health()[uuid].since == 1010.0
    clock.t = 1030.0
    node.reset(3)
    health = step(t, node)
    assert health[uuid].healthy and health[uuid].reason == "" and health[uuid].since == 1030.0
    assert t.condition().reason == "AllGpusHealthy"


def test_reset_event_alone_makes_healthy(node, clock):
    t = HealthTracker(clock)
    uuid = node.device(0).uuid
    step(t, node)
    t.observe(events=[GpuEvent(uuid, "xid", 48, 1001.0)])
    assert t.health()[uuid].reason == "XidError" and "double-bit ECC" in t.health()[uuid].message
    t.observe(events=[GpuEvent(uuid, "reset", 0, 1002.0)])
    assert t.health()[uuid].healthy


@pytest.mark.parametrize("code", sorted(APPLICATION_XIDS))
def test_application_xids_are_ignored(node, clock, code):
    t = HealthTracker(clock)
    node.xid(2, code)
    assert step(t, node)[node.device(2).uuid].healthy


@pytest.mark.parametrize("code,reason", [(48, "XidError"), (63, "XidError"), (64, "XidError"), (74, "XidError"),
                                         (92, "XidError"), (94, "XidError"), (95, "XidError"),
                                         (79, "FellOffTheBus"), (999, "XidError")])
def test_device_xids_mark_unhealthy(node, clock, code, reason):
    t = HealthTracker(clock)
    node.xid(1, code)
    h = step(t, node)[node.device(1).uuid]
    assert (h.healthy, h.reason, h.xid) == (False, reason, code)
    assert h.message.startswith(f"XID {code}")


def test_custom_ignore_list(node, clock):
    t = HealthTracker(clock, ignore_xids=(13, 31, 43, 45, 68, 94))
    node.xid(1, 94)
    assert step(t, node)[node.device(1).uuid].healthy


def test_first_fault_keeps_its_reason(node, clock):
    t = HealthTracker(clock)
    node.xid(0, 74)
    node.xid(0, 79)
    assert step(t, node)[node.device(0).uuid].xid == 74


def test_ecc_count_rising_then_rebaselined_by_reset(h200, clock):
    t = HealthTracker(clock)
    uuid = h200.device(0).uuid
    assert step(t, h200)[uuid].healthy
    h200.set_sample(0, ecc_volatile_uncorrected=3)
    h = step(t, h200)[uuid]
    assert (h.healthy, h.reason) == (False, "EccUncorrectable") and "3" in h.message
    h200.set_sample(0, ecc_volatile_uncorrected=2)
    assert not step(t, h200)[uuid].healthy  # sticky until reset
    h200.reset(0)
    assert step(t, h200)[uuid].healthy
    # a GPU whose counter did not clear: the reading after the reset is the new baseline
    h200.set_sample(0, ecc_volatile_uncorrected=5)
    t.observe(events=[GpuEvent(uuid, "reset", 0, 2000.0)])
    assert step(t, h200)[uuid].healthy
    h200.set_sample(0, ecc_volatile_uncorrected=6)
    assert step(t, h200)[uuid].reason == "EccUncorrectable"


def test_ecc_count_present_at_start_counts(h200, clock):
    h200.set_sample(0, ecc_volatile_uncorrected=1)
    assert step(HealthTracker(clock), h200)[h200.device(0).uuid].reason == "EccUncorrectable"


def test_double_bit_ecc_event(h200, clock):
    t = HealthTracker(clock)
    uuid = h200.device(0).uuid
    h200.inject(GpuEvent(uuid, "ecc_dbe"))
    assert step(t, h200)[uuid].reason == "EccUncorrectable"


def test_row_remap_pending_until_reset_and_failure(h200, clock):
    t = HealthTracker(clock)
    uuid = h200.device(0).uuid
    h200.set_sample(0, remapped_rows=(0, 1, 1, 0))
    h = step(t, h200)[uuid]
    assert (h.healthy, h.reason) == (False, "RowRemapPending") and "reset" in h.message
    assert step(t, h200)[uuid].reason == "RowRemapPending"
    t.observe()  # an observation without readings changes nothing
    assert t.health()[uuid].reason == "RowRemapPending"
    h200.reset(0)  # the fake clears pending remaps on reset, as the GPU does
    assert step(t, h200)[uuid].healthy
    h200.set_sample(0, remapped_rows=(0, 8, 0, 1))
    h = step(t, h200)[uuid]
    assert (h.healthy, h.reason) == (False, "RowRemapFailure")
    h200.reset(0)
    assert step(t, h200)[uuid].reason == "RowRemapFailure"  # a reset does not repair a failed remap


def test_retired_pages_pending_on_older_gpus(h200, clock):
    h200.set_sample(0, retired_pages_pending=True)
    assert step(HealthTracker(clock), h200)[h200.device(0).uuid].reason == "RetiredPagesPending"


def test_lost_gpu_until_reset(node, clock):
    t = HealthTracker(clock)
    uuid = node.device(5).uuid
    node.lose(5)
    h = step(t, node)[uuid]
    assert (h.healthy, h.reason) == (False, "FellOffTheBus") and "GPU_IS_LOST" in h.message
    node.reset(5)
    assert step(t, node)[uuid].healthy


def test_throttling_is_noted_not_unhealthy(node, clock):
    t = HealthTracker(clock)
    uuid = node.device(2).uuid
    node.set_sample(2, throttle_reasons=0x40 | 0x1)
    h = step(t, node)[uuid]
    assert (h.healthy, h.reason) == (True, "ThermalThrottle") and "HW thermal slowdown" in h.message
    cond = t.condition()
    assert (cond.status, cond.reason) == ("True", "AllGpusHealthy")
    assert f"GPU 2 ({uuid}) ThermalThrottle" in cond.message
    node.set_sample(2, throttle_reasons=0x4)  # SW power cap: normal
    assert step(t, node)[uuid] == GpuHealth(uuid, True, "", "", 0, 1000.0)
    for bits in (0x8, 0x20, 0x80):
        node.set_sample(2, throttle_reasons=bits)
        assert step(t, node)[uuid].reason == "ThermalThrottle"
    node.xid(2, 79)  # a fault outranks throttling
    assert step(t, node)[uuid].reason == "FellOffTheBus"


def test_condition_messages():
    assert condition({}).status == "Unknown"
    hs = {"GPU-a": GpuHealth("GPU-a", False, "XidError", "XID 48: double-bit ECC error", 48, 1.0),
          "GPU-b": GpuHealth("GPU-b", True), "GPU-c": GpuHealth("GPU-c", False, "FellOffTheBus", "lost", 79, 1.0)}
    c = condition(hs, {"GPU-a": 1, "GPU-b": 0, "GPU-c": 2})
    assert (c.type, c.status, c.reason) == ("GpuHealthy", "False", "GpuUnhealthy")
    assert c.message.startswith("2 of 3 GPUs unhealthy: GPU 1 (GPU-a) XidError: XID 48")
    assert c.message.index("GPU 1") < c.message.index("GPU 2 (GPU-c) FellOffTheBus")
    assert "GPU GPU-a" in condition(hs).message  # no index known: the UUID alone
    api = c.to_api("2026-01-01T00:00:00Z")
    assert api["reason"] == "GpuUnhealthy" and api["status"] == "False"
    d = driver_failure_condition("nvmlInit: NVMLError_DriverNotLoaded: Driver Not Loaded")
    assert (d.status, d.reason) == ("Unknown", "NvmlUnavailable") and "Driver Not Loaded" in d.message


def test_helpers():
    assert xid_message(79) == "XID 79: GPU has fallen off the bus"
    assert "catalogue" in xid_message(12345)
    assert throttle_names(0x41) == ["GPU idle", "HW thermal slowdown"]


def test_driver_failure_on_the_fake(node):
    node.fail_driver("NVML: Driver Not Loaded")
    from gpupool.agent.backend import BackendError

    with pytest.raises(BackendError):
        node.sample()
