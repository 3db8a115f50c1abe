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

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.k8s.cache.eligibility import constraints_of
from gpupool.k8s.cache.model import ClusterModel
from gpupool.k8s.cache.sharing import share_spelling
from gpupool.k8s.cycle.claims import claim_victims, dra_backed, has_claims, place_claim_unit
from gpupool.k8s.cycle.dra import DraAllocator
from gpupool.k8s.cycle.plan import Placement, Plan, Preemption
from gpupool.k8s.cycle.pool import PoolDriver
from gpupool.k8s.cycle.units import Unit, identity_problem, place_unit, unsupported_constraint
from gpupool.k8s.objects.fields import deletion_time
from gpupool.k8s.objects.hami import hami_devices_for
from gpupool.k8s.objects.nodes import hami_registered_gpus
from gpupool.k8s.objects.pods import PodInfo, describe_pod
from gpupool.k8s.objects.snapshots import ClusterSnapshot
from gpupool.policies import DEFAULT_POLICY

log = logging.getLogger("gpupool.k8s.state")  # the cycle logs under the model's name, as before


def plan(snapshot: ClusterSnapshot, scheduler_name: str = "gpupool", policy: str = DEFAULT_POLICY,
         seed: int = 0, prepare_state: Callable[[ClusterState], Any] | None = None,
         describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod, pool: Any = None,
         share_enforcement: str = "none") -> Plan:
    """One scheduling cycle on ``snapshot``: a :class:`Placement` for every pending pod of ``scheduler_name``.

    The snapshot's objects are fed to a :class:`~gpupool.k8s.cache.model.ClusterModel` as the live scheduler's
    watch events are, and one cycle of it runs: the dry run and the live scheduler share one code path.
    ``prepare_state`` runs on the state before any placement (e.g. GPU health from telemetry:
    :meth:`gpupool.k8s.telemetry.GpuTelemetry.apply_health`). ``describe`` reads a pod. ``pool``: a
    :class:`~gpupool.engine.pool.PoolConfig` to plan as the live scheduler's pool mode does (queue fair share,
    reservations, reclaim and preemption: the plan then lists the evictions it would make), None for
    placement within queue limits only. ``share_enforcement``: where a GPU share may go
    (:mod:`gpupool.k8s.cache.sharing`).
    """
    model = ClusterModel.from_snapshot(snapshot, scheduler_name=scheduler_name, policy=policy, seed=seed,
                                       describe=describe, share_enforcement=share_enforcement)
    if pool is not None:
        PoolDriver(model, pool)
    return run_cycle(model, prepare_state, full_inventory=True)


def run_cycle(model: ClusterModel, prepare_state: Callable[[ClusterState], Any] | None = None,
              full_inventory: bool = False) -> Any:
    """One scheduling cycle: a :class:`~gpupool.k8s.cycle.plan.Placement` for every pending pod.

    Placed pods are assumed (they hold their devices and leave the pending set) until :meth:`forget`
    or the watch shows them bound. ``prepare_state`` runs on the state first (GPU health from telemetry).
    ``full_inventory``: fill ``Plan.inventory`` (O(cluster); the dry run does, the live loop does not).
    Returns a :class:`~gpupool.k8s.cycle.plan.Plan`.
    """
    model.expire()
    model.refresh()
    pending = [model.pods[k] for k in model.pending]
    if not pending and (model.pool is None or model.state is None):
        return Plan([], None, model.policy_name)
    state, engine = model.state, model.engine
    if state is None or engine is None:
        skipped = model.skipped_nodes()
        usable = "no usable node" + (f" ({len(skipped)} unreadable)" if skipped else "")
        return Plan([Placement(r.base, None, reason=f"0/0 nodes are available: {usable}")
                          for r in pending], None, model.policy_name, skipped_nodes=skipped)
    model.stats["incremental"] += 1
    if prepare_state is not None:
        prepare_state(state)
    out: list[Any] = []
    infos: list[tuple[Mapping[str, Any], PodInfo]] = []
    dup = [r for r in pending if r.base in model.duplicates or r.key != r.base]
    pending_count: dict[str, int] = {}
    for rec in dup:
        pending_count[rec.base] = pending_count.get(rec.base, 0) + 1
    bound_to = {}
    for base in {r.base for r in dup}:
        for key in [base] + model.duplicates.get(base, []):
            other = model.pods.get(key)
            if other is not None and other.node and not other.terminal:
                bound_to[base] = other.node
    for rec in pending:
        why = identity_problem(rec.obj, rec.base, pending_count, bound_to)
        if why:
            out.append(Placement(rec.base, None, reason=f"pod {rec.base}: {why}", invalid=True))
            continue
        if rec.info is None:
            out.append(Placement(rec.base, None, reason=str(rec.error), invalid=True))
            continue
        try:
            why = unsupported_constraint(rec.obj)
            if not why and rec.key not in model._constraints:
                model._constraints[rec.key] = constraints_of(
                    rec.obj, rec.info.mig, share_spelling(rec.info.request, rec.info.spelling))
        except Exception as exc:  # noqa: BLE001 - one unreadable pod never stops the cycle
            out.append(Placement(rec.base, None, invalid=True,
                                      reason=f"pod {rec.base}: invalid object: {type(exc).__name__}: {exc}"))
            continue
        if why:
            out.append(Placement(rec.base, None, reason=f"pod {rec.base}: {why}", invalid=True))
            continue
        infos.append((rec.obj, rec.info))

    groups, group_errors = model.group_sizes()
    units: list[Unit] = []
    gangs: dict[str, Unit] = {}
    for pod, info in infos:
        if info.pod_group is None:
            units.append(Unit([(pod, info)]))
        else:
            gangs.setdefault(info.pod_group, Unit([], info.pod_group)).members.append((pod, info))
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
            done = model.group_counted.get(gkey, 0) + sum(
                1 for k in model.assumed if (r := model.pods.get(k)) is not None and r.info is not None
                and r.info.pod_group == gkey)
            unit.need = max(0, min_member - done)
            if len(unit.members) < unit.need:
                reason = (f"gang {gkey}: {len(unit.members)} pod(s) pending and {done} scheduled of minMember "
                          f"{min_member}; waiting for the rest")
        if reason:
            out.extend(Placement(i.key, None, reason=reason, gang=gkey) for _, i in unit.members)
        else:
            unit.members.sort(key=lambda m: (-m[1].request.priority, m[1].request.creation_time or 0.0,
                                             m[1].key))
            units.append(unit)

    backed = dra_backed(model.dra.classes, (r.obj for r in model.nodes.values())) if model.dra.classes else {}
    claim_units = [u for u in units if any(has_claims(p, backed) for p, _ in u.members)]
    if claim_units:
        units = [u for u in units if u not in claim_units]
    if model.pool is not None:  # the pool scheduler runs the cluster (gpupool.k8s.pool)
        before = set(model.assumed)
        mark = model.pool.mark()
        try:
            plan = model.pool.cycle(out, units)
        except Exception:  # a bug in the pool path must not stop scheduling: place this cycle without it
            log.error("pool cycle failed; this cycle places within queue limits only, the pool scheduler is "
                      "rebuilt from the cluster next cycle", exc_info=True, extra={"event": "pool_cycle_failed"})
            model.stats["pool_errors"] = model.stats.get("pool_errors", 0) + 1
            for key in [k for k in model.assumed if k not in before]:
                model.forget(key)  # nothing of the failed cycle is carried out
            model.pool.abort(mark)  # its evictions were never carried out; rebuilt at the next cycle
            model._dirty = True  # and the state from the records: the failed cycle's placements go
            model.refresh()
            state, engine, elig = model.state, model.engine, model.elig
            if state is None or engine is None or elig is None:
                return Plan(out, None, model.policy_name, skipped_nodes=model.skipped_nodes())
            units = [u for u in units if all(i.key in model.pending for _, i in u.members)]
        else:
            if claim_units and model.state is not None and model.engine is not None:
                plan.placements.extend(place_claims(model, claim_units, model.queue_book(), backed,
                                                    plan.preemptions))
            model._after_cycle()
            if full_inventory:
                plan.inventory = model.inventory()
            plan.placements = hand_over(model, plan.placements)
            return plan
    book = model.queue_book()
    elig = model.elig
    assert elig is not None
    for unit in units:
        for _, info in unit.members:
            if info.mig:
                elig.pending_mig[info.key] = info.mig
    pol = engine.policy
    claim_preemptions: list[Preemption] = []
    if claim_units:
        out.extend(place_claims(model, claim_units, book, backed, claim_preemptions))
    epoch = model._epoch
    for unit in sorted(units, key=Unit.order):
        single = unit.members[0][1].key if unit.gang is None else None
        if single is not None:
            # kube-scheduler's unschedulable queue, in an exact form: a pod that failed cannot fit while
            # nothing was freed or loosened since (no pod released, no GPU repaired, no node changed, no
            # Queue or PodGroup changed, not the pod itself: other pods placed only take more), so it is not
            # planned again; its last reason stands
            last = model._last_fail.get(single)
            seen = (model.pods[single].rv, state.loosened, epoch)
            if last is not None and last[0] == seen:
                out.append(last[1])
                model.stats["skipped_unchanged"] += 1
                continue
        try:
            placed = place_unit(unit, engine, pol, book, model.policy_name, state)
        except Exception as exc:  # noqa: BLE001 - a unit that trips the engine fails alone
            log.error("placement failed", exc_info=True, extra={"event": "placement_error",
                                                                 "pods": [i.key for _, i in unit.members]})
            placed = [Placement(i.key, None, gang=unit.gang,
                                     reason=f"gpupool could not place this pod: {type(exc).__name__}: {exc}")
                      for _, i in unit.members]
        for p in placed:
            if p.node is not None:
                model.assume(p.pod, p.node, tuple(p.mig))
            else:
                elig.pending_mig.pop(p.pod, None)
                if single is not None and not p.invalid:
                    model._last_fail[single] = (seen, p)
        out.extend(placed)
    model._after_cycle()
    inventory = model.inventory() if full_inventory else None
    return Plan(hand_over(model, out), inventory, model.policy_name, state, book, preemptions=claim_preemptions)


def place_claims(model: ClusterModel, units: list[Unit], book: Any, backed: Mapping[str, str] | None = None,
                 preemptions: list[Preemption] | None = None) -> list[Placement]:
    """Place the units whose pods hold ResourceClaims (:mod:`gpupool.k8s.cycle.claims`), in unit order; placed
    pods and their claims' allocations are assumed until the watch shows them. A single pod whose claims fit
    nowhere may preempt lower-priority pods holding claims (appended to ``preemptions``; it is nominated on the
    node while they leave, and preempts nothing more until they are gone)."""
    engine = model.engine
    assert engine is not None
    allocator = getattr(model, "dra_allocator", None)
    if allocator is None or allocator.inv is not model.dra:
        allocator = model.dra_allocator = DraAllocator(model.dra)
    usage = model.dra.usage()
    nodes = {name: rec.obj for name, rec in model.nodes.items()}
    out: list[Placement] = []
    state, epoch = model.state, model._epoch
    assert state is not None
    running: list[dict[str, Any]] = []  # bound pods holding claims, read once per cycle when a pod may preempt
    for unit in sorted(units, key=Unit.order):
        single = unit.members[0][1].key if unit.gang is None else None
        if single is not None:  # as for other pods: one that failed is not planned again until something loosens
            last = model._last_fail.get(single)
            seen = (model.pods[single].rv, state.loosened, epoch)
            if last is not None and last[0] == seen:
                out.append(last[1])
                model.stats["skipped_unchanged"] += 1
                continue
        try:
            placed = place_claim_unit(unit.members, max(1, unit.need), unit.gang, engine, engine.policy,
                                      allocator, usage, book, nodes, backed)
        except Exception as exc:  # noqa: BLE001 - a unit that trips the allocator fails alone
            log.error("claim allocation failed", exc_info=True,
                      extra={"event": "placement_error", "pods": [i.key for _, i in unit.members]})
            placed = [Placement(i.key, None, gang=unit.gang,
                                reason=f"gpupool could not allocate this pod's claims: {type(exc).__name__}: {exc}")
                      for _, i in unit.members]
        if preemptions is not None and unit.gang is None and placed and placed[0].node is None \
                and not placed[0].invalid:
            placed = [_preempt_for(model, unit, placed[0], allocator, usage, nodes, backed or {}, preemptions,
                                   running)]
        for p in placed:
            if p.node is None and single is not None and not p.invalid:
                model._last_fail[single] = (seen, p)
            if p.node is not None and not p.nominated:
                model.assume(p.pod, p.node)
                keys = []
                for ca in p.claims:  # a claim to be made is assumed under its generateName until it exists
                    if ca.results:
                        model.dra.assume(ca.claim.key, ca.results, ca.node)
                        keys.append(ca.claim.key)
                model.claims_of[p.pod] = keys
        out.extend(placed)
    return out


def _running_claims(model: ClusterModel) -> dict[str, list[tuple[int, float, str, str, list[Any]]]]:
    """node -> (priority, start, pod key, uid, the allocated claims reserved for that pod alone) of bound pods."""
    alone: dict[str, list[Any]] = {}
    for c in model.dra.claims.values():
        if c.allocated and len(c.reserved_for) == 1 and not c.deleting:
            alone.setdefault(c.reserved_for[0][1], []).append(c)
    out: dict[str, list[tuple[int, float, str, str, list[Any]]]] = {}
    for rec in model.pods.values():
        held = alone.get(rec.uid) if rec.uid else None
        if not held or not rec.node or rec.terminal or rec.info is None or deletion_time(rec.obj) is not None:
            continue
        out.setdefault(rec.node, []).append((rec.info.request.priority, rec.info.request.creation_time or 0.0,
                                             rec.key, rec.uid, held))
    return out


def _preempt_for(model: ClusterModel, unit: Unit, failed: Placement, allocator: DraAllocator, usage: Any,
                 nodes: Mapping[str, Any], backed: Mapping[str, str], preemptions: list[Preemption],
                 running: list[dict[str, Any]]) -> Placement:
    pod, info = unit.members[0]
    pending = model.dra_preempting.get(info.key)
    if pending is not None:
        left = [k for k in pending[1] if (r := model.pods.get(k)) is not None and not r.terminal]
        if left:
            return dataclasses.replace(failed, reason=f"{failed.reason}; waiting for {len(left)} pod(s) preempted "
                                                      f"for it to leave ({', '.join(left[:3])})")
        uids = set(pending[2])
        held = [c.key for c in model.dra.claims.values() if c.allocated and any(u in uids for _, u in c.reserved_for)]
        if held:  # the resourceclaim controller (kube-controller-manager) has not released them yet
            return dataclasses.replace(failed, reason=f"{failed.reason}; waiting for the claims of the pods preempted "
                                                      f"for it to be released ({', '.join(held[:3])})")
        model.dra_preempting.pop(info.key, None)
    claims, why = allocator.pod_claims(pod)
    ext = allocator.extended_claim(pod, backed) if not why else None
    if why:
        return failed
    if ext is not None:
        claims = [*claims, ext[0]]
    engine = model.engine
    assert engine is not None and model.state is not None
    request = info.request if ext is None else dataclasses.replace(info.request, num_gpu=0, gpu_milli=0,
                                                                  gpu_memory_mib=0)
    mask = engine.feasible_mask(engine.policy.effective(request))
    names = [model.state.node_names[i] for i in mask.nonzero()[0].tolist()]
    if not running:  # read once per cycle, by the first pod that may preempt
        running.append(_running_claims(model))
    chosen = claim_victims(pod, info, claims, [(n, nodes.get(n)) for n in names], running[0], allocator, usage)
    if chosen is None:
        return failed
    node, victims = chosen
    taken = {k for k, _ in victims}  # a victim frees its devices once: later preemptors this cycle look elsewhere
    running[0][node] = [v for v in running[0].get(node, ()) if v[2] not in taken]
    model.dra_preemption_seq += 1
    pid = 1_000_000_000 + model.dra_preemption_seq  # apart from the pool scheduler's ids
    reason = (f"preempted by {info.key} (priority {info.request.priority}), whose ResourceClaims need the devices "
              f"this pod's claims hold on node {node}")
    grace = max([float((model.pods[k].obj.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
                 for k, _ in victims if k in model.pods] or [30.0])
    nominated = Placement(info.key, node, nominated=True, reason=(
        f"preempting {len(victims)} lower-priority pod(s) holding claims on {node}: "
        f"{', '.join(k for k, _ in victims[:3])}"))
    preemptions.append(Preemption(pid, "preempt", info.key, reason, victims, [nominated], grace))
    model.dra_preempting[info.key] = (pid, [k for k, _ in victims], [u for _, u in victims])
    return nominated


def hand_over(model: ClusterModel, placements: list[Placement]) -> list[Placement]:
    """``--share-enforcement hami``: each placement on a node where HAMi's device plugin registered, of a pod whose
    containers ask ``nvidia.com/gpu`` (whole GPUs too: HAMi's plugin serves every such container on its nodes),
    gets the device string HAMi's plugin reads (:func:`gpupool.k8s.objects.hami.hami_devices_for`). A placement
    whose devices cannot be named (no UUID in the registration) is taken back, with the reason."""
    if model.share_enforcement != "hami":
        return placements
    out = []
    for p in placements:
        node = model.nodes.get(p.node or "")
        rec = model.pods.get(p.pod)
        if node is None or node.spec is None or rec is None or not p.gpus or p.nominated:
            out.append(p)
            continue
        registered = hami_registered_gpus(node.obj)
        try:
            devices = hami_devices_for(rec.obj, p.gpus, registered) if registered is not None else ""
            out.append(dataclasses.replace(p, hami_devices=devices) if devices else p)
        except ValueError as exc:
            model.forget(p.pod)
            out.append(dataclasses.replace(p, node=None, gpus=(), reason=(
                f"pod {p.pod}: not handed to HAMi's device plugin on node {p.node}: {exc}")))
    return out
