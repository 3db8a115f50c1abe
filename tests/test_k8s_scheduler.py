"""The live scheduler against a Kubernetes API mock server over real HTTP, with the official client.

The server is kmock's ``KubernetesEmulator`` (aiohttp, real sockets, the API's JSON and watch-stream wire
format), extended here with what a scheduler depends on and the emulator leaves out:

* ``resourceVersion`` on every change, LIST answering with the current one, WATCH resuming from a given
  one (replaying only the later events), ``410 Gone`` for a compacted one, and a BOOKMARK after catch-up;
* the ``pods/binding`` subresource with kube-apiserver's rules (``BindingREST.Create`` / ``assignPod``):
  400 when the URL's name differs from the Binding's, 404 for a missing pod, 409 for a UID or
  resourceVersion precondition that fails, a pod already bound, being deleted or gated; on success, in
  ONE update: ``spec.nodeName``, the Binding's annotations (and labels) merged over the pod's, PodScheduled=True,
  and a ``201`` with a ``Status`` body;
* ``generateName`` for Events;
* pod deletion as kube-apiserver's pod strategy does it (``CheckGracefulDelete``): a pod bound to a node with a
  grace period > 0 (``gracePeriodSeconds``, else ``terminationGracePeriodSeconds``, default 30) stays, Terminating
  (``deletionTimestamp`` = now + grace, ``deletionGracePeriodSeconds``), until a kubelet (:meth:`ApiServer.
  finish_termination`) or a grace-0 delete removes it; an unbound or finished pod goes at once; UID and
  resourceVersion preconditions (409), ``dryRun``;
* the ``pods/eviction`` subresource (policy/v1 Eviction) as ``registry/core/pod/storage/eviction.go`` (v1.36):
  PodDisruptionBudgets (``policy/v1``, stored and served; a create resets status and sets ``generation``, a spec
  change bumps it) matching the pod's labels; ``429`` when the budget is not yet processed
  (``observedGeneration < generation``) or allows no disruption, ``500`` for several budgets, ``403`` for a
  negative budget; Pending / finished / Terminating pods skip the budgets; unready pods do not consume it when
  the budget is healthy (or ``unhealthyPodEvictionPolicy: AlwaysAllow``); a real eviction decrements
  ``disruptionsAllowed``, records ``status.disruptedPods``, sets ``DisruptionTarget`` (``EvictionByEvictionAPI``)
  and deletes the pod as a DELETE does; ``dryRun`` changes nothing;
* strategic-merge patches of ``status.conditions`` merge by ``type`` (kmock replaces lists);
* fault hooks: run something just before a binding is served (bind the pod elsewhere, delete it),
  end every open watch, compact the history;
* a count of the TCP connections the server accepted (``Harness.connections``), to check that the client
  reuses its connections.

The emulator runs on its own event loop thread; the scheduler's threads use the official ``kubernetes``
client against it exactly as against a real API server.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import datetime
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest
from kubernetes import client

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE, wire
from gpupool.k8s.scheduler import Scheduler, SchedulerConfig, _Assumed, assignment_annotations
from gpupool.k8s.snapshot import Placement

NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}
PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")
EVENTS = kmock.resource("", "v1", "events")
PDBS = kmock.resource("policy", "v1", "poddisruptionbudgets")
PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
MAX_DISRUPTED_PODS = 2000
PODGROUPS = kmock.resource("scheduling.x-k8s.io", "v1alpha1", "podgroups")
QUEUES = kmock.resource("gpupool.io", "v1alpha1", "queues")


class _EventLog:
    """Stands in for kmock's per-resource bus: stamps each event (and the stored object) with the next
    resourceVersion and keeps the event for watches that resume from an older one."""

    def __init__(self, server: ApiServer, resource) -> None:
        self.server = server
        self.resource = resource
        self.events: list[tuple[int, dict[str, Any]]] = []

    async def put(self, *events: dict[str, Any]) -> None:
        for event in events:
            self.server.rv += 1
            rv = str(self.server.rv)
            obj = copy.deepcopy(dict(event["object"]))
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = rv
            self.events.append((self.server.rv, {"type": event["type"], "object": obj}))
            key = (self.resource, meta.get("namespace"), meta.get("name"))
            if event["type"] != "DELETED" and key in self.server._objects and not self.server._objects[key].deleted:
                self.server._objects[key].patch({"metadata": {"resourceVersion": rv}})
        async with self.server.cond:
            self.server.cond.notify_all()


class _EventLogs(dict):
    def __init__(self, server: ApiServer) -> None:
        super().__init__()
        self.server = server

    def __missing__(self, resource) -> _EventLog:
        log = self[resource] = _EventLog(self.server, resource)
        return log


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    rv: int = 0
    compacted: int = 0
    epoch: int = 0
    cond: asyncio.Condition = attrs.field(factory=asyncio.Condition)
    before_bind: dict[str, Callable[..., Any]] = attrs.field(factory=dict)
    on_every_bind: Callable[..., Any] | None = None  # awaited before every binding is served
    binds: list[tuple[str, str, str]] = attrs.field(factory=list)
    # every binding request: (ns, name, target, annotations, HTTP status)
    bind_attempts: list[tuple[str, str, str, dict[str, str], int]] = attrs.field(factory=list)
    watches: int = 0
    # every PATCH / PUT: (plural, ns, name, subresource, body as sent)
    updates: list[tuple[str, str | None, str, str | None, dict[str, Any]]] = attrs.field(factory=list)
    on_evict: Callable[..., Any] | None = None  # awaited before every eviction is served (may raise an API error)
    # every eviction request: (ns, name, dry run, HTTP status)
    evictions: list[tuple[str, str, bool, int]] = attrs.field(factory=list)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._buses = _EventLogs(self)
        self["post", PODS, kmock.subresource("binding")] << self._serve_binding
        self["post", PODS, kmock.subresource("eviction")] << self._serve_eviction
        self["put"] << self._serve_replace

    # -- generateName, as the API server does it
    async def _handle(self, request):  # type: ignore[override]
        if request.action == kmock.action.DELETE and request.resource == PODS and request.name \
                and not request.subresource:
            try:  # kmock would remove the pod at once; the API server deletes a bound pod gracefully
                return aiohttp.web.json_response(await self._serve_pod_delete(request), status=200)
            except kmock.KubernetesError as exc:
                return await self._render_error(exc)
        if request.action == kmock.action.UPDATE and isinstance(request.data, dict):
            self.updates.append((request.resource.plural, request.namespace, request.name, request.subresource,
                                 copy.deepcopy(request.data)))
            await self._prepare_update(request)
        if request.action == kmock.action.CREATE and isinstance(request.data, dict) and request.resource == PDBS:
            request.data.pop("status", None)  # PodDisruptionBudget PrepareForCreate: status reset, generation 1
            request.data.setdefault("metadata", {})["generation"] = 1
        if request.action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
            meta.setdefault("uid", str(uuid.uuid4()))
            if request.resource == PODS:  # the API server's create starts a pod Pending (tests may preset a phase)
                status = request.data.get("status")
                if not isinstance(status, dict):
                    status = request.data["status"] = {}
                status.setdefault("phase", "Pending")
            if request.resource == NODES:
                # as a real v1.36 server does (tests/e2e/README.md): a create ignores status (only nodes/status
                # sets it), and the TaintNodesByCondition admission plugin makes every new Node not-ready
                request.data.pop("status", None)
                spec = request.data.setdefault("spec", {}) or {}
                request.data["spec"] = spec
                taints = [t for t in (spec.get("taints") or []) if t.get("key") != NOT_READY_TAINT["key"]]
                spec["taints"] = taints + [dict(NOT_READY_TAINT)]
        return await super()._handle(request)

    def _current(self, resource, namespace: str | None) -> list[dict[str, Any]]:
        return [copy.deepcopy(obj.raw) for (res, ns, _), obj in self._objects.items()
                if res == resource and not obj.deleted and (namespace is None or ns == namespace)]

    async def _serve_list(self, request):  # type: ignore[override]
        result = await super()._serve_list(request)
        result["metadata"] = {"resourceVersion": str(self.rv)}
        return result

    async def _serve_watch(self, request):  # type: ignore[override]
        yield b""
        self.watches += 1
        resource, namespace = request.resource, request.namespace
        log = self._buses[resource]
        rv = request.params.get("resourceVersion")
        epoch = self.epoch
        if rv and rv != "0":
            pos = int(rv)
            if pos < self.compacted:
                yield {"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 410,
                    "reason": "Expired", "message": f"too old resource version: {pos} ({self.compacted})"}}
                return
        else:
            async with self._lock:
                objs = self._current(resource, namespace)
                pos = self.rv
            for obj in objs:
                yield {"type": "ADDED", "object": obj}
        bookmark = request.params.get("allowWatchBookmarks") == "true"
        while True:
            for r, event in [(r, e) for r, e in log.events if r > pos]:
                pos = r
                if namespace is None or event["object"].get("metadata", {}).get("namespace") == namespace:
                    yield event
            if bookmark:
                bookmark = False
                yield {"type": "BOOKMARK", "object": {"kind": "Pod", "apiVersion": "v1",
                                                      "metadata": {"resourceVersion": str(max(pos, self.rv))}}}
            async with self.cond:
                if self.epoch != epoch:
                    return
                if not any(r > pos for r, _ in log.events):
                    await self.cond.wait()
            if self.epoch != epoch:
                return

    # -- PUT (replace) with optimistic concurrency, as the Lease elector uses it
    async def _serve_replace(self, request):
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound", message=f"{request.name} not found")
            obj = self._objects[key]
            have = str((obj.raw.get("metadata") or {}).get("resourceVersion") or "")
            want = str(((request.data or {}).get("metadata") or {}).get("resourceVersion") or "")
            if want and want != have:
                raise kmock.KubernetesError(status=409, reason="Conflict",
                                            message="the object has been modified; please apply your changes")
            obj.patch({**request.data, "spec": None})
            obj.patch({"spec": request.data.get("spec")})
            await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
            return obj.raw

    # -- pods/binding, as kube-apiserver's BindingREST.Create -> assignPod -> setPodNodeAndMetadata
    async def _serve_binding(self, request):
        ns, name = request.namespace, request.name
        body = request.data or {}
        meta = body.get("metadata") or {}
        annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
        target = (body.get("target") or {}).get("name")
        if self.on_every_bind is not None:
            await self.on_every_bind(self, ns, name, body)
        hook = self.before_bind.pop(name, None)
        if hook is not None:
            await hook(self, ns, name, body)
        status = 500
        try:
            if meta.get("name") != name:
                status = 400
                raise kmock.KubernetesError(status=400, reason="BadRequest",
                                            message="name in URL does not match name in Binding object")
            if not target:
                status = 422
                raise kmock.KubernetesError(status=422, reason="Invalid", message="target.name: Required value")
            async with self._lock:  # one atomic update, as GuaranteedUpdate
                key = (PODS, ns, name)
                if key not in self._objects or self._objects[key].deleted:
                    status = 404
                    raise kmock.KubernetesError(status=404, reason="NotFound", message=f'pods "{name}" not found')
                pod = self._objects[key].raw
                pmeta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
                problem = None
                if meta.get("uid") and meta["uid"] != pmeta.get("uid"):
                    problem = (f"Precondition failed: UID in precondition: {meta['uid']}, UID in object meta: "
                               f"{pmeta.get('uid')}")
                elif meta.get("resourceVersion") and meta["resourceVersion"] != pmeta.get("resourceVersion"):
                    problem = "the object has been modified; please apply your changes to the latest version"
                elif pmeta.get("deletionTimestamp"):
                    problem = f"pod {name} is being deleted, cannot be assigned to a host"
                elif spec.get("nodeName"):
                    problem = f'pod {name} is already assigned to node "{spec["nodeName"]}"'
                elif spec.get("schedulingGates"):
                    problem = f"pod {name} has non-empty .spec.schedulingGates"
                if problem:
                    status = 409
                    raise kmock.KubernetesError(
                        status=409, reason="Conflict",
                        message=f'Operation cannot be fulfilled on pods/binding "{name}": {problem}')
                await self._set_node(ns, name, target, annotations, meta.get("labels") or {})
                self.binds.append((ns, name, target))
                status = 201
        finally:
            self.bind_attempts.append((ns, name, target, annotations, status))
        return kmock.Response(status=201, payload={"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                   "status": "Success", "code": 201})

    async def _set_node(self, ns: str, name: str, node: str, annotations: dict[str, str] | None = None,
                        labels: dict[str, str] | None = None) -> None:
        """spec.nodeName, the annotations (and labels) merged over the pod's (a key set to a value, none removed),
        PodScheduled=True; one new version, one MODIFIED event."""
        obj = self._objects[PODS, ns, name]
        conditions = [c for c in (obj.raw.get("status") or {}).get("conditions") or []
                      if c.get("type") != "PodScheduled"]
        conditions.append({"type": "PodScheduled", "status": "True"})
        obj.patch({"spec": {"nodeName": node}, "metadata": {"annotations": dict(annotations or {}),
                                                            "labels": dict(labels or {})},
                   "status": {"conditions": conditions}})
        await self._buses[PODS].put({"type": "MODIFIED", "object": obj.raw})

    # -- PATCH / PUT: what kmock's plain dict merge leaves out
    async def _prepare_update(self, request) -> None:
        """Strategic merge of ``status.conditions`` by ``type`` (pods); PodDisruptionBudget: the main resource keeps
        its status and a spec change bumps ``generation``, the status subresource changes only the status."""
        async with self._lock:
            key = (request.resource, request.namespace, request.name)
            obj = self._objects[key].raw if key in self._objects and not self._objects[key].deleted else None
        if obj is None:
            return
        data = request.data
        ctype = str(request.headers.get("Content-Type", ""))
        status = data.get("status")
        if "strategic-merge-patch" in ctype and isinstance(status, dict) and isinstance(status.get("conditions"), list):
            merged = [dict(c) for c in (obj.get("status") or {}).get("conditions") or []]
            for cond in status["conditions"]:
                at = next((i for i, c in enumerate(merged) if c.get("type") == cond.get("type")), None)
                if at is None:
                    merged.append(dict(cond))
                else:
                    merged[at] = {**merged[at], **cond}
            status["conditions"] = [{k: v for k, v in c.items() if v is not None} for c in merged]
        if request.resource == PDBS:
            if request.subresource == "status":
                for k in [k for k in data if k not in ("status", "metadata", "apiVersion", "kind")]:
                    del data[k]
                if isinstance(data.get("metadata"), dict):
                    data["metadata"] = {k: v for k, v in data["metadata"].items() if k == "resourceVersion"}
            else:
                data.pop("status", None)
                if "spec" in data and data["spec"] != obj.get("spec"):
                    meta = data.setdefault("metadata", {})
                    meta["generation"] = int((obj.get("metadata") or {}).get("generation") or 1) + 1

    # -- pod deletion, as kube-apiserver's pod strategy and generic registry do it
    @staticmethod
    def _delete_options(request, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """DeleteOptions from the body (a DeleteOptions, or an Eviction's ``deleteOptions``) and the query."""
        opts = dict(body if body is not None else (request.data if isinstance(request.data, dict) else {}) or {})
        if "gracePeriodSeconds" in request.params and opts.get("gracePeriodSeconds") is None:
            opts["gracePeriodSeconds"] = int(request.params["gracePeriodSeconds"])
        if "dryRun" in request.params and not opts.get("dryRun"):
            opts["dryRun"] = [request.params["dryRun"]]
        return opts

    async def _serve_pod_delete(self, request) -> dict[str, Any]:
        async with self._lock:
            return await self._delete_pod(request.namespace, request.name, self._delete_options(request))

    def _check_preconditions(self, pod: dict[str, Any], opts: dict[str, Any]) -> None:
        """rest.BeforeDelete's precondition check: 409 when the UID or resourceVersion differs."""
        pre = opts.get("preconditions") or {}
        meta = pod.get("metadata") or {}
        name = meta.get("name")
        if pre.get("uid") and pre["uid"] != meta.get("uid"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                f'Operation cannot be fulfilled on Pod "{name}": the UID in the precondition ({pre["uid"]}) does not '
                f"match the UID in record ({meta.get('uid')}). The object might have been deleted and then recreated"))
        if pre.get("resourceVersion") and pre["resourceVersion"] != meta.get("resourceVersion"):
            raise kmock.KubernetesError(status=409, reason="Conflict", message=(
                f'Operation cannot be fulfilled on Pod "{name}": the ResourceVersion in the precondition '
                f"({pre['resourceVersion']}) does not match the ResourceVersion in record "
                f"({meta.get('resourceVersion')}). The object might have been modified"))

    def _pod(self, ns: str, name: str) -> Any:
        key = (PODS, ns, name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=f'pods "{name}" not found')
        return self._objects[key]

    async def _delete_pod(self, ns: str, name: str, opts: dict[str, Any]) -> dict[str, Any]:
        """DELETE of a pod (caller holds ``self._lock``); returns the pod as the API answers it.

        Grace (``podStrategy.CheckGracefulDelete``): ``gracePeriodSeconds``, else the pod's
        ``terminationGracePeriodSeconds``, else 30 (the API's default); 0 for a pod not bound to a node or in a
        terminal phase; a negative one is 1. Grace 0 removes the pod (DELETED); otherwise it stays with
        ``deletionTimestamp`` / ``deletionGracePeriodSeconds`` (MODIFIED) until the kubelet (here:
        :meth:`finish_termination`) or a grace-0 delete removes it. A pod already Terminating only takes a shorter
        grace period. ``dryRun``: checks only.
        """
        obj = self._pod(ns, name)
        pod = obj.raw
        self._check_preconditions(pod, opts)
        spec, meta = pod.get("spec") or {}, pod.get("metadata") or {}
        grace = opts.get("gracePeriodSeconds")
        if grace is None:
            grace = spec.get("terminationGracePeriodSeconds", 30)
        grace = int(grace)
        if not spec.get("nodeName") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            grace = 0
        grace = 1 if grace < 0 else grace
        if opts.get("dryRun"):
            return copy.deepcopy(pod)
        if meta.get("deletionTimestamp") and grace > 0 and grace >= int(meta.get("deletionGracePeriodSeconds") or 0):
            return copy.deepcopy(pod)  # already Terminating: only a shorter grace period changes it
        if grace == 0 and not meta.get("finalizers"):
            raw = copy.deepcopy(pod)
            obj.delete()
            await self._buses[PODS].put({"type": "DELETED", "object": raw})
            return raw
        at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=grace)
        obj.patch({"metadata": {"deletionTimestamp": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                                "deletionGracePeriodSeconds": grace}})
        await self._buses[PODS].put({"type": "MODIFIED", "object": obj.raw})
        return copy.deepcopy(obj.raw)

    async def finish_termination(self, ns: str, name: str) -> None:
        """What the kubelet does once a Terminating pod's containers stopped: delete it with grace 0."""
        async with self._lock:
            await self._delete_pod(ns, name, {"gracePeriodSeconds": 0})

    # -- pods/eviction, as registry/core/pod/storage/eviction.go (EvictionREST.Create, checkAndDecrement)
    @staticmethod
    def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
        """metav1.LabelSelectorAsSelector(...).Matches; a nil or empty selector matches nothing (PDB rule)."""
        selector = selector or {}
        match, exprs = selector.get("matchLabels") or {}, selector.get("matchExpressions") or []
        if not match and not exprs:
            return False
        if any(labels.get(k) != v for k, v in match.items()):
            return False
        for e in exprs:
            key, op, values = e.get("key"), e.get("operator"), e.get("values") or []
            if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and labels.get(key) in values) \
                    or (op == "Exists" and key not in labels) or (op == "DoesNotExist" and key in labels):
                return False
        return True

    async def _serve_eviction(self, request):
        ns, name = request.namespace, request.name
        body = request.data if isinstance(request.data, dict) else {}
        opts = self._delete_options(request, dict(body.get("deleteOptions") or {}))
        dry = bool(opts.get("dryRun"))
        status = 500
        try:
            if self.on_evict is not None:
                await self.on_evict(self, ns, name, dry)
            if (body.get("metadata") or {}).get("name") != name:
                status = 400
                raise kmock.KubernetesError(status=400, reason="BadRequest",
                                            message="name in URL does not match name in Eviction object")
            async with self._lock:
                status = await self._evict(ns, name, opts, dry)
        except kmock.KubernetesError as exc:
            status = exc.status
            raise
        finally:
            self.evictions.append((ns, name, dry, status))
        if status == 500:
            return kmock.Response(status=500, payload={
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "code": 500,
                "message": "This pod has more than one PodDisruptionBudget, which the eviction subresource does not "
                           "support."})
        return kmock.Response(status=201, payload={"kind": "Status", "apiVersion": "v1", "metadata": {},
                                                   "status": "Success", "code": 201})

    async def _evict(self, ns: str, name: str, opts: dict[str, Any], dry: bool) -> int:
        """One eviction (caller holds ``self._lock``); returns 201, or 500 for several budgets; raises the rest."""
        pod = self._pod(ns, name).raw
        meta, st = pod.get("metadata") or {}, pod.get("status") or {}
        if st.get("phase") in ("Succeeded", "Failed", "Pending") or meta.get("deletionTimestamp"):  # canIgnorePDB
            await self._condition_and_delete(ns, name, opts, dry)
            return 201
        labels = meta.get("labels") or {}
        pdbs = [o for (res, pns, _), o in self._objects.items() if res == PDBS and pns == ns and not o.deleted
                and self._selects((o.raw.get("spec") or {}).get("selector"), labels)]
        if len(pdbs) > 1:
            return 500
        if pdbs:
            pdb = pdbs[0]
            spec, pst = pdb.raw.get("spec") or {}, dict(pdb.raw.get("status") or {})
            pname = pdb.raw["metadata"]["name"]
            ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in st.get("conditions") or [])
            healthy_enough = (spec.get("unhealthyPodEvictionPolicy") == "AlwaysAllow"
                              or (pst.get("currentHealthy", 0) >= pst.get("desiredHealthy", 0) > 0))
            if not (not ready and healthy_enough):
                await self._check_and_decrement(pdb, pname, name, dry)
        await self._condition_and_delete(ns, name, opts, dry)
        return 201

    async def _check_and_decrement(self, pdb: Any, pname: str, pod_name: str, dry: bool) -> None:
        pst = dict(pdb.raw.get("status") or {})
        if int(pst.get("observedGeneration") or 0) < int((pdb.raw.get("metadata") or {}).get("generation") or 0):
            raise kmock.KubernetesError(status=429, reason="TooManyRequests", message=PDB_MESSAGE, details={
                "causes": [{"reason": "DisruptionBudget",
                            "message": f"The disruption budget {pname} is still being processed by the server."}],
                "retryAfterSeconds": 10})
        allowed = int(pst.get("disruptionsAllowed") or 0)
        forbidden = ("pdb disruptions allowed is negative" if allowed < 0 else
                     "DisruptedPods map too big - too many evictions not confirmed by PDB controller"
                     if len(pst.get("disruptedPods") or {}) > MAX_DISRUPTED_PODS else None)
        if forbidden:
            raise kmock.KubernetesError(status=403, reason="Forbidden", message=(
                f'poddisruptionbudgets.policy "{pname}" is forbidden: {forbidden}'))
        if allowed == 0:
            raise kmock.KubernetesError(status=429, reason="TooManyRequests", message=PDB_MESSAGE, details={
                "causes": [{"reason": "DisruptionBudget", "message": (
                    f"The disruption budget {pname} needs {int(pst.get('desiredHealthy') or 0)} healthy pods and "
                    f"has {int(pst.get('currentHealthy') or 0)} currently")}]})
        if dry:
            return
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        change: dict[str, Any] = {"disruptionsAllowed": allowed - 1,
                                  "disruptedPods": {**(pst.get("disruptedPods") or {}), pod_name: now}}
        if allowed - 1 == 0:  # pdbhelper.UpdateDisruptionAllowedCondition
            conds = [c for c in pst.get("conditions") or [] if c.get("type") != "DisruptionAllowed"]
            change["conditions"] = conds + [{"type": "DisruptionAllowed", "status": "False",
                                             "reason": "InsufficientPods", "message": "",
                                             "observedGeneration": pst.get("observedGeneration"),
                                             "lastTransitionTime": now}]
        pdb.patch({"status": change})
        await self._buses[PDBS].put({"type": "MODIFIED", "object": pdb.raw})

    async def _condition_and_delete(self, ns: str, name: str, opts: dict[str, Any], dry: bool) -> None:
        """addConditionAndDeletePod: unless a dry run, DisruptionTarget=True (EvictionByEvictionAPI) in one update
        (the UID precondition checked first), then the delete."""
        obj = self._pod(ns, name)
        if not dry:
            self._check_preconditions(obj.raw, opts)
            conds = [dict(c) for c in (obj.raw.get("status") or {}).get("conditions") or []]
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            new = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                   "message": "Eviction API: evicting", "lastTransitionTime": now}
            old = next((c for c in conds if c.get("type") == "DisruptionTarget"), None)
            if old is None:
                conds.append(new)
            else:
                if old.get("status") == "True":
                    new["lastTransitionTime"] = old.get("lastTransitionTime") or now
                conds[conds.index(old)] = new
            obj.patch({"status": {"conditions": conds}})
            await self._buses[PODS].put({"type": "MODIFIED", "object": obj.raw})
            # the update made a new resourceVersion; the API server moves an RV precondition on to it
            opts = {**opts, "preconditions": {k: v for k, v in (opts.get("preconditions") or {}).items()
                                              if k != "resourceVersion"}}
        await self._delete_pod(ns, name, opts)

    # -- fault injection (called in the server's loop)
    async def bind_elsewhere(self, ns: str, name: str, node: str) -> None:
        async with self._lock:
            await self._set_node(ns, name, node)

    async def delete_pod(self, ns: str, name: str) -> None:
        async with self._lock:
            obj = self._objects[PODS, ns, name]
            raw = obj.raw
            obj.delete()
            await self._buses[PODS].put({"type": "DELETED", "object": raw})

    async def drop_watches(self) -> None:
        async with self.cond:
            self.epoch += 1
            self.cond.notify_all()

    # -- long tests (called in the server's loop)
    def trim_requests(self, upto: Any) -> None:
        """Forget kmock's request history up to and including request ``upto`` (one of ``self._requests``, by
        identity). kmock routes each request by scanning the whole history for it, so a test that makes thousands
        of requests slows down quadratically. Pass a request that arrived a while ago (every request is routed
        within moments of arriving; one not yet routed must stay). For tests that do not read the history."""
        at = next((i for i, r in enumerate(self._requests) if r is upto), None)
        if at is None:
            return
        del self._requests[:at + 1]
        kept = {id(r) for r in self._requests}
        for payload in self._payloads:
            log = getattr(payload, "_requests", None)
            if log is not None:
                log[:] = [r for r in log if id(r) in kept]


class Harness:
    """The API server on a background event loop, and helpers to talk to it from the test's thread."""

    def __init__(self) -> None:
        self.connections = 0  # TCP connections the server accepted
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        assert self._ready.wait(10), "mock API server did not start"
        cfg = client.Configuration()
        cfg.host = str(self.srv.url).rstrip("/")
        wire.configure(cfg, SchedulerConfig().bind_workers)  # as scheduler_cli does
        self.url = cfg.host
        self.api = client.ApiClient(cfg)
        self.v1 = client.CoreV1Api(self.api)
        self.schedulers: list[Scheduler] = []

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        async with ApiServer() as server, kmock.Server(server) as srv:
            self.server, self.srv = server, srv
            server.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
            server.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
            server.resources[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True)
            server.resources[PDBS] = kmock.ResourceInfo(kind="PodDisruptionBudget", namespaced=True)
            web = srv._managed_server.runner.server  # aiohttp's low-level Server: one call per TCP connection
            made = web.connection_made

            def count_connection(handler, transport):
                self.connections += 1
                return made(handler, transport)

            web.connection_made = count_connection
            self._ready.set()
            await self._stop.wait()
            await server.drop_watches()

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (sync, or returning an awaitable) in the server's loop and return its result."""
        async def wrapper():
            result = fn()
            if asyncio.iscoroutine(result):
                result = await result
            return result
        return asyncio.run_coroutine_threadsafe(wrapper(), self.loop).result(10)

    def close(self) -> None:
        for s in self.schedulers:
            s.stop()
        self.api.close()
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    # -- objects
    def declare(self, resource) -> None:
        self.call(lambda: self.server.resources.__setitem__(resource, kmock.ResourceInfo(namespaced=True)))

    def put_silently(self, resource, ns: str | None, obj: dict[str, Any]) -> None:
        """Store an object without any watch event (as if the event was lost to compaction)."""
        def do():
            self.server.objects[resource, ns, obj["metadata"]["name"]] = copy.deepcopy(obj)
        self.call(do)

    def objects(self, resource) -> list[dict[str, Any]]:
        return self.call(lambda: self.server._current(resource, None))

    def pod(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        return next((p for p in self.objects(PODS) if p["metadata"]["name"] == name
                     and p["metadata"].get("namespace") == ns), None)

    def events_for(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.objects(EVENTS) if e.get("involvedObject", {}).get("name") == name]

    def create_node(self, node: dict[str, Any], ready: bool = True) -> None:
        """Create a Node; ``ready``: then lift the not-ready taint the API server adds, as the node lifecycle
        controller does once the node reports Ready (no controller runs here, nor on the e2e control plane)."""
        wire.drain(self.v1.create_node(node, _preload_content=False))
        if node.get("status"):  # what the kubelet and the device plugin report, through the status subresource
            wire.drain(self.v1.patch_node_status(node["metadata"]["name"], {"status": node["status"]},
                                                 _content_type="application/merge-patch+json",
                                                 _preload_content=False))
        if ready:
            taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != NOT_READY_TAINT["key"]]
            wire.drain(self.v1.patch_node(node["metadata"]["name"], {"spec": {"taints": taints or None}},
                                          _content_type="application/merge-patch+json", _preload_content=False))

    def create_pod(self, pod: dict[str, Any]) -> None:
        wire.drain(self.v1.create_namespaced_pod(pod["metadata"].get("namespace", "default"), pod,
                                                 _preload_content=False))

    def pdb(self, name: str, ns: str = "default") -> dict[str, Any] | None:
        return next((p for p in self.objects(PDBS) if p["metadata"]["name"] == name
                     and p["metadata"].get("namespace") == ns), None)

    def create_pdb(self, name: str, match_labels: dict[str, str], ns: str = "default", allowed: int | None = None,
                   healthy: tuple[int, int] = (0, 0), **spec: Any) -> None:
        """Create a policy/v1 PodDisruptionBudget; ``allowed``: then write its status as the disruption controller
        would (observedGeneration, disruptionsAllowed, ``healthy`` = (current, desired))."""
        body = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
                "spec": {"selector": {"matchLabels": match_labels}, **spec}}
        wire.drain(client.PolicyV1Api(self.api).create_namespaced_pod_disruption_budget(ns, body,
                                                                                          _preload_content=False))
        if allowed is not None:
            self.set_pdb_status(name, allowed, ns, healthy)

    def set_pdb_status(self, name: str, allowed: int, ns: str = "default", healthy: tuple[int, int] = (0, 0)) -> None:
        gen = (self.pdb(name, ns) or {}).get("metadata", {}).get("generation", 1)
        status = {"observedGeneration": gen, "disruptionsAllowed": allowed, "currentHealthy": healthy[0],
                  "desiredHealthy": healthy[1], "expectedPods": healthy[0]}
        wire.drain(client.PolicyV1Api(self.api).patch_namespaced_pod_disruption_budget_status(
            name, ns, {"status": status}, _content_type="application/merge-patch+json", _preload_content=False))

    def scheduler(self, leader: Callable[[], bool] | None = None, identity: str = "gpupool-0",
                  **config: Any) -> Scheduler:
        # The tests here use fractional pods as their vehicle: "trust" vouches that something on the nodes enforces
        # shares (tests/test_k8s_share_enforcement.py sets the other modes itself).
        config.setdefault("share_enforcement", "trust")
        cfg = SchedulerConfig(identity=identity, batch_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.3,
                              optional_retry_s=0.5, resync_s=0.5, watch_timeout_s=30, **config)
        s = Scheduler(self.api, cfg, leader=leader)
        self.schedulers.append(s)
        s.start()
        return s


@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


# A wait ends as soon as its condition holds; ``timeout`` is only a ceiling for a condition that never comes, so it
# is generous: GPUPOOL_TEST_WAIT_SCALE (default 6) times the figure the test names, which a quiet machine meets with
# room to spare. A loaded machine (two test suites on two cores) then takes longer, never fails for it.
WAIT_SCALE = float(os.environ.get("GPUPOOL_TEST_WAIT_SCALE", "6"))


def wait_for(cond: Callable[[], Any], timeout: float = 8.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it is truthy and return its value; AssertionError after ``timeout`` x WAIT_SCALE s."""
    deadline = time.monotonic() + timeout * WAIT_SCALE
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------ builders
_uids = itertools.count()


def gpu_node(name: str, gpus: int = 2, product: str = "NVIDIA-H100-80GB-HBM3", **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **labels}},
            "spec": {},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus), "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def gpu_pod(name: str, gpus: int | None = None, annotations: dict[str, str] | None = None,
            labels: dict[str, str] | None = None, node: str | None = None, scheduler: str = "gpupool",
            ns: str = "default") -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus is not None else {}
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}-{next(_uids)}",
                        "annotations": annotations or {}, "labels": labels or {},
                        "creationTimestamp": "2025-01-01T00:00:00Z"},
           "spec": {"schedulerName": scheduler,
                    "containers": [{"name": "main", "image": "busybox",
                                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": limits}}]},
           "status": {"phase": "Pending"}}
    if node:
        pod["spec"]["nodeName"] = node
        pod["status"]["phase"] = "Running"
    return pod


def bound_node(h: Harness, name: str) -> str | None:
    pod = h.pod(name)
    return (pod or {}).get("spec", {}).get("nodeName")


def gpu_use(h: Harness) -> dict[tuple[str, int], int]:
    """milli-GPU per (node, device) from gpupool's annotations of every bound pod."""
    use: dict[tuple[str, int], int] = collections.Counter()
    for p in h.objects(PODS):
        ann = p["metadata"].get("annotations") or {}
        node = p.get("spec", {}).get("nodeName")
        if node and ann.get(ANN_NODE) == node and ann.get(ANN_GPU_INDEX):
            for g in ann[ANN_GPU_INDEX].split(","):
                use[node, int(g)] += int(ann[ANN_GPU_MILLI])
    return use


# ------------------------------------------------------------------ tests
def test_list_watch_bind_fraction_records_gpu_and_events(h):
    """The issue's acceptance case: a pod with gpu-fraction 0.25 is bound with its GPU recorded on it."""
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("early", gpus=1, annotations={}))  # exists before the scheduler starts: found by LIST
    s = h.scheduler()
    wait_for(lambda: bound_node(h, "early") == "n1", what="early bound")
    h.create_pod(gpu_pod("frac", annotations={"gpu-fraction": "0.25"}))  # arrives through the WATCH
    h.create_node(gpu_node("n2", gpus=1))  # a node added later is seen too
    wait_for(lambda: bound_node(h, "frac") == "n2", what="frac bound to the new node")
    ann = h.pod("frac")["metadata"]["annotations"]
    assert ann[ANN_NODE] == "n2" and ann[ANN_GPU_INDEX] == "0" and ann[ANN_GPU_MILLI] == "250"
    assert ann["gpupool.io/gpu-memory"] == str(81559 * 250 // 1000)
    scheduled = wait_for(lambda: [e for e in h.events_for("frac") if e["reason"] == "Scheduled"], what="event")
    assert scheduled[0]["message"] == "Successfully assigned default/frac to n2"
    assert scheduled[0]["source"]["component"] == "gpupool"
    assert ("default", "frac", "n2") in h.server.binds
    assert s.reflectors[0].resource_version is not None


def test_unschedulable_pod_gets_event_and_condition(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("big", gpus=4))
    h.scheduler()
    ev = wait_for(lambda: [e for e in h.events_for("big") if e["reason"] == "FailedScheduling"], what="event")
    assert ev[0]["type"] == "Warning"
    # more GPUs than any node has: set aside from its queue's order, with the cause (issue 33, item 2)
    why = ("0/1 nodes are available: 1 Insufficient GPUs (fewer than 4 on the node). Set aside from the order of "
           "queue default (its other pods go on) until a node is added or changes.")
    assert ev[0]["message"] == why
    cond = wait_for(lambda: [c for c in h.pod("big")["status"].get("conditions", [])
                             if c["type"] == "PodScheduled"], what="condition")
    assert cond[0] == {**cond[0], "status": "False", "reason": "Unschedulable", "message": why}
    time.sleep(0.3)  # later cycles do not repeat the same event
    assert len([e for e in h.events_for("big") if e["reason"] == "FailedScheduling"]) == 1
    assert bound_node(h, "big") is None


def test_malformed_annotation_fails_alone(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("bad", annotations={"gpu-fraction": "half"}))
    h.create_pod(gpu_pod("good", annotations={"gpu-fraction": "0.5"}))
    h.scheduler()
    wait_for(lambda: bound_node(h, "good") == "n1", what="good bound")
    ev = wait_for(lambda: [e for e in h.events_for("bad") if e["reason"] == "FailedScheduling"], what="event")
    assert ev[0]["message"] == 'pod default/bad: annotation gpu-fraction="half": must be a number in (0, 1]'
    assert bound_node(h, "bad") is None
    assert "gpupool.io/node" not in h.pod("bad")["metadata"]["annotations"]


def test_watch_expiry_relists_and_finds_missed_pod(h):
    h.create_node(gpu_node("n1", gpus=2))
    s = h.scheduler()
    pods = s.reflectors[1]
    wait_for(lambda: s.synced, what="synced")
    lists_before = pods.lists
    # A pod whose ADDED event the scheduler never sees: only a relist can find it.
    h.put_silently(PODS, "default", gpu_pod("missed", gpus=1))
    h.call(lambda: setattr(h.server, "compacted", h.server.rv + 1))
    h.call(h.server.drop_watches)  # the open watch ends; resuming from the old resourceVersion gets 410
    wait_for(lambda: bound_node(h, "missed") == "n1", what="missed pod bound after relist")
    assert pods.lists > lists_before


def test_watch_resumes_from_resource_version_after_disconnect(h):
    h.create_node(gpu_node("n1", gpus=2))
    s = h.scheduler()
    wait_for(lambda: s.synced, what="synced")
    pods = s.reflectors[1]
    wait_for(lambda: pods.resource_version is not None, what="bookmark or event")
    lists_before, watches_before = pods.lists, h.server.watches
    h.call(h.server.drop_watches)
    h.create_pod(gpu_pod("after", gpus=1))
    wait_for(lambda: bound_node(h, "after") == "n1", what="bound")
    assert pods.lists == lists_before  # resumed, no relist needed
    assert h.server.watches > watches_before
    # Bookmarks: the node watch saw no node change, yet its resourceVersion follows the server's.
    wait_for(lambda: s.reflectors[0].resource_version == str(h.server.rv) or h.call(h.server.drop_watches),
             what="bookmark")


def test_conflict_409_counts_the_pod_where_the_api_says(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_node(gpu_node("n2", gpus=1, **{"gpupool.io/test": "x"}))
    h.create_pod(gpu_pod("raced", gpus=1))
    taken: list[str] = []

    async def someone_else_binds_first(server, ns, name, binding):
        planned = binding["metadata"]["annotations"]["gpupool.io/node"]
        assert planned == binding["target"]["name"]
        assert "gpupool.io/node" not in server._objects[PODS, ns, name].raw["metadata"]["annotations"]  # no PATCH
        other = "n2" if planned == "n1" else "n1"
        taken.append(other)
        await server.bind_elsewhere(ns, name, other)

    h.call(lambda: h.server.before_bind.__setitem__("raced", someone_else_binds_first))
    s = h.scheduler()
    wait_for(lambda: taken and bound_node(h, "raced") == taken[0], what="bound elsewhere")
    # The loser never wrote the pod: it carries the winner's annotations (none here), not gpupool's.
    assert "gpupool.io/node" not in h.pod("raced")["metadata"]["annotations"]
    # The GPU the other scheduler took is not handed out again; the free one is.
    h.create_pod(gpu_pod("next", gpus=1))
    h.create_pod(gpu_pod("third", gpus=1))
    free = "n1" if taken[0] == "n2" else "n2"
    wait_for(lambda: bound_node(h, "next") == free, what="next on the free node")
    wait_for(lambda: h.events_for("third") and h.events_for("third")[0]["reason"] == "FailedScheduling",
             what="third unschedulable")
    assert bound_node(h, "third") is None
    assert not [b for b in h.server.binds if b[1] == "raced"]  # gpupool's binding was refused (409)
    assert ("default/raced", taken[0]) not in s.bindings


def test_a_second_gpupool_binder_is_detected_and_named(h, caplog):
    """Issue 33 item 5: two replicas without leader election double-booked GPUs and nothing said so. A pod this
    scheduler planned, found bound by a Binding that carries gpupool's annotations but is not its own, is
    another gpupool scheduler at work: one ERROR line ``second_scheduler_detected`` naming the pod (a minute
    apart at most); the pod is counted where the API says. Leader election is on by default, as
    kube-scheduler's."""
    from gpupool.k8s.scheduler_cli import Settings

    assert Settings().leader_elect is True
    h.create_node(gpu_node("n1", gpus=1))
    h.create_node(gpu_node("n2", gpus=1, **{"gpupool.io/test": "x"}))
    h.create_pod(gpu_pod("raced", gpus=1))
    taken: list[str] = []

    async def another_gpupool_binds_first(server, ns, name, binding):
        other = "n2" if binding["target"]["name"] == "n1" else "n1"
        taken.append(other)
        async with server._lock:
            await server._set_node(ns, name, other, {"gpupool.io/node": other, "gpupool.io/gpu-index": "0",
                                                     "gpupool.io/gpu-milli": "1000"})

    h.call(lambda: h.server.before_bind.__setitem__("raced", another_gpupool_binds_first))
    with caplog.at_level(logging.INFO, logger="gpupool.k8s"):
        h.scheduler()
        wait_for(lambda: taken and bound_node(h, "raced") == taken[0], what="bound by the other")
        wait_for(lambda: [r for r in caplog.records if "second_scheduler_detected" in r.getMessage()],
                 what="second_scheduler_detected logged")
    (line,) = [r for r in caplog.records if "second_scheduler_detected" in r.getMessage()]
    assert line.levelno == logging.ERROR and line.pod == "default/raced" and line.bound_to == taken[0]
    assert "--leader-elect" in line.action
    assert "gpupool.io/node" in h.pod("raced")["metadata"]["annotations"]  # the other's, untouched


def test_the_loop_waits_resync_s_between_idle_passes_as_leader_and_as_standby(h):
    """The loop's wait counts from its last full pass (so that deferred status rounds do not postpone the resync):
    a standby, which never runs a cycle, and an idle leader still wait ``resync_s`` between passes, no busy loop."""
    h.create_node(gpu_node("n1", gpus=1))
    standby = h.scheduler(leader=lambda: False, identity="standby")
    leader = h.scheduler(identity="leader")
    wait_for(lambda: standby.synced and leader.synced, what="synced")
    passes = {"standby": 0, "leader": 0}
    for name, s in (("standby", standby), ("leader", leader)):
        sync = s._sync_model

        def counted(sync=sync, name=name):
            passes[name] += 1
            sync()

        s._sync_model = counted
    t0 = time.monotonic()
    # resync_s is 0.5 in the harness: about 2 passes a second each; each must pass (liveness; a loaded machine
    # may take longer, so wait on it) and neither may spin (a busy loop makes thousands a second)
    wait_for(lambda: passes["standby"] >= 2 and passes["leader"] >= 2, what="two passes each")
    time.sleep(1.0)
    elapsed = time.monotonic() - t0
    # a busy loop makes thousands of passes a second; watch events (the leader's own writes) wake a pass early,
    # more of them on a loaded machine: the bound tells the two apart without counting the wake-ups
    assert passes["standby"] <= 40 * elapsed + 10 and passes["leader"] <= 60 * elapsed + 10, (passes, elapsed)


def test_binding_whose_reply_and_read_back_are_lost_keeps_its_gpu(h, monkeypatch):
    """Issue 33 item 1: the apiserver dies while a Binding is answered. The Binding went through server-side, its
    reply is cut and the read-back fails too, and the watch is silent meanwhile. The scheduler used to forget the
    assumed pod and give its GPU to the next pod (two pods bound on one GPU). The assumption is kept until there is
    evidence (a read-back answers, the watch shows the pod), so the next pod waits; once the API answers again the
    first pod is taken as bound."""
    import urllib3

    from gpupool.k8s import scheduler as sched_mod

    down = threading.Event()
    real_post, real_read = sched_mod.post_binding, sched_mod.read_pod

    def post_binding(api, ns, name, *args, **kwargs):
        real_post(api, ns, name, *args, **kwargs)
        if name == "first":  # committed, then the connection drops before the reply
            down.set()
            raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))

    def read_pod(api, ns, name, *args, **kwargs):
        if down.is_set():
            raise urllib3.exceptions.ProtocolError("Connection aborted.", ConnectionRefusedError(111, "refused"))
        return real_read(api, ns, name, *args, **kwargs)

    monkeypatch.setattr(sched_mod, "post_binding", post_binding)
    monkeypatch.setattr(sched_mod, "read_pod", read_pod)
    h.create_node(gpu_node("n1", gpus=1))
    s = h.scheduler()
    wait_for(lambda: s.synced, what="synced")
    held: list[tuple[str, str, dict]] = []
    apply = s.cache.apply

    released = threading.Event()

    def silent_while_down(kind, event_type, obj):  # the watch lost first's binding (it relists later)
        # every event showing first bound is held until the apiserver is back: on a loaded machine the watch can
        # deliver it before the binder thread has seen its reply cut
        if not released.is_set() and kind == "pods" and obj["metadata"]["name"] == "first" \
                and (obj.get("spec") or {}).get("nodeName"):
            held.append((kind, event_type, obj))
            return
        apply(kind, event_type, obj)

    monkeypatch.setattr(s.cache, "apply", silent_while_down)
    h.create_pod(gpu_pod("first", gpus=1))
    wait_for(lambda: down.is_set(), what="the binding of first sent")
    assert bound_node(h, "first") == "n1"  # it went through
    second = gpu_pod("second", gpus=1)  # the next pod of the burst (placed before first if first waited again)
    second["spec"]["priority"] = 50
    n = s.cycles
    h.create_pod(second)
    # cycles go on (resync 0.5 s) while the read-backs fail: wait until second was planned a few times
    wait_for(lambda: "default/second" in s.model.pods and s.cycles >= n + 3, what="cycles with second pending")
    assert not [a for a in h.server.bind_attempts if a[1] == "second"], "second was given first's GPU"
    assert "default/first" in s.model.assumed
    down.clear()  # the apiserver is back: the read-back answers, the watch delivers
    released.set()
    for event in held:
        apply(*event)
    wait_for(lambda: ("default/first", "n1") in s.bindings, what="first taken as bound after the read-back")
    wait_for(lambda: "default/first" not in s.assumed and s.model.pods["default/first"].counted,
             what="first counted")
    n = s.cycles
    wait_for(lambda: s.cycles >= n + 2, what="two more cycles")  # second had its chance at the GPU
    assert not [a for a in h.server.bind_attempts if a[1] == "second"] and bound_node(h, "second") is None
    assert not s.model.skipped_pods  # nothing miscounted


def test_pod_deleted_before_binding(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("doomed", gpus=1))

    async def delete_first(server, ns, name, binding):
        await server.delete_pod(ns, name)

    h.call(lambda: h.server.before_bind.__setitem__("doomed", delete_first))
    s = h.scheduler()
    wait_for(lambda: h.pod("doomed") is None, what="deleted")
    h.create_pod(gpu_pod("heir", gpus=1))  # the GPU the deleted pod was given is free again
    wait_for(lambda: bound_node(h, "heir") == "n1", what="heir bound")
    assert not any(b[1] == "doomed" for b in h.server.binds)
    assert "default/doomed" not in s.assumed


def test_node_that_vanishes_is_dropped(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("p", gpus=1))
    s = h.scheduler()
    wait_for(lambda: bound_node(h, "p") == "n1", what="bound")
    h.v1.delete_node("n1", _preload_content=False)  # p is now bound to a node that does not exist
    h.create_node(gpu_node("n2", gpus=1))
    h.create_pod(gpu_pod("q", gpus=1))
    wait_for(lambda: bound_node(h, "q") == "n2", what="q on n2")
    h.create_pod(gpu_pod("r", gpus=1))
    ev = wait_for(lambda: h.events_for("r"), what="r reported")
    assert ev[0]["message"] == "0/1 nodes are available: 1 Insufficient GPU share."
    assert s.cycles > 0


def test_node_gone_at_binding_time_is_planned_again(h):
    h.create_node(gpu_node("n1", gpus=1))
    s = Scheduler(h.api, SchedulerConfig())  # not started: drive one binding by hand
    pod = gpu_pod("p", gpus=1)
    h.create_pod(pod)
    placement = Placement("default/p", "n1", (0,), 1000)
    a = _Assumed(pod["metadata"]["uid"], placement, assignment_annotations(placement))
    s.assumed["default/p"] = a
    s.cache.replace("nodes", [])  # the node left the cache after the plan was made
    assert s._bind(pod, a) == "node_gone"
    assert "default/p" not in s.assumed and not h.server.binds
    s.cache.replace("nodes", [gpu_node("n1")])
    s.assumed["default/p"] = a
    assert s._bind(pod, a) == "bound"
    assert h.server.binds == [("default", "p", "n1")]
    s.stop()


def test_restart_with_pods_already_bound_never_double_allocates(h):
    h.create_node(gpu_node("n1", gpus=2))
    # Bound before gpupool starts: one by gpupool (annotations), one by kube-scheduler (no annotations).
    h.create_pod(gpu_pod("mine", node="n1", annotations={"gpu-fraction": "0.5", ANN_NODE: "n1", ANN_GPU_INDEX: "1",
                                                         ANN_GPU_MILLI: "500"}))
    h.create_pod(gpu_pod("theirs", gpus=1, node="n1", scheduler="default-scheduler"))
    h.create_pod(gpu_pod("half", annotations={"gpu-fraction": "0.5"}))
    h.create_pod(gpu_pod("whole", gpus=1))
    s1 = h.scheduler(identity="gpupool-a")
    wait_for(lambda: bound_node(h, "half") == "n1", what="half bound")
    wait_for(lambda: h.events_for("whole"), what="whole reported")
    assert h.pod("half")["metadata"]["annotations"][ANN_GPU_INDEX] == "1"  # next to "mine" (0 is "theirs")
    s1.stop()
    # A fresh replica rebuilds everything from the API.
    s2 = h.scheduler(identity="gpupool-b")
    h.create_pod(gpu_pod("late", annotations={"gpu-fraction": "0.25"}))
    wait_for(lambda: h.events_for("late"), what="late reported")
    assert bound_node(h, "late") is None and bound_node(h, "whole") is None
    assert all(v <= 1000 for v in gpu_use(h).values())
    assert s2.cycles > 0 and not s2.bindings


def test_two_replicas_only_the_leader_binds(h):
    h.create_node(gpu_node("n1", gpus=2))
    leader = {"a": True, "b": False}
    a = h.scheduler(leader=lambda: leader["a"], identity="a")
    b = h.scheduler(leader=lambda: leader["b"], identity="b")
    h.create_pod(gpu_pod("p1", gpus=1))
    wait_for(lambda: bound_node(h, "p1"), what="p1 bound")
    wait_for(lambda: a.bindings, what="a's record of the binding")
    assert not b.bindings
    leader["a"] = False  # hand-over: b becomes leader and rebuilds from the API first
    leader["b"] = True
    h.create_pod(gpu_pod("p2", gpus=1))
    h.create_pod(gpu_pod("p3", gpus=1))
    wait_for(lambda: bound_node(h, "p2"), what="p2 bound")
    wait_for(lambda: h.events_for("p3"), what="p3 reported")
    wait_for(lambda: b.bindings, what="b's record of the binding")
    assert [p for p, _ in b.bindings] == ["default/p2"]
    assert b.reflectors[1].lists >= 2  # listed again when elected: state rebuilt from the API
    assert bound_node(h, "p3") is None
    assert all(v <= 1000 for v in gpu_use(h).values())


def test_gang_binds_all_or_nothing(h):
    h.declare(PODGROUPS)
    h.create_node(gpu_node("n1", gpus=2))
    h.create_node(gpu_node("n2", gpus=2))
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "job", "namespace": "default"}, "spec": {"minMember": 3}}
    client.CustomObjectsApi(h.api).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", group, _preload_content=False)
    label = {"scheduling.x-k8s.io/pod-group": "job"}
    h.scheduler()
    h.create_pod(gpu_pod("w0", gpus=2, labels=label))
    h.create_pod(gpu_pod("w1", gpus=2, labels=label))
    wait_for(lambda: h.events_for("w0"), what="gang waiting")
    assert "waiting for the rest" in h.events_for("w0")[0]["message"]
    h.create_pod(gpu_pod("w2", gpus=2, labels=label))  # 3 x 2 GPUs do not fit on 2 x 2: nothing is bound
    wait_for(lambda: any("cannot be placed together" in e["message"] for e in h.events_for("w2")), what="refused")
    assert not h.server.binds
    h.create_node(gpu_node("n3", gpus=2))
    wait_for(lambda: all(bound_node(h, f"w{i}") for i in range(3)), what="gang bound")
    assert sorted(bound_node(h, f"w{i}") for i in range(3)) == ["n1", "n2", "n3"]


def test_queue_limit_refuses_and_crd_absence_is_tolerated(h):
    h.create_node(gpu_node("n1", gpus=4))
    s = h.scheduler()
    wait_for(lambda: s.synced, what="synced without Queue or PodGroup CRDs")
    h.create_pod(gpu_pod("free-for-all", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    wait_for(lambda: bound_node(h, "free-for-all"), what="bound with no Queue CRD (no limits)")
    h.declare(QUEUES)
    custom = client.CustomObjectsApi(h.api)
    custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-a"},
        "spec": {"quota": 1, "limit": 2, "weight": 1}}, _preload_content=False)
    wait_for(lambda: s.cache.objects["queues"], timeout=5, what="queues seen")
    h.create_pod(gpu_pod("second", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    h.create_pod(gpu_pod("third", gpus=1, labels={"kai.scheduler/queue": "team-a"}))
    h.create_pod(gpu_pod("lost", gpus=1, labels={"kai.scheduler/queue": "nobody"}))
    wait_for(lambda: bound_node(h, "second"), what="second bound")
    ev = wait_for(lambda: h.events_for("third"), what="third refused")
    assert ev[0]["message"] == "queue team-a would exceed its limit: 2 of 2 GPU in use, 1 more asked"
    ev = wait_for(lambda: h.events_for("lost"), what="lost refused")
    assert ev[0]["message"].startswith("queue nobody not found")


LEASES = kmock.resource("coordination.k8s.io", "v1", "leases")


def write_kubeconfig(h: Harness, tmp_path) -> Any:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: mock\n"
        f"clusters:\n- name: mock\n  cluster:\n    server: {h.url}\n"
        "users:\n- name: me\n  user:\n    token: t0ken\n"
        "contexts:\n- name: mock\n  context:\n    cluster: mock\n    user: me\n")
    return kubeconfig


def test_cli_dry_run_on_the_live_cluster_binds_nothing(h, tmp_path):
    import json

    from typer.testing import CliRunner

    from gpupool.cli import app

    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("frac", annotations={"gpu-fraction": "0.25"}))
    h.create_pod(gpu_pod("big", gpus=2))
    result = CliRunner().invoke(app, ["scheduler", "--dry-run", "--kubeconfig", str(write_kubeconfig(h, tmp_path)),
                                      "--json", "-", "--share-enforcement", "trust"])
    assert result.exit_code == 0, result.output
    # stdout only: the JSON; log records of an earlier test's root level go to stderr, which `output` mixes in
    placements = {p["pod"]: p for p in json.loads(result.stdout)["placements"]}
    assert placements["default/frac"]["node"] == "n1" and placements["default/frac"]["gpu_milli"] == 250
    assert placements["default/big"]["node"] is None
    assert not h.server.binds and bound_node(h, "frac") is None


def test_cli_scheduler_with_lease_metrics_and_kubeconfig(h, tmp_path):
    """``gpupool scheduler --leader-elect`` end to end: kubeconfig, Lease, /readyz and /metrics, clean stop."""
    import logging
    import socket
    import urllib.request

    from gpupool.k8s.scheduler_cli import Settings, run_scheduler

    kubeconfig = write_kubeconfig(h, tmp_path)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = Settings(leader_elect=True, lease_namespace="gpupool-system", lease_duration=2.0, renew_deadline=1.5,
                        retry_period=0.2, metrics_address=f"127.0.0.1:{port}", log_format="kv", log_level="warning",
                        share_enforcement="trust")
    stop = threading.Event()
    runner = threading.Thread(target=run_scheduler, args=(settings, 0, "replica-1", kubeconfig, None, stop),
                              daemon=True)
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("frac", annotations={"gpu-fraction": "0.25"}))
    runner.start()
    try:
        wait_for(lambda: bound_node(h, "frac") == "n1", what="bound through the CLI")
        assert h.pod("frac")["metadata"]["annotations"][ANN_GPU_MILLI] == "250"
        (lease,) = h.objects(LEASES)
        assert lease["spec"]["holderIdentity"] == "replica-1"

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                    return resp.status, resp.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, ""

        assert get("/readyz")[0] == 200 and get("/healthz")[0] == 200
        metrics = wait_for(lambda: (m := get("/metrics")[1]) and 'result="scheduled"} 1.0' in m and m,
                           what="metrics")
        assert "gpupool_leader 1.0" in metrics
    finally:
        stop.set()
        runner.join(15)
        for handler in [x for x in logging.getLogger().handlers if getattr(x, "_gpupool", False)]:
            logging.getLogger().removeHandler(handler)
    assert not runner.is_alive()
    (lease,) = h.objects(LEASES)
    assert lease["spec"]["holderIdentity"] == ""  # released on a clean stop


def test_api_errors_reconnect_with_backoff(h):
    """A flaky API server (500 on list, 503 on watch) only delays scheduling."""
    calls = {"list": 0, "watch": 0}

    def flaky_list(request):
        calls["list"] += 1
        if calls["list"] <= 2:
            raise kmock.KubernetesError(status=500, reason="InternalError", message="etcd timeout")
        raise kmock.ReactionMismatchError()  # then the normal answer

    def flaky_watch(request):
        calls["watch"] += 1
        if calls["watch"] <= 2:
            raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="try later")
        raise kmock.ReactionMismatchError()

    h.call(lambda: h.server[kmock.action.LIST, PODS] << flaky_list)
    h.call(lambda: h.server[kmock.action.WATCH, PODS] << flaky_watch)
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("p", gpus=1))
    s = h.scheduler()
    wait_for(lambda: bound_node(h, "p") == "n1", what="bound despite the errors")
    assert calls["list"] >= 3
    wait_for(lambda: calls["watch"] >= 3, what="watch retried")
    h.create_node(gpu_node("n2", gpus=1))
    h.create_pod(gpu_pod("q", gpus=1))  # seen only through the watch that finally works
    wait_for(lambda: bound_node(h, "q") == "n2", what="q bound")
    assert s.reflectors[1].lists >= 1


def test_backoff_grows_and_resets():
    from gpupool.k8s.scheduler import Backoff

    b = Backoff(0.5, 4.0)
    delays = [b.next() for _ in range(6)]
    assert 0.25 <= delays[0] <= 0.5 and 2.0 <= delays[-1] <= 4.0
    assert all(d <= 4.0 for d in delays)
    b.reset()
    assert b.next() <= 0.5


# ------------------------------------------------------------------ the wire: one write per binding, reused connections
def test_two_schedulers_racing_for_the_same_pods_leave_the_winners_annotations(h):
    """Two binders race for every pod (as around a leader hand-over) with different plans for it: whoever wins,
    the pod carries exactly the winner's Binding annotations, and no GPU is booked past its capacity."""
    h.create_node(gpu_node("n1", gpus=2))
    pack = h.scheduler(identity="pack", policy="gpupool")
    spread = h.scheduler(identity="spread", policy="spread")
    wait_for(lambda: pack.synced and spread.synced, what="synced")
    first: dict[str, asyncio.Future] = {}

    async def meet(server, ns, name, binding):
        """Hold a pod's first binding until the other scheduler's arrives (or 0.5 s), then serve both."""
        fut = first.get(name)
        if fut is None:
            fut = first[name] = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(asyncio.shield(fut), 0.5)
            except TimeoutError:
                pass
        elif not fut.done():
            fut.set_result(None)
            await asyncio.sleep(0.01)  # the first one is served first

    h.call(lambda: setattr(h.server, "on_every_bind", meet))
    for i in range(8):  # 8 quarter-GPU pods fill the node's 2 GPUs exactly
        h.create_pod(gpu_pod(f"p{i}", annotations={"gpu-fraction": "0.25"}))
        key = f"default/p{i}"
        wait_for(lambda i=i: bound_node(h, f"p{i}") == "n1", what=f"p{i} bound")
        wait_for(lambda key=key: all((s.cache.get("pods", key) or {}).get("spec", {}).get("nodeName")
                                     for s in (pack, spread)), what="both schedulers saw it bound")
    attempts = h.call(lambda: list(h.server.bind_attempts))
    raced = 0
    for i in range(8):
        mine = [(ann, status) for ns, name, _, ann, status in attempts if name == f"p{i}"]
        (won,) = [ann for ann, status in mine if status == 201]
        lost = [ann for ann, status in mine if status == 409]
        raced += any(ann != won for ann in lost)
        ann = h.pod(f"p{i}")["metadata"]["annotations"]
        assert {k: v for k, v in ann.items() if k.startswith("gpupool.io/")} == won, f"p{i}"
        assert won[ANN_NODE] == "n1"
    assert raced >= 1  # the plans differed for some pod, and the loser's annotations were not written
    use = gpu_use(h)
    assert sum(use.values()) == 8 * 250 and all(v <= 1000 for v in use.values()), use
    h.create_pod(gpu_pod("late", annotations={"gpu-fraction": "0.25"}))
    wait_for(lambda: h.events_for("late"), what="late reported")
    assert bound_node(h, "late") is None


def test_connections_are_reused_for_bindings_events_and_conditions(h):
    """Every response is read and its connection goes back to the pool: a few connections, not 3 per binding."""
    for n in range(4):
        h.create_node(gpu_node(f"n{n}", gpus=4))
    pods = 120  # eighth-GPU pods of 1 CPU: 16 GPUs and 128 CPUs hold 128
    for i in range(pods):
        h.create_pod(gpu_pod(f"p{i}", annotations={"gpu-fraction": "0.125"}))
    for i in range(6):
        h.create_pod(gpu_pod(f"big{i}", gpus=9))  # unschedulable: a FailedScheduling Event and a condition each
    before = h.connections
    s = h.scheduler()
    wait_for(lambda: len(h.server.binds) == pods, timeout=30, what="all bound")
    wait_for(lambda: all(any(c.get("type") == "PodScheduled" for c in h.pod(f"big{i}")["status"].get("conditions", []))
                         for i in range(6)), what="conditions")
    assert s.recorder.flush(60)  # a loaded 2-core machine needed more than 10 s for ~130 events
    wait_for(lambda: len([e for e in h.objects(EVENTS) if e["reason"] == "Scheduled"]) == pods, what="events")
    used = h.connections - before
    # binders + eviction workers + event writers + condition/status writers + one per watch + lists/read-backs (the
    # pool size the scheduler asks for): far below one per request
    limit = s.config.bind_workers + s.config.evict_workers + s.recorder.workers + 2 + len(s.reflectors) + 4
    assert used <= limit, f"{used} connections for {pods} bindings (limit {limit})"
    made = sum(p.num_connections for p in h.api.rest_client.pool_manager.pools._container.values())
    assert made <= limit


def test_forbidden_after_sync_keeps_the_queue_cache_and_its_limits(h, caplog):
    """A 403/404 from a kind already listed is the API server's trouble (a restarting kube-apiserver answers 403
    for a while), not "CRD not installed": the Queues stay known and their limits hold."""
    import logging

    h.declare(QUEUES)
    wire.drain(client.CustomObjectsApi(h.api).create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-a"},
        "spec": {"quota": 1, "limit": 2, "weight": 1}}, _preload_content=False))
    h.create_node(gpu_node("n1", gpus=4))
    s = h.scheduler()
    queues = next(r for r in s.reflectors if r.kind == "queues")
    wait_for(lambda: queues.lists and s.cache.objects["queues"], what="queues listed")
    denied = {"on": True, "calls": 0}

    def deny(request):
        if not denied["on"]:
            raise kmock.ReactionMismatchError()
        denied["calls"] += 1
        raise kmock.KubernetesError(status=403, reason="Forbidden", message='queues.gpupool.io is forbidden: User '
                                    '"system:serviceaccount:gpupool-system:gpupool-scheduler" cannot list resource')

    with caplog.at_level(logging.DEBUG, logger="gpupool.k8s.scheduler"):
        h.call(lambda: h.server[kmock.action.LIST, QUEUES] << deny)
        h.call(lambda: h.server[kmock.action.WATCH, QUEUES] << deny)
        h.call(h.server.drop_watches)  # the open watch ends; every reconnect and relist is refused
        wait_for(lambda: denied["calls"] >= 3, what="403s")
        for i in range(3):
            h.create_pod(gpu_pod(f"q{i}", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
        ev = wait_for(lambda: [e for i in range(3) for e in h.events_for(f"q{i}") if e["reason"] == "FailedScheduling"],
                      what="one refused")
        assert ev[0]["message"] == "queue team-a would exceed its limit: 2 of 2 GPU in use, 1 more asked"
        time.sleep(0.2)
        assert sum(bool(bound_node(h, f"q{i}")) for i in range(3)) == 2  # the limit held during the 403s
        assert s.cache.objects["queues"] and queues.lists >= 1
        lists = queues.lists
        denied["on"] = False
        wait_for(lambda: queues.lists > lists, what="listed again after the 403s")
        wait_for(lambda: any(r.getMessage() == "api_recovered" and getattr(r, "kind", "") == "queues"
                             for r in caplog.records), what="recovery logged")
    mine = [r for r in caplog.records if getattr(r, "kind", "") == "queues" and r.levelno >= logging.WARNING]
    assert [r.getMessage() for r in mine] == ["api_failing", "api_recovered"]  # once per outage, not per attempt
    assert mine[1].attempts >= 3
    # the Queues were never taken for "CRD not installed" (other kinds' first lists may log their own absence late
    # on a loaded machine: those records are not this test's subject)
    assert not any(r.getMessage() in ("resource_absent", "resource_forbidden") and getattr(r, "kind", "") == "queues"
                   for r in caplog.records)


def test_forbidden_on_first_list_is_reported_as_not_granted(h, caplog):
    """403 before any list: the kind is run without, with a warning that names the missing permission."""
    import logging

    h.declare(QUEUES)
    h.call(lambda: h.server[kmock.action.LIST, QUEUES] << kmock.KubernetesError(status=403, reason="Forbidden",
                                                                               message="forbidden"))
    h.create_node(gpu_node("n1", gpus=1))
    with caplog.at_level(logging.INFO, logger="gpupool.k8s.scheduler"):
        s = h.scheduler()
        wait_for(lambda: s.synced, what="synced without the Queues")
        h.create_pod(gpu_pod("p", gpus=1))
        wait_for(lambda: bound_node(h, "p") == "n1", what="bound")
    assert s.cache.objects["queues"] is None
    (warning,) = [r for r in caplog.records if r.getMessage() == "resource_forbidden"]
    assert warning.kind == "queues" and "rbac" in warning.note
    # a pod of a queue waits while Queues cannot be read: its limit is never skipped
    h.create_pod(gpu_pod("queued", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    ev = wait_for(lambda: h.events_for("queued"), what="queued pod reported")
    assert "Queue objects cannot be read (403 Forbidden" in ev[0]["message"]
    assert bound_node(h, "queued") is None


def test_urllib3_retry_warnings_are_not_logged_per_attempt(caplog):
    import logging

    from kubernetes import client as k8s_client

    cfg = wire.configure(k8s_client.Configuration(), writers=8)
    assert cfg.connection_pool_maxsize >= 16 and cfg.retries.total == 3
    pool_log = logging.getLogger("urllib3.connectionpool")
    with caplog.at_level(logging.DEBUG, logger="urllib3.connectionpool"):
        pool_log.warning("Retrying (%r) after connection broken by '%r': %s", "Retry(total=2)", "refused", "/api")
        pool_log.warning("Connection pool is full, discarding connection: %s", "127.0.0.1")
    assert [r.getMessage()[:26] for r in caplog.records] == ["Connection pool is full, d"]


def test_outage_logs_once_at_start_and_once_at_recovery():
    lines: list[tuple[int, str, dict]] = []
    outage = wire.Outage(lambda level, event, **f: lines.append((level, event, f)), "api", kind="pods")
    outage.success()
    for _ in range(5):
        outage.failure(status=503)
    outage.success()
    outage.success()
    import logging

    assert [(lv, ev) for lv, ev, _ in lines if lv >= logging.WARNING] == [(logging.WARNING, "api_failing"),
                                                                          (logging.WARNING, "api_recovered")]
    assert lines[-1][2]["attempts"] == 5 and outage.outages == 1


def test_relist_cuts_an_idle_watch_at_once():
    """A relist (on becoming leader) must not wait for the next event of an idle kind: Watch.stop() alone is
    seen only then (a real kube-apiserver kept an idle nodes watch silent for 30 s and the new leader bound
    nothing meanwhile), so the open watch response is shut down, which ends the blocked read at once."""
    import urllib3

    from gpupool.k8s.scheduler import ClusterCache, Reflector

    class Silent:  # a watch response on which nothing ever arrives, until it is shut down
        status = 200

        def __init__(self) -> None:
            self.cut = threading.Event()

        def stream(self, amt=None, decode_content=False):
            self.cut.wait(30)
            raise urllib3.exceptions.ProtocolError("connection shut down")
            yield b""  # pragma: no cover - a generator

        def shutdown(self) -> None:
            self.cut.set()

        def close(self) -> None:
            pass

        def release_conn(self) -> None:
            pass

    class Listed:
        data = b'{"items": [], "metadata": {"resourceVersion": "7"}}'

        def release_conn(self) -> None:
            pass

    watches: list[Silent] = []

    def list_nodes(**kwargs):
        """list nodes

        :param bool watch: Watch for changes.
        :return: V1NodeList
        """
        if kwargs.get("watch"):
            watches.append(Silent())
            return watches[-1]
        return Listed()

    r = Reflector("nodes", list_nodes, ClusterCache(), SchedulerConfig(backoff_initial_s=0.01))
    r.start()
    try:
        wait_for(lambda: watches and r._resp is not None, what="watch open")
        before = r.lists
        t0 = time.monotonic()
        r.relist()
        wait_for(lambda: r.lists > before, timeout=5, what="relisted")
        assert time.monotonic() - t0 < 2.0 and watches[0].cut.is_set()
        wait_for(lambda: len(watches) == 2, what="watching again")
    finally:
        r.stop()
        r.join(5)
    assert not r.is_alive()


def test_a_new_node_is_not_ready_until_its_taint_is_lifted(h):
    """As on a real kube-apiserver: a Node created by hand carries node.kubernetes.io/not-ready:NoSchedule, and
    gpupool does not place pods there until the taint is lifted; a create ignores the status it carries."""
    wire.drain(h.v1.create_node(gpu_node("bare", gpus=1), _preload_content=False))
    bare = next(n for n in h.objects(NODES) if n["metadata"]["name"] == "bare")
    assert not bare.get("status")
    wire.drain(h.v1.delete_node("bare", _preload_content=False))
    h.create_node(gpu_node("fresh", gpus=1), ready=False)
    node = next(n for n in h.objects(NODES) if n["metadata"]["name"] == "fresh")
    assert NOT_READY_TAINT in node["spec"]["taints"]
    h.scheduler()
    h.create_pod(gpu_pod("p", gpus=1))
    ev = wait_for(lambda: h.events_for("p"), what="unschedulable")
    assert "1 node(s) had untolerated taint" in ev[0]["message"]
    wire.drain(h.v1.patch_node("fresh", {"spec": {"taints": None}}, _content_type="application/merge-patch+json",
                               _preload_content=False))
    wait_for(lambda: bound_node(h, "p") == "fresh", what="bound once Ready")



def test_queue_status_is_written(h):
    """Each Queue's status (the CRD's fields; `kubectl get queues` shows usedGPUs) follows what its pods hold."""
    h.declare(QUEUES)
    custom = client.CustomObjectsApi(h.api)
    for name, spec in (("team-a", {"quota": 1, "limit": 2}), ("broken", {"quota": "lots"})):
        wire.drain(custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", {
            "apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec},
            _preload_content=False))
    h.create_node(gpu_node("n1", gpus=4))
    for i in range(3):
        h.create_pod(gpu_pod(f"q{i}", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
    h.scheduler(queue_status_s=0.05)

    def status(name):
        q = next((o for o in h.objects(QUEUES) if o["metadata"]["name"] == name), None)
        return (q or {}).get("status") or {}

    st = wait_for(lambda: status("team-a").get("usedGPUs") == 2 and status("team-a").get("pendingPods") == 1
                  and status("team-a"), what="team-a status")
    assert st["allocatedPods"] == 2
    assert st["conditions"][0]["type"] == "Valid" and st["conditions"][0]["status"] == "True"
    bad = wait_for(lambda: status("broken").get("conditions"), what="broken status")
    assert bad[0]["status"] == "False" and bad[0]["reason"] == "InvalidSpec" and "quota" in bad[0]["message"]


def test_queue_status_is_current_within_a_second_with_the_production_intervals(h):
    """Issue 29: with the production defaults (status rounds ``queue_status_s`` apart, a cycle at least every 30 s)
    a change soon after a status write was skipped and shown only at the next resync, ~30 s later. Rate limiting
    coalesces instead: every change is written within a round (0.5 s) of the cycle that saw it."""
    h.declare(QUEUES)
    custom = client.CustomObjectsApi(h.api)
    wire.drain(custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": "team-a"},
        "spec": {"quota": 4}}, _preload_content=False))
    h.create_node(gpu_node("n1", gpus=4))
    defaults = SchedulerConfig()
    assert defaults.queue_status_s <= 1.0 and defaults.resync_s >= 30.0
    s = Scheduler(h.api, SchedulerConfig(identity="gpupool-0"))  # production intervals throughout
    h.schedulers.append(s)
    s.start()
    wait_for(lambda: s.synced, what="synced")

    def used() -> float | None:
        q = next((o for o in h.objects(QUEUES) if o["metadata"]["name"] == "team-a"), None)
        return ((q or {}).get("status") or {}).get("usedGPUs")

    lags = []
    for i in range(3):  # each change right after the write the one before caused
        h.create_pod(gpu_pod(f"q{i}", gpus=1, labels={"kueue.x-k8s.io/queue-name": "team-a"}))
        wait_for(lambda i=i: bound_node(h, f"q{i}"), what=f"q{i} bound")
        t0 = time.monotonic()
        wait_for(lambda i=i: used() == i + 1, timeout=10.0, what=f"usedGPUs {i + 1} (a resync is 30 s away)")
        lags.append(time.monotonic() - t0)
    h.call(lambda: h.server.delete_pod("default", "q0"))
    t0 = time.monotonic()
    wait_for(lambda: used() == 2, timeout=10.0, what="usedGPUs 2 after a pod went")
    lags.append(time.monotonic() - t0)
    # 0.5 s by design; the bug it guards against showed a change at the next resync, 30 s later: a bound well
    # below that, and far above 0.5 s, tells the two apart on a loaded machine too
    assert max(lags) < 15.0, lags


def test_a_failed_binding_tells_the_user_what_it_means():
    """Issue 33 item 7: binds refused while a restarted API server warms up showed users "Binding rejected: 403
    Forbidden". The FailedScheduling message says what the answer means and that gpupool retries."""
    from gpupool.k8s.api.calls import binding_failure_message

    msg = binding_failure_message(403, "Forbidden")
    assert msg.startswith("Binding refused by the API server (403 Forbidden); gpupool retries.")
    assert "authorization needs a few seconds" in msg and "pods/binding create" in msg
    assert binding_failure_message(429, "TooManyRequests") == ("API server busy (429 TooManyRequests); gpupool "
                                                               "retries the binding")
    assert binding_failure_message(504, "Timeout") == ("the API server did not complete the binding "
                                                       "(504 Timeout); gpupool retries")
    assert binding_failure_message(None, None).startswith("the API server did not complete the binding (no answer)")
    assert binding_failure_message(422, "Invalid") == "Binding rejected: 422 Invalid"
