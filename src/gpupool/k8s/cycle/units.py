"""Units of a cycle (a single pod, or a gang) and placing one within its queues' limits; why a pod cannot be
placed at all (an unsupported constraint, no identity)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.engine.statement import place_gang
from gpupool.k8s.cache.queues import QueueBook
from gpupool.k8s.cache.records import queue_charge
from gpupool.k8s.cycle.plan import Placement
from gpupool.k8s.objects.pods import PodInfo
from gpupool.model import Assignment

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
class Unit:
    members: list[tuple[dict[str, Any], PodInfo]]
    gang: str | None = None
    need: int = 0

    def order(self) -> tuple:
        best = min((-i.request.priority, i.request.creation_time or 0.0, i.key) for _, i in self.members)
        return best


def success_reason(policy: str, a: Assignment, feasible: int, gang: str | None, mig: Sequence[tuple[str, int]]
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


def identity_problem(pod: Mapping[str, Any], key: str, pending_count: Mapping[str, int],
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


def _charges(members: Sequence[tuple[Any, PodInfo]], book: QueueBook, state: ClusterState | None = None,
             assignments: Mapping[str, Assignment] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """({queue: milli-GPU} the members are charged, {queue: milli-GPU} of that held by non-preemptible members
    (``book.nonpreemptible``)): exact where placed (``assignments``: milli-GPU x devices, a memory-sized share as
    its fraction of the card), else a lower bound."""
    out: dict[str, int] = {}
    np_out: dict[str, int] = {}
    for _, info in members:
        if info.queue:
            a = assignments.get(info.key) if assignments is not None else None
            milli = queue_charge(info, a, state)
            out[info.queue] = out.get(info.queue, 0) + milli
            if book.nonpreemptible(info.request.priority):
                np_out[info.queue] = np_out.get(info.queue, 0) + milli
    return out, np_out


def _charge(book: QueueBook, charges: tuple[dict[str, int], dict[str, int]]) -> None:
    every, np_part = charges
    for queue, milli in every.items():
        book.charge(queue, milli, np_part.get(queue, 0))


def place_unit(unit: Unit, engine: Engine, pol: Any, book: QueueBook, policy: str,
                state: ClusterState | None = None) -> list[Placement]:
    """Place one unit (a single pod, or a gang) within its queues' limits.

    The limit check (and, in pool mode, the quota check of non-preemptible pods) is exact: a pod is placed,
    charged what it occupies there (a memory-sized share as its
    memory's fraction of the GPU, :func:`gpupool.k8s.cache.records.queue_charge`), and released again if that breaks
    a limit. A gang needs its minMember within the limits (all or nothing); members beyond the minimum are
    kept one by one, in order, while the limits hold.
    """
    state = engine.state if state is None else state
    minimum = unit.members[: max(1, unit.need)] if unit.gang is not None else unit.members
    refused = book.admit(*_charges(minimum, book, state))  # a lower bound of the exact charge
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
        charges = _charges(need, book, state, by_key)
        why = book.admit(*charges)
        if why:
            for b in reversed(assignments):
                engine.release(b.pod)
            return [Placement(i.key, None, reason=why, gang=unit.gang) for _, i in unit.members]
        kept = need
        _charge(book, charges)
    for a in assignments[len(kept):]:  # then one by one, each charged as it is kept
        charges = _charges([info_of[a.pod]], book, state, by_key)
        why = book.admit(*charges)
        if not why:
            kept.append(info_of[a.pod])
            _charge(book, charges)
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
            success_reason(policy, a, feasible_of[info.key], unit.gang, info.mig), a.gpu_memory_mib, info.mig,
            unit.gang,
        ))
    return out
