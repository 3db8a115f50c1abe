"""``gpupool scheduler``: a Kubernetes scheduler for the pods whose ``spec.schedulerName`` is gpupool's.

Pieces, each on its own thread:

* :class:`Reflector` (one per resource: Nodes, Pods, PodGroups, Queues) lists, then watches from the
  list's ``resourceVersion`` with bookmarks; a ``410 Gone`` (watch expired) makes it list again, any other
  failure makes it reconnect after an exponential backoff. It keeps :class:`ClusterCache` in step.
* The scheduling loop wakes on every change (batched), takes a snapshot of the cache and runs one
  planning cycle (:func:`gpupool.k8s.snapshot.plan`, no I/O) on it; pods it is still binding count as
  bound ("assumed", as in kube-scheduler's cache), so a GPU is never handed out twice.
* Binder workers carry out the plan: write the device assignment as annotations on the pod
  (``gpupool.io/node``, ``gpu-index``, ``gpu-milli``, ``gpu-memory``), then POST the ``pods/binding``
  subresource (with the same annotations and the pod's UID as precondition), then post a ``Scheduled``
  Event. A pod that cannot be placed gets a ``FailedScheduling`` Event and ``PodScheduled=False``
  (reason ``Unschedulable``), each posted once per distinct message.

Pool mode (the pool scheduler decides evictions): each :class:`~gpupool.k8s.snapshot.Preemption` of a plan is
carried out off the scheduling thread (:meth:`Scheduler._preempt`): an Eviction dry run for every victim first
(all or nothing: one refusal, e.g. a PodDisruptionBudget's 429, and nothing is evicted; the model is told
through :meth:`~gpupool.k8s.state.ClusterModel.preemption_refused`), then per victim a ``DisruptionTarget``
condition and the real eviction. A nominated placement (held while its victims terminate) is not bound: the pod's
``status.nominatedNodeName`` is set instead (:meth:`Scheduler._nominate`).

Failure handling: ``409`` on binding (another scheduler or replica bound the pod) -> the pod is taken
as bound where the API says and its GPUs are counted from there; ``404`` (pod deleted mid-cycle) -> the
assumption is dropped; a node gone before binding -> the pod is planned again. Only the leader binds
(``leader`` callback, e.g. :class:`gpupool.k8s.leader.LeaderElector`); on becoming leader, every
reflector lists again so the state is rebuilt from the API before the first binding.
"""

from __future__ import annotations

import collections
import gc
import json
import logging
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from gpupool.k8s import (
    ANN_GPU_INDEX,
    ANN_NODE,
    DEFAULT_SCHEDULER_NAME,
    POD_GROUP_API,
    QUEUE_API,
    VOLCANO_POD_GROUP_API,
)
from gpupool.k8s.cycle.plan import assignment_annotations
from gpupool.k8s.events import EventRecorder
from gpupool.k8s.pool import PoolDriver
from gpupool.k8s.requests import annotations_of, node_name_of, pod_key
from gpupool.k8s.snapshot import ClusterSnapshot, Placement, Plan, Preemption
from gpupool.k8s.state import ClusterModel
from gpupool.k8s.status import StatusWriter
from gpupool.k8s.wire import MERGE_PATCH, STRATEGIC_PATCH, Outage, call, drain, ensure_pool
from gpupool.policies import DEFAULT_POLICY

log = logging.getLogger("gpupool.k8s.scheduler")


def _log(level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
    """One structured log line: the event as the message, the fields as ``extra`` (JSON / logfmt fields with
    :func:`gpupool.k8s.metrics.logging_setup`)."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, **fields}, exc_info=exc_info)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


EVICTION_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/eviction"
POD_STATUS_PATH = "/api/v1/namespaces/{namespace}/pods/{name}/status"
DISRUPTION_TARGET = "DisruptionTarget"  # the pod condition kube-scheduler sets on a preemption victim
PREEMPTION_BY_SCHEDULER = "PreemptionByScheduler"


_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


def _split_key(key: str) -> tuple[str, str]:
    """``"ns/name"`` -> ``(ns, name)``; a key without a namespace is in ``default``."""
    ns, _, name = key.rpartition("/")
    return ns or "default", name


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


@dataclass
class SchedulerConfig:
    """Knobs of the live scheduler (defaults suit a production cluster; tests shorten the timeouts)."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    policy: str = DEFAULT_POLICY
    seed: int = 0
    identity: str = field(default_factory=socket.gethostname)
    watch_timeout_s: int = 300  # server-side timeout of each watch request
    read_timeout_s: float | None = None  # client-side: no byte for this long -> reconnect (default watch + 30 s)
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    optional_retry_s: float = 60.0  # how often to look again for a CRD that is not installed
    batch_s: float = 0.05  # wait this long after a change so that a burst becomes one cycle
    resync_s: float = 30.0  # run a cycle at least this often
    assume_ttl_s: float = 60.0  # forget a binding the watch has not shown this long after it succeeded
    bind_workers: int = 8  # threads that POST bindings (nothing else); the client's pool is sized to fit
    bind_timeout_s: float = 30.0  # read timeout of a binding, a status patch, a read-back (seconds)
    list_page: int = 500
    evict_workers: int = 2  # threads that carry out preemptions (eviction dry runs, conditions, evictions)
    queue_status_s: float = 5.0  # write Queue status (usedGPUs, pods, Valid condition) at most this often; 0 = never
    gc_freeze: bool = False  # after the first cycle, move the listed objects out of the GC's scans (gc.freeze);
    # process-wide, so `gpupool scheduler` turns it on and library users decide for themselves
    pool: bool = True  # the pool scheduler runs the cluster (fair share, gangs, reclaim, preemption): gpupool.k8s.pool
    pool_config: Any = None  # its gpupool.engine.pool.PoolConfig (None: gpupool.k8s.pool.live_config())
    default_queue: str = "default"  # the leaf queue of pods that name none
    rereport_s: float = 60.0  # a reason whose only change is a figure (GPUs held, seconds waited) is re-posted at
    # most this often: the pool's reasons carry live numbers, and a write per change would flood the API
    pod_group_status: bool = True  # write PodGroup status (off where scheduler-plugins' or Volcano's controller does)


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
    for a list) for the scheduling thread, which applies them to its :class:`~gpupool.k8s.state.ClusterModel`
    at the start of each cycle (:meth:`drain`): reflectors never touch the model.
    """

    KINDS = ("nodes", "pods", "podgroups", "volcanopodgroups", "queues")

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
        """Apply the queued changes to ``model`` (a :class:`~gpupool.k8s.state.ClusterModel`); returns how many.

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

    def __init__(self, kind: str, list_fn: Callable[..., Any], cache: ClusterCache, config: SchedulerConfig,
                 optional: bool = False) -> None:
        super().__init__(name=f"reflector-{kind}", daemon=True)
        self.kind, self.list_fn, self.cache, self.config, self.optional = kind, list_fn, cache, config, optional
        self.resource_version: str | None = None
        self.lists = 0  # completed lists (tests and the leader hand-over read it)
        self.listed_at = -1e9  # time.monotonic() of the last completed list
        self.synced = threading.Event()
        self._halt = threading.Event()
        self._relist = threading.Event()
        self._watch: _RawWatch | None = None
        self._resp: Any = None  # the open watch response (urllib3), for _interrupt
        self._backoff = Backoff(config.backoff_initial_s, config.backoff_max_s)
        self._outage = Outage(_log, "api", kind=kind)
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
        _log(logging.INFO, "listed", kind=self.kind, items=len(items), resource_version=self.resource_version)

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
                    _log(logging.INFO, "watch_expired", kind=self.kind, resource_version=self.resource_version,
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
        _log(logging.INFO, "reflector_stopped", kind=self.kind)

    def _absent(self, status: int) -> None:
        """An optional kind never listed answered 404 (CRD not installed) or 403 (not granted): run without it."""
        if not self.absent_reported:
            self.absent_reported = True
            if status == 404:
                _log(logging.INFO, "resource_absent", kind=self.kind, status=status,
                     note="CRD not installed: running without it", retry_s=self.config.optional_retry_s)
            else:
                _log(logging.WARNING, "resource_forbidden", kind=self.kind, status=status,
                     note="list/watch not granted to this service account (see deploy/rbac.yaml): running without "
                          "it, so what it would enforce is not enforced", retry_s=self.config.backoff_max_s)
        if status == 404:
            self.cache.replace(self.kind, None)
        else:
            self.cache.forbidden(self.kind, f"{status} Forbidden: list/watch {self.kind} not granted, or the API "
                                            "server is starting up")
        self.synced.set()
        # Not granted may be a moment's trouble (an API server starting up): look again soon, then less often.
        self._sleep(self.config.optional_retry_s if status == 404 else self._backoff.next())


# ------------------------------------------------------------------ the scheduler
@dataclass
class _Assumed:
    """A pod gpupool is binding (or has bound, until the watch shows it): counted as bound meanwhile."""

    uid: str
    placement: Placement
    annotations: dict[str, str]
    done_at: float | None = None
    started: float = field(default_factory=time.perf_counter)  # when the cycle that placed it began


class Scheduler:
    """The live scheduler; :meth:`start` / :meth:`stop`, or :meth:`run` until stopped.

    ``leader``: a callable telling whether this replica may bind now (None: always), e.g.
    ``lambda: elector.is_leader`` with :class:`gpupool.k8s.leader.LeaderElector`. ``metrics``: a
    :class:`gpupool.k8s.metrics.SchedulerMetrics` (or anything with some of its methods: each is looked up
    with getattr). ``prepare_state``: run on the engine's state each cycle before placing (e.g. GPU health
    from :class:`gpupool.k8s.telemetry.GpuTelemetry`).
    """

    def __init__(self, api_client: client.ApiClient, config: SchedulerConfig | None = None,
                 leader: Callable[[], bool] | None = None, metrics: Any = None,
                 prepare_state: Callable[[Any], Any] | None = None) -> None:
        self.api_client = api_client
        self.config = config or SchedulerConfig()
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.cache = ClusterCache()
        self.leader = leader
        self.metrics = metrics
        self.prepare_state = prepare_state
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.assumed: dict[str, _Assumed] = {}
        self._reported: dict[str, tuple[str, str, str, float]] = {}  # pod -> (uid, message, its shape, when)
        self._leading = False
        self._lists_at_election: dict[str, int] | None = None
        self._pool = ThreadPoolExecutor(max_workers=self.config.bind_workers, thread_name_prefix="gpupool-bind")
        # Binders only bind; Events go through the recorder's bounded queue, conditions through the report pool.
        self.recorder = EventRecorder(api_client, self.config.scheduler_name, self.config.identity,
                                      on_drop=lambda: self._metric("inc_events_dropped"))
        self._report_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="gpupool-report")
        self._report_pool_closed = False
        self._bind_outage = Outage(_log, "bind")
        self._thread: threading.Thread | None = None
        self.cycles = 0
        self.model = ClusterModel(self.config.scheduler_name, self.config.policy, self.config.seed,
                                  assume_ttl_s=self.config.assume_ttl_s)  # parses each pod once per version
        self.pool_driver = (PoolDriver(self.model, self.config.pool_config, self.config.default_queue)
                            if self.config.pool else None)
        # outcomes from binder / eviction threads, applied on the scheduling thread: ("forget", key, uid),
        # ("refused", preemption id, {victim: why}), ("evict_failed", victim key, why)
        self._model_ops: collections.deque[tuple[str, Any, Any]] = collections.deque()
        self._evict_pool = ThreadPoolExecutor(max_workers=max(1, self.config.evict_workers),
                                              thread_name_prefix="gpupool-evict")
        self._nominated: dict[str, str] = {}  # pod key -> node written as its status.nominatedNodeName
        self.preemption_outcomes: list[tuple[int, str]] = []  # (preemption id, outcome), in order (tests read it)
        self.cycle_seconds: collections.deque[float] = collections.deque(maxlen=10000)  # recent cycle times
        self._frozen = False
        self.status_writer = StatusWriter(api_client, self._report_pool.submit, self.config.queue_status_s, _log,
                                          timeout_s=self.config.bind_timeout_s,
                                          pod_groups=self.config.pod_group_status)
        self._skipped: dict[str, str] = {}
        self.heartbeat = time.monotonic()
        self.bindings: list[tuple[str, str]] = []  # (pod, node) bound by this replica, in order
        cfg = self.config
        self.reflectors = [
            Reflector("nodes", self.core.list_node, self.cache, cfg),
            Reflector("pods", self.core.list_pod_for_all_namespaces, self.cache, cfg),
            Reflector("podgroups", self._custom_lister(*POD_GROUP_API), self.cache, cfg, optional=True),
            Reflector("volcanopodgroups", self._custom_lister(*VOLCANO_POD_GROUP_API), self.cache, cfg, optional=True),
            Reflector("queues", self._custom_lister(*QUEUE_API), self.cache, cfg, optional=True),
        ]

    def _custom_lister(self, group: str, version: str, plural: str) -> Callable[..., Any]:
        api = self.custom

        def list_objects(**kwargs: Any) -> Any:
            return api.list_cluster_custom_object(group, version, plural, **kwargs)

        # Watch.stream reads the wrapped call's docstring for its return type and watch argument name.
        list_objects.__doc__ = api.list_cluster_custom_object.__doc__
        return list_objects

    # -- lifecycle
    def start(self) -> None:
        # One connection per thread that writes at once (binders, report pool, event workers) plus the watches
        # (each holds one) and a few for lists and read-backs: fewer and urllib3 discards one per request.
        want = (self.config.bind_workers + 2 + self.config.evict_workers + self.recorder.workers
                + len(self.reflectors) + 4)
        if not ensure_pool(self.api_client, want):
            _log(logging.WARNING, "connection_pool_small", size=self.api_client.configuration.connection_pool_maxsize,
                 want=want)
        for r in self.reflectors:
            r.start()
        self._thread = threading.Thread(target=self._loop, name="gpupool-scheduler", daemon=True)
        self._thread.start()
        _log(logging.INFO, "started", scheduler=self.config.scheduler_name, policy=self.config.policy,
             identity=self.config.identity)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.cache.changed.set()
        for r in self.reflectors:
            r.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._evict_pool.shutdown(wait=True, cancel_futures=True)
        self._report_pool_closed = True
        self._report_pool.shutdown(wait=True, cancel_futures=True)
        self.recorder.stop(timeout)
        for r in self.reflectors:
            if r.is_alive():
                r.join(timeout)
        _log(logging.INFO, "stopped", scheduler=self.config.scheduler_name)

    def run(self) -> None:
        """Start and block until :meth:`stop` is called (from a signal handler or another thread)."""
        self.start()
        while not self._stop.wait(1.0):
            pass

    def healthy(self) -> bool:
        """Liveness: the scheduling loop is running and went round recently (a cycle stuck for minutes fails)."""
        alive = self._thread is not None and self._thread.is_alive()
        return alive and time.monotonic() - self.heartbeat < max(120.0, 4 * self.config.resync_s)

    @property
    def synced(self) -> bool:
        return all(r.synced.is_set() for r in self.reflectors)

    # -- leadership
    def _is_leader(self) -> bool:
        return True if self.leader is None else bool(self.leader())

    def _check_leadership(self) -> bool:
        """True when this replica may bind now; on becoming leader, relist everything first."""
        leading = self._is_leader()
        if leading and not self._leading:
            _log(logging.INFO, "elected", identity=self.config.identity, action="relist")
            with self._lock:
                self.assumed.clear()
                self._reported.clear()
                self._nominated.clear()
            for key in list(self.model.assumed):
                self.model.forget(key)
            if self.leader is None:
                self._lists_at_election = None  # no election: the lists made at start are the rebuild
            else:
                self._lists_at_election = {r.kind: r.lists for r in self.reflectors}
                for r in self.reflectors:
                    r.relist()
        elif not leading and self._leading:
            _log(logging.INFO, "lost_leadership", identity=self.config.identity)
        if leading != self._leading:
            self._metric("set_leader", leading)
        self._leading = leading
        if not leading:
            return False
        if self._lists_at_election is not None:
            if any(r.lists <= self._lists_at_election[r.kind] and not (r.optional and r.synced.is_set()
                   and self.cache.objects.get(r.kind) is None) for r in self.reflectors):
                return False  # the rebuild from the API is not complete yet
            self._lists_at_election = None
        return True

    # -- the loop
    def _loop(self) -> None:
        self._set_ready(False)
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            self.cache.changed.wait(self.config.resync_s)
            self.heartbeat = time.monotonic()
            if self._stop.is_set():
                break
            time.sleep(self.config.batch_s)
            self.cache.changed.clear()
            try:
                self._sync_model()  # as leader or as warm standby: the model follows the watches
            except Exception:  # pragma: no cover - a bug must not stop the scheduler
                _log(logging.ERROR, "model_update_failed", exc_info=True)
                self.model.touch_all()
            if not self.synced:
                continue
            self._set_ready(True)  # cache synced: ready, as leader or as warm standby
            if not self._check_leadership():
                continue
            try:
                self.run_cycle()
                if self.config.gc_freeze and not self._frozen:
                    # Tens of thousands of listed objects live as long as the process: a full GC pass over them
                    # costs tens of ms per collection; frozen, collections scan only what is new.
                    self._frozen = True
                    gc.collect()
                    gc.freeze()
            except Exception:  # a bug must not stop the scheduler: log it and go on with the next cycle
                _log(logging.ERROR, "cycle_failed", exc_info=True)
                time.sleep(self.config.backoff_initial_s)
                self.cache.changed.set()

    def _sync_model(self) -> None:
        """Apply the watch changes and the binders' outcomes (bound, forgotten) to the model."""
        self.cache.drain(self.model)
        with self._lock:
            done = [k for k, a in self.assumed.items() if a.done_at is not None]
            for key in done:
                del self.assumed[key]
        for key in done:
            self.model.bound(key)
        while self._model_ops:
            op, key, arg = self._model_ops.popleft()
            if op == "forget":
                self.model.forget(key, arg or None)
            elif op == "refused":
                self.model.preemption_refused(key, arg)
            elif op == "evict_failed":
                self.model.eviction_failed(key, arg)
        with self._lock:
            for key in [k for k in self._reported if self.cache.get("pods", k) is None]:
                del self._reported[key]

    def run_cycle(self) -> Plan:
        """One cycle: apply what changed to the model, plan its pending pods, dispatch bindings and reports.

        Costs what the pending pods and the changes cost (:class:`~gpupool.k8s.state.ClusterModel`), not what
        the cluster costs; the time is kept in ``cycle_seconds``.
        """
        t0 = time.perf_counter()
        self._sync_model()
        result = self.model.cycle(self.prepare_state)
        self.cycles += 1
        skipped = self.model.skipped_pods
        if skipped.keys() != self._skipped.keys():
            for key in skipped.keys() - self._skipped.keys():
                _log(logging.WARNING, "bound_pod_miscounted", pod=key, note=skipped[key])
            self._skipped = dict(skipped)
        elapsed = time.perf_counter() - t0
        if result.placements:
            self.cycle_seconds.append(elapsed)
            self._metric("observe_cycle", elapsed)
        self._metric("set_model_stats", self.model.stats)
        self._write_status()
        per_pod = elapsed / max(1, len(result.placements))
        for pre in result.preemptions:
            self._submit_preemption(pre)
        for key in result.denominated:
            self._denominate(key)
        for p in result.placements:
            pod = self.cache.get("pods", p.pod)
            if pod is None:
                if p.node is not None:
                    self.model.forget(p.pod)
                continue
            if p.nominated and p.node is not None:
                self._nominate(pod, p)
                continue
            if p.node is None:
                self._metric("observe_attempt", "unschedulable", per_pod)
                self._report_unschedulable(pod, p.reason)
                continue
            uid = (pod.get("metadata") or {}).get("uid", "")
            with self._lock:
                a = _Assumed(uid, p, assignment_annotations(p), started=t0)
                self.assumed[p.pod] = a
            self._pool.submit(self._bind, pod, a)
        if result.placements:
            _log(logging.INFO, "cycle", pending=len(result.placements), placed=len(result.placed),
                 seconds=round(elapsed, 4))
        self._metric("set_pending", len(result.placements) - len(result.placed))
        if result.state is not None:
            self._metric("set_allocation", result.state)
        if result.queues is not None and result.queues.known:
            book = result.queues
            fair = self.pool_driver.fair_shares() if self.pool_driver is not None else {}
            self._metric("set_queues", {
                name: (book.used.get(name, 0) / 1000, q.quota_milli / 1000,
                       -1 if q.limit_milli is None else q.limit_milli / 1000, fair.get(name))
                for name, q in book.specs.items()})
        return result

    # -- Queue and PodGroup status
    def _write_status(self, force: bool = False) -> None:
        """PATCH the status of the Queues and PodGroups whose status changed (leader only, at most every
        ``queue_status_s``, off the scheduling thread; :class:`gpupool.k8s.status.StatusWriter`):
        ``kubectl get queues`` shows allocation, fair share and borrowing, ``kubectl get podgroups`` the phase."""
        fair = self.pool_driver.fair_shares() if self.pool_driver is not None else None
        self.status_writer.update(self.model, fair or None, force=force)

    # -- binding
    def _forget(self, key: str, a: _Assumed) -> None:
        """The binding of ``key`` did not happen: its devices go back to the pool at the next cycle."""
        with self._lock:
            if self.assumed.get(key) is a:
                del self.assumed[key]
        self._model_ops.append(("forget", key, a.uid))
        self.cache.changed.set()

    def _bind(self, pod: Mapping[str, Any], a: _Assumed) -> str:
        """Bind ``pod`` as ``a`` plans it, in ONE write; returns bound|conflict|deleted|node_gone|error|not_leader.

        The ``pods/binding`` POST carries the device annotations and the pod's UID (precondition): the API server
        sets ``spec.nodeName`` and copies the Binding's annotations onto the pod in one atomic update, so a pod
        is never annotated by a scheduler that did not bind it. The ``Scheduled`` Event is queued on the
        recorder (:class:`gpupool.k8s.events.EventRecorder`) and never delays the next binding.
        """
        key = a.placement.pod
        node = a.placement.node or ""
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace") or "default", meta.get("name", "")
        if self._stop.is_set() or not self._is_leader():
            self._forget(key, a)
            return "not_leader"
        if self.cache.get("nodes", node) is None:
            _log(logging.INFO, "bind_skipped", pod=key, node=node, reason="node no longer exists")
            self._forget(key, a)
            return "node_gone"
        binding_meta: dict[str, Any] = {"name": name, "namespace": ns, "annotations": a.annotations}
        if a.uid:
            binding_meta["uid"] = a.uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": binding_meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            call(self.api_client, "POST", "/api/v1/namespaces/{namespace}/pods/{name}/binding", body,
                 timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
                 path_params={"namespace": ns, "name": name})
        except ApiException as exc:
            if exc.status == 404:
                result = "deleted"
                _log(logging.INFO, "bind_skipped", pod=key, node=node, reason="pod deleted")
                self._forget(key, a)
            elif exc.status == 409:
                self._bind_outage.success()
                result = self._on_conflict(ns, name, key, a)
            else:
                result = "error"
                if exc.status is None or exc.status in (403, 429) or exc.status >= 500:
                    self._bind_outage.failure(pod=key, status=exc.status, reason=exc.reason)
                else:
                    _log(logging.WARNING, "bind_failed", pod=key, node=node, status=exc.status, reason=exc.reason)
                self._forget(key, a)
                self._report_unschedulable(pod, f"Binding rejected: {exc.status} {exc.reason}", force=True)
            if result == "error":
                self._metric("observe_attempt", "error", time.perf_counter() - a.started)
            elif result == "bound":
                self._metric("observe_attempt", "scheduled", time.perf_counter() - a.started)
            return result
        except Exception as exc:  # transport trouble: the binding may or may not have reached the API server
            self._bind_outage.failure(pod=key, error=type(exc).__name__, detail=str(exc)[:200])
            result = self._on_conflict(ns, name, key, a, why="unknown outcome")
            self._metric("observe_attempt", "scheduled" if result == "bound" else "error",
                         time.perf_counter() - a.started)
            return result
        self._bind_outage.success()
        self._bound(pod, key, a, node)
        return "bound"

    def _bound(self, pod: Mapping[str, Any], key: str, a: _Assumed, node: str, note: str = "") -> None:
        """Record a binding the API server accepted: assumption done, ``Scheduled`` Event queued, metric."""
        with self._lock:
            a.done_at = time.monotonic()
            self.bindings.append((key, node))
            self._reported.pop(key, None)
            was_nominated = self._nominated.pop(key, None) is not None
        _log(logging.INFO, "bound", pod=key, node=node, gpus=a.annotations.get(ANN_GPU_INDEX) or "-",
             gpu_milli=a.placement.gpu_milli, **({"note": note} if note else {}))
        self._post_event(pod, "Scheduled", f"Successfully assigned {key} to {node}", "Normal", "Binding")
        self._metric("observe_attempt", "scheduled", time.perf_counter() - a.started)
        if a.placement.waited_s is not None:  # a preemption made room for it: decision -> bound
            self._metric("observe_preemption_latency", a.placement.waited_s + time.perf_counter() - a.started)
        if was_nominated or (pod.get("status") or {}).get("nominatedNodeName"):
            self._submit_report(self._patch_nominated, dict(pod), None)  # it is bound: the nomination is done
        self.cache.changed.set()

    def _on_conflict(self, ns: str, name: str, key: str, a: _Assumed, why: str = "409") -> str:
        """The binding was refused (409) or its outcome is unknown: read the pod back and take the API's word.

        Bound where planned with exactly our annotations (an earlier attempt of ours went through) -> ``bound``.
        Bound elsewhere or by someone else -> ``conflict``: the assumption is dropped and the pod is counted where
        the API says, with the winner's annotations; the pod is never written to (its annotations are the
        winner's). Gone -> ``deleted``. Unbound, or unreadable -> ``error`` (planned again next cycle).
        """
        node = a.placement.node or ""
        try:
            current = json.loads(call(self.api_client, "GET", "/api/v1/namespaces/{namespace}/pods/{name}",
                                      timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
                                      path_params={"namespace": ns, "name": name}))
        except ApiException as exc:
            if exc.status == 404:
                self._forget(key, a)
                return "deleted"
            current = None
        except Exception:  # network trouble while reading back
            current = None
        if current is None:
            _log(logging.INFO, "bind_unknown", pod=key, planned=node, why=why, action="plan again")
            self._forget(key, a)
            return "error"
        bound_to = node_name_of(current)
        cmeta = current.get("metadata") or {}
        ann = annotations_of(current)
        if (bound_to == node and cmeta.get("uid", "") == a.uid
                and all(ann.get(k) == v for k, v in a.annotations.items())):
            self._bound(current, key, a, node, note=f"already bound here ({why})")
            return "bound"
        if not bound_to:
            _log(logging.INFO, "bind_unknown", pod=key, planned=node, why=why, action="plan again")
            self._forget(key, a)
            return "error"
        _log(logging.INFO, "bind_conflict", pod=key, planned=node, bound_to=bound_to,
             their_gpus=ann.get(ANN_GPU_INDEX, "?") if ann.get(ANN_NODE) == bound_to else "?")
        self._forget(key, a)
        return "conflict"

    # -- reporting
    def _report_unschedulable(self, pod: Mapping[str, Any], message: str, force: bool = False) -> None:
        """Report ``pod`` unplaceable: a ``FailedScheduling`` Event and ``PodScheduled=False``, once per message.

        Never blocks on the API: the Event goes to the recorder's queue, the condition to the report pool.
        ``force``: report even if this exact message was reported for this pod before.
        """
        meta = pod.get("metadata") or {}
        key = pod_key(pod)
        uid = meta.get("uid", "")
        stable = _NUMBERS.sub("#", message)
        now = time.monotonic()
        with self._lock:
            last = self._reported.get(key)
            if not force and last is not None and last[0] == uid and (
                    last[1] == message or (last[2] == stable and now - last[3] < self.config.rereport_s)):
                return  # the same message, or only its figures changed (GPUs held, seconds waited) recently
            self._reported[key] = (uid, message, stable, now)
        _log(logging.INFO, "unschedulable", pod=key, reason=message)
        self._post_event(pod, "FailedScheduling", message, "Warning", "Scheduling")
        self._submit_report(self._post_failure, dict(pod), message)

    def _post_failure(self, pod: Mapping[str, Any], message: str) -> None:
        """Set ``PodScheduled=False`` (reason ``Unschedulable``, ``message``) unless the pod already says so."""
        meta = pod.get("metadata") or {}
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if (cond.get("type") == "PodScheduled" and cond.get("status") == "False"
                    and cond.get("reason") == "Unschedulable" and cond.get("message") == message):
                return
        body = {"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
            "lastProbeTime": None, "lastTransitionTime": _now(),
        }]}}
        try:
            call(self.api_client, "PATCH", "/api/v1/namespaces/{namespace}/pods/{name}/status", body,
                 content_type=STRATEGIC_PATCH, timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
                 path_params={"namespace": meta.get("namespace") or "default", "name": meta.get("name", "")})
        except Exception as exc:
            _log(logging.DEBUG, "condition_failed", pod=pod_key(pod), error=type(exc).__name__,
                 status=getattr(exc, "status", None))

    def _post_event(self, pod: Mapping[str, Any], reason: str, message: str, etype: str, action: str) -> None:
        """Queue an Event about ``pod`` on the recorder (aggregated, dropped and counted when the queue is full)."""
        self.recorder.event(pod, etype, reason, message, action)

    # -- preemption (pool mode)
    def _submit_report(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the report pool (never on the scheduling thread); dropped while stopping."""
        if self._report_pool_closed:
            return
        try:
            self._report_pool.submit(fn, *args)
        except RuntimeError:  # shut down meanwhile
            pass

    def _submit_preemption(self, pre: Preemption) -> None:
        """Hand ``pre`` to the eviction pool (:meth:`_preempt`); returns at once."""
        try:
            self._evict_pool.submit(self._preempt_safely, pre)
        except RuntimeError:  # stopping: the model is rebuilt by whoever leads next
            pass

    def _preempt_safely(self, pre: Preemption) -> str:
        try:
            return self._preempt(pre)
        except Exception:  # pragma: no cover - a bug must not kill the worker silently
            _log(logging.ERROR, "preemption_failed", preemption=pre.id, exc_info=True)
            return "error"

    def _evict(self, key: str, uid: str, dry_run: bool) -> None:
        """POST a policy/v1 Eviction for pod ``key`` (``"ns/name"``) with ``uid`` as precondition.

        ``dry_run``: ``deleteOptions.dryRun=["All"]`` (the API server runs every check, PodDisruptionBudgets
        included, and changes nothing). The pod's own ``terminationGracePeriodSeconds`` applies. Returns on
        ``201``; raises :class:`ApiException` for a refusal (``429``: a PodDisruptionBudget allows no disruption
        now or is not yet processed; ``404``: the pod is gone; ``409``: the UID differs, the pod was replaced;
        ``500``: several budgets match the pod) and urllib3's errors for transport trouble. Timeout: the
        connect timeout plus ``bind_timeout_s`` (seconds).
        """
        ns, name = _split_key(key)
        options: dict[str, Any] = {}
        if dry_run:
            options["dryRun"] = ["All"]
        if uid:
            options["preconditions"] = {"uid": uid}
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": ns},
                "deleteOptions": options}
        call(self.api_client, "POST", EVICTION_PATH, body,
             timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
             path_params={"namespace": ns, "name": name})

    def _mark_disruption_target(self, key: str, reason: str) -> None:
        """PATCH (strategic merge, ``pods/status``) the ``DisruptionTarget=True`` condition onto victim ``key``, as
        kube-scheduler does before it removes a victim (reason ``PreemptionByScheduler``, ``reason`` as the
        message). Raises :class:`ApiException` (``404``: the pod is gone) and transport errors."""
        ns, name = _split_key(key)
        body = {"status": {"conditions": [{
            "type": DISRUPTION_TARGET, "status": "True", "reason": PREEMPTION_BY_SCHEDULER,
            "message": reason, "lastTransitionTime": _now()}]}}
        call(self.api_client, "PATCH", POD_STATUS_PATH, body, content_type=STRATEGIC_PATCH,
             timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
             path_params={"namespace": ns, "name": name})

    def _preemptor_pods(self, pre: Preemption) -> list[Mapping[str, Any]]:
        """The pods that wait for ``pre`` (its nominated placements, else the preemptor if it names a pod)."""
        keys = [p.pod for p in pre.nominated] or ([pre.preemptor] if pre.preemptor else [])
        return [pod for k in dict.fromkeys(keys) if (pod := self.cache.get("pods", k)) is not None]

    def _victim_ref(self, key: str, uid: str) -> Mapping[str, Any]:
        """The victim as the cache has it, else enough of it for an Event's ``involvedObject``."""
        pod = self.cache.get("pods", key)
        if pod is not None and (not uid or (pod.get("metadata") or {}).get("uid") == uid):
            return pod
        ns, name = _split_key(key)
        return {"metadata": {"namespace": ns, "name": name, "uid": uid}}

    def _preempt(self, pre: Preemption) -> str:
        """Carry out ``pre`` (on an eviction worker); returns ``evicted``, ``refused`` or ``not_leader``.

        1. Dry run, all or nothing: an Eviction with ``dryRun: ["All"]`` and the victim's UID as precondition for
           every victim. Any refusal (``429`` from a PodDisruptionBudget, ``409``, ``500``, a transport error)
           blocks the victim; ``404`` means it is gone already (not a refusal). If one is blocked, nothing is
           evicted: ``("refused", id, {victim: why})`` is queued for the model
           (:meth:`~gpupool.k8s.state.ClusterModel.preemption_refused`, on the scheduling thread) and each
           waiting pod gets a ``PreemptionBlocked`` Warning naming the blocked victims and why.
        2. Otherwise, per victim: ``DisruptionTarget=True`` (reason ``PreemptionByScheduler``, message
           ``pre.reason``) through ``pods/status``, then the real eviction (UID precondition, the pod's own grace
           period) and a ``Preempted`` Event on the victim. A refusal now (a PodDisruptionBudget changed since
           the dry run, the API failing) queues ``("evict_failed", victim, why)``
           (:meth:`~gpupool.k8s.state.ClusterModel.eviction_failed`).

        A replica that is not (or no longer) the leader evicts nothing and reports the preemption refused, so that
        the model drops what it holds for it. Metrics: ``inc_preemption(action)`` once a dry run passed,
        ``inc_eviction(result, n)`` per victim.
        """
        if self._stop.is_set() or not self._is_leader():
            self._model_ops.append(("refused", pre.id, {k: "not the leader" for k, _ in pre.victims}))
            self.cache.changed.set()
            self.preemption_outcomes.append((pre.id, "not_leader"))
            return "not_leader"
        blocked: dict[str, str] = {}
        gone: set[str] = set()
        for key, uid in pre.victims:
            try:
                self._evict(key, uid, dry_run=True)
            except ApiException as exc:
                if exc.status == 404:
                    gone.add(key)
                else:
                    blocked[key] = api_reason(exc)
            except Exception as exc:  # transport trouble: the dry run did not answer, so it did not pass
                blocked[key] = api_reason(exc)
        if blocked:
            self._model_ops.append(("refused", pre.id, dict(blocked)))
            self.cache.changed.set()
            self._metric("inc_eviction", "refused", len(blocked))
            _log(logging.INFO, "preemption_blocked", preemption=pre.id, action=pre.action, preemptor=pre.preemptor,
                 blocked=blocked)
            message = (f"preemption ({pre.action}) blocked, nothing evicted: "
                       + "; ".join(f"{k}: {why}" for k, why in blocked.items()))
            for pod in self._preemptor_pods(pre):
                self._post_event(pod, "PreemptionBlocked", message, "Warning", "Preempting")
            self.preemption_outcomes.append((pre.id, "refused"))
            return "refused"
        self._metric("inc_preemption", pre.action)
        counts = {"evicted": 0, "failed": 0, "gone": len(gone)}
        for key, uid in pre.victims:
            if key in gone:
                continue
            try:
                self._mark_disruption_target(key, pre.reason)
            except ApiException as exc:
                if exc.status == 404:
                    counts["gone"] += 1
                    continue
                _log(logging.INFO, "disruption_condition_failed", pod=key, reason=api_reason(exc))
            except Exception as exc:  # the condition is informative; the eviction decides
                _log(logging.INFO, "disruption_condition_failed", pod=key, reason=api_reason(exc))
            try:
                self._evict(key, uid, dry_run=False)
            except ApiException as exc:
                if exc.status == 404:
                    counts["gone"] += 1
                    continue
                self._eviction_failed(pre, key, api_reason(exc), counts)
                continue
            except Exception as exc:
                self._eviction_failed(pre, key, api_reason(exc), counts)
                continue
            counts["evicted"] += 1
            _log(logging.INFO, "evicted", pod=key, preemption=pre.id, action=pre.action, preemptor=pre.preemptor)
            self._post_event(self._victim_ref(key, uid), "Preempted", pre.reason, "Normal", "Preempting")
        for result, n in counts.items():
            self._metric("inc_eviction", result, n)
        self.preemption_outcomes.append((pre.id, "evicted"))
        return "evicted"

    def _eviction_failed(self, pre: Preemption, key: str, why: str, counts: dict[str, int]) -> None:
        counts["failed"] += 1
        _log(logging.WARNING, "eviction_failed", pod=key, preemption=pre.id, reason=why)
        self._model_ops.append(("evict_failed", key, why))
        self.cache.changed.set()

    def _nominate(self, pod: Mapping[str, Any], p: Placement) -> None:
        """``p`` is held on ``p.node`` while victims terminate: set the pod's ``status.nominatedNodeName`` (off the
        scheduling thread) and post a ``Nominated`` Event, once per (pod, node). The pod is not bound."""
        node = p.node or ""
        with self._lock:
            if self._nominated.get(p.pod) == node:
                return
            self._nominated[p.pod] = node
        if (pod.get("status") or {}).get("nominatedNodeName") != node:
            self._submit_report(self._patch_nominated, dict(pod), node)
        self._post_event(pod, "Nominated", p.reason or f"waiting for preemption victims to terminate on node {node}",
                         "Normal", "Scheduling")

    def _denominate(self, key: str) -> None:
        """The model dropped ``key``'s nomination: clear ``status.nominatedNodeName`` (if set) off-thread."""
        with self._lock:
            had = self._nominated.pop(key, None)
        pod = self.cache.get("pods", key)
        if pod is None:
            return
        if had is not None or (pod.get("status") or {}).get("nominatedNodeName"):
            self._submit_report(self._patch_nominated, dict(pod), None)

    def _patch_nominated(self, pod: Mapping[str, Any], node: str | None) -> None:
        """Merge-patch ``status.nominatedNodeName`` of ``pod`` to ``node`` (None: removed). Best effort: a failure
        is logged at DEBUG (the next nomination or binding writes again)."""
        meta = pod.get("metadata") or {}
        try:
            call(self.api_client, "PATCH", POD_STATUS_PATH, {"status": {"nominatedNodeName": node}},
                 content_type=MERGE_PATCH, timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s),
                 path_params={"namespace": meta.get("namespace") or "default", "name": meta.get("name", "")})
        except Exception as exc:
            _log(logging.DEBUG, "nominate_failed", pod=pod_key(pod), node=node, error=type(exc).__name__,
                 status=getattr(exc, "status", None))

    # -- metrics seam
    def _metric(self, name: str, *args: Any) -> None:
        fn = getattr(self.metrics, name, None)
        if fn is not None:
            try:
                fn(*args)
            except Exception:  # pragma: no cover - metrics must never break scheduling
                _log(logging.DEBUG, "metric_failed", metric=name)

    def _set_ready(self, ready: bool) -> None:
        self._metric("set_ready", ready)


def read_cluster(api_client: client.ApiClient, page: int = 500) -> ClusterSnapshot:
    """One consistent-enough read of the cluster (Nodes, Pods, PodGroups, Queues) for a dry run."""
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)

    def items(fn: Callable[..., Any], *args: Any) -> list[dict[str, Any]]:
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

    def optional(*api: str) -> list[dict[str, Any]] | None:
        try:
            return items(custom.list_cluster_custom_object, *api)
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise

    groups = (optional(*POD_GROUP_API) or []) + (optional(*VOLCANO_POD_GROUP_API) or [])
    return ClusterSnapshot(nodes=items(core.list_node), pods=items(core.list_pod_for_all_namespaces),
                           pod_groups=groups, queues=optional(*QUEUE_API))


__all__ = ["read_cluster", "Scheduler", "SchedulerConfig", "Reflector", "ClusterCache", "Backoff",
           "assignment_annotations", "api_reason", "DISRUPTION_TARGET", "PREEMPTION_BY_SCHEDULER"]
