"""List and watch: a :class:`Reflector` per kind keeps :class:`ClusterCache` in step with the API server
(:class:`Backoff` between failures); :func:`list_all` reads every page of a list. Imports only k8s.api.wire."""

from __future__ import annotations

import collections
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.api.wire import Outage, drain
from gpupool.k8s.api.wire import log_event as _log


class WatchConfig(Protocol):
    """The settings a :class:`Reflector` reads (:class:`gpupool.k8s.scheduler.SchedulerConfig` has them all)."""

    watch_timeout_s: int
    read_timeout_s: float | None
    connect_timeout_s: float
    backoff_initial_s: float
    backoff_max_s: float
    optional_retry_s: float
    list_page: int


class Backoff:
    """Exponential backoff with jitter: the n-th delay is drawn from ``[d/2, d]``, ``d = initial * 2**n`` capped at
    ``maximum`` (seconds). :meth:`reset` after a success."""

    def __init__(self, initial: float, maximum: float) -> None:
        self.initial, self.maximum, self.failures = initial, maximum, 0

    def next(self) -> float:
        delay = min(self.maximum, self.initial * (2 ** self.failures))
        self.failures += 1
        return random.uniform(delay / 2, delay)

    def reset(self) -> None:
        self.failures = 0


class _RawWatch(watch.Watch):
    """The client's Watch, yielding raw dicts (no model deserialization; gpupool reads plain JSON)."""

    def get_return_type(self, func):  # noqa: D102
        return None


# ------------------------------------------------------------------ cache
class ClusterCache:
    """Objects by kind, as the watches last reported them; ``changed`` is set on every change.

    Every change is also queued in ``changes`` (``(kind, event type, object)``, ``(kind, "RELIST", items)``
    for a list) for the scheduling thread, which applies them to its :class:`~gpupool.k8s.cache.model.ClusterModel`
    at the start of each cycle (:meth:`drain`): reflectors never touch the model.
    """

    KINDS = ("nodes", "pods", "podgroups", "volcanopodgroups", "queues", "resourceslices", "deviceclasses",
             "resourceclaims")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, dict[str, Any]] | None] = {k: {} for k in self.KINDS}
        self.changed = threading.Event()
        self.changes: collections.deque[tuple[str, str, Any]] = collections.deque()

    @staticmethod
    def key(obj: Mapping[str, Any]) -> str:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace")
        return f"{ns}/{meta.get('name', '')}" if ns else str(meta.get("name", ""))

    def replace(self, kind: str, items: list[dict[str, Any]] | None) -> None:
        with self.lock:
            self.objects[kind] = None if items is None else {self.key(o): o for o in items}
            self.changes.append((kind, "RELIST", items))
        self.changed.set()

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        with self.lock:
            store = self.objects[kind]
            if store is None:
                store = self.objects[kind] = {}
            if event_type == "DELETED":
                store.pop(self.key(obj), None)
            else:
                store[self.key(obj)] = obj
            self.changes.append((kind, event_type, obj))
        self.changed.set()

    def drain(self, model: Any) -> int:
        """Apply the queued changes to ``model`` (a :class:`~gpupool.k8s.cache.model.ClusterModel`); returns how many.

        A relist supersedes the queued events of its kind before it, so they are skipped."""
        with self.lock:
            batch = list(self.changes)
            self.changes.clear()
        last_relist = {kind: i for i, (kind, etype, _) in enumerate(batch) if etype == "RELIST"}
        for i, (kind, etype, obj) in enumerate(batch):
            if i < last_relist.get(kind, -1):
                continue
            if etype == "RELIST":
                model.replace(kind, obj)
            elif etype == "FORBIDDEN":
                model.forbid(kind, obj)
            else:
                model.apply(kind, etype, obj)
        return len(batch)

    def forbidden(self, kind: str, reason: str) -> None:
        """``kind`` may not be read (403 before any list): nothing cached; the model is told why."""
        with self.lock:
            self.objects[kind] = None
            self.changes.append((kind, "FORBIDDEN", reason))
        self.changed.set()

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            store = self.objects[kind]
            return None if store is None else store.get(key)


# ------------------------------------------------------------------ list + watch
class Reflector(threading.Thread):
    """Keeps one kind of object in :class:`ClusterCache` in step with the API server.

    List (paged), then watch from the list's ``resourceVersion`` with ``allowWatchBookmarks``; each
    watch request ends after ``watch_timeout_s`` and is resumed from the last resourceVersion seen
    (events and bookmarks). ``410 Gone`` -> list again at once. Other errors -> resume after a backoff.

    An ``optional`` kind (a CRD) that has never been listed and answers 404 (not installed) or 403 (not granted:
    a warning names the missing permission) is recorded as absent and looked for again later. Once a kind has
    been listed, every error is transient: the cache is kept (a restarting API server answers 403 and 5xx for a
    while), the reflector backs off and lists again. An outage is logged once when it starts and once when it
    ends (with the number of failed attempts), not per attempt.
    """

    def __init__(self, kind: str, list_fn: Callable[..., Any], cache: ClusterCache, config: WatchConfig,
                 optional: bool = False, log: Callable[..., None] | None = None) -> None:
        super().__init__(name=f"reflector-{kind}", daemon=True)
        self.kind, self.list_fn, self.cache, self.config, self.optional = kind, list_fn, cache, config, optional
        # the owning component's structured logger (``log(level, event, **fields)``), so that its watch lines carry
        # its logger name; default: the scheduler's
        self._log = log if log is not None else _log
        self.resource_version: str | None = None
        self.lists = 0  # completed lists (tests and the leader hand-over read it)
        self.listed_at = -1e9  # time.monotonic() of the last completed list
        self.synced = threading.Event()
        self._halt = threading.Event()
        self._relist = threading.Event()
        self._watch: _RawWatch | None = None
        self._resp: Any = None  # the open watch response (urllib3), for _interrupt
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        self._outage = Outage(self._log, "api", kind=kind)
        self.absent_reported = False  # the "not installed / not granted" line was logged

    # -- control
    def stop(self) -> None:
        self._halt.set()
        self._relist.set()  # wakes a backoff sleep
        self._interrupt()

    def relist(self) -> None:
        """List again now (e.g. after becoming leader)."""
        self._relist.set()
        self._interrupt()

    def _interrupt(self) -> None:
        """Cut the open watch now. ``Watch.stop()`` alone is seen only when the next event arrives, which on an
        idle kind (nodes) may be minutes away; shutting the response's socket ends the blocked read at once."""
        w = self._watch
        if w is not None:
            w.stop()
        resp = self._resp
        if resp is not None:
            try:
                shutdown = getattr(resp, "shutdown", None)  # urllib3 >= 2.3: unblocks a read in another thread
                (shutdown or resp.close)()
            except Exception:  # noqa: BLE001 - the watch is being abandoned anyway
                pass

    def _sleep(self, seconds: float) -> None:
        """Wait ``seconds``, or less if asked to relist or stop."""
        if not self._halt.is_set():
            self._relist.wait(seconds)

    # -- work
    def _list(self) -> None:
        items: list[dict[str, Any]] = []
        cont: str | None = None
        while True:
            kwargs: dict[str, Any] = {"limit": self.config.list_page, "_preload_content": False,
                                      "_request_timeout": (self.config.connect_timeout_s, 120)}
            if cont:
                kwargs["_continue"] = cont
            body = json.loads(drain(self.list_fn(**kwargs)))
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            cont = meta.get("continue")
            if not cont:
                break
        self.resource_version = meta.get("resourceVersion") or None
        self.cache.replace(self.kind, items)
        self.lists += 1
        self.listed_at = time.monotonic()
        self.synced.set()
        self.cache.changed.set()  # again once synced: the loop may have looked before, then waited a resync
        self._log(logging.INFO, "listed", kind=self.kind, items=len(items), resource_version=self.resource_version)

    def _watch_once(self) -> None:
        w = self._watch = _RawWatch()
        if self._halt.is_set() or self._relist.is_set():
            return
        read = self.config.read_timeout_s or self.config.watch_timeout_s + 30
        kwargs: dict[str, Any] = {"allow_watch_bookmarks": True, "timeout_seconds": int(self.config.watch_timeout_s),
                                  "_request_timeout": (self.config.connect_timeout_s, read)}
        if self.resource_version:
            kwargs["resource_version"] = self.resource_version
        def call(*args: Any, **kw: Any) -> Any:  # the watch request, kept so that _interrupt can cut it
            self._resp = resp = self.list_fn(*args, **kw)
            if self._relist.is_set() or self._halt.is_set():
                self._interrupt()
            return resp

        call.__doc__ = self.list_fn.__doc__  # Watch.stream reads the return type from the docstring
        try:
            for event in w.stream(call, **kwargs):
                if self._halt.is_set() or self._relist.is_set():
                    break
                etype = event.get("type")
                obj = event.get("raw_object") or event.get("object") or {}
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if etype in ("ADDED", "MODIFIED", "DELETED"):
                    self.cache.apply(self.kind, etype, obj)
                if rv and etype in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK"):
                    self.resource_version = rv
                self._backoff.reset()
                self._outage.success(action="watched")
        finally:
            self._watch = None
            resp, self._resp = self._resp, None
            if resp is not None:
                try:
                    resp.release_conn()
                except Exception:  # noqa: BLE001 - a connection cut by _interrupt is simply dropped
                    pass

    def run(self) -> None:
        need_list = True
        while not self._halt.is_set():
            try:
                if self._relist.is_set():
                    self._relist.clear()
                    need_list = True
                if need_list:
                    self._list()
                    need_list = False
                    self._backoff.reset()
                    self._outage.success(action="listed")
                self._watch_once()
                self._outage.success(action="watched")
            except ApiException as exc:
                if self._halt.is_set():
                    break
                if exc.status == 410:
                    self._log(logging.INFO, "watch_expired", kind=self.kind, resource_version=self.resource_version,
                         action="relist")
                    need_list = True
                    continue
                if exc.status in (403, 404) and self.optional and self.lists == 0:
                    # Never listed: the CRD is not installed (404) or we may not read it (403). Run without it
                    # and look again later. Once listed, a 403/404 is the API server's trouble, not an answer.
                    self._absent(exc.status)
                    need_list = True
                    continue
                # Transient (5xx, 429, and 403/404 from a kind already listed: a restarting API server answers
                # 403 until its authorizer is ready): keep what the cache holds, back off, list again.
                delay = self._backoff.next()
                self._outage.failure(status=exc.status, reason=exc.reason, retry_s=round(delay, 2))
                if exc.status in (400, 401, 403, 404, 422) or exc.status is None:
                    need_list = True
                self._sleep(delay)
            except Exception as exc:  # connection refused, reset, read timeout, malformed stream, ...
                if self._halt.is_set():
                    break
                if self._relist.is_set():
                    continue  # we cut the watch short ourselves to list again
                delay = self._backoff.next()
                self._outage.failure(error=type(exc).__name__, detail=str(exc)[:200], retry_s=round(delay, 2))
                if self._backoff.failures > 5:
                    need_list = True  # a long outage: do not trust the resourceVersion any more
                self._sleep(delay)
        self._log(logging.INFO, "reflector_stopped", kind=self.kind)

    def _absent(self, status: int) -> None:
        """An optional kind never listed answered 404 (CRD not installed) or 403 (not granted): run without it."""
        if not self.absent_reported:
            self.absent_reported = True
            if status == 404:
                self._log(logging.INFO, "resource_absent", kind=self.kind, status=status,
                     note="CRD not installed: running without it", retry_s=self.config.optional_retry_s)
            else:
                self._log(logging.WARNING, "resource_forbidden", kind=self.kind, status=status,
                     note="list/watch not granted to this service account (see deploy/rbac.yaml): running without "
                          "it, so what it would enforce is not enforced", retry_s=self.config.backoff_max_s)
        if status == 404:
            self.cache.replace(self.kind, None)
        else:
            self.cache.forbidden(self.kind, f"{status} Forbidden: list/watch {self.kind} not granted, or the API "
                                            "server is starting up")
        self.synced.set()
        self.cache.changed.set()
        # Not granted may be a moment's trouble (an API server starting up): look again soon, then less often.
        self._sleep(self.config.optional_retry_s if status == 404 else self._backoff.next())


def list_all(fn: Callable[..., Any], *args: Any, page: int = 500) -> list[dict[str, Any]]:
    """Every item of a list call, ``page`` items per request, following ``continue`` (raw JSON dicts)."""
    out: list[dict[str, Any]] = []
    cont = None
    while True:
        kwargs: dict[str, Any] = {"limit": page, "_preload_content": False}
        if cont:
            kwargs["_continue"] = cont
        body = json.loads(drain(fn(*args, **kwargs)))
        out.extend(body.get("items") or [])
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            return out


__all__ = ["Backoff", "ClusterCache", "Reflector", "WatchConfig", "list_all"]
