"""Kubernetes Events for gpupool: posted off the binding path, aggregated as kube-scheduler's recorder does.

:class:`EventRecorder` is a small counterpart of client-go's ``tools/record`` (broadcaster + EventCorrelator):

* :meth:`EventRecorder.event` only puts the event on a bounded queue and returns; worker threads write it.
  A full queue drops the event and counts it (``dropped``), as client-go's broadcaster does, so a slow or
  unreachable API server never holds up a binding.
* The same event again -- same involved object (kind, namespace, name, UID), type, reason, message and
  source component -- is not posted anew: the Event already written gets a PATCH of its ``count`` and
  ``lastTimestamp`` (client-go's ``eventLogger``). The recent events live in a bounded LRU (``cache_size``
  entries); if the Event has gone meanwhile (404: Events expire, by default after 1 h), a new one is created
  with the count carried on. The cache is per process: a restarted scheduler starts with an empty one, as
  client-go does.
* Failures are logged once per outage (:class:`gpupool.k8s.api.wire.Outage`), never per event.

Events of one key always go to the same worker, so a key is never written by two threads at once.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.api.wire import MERGE_PATCH, Outage, call

log = logging.getLogger("gpupool.k8s.events")

MAX_MESSAGE = 1024  # characters of a message kept (kube-scheduler truncates likewise)

EventKey = tuple[str, str, str, str, str, str, str, str]
"""(kind, namespace, name, uid, type, reason, message, source component)."""


def _log(level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
    """One structured log line: the event as the message, the fields as ``extra``."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, **fields}, exc_info=exc_info)


def _timestamp(t: float) -> str:
    """``metav1.Time``: RFC 3339, UTC, whole seconds."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_reference(obj: Mapping[str, Any], kind: str = "Pod", api_version: str = "v1") -> dict[str, str]:
    """The ``involvedObject`` of an Event about ``obj`` (an API object as a dict)."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": str(obj.get("apiVersion") or api_version), "kind": str(obj.get("kind") or kind),
           "name": str(meta.get("name") or ""), "uid": str(meta.get("uid") or "")}
    if meta.get("namespace"):
        ref["namespace"] = str(meta["namespace"])
    return ref


@dataclass
class _Seen:
    """An Event already written: where it is and what it said last."""

    namespace: str
    name: str
    count: int
    first: str


@dataclass(frozen=True)
class _Pending:
    key: EventKey
    ref: dict[str, str]
    etype: str
    reason: str
    message: str
    action: str
    at: float  # time.time() when recorded


class EventRecorder:
    """Writes core/v1 Events about objects, asynchronously, with client-go's aggregation.

    ``api_client``: the client to write with. ``component``: ``source.component`` and ``reportingComponent``
    (the scheduler's name); ``instance``: ``reportingInstance`` (the replica's identity). ``queue_size``: events
    waiting at most, over all ``workers`` threads (each holds ``queue_size // workers``). ``cache_size``: Events
    remembered for aggregation (LRU). ``timeout_s``: seconds each API request may take. ``on_drop``: called
    (no arguments) for every event dropped because the queue was full, e.g. to bump a metric.

    Threads start on the first event; :meth:`stop` ends them (events still queued are written first, within
    the timeout). Counters: ``created``, ``patched``, ``failed``, ``dropped``.
    """

    def __init__(self, api_client: client.ApiClient, component: str, instance: str = "", *, queue_size: int = 1024,
                 workers: int = 2, cache_size: int = 4096, timeout_s: float = 10.0,
                 on_drop: Callable[[], None] | None = None, clock: Callable[[], float] = time.time) -> None:
        if workers < 1 or queue_size < workers or cache_size < 1:
            raise ValueError(f"need workers >= 1, queue_size >= workers, cache_size >= 1; got "
                             f"{workers}, {queue_size}, {cache_size}")
        self.api_client = api_client
        self.component, self.instance = component, instance
        self.cache_size, self.timeout_s = cache_size, timeout_s
        self.on_drop, self.clock = on_drop, clock
        self._queues: list[queue.Queue[_Pending | None]] = [queue.Queue(queue_size // workers)
                                                            for _ in range(workers)]
        self._threads: list[threading.Thread] = []
        self._seen: OrderedDict[EventKey, _Seen] = OrderedDict()
        self._lock = threading.Lock()
        self._stopped = False
        self.created = self.patched = self.failed = self.dropped = 0
        self._full = Outage(_log, "event_queue_full", component=component)
        self._outage = Outage(_log, "event_write", component=component)

    # ------------------------------------------------------------------ recording
    def key(self, ref: Mapping[str, str], etype: str, reason: str, message: str) -> EventKey:
        """What makes two events "the same" (client-go's ``getEventKey``, without the host)."""
        return (ref.get("kind", ""), ref.get("namespace", ""), ref.get("name", ""), ref.get("uid", ""), etype, reason,
                message, self.component)

    def event(self, obj: Mapping[str, Any], etype: str, reason: str, message: str, action: str = "") -> bool:
        """Queue an Event about ``obj`` (an API object as a dict); returns False when it was dropped.

        ``etype``: ``Normal`` or ``Warning``; ``reason``: CamelCase (``Scheduled``, ``FailedScheduling``);
        ``message``: truncated to 1024 characters; ``action``: what was done (``Binding``, ``Scheduling``).
        Never blocks and never raises for API trouble.
        """
        ref = object_reference(obj)
        message = message[:MAX_MESSAGE]
        pending = _Pending(self.key(ref, etype, reason, message), ref, etype, reason, message, action, self.clock())
        if self._stopped:
            return self._drop()
        self._ensure_started()
        q = self._queues[hash(pending.key) % len(self._queues)]
        try:
            q.put_nowait(pending)
        except queue.Full:
            return self._drop()
        if self._full.failing and q.qsize() <= q.maxsize // 2:  # drained well below full: the burst is over
            self._full.success(dropped_total=self.dropped)
        return True

    def _drop(self) -> bool:
        with self._lock:
            self.dropped += 1
        self._full.failure(dropped_total=self.dropped)
        if self.on_drop is not None:
            try:
                self.on_drop()
            except Exception:  # pragma: no cover - a metric must not break recording
                pass
        return False

    # ------------------------------------------------------------------ writing
    def write(self, pending: _Pending) -> str:
        """Write one event now (on the caller's thread): ``created``, ``patched`` or ``failed``."""
        now = _timestamp(pending.at)
        with self._lock:
            seen = self._seen.get(pending.key)
            if seen is not None:
                self._seen.move_to_end(pending.key)
        try:
            if seen is not None:
                try:
                    count = seen.count + 1
                    call(self.api_client, "PATCH", "/api/v1/namespaces/{namespace}/events/{name}",
                         {"count": count, "lastTimestamp": now, "message": pending.message},
                         content_type=MERGE_PATCH, timeout=self.timeout_s,
                         path_params={"namespace": seen.namespace, "name": seen.name})
                    seen.count = count
                    result = "patched"
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    seen = self._create(pending, now, count=seen.count + 1, first=seen.first)  # it expired
                    result = "created"
            else:
                seen = self._create(pending, now, count=1, first=now)
                result = "created"
        except Exception as exc:
            with self._lock:
                self.failed += 1
            self._outage.failure(reason=pending.reason, status=getattr(exc, "status", None),
                                 error=type(exc).__name__, detail=str(exc)[:200])
            return "failed"
        self._outage.success()
        with self._lock:
            if result == "patched":
                self.patched += 1
            else:
                self.created += 1
                self._seen[pending.key] = seen
                self._seen.move_to_end(pending.key)
                while len(self._seen) > self.cache_size:
                    self._seen.popitem(last=False)
        return result

    def _create(self, p: _Pending, now: str, count: int, first: str) -> _Seen:
        ns = p.ref.get("namespace") or "default"
        name = f"{p.ref.get('name') or 'object'}.{time.time_ns():x}"  # client-go's naming
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": p.ref,
            "reason": p.reason, "message": p.message, "type": p.etype, "action": p.action or None,
            "source": {"component": self.component},
            "reportingComponent": self.component, "reportingInstance": self.instance,
            "firstTimestamp": first, "lastTimestamp": now, "eventTime": None, "count": count,
        }
        call(self.api_client, "POST", "/api/v1/namespaces/{namespace}/events", body, timeout=self.timeout_s,
             path_params={"namespace": ns})
        return _Seen(ns, name, count, first)

    # ------------------------------------------------------------------ threads
    def _ensure_started(self) -> None:
        if self._threads:
            return
        with self._lock:
            if self._threads or self._stopped:
                return
            self._threads = [threading.Thread(target=self._work, args=(q,), name=f"gpupool-events-{i}", daemon=True)
                             for i, q in enumerate(self._queues)]
            for t in self._threads:
                t.start()

    def _work(self, q: queue.Queue[_Pending | None]) -> None:
        while True:
            pending = q.get()
            try:
                if pending is None:
                    return
                self.write(pending)
            except Exception:  # pragma: no cover - write() catches API trouble; a bug must not end the worker
                _log(logging.ERROR, "event_worker_error", exc_info=True)
            finally:
                q.task_done()

    @property
    def workers(self) -> int:
        """Threads writing events (each may hold one API connection)."""
        return len(self._queues)

    def pending(self) -> int:
        """Events queued and not yet written (approximate)."""
        return sum(q.qsize() for q in self._queues)

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait up to ``timeout`` seconds until every queued event is written; True if all were."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(q.unfinished_tasks == 0 for q in self._queues):
                return True
            time.sleep(0.005)
        return all(q.unfinished_tasks == 0 for q in self._queues)

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued (within ``timeout`` seconds), then end the worker threads; later events drop."""
        self._stopped = True
        deadline = time.monotonic() + timeout
        for q in self._queues:
            try:
                q.put(None, timeout=max(0.0, deadline - time.monotonic()))
            except queue.Full:  # pragma: no cover - API hung: the daemon threads die with the process
                pass
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._threads = []


__all__ = ["EventRecorder", "object_reference"]
