"""A cluster snapshot (Nodes, Pods, PodGroups, Queues) and the planning cycle run on it.

:func:`plan` is one scheduling cycle with no I/O: it builds the engine's state from the snapshot (every
bound pod counted), reads the pending pods that name gpupool's scheduler, groups gangs, checks queue
limits, and places pods with the engine: singles with :meth:`Engine.place`, gangs all or nothing with
:func:`~gpupool.engine.statement.place_gang`. The live scheduler (:mod:`gpupool.k8s.scheduler`) runs it
on its watch cache every cycle and carries out the result; ``gpupool scheduler --dry-run --snapshot FILE``
runs it on a file that ``kubectl get nodes,pods,podgroups,queues -A -o yaml`` (or ``-o json``) wrote.

Order: higher ``spec.priority`` first, then older pods; a gang goes at the place of its best member.
Pods gpupool cannot read get ``node: None`` and the parse error as their reason; nothing else changes.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.engine.statement import place_gang
from gpupool.k8s import POD_GROUP_API, QUEUE_API, VOLCANO_POD_GROUP_API
from gpupool.k8s.inventory import (
    ConstrainedRequest,
    Constraints,
    Eligibility,
    InventoryInfo,
    NoUsableNodeError,
    build_state,
    constraints_of,
)
from gpupool.k8s.requests import (
    PodInfo,
    QueueSpec,
    RequestParseError,
    describe_pod,
    is_terminal,
    is_waiting_for,
    node_name_of,
    object_key,
    parse_pod_group,
    parse_queue,
    pod_key,
    spec_unreadable,
)
from gpupool.model import MILLI, Assignment, GpupoolError
from gpupool.policies import DEFAULT_POLICY, make_policy

log = logging.getLogger("gpupool.k8s.snapshot")


class SnapshotError(GpupoolError, ValueError):
    """A snapshot file gpupool cannot read."""


# ------------------------------------------------------------------ the snapshot
@dataclass
class ClusterSnapshot:
    """Objects as the API returns them (dicts). ``queues`` None: the Queue CRD is not installed (no limits)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    pod_groups: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] | None = None
    ignored: int = 0


def _group(obj: Mapping[str, Any]) -> str:
    api = str(obj.get("apiVersion") or "")
    return api.rsplit("/", 1)[0] if "/" in api else ""


def _flatten(docs: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, list):
            yield from _flatten(doc)
        elif isinstance(doc, Mapping) and isinstance(doc.get("items"), list) and (
            doc.get("kind") in (None, "List") or str(doc.get("kind", "")).endswith("List")
        ):
            list_kind = str(doc.get("kind", ""))
            for item in doc["items"]:
                typed_list = list_kind.endswith("List") and list_kind != "List"
                if isinstance(item, Mapping) and "kind" not in item and typed_list:
                    item = {**item, "kind": list_kind[: -len("List")], "apiVersion": doc.get("apiVersion", "v1")}
                yield from _flatten([item])
        elif isinstance(doc, Mapping):
            yield doc


def snapshot_from_objects(objects: Iterable[Any]) -> ClusterSnapshot:
    """Sort API objects (or ``v1/List`` documents holding them) into a :class:`ClusterSnapshot`."""
    snap = ClusterSnapshot()
    queues: list[dict[str, Any]] = []
    for obj in _flatten(objects):
        kind, group = obj.get("kind"), _group(obj)
        if kind == "Node" and group == "":
            snap.nodes.append(dict(obj))
        elif kind == "Pod" and group == "":
            snap.pods.append(dict(obj))
        elif kind == "PodGroup" and group in (POD_GROUP_API[0], VOLCANO_POD_GROUP_API[0]):
            snap.pod_groups.append(dict(obj))
        elif kind == "Queue" and group == QUEUE_API[0]:
            queues.append(dict(obj))
        else:
            snap.ignored += 1
    snap.queues = queues or None
    return snap


def load_snapshot(path: str | Path) -> ClusterSnapshot:
    """Read a ``kubectl get ... -o yaml`` / ``-o json`` file (a ``v1/List``, several YAML documents, or one object)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"{p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                            "kubectl writes UTF-8") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            docs: list[Any] = [json.loads(text)]
        else:
            docs = list(yaml.safe_load_all(text))
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{p}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise SnapshotError(f"{p}: {where}invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    except (ValueError, RecursionError) as exc:  # e.g. a YAML value PyYAML cannot construct
        raise SnapshotError(f"{p}: unreadable: {exc}") from None
    if not any(isinstance(d, Mapping | list) for d in docs):
        raise SnapshotError(f"{p}: no Kubernetes objects found")
    snap = snapshot_from_objects(docs)
    if not snap.nodes and not snap.pods:
        raise SnapshotError(f"{p}: no Node or Pod objects found (expected kubectl -o yaml/-o json output)")
    return snap


# ------------------------------------------------------------------ queues (seam for the pool layer)
class QueueBook:
    """GPU use per gpupool Queue (milli-GPU, a queue's use includes its children's) and the limit check.

    The pool layer's quota / fair-share logic can replace :meth:`admit`; the planner only asks it
    whether a unit of pods may start, and tells it with :meth:`charge` what started.
    """

    def __init__(self, specs: Mapping[str, QueueSpec], errors: Mapping[str, str] | None = None,
                 known: bool = True) -> None:
        self.specs = dict(specs)
        self.errors = dict(errors or {})
        self.known = known  # False: no Queue CRD; queue names are not checked and nothing is limited
        self.used: dict[str, int] = {}

    def chain(self, queue: str) -> list[str]:
        out, seen = [], set()
        q: str | None = queue
        while q and q not in seen and q in self.specs:
            seen.add(q)
            out.append(q)
            q = self.specs[q].parent or None
        return out

    def charge(self, queue: str | None, milli: int) -> None:
        if queue:
            for q in self.chain(queue) or [queue]:
                self.used[q] = self.used.get(q, 0) + milli

    def admit(self, demands: Mapping[str, int]) -> str:
        """Why ``demands`` ({queue: milli}) would break a queue's (or a parent's) limit; "" if they fit."""
        if not self.known:
            return ""
        extra: dict[str, int] = {}
        for queue, milli in demands.items():
            if queue in self.errors:
                return f"queue {queue}: {self.errors[queue]}"
            if queue not in self.specs:
                return f"queue {queue} not found (no Queue {queue} in group {QUEUE_API[0]})"
            for q in self.chain(queue):
                extra[q] = extra.get(q, 0) + milli
        for q, milli in extra.items():
            limit = self.specs[q].limit_milli
            if limit is not None and self.used.get(q, 0) + milli > limit:
                return (f"queue {q} would exceed its limit: {_gpus(self.used.get(q, 0))} of {_gpus(limit)} GPU "
                        f"in use, {_gpus(milli)} more asked")
        return ""


def _gpus(milli: int) -> str:
    return f"{milli / MILLI:g}"


def queue_book(queues: Sequence[Mapping[str, Any]] | None) -> QueueBook:
    if queues is None:
        return QueueBook({}, known=False)
    specs: dict[str, QueueSpec] = {}
    errors: dict[str, str] = {}
    for obj in queues:
        name = str(object_key(obj).split("/", 1)[1])
        try:
            specs[name] = parse_queue(obj)
        except RequestParseError as exc:
            errors[name] = str(exc)
        except Exception as exc:  # noqa: BLE001 - one unreadable Queue never stops the cycle
            errors[name] = f"Queue {name}: invalid object: {type(exc).__name__}: {exc}"
    return QueueBook(specs, errors)


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True, slots=True)
class Placement:
    """Where one pending pod goes (``node`` None: it stays pending, ``reason`` says why)."""

    pod: str
    node: str | None
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    reason: str = ""
    gpu_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    gang: str | None = None
    invalid: bool = False  # the pod's request could not be read (not a matter of capacity)

    def to_json(self) -> dict[str, Any]:
        return {"pod": self.pod, "node": self.node, "gpus": list(self.gpus), "gpu_milli": self.gpu_milli,
                "reason": self.reason}


@dataclass
class Plan:
    """The outcome of :func:`plan`: a :class:`Placement` per pending pod, in the order they were decided.

    ``state`` is the engine's state after the placements (None when there was nothing to do or no node);
    ``queues`` the queue book after them.
    """

    placements: list[Placement]
    inventory: InventoryInfo | None
    policy: str
    state: ClusterState | None = None
    queues: QueueBook | None = None
    skipped_nodes: dict[str, str] = field(default_factory=dict)

    @property
    def placed(self) -> list[Placement]:
        return [p for p in self.placements if p.node is not None]

    @property
    def skipped(self) -> list[dict[str, str]]:
        """Nodes left out (``{"node", "reason"}``) and bound pods not (fully) counted (``{"pod", "reason"}``)."""
        nodes = dict(self.skipped_nodes)
        pods: dict[str, str] = {}
        if self.inventory is not None:
            nodes.update(self.inventory["skipped_nodes"])
            pods = self.inventory["skipped_pods"]
        return ([{"node": n, "reason": r} for n, r in nodes.items()]
                + [{"pod": k, "reason": r} for k, r in pods.items()])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"placements": [p.to_json() for p in self.placements]}
        skipped = self.skipped
        if skipped:
            out["skipped"] = skipped
        return out


UNSUPPORTED = "gpupool does not support"


def unsupported_constraint(pod: Mapping[str, Any]) -> str:
    """Why gpupool must not place ``pod`` (a hard constraint it does not evaluate), or ""."""
    spec = pod.get("spec") or {}
    aff = spec.get("affinity") or {}
    for kind in ("podAffinity", "podAntiAffinity"):
        if (aff.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution"):
            return f"{UNSUPPORTED} required {kind} (spec.affinity.{kind}); use the default scheduler for this pod"
    for i, tsc in enumerate(spec.get("topologySpreadConstraints") or []):
        if tsc.get("whenUnsatisfiable", "DoNotSchedule") == "DoNotSchedule":
            return (f"{UNSUPPORTED} spec.topologySpreadConstraints[{i}] with whenUnsatisfiable=DoNotSchedule; "
                    "use ScheduleAnyway or the default scheduler")
    return ""


@dataclass
class _Unit:
    members: list[tuple[dict[str, Any], PodInfo]]
    gang: str | None = None
    need: int = 0

    def order(self) -> tuple:
        best = min((-i.request.priority, i.request.creation_time or 0.0, i.key) for _, i in self.members)
        return best


def _success_reason(policy: str, a: Assignment, feasible: int, gang: str | None, mig: Sequence[tuple[str, int]]
                    ) -> str:
    parts = [f"policy {policy} chose {a.node_name} among {feasible} feasible node(s)"]
    if a.gpus:
        memory = f", {a.gpu_memory_mib} MiB" if a.gpu_memory_mib else ""
        parts.append(f"GPU {','.join(map(str, a.gpus))} at {a.gpu_milli} milli{memory} each")
    if mig:
        parts.append("MIG " + ", ".join(f"{c}x {p}" for p, c in mig))
    if gang:
        parts.append(f"gang {gang} placed together")
    return "; ".join(parts)


def plan(snapshot: ClusterSnapshot, scheduler_name: str = "gpupool", policy: str = DEFAULT_POLICY,
         seed: int = 0, prepare_state: Callable[[ClusterState], Any] | None = None,
         describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod) -> Plan:
    """One scheduling cycle on ``snapshot``: a :class:`Placement` for every pending pod of ``scheduler_name``.

    ``prepare_state`` runs on the state before any placement (e.g. GPU health from telemetry:
    :meth:`gpupool.k8s.telemetry.GpuTelemetry.apply_health`). ``describe`` reads a pod (the live
    scheduler passes a cache of :func:`~gpupool.k8s.requests.describe_pod` keyed by UID and resourceVersion).
    """
    # A pod whose spec is not even a mapping cannot say which scheduler it names: it is reported, not dropped.
    pending_pods = [p for p in snapshot.pods if isinstance(p, Mapping) and (
        is_waiting_for(p, scheduler_name) or (spec_unreadable(p) and not is_terminal(p)))]
    out: list[Placement] = []
    if not pending_pods:
        return Plan(out, None, policy)
    try:
        state, inv = build_state(snapshot.nodes, snapshot.pods, describe)
    except ValueError as exc:
        skipped = exc.skipped_nodes if isinstance(exc, NoUsableNodeError) else {}
        return Plan([Placement(pod_key(p), None, reason=f"0/0 nodes are available: {exc}")
                     for p in pending_pods], None, policy, skipped_nodes=skipped)
    if prepare_state is not None:
        prepare_state(state)

    # Read every pending pod; a pod that cannot be read (or is not the only one of its name) fails alone.
    bound_to = {pod_key(p): node_name_of(p) for p in snapshot.pods
                if isinstance(p, Mapping) and node_name_of(p) and not is_terminal(p)}
    pending_count: dict[str, int] = {}
    for pod in pending_pods:
        pending_count[pod_key(pod)] = pending_count.get(pod_key(pod), 0) + 1
    infos: list[tuple[dict[str, Any], PodInfo]] = []
    constraints: dict[str, Constraints] = {}
    for pod in pending_pods:
        key = pod_key(pod)
        why = _identity_problem(pod, key, pending_count, bound_to)
        if why:
            out.append(Placement(key, None, reason=f"pod {key}: {why}", invalid=True))
            continue
        try:
            info = describe(pod)
            why = unsupported_constraint(pod)
            if not why:
                constraints[info.key] = constraints_of(pod, info.mig)
        except RequestParseError as exc:
            out.append(Placement(key, None, reason=str(exc), invalid=True))
            continue
        except Exception as exc:  # noqa: BLE001 - one unreadable pod never stops the cycle
            log.warning("pod unreadable", exc_info=True, extra={"event": "pod_invalid", "pod": key})
            out.append(Placement(key, None, reason=f"pod {key}: invalid object: {type(exc).__name__}: {exc}",
                                 invalid=True))
            continue
        if why:
            out.append(Placement(key, None, reason=f"pod {key}: {why}", invalid=True))
            continue
        infos.append((pod, info))

    # Gangs.
    groups: dict[str, int] = {}
    group_errors: dict[str, str] = {}
    for obj in snapshot.pod_groups:
        try:
            gkey, min_member = parse_pod_group(obj)
        except RequestParseError as exc:
            group_errors[object_key(obj)] = str(exc)
            continue
        except Exception as exc:  # noqa: BLE001 - one unreadable PodGroup never stops the cycle
            gkey = object_key(obj)
            group_errors[gkey] = f"PodGroup {gkey}: invalid object: {type(exc).__name__}: {exc}"
            continue
        groups.setdefault(gkey, min_member)
    scheduled_in: dict[str, int] = {}
    for pinfo in inv["pods"].values():
        if pinfo.pod_group:
            scheduled_in[pinfo.pod_group] = scheduled_in.get(pinfo.pod_group, 0) + 1
    units: list[_Unit] = []
    gangs: dict[str, _Unit] = {}
    for pod, info in infos:
        if info.pod_group is None:
            units.append(_Unit([(pod, info)]))
        else:
            gangs.setdefault(info.pod_group, _Unit([], info.pod_group)).members.append((pod, info))
    for gkey, unit in gangs.items():
        declared = [i.min_member for _, i in unit.members if i.min_member]
        min_member = groups.get(gkey) or (max(declared) if declared else None)
        reason = ""
        if gkey in group_errors:
            reason = group_errors[gkey]
        elif min_member is None:
            reason = (f"PodGroup {gkey} not found (create a PodGroup with spec.minMember, "
                      "or annotate the pods with gpupool.io/min-member)")
        else:
            done = scheduled_in.get(gkey, 0)
            unit.need = max(0, min_member - done)
            if len(unit.members) < unit.need:
                reason = (f"gang {gkey}: {len(unit.members)} pod(s) pending and {done} scheduled of minMember "
                          f"{min_member}; waiting for the rest")
        if reason:
            out.extend(Placement(i.key, None, reason=reason, gang=gkey) for _, i in unit.members)
        else:
            unit.members.sort(key=lambda m: (-m[1].request.priority, m[1].request.creation_time or 0.0, m[1].key))
            units.append(unit)

    # Queues.
    book = queue_book(snapshot.queues)
    for pinfo in inv["pods"].values():
        book.charge(pinfo.queue, pinfo.gpu_milli_total)

    # The engine, with node eligibility (selectors, taints, cordons, MIG counts) as extra filters.
    elig = Eligibility(state, inv["nodes"], inv["mig_capacity"], inv["mig_used"])
    for unit in units:
        for _, info in unit.members:
            if info.mig:
                elig.pending_mig[info.key] = info.mig
    pol = make_policy(policy)
    pol.filters = tuple(elig.filters) + tuple(pol.filters)
    base_effective = pol.effective

    def effective(req):
        e = base_effective(req)
        return ConstrainedRequest(e.requested, e.gpu_milli, constraints.get(req.name, Constraints()))

    pol.effective = effective  # type: ignore[method-assign]
    workload = [i.request for i in inv["pods"].values()] + [i.request for _, i in infos]
    engine = Engine(state, pol, seed=seed, workload=workload if len(workload) >= 50 else None)

    for unit in sorted(units, key=_Unit.order):
        try:
            out.extend(_place_unit(unit, engine, pol, book, policy))
        except Exception as exc:  # noqa: BLE001 - a unit that trips the engine fails alone
            log.error("placement failed", exc_info=True, extra={"event": "placement_error",
                                                                 "pods": [i.key for _, i in unit.members]})
            out.extend(Placement(i.key, None, reason=f"gpupool could not place this pod: {type(exc).__name__}: {exc}",
                                 gang=unit.gang) for _, i in unit.members)
    return Plan(out, inv, policy, state, book)


def _identity_problem(pod: Mapping[str, Any], key: str, pending_count: Mapping[str, int],
                      bound_to: Mapping[str, str]) -> str:
    """Why a pending pod cannot be told apart from others (no name, or a name another pod has too), or ""."""
    meta = pod.get("metadata")
    name = meta.get("name") if isinstance(meta, Mapping) else None
    namespace = meta.get("namespace") if isinstance(meta, Mapping) else None
    if not isinstance(name, str) or not name:
        return ("invalid object: metadata.name is missing" if name is None or name == "" else
                f"invalid object: metadata.name: expected a string, got {type(name).__name__} {name!r}")
    if namespace is not None and not isinstance(namespace, str):
        return f"invalid object: metadata.namespace: expected a string, got {type(namespace).__name__}"
    if pending_count.get(key, 0) > 1:
        return (f"duplicate pod: {pending_count[key]} pending pods are named {key} in the snapshot; "
                "none of them is placed")
    if key in bound_to:
        return f"duplicate pod: a pod named {key} is already bound to node {bound_to[key]}"
    return ""


def _place_unit(unit: _Unit, engine: Engine, pol: Any, book: QueueBook, policy: str) -> list[Placement]:
    """Place one unit (a single pod, or a gang all or nothing) within its queues' limits."""
    demands: dict[str, int] = {}
    for _, info in unit.members:
        if info.queue:
            demands[info.queue] = demands.get(info.queue, 0) + info.gpu_milli_total
    refused = book.admit(demands)
    if refused:
        return [Placement(i.key, None, reason=refused, gang=unit.gang) for _, i in unit.members]
    if unit.gang is None:
        _, info = unit.members[0]
        feasible = int(engine.feasible_mask(pol.effective(info.request)).sum())
        decision = engine.place(info.request)
        if decision.assignment is None:
            return [Placement(info.key, None, reason=decision.reason)]
        placed = {info.key: (decision.assignment, feasible)}
    else:
        feasible_of = {i.key: int(engine.feasible_mask(pol.effective(i.request)).sum()) for _, i in unit.members}
        assignments, reason = place_gang(engine, [i.request for _, i in unit.members], unit.need)
        if not assignments and unit.need > 0:
            return [Placement(i.key, None, reason=f"gang {unit.gang} cannot be placed together: {reason}",
                              gang=unit.gang) for _, i in unit.members]
        placed = {a.pod: (a, feasible_of[a.pod]) for a in assignments}
    out: list[Placement] = []
    for _, info in unit.members:
        if info.key not in placed:
            why = engine.schedule(info.request).reason or "no room"
            out.append(Placement(info.key, None, reason=f"gang {unit.gang} has its minMember without this pod; "
                                 f"this pod waits: {why}", gang=unit.gang))
            continue
        a, feasible_n = placed[info.key]
        book.charge(info.queue, info.gpu_milli_total)
        out.append(Placement(
            info.key, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
            _success_reason(policy, a, feasible_n, unit.gang, info.mig), a.gpu_memory_mib, info.mig, unit.gang,
        ))
    return out


def format_plan(result: Plan) -> str:
    """A plain-text table of a plan (one line per pod)."""
    rows = [("POD", "NODE", "GPUS", "MILLI", "REASON")]
    for p in result.placements:
        rows.append((p.pod, p.node or "-", ",".join(map(str, p.gpus)) or "-", str(p.gpu_milli) if p.node else "-",
                     p.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(4)) + "  " + r[4] for r in rows]
    for item in result.skipped:
        what = f"node {item['node']}" if "node" in item else f"bound pod {item['pod']}"
        lines.append(f"skipped {what}: {item['reason']}")
    placed = len(result.placed)
    lines.append(f"{placed} of {len(result.placements)} pending pod(s) placed (policy {result.policy}; dry run, "
                 "nothing bound)")
    return "\n".join(lines)


__all__ = ["ClusterSnapshot", "SnapshotError", "Placement", "Plan", "QueueBook", "load_snapshot",
           "snapshot_from_objects", "plan", "format_plan", "queue_book", "unsupported_constraint"]
