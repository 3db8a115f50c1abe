"""Status written back on gpupool's Queues and on PodGroups, so that ``kubectl get queues`` / ``kubectl get
podgroups`` show allocation against quota and each gang's phase.

Two pure functions compute the bodies from a :class:`~gpupool.k8s.cache.model.ClusterModel` (read only, on the
scheduling thread):

* :func:`queue_statuses`: per Queue, what :meth:`ClusterModel.queue_status` says (``usedGPUs``,
  ``allocatedPods``, ``pendingPods``, condition ``Valid``) plus ``pendingGPUs``, ``borrowedGPUs`` (GPUs held
  above the quota) and ``fairShareGPUs`` (the pool's fair share, when known); GPUs as numbers rounded to
  3 decimals (milli-GPU precision).
* :func:`pod_group_statuses`: per PodGroup (scheduler-plugins ``scheduling.x-k8s.io`` and Volcano
  ``scheduling.volcano.sh``), counts of its member pods and its phase in that CRD's own vocabulary.

:class:`StatusWriter` sends them: a merge PATCH of the ``status`` subresource of each object whose status
changed, off the scheduling thread, rate-limited by coalescing: a round asked for within ``interval_s`` of the
last one is deferred to ``last + interval_s`` (:meth:`StatusWriter.due_in`), never dropped. It compares with
what it wrote last (or, for an object it has not written or that changed since, with the status the watch
shows), so a new leader does not rewrite statuses that are already right and conditions keep their
``lastTransitionTime``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpupool.k8s import POD_GROUP_API, QUEUE_API, VOLCANO_POD_GROUP_API
from gpupool.k8s.api.wire import MERGE_PATCH, call
from gpupool.k8s.objects.fields import RequestParseError
from gpupool.k8s.objects.pods import parse_pod_group, pod_group_of
from gpupool.model import MILLI

_logger = logging.getLogger("gpupool.k8s.status")

QUEUES, PODGROUPS, VOLCANO_PODGROUPS = "queues", "podgroups", "volcanopodgroups"

#: status fields gpupool owns on each kind: a field it wrote and no longer computes is cleared (``null``).
OWNED_FIELDS: dict[str, tuple[str, ...]] = {
    QUEUES: ("usedGPUs", "allocatedPods", "pendingPods", "pendingGPUs", "fairShareGPUs", "borrowedGPUs",
             "observedGeneration", "conditions"),
    PODGROUPS: ("phase", "scheduled", "running", "succeeded", "failed"),
    VOLCANO_PODGROUPS: ("phase", "running", "succeeded", "failed"),
}

#: status subresource path of each kind (``{name}``, ``{namespace}`` filled per object).
STATUS_PATHS: dict[str, str] = {
    QUEUES: f"/apis/{QUEUE_API[0]}/{QUEUE_API[1]}/{QUEUE_API[2]}/{{name}}/status",
    PODGROUPS: (f"/apis/{POD_GROUP_API[0]}/{POD_GROUP_API[1]}/namespaces/{{namespace}}/"
                f"{POD_GROUP_API[2]}/{{name}}/status"),
    VOLCANO_PODGROUPS: (f"/apis/{VOLCANO_POD_GROUP_API[0]}/{VOLCANO_POD_GROUP_API[1]}/namespaces/{{namespace}}/"
                        f"{VOLCANO_POD_GROUP_API[2]}/{{name}}/status"),
}

Ref = tuple[str, str]  # (kind, "name" for a Queue or "namespace/name" for a PodGroup)


def _gpus(milli: float) -> float:
    """milli-GPU -> GPUs, rounded to 3 decimals."""
    return round(milli / MILLI, 3)


# ------------------------------------------------------------------ Queues
def queue_statuses(model: Any, fair_shares: Mapping[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """What each Queue's ``status`` should say now, by Queue name (no ``lastTransitionTime``: the writer adds it).

    From :meth:`~gpupool.k8s.cache.model.ClusterModel.queue_status` (``usedGPUs``: GPUs held by the queue's and its
    children's pods; ``allocatedPods``; ``pendingPods``: its own pods waiting for gpupool; condition ``Valid``),
    plus:

    * ``pendingGPUs``: GPUs its own waiting pods ask (declared shares summed, MIG slices as their fraction);
    * ``borrowedGPUs``: ``max(0, usedGPUs - quota)``, GPUs held above the guarantee (Queues with a readable
      spec only);
    * ``fairShareGPUs``: ``fair_shares[name]`` (GPUs the pool scheduler entitles the queue to now); left out
      when ``fair_shares`` is None or has no entry for the queue;
    * ``observedGeneration``: the Queue's ``metadata.generation`` the status was computed from.

    GPU numbers are rounded to 3 decimals. ``{}`` when Queues are not served (CRD not installed or forbidden).
    """
    out = model.queue_status()
    if not out:
        return {}
    specs, _, _ = model.queue_specs()
    pending_milli: dict[str, int] = {}
    for key in model.pending:
        rec = model.pods.get(key)
        if rec is not None and rec.info is not None and rec.info.queue:
            pending_milli[rec.info.queue] = pending_milli.get(rec.info.queue, 0) + rec.info.gpu_milli_total
    for name, st in out.items():
        st["pendingGPUs"] = _gpus(pending_milli.get(name, 0))
        spec = specs.get(name)
        if spec is not None:
            st["borrowedGPUs"] = round(max(0.0, st["usedGPUs"] - spec.quota_milli / MILLI), 3)
        if fair_shares is not None and name in fair_shares:
            st["fairShareGPUs"] = round(float(fair_shares[name]), 3)
        obj = (model.queues or {}).get(name)
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        generation = meta.get("generation") if isinstance(meta, Mapping) else None
        if isinstance(generation, int) and not isinstance(generation, bool):
            st["observedGeneration"] = generation
    return out


# ------------------------------------------------------------------ PodGroups
def _members(model: Any) -> dict[str, dict[str, int | str]]:
    """PodGroup key -> counts of its member pods (every pod naming it, whichever scheduler it names)."""
    counts: dict[str, dict[str, Any]] = {}
    assumed = model.assumed
    for rec in model.pods.values():
        info = rec.info
        group = info.pod_group if info is not None else pod_group_of(rec.obj)  # terminal pods are not parsed
        if not group:
            continue
        c = counts.get(group)
        if c is None:
            c = counts[group] = {"pods": 0, "scheduled": 0, "running": 0, "succeeded": 0, "failed": 0,
                                 "pending": 0, "owner": ""}
        c["pods"] += 1
        status = rec.obj.get("status") if isinstance(rec.obj, Mapping) else None
        phase = status.get("phase") if isinstance(status, Mapping) else None
        if rec.node or rec.key in assumed:
            c["scheduled"] += 1
        elif not rec.terminal:
            c["pending"] += 1
        if phase == "Running":
            c["running"] += 1
        elif phase == "Succeeded":
            c["succeeded"] += 1
        elif phase == "Failed":
            c["failed"] += 1
        if not c["owner"]:
            c["owner"] = _owners(rec.obj)
    return counts


def _owners(pod: Mapping[str, Any]) -> str:
    """scheduler-plugins' ``occupiedBy``: the pod's owners as ``namespace/name``, sorted, comma-joined."""
    meta = pod.get("metadata") if isinstance(pod, Mapping) else None
    refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
    if not isinstance(refs, list):
        return ""
    ns = meta.get("namespace") or "default"
    return ",".join(sorted(f"{ns}/{r['name']}" for r in refs if isinstance(r, Mapping) and r.get("name")))


def scheduler_plugins_phase(min_member: int, c: Mapping[str, int]) -> str:
    """A scheduler-plugins PodGroup's phase from its members' counts (its PodGroup controller's rules).

    ``Finished``: ``succeeded >= minMember``; ``Failed``: some failed and ``failed + running + succeeded >=
    minMember``; ``Running``: ``running + succeeded >= minMember``; ``Scheduled``: ``scheduled >= minMember``
    (bound or being bound, not all running yet); else ``Pending`` (no members, or fewer than minMember placed).
    """
    if c.get("pods", 0) == 0:
        return "Pending"
    running, succeeded, failed = c.get("running", 0), c.get("succeeded", 0), c.get("failed", 0)
    if succeeded >= min_member:
        return "Finished"
    if failed and failed + running + succeeded >= min_member:
        return "Failed"
    if running + succeeded >= min_member:
        return "Running"
    if c.get("scheduled", 0) >= min_member:
        return "Scheduled"
    return "Pending"


def volcano_phase(min_member: int, c: Mapping[str, int], current: str = "") -> str:
    """A Volcano PodGroup's phase from its members' counts (Volcano's scheduler session rules).

    ``Running``: at least minMember members placed (bound, being bound, running or finished), not all of them
    finished; ``Completed``: as many and every placed member finished (``Succeeded``/``Failed``); else
    ``Inqueue`` when all minMember members exist and wait for GPUs (gpupool admits a gang as soon as it is
    whole: Volcano's enqueue step), or when the group is ``Inqueue`` already (``current``); else ``Pending``.
    """
    scheduled = c.get("scheduled", 0)
    if scheduled >= min_member and scheduled > 0:
        done = c.get("succeeded", 0) + c.get("failed", 0)
        return "Completed" if done >= scheduled else "Running"
    if current == "Inqueue" or (c.get("pods", 0) > 0 and scheduled + c.get("pending", 0) >= min_member):
        return "Inqueue"
    return "Pending"


def pod_group_statuses(model: Any) -> dict[Ref, dict[str, Any]]:
    """What each PodGroup's ``status`` should say now, by ``(kind, "namespace/name")``.

    ``kind``: ``"podgroups"`` (scheduler-plugins, ``scheduling.x-k8s.io/v1alpha1``) or ``"volcanopodgroups"``
    (Volcano, ``scheduling.volcano.sh/v1beta1``). Members are the pods naming the group (scheduler-plugins'
    label, Volcano's or KAI's annotation), finished ones included. Counts, in pods: ``scheduled`` (bound, or
    placed by gpupool and being bound; scheduler-plugins only), ``running`` / ``succeeded`` / ``failed`` (pod
    phase). ``phase``: :func:`scheduler_plugins_phase` / :func:`volcano_phase`; ``Unknown`` when the group's
    spec cannot be read. scheduler-plugins' ``occupiedBy`` (the members' owners) is set when known and the
    group has none.
    """
    out: dict[Ref, dict[str, Any]] = {}
    stores = model.pod_groups
    if not any(stores.get(k) for k in (PODGROUPS, VOLCANO_PODGROUPS)):
        return out
    counts = _members(model)
    empty: dict[str, Any] = {"pods": 0, "scheduled": 0, "running": 0, "succeeded": 0, "failed": 0, "pending": 0,
                             "owner": ""}
    for kind in (PODGROUPS, VOLCANO_PODGROUPS):
        for key, obj in (stores.get(kind) or {}).items():
            try:
                gkey, min_member = parse_pod_group(obj)
            except RequestParseError:
                gkey, min_member = key, None
            except Exception:  # noqa: BLE001 - one unreadable PodGroup never stops the rest
                gkey, min_member = key, None
            c = counts.get(gkey, empty)
            current = obj.get("status") if isinstance(obj, Mapping) else None
            current = current if isinstance(current, Mapping) else {}
            st: dict[str, Any] = {"running": c["running"], "succeeded": c["succeeded"], "failed": c["failed"]}
            if kind == PODGROUPS:
                st["scheduled"] = c["scheduled"]
                st["phase"] = "Unknown" if min_member is None else scheduler_plugins_phase(min_member, c)
                if c["owner"] and not current.get("occupiedBy"):
                    st["occupiedBy"] = c["owner"]
            else:
                st["phase"] = ("Unknown" if min_member is None
                               else volcano_phase(min_member, c, str(current.get("phase") or "")))
            out[(kind, gkey)] = st
    return out


# ------------------------------------------------------------------ the writer
def _rfc3339_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _default_log(level: int, event: str, **fields: Any) -> None:
    if _logger.isEnabledFor(level):
        _logger.log(level, event, extra={"event": event, **fields})


def _rv(obj: Any) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def _status_of(obj: Any) -> Mapping[str, Any]:
    st = obj.get("status") if isinstance(obj, Mapping) else None
    return st if isinstance(st, Mapping) else {}


class StatusWriter:
    """Writes Queue and PodGroup statuses through the ``status`` subresource (JSON merge patch).

    ``api_client``: a ``kubernetes.client.ApiClient``. ``submit(fn)``: runs ``fn`` (no arguments) off the
    scheduling thread, e.g. a ``ThreadPoolExecutor``'s ``submit``; a ``RuntimeError`` from it (pool shut down)
    drops the round. ``interval_s``: seconds between two rounds at least (0 or less: never write).
    ``log(level, event, **fields)``: structured logging (default: logger ``gpupool.k8s.status``).
    ``timeout_s``: seconds per PATCH. ``queues`` / ``pod_groups``: which kinds to write (turn ``pod_groups`` off
    where scheduler-plugins' or Volcano's own controller writes PodGroup status). ``clock``: monotonic seconds;
    ``now``: the RFC 3339 time stamped on a condition that changes status.

    :meth:`update` is called from the scheduling thread (once per cycle is fine: within ``interval_s`` of the last
    round it returns at once and leaves a round due, which :meth:`due_in` tells the caller to come back for). Per
    object it sends only the owned fields that differ from the base, where the base is what it wrote last while the
    watch has not shown a newer object, else the status the object carries (so a new leader, or a status another
    writer changed, is compared with what the API holds). A field it owns and no
    longer computes (e.g. ``fairShareGPUs`` once the pool is off) is cleared with ``null``. A ``404`` (object
    gone) or ``403`` (no grant) is logged at DEBUG and not retried until the object's resourceVersion changes;
    other failures are retried the next round. At most one PATCH per object is in flight.
    """

    def __init__(self, api_client: Any, submit: Callable[[Callable[[], None]], Any], interval_s: float = 0.5,
                 log: Callable[..., None] | None = None, *, timeout_s: float = 10.0, queues: bool = True,
                 pod_groups: bool = True, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], str] = _rfc3339_now) -> None:
        self.api_client = api_client
        self.submit = submit
        self.interval_s = interval_s
        self.log = log or _default_log
        self.timeout_s = timeout_s
        self.kinds = tuple(k for k, on in ((QUEUES, queues), (PODGROUPS, pod_groups), (VOLCANO_PODGROUPS, pod_groups))
                           if on)
        self.clock = clock
        self.now = now
        self._at = -1e18
        self._due: float | None = None  # a round was asked for within interval_s of the last: when it is due
        self._lock = threading.Lock()
        # ref -> (status as last written, resourceVersion of the object when it was computed)
        self._sent: dict[Ref, tuple[dict[str, Any], str]] = {}
        self._blocked: dict[Ref, str] = {}  # ref -> resourceVersion at a 404/403: not retried until it changes
        self._inflight: set[Ref] = set()
        self.writes = 0  # PATCHes that succeeded
        self.failures = 0  # PATCHes that failed

    # -- what to send
    def _objects(self, model: Any, kind: str) -> Mapping[str, Any]:
        if kind == QUEUES:
            return model.queues or {}
        return model.pod_groups.get(kind) or {}

    def desired(self, model: Any, fair_shares: Mapping[str, float] | None = None) -> dict[Ref, dict[str, Any]]:
        """Every object's status as computed now, by ref (without ``lastTransitionTime``)."""
        out: dict[Ref, dict[str, Any]] = {}
        if QUEUES in self.kinds:
            out.update(((QUEUES, name), st) for name, st in queue_statuses(model, fair_shares).items())
        if PODGROUPS in self.kinds:
            out.update((ref, st) for ref, st in pod_group_statuses(model).items() if ref[0] in self.kinds)
        return out

    def _patch(self, kind: str, base: Mapping[str, Any], want: dict[str, Any], stamp: str) -> dict[str, Any]:
        """The merge patch taking ``base`` to ``want`` (``want``'s conditions get their lastTransitionTime)."""
        if "conditions" in want:
            before = {c.get("type"): c for c in base.get("conditions") or [] if isinstance(c, Mapping)}
            conds = []
            for cond in want["conditions"]:
                cond = dict(cond)
                old = before.get(cond.get("type"))
                same = old is not None and old.get("status") == cond["status"]
                cond["lastTransitionTime"] = (old.get("lastTransitionTime") if same else None) or stamp
                conds.append(cond)
            want["conditions"] = conds
        patch: dict[str, Any] = {k: v for k, v in want.items() if base.get(k) != v}
        for field in OWNED_FIELDS[kind]:
            if field not in want and base.get(field) is not None:
                patch[field] = None
        return patch

    def update(self, model: Any, fair_shares: Mapping[str, float] | None = None, force: bool = False) -> int:
        """One round (scheduling thread): compute, compare, submit the PATCHes. Returns how many were submitted.

        ``fair_shares``: GPUs per Queue name from the pool scheduler (None: not known, ``fairShareGPUs`` left
        out and cleared where it was written). ``force``: do not wait for ``interval_s`` to pass (still nothing when
        ``interval_s`` is 0 or less).
        """
        if self.interval_s <= 0:
            return 0
        t = self.clock()
        if not force and t - self._at < self.interval_s:
            self._due = self._at + self.interval_s  # coalesced, never skipped: the caller comes back (due_in)
            return 0
        self._at = t
        self._due = None
        want = self.desired(model, fair_shares)
        stamp = self.now()
        jobs: list[tuple[Ref, dict[str, Any], dict[str, Any], str]] = []
        with self._lock:
            for ref in [r for r in self._sent if r not in want]:
                del self._sent[ref]
            for ref in [r for r in self._blocked if r not in want]:
                del self._blocked[ref]
            for ref, st in want.items():
                kind, key = ref
                obj = self._objects(model, kind).get(key)
                rv = _rv(obj)
                if ref in self._inflight:
                    self._due = t + self.interval_s  # compared again once that write is done
                    continue
                if ref in self._blocked and self._blocked[ref] == rv:
                    continue
                self._blocked.pop(ref, None)
                sent = self._sent.get(ref)
                base = sent[0] if sent is not None and sent[1] == rv else _status_of(obj)
                full = dict(st)
                patch = self._patch(kind, base, full, stamp)
                if not patch:
                    self._sent[ref] = (full, rv)
                    continue
                self._inflight.add(ref)
                jobs.append((ref, patch, full, rv))
        if not jobs:
            return 0

        def write() -> None:
            for ref, patch, full, rv in jobs:
                self._write(ref, patch, full, rv)

        try:
            self.submit(write)
        except RuntimeError:  # the pool is shut down (stopping)
            with self._lock:
                self._inflight.difference_update(ref for ref, *_ in jobs)
            return 0
        return len(jobs)

    def _write(self, ref: Ref, patch: dict[str, Any], full: dict[str, Any], rv: str) -> None:
        kind, key = ref
        if kind == QUEUES:
            params = {"name": key}
        else:
            ns, name = key.split("/", 1)
            params = {"namespace": ns, "name": name}
        try:
            call(self.api_client, "PATCH", STATUS_PATHS[kind], {"status": patch}, content_type=MERGE_PATCH,
                        timeout=self.timeout_s, path_params=params)
        except Exception as exc:  # status is best effort
            code = getattr(exc, "status", None)
            with self._lock:
                self._inflight.discard(ref)
                self.failures += 1
                if code in (403, 404):
                    self._blocked[ref] = rv
            self.log(logging.DEBUG, "status_write_failed", kind=kind, object=key, code=code,
                     error=type(exc).__name__, detail=str(exc)[:200])
            return
        with self._lock:
            self._inflight.discard(ref)
            self.writes += 1
            # until the watch shows a newer object than the one at rv (ours, or later), compare with what was sent
            self._sent[ref] = (full, rv)
        self.log(logging.DEBUG, "status_written", kind=kind, object=key, fields=sorted(patch))

    def due_in(self) -> float | None:
        """Seconds until the round :meth:`update` deferred is due (0 when it is due now), None when none waits.

        A call of :meth:`update` within ``interval_s`` of the last round (a change soon after a write), or a round
        that found an object's PATCH still in flight, leaves a round due at ``last + interval_s``: the caller
        calls :meth:`update` again then (the scheduler's loop wakes for it), so a change is written at most
        ``interval_s`` after it, however rarely anything else happens."""
        due = self._due
        if due is None or self.interval_s <= 0:
            return None
        return max(0.0, due - self.clock())

    # -- introspection (tests, metrics)
    def sent(self, kind: str, key: str) -> dict[str, Any] | None:
        """The status last written (or found right) for ``(kind, key)``; None if none."""
        with self._lock:
            entry = self._sent.get((kind, key))
        return None if entry is None else entry[0]


__all__ = ["StatusWriter", "queue_statuses", "pod_group_statuses", "scheduler_plugins_phase", "volcano_phase",
           "OWNED_FIELDS", "STATUS_PATHS"]
