"""``gpupool scheduler``: a Kubernetes scheduler for the pods whose ``spec.schedulerName`` is gpupool's.

Pieces, each on its own thread:

* :class:`Reflector` (one per resource: Nodes, Pods, PodGroups, Queues) lists, then watches from the
  list's ``resourceVersion`` with bookmarks; a ``410 Gone`` (watch expired) makes it list again, any other
  failure makes it reconnect after an exponential backoff. It keeps :class:`ClusterCache` in step.
* The scheduling loop wakes on every change (batched), takes a snapshot of the cache and runs one
  planning cycle (:func:`gpupool.k8s.cycle.planner.plan`, no I/O) on it; pods it is still binding count as
  bound ("assumed", as in kube-scheduler's cache), so a GPU is never handed out twice.
* Binder workers carry out the plan: write the device assignment as annotations on the pod
  (``gpupool.io/node``, ``gpu-index``, ``gpu-milli``, ``gpu-memory``), then POST the ``pods/binding``
  subresource (with the same annotations and the pod's UID as precondition), then post a ``Scheduled``
  Event. With ``share_enforcement="hami"``, on a node where HAMi's device plugin registered, the Binding also
  carries what that plugin reads (:mod:`gpupool.k8s.objects.hami`) and HAMi's node lock is taken first
  (:mod:`gpupool.k8s.api.hami_lock`); where a GPU share may go at all: :mod:`gpupool.k8s.cache.sharing`.
  A pod that cannot be placed gets a ``FailedScheduling`` Event and ``PodScheduled=False``
  (reason ``Unschedulable``), each posted once per distinct message.

Pool mode (the pool scheduler decides evictions): each :class:`~gpupool.k8s.cycle.plan.Preemption` of a plan is
carried out off the scheduling thread (:meth:`Scheduler._preempt`): an Eviction dry run for every victim first
(all or nothing: one refusal, e.g. a PodDisruptionBudget's 429, and nothing is evicted; the model is told
through :meth:`~gpupool.k8s.cache.model.ClusterModel.preemption_refused`), then per victim a ``DisruptionTarget``
condition and the real eviction. A nominated placement (held while its victims terminate) is not bound: the pod's
``status.nominatedNodeName`` is set instead (:meth:`Scheduler._nominate`).

Failure handling: ``409`` on binding (another scheduler or replica bound the pod) -> the pod is taken
as bound where the API says and its GPUs are counted from there; ``404`` (pod deleted mid-cycle) -> the
assumption is dropped; a node gone before binding -> the pod is planned again; no answer (the reply lost, a
``5xx``) -> the pod is read back, and while the read-back fails too the assumption is kept (the binding may
have gone through) and read back again, until the API answers or ``bind_unknown_ttl_s`` passes: its GPUs are
never handed out meanwhile (as kube-scheduler's cache keeps an assumed pod). Only the leader binds
(``leader`` callback, e.g. :class:`gpupool.k8s.api.leader.LeaderElector`); on becoming leader, every
reflector lists again so the state is rebuilt from the API before the first binding.
"""

from __future__ import annotations

import collections
import gc
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s import (
    ANN_GPU_INDEX,
    ANN_HAMI_DEVICES_TO_ALLOCATE,
    ANN_NODE,
    ANNOTATION_PREFIX,
    DEFAULT_SCHEDULER_NAME,
    DRA_CLAIM_API,
    DRA_CLASS_API,
    DRA_SLICE_API,
    POD_GROUP_API,
    QUEUE_API,
    VOLCANO_POD_GROUP_API,
)
from gpupool.k8s.api.calls import (
    DISRUPTION_TARGET,
    PREEMPTION_BY_SCHEDULER,
    binding_failure_message,
    clear_disruption_target,
    evict,
    mark_disruption_target,
    post_binding,
    read_pod,
    set_nominated_node,
    set_unschedulable,
    split_key,
)
from gpupool.k8s.api.claims import ClaimWriteError, write_pod_claims
from gpupool.k8s.api.events import EventRecorder
from gpupool.k8s.api.hami_lock import release_node_lock, take_node_lock
from gpupool.k8s.api.status import StatusWriter
from gpupool.k8s.api.watch import Backoff, ClusterCache, Reflector, list_all
from gpupool.k8s.api.wire import Outage, api_reason, ensure_pool
from gpupool.k8s.api.wire import log_event as _log
from gpupool.k8s.cycle.plan import Placement, Plan, Preemption, assignment_annotations
from gpupool.k8s.cycle.pool import PoolDriver
from gpupool.k8s.objects.fields import annotations_of, node_name_of, pod_key
from gpupool.k8s.objects.hami import HAMI_LOCK_EXPIRE_S, hami_pod_annotations
from gpupool.k8s.objects.snapshots import ClusterSnapshot
from gpupool.k8s.state import ClusterModel
from gpupool.policies import DEFAULT_POLICY

_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


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
    bind_unknown_ttl_s: float = 600.0  # a binding whose outcome is unknown (no reply, no read-back) keeps its GPUs
    # this long at most while it is read back again (an apiserver restart takes seconds to minutes)
    bind_workers: int = 8  # threads that POST bindings (nothing else); the client's pool is sized to fit
    bind_timeout_s: float = 30.0  # read timeout of a binding, a status patch, a read-back (seconds)
    list_page: int = 500
    evict_workers: int = 2  # threads that carry out preemptions (eviction dry runs, conditions, evictions)
    queue_status_s: float = 0.5  # Queue and PodGroup status: a change is written at most this long after it,
    # rounds at least this far apart (a change within it waits for the next round, never skipped); 0 = never
    gc_freeze: bool = False  # after the first cycle, move the listed objects out of the GC's scans (gc.freeze);
    # process-wide, so `gpupool scheduler` turns it on and library users decide for themselves
    pool: bool = True  # the pool scheduler runs the cluster (fair share, gangs, reclaim, preemption): gpupool.k8s.pool
    pool_config: Any = None  # its gpupool.engine.pool.PoolConfig (None: gpupool.k8s.cycle.pool.driver.live_config())
    default_queue: str = "default"  # the leaf queue of pods that name none
    rereport_s: float = 60.0  # a reason whose only change is a figure (GPUs held, seconds waited) is re-posted at
    # most this often: the pool's reasons carry live numbers, and a write per change would flood the API
    pod_group_status: bool = True  # write PodGroup status (off where scheduler-plugins' or Volcano's controller does)
    share_enforcement: str = "none"  # where a GPU share may go: none, hami or trust (gpupool.k8s.cache.sharing)




# ------------------------------------------------------------------ the scheduler
@dataclass
class _Assumed:
    """A pod gpupool is binding (or has bound, until the watch shows it): counted as bound meanwhile."""

    uid: str
    placement: Placement
    annotations: dict[str, str]
    done_at: float | None = None
    started: float = field(default_factory=time.perf_counter)  # when the cycle that placed it began
    unknown_since: float | None = None  # monotonic time its binding's outcome became unknown (None: known)
    rechecks: int = 0  # read-backs scheduled since
    lock_since: float | None = None  # monotonic time it began waiting for HAMi's node lock (None: not waiting)
    locked: bool = False  # it holds HAMi's node lock (released by HAMi's device plugin once served)


class Scheduler:
    """The live scheduler; :meth:`start` / :meth:`stop`, or :meth:`run` until stopped.

    ``leader``: a callable telling whether this replica may bind now (None: always), e.g.
    ``lambda: elector.is_leader`` with :class:`gpupool.k8s.api.leader.LeaderElector`. ``metrics``: a
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
        self._second_binder_logged = -1e9  # monotonic time of the last second_scheduler_detected line
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
                                  assume_ttl_s=self.config.assume_ttl_s,  # parses each pod once per version
                                  share_enforcement=self.config.share_enforcement)
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
        self._last_cycle = time.monotonic()  # when the loop's last full pass began (resync_s counts from it)
        self.bindings: list[tuple[str, str]] = []  # (pod, node) bound by this replica, in order
        cfg = self.config
        self.reflectors = [
            Reflector("nodes", self.core.list_node, self.cache, cfg),
            Reflector("pods", self.core.list_pod_for_all_namespaces, self.cache, cfg),
            Reflector("podgroups", self._custom_lister(*POD_GROUP_API), self.cache, cfg, optional=True),
            Reflector("volcanopodgroups", self._custom_lister(*VOLCANO_POD_GROUP_API), self.cache, cfg, optional=True),
            Reflector("queues", self._custom_lister(*QUEUE_API), self.cache, cfg, optional=True),
            # DRA (resource.k8s.io/v1, Kubernetes 1.34+): absent or not granted -> no claims are placed
            Reflector("resourceslices", self._custom_lister(*DRA_SLICE_API), self.cache, cfg, optional=True),
            Reflector("deviceclasses", self._custom_lister(*DRA_CLASS_API), self.cache, cfg, optional=True),
            Reflector("resourceclaims", self._custom_lister(*DRA_CLAIM_API), self.cache, cfg, optional=True),
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
            timeout = max(0.0, self._last_cycle + self.config.resync_s - self.heartbeat)
            status_in = self.status_writer.due_in() if self._leading else None
            woke = self.cache.changed.wait(timeout if status_in is None else min(timeout, status_in))
            self.heartbeat = time.monotonic()
            if self._stop.is_set():
                break
            if (not woke and status_in is not None and status_in < timeout
                    and self.heartbeat - self._last_cycle < self.config.resync_s):
                self._status_round()  # a status write was deferred (coalesced) and nothing else woke the loop
                continue
            self._last_cycle = self.heartbeat  # a full pass (a cycle, or a standby's model update) restarts resync_s
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
            elif op == "claim":  # what the API server answered to a claim write (ahead of its watch event)
                planned_key, obj = arg
                self.model.apply("resourceclaims", "MODIFIED", obj)
                self.model.dra.forget(planned_key)  # a claim made now was assumed under its generateName
        with self._lock:
            for key in [k for k in self._reported if self.cache.get("pods", k) is None]:
                del self._reported[key]

    def run_cycle(self) -> Plan:
        """One cycle: apply what changed to the model, plan its pending pods, dispatch bindings and reports.

        Costs what the pending pods and the changes cost (:class:`~gpupool.k8s.cache.model.ClusterModel`), not what
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
            ann = assignment_annotations(p)
            if p.hami_devices:  # --share-enforcement hami: what HAMi's device plugin reads to hand the GPUs over
                ann.update(hami_pod_annotations(p.node, p.hami_devices, time.time()))
            with self._lock:
                a = _Assumed(uid, p, ann, started=t0)
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
        """PATCH the status of the Queues and PodGroups whose status changed (leader only, off the scheduling
        thread; :class:`gpupool.k8s.api.status.StatusWriter`): ``kubectl get queues`` shows allocation, fair share
        and borrowing, ``kubectl get podgroups`` the phase. Rounds are ``queue_status_s`` apart at least; a change
        within that is written when the next round is due (the loop wakes for it: :meth:`_status_round`)."""
        fair = self.pool_driver.fair_shares() if self.pool_driver is not None else None
        self.status_writer.update(self.model, fair or None, force=force)

    def _status_round(self) -> None:
        """The deferred status round, on the scheduling thread between cycles: the model as the last cycle left
        it (changes since then wake the loop for a cycle, which writes them). Leader only."""
        if not self._leading or not self._is_leader():
            self.cache.changed.set()  # leadership changed: a full pass (it rechecks leadership) comes first
            return
        try:
            self._write_status()
        except Exception:  # pragma: no cover - status is best effort; a bug must not stop the scheduler
            _log(logging.ERROR, "status_round_failed", exc_info=True)

    # -- binding
    def _forget(self, key: str, a: _Assumed) -> None:
        """The binding of ``key`` did not happen: its devices go back to the pool at the next cycle (and HAMi's node
        lock, if it took one, is released)."""
        with self._lock:
            if self.assumed.get(key) is a:
                del self.assumed[key]
        self._model_ops.append(("forget", key, a.uid))
        self.cache.changed.set()
        if a.locked:
            a.locked = False
            ns, name = split_key(key)
            try:
                release_node_lock(self.api_client, a.placement.node or "", ns, name,
                                  timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
            except Exception as exc:  # it expires after 5 minutes, or the next taker finds its pod unbound
                _log(logging.INFO, "hami_lock_release_failed", pod=key, reason=api_reason(exc))

    def _hami_lock(self, pod: Mapping[str, Any], a: _Assumed, ns: str, name: str, key: str, node: str) -> str:
        """Take HAMi's node lock for ``pod`` before its binding (:mod:`gpupool.k8s.api.hami_lock`); returns "" once
        held. While another pod's devices are being handed over on the node, the assumption (its GPUs) is kept and
        the lock tried again after a backoff, on a binder (a lock older than HAMi's expiry, 5 min, is taken over).
        After twice that of waiting it is forgotten (planned again) and the pod told why. Returns ``waiting`` or
        ``error`` then."""
        try:
            why = take_node_lock(self.api_client, node, ns, name, time.time(),
                                 timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
        except Exception as exc:
            why = f"HAMi's node lock on {node} could not be taken: {api_reason(exc)}"
        if not why:
            a.locked, a.lock_since = True, None
            return ""
        now = time.monotonic()
        if a.lock_since is None:
            a.lock_since = now
            _log(logging.INFO, "hami_lock_wait", pod=key, node=node, reason=why)
        if now - a.lock_since > 2 * HAMI_LOCK_EXPIRE_S:
            self._forget(key, a)
            self._report_unschedulable(pod, f"not bound to {node}: {why} (waited {2 * HAMI_LOCK_EXPIRE_S:.0f} s)")
            return "error"
        a.rechecks += 1
        delay = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** min(a.rechecks, 20))
        timer = threading.Timer(delay, self._bind_again, (pod, a))
        timer.daemon = True
        timer.start()
        return "waiting"

    def _bind_again(self, pod: Mapping[str, Any], a: _Assumed) -> None:
        """Timer callback of :meth:`_hami_lock`: hand the binding to a binder again unless settled meanwhile."""
        with self._lock:
            if self._stop.is_set() or self.assumed.get(a.placement.pod) is not a:
                return
        try:
            self._pool.submit(self._bind, pod, a)
        except RuntimeError:  # stopping
            pass

    def _bind(self, pod: Mapping[str, Any], a: _Assumed) -> str:
        """Bind ``pod`` as ``a`` plans it, in ONE write; returns bound|conflict|deleted|node_gone|error|not_leader
        (or ``waiting``: HAMi's node lock is held by another pod, :meth:`_hami_lock`).

        The ``pods/binding`` POST carries the device annotations and the pod's UID (precondition): the API server
        sets ``spec.nodeName`` and copies the Binding's annotations onto the pod in one atomic update, so a pod
        is never annotated by a scheduler that did not bind it. The ``Scheduled`` Event is queued on the
        recorder (:class:`gpupool.k8s.api.events.EventRecorder`) and never delays the next binding.
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
        if a.placement.claims:
            failed = self._write_claims(pod, a)
            if failed:
                return failed
        if ANN_HAMI_DEVICES_TO_ALLOCATE in a.annotations and not a.locked:
            waiting = self._hami_lock(pod, a, ns, name, key, node)
            if waiting:
                return waiting
        try:
            post_binding(self.api_client, ns, name, a.uid, a.annotations, node,
                         timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
        except ApiException as exc:
            if exc.status == 404:
                result = "deleted"
                _log(logging.INFO, "bind_skipped", pod=key, node=node, reason="pod deleted")
                self._forget(key, a)
            elif exc.status == 409:
                self._bind_outage.success()
                result = self._on_conflict(ns, name, key, a)
            elif exc.status is not None and exc.status >= 500:  # e.g. a timeout after etcd took it: maybe bound
                self._bind_outage.failure(pod=key, status=exc.status, reason=exc.reason)
                result = self._on_conflict(ns, name, key, a, why=f"{exc.status} {exc.reason}")
                if result == "error":
                    self._report_unschedulable(pod, binding_failure_message(exc.status, exc.reason), force=True)
            else:
                result = "error"
                if exc.status is None or exc.status in (403, 429):
                    self._bind_outage.failure(pod=key, status=exc.status, reason=exc.reason)
                else:
                    _log(logging.WARNING, "bind_failed", pod=key, node=node, status=exc.status, reason=exc.reason)
                self._forget(key, a)
                self._report_unschedulable(pod, binding_failure_message(exc.status, exc.reason), force=True)
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

    def _write_claims(self, pod: Mapping[str, Any], a: _Assumed) -> str:
        """Allocate and reserve the pod's ResourceClaims as planned, before the binding (kube-scheduler's DRA
        PreBind; :func:`gpupool.k8s.api.claims.write_pod_claims`): "" when every claim is written, else the
        outcome (the pod is planned again: a claim changed meanwhile answers 409, a claim or pod gone 404). What
        the API server answered is fed to the model, so the devices stay held even when the binding then fails."""
        key = a.placement.pod
        try:
            written = write_pod_claims(self.api_client, pod, a.uid, a.placement.claims,
                                       timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
        except ClaimWriteError as err:
            for planned, obj in err.written:
                self._model_ops.append(("claim", key, (planned, obj)))
            quiet = err.status in (404, 409)
            _log(logging.INFO if quiet else logging.WARNING, "claim_write_failed", pod=key, claim=err.claim,
                 status=err.status, reason=err.reason)
            self._forget(key, a)
            if err.status is not None and not quiet:
                self._report_unschedulable(pod, f"{err}", force=True)
            return "conflict" if err.status == 409 else "error"
        for planned, obj, ca in written:
            self._model_ops.append(("claim", key, (planned, obj)))
            _log(logging.INFO, "claim_allocated" if ca.results else "claim_reserved", pod=key,
                 claim=f"{ca.claim.namespace}/{obj['metadata']['name']}", node=ca.node,
                 devices=",".join(r.device for r in ca.results) or "-")
        return ""

    def _bound(self, pod: Mapping[str, Any], key: str, a: _Assumed, node: str, note: str = "") -> None:
        """Record a binding the API server accepted: assumption done, ``Scheduled`` Event queued, metric."""
        with self._lock:
            a.done_at = time.monotonic()
            a.locked = False  # HAMi's node lock, if taken, is its device plugin's to release once it served the pod
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
        winner's). Gone -> ``deleted``. Unbound -> ``error`` (planned again next cycle). Unreadable (the API
        does not answer) -> ``unknown``: the assumption is kept, since the binding may have gone through, and
        the pod is read back again later (:meth:`_keep_unconfirmed`).
        """
        node = a.placement.node or ""
        try:
            current = read_pod(self.api_client, ns, name,
                               timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
        except ApiException as exc:
            if exc.status == 404:
                self._forget(key, a)
                return "deleted"
            current = None
        except Exception:  # network trouble while reading back
            current = None
        if current is None:
            return self._keep_unconfirmed(ns, name, key, a, why)
        bound_to = node_name_of(current)
        cmeta = current.get("metadata") or {}
        ann = annotations_of(current)
        if (bound_to == node and cmeta.get("uid", "") == a.uid  # HAMi's plugin rewrites its own keys once served
                and all(ann.get(k) == v for k, v in a.annotations.items() if k.startswith(ANNOTATION_PREFIX))):
            self._bound(current, key, a, node, note=f"already bound here ({why})")
            return "bound"
        if not bound_to:
            _log(logging.INFO, "bind_unknown", pod=key, planned=node, why=why, action="plan again")
            self._forget(key, a)
            return "error"
        _log(logging.INFO, "bind_conflict", pod=key, planned=node, bound_to=bound_to,
             their_gpus=ann.get(ANN_GPU_INDEX, "?") if ann.get(ANN_NODE) == bound_to else "?")
        if ann.get(ANN_NODE) == bound_to:
            self._second_binder(key, bound_to)
        self._forget(key, a)
        return "conflict"

    def _second_binder(self, key: str, bound_to: str) -> None:
        """A pod this scheduler planned was bound by a Binding carrying gpupool's annotations that is not its
        own: another gpupool scheduler (a second replica without leader election, an extender) binds the same
        pods, and two of them book the same GPUs twice (issue 33 item 5). One ERROR line a minute."""
        now = time.monotonic()
        if now - self._second_binder_logged < 60.0:
            return
        self._second_binder_logged = now
        _log(logging.ERROR, "second_scheduler_detected", pod=key, bound_to=bound_to,
             scheduler=self.config.scheduler_name, identity=self.config.identity,
             action="another gpupool scheduler binds pods of this schedulerName: run one replica, or all with "
                    "--leader-elect (the default)")

    def _keep_unconfirmed(self, ns: str, name: str, key: str, a: _Assumed, why: str) -> str:
        """Neither the binding of ``key`` nor its read-back answered: it may be bound. The assumption (its GPUs)
        is kept and the pod read back again after a backoff (``backoff_initial_s`` doubling up to
        ``backoff_max_s``), on a binder, until the API answers (:meth:`_on_conflict`), the assumption is settled
        otherwise (a new leadership, a stop) or ``bind_unknown_ttl_s`` passed since the outcome became unknown;
        then it is forgotten with a warning. Returns ``unknown`` (or ``error`` once expired)."""
        node = a.placement.node or ""
        now = time.monotonic()
        if a.unknown_since is None:
            a.unknown_since = now
        waited = now - a.unknown_since
        if waited > self.config.bind_unknown_ttl_s:
            _log(logging.WARNING, "bind_unknown", pod=key, planned=node, why=why, waited_s=round(waited, 1),
                 action="no answer for bind_unknown_ttl_s: forgotten, planned again")
            self._forget(key, a)
            return "error"
        delay = min(self.config.backoff_max_s, self.config.backoff_initial_s * 2 ** min(a.rechecks, 20))
        if a.rechecks == 0:
            _log(logging.INFO, "bind_unknown", pod=key, planned=node, why=why,
                 action="assumption kept (it may be bound); reading back again")
        a.rechecks += 1
        timer = threading.Timer(delay, self._read_back_again, (ns, name, key, a, why))
        timer.daemon = True
        timer.start()
        return "unknown"

    def _read_back_again(self, ns: str, name: str, key: str, a: _Assumed, why: str) -> None:
        """Timer callback of :meth:`_keep_unconfirmed`: hand the read-back to a binder unless settled meanwhile."""
        with self._lock:
            if self._stop.is_set() or self.assumed.get(key) is not a:
                return
        try:
            self._pool.submit(self._on_conflict, ns, name, key, a, why)
        except RuntimeError:  # stopping
            pass

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
        try:
            set_unschedulable(self.api_client, meta.get("namespace") or "default", meta.get("name", ""), message,
                              timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
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
        """:func:`gpupool.k8s.api.calls.evict` for ``key``; timeout: the connect timeout plus ``bind_timeout_s``."""
        evict(self.api_client, key, uid, dry_run,
              timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))

    def _mark_disruption_target(self, key: str, reason: str) -> None:
        """:func:`gpupool.k8s.api.calls.mark_disruption_target` for victim ``key`` (``reason`` as the message)."""
        mark_disruption_target(self.api_client, key, reason,
                               timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))

    def _preemptor_pods(self, pre: Preemption) -> list[Mapping[str, Any]]:
        """The pods that wait for ``pre`` (its nominated placements, else the preemptor if it names a pod)."""
        keys = [p.pod for p in pre.nominated] or ([pre.preemptor] if pre.preemptor else [])
        return [pod for k in dict.fromkeys(keys) if (pod := self.cache.get("pods", k)) is not None]

    def _victim_ref(self, key: str, uid: str) -> Mapping[str, Any]:
        """The victim as the cache has it, else enough of it for an Event's ``involvedObject``."""
        pod = self.cache.get("pods", key)
        if pod is not None and (not uid or (pod.get("metadata") or {}).get("uid") == uid):
            return pod
        ns, name = split_key(key)
        return {"metadata": {"namespace": ns, "name": name, "uid": uid}}

    def _preempt(self, pre: Preemption) -> str:
        """Carry out ``pre`` (on an eviction worker); returns ``evicted``, ``refused`` or ``not_leader``.

        1. Dry run, all or nothing: an Eviction with ``dryRun: ["All"]`` and the victim's UID as precondition for
           every victim. Any refusal (``429`` from a PodDisruptionBudget, ``409``, ``500``, a transport error)
           blocks the victim; ``404`` means it is gone already (not a refusal). If one is blocked, nothing is
           evicted: ``("refused", id, {victim: why})`` is queued for the model
           (:meth:`~gpupool.k8s.cache.model.ClusterModel.preemption_refused`, on the scheduling thread) and each
           waiting pod gets a ``PreemptionBlocked`` Warning naming the blocked victims and why.
        2. Otherwise, per victim: ``DisruptionTarget=True`` (reason ``PreemptionByScheduler``, message
           ``pre.reason``) through ``pods/status``, then the real eviction (UID precondition, the pod's own grace
           period) and a ``Preempted`` Event on the victim. A refusal now (a PodDisruptionBudget changed since
           the dry run, the API failing) queues ``("evict_failed", victim, why)``
           (:meth:`~gpupool.k8s.cache.model.ClusterModel.eviction_failed`) and turns the victim's
           ``DisruptionTarget`` False again (reason ``EvictionRefused``): it runs on.

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
            marked = True
            try:
                self._mark_disruption_target(key, pre.reason)
            except ApiException as exc:
                if exc.status == 404:
                    counts["gone"] += 1
                    continue
                marked = False
                _log(logging.INFO, "disruption_condition_failed", pod=key, reason=api_reason(exc))
            except Exception as exc:  # the condition is informative; the eviction decides
                marked = False
                _log(logging.INFO, "disruption_condition_failed", pod=key, reason=api_reason(exc))
            try:
                self._evict(key, uid, dry_run=False)
            except ApiException as exc:
                if exc.status == 404:
                    counts["gone"] += 1
                    continue
                self._eviction_failed(pre, key, api_reason(exc), counts, marked)
                continue
            except Exception as exc:
                self._eviction_failed(pre, key, api_reason(exc), counts, marked)
                continue
            counts["evicted"] += 1
            _log(logging.INFO, "evicted", pod=key, preemption=pre.id, action=pre.action, preemptor=pre.preemptor)
            self._post_event(self._victim_ref(key, uid), "Preempted", pre.reason, "Normal", "Preempting")
        for result, n in counts.items():
            self._metric("inc_eviction", result, n)
        self.preemption_outcomes.append((pre.id, "evicted"))
        return "evicted"

    def _eviction_failed(self, pre: Preemption, key: str, why: str, counts: dict[str, int],
                         marked: bool = False) -> None:
        """The real eviction of victim ``key`` was refused (or did not answer): the model counts it again; the
        ``DisruptionTarget=True`` set on it just before (``marked``) is turned False (reason ``EvictionRefused``),
        since it runs on. Best effort: a failure is logged (Kubernetes' disruption controller clears a stale
        condition after two minutes anyway)."""
        counts["failed"] += 1
        _log(logging.WARNING, "eviction_failed", pod=key, preemption=pre.id, reason=why)
        self._model_ops.append(("evict_failed", key, why))
        self.cache.changed.set()
        if not marked:
            return
        try:
            clear_disruption_target(self.api_client, key, f"gpupool's eviction ({pre.action}) was refused: {why}",
                                    timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
        except Exception as exc:  # informative only, as setting it
            _log(logging.INFO, "disruption_condition_failed", pod=key, reason=api_reason(exc))

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
            set_nominated_node(self.api_client, meta.get("namespace") or "default", meta.get("name", ""), node,
                               timeout=(self.config.connect_timeout_s, self.config.bind_timeout_s))
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
    """One consistent-enough read of the cluster (Nodes, Pods, PodGroups, Queues, and DRA's ResourceSlices,
    DeviceClasses and ResourceClaims) for a dry run."""
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)

    def optional(*api: str) -> list[dict[str, Any]] | None:
        try:
            return list_all(custom.list_cluster_custom_object, *api, page=page)
        except ApiException as exc:
            if exc.status in (403, 404):
                return None
            raise

    groups = (optional(*POD_GROUP_API) or []) + (optional(*VOLCANO_POD_GROUP_API) or [])
    return ClusterSnapshot(nodes=list_all(core.list_node, page=page),
                           pods=list_all(core.list_pod_for_all_namespaces, page=page),
                           pod_groups=groups, queues=optional(*QUEUE_API),
                           resourceslices=optional(*DRA_SLICE_API) or [],
                           deviceclasses=optional(*DRA_CLASS_API) or [],
                           resourceclaims=optional(*DRA_CLAIM_API) or [])


__all__ = ["read_cluster", "Scheduler", "SchedulerConfig", "Reflector", "ClusterCache", "Backoff",
           "assignment_annotations", "api_reason", "DISRUPTION_TARGET", "PREEMPTION_BY_SCHEDULER"]
