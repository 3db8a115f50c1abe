"""The GPU backends: FakeBackend reproduces the recorded H200, NvmlBackend (over a stand-in pynvml answering
from the same recording) yields the same, and the fake's hooks behave."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pynvml
import pytest

from gpupool.agent.backend import BackendError, GpuBackend, GpuEvent, MigInstance, MigProfile
from gpupool.agent.fake import FakeBackend, architecture_from_compute, cuda_version, nvml_standin
from gpupool.agent.nvml import NvmlBackend

ROOT = Path(__file__).parents[1]
REFERENCE = ROOT / "../shared/reference/nvml-h200"
COPY = ROOT / "tests/data/agent/nvml-h200.json"
DGX = ROOT / "examples/agent/dgx-h100.yaml"
UUID = "GPU-00000000-1111-2222-3333-444444444444"


def recording_path() -> Path:
    """The shared recording where present, else the copy shipped under tests/data/agent."""
    ref = REFERENCE / "nvml.json"
    return ref if ref.exists() else COPY


def clock() -> float:
    return 1_790_000_000.0


@pytest.fixture
def h200() -> FakeBackend:
    return FakeBackend.from_nvml_recording(recording_path(), clock=clock)


def two_gpu_recording() -> dict:
    """The H200 recording made into two NVLinked GPUs, the second in MIG mode with two MIG devices."""
    doc = json.loads(recording_path().read_text())
    a = doc["gpus"][0]
    b = copy.deepcopy(a)
    b.update(index=1, uuid="GPU-00000000-1111-2222-3333-555555555555", minor=1, mig_mode=[1, 1],
             max_mig_devices=7)
    b["pci"] = dict(a["pci"], busId="00000000:00:07.0")
    b["mig_instances"] = [
        {"profile": "3g.71gb", "profile_id": 9, "start": 0, "size": 4, "uuid": "MIG-aaaa", "memory_mib": 71424},
        {"profile": "1g.18gb", "profile_id": 19, "start": 6, "size": 1, "uuid": "MIG-bbbb", "memory_mib": 16384},
    ]
    a["nvlinks"] = [{"link": i, "active": 1, "remote_bus_id": "00000000:00:07.0"} for i in range(4)]
    b["nvlinks"] = [{"link": i, "active": 1, "remote_bus_id": "00000000:00:06.0"} for i in range(4)]
    b["nvlinks"].append({"link": 4, "active": 0, "remote_bus_id": "00000000:00:08.0"})
    doc["gpus"].append(b)
    doc["topology"] = {"0-1": "NVLINK"}
    return doc


# -- the recorded H200 ----------------------------------------------------------------------------------
@pytest.mark.skipif(not (REFERENCE / "nvml.json").exists(), reason="../shared/reference/nvml-h200 absent")
def test_shipped_copy_is_the_reference_recording():
    assert json.loads(COPY.read_text()) == json.loads((REFERENCE / "nvml.json").read_text())


def test_fake_reproduces_the_recorded_h200(h200):
    assert isinstance(h200, GpuBackend)
    drv = h200.driver()
    assert (drv.driver, drv.cuda_driver, drv.nvml) == ("580.159.04", "13.0", "13.580.159.04")
    [d] = h200.devices()
    assert d.index == 0 and d.uuid == UUID and d.minor == 0
    assert d.name == "NVIDIA H200"
    assert d.memory_mib == 150_754_820_096 // 2**20 == 143_771
    assert d.compute == (9, 0) and d.architecture == "hopper"
    assert d.pci_bus_id == "00000000:00:06.0"
    assert d.numa_node is None  # NotSupported
    assert d.power_limit_w == 700.0
    assert d.mig_enabled is False and d.mig_instances == ()
    assert d.nvlink_peers == ()
    assert d.vbios == "96.00.A5.00.1A"
    profiles = {p.name: p for p in d.mig_profiles}
    assert {n: (p.id, p.instances, p.memory_mib, p.slices) for n, p in profiles.items()} == {
        "1g.18gb": (19, 7, 16384, 1), "1g.18gb+me": (20, 1, 16384, 1), "1g.35gb": (15, 4, 33280, 1),
        "2g.35gb": (14, 3, 33280, 2), "3g.71gb": (9, 2, 71424, 3), "4g.71gb": (5, 1, 71424, 4),
        "7g.141gb": (0, 1, 143360, 7)}
    assert profiles["7g.141gb"].sms == 132
    assert all(p.memory_mib < int(p.name.split(".")[1].split("gb")[0]) * 1024 for p in d.mig_profiles)
    assert h200.topology() == {}


def test_fake_samples_the_recorded_h200(h200):
    [s] = h200.sample()
    assert s.uuid == UUID and s.time == clock()
    assert (s.util_gpu, s.util_memory) == (0.0, 0.0)
    assert s.memory_used_mib == 644_939_776 // 2**20 and s.memory_free_mib == 150_109_880_320 // 2**20
    assert s.power_w == pytest.approx(81.019)
    assert s.temperature_c == 40.0
    assert s.ecc_volatile_uncorrected == 0
    assert s.remapped_rows == (0, 0, 0, 0)
    assert s.retired_pages_pending is None  # NotSupported: H200 remaps rows instead
    assert s.throttle_reasons == 1  # GPU idle
    assert s.lost is False
    assert h200.events(0.0) == []


def test_nvml_backend_over_the_recording_matches_the_fake(h200):
    nv = nvml_standin(recording_path())
    backend = NvmlBackend(nv, clock=clock)
    assert isinstance(backend, GpuBackend)
    assert backend.driver() == h200.driver()
    assert backend.devices() == h200.devices()
    assert backend.sample() == h200.sample()
    assert backend.topology() == h200.topology() == {}
    assert backend.events(0.2) == []  # the recording's 200 ms poll: Timeout, no error
    backend.close()
    assert nv.initialized == 0
    backend.close()  # twice: no second shutdown
    assert nv.initialized == 0


def test_nvml_backend_multi_gpu_nvlink_and_mig_matches_the_fake():
    doc = two_gpu_recording()
    backend = NvmlBackend(nvml_standin(doc), clock=clock)
    fake = FakeBackend.from_recording(doc, clock=clock)
    devs = backend.devices()
    assert devs == fake.devices()
    assert devs[0].nvlink_peers == ("00000000:00:07.0",)  # four links, one peer; inactive link ignored
    assert devs[1].nvlink_peers == ("00000000:00:06.0",)
    assert devs[1].mig_enabled and devs[1].minor == 1
    assert devs[1].mig_instances == (MigInstance("3g.71gb", 0, 4, "MIG-aaaa", 71424),
                                     MigInstance("1g.18gb", 6, 1, "MIG-bbbb", 16384))
    assert backend.topology() == fake.topology() == {(0, 1): "NVLINK"}
    assert backend.sample() == fake.sample()


def test_nvml_topology_levels_from_common_ancestor():
    doc = two_gpu_recording()
    for g in doc["gpus"]:
        g["nvlinks"] = []
    for level in ("SINGLE", "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM", "SAME"):
        doc["topology"] = {"0-1": level}
        assert NvmlBackend(nvml_standin(doc)).topology() == {(0, 1): level}
    doc["topology"] = {}
    assert NvmlBackend(nvml_standin(doc)).topology() == {(0, 1): "SYSTEM"}  # NVML does not say


def test_nvml_errors_name_the_call_and_not_supported_is_none():
    nv = nvml_standin(recording_path())
    backend = NvmlBackend(nv)
    nv.fail["nvmlDeviceGetName"] = pynvml.NVML_ERROR_NO_PERMISSION
    with pytest.raises(BackendError, match="nvmlDeviceGetName"):
        backend.devices()
    nv.fail.clear()
    nv.fail["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_NOT_SUPPORTED
    [s] = backend.sample()
    assert s.power_w is None and s.temperature_c == 40.0
    nv.fail["nvmlEventSetWait_v2"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(BackendError, match="nvmlEventSetWait_v2"):
        backend.events(0)


def test_nvml_init_failure_is_a_backend_error():
    nv = nvml_standin(recording_path())
    nv.fail["nvmlInit"] = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(BackendError, match="nvmlInit.*DriverNotLoaded"):
        NvmlBackend(nv)


def test_real_pynvml_without_a_driver_raises_backend_error():
    try:
        backend = NvmlBackend()
    except BackendError as e:
        assert "nvmlInit" in str(e)
    else:  # a machine with a GPU: it answers
        assert backend.count() >= 0
        backend.close()


def test_nvml_gpu_lost_is_a_lost_sample():
    nv = nvml_standin(recording_path())
    backend = NvmlBackend(nv, clock=clock)
    backend.devices()
    before = backend.devices()
    nv.gpus[0]["lost"] = True
    [s] = backend.sample()
    assert s.lost and s.uuid == UUID and s.power_w is None
    assert backend.events(0) == []
    assert backend.devices() == before  # as last read
    # lost before it was ever read (issue 29, device-plugin #231): counted by the driver, so listed as lost
    [lost] = NvmlBackend(nv).devices()
    assert (lost.index, lost.lost, lost.uuid, lost.name) == (0, True, "", "")


def test_nvml_events_xid_and_double_bit_ecc():
    nv = nvml_standin(recording_path())
    backend = NvmlBackend(nv, clock=clock)
    nv.queued_events += [(0, pynvml.nvmlEventTypeXidCriticalError, 79),
                         (0, pynvml.nvmlEventTypeDoubleBitEccError, 0),
                         (0, pynvml.nvmlEventTypeSingleBitEccError, 0)]  # not registered: not delivered
    evs = backend.events(0.1)
    assert [(e.uuid, e.kind, e.code) for e in evs] == [(UUID, "xid", 79), (UUID, "ecc_dbe", 0)]
    assert evs[0].time == clock()
    assert backend.events(0) == []


# -- helpers --------------------------------------------------------------------------------------------
def test_versions_and_families():
    assert cuda_version(13000) == "13.0" and cuda_version(12080) == "12.8" and cuda_version("12.4") == "12.4"
    assert architecture_from_compute(9, 0) == "hopper"
    assert architecture_from_compute(8, 9) == "ada-lovelace"
    assert architecture_from_compute(8, 0) == "ampere"
    assert architecture_from_compute(7, 5) == "turing"
    assert architecture_from_compute(10, 0) == "blackwell"


# -- the description format and the hooks ---------------------------------------------------------------
def test_dgx_description():
    fake = FakeBackend.from_file(DGX)
    devs = fake.devices()
    assert len(devs) == 8 and [d.index for d in devs] == list(range(8))
    assert {d.name for d in devs} == {"NVIDIA H100 80GB HBM3"}
    assert all(d.architecture == "hopper" and d.memory_mib == 81559 for d in devs)
    assert len({d.uuid for d in devs}) == 8 and all(d.uuid.startswith("GPU-") for d in devs)
    assert devs[0].pci_bus_id == "00000000:18:00.0"
    assert all(len(d.nvlink_peers) == 7 for d in devs)
    topo = fake.topology()
    assert len(topo) == 28 and set(topo.values()) == {"NVLINK"}
    assert [d.mig_enabled for d in devs] == [False] * 7 + [True]
    assert [m.profile for m in devs[7].mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb"]
    assert all(m.uuid.startswith("MIG-") and m.memory_mib for m in devs[7].mig_instances)
    assert FakeBackend.from_file(DGX).devices() == devs  # deterministic UUIDs
    s7 = fake.sample()[7]
    assert s7.util_gpu == 35 and s7.power_w == 310.5


def test_compact_description_defaults_count_and_topology(tmp_path):
    desc = {"driver": "550.54.15", "cuda_driver": 12040,
            "defaults": {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute": [8, 0],
                         "power_limit_w": 400},
            "gpus": [{"count": 2, "numa_node": 0}, {"count": 2, "numa_node": 1}],
            "nvlink": [[0, 1], [2, 3]],
            "topology": [{"gpus": [1, 2], "level": "single"}]}
    path = tmp_path / "node.json"
    path.write_text(json.dumps(desc))
    fake = FakeBackend.from_file(path)
    assert fake.driver().cuda_driver == "12.4"
    assert [d.architecture for d in fake.devices()] == ["ampere"] * 4
    assert fake.topology() == {(0, 1): "NVLINK", (0, 2): "SYSTEM", (0, 3): "SYSTEM", (1, 2): "SINGLE",
                               (1, 3): "SYSTEM", (2, 3): "NVLINK"}
    s = fake.sample()[0]
    assert s.power_w == 40.0 and s.memory_free_mib == 40960 and s.remapped_rows == (0, 0, 0, 0)
    yaml_path = tmp_path / "node.yaml"
    yaml_path.write_text("gpus: [{name: X, memory_mib: 1}]\n")
    assert FakeBackend.from_file(yaml_path).devices()[0].name == "X"
    # an NVML recording is recognised by from_file too
    assert FakeBackend.from_file(recording_path()).devices()[0].name == "NVIDIA H200"


@pytest.mark.parametrize("bad", [
    {},
    {"gpus": [{"index": 0}, {"index": 0}]},
    {"gpus": [{}], "topology": [{"gpus": [0, 1], "level": "WARP"}]},
    {"gpus": [{}], "nvlink": [[0, 5]]},
    {"gpus": [{"sample": {"volts": 3}}]},
])
def test_bad_descriptions(bad):
    with pytest.raises((ValueError, KeyError)):
        FakeBackend.from_dict(bad)


def test_hooks_lose_reset_sample_mig(h200):
    h200.set_sample(0, temperature_c=91.0, throttle_reasons=0x40, ecc_volatile_uncorrected=2,
                    remapped_rows=(0, 1, 1, 0))
    s = h200.sample()[0]
    assert (s.temperature_c, s.throttle_reasons, s.ecc_volatile_uncorrected, s.remapped_rows) == (
        91.0, 0x40, 2, (0, 1, 1, 0))
    h200.lose(0)
    s = h200.sample()[0]
    assert s.lost and s.temperature_c is None and s.uuid == UUID
    h200.reset(0)
    s = h200.sample()[0]
    assert not s.lost and s.ecc_volatile_uncorrected == 0 and s.remapped_rows == (0, 1, 0, 0)
    assert h200.events(0) == [GpuEvent(UUID, "reset", 0, clock())]
    h200.set_mig(0, True, [{"profile": "3g.71gb", "start": 0, "size": 4},
                           {"profile": "1g.18gb", "start": 4}])
    d = h200.device(0)
    assert d.mig_enabled and [(m.profile, m.start, m.size, m.memory_mib) for m in d.mig_instances] == [
        ("3g.71gb", 0, 4, 71424), ("1g.18gb", 4, 1, 16384)]
    with pytest.raises(ValueError, match="9g.1tb"):
        h200.set_mig(0, True, [{"profile": "9g.1tb"}])
    h200.set_mig(0, False)
    assert not h200.device(0).mig_enabled and h200.device(0).mig_instances == ()
    with pytest.raises(KeyError):
        h200.set_sample(3, power_w=1.0)
    assert isinstance(h200.device(0).mig_profiles[0], MigProfile)


def test_fail_driver_every_call_raises(h200):
    h200.fail_driver("NVML: Driver Not Loaded")
    for call in (h200.driver, h200.devices, h200.topology, h200.sample, lambda: h200.events(0)):
        with pytest.raises(BackendError, match="Driver Not Loaded"):
            call()
    h200.heal_driver()
    assert h200.devices()
    h200.close()
    with pytest.raises(BackendError):
        h200.sample()


def test_inject_wakes_a_waiting_events_call(h200):
    got = []
    t = threading.Thread(target=lambda: got.extend(h200.events(5.0)))
    t.start()
    time.sleep(0.05)
    h200.xid(0, 48)
    t.join(2.0)
    assert not t.is_alive()
    assert [(e.kind, e.code, e.time) for e in got] == [("xid", 48, clock())]
    start = time.monotonic()
    assert h200.events(0.05) == []
    assert time.monotonic() - start >= 0.04
