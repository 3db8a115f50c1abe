"""Extreme and malformed input (far-out times, absurd sizes, int overflows, malformed ExtenderArgs, exponent
quantities): a clear error or an unschedulable reason, and nothing else lost."""

from __future__ import annotations

import pytest

from gpupool.engine.pool import job as pool_job
from gpupool.model import NodeSpec
from gpupool.sim.jobs import JobSimConfig, JobSpec, run_jobs


def _nodes(n: int, gpus: int) -> list[NodeSpec]:
    return [NodeSpec(f"n{i}", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=gpus, gpu_model="V100M32",
                     nvlink_domain=f"n{i}", rack="r0", switch="leaf0") for i in range(n)]


def test_a_job_asking_absurdly_many_gpus_is_unfinished_without_building_its_pods(monkeypatch) -> None:
    # 10**9 GPUs (the trace loaders allow up to 2**53): before the fix the simulator built all 1.25e8 pod
    # requests of the job before asking whether it could ever run (minutes, gigabytes)
    make_pods = pool_job.PoolJob.make_pods

    def guarded(self) -> None:
        assert self.max_pods <= 1000, f"{self.name}: {self.max_pods} pod requests built"
        make_pods(self)

    monkeypatch.setattr(pool_job.PoolJob, "make_pods", guarded)
    jobs = [JobSpec("huge", 0.0, 10.0, 10**9), JobSpec("ok", 0.0, 100.0, 1)]
    res = run_jobs(_nodes(2, 8), jobs, "gpupool", config=JobSimConfig(sample_interval_s=0, restart_overhead_s=0.0))
    by_id = {j["job_id"]: j for j in res.jobs}
    assert by_id["ok"]["status"] == "finished"
    assert by_id["huge"]["status"] == "unfinished"
    assert "the cluster can hold only" in by_id["huge"]["reason"]


# ------------------------------------------------------------------ GpuAutoscaler controller
def _controller(payload, current: int = 2):
    import json

    from kubernetes import client

    from gpupool.k8s.autoscaler.controller import AutoscalerController, ControllerConfig
    from gpupool.k8s.autoscaler.prometheus import parse_response, reduce_samples

    class Prom:
        def value(self, query: str, how: str):
            return reduce_samples(parse_response(payload, query), how)

    ctl = AutoscalerController(client.ApiClient(client.Configuration()), Prom(), ControllerConfig(),  # type: ignore[arg-type]
                               clock=lambda: 1000.0)
    writes: list[int] = []
    statuses: list[str] = []
    ctl._read_scale = lambda cfg: {"spec": {"replicas": current}}  # type: ignore[method-assign]
    ctl._write_scale = lambda cfg, n: writes.append(n)  # type: ignore[method-assign]
    # the API server only takes JSON: NaN / Infinity in a status body is a 400, the status is never written
    ctl._write_status = lambda obj, ns, name, old, new: statuses.append(json.dumps(new, allow_nan=False))  # type: ignore[method-assign]
    ctl.recorder.event = lambda *a, **k: None  # type: ignore[method-assign]
    return ctl, writes, statuses


def _gpu_autoscaler() -> dict:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GpuAutoscaler",
            "metadata": {"name": "llm", "namespace": "inference", "uid": "u1", "generation": 1},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                     "minReplicas": 1, "maxReplicas": 10, "metrics": [{"name": "concurrency", "target": 8}]}}


def test_a_metric_whose_sum_overflows_is_reported_and_the_status_is_still_written() -> None:
    vec = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pod": f"llm-{i}"}, "value": [1.0, "1e308"]} for i in range(2)]}}
    ctl, writes, statuses = _controller(vec)
    out = ctl.reconcile(_gpu_autoscaler())
    assert out.result == "no_metrics", out
    assert "not finite" in out.reason
    assert writes == [] and len(statuses) == 1


# ------------------------------------------------------------------ cluster YAML
@pytest.mark.parametrize(("field", "value", "words"), [
    ("cpuCores", "1.0e+300", "more than a node may have"),
    ("memoryGiB", "1.0e+10", "more than a node may have"),
    ("gpusPerNode", "100", "must be <= 64"),
    ("count", "100000000", "must be <= 1000000"),
])
def test_cluster_numbers_past_the_node_limits_name_the_file_field_and_line(tmp_path, field, value, words) -> None:
    from gpupool.clusterspec import ClusterSpecError, load_cluster

    pool = {"name": "a", "count": "2", "gpuModel": "A100-80GB", "gpusPerNode": "8", "cpuCores": "64",
            "memoryGiB": "512"} | {field: value}
    path = tmp_path / "c.yaml"
    path.write_text("apiVersion: gpupool.io/v1alpha1\nkind: Cluster\nmetadata: {name: t}\nspec:\n  nodePools:\n"
                    "    - {" + ", ".join(f"{k}: {v}" for k, v in pool.items()) + "}\n")
    with pytest.raises(ClusterSpecError) as exc:  # before the fix: ValueError "node a-0000: cpu_milli 1000...0
        load_cluster(path)                        # outside 0..1000000000" (no file, field or line), or a hang
    text = str(exc.value)
    assert str(path) in text and f"spec.nodePools[0].{field}" in text and "(line 6)" in text and words in text


# ------------------------------------------------------------------ pod requests
@pytest.mark.parametrize("raw", ["2000", "2e3", "2E3", "2.0e+3", "20e2"])
def test_kai_gpu_memory_in_exponent_form_is_mib_like_the_plain_number(raw: str) -> None:
    # before the fix "2e3" (a Kubernetes quantity without a unit, = 2000) was read as 2000 bytes: 1 MiB booked
    from gpupool.k8s.requests import parse_pod

    pod = {"metadata": {"name": "p", "namespace": "default", "annotations": {"gpu-memory": raw}},
           "spec": {"containers": [{"name": "main", "resources": {}}]}}
    assert parse_pod(pod).gpu_memory_mib == 2000


# ------------------------------------------------------------------ scheduler extender
@pytest.mark.parametrize("args", [
    {"NodeNames": 5},                       # was: TypeError -> HTTP 500
    {"NodeNames": "gpu-a"},                 # was: read letter by letter (nodes 'g', 'p', 'u', '-', 'a')
    {"Nodes": [{"metadata": {"name": "gpu-a"}}]},   # a bare list, not a NodeList: was AttributeError -> 500
    {"Nodes": {"items": ["gpu-a"]}},        # was AttributeError -> 500
])
def test_malformed_extender_args_get_an_error_naming_the_field_not_a_500(args) -> None:
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from gpupool.k8s.extender import Extender, NodeCache
    from gpupool.k8s.extender_http import make_app

    cache = NodeCache()
    cache.load([{"metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                                         "nvidia.com/gpu.count": "1"}},
                 "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "1"}}}],
               [])
    pod = {"metadata": {"name": "p", "namespace": "default"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
    body = {"Pod": pod, **args}

    async def go():
        async with TestClient(TestServer(make_app(Extender(cache)))) as http:
            f = await http.post("/filter", json=body)
            p = await http.post("/prioritize", json=body)
            return f.status, await f.json(), p.status, await p.json()

    f_status, f_body, p_status, p_body = asyncio.run(go())
    field = "Nodes" if "Nodes" in args else "NodeNames"
    assert f_status == 200 and f"ExtenderArgs.{field}" in f_body["Error"]
    assert not f_body["NodeNames"] and not f_body["FailedNodes"]
    assert p_status == 400 and f"ExtenderArgs.{field}" in p_body["error"]


# ------------------------------------------------------------------ pool scheduler far out in time
def _far_out_run(queue) -> None:
    # Philly timestamps 0001..9999 are valid rows: the last jobs arrive ~3.2e11 s in, where now + 1e-6 == now
    jobs = [JobSpec("early", 0.0, 100.0, 1), JobSpec("b", 3.155e11, 20_000.0, 7),
            JobSpec("c", 3.155e11 + 60.0, 20_000.0, 16)]
    res = run_jobs(_nodes(2, 8), jobs, "gpupool", config=JobSimConfig(sample_interval_s=0, restart_overhead_s=0.0))
    queue.put(sorted((j["job_id"], j["status"]) for j in res.jobs))


def test_a_level_crossing_far_out_in_time_does_not_loop_forever() -> None:
    # before the fix _roll_levels pushed the demotion at `now` again and again (a crossing rounded just short of
    # its boundary, and now + 1e-6 == now): the run never ended
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_far_out_run, args=(queue,))
    proc.start()
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        proc.join()
        pytest.fail("the job simulation did not end within 60 s")
    assert queue.get(timeout=5) == [("b", "finished"), ("c", "finished"), ("early", "finished")]


# ------------------------------------------------------------------ queues
def test_a_queue_priority_past_int64_in_a_queue_file_names_the_field(tmp_path) -> None:
    from gpupool.engine.pool.queues import QueueConfigError, load_queues_yaml

    path = tmp_path / "q.yaml"
    path.write_text("queues:\n  - {name: a, priority: 99999999999999999999999}\n  - {name: b}\n")
    with pytest.raises(QueueConfigError, match=r"queues\[0\] \(a\): field 'priority'"):  # was: OverflowError
        load_queues_yaml(path)


def test_a_queue_cr_with_a_huge_priority_is_left_out_and_the_pool_goes_on() -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from k8s_pool_harness import Cluster, node, pod, queue

    c = Cluster([node("n1")], [queue("a", quota=4, priority=10**23), queue("b", quota=4)])
    c.add(*[pod(f"b{i}", 1, queue="b") for i in range(2)])
    c.run(3)
    # before: QueueTree raised OverflowError every cycle (pool_errors 3) and tree_error stayed empty
    assert c.model.stats.get("pool_errors", 0) == 0
    assert "queue a" in c.driver.tree_error and "2147483647" in c.driver.tree_error
    assert c.running() == ["default/b0", "default/b1"]


def test_an_empty_node_list_as_go_encodes_it_is_no_error() -> None:
    from gpupool.k8s.extender_wire import candidate_nodes as _candidates

    assert _candidates({"Nodes": {"items": None}}) == ([], [])  # Go: a nil slice is null


def test_an_unknown_queue_is_named_before_capacity() -> None:
    from gpupool.engine.pool.queues import QueueSpec, QueueTree
    from gpupool.sim.jobs import JobSpec

    jobs = [JobSpec("huge", 0.0, 10.0, 10**5, queue="nosuch"), JobSpec("ok", 0.0, 100.0, 1, queue="a")]
    res = run_jobs(_nodes(2, 8), jobs, "gpupool", queues=QueueTree([QueueSpec(name="a", quota=8)]),
                   config=JobSimConfig(sample_interval_s=0, restart_overhead_s=0.0))
    by_id = {j["job_id"]: j for j in res.jobs}
    assert by_id["huge"]["reason"].startswith("unknown queue"), by_id["huge"]["reason"]
    assert by_id["ok"]["status"] == "finished"


# ------------------------------------------------------------------ input files: one reader, one error form
def test_every_yaml_file_is_read_through_the_one_helper() -> None:
    # issue 31: each loader had its own YAML error (PyYAML's multi-line dump in the queue, scenario, throughput,
    # fake-GPU and scheduler configuration files); now gpupool.inputs reads them all, FILE:LINE:COLUMN: what
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[1] / "src" / "gpupool"
    readers = sorted(str(p.relative_to(src)) for p in src.rglob("*.py")
                     if re.search(r"\byaml\.(safe_)?load(_all)?\(|from yaml import", p.read_text(encoding="utf-8")))
    # snapshots.py reads kubectl's multi-document output (safe_load_all), its errors through inputs.yaml_error_message
    assert readers == ["inputs.py", "k8s/objects/snapshots.py"]


def test_a_snapshot_yaml_error_is_one_line_with_file_line_and_column(tmp_path) -> None:
    from gpupool.k8s.objects.snapshots import SnapshotError, load_snapshot

    f = tmp_path / "snap.yaml"
    f.write_text("apiVersion: v1\nkind: List\nitems:\n- kind: Node\n   metadata: {name: n}\n")
    with pytest.raises(SnapshotError) as info:
        load_snapshot(f)
    assert str(info.value).startswith(f"{f}:5:") and "invalid YAML" in str(info.value)
    assert "\n" not in str(info.value)
