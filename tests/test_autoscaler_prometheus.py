"""The autoscaler's Prometheus client (gpupool.k8s.autoscaler.prometheus) against :class:`PromStub`, a Prometheus
HTTP API stub on loopback that answers ``/api/v1/query`` in the real server's wire format.

The formats are Prometheus's (docs "HTTP API"; web/api/v1/api.go): success ``{"status": "success", "data":
{"resultType": "vector", "result": [{"metric": {...}, "value": [<unix s>, "<value as string>"]}]}}`` (also
``scalar`` and ``matrix``), failure ``{"status": "error", "errorType": "bad_data", "error": "..."}`` with HTTP 400
(bad query), 422 (execution) or 503 (timeout). The controller tests and the e2e suite use the same stub.
"""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.parse
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpupool.k8s.autoscaler.prometheus import (
    PrometheusClient,
    PrometheusError,
    Sample,
    parse_response,
    per_instance,
    reduce_samples,
)

Series = list[tuple[Mapping[str, str], float | str]]
# Prometheus's duration parameters: seconds as a number ("1.5"), or whole numbers with units ("1m30s", "1500ms")
DURATION = re.compile(r"\d+(\.\d+)?|((\d+)(y|w|d|h|ms|m|s))+")


class PromError:
    """An error answer: HTTP ``status`` with ``{"status": "error", "errorType": ..., "error": ...}``."""

    def __init__(self, status: int, error_type: str, message: str) -> None:
        self.status, self.error_type, self.message = status, error_type, message


class PromStub:
    """``/api/v1/query`` (GET and form POST) and ``/-/ready`` on 127.0.0.1, a free port.

    ``set(query, value)``: the answer to exactly that query text: a number (one series with no labels), a list of
    ``(labels, value)`` (a vector; values may be "NaN" / "+Inf"), a :class:`PromError`, ``"scalar:1.5"`` (a scalar
    result), ``"matrix"``, or a callable returning one of these (called per request). An unknown query answers an
    empty vector, as Prometheus does for a selector that matches nothing. ``fail_next(n, status, error_type)``:
    the next ``n`` requests fail whatever the query. ``requests``: every query received, in order.
    """

    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.requests: list[dict[str, str]] = []
        self._fail: list[PromError] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's naming
                url = urllib.parse.urlsplit(self.path)
                params = dict(urllib.parse.parse_qsl(url.query))
                self._serve(url.path, params)

            def do_POST(self) -> None:  # noqa: N802
                url = urllib.parse.urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                params = dict(urllib.parse.parse_qsl(self.rfile.read(length).decode()))
                self._serve(url.path, params)

            def _serve(self, path: str, params: dict[str, str]) -> None:
                if path == "/-/ready":
                    self._send(200, b"Prometheus Server is Ready.\n", "text/plain")
                    return
                if path != "/api/v1/query":
                    self._send(404, b"404 page not found\n", "text/plain")
                    return
                status, body = stub.answer(params)
                self._send(status, json.dumps(body).encode(), "application/json")

            def _send(self, status: int, data: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="prom-stub", daemon=True)
        self._thread.start()

    def set(self, query: str, value: Any) -> None:
        with self._lock:
            self.answers[query] = value

    def fail_next(self, n: int, status: int = 503, error_type: str = "timeout",
                  message: str = "query timed out in expression evaluation") -> None:
        with self._lock:
            self._fail.extend(PromError(status, error_type, message) for _ in range(n))

    def queries(self) -> list[str]:
        with self._lock:
            return [r.get("query", "") for r in self.requests]

    def answer(self, params: dict[str, str]) -> tuple[int, dict[str, Any]]:
        query = params.get("query", "")
        with self._lock:
            self.requests.append(params)
            value = self._fail.pop(0) if self._fail else self.answers.get(query, [])
        if callable(value):
            value = value()
        if not query:
            value = PromError(400, "bad_data", 'invalid parameter "query": 1:1: parse error: no expression found '
                                               "in input")
        timeout = params.get("timeout")
        if timeout is not None and not DURATION.fullmatch(timeout):  # as web/api/v1 parseDuration
            value = PromError(400, "bad_data", f'invalid parameter "timeout": cannot parse "{timeout}" to a valid '
                                               "duration")
        if isinstance(value, PromError):
            return value.status, {"status": "error", "errorType": value.error_type, "error": value.message}
        ts = float(params.get("time") or time.time())
        if isinstance(value, str) and value.startswith("scalar:"):
            return 200, {"status": "success", "data": {"resultType": "scalar", "result": [ts, value[7:]]}}
        if value == "matrix":
            return 200, {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "up"}, "values": [[ts - 15, "1"], [ts, "1"]]}]}}
        series: Series = [({}, value)] if isinstance(value, int | float) else list(value)
        result = [{"metric": dict(labels), "value": [ts, v if isinstance(v, str) else repr(float(v))]}
                  for labels, v in series]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)


@pytest.fixture
def stub():
    s = PromStub()
    yield s
    s.close()


@pytest.fixture
def prom(stub: PromStub):
    c = PrometheusClient(stub.url, timeout=2.0, retries=2, backoff=0.01)
    yield c
    c.close()


# ------------------------------------------------------------------ the wire format
def test_vector_values_labels_and_reducers(stub: PromStub, prom: PrometheusClient) -> None:
    q = 'sum by (pod) (vllm:num_requests_running{namespace="inference",pod=~"llm-[a-z0-9]+-[a-z0-9]+"})'
    stub.set(q, [({"pod": "llm-7d9f-abcde"}, 3.0), ({"pod": "llm-7d9f-fghij"}, "5.5"), ({"pod": "llm-x"}, "1e1")])
    samples = prom.query(q)
    assert [s.labels["pod"] for s in samples] == ["llm-7d9f-abcde", "llm-7d9f-fghij", "llm-x"]
    assert [s.value for s in samples] == [3.0, 5.5, 10.0]
    assert all(abs(s.timestamp - time.time()) < 60 for s in samples)
    assert stub.queries() == [q]  # the PromQL arrives as written (braces, quotes, regex)
    assert stub.requests[0]["timeout"] == "1500ms"  # Prometheus stops evaluating when the client gives up
    assert prom.value(q, "sum") == 18.5
    assert prom.value(q, "avg") == pytest.approx(18.5 / 3)
    assert prom.value(q, "max") == 10.0 and prom.value(q, "min") == 3.0


def test_scalar_result(stub: PromStub, prom: PrometheusClient) -> None:
    stub.set("scalar(up)", "scalar:0.25")
    (s,) = prom.query("scalar(up)")
    assert s.value == 0.25 and s.labels == {}
    assert prom.value("scalar(up)") == 0.25


def test_empty_vector_nan_and_inf_are_no_value(stub: PromStub, prom: PrometheusClient) -> None:
    assert prom.query("absent_metric") == [] and prom.value("absent_metric") is None
    stub.set("nan", [({"pod": "a"}, "NaN")])
    assert prom.value("nan") is None  # e.g. histogram_quantile over no requests: no proposal, not a zero
    stub.set("mixed", [({"pod": "a"}, "NaN"), ({"pod": "b"}, "+Inf"), ({"pod": "c"}, "2")])
    assert prom.value("mixed", "avg") == 2.0


def test_bad_query_is_a_clear_error_and_not_retried(stub: PromStub, prom: PrometheusClient) -> None:
    msg = 'invalid parameter "query": 1:8: parse error: unexpected "}" in label matching'
    stub.set("sum(x{)", PromError(400, "bad_data", msg))
    with pytest.raises(PrometheusError) as info:
        prom.query("sum(x{)")
    err = info.value
    assert (err.status, err.error_type, err.retryable) == (400, "bad_data", False)
    assert "sum(x{)" in str(err) and "HTTP 400" in str(err) and "parse error" in str(err)
    assert len(stub.requests) == 1  # 400 is never retried
    stub.set("exec", PromError(422, "execution", "many-to-many matching not allowed"))
    with pytest.raises(PrometheusError, match="422 execution: many-to-many"):
        prom.query("exec")


def test_timeouts_are_retried_then_succeed(stub: PromStub, prom: PrometheusClient) -> None:
    stub.set("up", 1.0)
    stub.fail_next(2, 503, "timeout")
    assert prom.value("up") == 1.0
    assert len(stub.requests) == 3  # two 503 answers, then the value (retries=2)


def test_persistent_timeouts_give_the_servers_error(stub: PromStub, prom: PrometheusClient) -> None:
    stub.fail_next(5, 503, "timeout", "query timed out in expression evaluation")
    with pytest.raises(PrometheusError) as info:
        prom.query("up")
    assert info.value.status == 503 and info.value.error_type == "timeout" and info.value.retryable
    assert "query timed out" in str(info.value)
    assert len(stub.requests) == 3  # bounded: 1 + retries


def test_connection_refused_is_a_transport_error() -> None:
    stub = PromStub()
    url = stub.url
    stub.close()  # nothing listens there now
    client = PrometheusClient(url, timeout=1.0, retries=1, backoff=0.01)
    t0 = time.monotonic()
    with pytest.raises(PrometheusError) as info:
        client.query("up")
    assert info.value.error_type == "transport" and info.value.status is None and info.value.retryable
    assert time.monotonic() - t0 < 5


def test_range_vector_is_rejected_with_a_hint(stub: PromStub, prom: PrometheusClient) -> None:
    stub.set("up[5m]", "matrix")
    with pytest.raises(PrometheusError, match="instant vector or scalar is needed"):
        prom.query("up[5m]")


def test_not_json_answer() -> None:
    """A proxy's HTML error page in front of Prometheus: the status and a bit of the body, no JSON crash."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Html(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = b"<html><body>403 Forbidden</body></html>"
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Html)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = PrometheusClient(f"http://127.0.0.1:{server.server_port}", retries=0)
        with pytest.raises(PrometheusError, match="HTTP 403 http: Forbidden"):
            client.query("up")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("payload, match", [
    ({"status": "error", "errorType": "bad_data", "error": "boom"}, "bad_data: boom"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1]}]}},
     "no \\[time, value\\]"),
    ({"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}},
     "'x' is not a number"),
    ({"status": "success", "data": {"resultType": "string", "result": [1, "a"]}}, "instant vector or scalar"),
    ({"status": "weird"}, "unexpected answer"),
    ([1, 2], "not a JSON object"),
])
def test_parse_response_rejects_what_is_not_the_format(payload: Any, match: str) -> None:
    with pytest.raises(PrometheusError, match=match):
        parse_response(payload, "q")


def test_reduce_samples_hand_computed() -> None:
    from gpupool.k8s.autoscaler.prometheus import Sample

    xs = [Sample({}, 0, v) for v in (1.0, 2.0, 6.0, float("nan"))]
    assert (reduce_samples(xs, "sum"), reduce_samples(xs, "avg"), reduce_samples(xs, "max")) == (9.0, 3.0, 6.0)
    assert reduce_samples([], "sum") is None


def test_stub_rejects_a_fractional_duration_as_prometheus_does(stub: PromStub) -> None:
    """Found against the real server (tests/e2e/test_autoscaler_e2e.py): ``timeout=1.5s`` is a 400 bad_data."""
    assert stub.answer({"query": "up", "timeout": "1.5s"})[0] == 400
    assert stub.answer({"query": "up", "timeout": "1500ms"})[0] == 200
    assert stub.answer({"query": "up", "timeout": "2.5"})[0] == 200


def test_ready_and_bad_url(stub: PromStub, prom: PrometheusClient) -> None:
    assert prom.ready()
    with pytest.raises(ValueError, match="expected http"):
        PrometheusClient("prometheus:9090")



def test_cli_help_names_the_retried_statuses() -> None:
    """`gpupool autoscaler --help` says which answers are retried: RETRY_STATUS exactly (not "5xx": a 500 is not)."""
    from typer.testing import CliRunner

    from gpupool.cli import app
    from gpupool.k8s.autoscaler.prometheus import RETRY_STATUS

    out = " ".join(CliRunner().invoke(app, ["autoscaler", "--help"], env={"COLUMNS": "200"}).output.split())
    assert "/".join(map(str, RETRY_STATUS)) in out and "5xx" not in out


def test_per_instance_reads_mig_instances_from_their_own_metric_dcgm216() -> None:
    """dcgm-exporter #216: DCGM_FI_DEV_GPU_UTIL is 0 on MIG instances; their series come from the per-instance
    query, whole GPUs keep theirs, an instance with no reading there is left out (not 0)."""
    whole = [Sample({"gpu": "0", "pod": "a"}, 1.0, 40.0),
             Sample({"gpu": "1", "GPU_I_ID": "7", "pod": "b"}, 1.0, 0.0),
             Sample({"gpu": "1", "GPU_I_ID": "8", "pod": "c"}, 1.0, 0.0)]
    mig = [Sample({"gpu": "1", "GPU_I_ID": "7", "pod": "b"}, 1.0, 80.0), Sample({"gpu": "2", "pod": "x"}, 1.0, 5.0)]
    got = per_instance(whole, mig)
    assert [(s.labels.get("pod"), s.value) for s in got] == [("a", 40.0), ("b", 80.0)]
    assert reduce_samples(got, "avg") == 60.0
