"""GPU telemetry: dcgm-exporter pages and a Prometheus API served over real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.k8s.telemetry import (
    DcgmExporterSource,
    GpuSample,
    GpuTelemetry,
    PrometheusSource,
    TelemetryPoller,
    parse_dcgm_text,
    parse_prometheus_response,
)
from gpupool.model import NodeSpec

# What dcgm-exporter 3.x (default-counters.csv, pod mapping on) prints for an 8-GPU A100 node; trimmed to
# 4 GPUs. GPU 1 is time-sliced between two pods (one series per pod, same values); GPU 2 fell off the
# bus (XID 79); GPU 3 had an application fault (XID 13, the device stays usable).
_LABELS = ('gpu="{gpu}",UUID="GPU-5b2d4e1f-7c1a-4f6b-9a3e-0{gpu}c8d1e2f3a4b",pci_bus_id="00000000:{bus}:00.0",'
           'device="nvidia{gpu}",modelName="NVIDIA A100-SXM4-80GB",Hostname="{host}",'
           'DCGM_FI_DRIVER_VERSION="535.161.08",container="{ctr}",namespace="{ns}",pod="{pod}"')


def _series(name: str, gpu: int, value: str, host: str = "gpu-node-a", pods: tuple = (("", "", ""),)) -> str:
    bus = ("07", "0F", "47", "4E")[gpu]
    return "".join(
        f"{name}{{{_LABELS.format(gpu=gpu, bus=bus, host=host, ctr=c, ns=n, pod=p)}}} {value}\n"
        for c, n, p in pods
    )


def dcgm_page(host: str = "gpu-node-a", util=("87", "35", "0", "12"), xid=("0", "0", "79", "13")) -> str:
    shared = (("trainer", "team-a", "bert-ft-0"), ("notebook", "team-b", "jupyter-7f9c"))
    pods = [(("trainer", "team-a", "llama-pretrain-0"),), shared, (("", "", ""),), (("infer", "team-c", "vllm-1"),)]
    fb_used = ("71234", "20480", "0", "4100")
    fb_free = ("10015", "60769", "81251", "77151")
    power = ("389.512", "142.025", "61.337", "98.604")
    blocks = [
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", ("1410", "1410", "210", "1155")),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", ("1593",) * 4),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", ("64", "51", "33", "45")),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", power),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
         "Total energy consumption since boot (in mJ).", ("91823412315", "51234123", "4123123", "8123123")),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", ("0",) * 4),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", util),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", ("41", "12", "0", "3")),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", ("0",) * 4),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", ("0",) * 4),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", xid),
        ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", fb_free),
        ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", fb_used),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
         "Total number of NVLink bandwidth counters for all lanes.", ("912341", "11234", "0", "812")),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge",
         "Ratio of time the graphics engine is active.", ("0.861234", "0.341200", "0.000000", "0.118800")),
    ]
    out = []
    for name, kind, help_text, values in blocks:
        out.append(f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n")
        for gpu, value in enumerate(values):
            out.append(_series(name, gpu, value, host, pods[gpu]))
    return "".join(out)


# An H100 node in MIG mode behind an exporter whose Hostname is its own pod name: two 3g.40gb instances.
_MIG = ('gpu="0",UUID="GPU-aa11",device="nvidia0",modelName="NVIDIA H100 80GB HBM3",'
        'Hostname="nvidia-dcgm-exporter-x7k2p"')
_INST = ',GPU_I_PROFILE="3g.40gb",GPU_I_ID="{}"'
MIG_PAGE = (
    "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).\n# TYPE DCGM_FI_DEV_FB_USED gauge\n"
    f"DCGM_FI_DEV_FB_USED{{{_MIG}{_INST.format(1)}}} 30000\n"
    f"DCGM_FI_DEV_FB_USED{{{_MIG}{_INST.format(2)}}} 1000\n"
    "# HELP DCGM_FI_DEV_FB_FREE Framebuffer memory free (in MiB).\n# TYPE DCGM_FI_DEV_FB_FREE gauge\n"
    f"DCGM_FI_DEV_FB_FREE{{{_MIG}{_INST.format(1)}}} 10560\n"
    f"DCGM_FI_DEV_FB_FREE{{{_MIG}{_INST.format(2)}}} 39560\n"
    "# HELP DCGM_FI_DEV_POWER_USAGE Power draw (in W).\n# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n"
    f"DCGM_FI_DEV_POWER_USAGE{{{_MIG}}} 402.5\n"
)


def prometheus_answer(ts: float) -> dict:
    def item(name, node, gpu, value):
        return {"metric": {"__name__": name, "gpu": str(gpu), "Hostname": node, "UUID": f"GPU-{node}-{gpu}",
                           "modelName": "NVIDIA H100 80GB HBM3", "job": "dcgm-exporter",
                           "instance": f"10.0.3.{gpu + 10}:9400"},
                "value": [ts, value]}

    result = []
    for gpu, (util, used, free, power, xid) in enumerate([("95", "70000", "11559", "650.1", "0"),
                                                          ("5", "1024", "80535", "120.0", "48")]):
        result += [item("DCGM_FI_DEV_GPU_UTIL", "h100-0", gpu, util), item("DCGM_FI_DEV_FB_USED", "h100-0", gpu, used),
                   item("DCGM_FI_DEV_FB_FREE", "h100-0", gpu, free),
                   item("DCGM_FI_DEV_POWER_USAGE", "h100-0", gpu, power),
                   item("DCGM_FI_DEV_XID_ERRORS", "h100-0", gpu, xid)]
    result.append(item("DCGM_FI_DEV_GPU_UTIL", "h100-1", 0, "NaN"))
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class _Site:
    """A tiny HTTP server on 127.0.0.1 serving fixed bodies per path; records the queries it got."""

    def __init__(self) -> None:
        self.pages: dict[str, tuple[str, bytes]] = {}
        self.queries: list[dict] = []
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (stdlib name)
                url = urllib.parse.urlsplit(self.path)
                site.queries.append(urllib.parse.parse_qs(url.query))
                if url.path not in site.pages:
                    self.send_error(404)
                    return
                ctype, body = site.pages[url.path]
                self.send_response(200)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def site() -> Iterator[_Site]:
    s = _Site()
    yield s
    s.close()


def _state() -> ClusterState:
    return ClusterState([
        NodeSpec("gpu-node-a", 96000, 1_000_000, 4, "A100-80GB"),
        NodeSpec("gpu-node-b", 96000, 1_000_000, 1, "H100"),
        NodeSpec("h100-0", 96000, 1_000_000, 2, "H100"),
        NodeSpec("cpu-0", 32000, 131072),
    ])


def test_parse_dcgm_page_merges_pod_series_and_reads_fields():
    samples = {(s.node, s.gpu): s for s in parse_dcgm_text(dcgm_page(), now=1000.0)}
    assert set(samples) == {("gpu-node-a", g) for g in range(4)}
    s0 = samples["gpu-node-a", 0]
    assert s0.utilization == pytest.approx(0.87)
    assert (s0.fb_used_mib, s0.fb_free_mib, s0.power_w, s0.xid) == (71234, 10015, pytest.approx(389.512), 0)
    assert s0.model == "NVIDIA A100-SXM4-80GB" and s0.uuid.startswith("GPU-") and s0.timestamp == 1000.0
    assert s0.memory_used_ratio == pytest.approx(71234 / 81249)
    shared = samples["gpu-node-a", 1]  # two pod series, one GPU
    assert shared.fb_used_mib == 20480 and shared.utilization == pytest.approx(0.35)
    assert samples["gpu-node-a", 2].xid == 79 and samples["gpu-node-a", 3].xid == 13


def test_parse_mig_page_sums_instances_and_pins_node():
    (s,) = parse_dcgm_text(MIG_PAGE, node="gpu-node-b", now=5.0)
    assert (s.node, s.gpu) == ("gpu-node-b", 0)
    assert (s.fb_used_mib, s.fb_free_mib, s.power_w) == (31000, 50120, 402.5)
    assert s.utilization is None
    (unpinned,) = parse_dcgm_text(MIG_PAGE, now=5.0)
    assert unpinned.node == "nvidia-dcgm-exporter-x7k2p"


def test_parse_rejects_garbage_and_bad_prometheus_answers():
    with pytest.raises(ValueError):
        parse_dcgm_text("DCGM_FI_DEV_GPU_UTIL{gpu=0 12\n")
    with pytest.raises(ValueError, match="bad_data"):
        parse_prometheus_response({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(ValueError, match="vector"):
        parse_prometheus_response({"status": "success", "data": {"resultType": "matrix", "result": []}})


def test_health_mask_and_load_from_scraped_exporters(site):
    site.pages["/metrics"] = ("text/plain; version=0.0.4; charset=utf-8", dcgm_page().encode())
    site.pages["/mig/metrics"] = ("text/plain; version=0.0.4", MIG_PAGE.encode())
    now = [10_000.0]
    tel = GpuTelemetry(max_age=30.0, clock=lambda: now[0])
    source = DcgmExporterSource([f"{site.url}/metrics", f"gpu-node-b={site.url}/mig/metrics",
                                 f"{site.url}/missing"], timeout=2.0)
    poller = TelemetryPoller(tel, [source], interval=60)
    assert poller.poll_once() == 5
    assert list(source.errors) == [f"{site.url}/missing"]  # a failing endpoint is skipped, not fatal

    state = _state()
    mask = tel.health_mask(state)
    assert mask.shape == state.gpu_exists.shape
    assert mask[0].tolist() == [True, True, False, True]  # XID 79 -> unhealthy; XID 13 is the application's
    assert mask[1, 0] and mask[2, :2].all() and not mask[3].any()
    assert tel.unhealthy() == {("gpu-node-a", 2): 79}

    load = tel.load(state)
    assert load[0] == pytest.approx((0.87 + 0.35 + 0.0 + 0.12) / 4)
    assert load[1] == 0.0 and load[2] == 0.0 and load[3] == 0.0  # no utilisation reported -> default
    assert np.isnan(tel.gpu_load(state)[1, 0])

    changes = tel.apply_health(state)
    assert changes == [("gpu-node-a", 2, False)] and not state.gpu_healthy[0, 2]
    assert tel.apply_health(state) == []

    # The exporter goes quiet: after max_age its data no longer counts, the GPU reads healthy again.
    now[0] += 31.0
    assert tel.get("gpu-node-a", 2) is None and tel.fresh() == {}
    assert tel.health_mask(state)[0].all() and (tel.load(state, default=0.5) == 0.5).all()
    assert tel.apply_health(state) == [("gpu-node-a", 2, True)]
    assert tel.prune() == 5


def test_prometheus_source_over_http(site):
    ts = time.time()
    site.pages["/api/v1/query"] = ("application/json", json.dumps(prometheus_answer(ts)).encode())
    tel = GpuTelemetry(max_age=60.0, ignore_xids=())
    source = PrometheusSource(site.url + "/", selector='job="dcgm-exporter"')
    assert tel.update(source.collect()) == 2  # the NaN series is dropped
    (query,) = site.queries[-1]["query"]
    assert query.startswith('{__name__=~"DCGM_FI_DEV_(') and 'job="dcgm-exporter"' in query
    for name in ("GPU_UTIL", "FB_USED", "FB_FREE", "POWER_USAGE", "XID_ERRORS"):
        assert name in query
    s = tel.get("h100-0", 0)
    assert s is not None and s.timestamp == pytest.approx(ts)
    assert (s.utilization, s.fb_used_mib, s.power_w, s.xid) == (pytest.approx(0.95), 70000, 650.1, 0)
    assert tel.unhealthy() == {("h100-0", 1): 48}
    state = _state()
    assert tel.health_mask(state)[2].tolist()[:2] == [True, False]
    assert tel.load(state)[2] == pytest.approx(0.5)

    # Prometheus down: no samples, the error is kept, nothing raises.
    site.close()
    assert source.collect() == [] and source.errors


def test_older_samples_do_not_overwrite_newer():
    tel = GpuTelemetry(max_age=100.0, clock=lambda: 150.0)
    assert tel.update([GpuSample("n", 0, timestamp=120.0, xid=79)]) == 1
    assert tel.update([GpuSample("n", 0, timestamp=110.0, xid=0)]) == 0
    assert tel.get("n", 0).xid == 79
    assert tel.ingest_text(dcgm_page(host="n", xid=("0",) * 4), now=130.0) == 4
    assert tel.get("n", 0).xid == 0
    with pytest.raises(ValueError):
        GpuTelemetry(max_age=0)


def test_poller_thread_runs_and_stops(site):
    site.pages["/metrics"] = ("text/plain", dcgm_page().encode())
    tel = GpuTelemetry(max_age=60.0)
    poller = TelemetryPoller(tel, [DcgmExporterSource([site.url + "/metrics"])], interval=0.05).start()
    deadline = time.time() + 5
    while not tel.fresh() and time.time() < deadline:
        time.sleep(0.02)
    poller.stop()
    assert len(tel.fresh()) == 4
