"""Instant queries against a Prometheus server's HTTP API (``GET /api/v1/query``), for the autoscaler.

Wire format (Prometheus docs, "HTTP API", https://prometheus.io/docs/prometheus/latest/querying/api/):

* success: ``{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {...},
  "value": [<unix seconds>, "<float as string>"]}, ...]}}``; ``resultType`` may also be ``scalar``
  (``"result": [ts, "1.5"]``), ``matrix`` (a range selector: rejected, an instant value is needed) or ``string``;
  values may be ``"NaN"``, ``"+Inf"``, ``"-Inf"``; ``warnings`` / ``infos`` may accompany either answer.
* failure: HTTP 400 (bad query), 422 (cannot execute), 503 (timeout / aborted) or 5xx with ``{"status": "error",
  "errorType": "bad_data" | "execution" | "timeout" | ..., "error": "<message>"}``.

Transport: one ``requests.Session`` with urllib3's ``Retry`` (bounded, exponential backoff) on connection
errors and on 429 / 502 / 503 / 504; a 400 / 422 (the query is wrong) is never retried. Errors are raised as
:class:`PrometheusError` naming the query, the HTTP status and Prometheus's ``errorType`` / ``error``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.util import Retry

RETRY_STATUS = (429, 502, 503, 504)


class PrometheusError(RuntimeError):
    """A query that gave no usable value: transport error, HTTP error, ``status: error`` or a malformed answer.

    ``status``: the HTTP status (None for a transport error); ``error_type``: Prometheus's ``errorType``
    (``bad_data``, ``execution``, ``timeout``, ...; ``transport`` / ``format`` for ours); ``retryable``: whether
    asking again later may help (not for a bad query).
    """

    def __init__(self, query: str, message: str, status: int | None = None, error_type: str = "") -> None:
        self.query, self.status, self.error_type, self.message = query, status, error_type, message
        where = f"HTTP {status}" if status is not None else "no answer"
        kind = f" {error_type}" if error_type else ""
        super().__init__(f"prometheus query {query!r}: {where}{kind}: {message}")

    @property
    def retryable(self) -> bool:
        return self.error_type not in ("bad_data", "format") and self.status not in (400, 422)


@dataclass(frozen=True)
class Sample:
    """One element of an instant vector: its labels, the evaluation time (unix seconds) and the value."""

    labels: Mapping[str, str]
    timestamp: float
    value: float


def _float(raw: Any, query: str, what: str = "value") -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise PrometheusError(query, f"{what} {raw!r} is not a number", 200, "format")
    try:
        return float(raw)  # Prometheus sends "NaN", "+Inf", "-Inf", "1.5e+06": float() reads all of them
    except (TypeError, ValueError):
        raise PrometheusError(query, f"{what} {raw!r} is not a number", 200, "format") from None


def _pair(value: Any, query: str, item: Any) -> tuple[float, float]:
    """``[<unix seconds>, "<value>"]`` as two floats; a string (a Sequence too) or a wrong length is a format error."""
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or len(value) != 2:
        raise PrometheusError(query, f"{item} has no [time, value]", 200, "format")
    return _float(value[0], query, "sample time"), _float(value[1], query)


def parse_response(payload: Any, query: str = "") -> list[Sample]:
    """Samples of a decoded ``/api/v1/query`` answer (vector or scalar; a scalar gives one sample, no labels).

    Raises :class:`PrometheusError` for ``status: error`` (with its ``errorType`` and ``error``), a ``matrix`` or
    ``string`` result, or a body that is not the documented format.
    """
    if not isinstance(payload, Mapping):
        raise PrometheusError(query, f"answer is not a JSON object: {str(payload)[:200]!r}", 200, "format")
    if payload.get("status") == "error":
        raise PrometheusError(query, str(payload.get("error") or "(no message)"), None,
                              str(payload.get("errorType") or "error"))
    if payload.get("status") != "success" or not isinstance(payload.get("data"), Mapping):
        raise PrometheusError(query, f"unexpected answer {str(payload)[:200]!r}", 200, "format")
    data = payload["data"]
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar":
        ts, value = _pair(result, query, f"scalar result {str(result)[:200]!r}")
        return [Sample({}, ts, value)]
    if kind != "vector":
        raise PrometheusError(query, f"resultType {kind!r}: an instant vector or scalar is needed (a range "
                                     "selector like [5m] must be wrapped, e.g. in rate() or avg_over_time())",
                              200, "bad_data")
    if not isinstance(result, list):
        raise PrometheusError(query, f"vector result {result!r} is not a list", 200, "format")
    out = []
    for item in result:
        value = item.get("value") if isinstance(item, Mapping) else None
        ts, number = _pair(value, query, f"vector element {str(item)[:200]!r}")
        labels = item.get("metric") or {}
        if not isinstance(labels, Mapping):
            raise PrometheusError(query, f"vector element {str(item)[:200]!r}: metric is not a label map", 200,
                                  "format")
        out.append(Sample({str(k): str(v) for k, v in labels.items()}, ts, number))
    return out


MIG_INSTANCE_LABEL = "GPU_I_ID"
"""dcgm-exporter's label of a series that belongs to a MIG instance (GPU instance id; ``GPU_I_PROFILE`` names
its profile); whole GPUs have none."""


def per_instance(samples: Sequence[Sample], instances: Sequence[Sample]) -> list[Sample]:
    """``samples`` (a per-GPU metric such as ``DCGM_FI_DEV_GPU_UTIL``) with the series of MIG instances
    (:data:`MIG_INSTANCE_LABEL` set) replaced by ``instances`` (what is read per MIG instance, e.g.
    ``100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE``): the series of whole GPUs, then those of ``instances`` that name a
    MIG instance. dcgm-exporter #216 (DCGM #80): ``DCGM_FI_DEV_GPU_UTIL`` reads 0 on a MIG instance, however
    busy; a MIG instance without a reading in ``instances`` is left out (unknown), never counted as idle."""
    return [s for s in samples if not s.labels.get(MIG_INSTANCE_LABEL)] + \
        [s for s in instances if s.labels.get(MIG_INSTANCE_LABEL)]


REDUCERS = {"sum": sum, "avg": lambda xs: sum(xs) / len(xs), "max": max, "min": min}


def reduce_samples(samples: Sequence[Sample], how: str = "sum") -> float | None:
    """One value from an instant vector: ``how`` in sum / avg / max / min over the finite samples; None when the
    vector is empty or holds only NaN / Inf (the metric is then missing: it makes no proposal). Raises ValueError for
    an unknown ``how``."""
    if how not in REDUCERS:
        raise ValueError(f"reduce {how!r}: expected one of {', '.join(REDUCERS)}")
    values = [s.value for s in samples if math.isfinite(s.value)]
    if not values:
        return None
    return float(REDUCERS[how](values))


class PrometheusClient:
    """Instant queries against ``base_url`` (e.g. ``http://prometheus.monitoring.svc:9090``).

    ``timeout``: seconds per request (connect, read), also sent as the query's ``timeout`` parameter so that
    Prometheus gives up at the same time; ``retries``: extra attempts on a connection error or a 429/502/503/504
    answer, ``backoff``: urllib3's backoff factor (seconds; the n-th retry waits ``backoff * 2**(n-1)``).
    ``headers``: sent with every request (e.g. ``Authorization: Bearer ...`` for a proxy in front of Prometheus).
    Thread-safe for the controller's use (one requests.Session, a connection pool of ``pool`` connections).
    """

    def __init__(self, base_url: str, *, timeout: float = 5.0, retries: int = 2, backoff: float = 0.2,
                 headers: Mapping[str, str] | None = None, pool: int = 4, verify: bool | str = True) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"prometheus URL {base_url!r}: expected http://HOST:PORT or https://...")
        self.base_url = base_url.rstrip("/")
        self.timeout = float(timeout)
        self.session = requests.Session()
        self.session.headers.update({"Accept": "application/json", **dict(headers or {})})
        self.session.verify = verify
        retry = Retry(total=retries, connect=retries, read=retries, status=retries, backoff_factor=backoff,
                      status_forcelist=RETRY_STATUS, allowed_methods=frozenset({"GET", "POST"}),
                      raise_on_status=False, respect_retry_after_header=True)
        adapter = HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=pool)
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.queries = 0
        self.failures = 0

    def query(self, promql: str, at: float | None = None) -> list[Sample]:
        """Evaluate ``promql`` at ``at`` (unix seconds; None: now). Raises :class:`PrometheusError`."""
        # Prometheus durations are whole numbers with a unit ("1500ms"; "1.5s" is a 400 bad_data)
        params = {"query": promql, "timeout": f"{int(max(self.timeout - 0.5, 0.5) * 1000)}ms"}
        if at is not None:
            params["time"] = f"{at:.3f}"
        self.queries += 1
        try:
            resp = self.session.get(f"{self.base_url}/api/v1/query", params=params,
                                    timeout=(min(self.timeout, 3.0), self.timeout))
        except requests.RequestException as exc:
            self.failures += 1
            raise PrometheusError(promql, f"{type(exc).__name__}: {str(exc)[:300]}", None, "transport") from None
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        if resp.status_code != 200:
            self.failures += 1
            if isinstance(payload, Mapping) and payload.get("status") == "error":
                raise PrometheusError(promql, str(payload.get("error") or resp.reason), resp.status_code,
                                      str(payload.get("errorType") or "error"))
            raise PrometheusError(promql, f"{resp.reason}: {resp.text[:200]!r}", resp.status_code, "http")
        try:
            return parse_response(payload, promql)
        except PrometheusError:
            self.failures += 1
            raise

    def value(self, promql: str, how: str = "sum", at: float | None = None) -> float | None:
        """:meth:`query` reduced to one number by :func:`reduce_samples` (None: empty vector, no value)."""
        return reduce_samples(self.query(promql, at), how)

    def value_per_instance(self, promql: str, instance_promql: str, how: str = "sum",
                           at: float | None = None) -> float | None:
        """Both queries at ``at``, their series combined by :func:`per_instance` (MIG instances read from
        ``instance_promql``), reduced by :func:`reduce_samples`. Raises :class:`PrometheusError`."""
        return reduce_samples(per_instance(self.query(promql, at), self.query(instance_promql, at)), how)

    def ready(self) -> bool:
        """True when ``/-/ready`` answers 200 (a Prometheus that finished replaying its WAL)."""
        try:
            return self.session.get(f"{self.base_url}/-/ready", timeout=self.timeout).status_code == 200
        except requests.RequestException:
            return False

    def close(self) -> None:
        self.session.close()


__all__ = ["MIG_INSTANCE_LABEL", "PrometheusClient", "PrometheusError", "RETRY_STATUS", "REDUCERS", "Sample",
           "parse_response", "per_instance", "reduce_samples"]
