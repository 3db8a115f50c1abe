"""The agent's Prometheus endpoint (gpupool.agent.exporter): dcgm-exporter's names and labels, read back by the
scheduler's own parser (gpupool.k8s.telemetry), which must see utilisation, memory and an XID by UUID."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.agent.backend import GpuDevice, GpuSample
from gpupool.agent.exporter import LABELS, AgentExporter, GpuExporter
from gpupool.agent.report import GpuHealth
from gpupool.cluster import ClusterState
from gpupool.k8s.telemetry import GpuTelemetry, parse_dcgm_text
from gpupool.model import NodeSpec

H200 = Path("../shared/reference/nvml-h200/nvml.json")
NOW = 1_790_000_000.0


def devices(n: int = 2) -> list[GpuDevice]:
    return [GpuDevice(index=i, uuid=f"GPU-{i:08d}-aaaa-bbbb-cccc-dddddddddddd", name="NVIDIA H100 80GB HBM3",
                      memory_mib=81559, minor=i, pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0") for i in range(n)]


def samples(n: int = 2, **over) -> list[GpuSample]:
    out = []
    for d in devices(n):
        fields = dict(util_gpu=87.0 - 50 * d.index, util_memory=41.0, memory_used_mib=71234 - 1000 * d.index,
                      memory_free_mib=10015 + 1000 * d.index, power_w=389.5, temperature_c=64.0,
                      ecc_volatile_uncorrected=0)
        fields.update(over.get(d.index, {}))
        out.append(GpuSample(d.index, d.uuid, NOW, **fields))
    return out


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_names_units_and_labels():
    exp = GpuExporter("gpu-node-a", clock=lambda: NOW)
    exp.update(samples(), {}, devices())
    fams = families(exp.text())
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
                 "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS",
                 "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "gpupool_agent_gpu_healthy"):
        assert len(fams[name].samples) == 2, name
        assert fams[name].type == "gauge"
    s = fams["DCGM_FI_DEV_FB_USED"].samples[1]
    assert s.labels == {"gpu": "1", "UUID": "GPU-00000001-aaaa-bbbb-cccc-dddddddddddd",
                        "pci_bus_id": "00000000:28:00.0", "device": "nvidia1",
                        "modelName": "NVIDIA H100 80GB HBM3", "Hostname": "gpu-node-a"}
    assert set(s.labels) == set(LABELS)  # (prometheus_client prints labels sorted by name)
    assert s.value == 70234
    assert fams["DCGM_FI_DEV_GPU_UTIL"].samples[0].value == 87
    assert fams["DCGM_FI_DEV_POWER_USAGE"].samples[0].value == 389.5
    assert [x.value for x in fams["gpupool_agent_gpu_healthy"].samples] == [1, 1]
    assert fams["gpupool_agent_last_update_seconds"].samples[0].value == NOW


def test_scheduler_telemetry_reads_it_and_sees_the_xid_by_uuid():
    """The page parses with the scheduler's own parser: utilisation, memory, and XID 79 on GPU 1 marking
    that GPU (by UUID) unhealthy, its neighbour healthy."""
    exp = GpuExporter("gpu-node-a", clock=lambda: NOW)
    devs = devices()
    health = {devs[0].uuid: GpuHealth(devs[0].uuid),
              devs[1].uuid: GpuHealth(devs[1].uuid, healthy=False, reason="XidError", xid=79)}
    exp.update(samples(), health, devs)
    text = exp.text()

    telemetry = GpuTelemetry(max_age=60, clock=lambda: NOW)
    assert telemetry.ingest_text(text) == 2
    s0 = telemetry.get("gpu-node-a", 0)
    assert s0.utilization == pytest.approx(0.87)
    assert (s0.fb_used_mib, s0.fb_free_mib, s0.power_w) == (71234, 10015, 389.5)
    assert s0.memory_used_ratio == pytest.approx(71234 / (71234 + 10015))
    assert s0.uuid == devs[0].uuid and s0.model == "NVIDIA H100 80GB HBM3"
    assert telemetry.unhealthy() == {("gpu-node-a", 1): 79}

    # the scheduler matches by identity: the node advertises its GPUs by UUID, in another order
    state = ClusterState([NodeSpec("gpu-node-a", cpu_milli=64000, memory_mib=512000, gpu_count=2,
                                   gpu_model="H100", gpu_ids=(devs[1].uuid, devs[0].uuid))])
    mask = telemetry.health_mask(state)
    assert mask[0].tolist()[:2] == [False, True]  # device 0 is the UUID with XID 79
    assert telemetry.load(state)[0] == pytest.approx((0.87 + 0.37) / 2)


def test_plain_xids_and_application_xids():
    exp = GpuExporter("n", clock=lambda: NOW)
    devs = devices(3)
    exp.update(samples(3), {devs[0].uuid: 13, devs[1].uuid: 48}, devs)
    fams = families(exp.text())
    assert [s.value for s in fams["DCGM_FI_DEV_XID_ERRORS"].samples] == [13, 48, 0]
    assert [s.value for s in fams["gpupool_agent_gpu_healthy"].samples] == [1, 0, 1]
    telemetry = GpuTelemetry(clock=lambda: NOW)
    telemetry.ingest_text(exp.text())
    assert telemetry.unhealthy() == {("n", 1): 48}  # XID 13 is the application's: ignored by both


def test_reset_clears_the_xid():
    exp = GpuExporter("n", clock=lambda: NOW)
    devs = devices(1)
    exp.update(samples(1), {devs[0].uuid: GpuHealth(devs[0].uuid, healthy=False, xid=79)}, devs)
    assert parse_dcgm_text(exp.text(), now=NOW)[0].xid == 79
    exp.update(samples(1), {devs[0].uuid: GpuHealth(devs[0].uuid)})  # devices kept from the last call
    [s] = parse_dcgm_text(exp.text(), now=NOW)
    assert s.xid == 0 and s.model == "NVIDIA H100 80GB HBM3"


def test_lost_gpu_has_no_readings_and_is_unhealthy():
    exp = GpuExporter("n", clock=lambda: NOW)
    devs = devices(2)
    lost = [samples(2)[0], GpuSample(1, devs[1].uuid, NOW, lost=True)]
    exp.update(lost, {}, devs)
    fams = families(exp.text())
    assert [s.labels["gpu"] for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples] == ["0"]
    assert [s.value for s in fams["gpupool_agent_gpu_healthy"].samples] == [1, 0]


def test_unsupported_readings_are_left_out_and_unknown_devices_labelled():
    exp = GpuExporter("n", clock=lambda: NOW)
    exp.update([GpuSample(3, "GPU-x", NOW, util_gpu=5.0)])
    fams = families(exp.text())
    assert [s.value for s in fams["DCGM_FI_DEV_GPU_UTIL"].samples] == [5]
    assert fams["DCGM_FI_DEV_GPU_UTIL"].samples[0].labels["device"] == "nvidia3"
    assert "DCGM_FI_DEV_POWER_USAGE" not in fams or not fams["DCGM_FI_DEV_POWER_USAGE"].samples


def test_driver_version_label_and_agent_loop_arguments():
    """The agent loop calls update(discovery=..., samples=..., health=..., events=..., stack=..., driver=...)."""
    from types import SimpleNamespace

    from gpupool.agent.backend import DriverInfo

    exp = AgentExporter("n", clock=lambda: NOW)
    devs = devices(1)
    exp.update(samples=samples(1), health={}, discovery=SimpleNamespace(devices=devs),
               driver=DriverInfo("580.159.04", "13.0"))
    s = families(exp.text())["DCGM_FI_DEV_GPU_TEMP"].samples[0]
    assert s.labels["DCGM_FI_DRIVER_VERSION"] == "580.159.04" and s.labels["pci_bus_id"] == devs[0].pci_bus_id


def test_stale_snapshot_is_not_served():
    now = [NOW]
    exp = GpuExporter("n", max_age_s=30, clock=lambda: now[0])
    assert "DCGM_FI_DEV_GPU_UTIL{" not in exp.text()  # nothing before the first update
    exp.update(samples(1), {}, devices(1))
    assert "DCGM_FI_DEV_GPU_UTIL{" in exp.text()
    now[0] += 31
    text = exp.text()
    assert "DCGM_FI_DEV_GPU_UTIL{" not in text and "gpupool_agent_last_update_seconds" in text


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_serve_over_http():
    exp = GpuExporter("gpu-node-a", clock=lambda: NOW)
    server = exp.serve("127.0.0.1", 0)
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert _get(base + "/readyz")[0] == 503
        exp.update(samples(), {devices()[1].uuid: 79}, devices())
        assert _get(base + "/readyz")[0] == 200
        assert _get(base + "/healthz")[0] == 200
        status, body = _get(base + "/metrics")
        assert status == 200
        telemetry = GpuTelemetry(clock=lambda: NOW)
        assert telemetry.ingest_text(body) == 2
        assert telemetry.unhealthy() == {("gpu-node-a", 1): 79}
    finally:
        server.stop()


@pytest.mark.skipif(not H200.exists(), reason="H200 recording not present")
def test_h200_recording_through_the_exporter():
    fake = pytest.importorskip("gpupool.agent.fake")
    backend = fake.FakeBackend.from_nvml_recording(H200, clock=lambda: NOW)
    exp = GpuExporter("h200-node", clock=lambda: NOW)
    exp.update(backend.sample(), {}, backend.devices())
    fams = families(exp.text())
    labels = fams["DCGM_FI_DEV_FB_USED"].samples[0].labels
    assert labels["modelName"] == "NVIDIA H200" and labels["pci_bus_id"] == "00000000:00:06.0"
    assert labels["UUID"] == "GPU-00000000-1111-2222-3333-444444444444" and labels["device"] == "nvidia0"
    assert fams["DCGM_FI_DEV_FB_USED"].samples[0].value == 644939776 // (1 << 20)  # 615 MiB, as recorded
    assert fams["DCGM_FI_DEV_POWER_USAGE"].samples[0].value == pytest.approx(81.019)
    assert fams["DCGM_FI_DEV_GPU_TEMP"].samples[0].value == 40
    telemetry = GpuTelemetry(clock=lambda: NOW)
    telemetry.ingest_text(exp.text())
    assert telemetry.get("h200-node", 0).utilization == 0.0 and telemetry.unhealthy() == {}
    # XID 79 through the fake's hooks and the exporter: the scheduler sees it by UUID
    backend.lose(0)
    exp.update(backend.sample(), {labels["UUID"]: 79})
    telemetry.ingest_text(exp.text())
    assert telemetry.unhealthy() == {("h200-node", 0): 79}
    assert telemetry.get("h200-node", 0).uuid == labels["UUID"]
