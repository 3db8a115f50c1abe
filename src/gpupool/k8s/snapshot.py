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
    InventoryInfo,
)
from gpupool.k8s.requests import (
    PodInfo,
    QueueSpec,
    RequestParseError,
    describe_pod,
    object_key,
    parse_queue,
)
from gpupool.model import MILLI, Assignment, GpupoolError
from gpupool.policies import DEFAULT_POLICY

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
    objects = list(objects)
    # `kubectl get queues.gpupool.io -o yaml` on a cluster with the CRD and no Queue writes an empty QueueList:
    # the CRD is installed (pods naming a queue wait), which a file without it cannot say
    queue_crd = any(isinstance(d, Mapping) and d.get("kind") == "QueueList"
                    and str(d.get("apiVersion", "")).startswith(QUEUE_API[0] + "/") for d in objects)
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
    snap.queues = queues or ([] if queue_crd else None)
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
                 known: bool = True, blocked: str = "") -> None:
        self.specs = dict(specs)
        self.errors = dict(errors or {})
        self.known = known  # False: no Queue CRD; queue names are not checked and nothing is limited
        self.blocked = blocked  # why Queues cannot be read (403): pods of a queue wait, no limit is skipped
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
        if self.blocked and demands:
            return (f"queue {next(iter(demands))}: Queue objects cannot be read ({self.blocked}); pods of a queue "
                    "wait until they can, so that no limit is skipped")
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
    nominated: bool = False  # held on ``node`` while preemption victims terminate: set nominatedNodeName, no bind
    waited_s: float | None = None  # seconds since the preemption that made room for it (None: no preemption)

    def to_json(self) -> dict[str, Any]:
        """``gpu_milli`` and ``gpu_memory_mib`` are per listed GPU (MiB; 0 = in proportion to the share);
        ``annotations``: what the live scheduler writes on the pod when it binds it."""
        out: dict[str, Any] = {"pod": self.pod, "node": self.node, "gpus": list(self.gpus),
                               "gpu_milli": self.gpu_milli, "gpu_memory_mib": self.gpu_memory_mib,
                               "reason": self.reason}
        if self.mig:
            out["mig"] = {p: c for p, c in self.mig}
        if self.gang:
            out["gang"] = self.gang
        if self.invalid:
            out["invalid"] = True
        if self.nominated:
            out["nominated"] = True
        if self.node is not None:
            from gpupool.k8s.scheduler import assignment_annotations  # the one spelling of what is written

            out["annotations"] = assignment_annotations(self)
        return out


@dataclass
class Preemption:
    """Pods to evict so that a waiting job can start: all or nothing (the pool's victim solver chose them).

    * ``id``: unique per model; outcomes are reported back by it
      (:meth:`~gpupool.k8s.state.ClusterModel.preemption_refused`);
    * ``action``: ``reclaim`` (a queue below its fair share takes GPUs back), ``preempt`` (a higher-order job
      of the same queue), ``shrink`` (an elastic job gives extra workers back), ``consolidate`` (moved to
      defragment);
    * ``preemptor``: the job that waits for the room (PodGroup key or pod key; "" when none);
    * ``reason``: the message for the victims' Event and ``DisruptionTarget`` condition;
    * ``victims``: ``(pod key, uid)`` to evict through the Eviction API;
    * ``nominated``: the preemptor's pods held on the victims' devices (``status.nominatedNodeName``);
    * ``grace_s``: the longest ``terminationGracePeriodSeconds`` among the victims (s).
    """

    id: int
    action: str
    preemptor: str
    reason: str
    victims: list[tuple[str, str]]
    nominated: list[Placement] = field(default_factory=list)
    grace_s: float = 30.0


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
    preemptions: list[Preemption] = field(default_factory=list)  # evictions to carry out (pool mode)
    denominated: list[str] = field(default_factory=list)  # pods whose nomination lapsed: clear nominatedNodeName

    @property
    def placed(self) -> list[Placement]:
        return [p for p in self.placements if p.node is not None and not p.nominated]

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
        out: dict[str, Any] = {"placements": [p.to_json() for p in self.placements],
                               "summary": {"policy": self.policy, "pending": len(self.placements),
                                           "placed": len(self.placed)}}
        if self.queues is not None and self.queues.known:
            out["queues"] = {name: {"used_gpus": self.queues.used.get(name, 0) / MILLI,
                                    "quota_gpus": q.quota_milli / MILLI,
                                    "limit_gpus": None if q.limit_milli is None else q.limit_milli / MILLI}
                             for name, q in sorted(self.queues.specs.items())}
        skipped = self.skipped
        if skipped:
            out["skipped"] = skipped
        if self.preemptions:
            out["preemptions"] = [{"id": p.id, "action": p.action, "preemptor": p.preemptor, "reason": p.reason,
                                   "victims": [k for k, _ in p.victims],
                                   "nominated": {n.pod: n.node for n in p.nominated}} for p in self.preemptions]
            out["summary"]["evictions"] = sum(len(p.victims) for p in self.preemptions)
            out["summary"]["nominated"] = sum(1 for p in self.placements if p.nominated)
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
         describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod, pool: Any = None) -> Plan:
    """One scheduling cycle on ``snapshot``: a :class:`Placement` for every pending pod of ``scheduler_name``.

    The snapshot's objects are fed to a :class:`~gpupool.k8s.state.ClusterModel` as the live scheduler's
    watch events are, and one cycle of it runs: the dry run and the live scheduler share one code path.
    ``prepare_state`` runs on the state before any placement (e.g. GPU health from telemetry:
    :meth:`gpupool.k8s.telemetry.GpuTelemetry.apply_health`). ``describe`` reads a pod. ``pool``: a
    :class:`~gpupool.engine.pool.PoolConfig` to plan as the live scheduler's pool mode does (queue fair share,
    reservations, reclaim and preemption: the plan then lists the evictions it would make), None for
    placement within queue limits only.
    """
    from gpupool.k8s.state import ClusterModel

    model = ClusterModel.from_snapshot(snapshot, scheduler_name=scheduler_name, policy=policy, seed=seed,
                                       describe=describe)
    if pool is not None:
        from gpupool.k8s.pool import PoolDriver

        PoolDriver(model, pool)
    return model.cycle(prepare_state, full_inventory=True)


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


def _charges(members: Sequence[tuple[Any, PodInfo]], state: ClusterState | None = None,
             assignments: Mapping[str, Assignment] | None = None) -> dict[str, int]:
    """{queue: milli-GPU} the members are charged: exact where placed (``assignments``), else a lower bound."""
    from gpupool.k8s.state import queue_charge

    out: dict[str, int] = {}
    for _, info in members:
        if info.queue:
            a = assignments.get(info.key) if assignments is not None else None
            out[info.queue] = out.get(info.queue, 0) + queue_charge(info, a, state)
    return out


def _place_unit(unit: _Unit, engine: Engine, pol: Any, book: QueueBook, policy: str,
                state: ClusterState | None = None) -> list[Placement]:
    """Place one unit (a single pod, or a gang) within its queues' limits.

    The limit check is exact: a pod is placed, charged what it occupies there (a memory-sized share as its
    memory's fraction of the GPU, :func:`gpupool.k8s.state.queue_charge`), and released again if that breaks
    a limit. A gang needs its minMember within the limits (all or nothing); members beyond the minimum are
    kept one by one, in order, while the limits hold.
    """
    state = engine.state if state is None else state
    minimum = unit.members[: max(1, unit.need)] if unit.gang is not None else unit.members
    refused = book.admit(_charges(minimum, state))  # a lower bound of the exact charge
    if refused:
        return [Placement(i.key, None, reason=refused, gang=unit.gang) for _, i in unit.members]
    feasible_of: dict[str, int] = {}
    if unit.gang is None:
        _, info = unit.members[0]
        feasible_of[info.key] = int(engine.feasible_mask(pol.effective(info.request)).sum())
        decision = engine.place(info.request)
        if decision.assignment is None:
            return [Placement(info.key, None, reason=decision.reason)]
        assignments = [decision.assignment]
    else:
        feasible_of = {i.key: int(engine.feasible_mask(pol.effective(i.request)).sum()) for _, i in unit.members}
        assignments, reason = place_gang(engine, [i.request for _, i in unit.members], unit.need)
        if not assignments and unit.need > 0:
            return [Placement(i.key, None, reason=f"gang {unit.gang} cannot be placed together: {reason}",
                              gang=unit.gang) for _, i in unit.members]
    by_key = {a.pod: a for a in assignments}
    info_of = {i.key: (p, i) for p, i in unit.members}
    kept: list[tuple[Any, PodInfo]] = []
    over: dict[str, str] = {}
    if unit.gang is not None and unit.need > 0:  # the minimum all at once, or nothing starts
        need = [info_of[a.pod] for a in assignments[: unit.need]]
        why = book.admit(_charges(need, state, by_key))
        if why:
            for b in reversed(assignments):
                engine.release(b.pod)
            return [Placement(i.key, None, reason=why, gang=unit.gang) for _, i in unit.members]
        kept = need
        for queue, milli in _charges(need, state, by_key).items():
            book.charge(queue, milli)
    for a in assignments[len(kept):]:  # then one by one, each charged as it is kept
        charge = _charges([info_of[a.pod]], state, by_key)
        why = book.admit(charge)
        if not why:
            kept.append(info_of[a.pod])
            for queue, milli in charge.items():
                book.charge(queue, milli)
            continue
        engine.release(a.pod)
        over[a.pod] = why
    placed = {i.key: by_key[i.key] for _, i in kept}
    out: list[Placement] = []
    for _, info in unit.members:
        if info.key in over:
            out.append(Placement(info.key, None, gang=unit.gang, reason=over[info.key] if unit.gang is None else
                                 f"gang {unit.gang} has its minMember without this pod; this pod waits: "
                                 f"{over[info.key]}"))
            continue
        if info.key not in placed:
            why = engine.schedule(info.request).reason or "no room"
            out.append(Placement(info.key, None, reason=f"gang {unit.gang} has its minMember without this pod; "
                                 f"this pod waits: {why}", gang=unit.gang))
            continue
        a = placed[info.key]
        out.append(Placement(
            info.key, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
            _success_reason(policy, a, feasible_of[info.key], unit.gang, info.mig), a.gpu_memory_mib, info.mig,
            unit.gang,
        ))
    return out


def format_plan(result: Plan) -> str:
    """A plain-text table of a plan (one line per pod)."""
    rows = [("POD", "NODE", "GPUS", "MILLI", "MIB", "REASON")]
    for p in result.placements:
        placed = p.node is not None and bool(p.gpus)
        rows.append((p.pod, p.node or "-", ",".join(map(str, p.gpus)) or "-", str(p.gpu_milli) if placed else "-",
                     str(p.gpu_memory_mib) if placed and p.gpu_memory_mib else "-", p.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
    lines.append("(MILLI and MIB: share and GPU memory taken on each listed GPU)")
    for item in result.skipped:
        what = f"node {item['node']}" if "node" in item else f"bound pod {item['pod']}"
        lines.append(f"skipped {what}: {item['reason']}")
    for pre in result.preemptions:
        for key, _ in pre.victims:
            lines.append(f"would evict {key} ({pre.action}): {pre.reason}")
    placed = len(result.placed)
    nominated = sum(1 for p in result.placements if p.nominated)
    held = f", {nominated} nominated (bound once the evicted pods are gone)" if nominated else ""
    lines.append(f"{placed} of {len(result.placements)} pending pod(s) placed{held} (policy {result.policy}; "
                 "dry run, nothing bound)")
    return "\n".join(lines)


__all__ = ["ClusterSnapshot", "SnapshotError", "Placement", "Plan", "Preemption", "QueueBook", "load_snapshot",
           "snapshot_from_objects", "plan", "format_plan", "queue_book", "unsupported_constraint"]
