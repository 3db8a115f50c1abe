"""The GpuAutoscaler controller: Prometheus metrics in, ``scale`` subresource writes out.

Pieces, as in the live scheduler (:mod:`gpupool.k8s.scheduler`):

* a :class:`~gpupool.k8s.scheduler.Reflector` lists and watches ``gpuautoscalers.gpupool.io`` (all namespaces, or
  one) into a cache: the official client's list + watch with bookmarks, relist on ``410 Gone``, backoff on errors;
  a CRD not installed yet is looked for again later;
* one reconcile thread: every ``sync_period_s`` (15 s, the HPA controller's default ``--horizontal-pod-autoscaler-
  sync-period``) every object, and at once an object that is new or whose ``spec`` changed (``generation``); only
  the leader (``leader`` callable, e.g. :class:`gpupool.k8s.api.leader.LeaderElector`) reconciles, a standby keeps
  its cache warm;
* per object (:meth:`AutoscalerController.reconcile`): parse the spec (:mod:`.crd`), read the target's ``scale``
  subresource (``AppsV1Api.read_namespaced_deployment_scale`` / ``..._stateful_set_scale``), run each metric's
  instant query (:mod:`.prometheus`), ask the object's :class:`gpupool.engine.autoscale.Recommender` (its
  stabilization windows live in it, so one per object, kept while ``generation`` does not change), patch
  ``scale.spec.replicas`` when the answer differs, post an Event (``SuccessfulRescale``, as the HPA), choose the
  GPU slice with :class:`gpupool.engine.rightsize.RightSizer` (and, only with ``slicePolicy.apply``, patch the
  target's pod template, which rolls its pods), and write ``status`` (current / desired replicas, metrics,
  chosen slice, last scale time, the HPA's conditions ``AbleToScale``, ``ScalingActive``, ``ScalingLimited``).

As the HPA controller, the recommender's history is in memory: a restart or a leader change starts the
stabilization windows afresh (the first scale-down waits a full window). Objects are reconciled one after the
other on one thread; each Prometheus query is bounded by the client's timeout and retries.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpupool.k8s.api.events import EventRecorder
from gpupool.k8s.api.watch import ClusterCache, Reflector
from gpupool.k8s.api.wire import MERGE_PATCH, STRATEGIC_PATCH, api_reason, call, drain, ensure_pool
from gpupool.k8s.api.wire import now_iso as _now_iso
from gpupool.k8s.autoscaler import API, COMPONENT, GROUP, PLURAL, VERSION
from gpupool.k8s.autoscaler.crd import (
    SLICE_ANNOTATION,
    GpuAutoscalerConfig,
    SpecError,
    parse_gpu_autoscaler,
    slice_options,
    slice_template_patch,
)
from gpupool.k8s.autoscaler.prometheus import PrometheusClient, PrometheusError

log = logging.getLogger("gpupool.k8s.autoscaler")

STATUS_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{PLURAL}/{{name}}/status"
CONDITIONS = ("AbleToScale", "ScalingActive", "ScalingLimited")
LIMIT_REASONS = {"maxReplicas": "TooManyReplicas", "minReplicas": "TooFewReplicas", "scaleUpPolicy": "ScaleUpLimit",
                 "scaleDownPolicy": "ScaleDownLimit"}
"""Recommendation.limited_by -> the HPA's ScalingLimited reasons (pkg/controller/podautoscaler/horizontal.go); any
other rule (``panic``, ``cooldown``) is reported under its own name, the stabilization windows under AbleToScale."""
STABILIZED = {
    "scaleDownStabilization": ("ScaleDownStabilized", "recent recommendations were higher than current one, "
                                                      "applying the highest recent recommendation"),
    "scaleUpStabilization": ("ScaleUpStabilized", "recent recommendations were lower than current one, "
                                                  "applying the lowest recent recommendation"),
}
RESULTS = ("scaled", "unchanged", "invalid_spec", "failed_get_scale", "failed_rescale", "no_metrics", "disabled",
           "error")


def _log(level: int, event: str, exc_info: bool = False, **fields: Any) -> None:
    """One structured log line: the event as the message, the fields as ``extra``."""
    if log.isEnabledFor(level):
        log.log(level, event, extra={"event": event, **fields}, exc_info=exc_info)


def _camel(text: str) -> str:
    return text[:1].upper() + text[1:] if text else "Limited"


@dataclass
class ControllerConfig:
    """Knobs of the controller (defaults suit a cluster; tests shorten them). The watch knobs are the
    :class:`~gpupool.k8s.scheduler.Reflector`'s (same names as :class:`~gpupool.k8s.scheduler.SchedulerConfig`)."""

    identity: str = "gpupool-autoscaler"
    namespace: str | None = None  # watch GpuAutoscalers in this namespace only (None: all)
    sync_period_s: float = 15.0  # every object reconciled at least this often (HPA sync period)
    request_timeout_s: float = 10.0  # each scale read / write, status patch, template read / patch
    watch_timeout_s: int = 300
    read_timeout_s: float | None = None
    connect_timeout_s: float = 10.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    optional_retry_s: float = 30.0  # how often to look again for the CRD when it is not installed
    list_page: int = 500
    batch_s: float = 0.05  # wait after a change so that a burst of changes becomes one pass


class AutoscalerMetrics:
    """The controller's Prometheus metrics on their own registry (``/metrics`` through
    :class:`gpupool.k8s.metrics.MetricsServer`, which also reads :attr:`ready`)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.reconciles = Counter("gpupool_autoscaler_reconciles", "GpuAutoscaler reconciles by result.", ["result"],
                                  registry=r)
        for result in RESULTS:
            self.reconciles.labels(result=result)
        self.duration = Histogram("gpupool_autoscaler_reconcile_duration_seconds",
                                  "One reconcile: scale read, Prometheus queries, recommendation, writes.",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=r)
        self.replicas = Gauge("gpupool_autoscaler_replicas", "Replicas of a GpuAutoscaler's target: current, desired.",
                              ["namespace", "name", "kind"], registry=r)
        self.metric_value = Gauge("gpupool_autoscaler_metric_value",
                                  "Last value of a GpuAutoscaler's metric as read from Prometheus.",
                                  ["namespace", "name", "metric"], registry=r)
        self.scales = Counter("gpupool_autoscaler_scale_operations", "Writes of scale.spec.replicas by direction.",
                              ["direction"], registry=r)
        for direction in ("up", "down"):
            self.scales.labels(direction=direction)
        self.queries = Counter("gpupool_autoscaler_prometheus_queries", "Prometheus instant queries by result.",
                               ["result"], registry=r)
        for result in ("ok", "empty", "error"):
            self.queries.labels(result=result)
        self.query_duration = Histogram("gpupool_autoscaler_prometheus_query_duration_seconds",
                                        "One Prometheus instant query, retries included.",
                                        buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=r)
        self.objects = Gauge("gpupool_autoscaler_objects", "GpuAutoscalers in the cache.", registry=r)
        self.leader = Gauge("gpupool_autoscaler_leader", "1 while this replica holds the leader Lease.", registry=r)
        self.events_dropped = Counter("gpupool_autoscaler_events_dropped",
                                      "Events not posted because the recorder's queue was full.", registry=r)
        self._ready = threading.Event()
        self._series: dict[tuple[str, str], set[str]] = {}
        self._lock = threading.Lock()

    def set_ready(self, ready: bool = True) -> None:
        (self._ready.set if ready else self._ready.clear)()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def observe_object(self, namespace: str, name: str, current: int | None, desired: int | None,
                       values: Mapping[str, float]) -> None:
        with self._lock:
            self._series.setdefault((namespace, name), set()).update(values)
        for kind, value in (("current", current), ("desired", desired)):
            if value is not None:
                self.replicas.labels(namespace=namespace, name=name, kind=kind).set(value)
        for metric, value in values.items():
            self.metric_value.labels(namespace=namespace, name=name, metric=metric).set(value)

    def forget(self, keep: set[tuple[str, str]]) -> None:
        """Drop the series of the objects not in ``keep`` (deleted GpuAutoscalers)."""
        with self._lock:
            gone = {k: self._series.pop(k) for k in set(self._series) - keep}
        for (ns, name), metric_names in gone.items():
            for kind in ("current", "desired"):
                try:
                    self.replicas.remove(ns, name, kind)
                except KeyError:
                    pass
            for metric in metric_names:
                try:
                    self.metric_value.remove(ns, name, metric)
                except KeyError:
                    pass


@dataclass
class _State:
    """What the controller keeps per GpuAutoscaler between reconciles (in memory, as the HPA controller)."""

    uid: str
    generation: int
    config: GpuAutoscalerConfig
    recommender: Any
    rightsizer: Any = None
    options: dict[str, Any] = field(default_factory=dict)
    last_slice: str | None = None


@dataclass
class Outcome:
    """What one reconcile did (tests and logs read it)."""

    key: str
    result: str
    current: int | None = None
    desired: int | None = None
    samples: dict[str, float] = field(default_factory=dict)
    reason: str = ""
    slice: str | None = None
    status: dict[str, Any] = field(default_factory=dict)


class _Cache(ClusterCache):
    KINDS = ("gpuautoscalers",)


class AutoscalerController:
    """The controller; :meth:`start` / :meth:`stop`. ``prometheus``: a :class:`PrometheusClient` (or anything with
    its ``value(query, how)``); ``leader``: may this replica write now (None: always); ``clock``: monotonic seconds
    handed to the recommender (tests drive time with it)."""

    def __init__(self, api_client: client.ApiClient, prometheus: PrometheusClient,
                 config: ControllerConfig | None = None, leader: Callable[[], bool] | None = None,
                 metrics: AutoscalerMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api_client = api_client
        self.prometheus = prometheus
        self.config = config or ControllerConfig()
        self.leader = leader
        self.metrics = metrics or AutoscalerMetrics()
        self.clock = clock
        self.apps = client.AppsV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.cache = _Cache()
        self.recorder = EventRecorder(api_client, COMPONENT, self.config.identity,
                                      on_drop=self.metrics.events_dropped.inc)
        self.reflector = Reflector("gpuautoscalers", self._lister(), self.cache, self.config,  # type: ignore[arg-type]
                                   optional=True, log=_log)
        self.states: dict[str, _State] = {}
        self.outcomes: collections.deque[Outcome] = collections.deque(maxlen=1000)
        self.heartbeat = time.monotonic()
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_full = 0.0
        self._seen_generation: dict[str, tuple[str, int]] = {}

    def _lister(self) -> Callable[..., Any]:
        api, ns = self.custom, self.config.namespace
        if ns:
            def list_objects(**kwargs: Any) -> Any:
                return api.list_namespaced_custom_object(*API[:2], ns, API[2], **kwargs)
            list_objects.__doc__ = api.list_namespaced_custom_object.__doc__
        else:
            def list_objects(**kwargs: Any) -> Any:
                return api.list_cluster_custom_object(*API, **kwargs)
            list_objects.__doc__ = api.list_cluster_custom_object.__doc__  # Watch.stream reads it
        return list_objects

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> AutoscalerController:
        ensure_pool(self.api_client, 4 + self.recorder.workers)
        self.reflector.start()
        self._thread = threading.Thread(target=self._loop, name="gpupool-autoscaler", daemon=True)
        self._thread.start()
        _log(logging.INFO, "started", identity=self.config.identity, namespace=self.config.namespace or "(all)",
             sync_period_s=self.config.sync_period_s)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.cache.changed.set()
        self.reflector.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        self.recorder.stop(timeout)
        if self.reflector.is_alive():
            self.reflector.join(timeout)
        _log(logging.INFO, "stopped", identity=self.config.identity)

    def healthy(self) -> bool:
        """Liveness: the reconcile thread runs and went round recently."""
        alive = self._thread is not None and self._thread.is_alive()
        return alive and time.monotonic() - self.heartbeat < max(120.0, 4 * self.config.sync_period_s)

    def resync(self) -> None:
        """Reconcile every object now (e.g. on becoming leader)."""
        self._next_full = 0.0
        self.cache.changed.set()

    # ------------------------------------------------------------------ loop
    def _drain(self) -> set[str]:
        with self.cache.lock:
            batch = list(self.cache.changes)
            self.cache.changes.clear()
        keys: set[str] = set()
        for _, etype, obj in batch:
            if etype == "RELIST":
                keys |= {ClusterCache.key(o) for o in obj or []}
            elif etype in ("ADDED", "MODIFIED"):
                keys.add(ClusterCache.key(obj))
        return keys

    def _objects(self) -> dict[str, dict[str, Any]]:
        with self.cache.lock:
            return dict(self.cache.objects.get("gpuautoscalers") or {})

    def _is_leader(self) -> bool:
        return True if self.leader is None else bool(self.leader())

    def _loop(self) -> None:
        self.metrics.set_ready(False)
        while not self._stop.is_set():
            self.heartbeat = time.monotonic()
            # a standby (or a replica whose cache is not synced yet) waits for a change or the period, not the
            # overdue full pass it may not run: no spinning; becoming leader wakes it (resync)
            due = self._next_full - time.monotonic() if self._leading else self.config.sync_period_s
            self.cache.changed.wait(max(0.0, min(due, self.config.sync_period_s)))
            if self._stop.is_set():
                break
            time.sleep(self.config.batch_s)
            self.cache.changed.clear()
            self.heartbeat = time.monotonic()
            changed = self._drain()
            if not self.reflector.synced.is_set():
                continue
            self.metrics.set_ready(True)
            leading = self._is_leader()
            if leading != self._leading:
                _log(logging.INFO, "elected" if leading else "lost_leadership", identity=self.config.identity)
                self.metrics.leader.set(1 if leading else 0)
                self._leading = leading
                if leading:
                    self._next_full = 0.0
            if not leading:
                continue
            try:
                self.run_pass(changed)
            except Exception:  # a bug must not stop the controller
                _log(logging.ERROR, "pass_failed", exc_info=True)

    def run_pass(self, changed: set[str] | None = None) -> list[Outcome]:
        """One pass: every object when the sync period is due, else the new or re-specified ones in ``changed``."""
        objects = self._objects()
        self.metrics.objects.set(len(objects))
        for key in set(self.states) - set(objects):
            self.states.pop(key, None)
            self._seen_generation.pop(key, None)
        self.metrics.forget({tuple(k.split("/", 1)) for k in objects})  # type: ignore[misc]
        now = time.monotonic()
        if now >= self._next_full:
            keys = sorted(objects)
            self._next_full = now + self.config.sync_period_s
        else:
            keys = []
            for key in sorted(changed or ()):
                obj = objects.get(key)
                if obj is None:
                    continue
                meta = obj.get("metadata") or {}
                if self._seen_generation.get(key) != (meta.get("uid"), meta.get("generation")):
                    keys.append(key)  # new, or its spec changed: a status write by us does not bring it here
        out = []
        for key in keys:
            if self._stop.is_set():
                break
            out.append(self.reconcile(objects[key]))
        return out

    # ------------------------------------------------------------------ one object
    def reconcile(self, obj: dict[str, Any]) -> Outcome:
        """Reconcile one GpuAutoscaler (the API object as a dict); never raises for API or Prometheus trouble."""
        t0 = time.perf_counter()
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
        key = f"{ns}/{name}"
        self._seen_generation[key] = (meta.get("uid"), meta.get("generation"))
        try:
            outcome = self._reconcile(obj, ns, name, key)
        except Exception as exc:  # pragma: no cover - a bug in one object must not stop the others
            _log(logging.ERROR, "reconcile_failed", exc_info=True, autoscaler=key)
            outcome = Outcome(key, "error", reason=repr(exc))
        self.metrics.reconciles.labels(result=outcome.result).inc()
        self.metrics.duration.observe(time.perf_counter() - t0)
        self.outcomes.append(outcome)
        return outcome

    def _reconcile(self, obj: dict[str, Any], ns: str, name: str, key: str) -> Outcome:
        old_status = obj.get("status") or {}
        conds = _Conditions(old_status.get("conditions"))
        status: dict[str, Any] = {"observedGeneration": int((obj.get("metadata") or {}).get("generation") or 0)}
        for keep in ("lastScaleTime", "chosenSlice", "sliceReplicas", "sliceGpuCost", "appliedSlice"):
            if keep in old_status:
                status[keep] = old_status[keep]

        def finish(result: str, **kw: Any) -> Outcome:
            status["conditions"] = conds.render()
            self._write_status(obj, ns, name, old_status, status)
            return Outcome(key, result, status=status, **kw)

        # -- the spec
        try:
            cfg = parse_gpu_autoscaler(obj)
        except SpecError as exc:
            conds.set("ScalingActive", False, "InvalidSpec", str(exc))
            self.recorder.event(obj, "Warning", "InvalidSpec", str(exc), "Validating")
            _log(logging.WARNING, "invalid_spec", autoscaler=key, error=str(exc))
            self.states.pop(key, None)
            return finish("invalid_spec", reason=str(exc))
        state = self._state_for(cfg, key)

        # -- the target's scale subresource
        try:
            scale = self._read_scale(cfg)
        except ApiException as exc:
            why = f"the controller was unable to get the target's current scale: {api_reason(exc)}"
            conds.set("AbleToScale", False, "FailedGetScale", why)
            self.recorder.event(obj, "Warning", "FailedGetScale", why, "Scaling")
            return finish("failed_get_scale", reason=why)
        except Exception as exc:  # transport
            why = f"the controller was unable to get the target's current scale: {type(exc).__name__}: {exc}"[:500]
            conds.set("AbleToScale", False, "FailedGetScale", why)
            return finish("failed_get_scale", reason=why)
        spec_part = scale.get("spec") if isinstance(scale, dict) else None
        if isinstance(spec_part, dict):
            raw = spec_part.get("replicas") or 0  # replicas is omitempty: absent at 0
        else:
            raw = 0 if isinstance(scale, dict) and spec_part is None else scale
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:  # a broken API proxy or aggregated API
            why = f"the controller was unable to get the target's current scale: spec.replicas {str(raw)[:80]!r} " \
                  "is not a replica count"
            conds.set("AbleToScale", False, "FailedGetScale", why)
            self.recorder.event(obj, "Warning", "FailedGetScale", why, "Scaling")
            return finish("failed_get_scale", reason=why)
        current = raw
        status["currentReplicas"] = current
        conds.set("AbleToScale", True, "SucceededGetScale", "the controller was able to get the target's current scale")
        if current == 0 and cfg.min_replicas > 0:
            conds.set("ScalingActive", False, "ScalingDisabled",
                      "scaling is disabled since the replica count of the target is zero (minReplicas > 0)")
            status["desiredReplicas"] = 0
            self.metrics.observe_object(ns, name, current, 0, {})
            return finish("disabled", current=current, desired=0)

        # -- the metrics
        samples: dict[str, float] = {}
        problems: list[str] = []
        for m in cfg.metrics:
            t = time.perf_counter()
            try:
                by_instance = getattr(self.prometheus, "value_per_instance", None)
                if m.instance_query and by_instance is not None:  # MIG instances from their own metric
                    value = by_instance(m.query, m.instance_query, m.reduce)
                else:
                    value = self.prometheus.value(m.query, m.reduce)
            except PrometheusError as exc:
                self.metrics.queries.labels(result="error").inc()
                problems.append(f"{m.name}: {exc}")
                continue
            finally:
                self.metrics.query_duration.observe(time.perf_counter() - t)
            if value is None:
                self.metrics.queries.labels(result="empty").inc()
                problems.append(f"{m.name}: the query returned no value (empty vector or NaN)")
            elif not math.isfinite(value):  # finite samples whose sum overflows (1e308 + 1e308): no JSON number
                self.metrics.queries.labels(result="error").inc()
                problems.append(f"{m.name}: the query's {m.reduce} over its series is not finite ({value:g}); not used")
            elif value < 0:  # a count, a percentage or seconds: a negative one is a broken exporter or query
                self.metrics.queries.labels(result="error").inc()
                problems.append(f"{m.name}: the query returned a negative value ({value:g}); not used")
            else:
                self.metrics.queries.labels(result="ok").inc()
                samples[m.name] = value
        status["currentMetrics"] = [{"name": m.name, "value": round(samples[m.name], 6), "target": m.target}
                                    for m in cfg.metrics if m.name in samples]
        if problems:
            _log(logging.WARNING, "metric_unavailable", autoscaler=key, problems=problems[:4])
            self.recorder.event(obj, "Warning", "FailedGetPrometheusMetric", "; ".join(problems)[:1000], "Scaling")
        if not samples:
            conds.set("ScalingActive", False, "FailedGetPrometheusMetric",
                      "the controller was unable to compute the replica count: " + "; ".join(problems)[:900])
            status["desiredReplicas"] = current
            self.metrics.observe_object(ns, name, current, current, {})
            return finish("no_metrics", current=current, desired=current, reason="; ".join(problems))

        # -- the recommendation
        rec = state.recommender.recommend(self.clock(), current, samples)
        desired = int(rec.replicas)
        status["desiredReplicas"] = desired
        status["recommendation"] = str(rec.reason)[:1000]
        status["panic"] = bool(rec.panic)
        driver = max(rec.proposals, key=rec.proposals.get) if rec.proposals else cfg.metrics[0].name
        conds.set("ScalingActive", True, "ValidMetricFound",
                  f"the controller was able to calculate a replica count from {driver}"
                  + (f" ({len(problems)} metric(s) unavailable)" if problems else ""))
        limited = rec.limited_by
        stabilized = STABILIZED.get(str(limited))
        if limited in LIMIT_REASONS:
            conds.set("ScalingLimited", True, LIMIT_REASONS[limited], str(rec.reason)[:1000])
        elif limited and not stabilized:
            conds.set("ScalingLimited", True, _camel(str(limited)), str(rec.reason)[:1000])
        else:
            conds.set("ScalingLimited", False, "DesiredWithinRange", "the desired count is within the acceptable range")
        result = "unchanged"
        if desired != current:
            try:
                self._write_scale(cfg, desired)
            except Exception as exc:
                why = api_reason(exc)
                conds.set("AbleToScale", False, "FailedUpdateScale",
                          f"the controller was unable to update the target scale: {why}")
                self.recorder.event(obj, "Warning", "FailedRescale",
                                    f"New size: {desired}; reason: {rec.reason}; error: {why}", "Scaling")
                self.metrics.observe_object(ns, name, current, desired, samples)
                return finish("failed_rescale", current=current, desired=desired, samples=samples, reason=why)
            self.metrics.scales.labels(direction="up" if desired > current else "down").inc()
            status["lastScaleTime"] = _now_iso()
            self.recorder.event(obj, "Normal", "SuccessfulRescale", f"New size: {desired}; reason: {rec.reason}",
                                "Scaling")
            _log(logging.INFO, "rescaled", autoscaler=key, target=str(cfg.target), current=current, desired=desired,
                 reason=str(rec.reason), samples=samples)
            conds.set("AbleToScale", True, "SucceededRescale",
                      f"the controller was able to update the target scale to {desired}")
            result = "scaled"
        elif stabilized:
            conds.set("AbleToScale", True, stabilized[0], stabilized[1])
        else:
            conds.set("AbleToScale", True, "ReadyForNewScale", "recommended size matches current size")

        # -- the slice
        chosen = None
        if cfg.slice_policy is not None and state.rightsizer is not None:
            chosen = self._right_size(obj, cfg, state, samples, status, key)
        self.metrics.observe_object(ns, name, current, desired, samples)
        return finish(result, current=current, desired=desired, samples=samples, reason=str(rec.reason), slice=chosen)

    def _state_for(self, cfg: GpuAutoscalerConfig, key: str) -> _State:
        state = self.states.get(key)
        if state is not None and (state.uid, state.generation) == (cfg.uid, cfg.generation):
            return state
        from gpupool.engine.autoscale import Recommender

        rightsizer, options = None, {}
        if cfg.slice_policy is not None:
            from gpupool.engine.rightsize import RightSizer

            opts = slice_options(cfg.slice_policy)
            options = {o.name: o for o in opts}
            rightsizer = RightSizer(opts, hysteresis=cfg.slice_policy.hysteresis,
                                    min_dwell_s=cfg.slice_policy.min_dwell_s)
        last = state.last_slice if state is not None and state.uid == cfg.uid else None
        state = self.states[key] = _State(cfg.uid, cfg.generation, cfg, Recommender(cfg.engine_spec), rightsizer,
                                          options, last)
        return state

    def _right_size(self, obj: dict[str, Any], cfg: GpuAutoscalerConfig, state: _State, samples: Mapping[str, float],
                    status: dict[str, Any], key: str) -> str | None:
        policy = cfg.slice_policy
        assert policy is not None
        demand = samples.get(policy.demand_metric)
        if demand is None:
            return status.get("chosenSlice")
        try:
            choice = state.rightsizer.choose(self.clock(), float(demand), dict(policy.capacity), policy.memory_mib,
                                             min_replicas=max(1, cfg.min_replicas))
        except ValueError as exc:  # nothing fits (memory), reported, nothing changed
            self.recorder.event(obj, "Warning", "NoSliceFits", str(exc)[:1000], "RightSizing")
            return status.get("chosenSlice")
        name = choice.option.name
        status["chosenSlice"], status["sliceReplicas"] = name, int(choice.replicas)
        status["sliceGpuCost"] = round(float(choice.gpu_cost), 4)
        if name != state.last_slice:
            self.recorder.event(obj, "Normal", "SliceChosen", f"{name}: {choice.reason}", "RightSizing")
            _log(logging.INFO, "slice_chosen", autoscaler=key, slice=name, reason=str(choice.reason))
            state.last_slice = name
        if policy.apply and status.get("appliedSlice") != name:
            try:
                applied = self._apply_slice(cfg, choice.option)
            except (ApiException, SpecError) as exc:
                why = api_reason(exc) if isinstance(exc, ApiException) else str(exc)
                self.recorder.event(obj, "Warning", "FailedApplySlice", f"{name}: {why}", "RightSizing")
                return name
            status["appliedSlice"] = name
            if applied:
                self.recorder.event(obj, "Normal", "SliceApplied",
                                    f"{cfg.target}: pod template set to {name} (its pods roll)", "RightSizing")
        return name

    # ------------------------------------------------------------------ API calls
    def _read_scale(self, cfg: GpuAutoscalerConfig) -> dict[str, Any]:
        fn = (self.apps.read_namespaced_deployment_scale if cfg.target.kind == "Deployment"
              else self.apps.read_namespaced_stateful_set_scale)
        resp = fn(cfg.target.name, cfg.namespace, _preload_content=False,
                  _request_timeout=(self.config.connect_timeout_s, self.config.request_timeout_s))
        return json.loads(drain(resp))

    def _write_scale(self, cfg: GpuAutoscalerConfig, replicas: int) -> None:
        fn = (self.apps.patch_namespaced_deployment_scale if cfg.target.kind == "Deployment"
              else self.apps.patch_namespaced_stateful_set_scale)
        drain(fn(cfg.target.name, cfg.namespace, {"spec": {"replicas": int(replicas)}}, _content_type=MERGE_PATCH,
                 _preload_content=False,
                 _request_timeout=(self.config.connect_timeout_s, self.config.request_timeout_s)))

    def _apply_slice(self, cfg: GpuAutoscalerConfig, option: Any) -> bool:
        """Patch the target's pod template to ``option``; False when it already carries it (nothing written)."""
        kind = cfg.target.kind
        read = self.apps.read_namespaced_deployment if kind == "Deployment" else self.apps.read_namespaced_stateful_set
        patch = (self.apps.patch_namespaced_deployment if kind == "Deployment"
                 else self.apps.patch_namespaced_stateful_set)
        timeout = (self.config.connect_timeout_s, self.config.request_timeout_s)
        target = json.loads(drain(read(cfg.target.name, cfg.namespace, _preload_content=False,
                                       _request_timeout=timeout)))
        template = (target.get("spec") or {}).get("template") or {}
        if ((template.get("metadata") or {}).get("annotations") or {}).get(SLICE_ANNOTATION) == option.name:
            return False
        body = slice_template_patch(option, template, cfg.slice_policy.container if cfg.slice_policy else None)
        drain(patch(cfg.target.name, cfg.namespace, body, _content_type=STRATEGIC_PATCH, _preload_content=False,
                    _request_timeout=timeout))
        _log(logging.INFO, "slice_applied", autoscaler=cfg.key, target=str(cfg.target), slice=option.name)
        return True

    def _write_status(self, obj: dict[str, Any], ns: str, name: str, old: Mapping[str, Any],
                      new: dict[str, Any]) -> None:
        if all(old.get(k) == v for k, v in new.items()) and not (set(old) - set(new)):
            return  # nothing changed: no write
        body = {"status": {**{k: None for k in old if k not in new}, **new}}
        try:
            call(self.api_client, "PATCH", STATUS_PATH, body, content_type=MERGE_PATCH,
                 timeout=(self.config.connect_timeout_s, self.config.request_timeout_s),
                 path_params={"namespace": ns, "name": name})
        except ApiException as exc:
            if exc.status != 404:  # deleted meanwhile: nothing to report
                _log(logging.WARNING, "status_write_failed", autoscaler=f"{ns}/{name}", error=api_reason(exc))
        except Exception as exc:
            _log(logging.WARNING, "status_write_failed", autoscaler=f"{ns}/{name}", error=repr(exc)[:300])


class _Conditions:
    """The HPA's status conditions, ``lastTransitionTime`` kept while a condition's status does not change."""

    def __init__(self, old: Any) -> None:
        self.old = {c.get("type"): c for c in old or [] if isinstance(c, Mapping)}
        self.new: dict[str, dict[str, Any]] = {}

    def set(self, ctype: str, ok: bool, reason: str, message: str) -> None:
        status = "True" if ok else "False"
        prev = self.new.get(ctype) or self.old.get(ctype) or {}
        since = prev.get("lastTransitionTime") if prev.get("status") == status else None
        self.new[ctype] = {"type": ctype, "status": status, "reason": reason, "message": message[:1000],
                           "lastTransitionTime": since or _now_iso()}

    def render(self) -> list[dict[str, Any]]:
        out = []
        for ctype in CONDITIONS:
            cond = self.new.get(ctype) or self.old.get(ctype)
            if cond is not None:
                out.append(dict(cond))
        return out


__all__ = ["AutoscalerController", "AutoscalerMetrics", "CONDITIONS", "ControllerConfig", "LIMIT_REASONS",
           "Outcome", "RESULTS", "STATUS_PATH"]
