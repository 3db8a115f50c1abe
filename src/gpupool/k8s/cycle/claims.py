"""Pods with ResourceClaims in the planning cycle: the node from the engine's filters (CPU, memory, selectors,
affinity, taints) and the DRA allocator's choice (:mod:`gpupool.k8s.cycle.dra`); gangs all or nothing; queues
charged the whole-GPU equivalents the claims hold. No I/O: the placements carry the allocations, which the live
scheduler writes into the claims before it binds (:func:`gpupool.k8s.api.calls.write_claim_allocation`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.engine.core import Engine
from gpupool.k8s.cache.dra import Usage
from gpupool.k8s.cache.queues import QueueBook
from gpupool.k8s.cycle.dra import ClaimAllocation, DraAllocator, NodeFit
from gpupool.k8s.cycle.plan import Placement
from gpupool.k8s.objects.dra import extended_resource_classes
from gpupool.k8s.objects.pods import PodInfo
from gpupool.model import MILLI


def has_claims(pod: Mapping[str, Any], backed: Mapping[str, str] | None = None) -> bool:
    """Whether the pod names ResourceClaims (``spec.resourceClaims``), or asks an extended resource that
    ``backed`` (resource -> DeviceClass) says DRA provides."""
    spec = pod.get("spec") if isinstance(pod, Mapping) else None
    if not isinstance(spec, Mapping):
        return False
    if spec.get("resourceClaims"):
        return True
    if backed:
        for c in list(spec.get("initContainers") or ()) + list(spec.get("containers") or ()):
            res = c.get("resources") if isinstance(c, Mapping) else None
            if isinstance(res, Mapping) and any(
                    r in backed for part in ("requests", "limits") for r in (res.get(part) or {})):
                return True
    return False


def dra_backed(classes: Mapping[str, Any], nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resources backed by DRA on this cluster (resource -> DeviceClass): those a class provides and no
    node advertises in ``status.allocatable`` (a device plugin serves those; a cluster mixing both for one
    resource is served by the device plugin's nodes)."""
    backed = extended_resource_classes(classes)
    if not backed:
        return {}
    advertised: set[str] = set()
    for node in nodes:
        alloc = ((node.get("status") or {}).get("allocatable") or {}) if isinstance(node, Mapping) else {}
        advertised.update(k for k, v in alloc.items() if k in backed and str(v) not in ("0", ""))
    return {r: c for r, c in backed.items() if r not in advertised}


def _charge(book: QueueBook, info: PodInfo, gpus: float) -> tuple[dict[str, int], dict[str, int]]:
    """({queue: milli-GPU}, {queue: non-preemptible part}) for a pod whose claims hold ``gpus`` GPU equivalents."""
    milli = int(round(gpus * MILLI))
    if not info.queue or not milli:
        return {}, {}
    return {info.queue: milli}, ({info.queue: milli} if book.nonpreemptible(info.request.priority) else {})


def place_claim_unit(members: Sequence[tuple[Mapping[str, Any], PodInfo]], need: int, gang: str | None,
                     engine: Engine, pol: Any, allocator: DraAllocator, usage: Usage, book: QueueBook,
                     nodes: Mapping[str, Mapping[str, Any]], backed: Mapping[str, str] | None = None
                     ) -> list[Placement]:
    """Place pods that hold ResourceClaims: each on the node where its claims allocate best (``usage`` is updated
    with what it takes). A gang (``gang`` set) places its first ``need`` members all or nothing."""
    state = engine.state
    placed: list[tuple[PodInfo, NodeFit]] = []
    saved = usage.copy()
    out: list[Placement] = []
    failed: dict[str, str] = {}
    for pod, info in members:
        claims, why = allocator.pod_claims(pod)
        ext = allocator.extended_claim(pod, backed or {}) if not why else None
        request = info.request
        if ext is not None:  # its GPUs come from the claim made for it, not from a device plugin
            claims = [*claims, ext[0]]
            request = replace(request, num_gpu=0, gpu_milli=0, gpu_memory_mib=0)
        if not why:
            mask = engine.feasible_mask(pol.effective(request))
            idx = mask.nonzero()[0].tolist()
            candidates = [(state.node_names[i], nodes.get(state.node_names[i])) for i in idx]
            if not candidates:
                why = engine.unschedulable_reason(pol.effective(request))
            else:
                fit = allocator.best(claims, candidates, usage)
                if isinstance(fit, str):
                    why = fit
                else:
                    charges = _charge(book, info, fit.gpus)
                    refused = book.admit(*charges)
                    if refused:
                        why = refused
                    else:
                        book_charge(book, charges)
                        state.allocate(request, state.node_index[fit.node], (), None)
                        if ext is not None:
                            fit.allocations = [ClaimAllocation(ca.claim, ca.results, ca.node, ext[1], ext[2])
                                               if ca.claim is ext[0] else ca for ca in fit.allocations]
                        devices = allocator.inv.devices()
                        for ca in fit.allocations:
                            for r in ca.results:
                                usage.add(devices.get(r.key), r)
                        placed.append((info, fit))
                        continue
        failed[info.key] = f"pod {info.key}: {why}" if not why.startswith("pod ") else why
        if gang is not None and len(placed) < need:
            break
    if gang is not None and len(placed) < need:  # the minimum all at once, or nothing starts
        for info, fit in placed:
            engine.release(info.key)
            book_charge(book, _charge(book, info, fit.gpus), -1)
        usage.restore(saved)
        first = next(iter(failed.values()), "no room")
        return [Placement(i.key, None, reason=f"gang {gang} cannot be placed together: {first}", gang=gang)
                for _, i in members]
    fits = {i.key: f for i, f in placed}
    for _, info in members:
        f = fits.get(info.key)
        if f is None:
            why = failed.get(info.key, "waits for its gang's next cycle")
            out.append(Placement(info.key, None, reason=why, gang=gang))
            continue
        devices = ", ".join(f"{r.device}" for ca in f.allocations for r in ca.results) or "claims allocated already"
        out.append(Placement(info.key, f.node, reason=f"claims allocated on {f.node}: {devices}", gang=gang,
                             claims=tuple(f.allocations)))
    return out


def book_charge(book: QueueBook, charges: tuple[dict[str, int], dict[str, int]], sign: int = 1) -> None:
    """Add (``sign`` 1) or take back (-1) a charge on the queue book."""
    every, np_part = charges
    for queue, milli in every.items():
        book.charge(queue, sign * milli, sign * np_part.get(queue, 0))


def claim_victims(pod: Mapping[str, Any], info: PodInfo, claims: Sequence[Any], candidates: Sequence[tuple[str, Any]],
                  running: Mapping[str, Sequence[tuple[int, float, str, str, list[Any]]]], allocator: DraAllocator,
                  usage: Usage) -> tuple[str, list[tuple[str, str]]] | None:
    """Pods to evict so that ``pod``'s claims allocate on one node (kube-scheduler's DRA preemption in PostFilter):
    on each candidate node the lower-priority pods holding claims there (``running``: node -> (priority, start,
    key, uid, the claims only they hold)) are released cheapest first (lowest priority, then the newest) until
    the claims fit; the node that needs the fewest victims (then the lowest priorities) wins. None: no set of
    lower-priority pods frees enough, or the pod may not preempt (``preemptionPolicy: Never``)."""
    if ((pod.get("spec") or {}).get("preemptionPolicy") or "") == "Never":
        return None
    devices = allocator.inv.devices()
    best: tuple[tuple[int, int], str, list[tuple[str, str]]] | None = None
    for name, obj in candidates:
        victims = sorted((v for v in running.get(name, ()) if v[0] < info.request.priority),
                         key=lambda v: (v[0], -v[1]))
        if not victims:
            continue
        trial = usage.copy()
        taken: list[tuple[str, str]] = []
        prio = 0
        for v_prio, _, key, uid, held in victims:
            for claim in held:
                for r in claim.allocated or ():
                    trial.add(devices.get(r.key), r, -1)
            taken.append((key, uid))
            prio += v_prio
            if not isinstance(allocator.fit(claims, name, obj, trial.copy()), str):
                score = (len(taken), prio)
                if best is None or score < best[0]:
                    best = (score, name, list(taken))
                break
    return None if best is None else (best[1], best[2])
