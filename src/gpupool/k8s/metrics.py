"""Observability of the Kubernetes drivers: Prometheus metrics, health endpoints and structured logs.

* :class:`SchedulerMetrics` holds the scheduler's series in its own ``CollectorRegistry`` (so that
  several schedulers, or tests, never collide in the global one):

  - ``gpupool_schedule_attempts_total{result="scheduled|unschedulable|error"}``
  - ``gpupool_scheduling_duration_seconds`` (histogram of one scheduling cycle)
  - ``gpupool_pending_pods``
  - ``gpupool_gpu_allocation_ratio{node, model}`` (milli-GPU handed out / installed)
  - ``gpupool_queue_gpus{queue, kind="used|quota|limit"}`` (limit ``-1`` = unlimited)
  - ``gpupool_leader`` (1 while this replica holds the leader Lease)
  - ``gpupool_preemptions_total{action}`` (preemptions carried out: their dry run passed; ``reclaim``,
    ``preempt``, ``shrink``, ``consolidate``)
  - ``gpupool_evictions_total{result="evicted|refused|failed|gone"}`` (victims, one per pod: evicted; refused in
    the dry run, e.g. by a PodDisruptionBudget; failed after a passed dry run; already gone)
  - ``gpupool_preemption_latency_seconds`` (histogram: from the preemption decision to the preemptor's binding)

* :class:`MetricsServer` serves ``/metrics``, ``/healthz`` (the process answers and its liveness
  check, if any, passes) and ``/readyz`` (the scheduler said its cache is synced:
  :meth:`SchedulerMetrics.set_ready`) on a background thread.

* :func:`logging_setup` configures stdlib logging with one JSON object (or ``key=value`` pairs) per
  line; fields passed as ``extra={...}`` become fields of the line.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import IO
from wsgiref.simple_server import WSGIRequestHandler, make_server

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from gpupool.cluster import ClusterState
from gpupool.model import MILLI

RESULTS = ("scheduled", "unschedulable", "error")
QUEUE_KINDS = ("used", "quota", "limit", "fair_share")
EVICTION_RESULTS = ("evicted", "refused", "failed", "gone")
PREEMPTION_ACTIONS = ("reclaim", "preempt", "shrink", "consolidate")
PREEMPTION_BUCKETS = (0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SchedulerMetrics:
    """The scheduler's Prometheus series, plus the readiness flag the ``/readyz`` endpoint reports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.attempts = Counter(
            "gpupool_schedule_attempts", "Scheduling attempts by result.", ["result"], registry=self.registry,
        )
        for result in RESULTS:
            self.attempts.labels(result=result)
        self.duration = Histogram(
            "gpupool_scheduling_duration_seconds", "Time to schedule one pod (filter, score, bind).",
            buckets=DURATION_BUCKETS, registry=self.registry,
        )
        self.pending = Gauge("gpupool_pending_pods", "Pods waiting for gpupool to place them.",
                             registry=self.registry)
        self.allocation = Gauge(
            "gpupool_gpu_allocation_ratio", "Share of the node's GPU capacity handed out to pods (0..1).",
            ["node", "model"], registry=self.registry,
        )
        self.queue_gpus = Gauge(
            "gpupool_queue_gpus", "GPUs per queue: used, quota, limit (-1 = unlimited), fair_share (pool mode).",
            ["queue", "kind"], registry=self.registry,
        )
        self.leader = Gauge("gpupool_leader", "1 while this replica holds the leader Lease.",
                            registry=self.registry)
        self.events_dropped = Counter(
            "gpupool_events_dropped", "Kubernetes Events not posted because the recorder's queue was full.",
            registry=self.registry,
        )
        self.cycle = Histogram(
            "gpupool_scheduling_cycle_duration_seconds",
            "One scheduling cycle: apply the watch changes to the incremental state and plan every pending pod.",
            buckets=DURATION_BUCKETS, registry=self.registry,
        )
        self.model = Counter(
            "gpupool_state_operations", "Incremental cluster state: rebuilds (node set or capacity changed, relist), "
            "drift (a relist found the incremental books wrong), parsed objects.", ["op"], registry=self.registry,
        )
        for op in ("rebuilds", "drift", "parsed_pods", "parsed_nodes"):
            self.model.labels(op=op)
        self.preemptions = Counter(
            "gpupool_preemptions", "Preemptions carried out (their eviction dry run passed), by action.", ["action"],
            registry=self.registry,
        )
        for action in PREEMPTION_ACTIONS:
            self.preemptions.labels(action=action)
        self.evictions = Counter(
            "gpupool_evictions", "Preemption victims by outcome: evicted, refused (dry run, e.g. a "
            "PodDisruptionBudget), failed (after a passed dry run), gone (deleted meanwhile).", ["result"],
            registry=self.registry,
        )
        for result in EVICTION_RESULTS:
            self.evictions.labels(result=result)
        self.preemption_latency = Histogram(
            "gpupool_preemption_latency_seconds",
            "From the preemption decision to the binding of the pod it made room for (seconds).",
            buckets=PREEMPTION_BUCKETS, registry=self.registry,
        )
        self._model_seen: dict[str, int] = {}
        self._ready = threading.Event()
        self._alloc_labels: set[tuple[str, str]] = set()
        self._queues: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ scheduling
    def observe_attempt(self, result: str, seconds: float | None = None) -> None:
        """Count one attempt (``result`` in :data:`RESULTS`) and, if given, its duration."""
        if result not in RESULTS:
            raise ValueError(f"result {result!r} not in {RESULTS}")
        self.attempts.labels(result=result).inc()
        if seconds is not None:
            self.duration.observe(seconds)

    @contextmanager
    def attempt(self) -> Iterator[dict[str, str]]:
        """Time one attempt; set ``outcome["result"]`` inside the block (an exception counts as ``error``)::

            with metrics.attempt() as outcome:
                outcome["result"] = "scheduled" if decision.scheduled else "unschedulable"
        """
        outcome = {"result": "error"}
        start = time.perf_counter()
        try:
            yield outcome
        except BaseException:
            outcome["result"] = "error"
            raise
        finally:
            self.observe_attempt(outcome["result"], time.perf_counter() - start)

    def set_pending(self, count: int) -> None:
        self.pending.set(count)

    # ------------------------------------------------------------------ cluster
    def set_allocation(self, state: ClusterState) -> None:
        """Refresh ``gpupool_gpu_allocation_ratio`` from ``state`` (GPU nodes only; gone nodes are dropped)."""
        handed = np.where(state.gpu_exists, MILLI - state.gpu_free, 0).sum(axis=1)
        capacity = state.gpu_count * MILLI
        labels: set[tuple[str, str]] = set()
        for i in np.flatnonzero(capacity > 0):
            spec = state.nodes[i]
            key = (spec.name, spec.gpu_model)
            labels.add(key)
            self.allocation.labels(node=key[0], model=key[1]).set(float(handed[i]) / float(capacity[i]))
        with self._lock:
            for key in self._alloc_labels - labels:
                self.allocation.remove(*key)
            self._alloc_labels = labels

    def set_queue(self, queue: str, used: float, quota: float, limit: float = -1,
                  fair_share: float | None = None) -> None:
        """GPUs of one queue (``limit`` -1 = unlimited; ``fair_share`` None: not known, the series is dropped)."""
        for kind, value in zip(QUEUE_KINDS, (used, quota, limit, fair_share), strict=True):
            if value is None:
                try:
                    self.queue_gpus.remove(queue, kind)
                except KeyError:
                    pass
                continue
            self.queue_gpus.labels(queue=queue, kind=kind).set(value)
        with self._lock:
            self._queues.add(queue)

    def set_queues(self, queues: Mapping[str, tuple[float, ...]]) -> None:
        """Replace all queues at once: name -> (used, quota, limit[, fair_share]); queues not named are dropped."""
        for name, values in queues.items():
            self.set_queue(name, *values)
        with self._lock:
            gone = self._queues - set(queues)
            self._queues -= gone
        for name in gone:
            for kind in QUEUE_KINDS:
                try:
                    self.queue_gpus.remove(name, kind)
                except KeyError:
                    pass

    def set_leader(self, leading: bool) -> None:
        self.leader.set(1 if leading else 0)

    def inc_events_dropped(self) -> None:
        self.events_dropped.inc()

    def observe_cycle(self, seconds: float) -> None:
        """One scheduling cycle's duration (seconds)."""
        self.cycle.observe(seconds)

    def set_model_stats(self, stats: Mapping[str, int]) -> None:
        """The incremental state's running totals (``ClusterModel.stats``): counted as increments since last."""
        with self._lock:
            for op in ("rebuilds", "drift", "parsed_pods", "parsed_nodes"):
                value = int(stats.get(op, 0))
                delta = value - self._model_seen.get(op, 0)
                if delta > 0:
                    self.model.labels(op=op).inc(delta)
                self._model_seen[op] = value

    # ------------------------------------------------------------------ preemption (pool mode)
    def inc_preemption(self, action: str) -> None:
        """One preemption carried out (its dry run passed); ``action``: reclaim, preempt, shrink, consolidate (any
        other name is counted under its own label)."""
        self.preemptions.labels(action=action or "unknown").inc()

    def inc_eviction(self, result: str, n: int = 1) -> None:
        """``n`` victims with outcome ``result`` (in :data:`EVICTION_RESULTS`); raises ValueError for another."""
        if result not in EVICTION_RESULTS:
            raise ValueError(f"result {result!r} not in {EVICTION_RESULTS}")
        if n > 0:
            self.evictions.labels(result=result).inc(n)

    def observe_preemption_latency(self, seconds: float) -> None:
        """Seconds from a preemption decision to the binding of the pod it made room for."""
        self.preemption_latency.observe(max(0.0, seconds))

    # ------------------------------------------------------------------ readiness
    def set_ready(self, ready: bool = True) -> None:
        """Mark the scheduler ready (cache synced) or not; ``/readyz`` answers 200 or 503 accordingly."""
        if ready:
            self._ready.set()
        else:
            self._ready.clear()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (stdlib signature)
        logging.getLogger(__name__).debug("http " + format, *args)


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` over HTTP on a daemon thread.

    ``liveness``: optional callable; ``/healthz`` answers 503 when it returns False or raises (e.g. the
    scheduling loop stopped making progress). ``port=0`` picks a free port (see :attr:`port`).
    """

    def __init__(self, metrics: SchedulerMetrics, host: str = "0.0.0.0", port: int = 8080,
                 liveness: Callable[[], bool] | None = None) -> None:
        from prometheus_client.exposition import ThreadingWSGIServer

        self.metrics = metrics
        self.liveness = liveness
        self._prom = make_wsgi_app(metrics.registry)
        self._server = make_server(host, port, self._app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_port)

    def _app(self, environ, start_response):
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self._prom(environ, start_response)
        if path in ("/healthz", "/livez"):
            ok, detail = True, "ok"
            if self.liveness is not None:
                try:
                    ok = bool(self.liveness())
                except Exception as exc:  # a broken check is a failed check
                    ok, detail = False, f"liveness check raised {exc!r}"
                if not ok and detail == "ok":
                    detail = "liveness check failed"
            return _plain(start_response, 200 if ok else 503, detail)
        if path == "/readyz":
            ready = self.metrics.ready
            return _plain(start_response, 200 if ready else 503, "ok" if ready else "cache not synced")
        return _plain(start_response, 404, "not found")

    def start(self) -> MetricsServer:
        if self._thread is None:
            self._thread = threading.Thread(target=self._server.serve_forever, name="gpupool-metrics",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_REASONS = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}


def _plain(start_response, status: int, body: str):
    data = (body + "\n").encode()
    start_response(f"{status} {_REASONS[status]}",
                   [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data)))])
    return [data]


# ---------------------------------------------------------------------- logging
_STANDARD_ATTRS = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _extras(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


def _iso(created: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created % 1 * 1000):03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg``, the record's extras, ``exc``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, ensure_ascii=False)


class KeyValueFormatter(logging.Formatter):
    """logfmt-style ``ts=... level=info logger=... msg="..." key=value`` lines."""

    @staticmethod
    def _quote(value: object) -> str:
        text = str(value)
        if text and not any(c in text for c in ' ="\n\t'):
            return text
        return json.dumps(text, ensure_ascii=False)

    def format(self, record: logging.LogRecord) -> str:
        pairs: dict[str, object] = {
            "ts": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        pairs.update(_extras(record))
        if record.exc_info:
            pairs["exc"] = self.formatException(record.exc_info)
        return " ".join(f"{k}={self._quote(v)}" for k, v in pairs.items())


class _StderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever ``sys.stderr`` is when a record is written, not when the handler was made:
    a handler left behind by an earlier caller that had swapped stderr (a CLI test runner, a daemonizing
    wrapper) then neither writes to that closed stream nor fails with "--- Logging error ---"."""

    @property
    def stream(self) -> IO[str]:  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, _value: IO[str]) -> None:  # StreamHandler.__init__ / setStream assign it: kept dynamic
        pass


def logging_setup(level: str | int = "INFO", fmt: str = "json", stream: IO[str] | None = None) -> logging.Handler:
    """Send the root logger's records to ``stream`` (default: the process's stderr at the time of each record) as
    JSON (``fmt="json"``) or logfmt (``"kv"``).

    Replaces the handlers a previous call installed; returns the new handler.
    """
    formatters = {"json": JsonFormatter, "kv": KeyValueFormatter, "logfmt": KeyValueFormatter}
    if fmt not in formatters:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(formatters)}")
    handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.setFormatter(formatters[fmt]())
    handler._gpupool = True  # type: ignore[attr-defined]  # marks the handlers this helper owns
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, "_gpupool", False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    return handler


__all__ = [
    "DURATION_BUCKETS", "EVICTION_RESULTS", "PREEMPTION_ACTIONS", "PREEMPTION_BUCKETS", "JsonFormatter",
    "KeyValueFormatter", "MetricsServer", "QUEUE_KINDS", "RESULTS",
    "SchedulerMetrics", "logging_setup",
]
