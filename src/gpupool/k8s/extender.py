"""kube-scheduler extender: kube-scheduler keeps scheduling, gpupool filters, scores and binds GPU pods.

kube-scheduler POSTs JSON to ``<urlPrefix>/<verb>`` (types of ``k8s.io/kube-scheduler/extender/v1``;
Go field names, no JSON tags, decoded case-insensitively):

* ``filter``: ``ExtenderArgs {Pod, Nodes, NodeNames}`` -> ``ExtenderFilterResult {Nodes, NodeNames,
  FailedNodes, FailedAndUnresolvableNodes, Error}``. With ``nodeCacheCapable: true`` the request carries
  node names only and the answer lists names; otherwise it carries a ``NodeList`` and gets one back.
* ``prioritize``: ``ExtenderArgs`` -> ``HostPriorityList [{Host, Score}]``, scores 0..10
  (``MaxExtenderPriority``; kube-scheduler multiplies by the extender's weight and by 10).
* ``bind``: ``ExtenderBindingArgs {PodName, PodNamespace, PodUID, Node}`` ->
  ``ExtenderBindingResult {Error}``. gpupool reads the pod, checks that it may bind it (its
  ``schedulerName`` is one this extender serves, its namespace one it may bind in, not bound, not being
  deleted, the UID kube-scheduler named), picks the devices and POSTs the ``pods/binding`` carrying them as
  annotations (``gpupool.io/node``, ``gpu-index``, ``gpu-milli``, ``gpu-memory``): the API server sets
  ``spec.nodeName`` and copies the annotations in one update (``assignPod``), so the Binding is the one write
  and a pod is never annotated by a bind that did not happen. One bind per pod at a time: a second bind of a
  pod while one is in flight is refused at once (two concurrent binds of one pod used to release each other's
  reservation and strip the annotations off the bound pod). With ``share_enforcement="hami"`` on a HAMi node the Binding
  also carries HAMi's keys, after gpupool took HAMi's node lock (``api.hami_lock``).

Failures are answered with HTTP 200 and the ``Error`` field, as kube-scheduler expects; a node that can
never fit the pod (GPU model, a request gpupool cannot read) goes to ``FailedAndUnresolvableNodes`` so
preemption does not try it.

:class:`NodeCache` is the extender's own view of the cluster (that is what ``nodeCacheCapable`` promises):
nodes and bound pods listed every ``resync`` seconds and turned into a
:class:`~gpupool.cluster.ClusterState` by :func:`gpupool.k8s.cache.model.build_state`, plus the pods this
extender bound itself and the list does not show yet ("assumed", as kube-scheduler's cache does), so two
pods bound in quick succession never get the same GPU share. A binding without an answer (no reply, a 5xx)
is read back; bound there, it succeeded; when the read-back fails too, the reservation and the annotations
are kept (it may be bound) until the list shows the pod or ``assume_ttl`` passes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from kubernetes import client

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine, Policy
from gpupool.engine.filters import EffectiveRequest, GpuModelMatch, feasible
from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.api.calls import post_binding, read_pod
from gpupool.k8s.api.hami_lock import release_node_lock, take_node_lock
from gpupool.k8s.cache.devices import InventoryInfo
from gpupool.k8s.cache.eligibility import with_share
from gpupool.k8s.cache.model import build_state
from gpupool.k8s.cache.sharing import check_mode, share_filters
from gpupool.k8s.extender_wire import MAX_EXTENDER_PRIORITY, binding_args, candidate_nodes, field_of, scale_scores
from gpupool.k8s.metrics import SchedulerMetrics
from gpupool.k8s.objects.fields import RequestParseError
from gpupool.k8s.objects.hami import hami_devices_for, hami_pod_annotations
from gpupool.k8s.objects.nodes import RegisteredGpu, hami_registered_gpus, node_name
from gpupool.k8s.objects.pods import parse_pod
from gpupool.k8s.telemetry import GpuTelemetry
from gpupool.model import AllocationError, Assignment, PodRequest
from gpupool.policies import DEFAULT_POLICY, make_policy

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER_NAME = "default-scheduler"
"""kube-scheduler's default profile (``v1.DefaultSchedulerName``): a pod without ``spec.schedulerName`` has it."""


UNRESOLVABLE_FILTERS: tuple[type, ...] = (GpuModelMatch,)
"""Filters whose failure preemption cannot cure (evicting pods does not change a node's GPU model)."""


def device_annotations(assignment: Assignment) -> dict[str, str]:
    """The annotations gpupool writes on a pod it places (read back by :mod:`gpupool.k8s.inventory`)."""
    return {
        ANN_NODE: assignment.node_name,
        ANN_GPU_INDEX: ",".join(str(g) for g in assignment.gpus),
        ANN_GPU_MILLI: str(assignment.gpu_milli if assignment.gpus else 0),
        ANN_GPU_MEMORY: str(assignment.gpu_memory_mib if assignment.gpus else 0),
    }


@dataclass(frozen=True, slots=True)
class _Assumed:
    request: PodRequest
    node: str
    gpus: tuple[int, ...]
    gpu_milli: int
    since: float
    bound: bool = False  # the API server accepted the binding (else: in flight, or its outcome is unknown)


class NodeCache:
    """The extender's view of the cluster, refreshed by listing nodes and pods (see the module doc).

    ``core``: the ``CoreV1Api`` to list with (None: only :meth:`load` feeds it). ``policy``: a name of
    :mod:`gpupool.policies`. ``assume_ttl``: seconds a pod bound here is counted while the list does not
    show it bound. ``telemetry``: if given, GPUs with XID errors are marked unhealthy at every refresh.
    ``share_enforcement``: where a GPU share may go (:mod:`gpupool.k8s.cache.sharing`: none, hami or trust).
    """

    def __init__(self, core: client.CoreV1Api | None = None, policy: str = DEFAULT_POLICY, resync: float = 10.0,
                 assume_ttl: float = 120.0, telemetry: GpuTelemetry | None = None,
                 metrics: SchedulerMetrics | None = None, clock: Callable[[], float] = time.monotonic,
                 share_enforcement: str = "none") -> None:
        make_policy(policy)  # fail early on an unknown name
        self.share_enforcement = check_mode(share_enforcement, "share_enforcement")
        self.hami: dict[str, list[RegisteredGpu]] = {}  # node -> HAMi's registration (nodes where it registered)
        self.filters: tuple[Any, ...] = ()  # the policy's filters, then the share filters
        self.core = core
        self.policy_name = policy
        self.resync = resync
        self.assume_ttl = assume_ttl
        self.telemetry = telemetry
        self.metrics = metrics
        self.clock = clock
        self.lock = threading.RLock()
        self.state: ClusterState | None = None
        self.engine: Engine | None = None
        self.info: InventoryInfo | None = None
        self.synced_at: float | None = None
        self.last_error = ""
        self.assumed: dict[str, _Assumed] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.state is not None

    @property
    def policy(self) -> Policy:
        assert self.engine is not None
        return self.engine.policy

    # ------------------------------------------------------------------ filling
    def _list(self, call: Callable, **kwargs) -> list[dict]:
        items: list[dict] = []
        token = None
        while True:
            resp = call(limit=500, _continue=token, _preload_content=False, _request_timeout=60, **kwargs)
            page = json.loads(resp.data)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return items

    def refresh(self) -> None:
        """List nodes and bound pods from the API and rebuild the state (raises on API errors)."""
        if self.core is None:
            raise RuntimeError("NodeCache has no API client to list with")
        nodes = self._list(self.core.list_node)
        pods = self._list(self.core.list_pod_for_all_namespaces,
                          field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed")
        self.load(nodes, pods)

    def load(self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]) -> None:
        """Rebuild the state from Node and Pod dicts (as the API returns them)."""
        state, info = build_state(nodes, pods)
        if info["skipped_nodes"]:
            log.warning("nodes left out of the cache", extra={"nodes": info["skipped_nodes"]})
        engine = Engine(state, make_policy(self.policy_name))
        hami = {node_name(o): r for o in nodes if isinstance(o, Mapping) and (r := hami_registered_gpus(o)) is not None}
        flags = np.array([n in hami for n in state.node_names], dtype=bool)
        filters = tuple(engine.policy.filters) + share_filters(self.share_enforcement, flags, state.node_names)
        with self.lock:
            now = self.clock()
            for key, a in list(self.assumed.items()):
                if key in info["assignments"] or now - a.since > self.assume_ttl:
                    del self.assumed[key]  # the list counts it now (or it never showed up)
                    continue
                try:
                    self._allocate(state, engine.policy, a)
                except (AllocationError, KeyError) as exc:
                    log.warning("assumed pod no longer fits", extra={"pod": key, "node": a.node, "error": str(exc)})
                    del self.assumed[key]
            if self.telemetry is not None:
                changed = self.telemetry.apply_health(state)
                if changed:
                    log.info("gpu health from telemetry", extra={"changes": changed})
            self.state, self.engine, self.info = state, engine, info
            self.hami, self.filters = hami, filters
            self.synced_at = now
            if self.metrics is not None:
                self.metrics.set_allocation(state)
                self.metrics.set_ready(True)

    @staticmethod
    def _allocate(state: ClusterState, policy: Policy, a: _Assumed) -> Assignment:
        node = state.node_index[a.node]
        assignment = state.allocate(a.request, node, a.gpus, a.gpu_milli if a.gpus else None)
        policy.on_allocate(state, assignment)
        return assignment

    # ------------------------------------------------------------------ assumed pods
    def assume(self, request: PodRequest, node: str, gpus: tuple[int, ...], gpu_milli: int) -> Assignment:
        """Reserve ``request`` on ``node`` now (raises AllocationError/KeyError if it does not fit)."""
        with self.lock:
            assert self.state is not None and self.engine is not None
            a = _Assumed(request, node, tuple(gpus), gpu_milli, self.clock())
            assignment = self._allocate(self.state, self.engine.policy, a)
            self.assumed[request.name] = a
            return assignment

    def confirm(self, key: str) -> None:
        """The binding of ``key`` went through: its reservation is kept until the list shows the pod, and no
        later filter call releases it."""
        with self.lock:
            a = self.assumed.get(key)
            if a is not None:
                self.assumed[key] = dataclasses.replace(a, bound=True)

    def forget(self, key: str, *, keep_bound: bool = False) -> None:
        """Drop a reservation made by :meth:`assume` (a bind that failed, or a pod kube-scheduler retries).
        ``keep_bound``: leave it if its binding went through (:meth:`confirm`)."""
        with self.lock:
            a = self.assumed.get(key)
            if a is None or (keep_bound and a.bound):
                return
            del self.assumed[key]
            if self.state is not None and key in self.state.assignments:
                assignment = self.state.release(key)
                self.policy.on_release(self.state, assignment)

    # ------------------------------------------------------------------ background
    def _run(self) -> None:
        while not self._stop.wait(self.resync):
            try:
                self.refresh()
                self.last_error = ""
            except Exception as exc:  # keep serving from the last good state
                self.last_error = repr(exc)
                log.warning("cache refresh failed", extra={"error": repr(exc)})

    def start(self) -> NodeCache:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="gpupool-extender-cache", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None


class Extender:
    """The three verbs over a :class:`NodeCache`; ``core`` is used by :meth:`bind` (read, annotate, bind).

    ``load_weight`` (0..1) blends GPU utilisation from ``telemetry`` into the score: a node's score becomes
    ``(1 - w) * policy score + w * idle share``, both on the 0..10 scale. ``scheduler_names``: the
    ``spec.schedulerName`` values of the pods it may bind (kube-scheduler's profiles that call it; default
    ``default-scheduler``); ``namespaces``: the namespaces it may bind in (None: all).
    """

    def __init__(self, cache: NodeCache, core: client.CoreV1Api | None = None,
                 metrics: SchedulerMetrics | None = None, telemetry: GpuTelemetry | None = None,
                 load_weight: float = 0.0, scheduler_names: Iterable[str] = (DEFAULT_SCHEDULER_NAME,),
                 namespaces: Iterable[str] | None = None) -> None:
        if not 0.0 <= load_weight <= 1.0:
            raise ValueError("load_weight must be within [0, 1]")
        self.cache = cache
        self.core = core
        self.metrics = metrics
        self.telemetry = telemetry
        self.load_weight = load_weight
        self.scheduler_names = frozenset(scheduler_names)
        if not self.scheduler_names:
            raise ValueError("scheduler_names: name at least one scheduler (kube-scheduler's profile) to bind for")
        self.namespaces = None if namespaces is None else frozenset(namespaces)
        self._in_flight: set[str] = set()  # "ns/name" of the pods being bound now
        self._in_flight_lock = threading.Lock()

    # ------------------------------------------------------------------ filter
    def filter(self, args: Mapping[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = {"Nodes": None, "NodeNames": None, "FailedNodes": {},
                                  "FailedAndUnresolvableNodes": {}, "Error": ""}
        try:
            names, node_objs = candidate_nodes(args)
        except ValueError as exc:
            result["Error"] = str(exc)
            return result
        pod = field_of(args, "Pod")
        if not isinstance(pod, Mapping):
            result["Error"] = "ExtenderArgs without a Pod"
            return result
        if not self.cache.ready:
            result["Error"] = "gpupool extender: node cache not synced yet"
            return result
        try:
            req = parse_pod(pod)
        except RequestParseError as exc:
            result["FailedAndUnresolvableNodes"] = {n: str(exc) for n in names}
            self._keep(names, set(), node_objs, result)
            self._count("unschedulable")
            return result
        with self._in_flight_lock:  # asked again: an earlier reservation whose binding is unknown did not lead
            if req.name not in self._in_flight:  # to one (never one being bound now, or bound)
                self.cache.forget(req.name, keep_bound=True)
        with self.cache.lock:
            state, policy = self.cache.state, self.cache.policy
            assert state is not None
            eff = with_share(pod, req, policy.effective(req))
            ok: set[str] = set()
            known = [(n, state.node_index[n]) for n in names if n in state.node_index]
            for n in names:
                if n not in state.node_index:
                    result["FailedNodes"][n] = "node is not in gpupool's cache yet"
            if known:
                idx = np.array([i for _, i in known], dtype=np.int64)
                remaining = np.ones(len(idx), dtype=bool)
                for f in self.cache.filters:
                    fails = remaining & ~f.mask(state, eff, idx)
                    target = ("FailedAndUnresolvableNodes" if isinstance(f, UNRESOLVABLE_FILTERS)
                              else "FailedNodes")
                    for j in np.flatnonzero(fails):
                        result[target][known[j][0]] = f.reason
                    remaining &= ~fails
                ok = {known[j][0] for j in np.flatnonzero(remaining)}
        self._keep(names, ok, node_objs, result)
        if not ok:
            self._count("unschedulable")
        return result

    @staticmethod
    def _keep(names: list[str], ok: set[str], node_objs: list[dict] | None, result: dict[str, Any]) -> None:
        if node_objs is None:
            result["NodeNames"] = [n for n in names if n in ok]
        else:
            result["Nodes"] = {"metadata": {}, "items": [o for o, n in zip(node_objs, names, strict=True) if n in ok]}

    # ------------------------------------------------------------------ prioritize
    def prioritize(self, args: Mapping[str, Any]) -> list[dict[str, Any]]:
        names, _ = candidate_nodes(args)
        scores = dict.fromkeys(names, 0)
        pod = field_of(args, "Pod")
        if not isinstance(pod, Mapping) or not self.cache.ready:
            return [{"Host": n, "Score": 0} for n in names]
        try:
            req = parse_pod(pod)
        except RequestParseError:
            return [{"Host": n, "Score": 0} for n in names]
        with self.cache.lock:
            state, policy = self.cache.state, self.cache.policy
            assert state is not None
            eff = with_share(pod, req, policy.effective(req))
            known = [(n, state.node_index[n]) for n in names if n in state.node_index]
            if known:
                idx = np.array([i for _, i in known], dtype=np.int64)
                fit = feasible(state, eff, idx, self.cache.filters)
                if fit.any():
                    cand = idx[fit]
                    norm = scale_scores(policy.score(state, eff, cand))
                    if self.telemetry is not None and self.load_weight > 0:
                        idle = (1.0 - self.telemetry.load(state)[cand]) * MAX_EXTENDER_PRIORITY
                        norm = (1 - self.load_weight) * norm + self.load_weight * idle
                    names_fit = [known[j][0] for j in np.flatnonzero(fit)]
                    for n, s in zip(names_fit, norm, strict=True):
                        scores[n] = int(round(float(s)))
        return [{"Host": n, "Score": scores[n]} for n in names]

    # ------------------------------------------------------------------ bind
    def bind(self, args: Mapping[str, Any]) -> dict[str, str]:
        """``ExtenderBindingArgs`` -> ``ExtenderBindingResult`` (``{"Error": ""}`` when bound). One bind per pod
        at a time: another bind of the same pod while this one runs is refused at once, untouched."""
        start = time.perf_counter()
        try:
            name, namespace, uid, node = binding_args(args)
        except ValueError as exc:
            self._count("error", start)
            return {"Error": str(exc)}
        key = f"{namespace}/{name}"
        if self.core is None:
            return {"Error": "gpupool extender has no API client to bind with"}
        with self._in_flight_lock:
            if key in self._in_flight:
                self._count("error", start)
                log.warning("bind refused", extra={"pod": key, "node": node,
                                                   "error": "another bind of this pod is in progress"})
                return {"Error": f"bind {key} to {node}: another bind of this pod is in progress"}
            self._in_flight.add(key)
        try:
            return self._bind(key, name, namespace, uid, node, start)
        finally:
            with self._in_flight_lock:
                self._in_flight.discard(key)

    def _bind(self, key: str, name: str, namespace: str, uid: str, node: str, start: float) -> dict[str, str]:
        assert self.core is not None
        api = self.core.api_client
        try:
            pod = read_pod(api, namespace, name)
            uid = self._admit(pod, key, uid)
            req = parse_pod(pod)
            assignment = self._reserve(req, node, pod)
        except (RequestParseError, AllocationError, LookupError) as exc:
            self._count("unschedulable", start)
            log.info("bind refused", extra={"pod": key, "node": node, "error": str(exc)})
            return {"Error": str(exc)}
        except Exception as exc:
            self._count("error", start)
            log.warning("bind failed", extra={"pod": key, "node": node, "error": _api_error(exc)})
            return {"Error": f"bind {key} to {node}: {_api_error(exc)}"}
        hami: dict[str, str] = {}
        try:  # HAMi's device plugin finds the pod it serves through its node lock: one pod per node at once
            registered = self.cache.hami.get(node) if self.cache.share_enforcement == "hami" else None
            devices = hami_devices_for(pod, assignment.gpus, registered) if registered and assignment.gpus else ""
            hami = hami_pod_annotations(node, devices, time.time()) if devices else {}
            why = take_node_lock(api, node, namespace, name, time.time()) if hami else ""
        except Exception as exc:  # ValueError: the registration does not name the devices chosen
            why = (f"not handed to HAMi's device plugin: {exc}" if isinstance(exc, ValueError)
                   else f"HAMi's node lock: {_api_error(exc)}")
        if why:
            self.cache.forget(req.name)
            self._count("error", start)
            return {"Error": f"bind {key} to {node}: {why}"}
        annotations = device_annotations(assignment)
        try:
            post_binding(api, namespace, name, uid, {**annotations, **hami}, node)
        except Exception as exc:
            status = exc.status if isinstance(exc, client.ApiException) else None
            where = self._read_back(name, namespace) if status is None or status == 409 or status >= 500 else ("", {})
            if where is None and _outcome_unknown(exc):  # no answer, no read-back: it may be bound
                self._count("error", start)
                log.warning("bind outcome unknown", extra={"pod": key, "node": node, "error": _api_error(exc),
                                                           "action": "devices kept until the pod shows up or "
                                                                     f"{self.cache.assume_ttl:.0f}s pass"})
                return {"Error": f"bind {key} to {node}: outcome unknown ({_api_error(exc)}); gpupool keeps its "
                                 "devices reserved until the API shows the pod"}
            bound_to, ann = where or ("", {})
            if bound_to != node or ann.get(ANN_GPU_INDEX) != annotations[ANN_GPU_INDEX]:
                # refused, or bound by someone else: nothing of ours is on the pod (the annotations ride on
                # the Binding), so only the reservation goes
                self.cache.forget(req.name)
                if hami:  # best effort: it expires after 5 minutes, or the next taker finds its pod unbound
                    with contextlib.suppress(Exception):
                        release_node_lock(api, node, namespace, name)
                self._count("error", start)
                log.warning("bind failed", extra={"pod": key, "node": node, "error": _api_error(exc),
                                                  **({"bound_to": bound_to} if bound_to else {})})
                return {"Error": f"bind {key} to {node}: {_api_error(exc)}"}
            log.info("bind answered late", extra={"pod": key, "node": node, "error": _api_error(exc),
                                                  "note": "read back: bound there with these devices"})
        self.cache.confirm(req.name)
        self._count("scheduled", start)
        if self.metrics is not None and self.cache.state is not None:
            with self.cache.lock:
                self.metrics.set_allocation(self.cache.state)
        log.info("bound", extra={"pod": key, "node": node, "gpus": list(assignment.gpus),
                                 "gpu_milli": assignment.gpu_milli})
        return {"Error": ""}

    def _admit(self, pod: Mapping[str, Any], key: str, uid: str) -> str:
        """The pod's UID if this extender may bind it now; LookupError naming the field otherwise."""
        meta = pod.get("metadata") if isinstance(pod.get("metadata"), Mapping) else {}
        spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
        pod_uid = str(meta.get("uid") or "")
        if uid and pod_uid and uid != pod_uid:
            raise LookupError(f"pod {key}: metadata.uid is {pod_uid}, not the PodUID {uid} asked to bind "
                              "(the pod was replaced)")
        scheduler = str(spec.get("schedulerName") or DEFAULT_SCHEDULER_NAME)
        if scheduler not in self.scheduler_names:
            raise LookupError(f"pod {key}: spec.schedulerName {scheduler!r} is not served by this extender "
                              f"(it binds for {', '.join(sorted(self.scheduler_names))})")
        if self.namespaces is not None and str(meta.get("namespace") or "default") not in self.namespaces:
            raise LookupError(f"pod {key}: namespace not one this extender may bind in "
                              f"({', '.join(sorted(self.namespaces))})")
        if meta.get("deletionTimestamp"):
            raise LookupError(f"pod {key} is being deleted (metadata.deletionTimestamp set)")
        if spec.get("nodeName"):
            raise LookupError(f"pod {key} is already bound to {spec['nodeName']} (spec.nodeName)")
        return pod_uid or uid

    def _reserve(self, req: PodRequest, node: str, pod: Mapping[str, Any] | None = None) -> Assignment:
        # The API shows the pod unbound (``_admit``): a reservation still held for it (an earlier bind whose
        # outcome was unknown) did not lead to a binding.
        self.cache.forget(req.name)
        with self.cache.lock:
            state, policy = self.cache.state, self.cache.policy
            if state is None:
                raise LookupError("node cache not synced yet")
            if node not in state.node_index:
                raise LookupError(f"node {node} is not in gpupool's cache")
            i = state.node_index[node]
            eff: EffectiveRequest = policy.effective(req)
            if pod is not None:
                eff = with_share(pod, req, eff)
            idx = np.array([i])
            for f in self.cache.filters:
                if not f.mask(state, eff, idx)[0]:
                    raise AllocationError(f"node {node} cannot take pod {req.name} now: {f.reason}")
            gpus = policy.select_gpus(state, eff, i)
            return self.cache.assume(req, node, gpus, eff.gpu_milli if req.num_gpu else 0)

    def _read_back(self, name: str, namespace: str) -> tuple[str, dict[str, str]] | None:
        """(the node the pod is bound to now, "" if unbound or gone; its annotations), read back after a binding
        that was refused or not answered; None when the read-back fails too (the outcome stays unknown)."""
        assert self.core is not None
        try:
            pod = read_pod(self.core.api_client, namespace, name)
        except client.ApiException as exc:
            return ("", {}) if exc.status == 404 else None
        except Exception:  # noqa: BLE001 - transport trouble: unknown
            return None
        meta = pod.get("metadata") if isinstance(pod, Mapping) else None
        spec = pod.get("spec") if isinstance(pod, Mapping) else None
        bound_to = spec.get("nodeName") if isinstance(spec, Mapping) else None
        ann = meta.get("annotations") if isinstance(meta, Mapping) else None
        return str(bound_to or ""), dict(ann) if isinstance(ann, Mapping) else {}

    # ------------------------------------------------------------------ helpers
    def _count(self, result: str, start: float | None = None) -> None:
        if self.metrics is not None:
            self.metrics.observe_attempt(result, None if start is None else time.perf_counter() - start)


def _outcome_unknown(exc: Exception) -> bool:
    """A binding that failed this way may still have gone through: no HTTP answer, or a 5xx (a timeout after
    etcd took it). A 4xx is a refusal."""
    if isinstance(exc, client.ApiException):
        return exc.status is None or exc.status >= 500
    return True


def _api_error(exc: Exception) -> str:
    if isinstance(exc, client.ApiException):
        try:
            return json.loads(exc.body).get("message") or f"{exc.status} {exc.reason}"
        except (TypeError, ValueError, AttributeError):
            return f"{exc.status} {exc.reason}"
    return repr(exc)


__all__ = ["DEFAULT_SCHEDULER_NAME", "MAX_EXTENDER_PRIORITY", "Extender", "NodeCache", "device_annotations",
           "field_of"]
