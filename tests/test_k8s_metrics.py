"""SchedulerMetrics over real HTTP: /metrics parsed as the Prometheus text format, /healthz, /readyz; logs."""

from __future__ import annotations

import io
import json
import logging
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpupool.cluster import ClusterState
from gpupool.k8s.metrics import MetricsServer, SchedulerMetrics, logging_setup
from gpupool.model import NodeSpec, PodRequest


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Type", ""), exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def served():
    metrics = SchedulerMetrics()
    alive = {"ok": True}
    server = MetricsServer(metrics, host="127.0.0.1", port=0, liveness=lambda: alive["ok"]).start()
    yield metrics, f"http://127.0.0.1:{server.port}", alive
    server.stop()


def test_scrape_reports_every_series(served):
    metrics, url, _ = served
    state = ClusterState([NodeSpec("a100-0", 64000, 500_000, 4, "A100-80GB"),
                          NodeSpec("t4-0", 32000, 100_000, 2, "T4"),
                          NodeSpec("cpu-0", 16000, 64_000)])
    state.allocate(PodRequest("train", num_gpu=2, gpu_milli=1000), 0, [0, 1])
    state.allocate(PodRequest("nb", num_gpu=1, gpu_milli=250), 0, [2])
    metrics.set_allocation(state)
    for _ in range(3):
        metrics.observe_attempt("scheduled", 0.004)
    with metrics.attempt() as outcome:
        outcome["result"] = "unschedulable"
    with pytest.raises(RuntimeError), metrics.attempt():
        raise RuntimeError("API down")
    metrics.set_pending(7)
    metrics.set_queue("team-a", used=6, quota=8, limit=-1)
    metrics.set_queue("team-b", used=0, quota=2, limit=4)
    metrics.set_leader(True)

    status, ctype, body = _get(url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    s = _samples(body)
    assert s[("gpupool_schedule_attempts_total", (("result", "scheduled"),))] == 3
    assert s[("gpupool_schedule_attempts_total", (("result", "unschedulable"),))] == 1
    assert s[("gpupool_schedule_attempts_total", (("result", "error"),))] == 1
    assert s[("gpupool_scheduling_duration_seconds_count", ())] == 5
    assert s[("gpupool_scheduling_duration_seconds_bucket", (("le", "0.005"),))] >= 3
    assert s[("gpupool_scheduling_duration_seconds_bucket", (("le", "+Inf"),))] == 5
    assert s[("gpupool_pending_pods", ())] == 7
    assert s[("gpupool_gpu_allocation_ratio", (("model", "A100-80GB"), ("node", "a100-0")))] == pytest.approx(2.25 / 4)
    assert s[("gpupool_gpu_allocation_ratio", (("model", "T4"), ("node", "t4-0")))] == 0
    assert not any(k[0] == "gpupool_gpu_allocation_ratio" and ("node", "cpu-0") in k[1] for k in s)
    assert s[("gpupool_queue_gpus", (("kind", "used"), ("queue", "team-a")))] == 6
    assert s[("gpupool_queue_gpus", (("kind", "quota"), ("queue", "team-a")))] == 8
    assert s[("gpupool_queue_gpus", (("kind", "limit"), ("queue", "team-a")))] == -1
    assert s[("gpupool_queue_gpus", (("kind", "limit"), ("queue", "team-b")))] == 4
    assert s[("gpupool_leader", ())] == 1

    # Nodes and queues that disappear stop being reported.
    metrics.set_allocation(ClusterState([NodeSpec("t4-0", 32000, 100_000, 2, "T4")]))
    metrics.set_queues({"team-b": (1, 2, 4)})
    s = _samples(_get(url + "/metrics")[2])
    alloc = [k for k in s if k[0] == "gpupool_gpu_allocation_ratio"]
    assert alloc == [("gpupool_gpu_allocation_ratio", (("model", "T4"), ("node", "t4-0")))]
    assert {dict(k[1])["queue"] for k in s if k[0] == "gpupool_queue_gpus"} == {"team-b"}
    with pytest.raises(ValueError):
        metrics.observe_attempt("maybe")


def test_health_and_readiness(served):
    metrics, url, alive = served
    assert _get(url + "/healthz")[0] == 200
    status, _, body = _get(url + "/readyz")
    assert status == 503 and "not synced" in body
    metrics.set_ready()
    assert _get(url + "/readyz")[:1] == (200,)
    metrics.set_ready(False)
    assert _get(url + "/readyz")[0] == 503
    alive["ok"] = False
    assert _get(url + "/healthz")[0] == 503
    assert _get(url + "/nope")[0] == 404


def test_two_instances_do_not_collide():
    a, b = SchedulerMetrics(), SchedulerMetrics()
    a.observe_attempt("scheduled")
    assert a.registry.get_sample_value("gpupool_schedule_attempts_total", {"result": "scheduled"}) == 1
    assert b.registry.get_sample_value("gpupool_schedule_attempts_total", {"result": "scheduled"}) == 0


@pytest.mark.parametrize("fmt", ["json", "kv"])
def test_structured_logs(fmt):
    stream = io.StringIO()
    root_level = logging.getLogger().level
    handler = logging_setup("DEBUG", fmt=fmt, stream=stream)
    try:
        logging.getLogger("gpupool.test").info("bound pod %s", "team-a/p1",
                                               extra={"node": "a100-0", "gpus": [0, 1], "note": "two words"})
        try:
            raise ValueError("boom")
        except ValueError:
            logging.getLogger("gpupool.test").exception("bind failed")
        logging_setup("INFO", fmt=fmt, stream=stream)  # a second call replaces, not stacks, the handler
        assert sum(getattr(h, "_gpupool", False) for h in logging.getLogger().handlers) == 1
    finally:
        for h in list(logging.getLogger().handlers):
            if getattr(h, "_gpupool", False):
                logging.getLogger().removeHandler(h)
        logging.getLogger().setLevel(root_level)
    lines = stream.getvalue().strip().splitlines()
    if fmt == "json":
        first = json.loads(lines[0])
        assert first["msg"] == "bound pod team-a/p1" and first["level"] == "info"
        assert first["node"] == "a100-0" and first["gpus"] == [0, 1] and first["logger"] == "gpupool.test"
        assert first["ts"].endswith("Z")
        err = json.loads(lines[1])
        assert err["level"] == "error" and "ValueError: boom" in err["exc"]
    else:
        assert lines[0].startswith("ts=") and 'msg="bound pod team-a/p1"' in lines[0]
        assert "node=a100-0" in lines[0] and 'note="two words"' in lines[0]
        assert "level=error" in lines[1] and "exc=" in lines[1]
    with pytest.raises(ValueError):
        logging_setup(fmt="xml", stream=io.StringIO())
    assert handler is not None


def test_cycle_events_and_state_series(served):
    metrics, url, _ = served
    metrics.observe_cycle(0.004)
    metrics.inc_events_dropped()
    metrics.set_model_stats({"rebuilds": 1, "drift": 0, "parsed_pods": 30, "parsed_nodes": 5})
    metrics.set_model_stats({"rebuilds": 2, "drift": 0, "parsed_pods": 31, "parsed_nodes": 5})
    _, _, text = _get(url + "/metrics")
    s = _samples(text)
    assert s[("gpupool_scheduling_cycle_duration_seconds_count", ())] == 1
    assert s[("gpupool_scheduling_cycle_duration_seconds_bucket", (("le", "0.005"),))] == 1
    assert s[("gpupool_events_dropped_total", ())] == 1
    assert s[("gpupool_state_operations_total", (("op", "rebuilds"),))] == 2
    assert s[("gpupool_state_operations_total", (("op", "parsed_pods"),))] == 31
    assert s[("gpupool_state_operations_total", (("op", "drift"),))] == 0


def test_preemption_series(served):
    metrics, url, _ = served
    s = _samples(_get(url + "/metrics")[2])
    assert s[("gpupool_evictions_total", (("result", "refused"),))] == 0  # every result reported from the start
    assert s[("gpupool_preemptions_total", (("action", "reclaim"),))] == 0
    metrics.inc_preemption("reclaim")
    metrics.inc_preemption("preempt")
    metrics.inc_preemption("reclaim")
    metrics.inc_eviction("evicted", 3)
    metrics.inc_eviction("refused")
    metrics.inc_eviction("gone", 0)
    metrics.observe_preemption_latency(12.0)
    metrics.observe_preemption_latency(0.2)
    s = _samples(_get(url + "/metrics")[2])
    assert s[("gpupool_preemptions_total", (("action", "reclaim"),))] == 2
    assert s[("gpupool_preemptions_total", (("action", "preempt"),))] == 1
    assert s[("gpupool_evictions_total", (("result", "evicted"),))] == 3
    assert s[("gpupool_evictions_total", (("result", "refused"),))] == 1
    assert s[("gpupool_evictions_total", (("result", "gone"),))] == 0
    assert s[("gpupool_preemption_latency_seconds_count", ())] == 2
    assert s[("gpupool_preemption_latency_seconds_sum", ())] == pytest.approx(12.2)
    assert s[("gpupool_preemption_latency_seconds_bucket", (("le", "0.5"),))] == 1
    assert s[("gpupool_preemption_latency_seconds_bucket", (("le", "15.0"),))] == 2
    with pytest.raises(ValueError):
        metrics.inc_eviction("maybe")


def test_queue_fair_share_series_in_pool_mode():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpupool.k8s.metrics import SchedulerMetrics

    m = SchedulerMetrics()

    def series() -> dict:
        return {(s.labels["queue"], s.labels["kind"]): s.value
                for f in text_string_to_metric_families(generate_latest(m.registry).decode())
                for s in f.samples if s.name == "gpupool_queue_gpus"}

    m.set_queues({"a": (3.0, 4.0, -1.0, 6.5), "b": (1.0, 2.0, 8.0)})
    got = series()
    assert got[("a", "fair_share")] == 6.5 and ("b", "fair_share") not in got and got[("b", "limit")] == 8.0
    m.set_queues({"a": (3.0, 4.0, -1.0, None)})  # fair share no longer known; b gone
    got = series()
    assert ("a", "fair_share") not in got and not any(q == "b" for q, _ in got)


def test_logging_setup_writes_to_the_stderr_of_the_moment(monkeypatch) -> None:
    """A handler installed while stderr was a test runner's buffer must not hold that buffer once it is closed:
    records go to the stderr of the moment, and no "--- Logging error ---" appears."""
    import io
    import logging
    import sys

    from gpupool.k8s.metrics import logging_setup

    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    handler = logging_setup("INFO", "kv")
    try:
        logging.getLogger("gpupool.test").info("one")
        first.close()
        monkeypatch.setattr(sys, "stderr", second)
        logging.getLogger("gpupool.test").info("two")
        out = second.getvalue()
        assert "msg=two" in out and "Logging error" not in out
    finally:
        logging.getLogger().removeHandler(handler)
