"""How gpupool talks to the API server: one request, its response read to the end, its connection reused.

The official client's ``_preload_content=False`` returns urllib3's response unread; an unread response keeps
its connection out of the pool, so the next request opens a new (TLS) connection. Everything here reads the
body to the end and hands the connection back:

* :func:`call`: one request through ``ApiClient.param_serialize`` / ``call_api`` (the official client's own
  serialisation, auth and token refresh) with a plain dict body, no model classes; returns the body bytes,
  raises :class:`~kubernetes.client.exceptions.ApiException` for a non-2xx answer.
* :func:`drain`: for a response a generated API method returned with ``_preload_content=False``.
* :func:`configure`: a client ``Configuration`` with a connection pool as large as the number of threads
  that write at once, and urllib3 retries that do not log one warning per attempt.
* :class:`Outage`: one warning when a run of failures starts, one line when it ends (with the attempts).
* :func:`log_event`: the scheduler's structured log line; :func:`api_reason`: what the API server said;
  :func:`now_iso`: the time as the API writes it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"

_URLLIB3_POOL_LOGGER = "urllib3.connectionpool"


def drain(resp: Any) -> bytes:
    """Read a raw (``_preload_content=False``) response to the end and return its connection to the pool.

    Returns the body bytes (``b""`` for None). Never raises for a response already read or released.
    """
    if resp is None:
        return b""
    try:
        data = resp.data  # urllib3 reads the whole body and releases the connection once it is complete
    except Exception:
        data = b""
    release = getattr(resp, "release_conn", None)
    if release is not None:
        try:
            release()
        except Exception:  # pragma: no cover - already released
            pass
    return data if isinstance(data, bytes) else bytes(data or b"")


def call(api_client: client.ApiClient, method: str, path: str, body: Mapping[str, Any] | None = None, *,
         content_type: str = JSON, timeout: float | tuple[float, float] | None = None,
         path_params: Mapping[str, str] | None = None) -> bytes:
    """One API request; returns the response body (bytes), the connection back in the pool.

    ``path``: the resource path with ``{name}`` placeholders filled from ``path_params`` (URL-quoted), e.g.
    ``/api/v1/namespaces/{namespace}/pods/{name}/binding``. ``body``: a JSON-serialisable dict. ``timeout``:
    seconds, total or ``(connect, read)``. Raises :class:`ApiException` (``status`` set) for a non-2xx answer,
    and urllib3's exceptions for transport errors (refused, reset, timeout).
    """
    headers = {"Accept": JSON}
    if body is not None:
        headers["Content-Type"] = content_type
    if not hasattr(api_client, "param_serialize"):  # clients before v31 (python-legacy generator)
        raw = api_client.call_api(path, method, path_params=dict(path_params or {}), query_params=[],
                                  header_params=headers, body=body, auth_settings=["BearerToken"],
                                  _preload_content=False, _return_http_data_only=True, _request_timeout=timeout)
        return drain(raw)  # non-2xx answers were raised (read) in the REST layer
    method_, url, header_params, serialized, post = api_client.param_serialize(
        method=method, resource_path=path, path_params=dict(path_params or {}), query_params=[],
        header_params=headers, body=body, auth_settings=["BearerToken"])
    resp = api_client.call_api(method_, url, header_params=header_params, body=serialized, post_params=post,
                               _request_timeout=timeout)
    try:
        data = resp.read()
    finally:
        drain(resp.response)
    if not 200 <= resp.status <= 299:
        raise ApiException.from_response(http_resp=resp, body=data.decode("utf-8", "replace"), data=None)
    return data


class _RetryLogFilter(logging.Filter):
    """Drops urllib3's per-attempt "Retrying (...)" warnings; counts them instead (``dropped``)."""

    dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.WARNING and str(record.msg).startswith("Retrying"):
            _RetryLogFilter.dropped += 1
            return False
        return True


_filter_lock = threading.Lock()


def quiet_urllib3_retries() -> None:
    """Stop urllib3 logging a warning for every retried attempt (idempotent); callers log outages instead."""
    logger = logging.getLogger(_URLLIB3_POOL_LOGGER)
    with _filter_lock:
        if not any(isinstance(f, _RetryLogFilter) for f in logger.filters):
            logger.addFilter(_RetryLogFilter())
        # "Connection pool is full, discarding connection" is a sizing bug, not an outage: keep it.


def configure(cfg: client.Configuration, writers: int, *, retries: int = 3) -> client.Configuration:
    """Size ``cfg``'s connection pool and retries for a process with ``writers`` concurrent request threads.

    ``connection_pool_maxsize`` becomes at least ``writers + 8`` (watches, lists, events and the Lease use
    connections too); urllib3 retries connection errors ``retries`` times with a short backoff (0.1 s, 0.2 s,
    ...), never re-sends a request that may have reached the server (reads are not retried for POST), and its
    per-attempt warnings are filtered (:func:`quiet_urllib3_retries`). Returns ``cfg``.
    """
    cfg.connection_pool_maxsize = max(int(cfg.connection_pool_maxsize or 0), writers + 8)
    cfg.retries = urllib3.util.Retry(total=retries, connect=retries, read=0, status=0, redirect=0,
                                     backoff_factor=0.1, raise_on_status=False)
    quiet_urllib3_retries()
    return cfg


def pool_maxsize(api_client: client.ApiClient) -> int:
    """How many connections ``api_client`` keeps per host (its urllib3 pools' ``maxsize``)."""
    return int(api_client.configuration.connection_pool_maxsize or 1)


def ensure_pool(api_client: client.ApiClient, size: int) -> bool:
    """Make ``api_client`` keep at least ``size`` connections per host; True when it does (or now will).

    Grows the configuration's ``connection_pool_maxsize`` and, where the client has built its urllib3
    ``PoolManager`` already, the size new pools get (idle pools made earlier are closed so that the next request
    builds one of the new size). A pool smaller than the number of threads writing at once opens and throws
    away a connection per request once it is full.
    """
    cfg = api_client.configuration
    if (cfg.connection_pool_maxsize or 0) >= size:
        return True
    cfg.connection_pool_maxsize = size
    manager = getattr(getattr(api_client, "rest_client", None), "pool_manager", None)
    kw = getattr(manager, "connection_pool_kw", None)
    if not isinstance(kw, dict):
        return False
    kw["maxsize"] = size
    manager.clear()
    return True


class Outage:
    """Logs a run of failures of one kind of request once: a warning at the first, a line at recovery.

    ``log``: ``log(level, event, **fields)`` (a module's structured ``_log``). :meth:`failure` returns True for
    the first failure of a run (the one that was logged at WARNING); later ones are logged at DEBUG.
    :meth:`success` ends a run and logs ``<what>_recovered`` with ``attempts`` and ``seconds``. Thread-safe.
    """

    def __init__(self, log: Callable[..., None], what: str, **fields: Any) -> None:
        self.log, self.what, self.fields = log, what, fields
        self.attempts = 0
        self.since: float | None = None
        self.outages = 0
        self._lock = threading.Lock()

    @property
    def failing(self) -> bool:
        return self.since is not None

    def failure(self, **fields: Any) -> bool:
        with self._lock:
            self.attempts += 1
            first = self.since is None
            if first:
                self.since = time.monotonic()
                self.outages += 1
            attempts = self.attempts
        level = logging.WARNING if first else logging.DEBUG
        self.log(level, f"{self.what}_failing" if first else f"{self.what}_retry", attempt=attempts,
                 **self.fields, **fields)
        return first

    def success(self, **fields: Any) -> None:
        if self.since is None:  # the common case: no lock, nothing to log
            return
        with self._lock:
            if self.since is None:
                return
            seconds, attempts = time.monotonic() - self.since, self.attempts
            self.since, self.attempts = None, 0
        self.log(logging.WARNING, f"{self.what}_recovered", attempts=attempts, seconds=round(seconds, 2),
                 **self.fields, **fields)


log = logging.getLogger("gpupool.k8s.scheduler")


def log_event(level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
    """One structured log line: the event as the message, the fields as ``extra`` (JSON / logfmt fields with
    :func:`gpupool.k8s.metrics.logging_setup`)."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, **fields}, exc_info=exc_info)


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def api_reason(exc: BaseException) -> str:
    """What the API server said, for an Event or a log: ``"429 <Status message> (<causes>)"``; for a transport
    error its type and text."""
    status = getattr(exc, "status", None)
    if status is None:
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    message, causes = str(getattr(exc, "reason", "") or ""), []
    try:
        body = json.loads(getattr(exc, "body", None) or "{}")
        message = body.get("message") or message
        causes = [c.get("message") for c in (body.get("details") or {}).get("causes") or [] if c.get("message")]
    except (TypeError, ValueError, AttributeError):
        pass
    return f"{status} {message}" + (f" ({'; '.join(causes)})" if causes else "")


__all__ = ["call", "drain", "configure", "ensure_pool", "pool_maxsize", "quiet_urllib3_retries", "Outage", "JSON",
           "MERGE_PATCH", "STRATEGIC_PATCH", "log_event", "now_iso", "api_reason"]
