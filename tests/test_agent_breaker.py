"""Breaking the node agent (issue 11) with bad or unusual input: malformed fake descriptions, NVML errors,
events for GPUs that are not there, garbage on the Node, and what the scheduler makes of the inventory.

Tests marked ``xfail(strict=True)`` reproduce a defect found today; the others are guards that hold."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pynvml
import pytest
from kubernetes.client.exceptions import ApiException
from typer.testing import CliRunner

from gpupool.agent import publisher as pub
from gpupool.agent.backend import BackendError, GpuEvent
from gpupool.agent.fake import FakeBackend, nvml_standin
from gpupool.agent.health import HealthTracker
from gpupool.agent.nvml import NvmlBackend
from gpupool.agent.publisher import NodePublisher
from gpupool.agent.report import ANN_GPU_INVENTORY, ANN_OWNED_LABELS, COND_GPU_HEALTHY, inventory_json
from gpupool.agent.run import Agent, FakeClock
from gpupool.cli import app
from gpupool.k8s import inventory as kinv
from test_agent_publisher import FakeApi, node

ROOT = Path(__file__).resolve().parents[1]
H200 = ROOT.parent / "shared" / "reference" / "nvml-h200" / "nvml.json"
if not H200.exists():  # a checkout without the workplace's shared folder: the copy shipped with the tests
    H200 = ROOT / "tests" / "data" / "agent" / "nvml-h200.json"
DGX = ROOT / "examples" / "agent" / "dgx-h100.yaml"


def invoke(*args: str):
    return CliRunner().invoke(app, ["agent", *args], env={"NODE_NAME": ""}, terminal_width=200)


def dry_run(path: Path):
    return invoke("--backend", "fake", "--fake-file", str(path), "--dry-run")


def agent_on(backend, clock: FakeClock, publisher=None) -> Agent:
    return Agent(backend, publisher, HealthTracker(clock=clock.now), clock=clock)


def health_of(report) -> list[tuple[int, bool, str]]:
    return [(g["index"], g["healthy"], g["reason"]) for g in report.inventory["gpus"]]


def cond(report, kind: str = COND_GPU_HEALTHY):
    return next(c for c in report.conditions if c.type == kind)


# ---------------------------------------------------------------------- health: events that get lost

def test_xid_arriving_while_sampling_fails_is_not_lost():
    clock = FakeClock()
    b = FakeBackend.from_dict({"gpus": [{"count": 2}]}, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    healthy_sample = b.sample

    def failing_sample():
        raise BackendError("nvmlDeviceGetTemperature: NVMLError_Unknown: Unknown Error")

    b.sample = failing_sample  # the GPU falling off the bus often answers Unknown on some calls first
    b.xid(0, 79)
    assert a.poll_events(0.1)  # urgent: a round at once
    a.round()
    b.sample = healthy_sample  # NVML answers again
    report = a.round()
    assert health_of(report)[0][:2] == (0, False), "XID 79 was seen by poll_events but never reached the inventory"


def test_xid_whose_device_uuid_cannot_be_read_still_marks_the_gpu():
    clock = FakeClock()
    nv = nvml_standin(H200)
    nb = NvmlBackend(nv, clock=clock.now)
    a = agent_on(nb, clock)
    a.round()
    nv.fail["nvmlDeviceGetUUID"] = pynvml.NVML_ERROR_UNKNOWN  # samples use the cached UUID: they still work
    nv.queued_events.append((0, pynvml.nvmlEventTypeXidCriticalError, 79))
    events = nb.events(0.1)
    assert [e.code for e in events] == [79]
    report = a.round(events)
    assert health_of(report)[0][:2] == (0, False)


def test_xid_for_a_uuid_not_on_this_node_does_not_make_the_node_unhealthy():
    clock = FakeClock()
    b = FakeBackend.from_dict({"gpus": [{"count": 2}]}, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    b.inject(GpuEvent(uuid="GPU-not-on-this-node", kind="xid", code=79))
    a.poll_events(0.1)
    report = a.round()
    assert all(h for _, h, _ in health_of(report))
    assert cond(report).status == "True", cond(report).message


def test_one_gpu_sensor_error_does_not_make_the_whole_node_unknown():
    clock = FakeClock()
    nv = nvml_standin(H200)
    a = agent_on(NvmlBackend(nv, clock=clock.now), clock)
    a.round()
    nv.fail["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_UNKNOWN
    report = a.round()
    assert cond(report).reason != "DriverUnavailable", cond(report).message


def test_xid_storm_of_1000_events_marks_only_that_gpu_quickly():
    clock = FakeClock()
    b = FakeBackend.from_dict({"gpus": [{"count": 2}]}, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    for i in range(1000):
        b.xid(1, 48 if i % 2 else 13)
    assert a.poll_events(0.1)
    report = a.round()
    assert health_of(report) == [(0, True, ""), (1, False, "XidError")]
    assert "XID 48" in cond(report).message


def test_reset_of_a_healthy_gpu_keeps_it_healthy_and_rediscovers():
    clock = FakeClock()
    b = FakeBackend.from_dict({"gpus": [{"count": 2}]}, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    b.reset(1)
    assert a.poll_events(0.1)
    report = a.round()
    assert [h for _, h, _ in health_of(report)] == [True, True] and a.discoveries == 2


def test_gpu_lost_mid_run_then_reset_on_the_standin():
    clock = FakeClock()
    nv = nvml_standin(H200)
    a = agent_on(NvmlBackend(nv, clock=clock.now), clock)
    a.round()
    nv.gpus[0]["lost"] = True
    report = a.round()
    assert health_of(report)[0] == (0, False, "FellOffTheBus") and cond(report).status == "False"


@pytest.mark.parametrize("call", ["nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait_v2"])
@pytest.mark.parametrize("code", ["NVML_ERROR_NO_PERMISSION", "NVML_ERROR_UNKNOWN",
                                  "NVML_ERROR_DRIVER_NOT_LOADED", "NVML_ERROR_TIMEOUT", "NVML_ERROR_NOT_SUPPORTED"])
def test_event_api_errors_never_end_the_loop(call, code):
    clock = FakeClock()
    nv = nvml_standin(H200)
    a = agent_on(NvmlBackend(nv, clock=clock.now), clock)
    nv.fail[call] = getattr(pynvml, code)
    a.run(max_rounds=3)
    assert a.rounds == 3


def test_mig_toggled_every_round_rediscovers_without_errors():
    clock = FakeClock()
    b = FakeBackend.from_file(DGX, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    for r in range(6):
        b.set_mig(7, r % 2 == 1, [{"profile": "1g.10gb", "start": i, "size": 1} for i in range(7)] if r % 2 else ())
        report = a.round()
        assert ("nvidia.com/mig-1g.10gb.count" in report.labels) == (r % 2 == 1)
    assert a.errors == 0 and a.discoveries == 7


# ---------------------------------------------------------------------- malformed fake descriptions (CLI)

def test_yaml_syntax_error_is_a_usage_error(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("gpus: [ {a: 1")
    result = dry_run(f)
    assert result.exit_code == 2 and f"{f}:1:" in result.output and "invalid YAML" in result.output
    assert len(result.output.splitlines()) == 1


@pytest.mark.parametrize("mig", ["true", '"yes"', "[1]"])
def test_mig_that_is_not_a_mapping_is_a_usage_error(tmp_path, mig):
    f = tmp_path / "mig.yaml"
    f.write_text(f"gpus: [{{mig: {mig}}}]")
    assert dry_run(f).exit_code == 2


def test_compute_with_one_number_is_a_usage_error(tmp_path):
    f = tmp_path / "cc.yaml"
    f.write_text("gpus: [{compute: [9]}]")
    assert dry_run(f).exit_code == 2


@pytest.mark.parametrize("name,text", [("inf.yaml", "gpus: [{memory_mib: .inf}]"),
                                       ("inf.json", '{"gpus": [{"memory_mib": Infinity}]}')])
def test_infinite_numbers_are_a_usage_error(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    assert dry_run(f).exit_code == 2


def test_deeply_nested_json_is_a_usage_error(tmp_path):
    f = tmp_path / "deep.json"
    f.write_text('{"gpus": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert dry_run(f).exit_code == 2


def test_absurd_gpu_count_is_refused_quickly(tmp_path):
    f = tmp_path / "huge.yaml"
    f.write_text("gpus: [{count: 100000000}]")
    code = ("import sys; from gpupool.agent.fake import FakeBackend\n"
            "try:\n    FakeBackend.from_file(sys.argv[1])\nexcept ValueError:\n    sys.exit(7)\n")
    try:
        rc = subprocess.run([sys.executable, "-c", code, str(f)], timeout=15, capture_output=True).returncode
    except subprocess.TimeoutExpired:
        rc = None
    assert rc == 7


def test_duplicate_uuids_in_a_description_are_refused():
    with pytest.raises(ValueError):
        FakeBackend.from_dict({"gpus": [{"uuid": "GPU-x"}, {"uuid": "GPU-x"}]})


@pytest.mark.parametrize("entry", [{"memory_mib": -5}, {"count": -1}])
def test_negative_memory_or_count_is_refused(entry):
    with pytest.raises(ValueError):
        FakeBackend.from_dict({"gpus": [entry]})


def test_unquoted_cuda_driver_version_gives_the_right_labels(tmp_path):
    f = tmp_path / "cuda.yaml"
    f.write_text("cuda_driver: 12.8\ngpus: [{}]")
    clock = FakeClock()
    report = agent_on(FakeBackend.from_file(f, clock=clock.now), clock).round()
    assert report.labels["nvidia.com/cuda.runtime.major"] == "12"
    assert report.labels["nvidia.com/cuda.runtime.minor"] == "8"


@pytest.mark.parametrize("name,text", [
    ("empty.yaml", ""), ("empty.json", ""), ("list.yaml", "- a\n- b"), ("scalar.yaml", "hello"),
    ("null.yaml", "gpus:"), ("int.yaml", "gpus: 5"), ("strs.yaml", "gpus: [abc]"),
    ("defaults.yaml", "defaults: [1]\ngpus: [{}]"), ("sample.yaml", "gpus: [{sample: 5}]"),
    ("mem.yaml", 'gpus: [{memory_mib: "80GB"}]'), ("nan.json", '{"gpus": [{"memory_mib": NaN}]}'),
    ("rec.json", '{"gpus": [{"cuda_cc": [9, 0]}]}'), ("nvl.yaml", "gpus: [{count: 2}]\nnvlink: [[0, 9]]"),
    ("topo.yaml", "gpus: [{count: 2}]\ntopology: [{gpus: [0], level: NVLINK}]"),
    ("migi.yaml", "gpus: [{mig: {enabled: true, instances: [5]}}]"), ("dup.yaml", "gpus: [{index: 0}, {index: 0}]"),
])
def test_malformed_descriptions_are_usage_errors(tmp_path, name, text):
    f = tmp_path / name
    f.write_text(text)
    result = dry_run(f)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_a_directory_as_fake_file_is_a_usage_error(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    assert dry_run(tmp_path / "d.yaml").exit_code == 2


@pytest.mark.parametrize("text", ["gpus: []", "gpus: [{count: 64}]",
                                  'gpus: [{name: "NVIDIA H100 \U0001f680 80GB/HBM3 \u00fcn\u00efcode"}]',
                                  "gpus: [{name: " + "A" * 200 + "}]"])
def test_zero_64_unicode_and_long_names_run(tmp_path, text):
    f = tmp_path / "ok.yaml"
    f.write_text(text, encoding="utf-8")
    result = dry_run(f)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout[result.stdout.index("{"):])
    for key, value in doc["labels"].items():  # what would be published: never an invalid label
        if not pub.valid_label(key, value):
            assert key == "nvidia.com/gpu.product" and len(value) > 63  # dropped by the publisher


# ---------------------------------------------------------------------- publishing on unusual Nodes

@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi(node())
    monkeypatch.setattr(pub.wire, "call", fake.call)
    return fake


def dgx_agent(clock: FakeClock, interval_s: float = 10.0) -> tuple[Agent, FakeBackend, NodePublisher]:
    b = FakeBackend.from_file(DGX, clock=clock.now)
    p = NodePublisher(object(), "gpu-1", sleep=clock.sleep, clock=clock.now)
    return Agent(b, p, HealthTracker(clock=clock.now), interval_s=interval_s, clock=clock), b, p


def test_owned_labels_annotation_naming_foreign_keys_never_removes_them(api):
    api.node["metadata"]["annotations"][ANN_OWNED_LABELS] = "kubernetes.io/hostname,nvidia.com/gpu.product"
    clock = FakeClock()
    a, _, _ = dgx_agent(clock)
    a.round()
    assert api.node["metadata"]["labels"].get("kubernetes.io/hostname") == "gpu-1"


def test_refused_metadata_patch_still_publishes_conditions(api):
    real = api.call

    def call(apic, method, path, body=None, **kw):
        if method == "PATCH" and not path.format(**(kw.get("path_params") or {})).endswith("/status"):
            api.requests.append((method, path, body))
            raise ApiException(status=403, reason="Forbidden")
        return real(apic, method, path, body, **kw)

    pub.wire.call = call  # monkeypatched by the fixture: restored after the test
    clock = FakeClock()
    a, b, _ = dgx_agent(clock)
    a.round()
    b.xid(0, 79)
    a.poll_events(0.1)
    a.round()
    conds = {c["type"]: c for c in api.node["status"]["conditions"]}
    assert conds.get(COND_GPU_HEALTHY, {}).get("status") == "False"


def test_403_on_status_patch_is_one_request_per_round_and_inventory_still_goes_out(api):
    real = api.call

    def call(apic, method, path, body=None, **kw):
        if method == "PATCH" and path.endswith("/status"):
            api.requests.append((method, path, body))
            raise ApiException(status=403, reason="Forbidden")
        return real(apic, method, path, body, **kw)

    pub.wire.call = call
    clock = FakeClock()
    a, b, p = dgx_agent(clock)
    for _ in range(5):
        a.round()
    status = [r for r in api.requests if r[0] == "PATCH" and r[1].endswith("/status")]
    assert len(status) == 5 and p.failures == 5
    b.xid(0, 79)
    a.poll_events(0.1)
    a.round()
    inv = json.loads(api.node["metadata"]["annotations"][ANN_GPU_INVENTORY])
    assert inv["gpus"][0]["healthy"] is False  # the scheduler still learns it


def test_409_storm_is_bounded_per_round(api):
    api.fail = [ApiException(status=409, reason="Conflict") for _ in range(1000)]
    clock = FakeClock()
    a, _, p = dgx_agent(clock)
    for _ in range(3):
        a.round()
    assert len(api.requests) <= 3 * (5 + 5) + 2  # refresh + publish, 5 attempts each, and the RuntimeClasses


def test_missing_node_never_writes_and_keeps_running(api):
    api.fail = [ApiException(status=404, reason="Not Found") for _ in range(1000)]
    clock = FakeClock()
    a, _, p = dgx_agent(clock)
    a.run(max_rounds=4)
    assert a.rounds == 4 and a.published == 0 and not api.writes()


def test_gfd_labels_with_other_values_are_kept(api):
    api.node["metadata"]["labels"].update({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-GFD",
                                           "nvidia.com/gpu.count": "4"})
    clock = FakeClock()
    a, _, _ = dgx_agent(clock)
    for _ in range(3):
        a.round()
    labels = api.node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-GFD" and labels["nvidia.com/gpu.count"] == "4"
    assert "nvidia.com/gpu.product" not in api.node["metadata"]["annotations"][ANN_OWNED_LABELS].split(",")
    assert len(api.writes()) <= 2  # no fight: written once, then nothing changes


def test_inventory_of_64_gpus_with_7_mig_devices_fits_the_annotation_limit():
    doc = json.loads(DGX.read_text()) if DGX.suffix == ".json" else __import__("yaml").safe_load(DGX.read_text())
    doc["gpus"] = [{"count": 64, "mig": {"enabled": True, "instances": [
        {"profile": "1g.10gb", "start": i, "size": 1} for i in range(7)]}}]
    clock = FakeClock()
    report = agent_on(FakeBackend.from_dict(doc, clock=clock.now), clock).round()
    total = len(inventory_json(report.inventory)) + len(",".join(report.labels))
    assert total < 256 * 1024 // 2  # well under the API server's 256 KiB for all annotations


def test_sub_millisecond_interval_is_refused():
    result = invoke("--backend", "fake", "--fake-file", str(DGX), "--dry-run", "--interval", "0.0001ms")
    assert result.exit_code == 2


# ---------------------------------------------------------------------- the scheduler's reading of the inventory

def k8s_node(alloc: int, inventory: Any, labels: dict[str, str] | None = None) -> dict[str, Any]:
    raw = inventory_json(inventory) if isinstance(inventory, dict) else inventory
    return {"metadata": {"name": "dgx", "labels": dict(labels or {}), "resourceVersion": "1",
                         "annotations": {ANN_GPU_INVENTORY: raw}},
            "status": {"allocatable": {"cpu": "200", "memory": "2000Gi", "nvidia.com/gpu": str(alloc)}}}


def dgx_inventory(bad: int | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    clock = FakeClock()
    b = FakeBackend.from_file(DGX, clock=clock.now)
    a = agent_on(b, clock)
    a.round()
    if bad is not None:
        b.set_sample(bad, remapped_rows=(0, 1, 1, 0))  # RowRemapPending: the device plugin does not see it
    report = a.round()
    return report.inventory, report.labels


def test_mixed_mig_node_gpu_marked_unhealthy_is_excluded():
    inv, labels = dgx_inventory(bad=2)
    assert [g["healthy"] for g in inv["gpus"]][2] is False and inv["gpus"][7]["mig"]["enabled"]
    n = k8s_node(7, inv, labels)  # mixed strategy: GPU 7 is advertised as nvidia.com/mig-*, not nvidia.com/gpu
    spec = kinv.node_spec_from_node(n)
    assert spec.gpu_count == 7
    marked = kinv.agent_marked(n, spec)
    assert marked, "GPU 2 is marked unhealthy by the agent but nothing is excluded"
    if spec.gpu_ids:
        assert inv["gpus"][2]["uuid"] in [spec.gpu_ids[i] for i in marked]
        assert inv["gpus"][7]["uuid"] not in spec.gpu_ids  # a MIG-mode GPU is not an nvidia.com/gpu device


def test_full_gpu_node_gpu_marked_unhealthy_is_excluded():
    inv, _ = dgx_inventory(bad=2)
    for g in inv["gpus"]:
        g["mig"] = {"enabled": False, "instances": []}
    n = k8s_node(8, inv)
    spec = kinv.node_spec_from_node(n)
    assert kinv.agent_marked(n, spec) == (2,)


def test_healthy_false_as_a_string_is_still_unhealthy():
    inv, _ = dgx_inventory()
    for g in inv["gpus"]:
        g["mig"] = {"enabled": False, "instances": []}
    inv["gpus"][3]["healthy"] = "false"
    n = k8s_node(8, inv)
    spec = kinv.node_spec_from_node(n)
    assert kinv.agent_marked(n, spec) == (3,)


def test_inventory_with_an_infinite_index_is_ignored_not_fatal():
    n = k8s_node(1, '{"gpus": [{"uuid": "GPU-a", "index": 1e400, "healthy": false}]}')
    spec = kinv.node_spec_from_node(n)
    assert spec.gpu_count == 1


@pytest.mark.parametrize("garbage", ["{", "[]", "null", '{"gpus": 5}', '{"gpus": [1, 2, "x"]}',
                                     '{"gpus": [{"uuid": 5, "healthy": false}]}',
                                     '{"gpus": [{"uuid": "a", "index": "x", "healthy": false}]}',
                                     '{"gpus": [{"uuid": "a", "index": NaN, "healthy": false}]}'])
def test_garbage_inventory_is_ignored(garbage):
    n = k8s_node(1, garbage)
    spec = kinv.node_spec_from_node(n)
    assert spec.gpu_count == 1 and spec.gpu_ids == () and kinv.agent_marked(n, spec) == ()


def test_inventory_listing_more_gpus_than_allocatable_is_not_trusted_for_ids():
    inv, _ = dgx_inventory()
    for g in inv["gpus"]:
        g["mig"] = {"enabled": False, "instances": []}
    inv["gpus"] += [dict(copy.deepcopy(g), index=g["index"] + 8, uuid=g["uuid"] + "-x") for g in inv["gpus"]]
    n = k8s_node(8, inv)
    spec = kinv.node_spec_from_node(n)
    assert spec.gpu_ids == () and kinv.agent_marked(n, spec) == ()


def test_inventory_listing_fewer_gpus_with_a_bad_one_marks_the_whole_node():
    n = k8s_node(8, {"version": 1, "gpus": [{"index": 0, "uuid": "GPU-a", "healthy": False},
                                             {"index": 1, "uuid": "GPU-b", "healthy": True}]})
    spec = kinv.node_spec_from_node(n)
    # never more GPUs than the agent calls healthy (issue 29), and never a failed GPU in a healthy one's place:
    # the one healthy GPU, by its identity
    assert spec.gpu_count == 1 and spec.gpu_ids == ("GPU-b",) and kinv.agent_marked(n, spec) == ()
