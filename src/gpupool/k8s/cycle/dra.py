"""Allocating a pod's ResourceClaims (``resource.k8s.io/v1``) on a node, and choosing the node: no I/O.

What Kubernetes 1.36's structured allocator checks, gpupool checks the same way: every request form of the v1
API (``exactly``: class, CEL selectors, ``ExactCount``/``All``, count; ``firstAvailable`` tried in order; capacity
requests on devices with ``allowMultipleAllocations``, rounded up by the capacity's ``requestPolicy``;
``adminAccess``), the class's and the request's selectors (:mod:`gpupool.k8s.objects.dra_cel`), ``matchAttribute``
and ``distinctAttribute`` constraints, partitionable devices' shared counters, device taints and the request's
tolerations; a claim already allocated pins the pod to its node.

What differs is the choice. kube-scheduler takes the first devices that fit, in slice order, on a node its
other plugins scored (it has no device-packing score). gpupool chooses by fragmentation:

* inside a node, each device is taken where it **blocks the least**: the loss of a device is the whole-GPU
  equivalents of the other devices that are free now and could no longer be allocated once it is taken (a MIG
  partition on a GPU already partitioned blocks less than one on an untouched GPU, which blocks the whole GPU and
  its large profiles; a share of a GPU already shared blocks nothing new);
* across nodes, the node with the least loss wins, then the one left with the fewest free whole GPUs (best fit:
  large requests keep finding empty nodes), then the node order.

Reasons name the request and why it failed, as kube-scheduler's ``FailedScheduling`` messages do.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from typing import Any

from gpupool.k8s.cache.dra import CounterKey, DraInventory, Usage, device_value
from gpupool.k8s.cache.eligibility import matches_node_selector_term
from gpupool.k8s.cycle.dra_score import FragmentationScores
from gpupool.k8s.objects.dra import (
    ALLOCATION_MODE_ALL,
    MAX_DEVICES_PER_CLAIM,
    AllocatedDevice,
    Claim,
    Device,
    SubRequest,
    extended_claim_body,
    extended_requests,
    pod_claim_names,
)
from gpupool.k8s.objects.nodes import agent_unhealthy_uuids

Matcher = Callable[[Sequence[str], Device], tuple[bool, "str | None"]]


def _as_device_names(qualified: str, d: Device) -> str:
    """A capacity name as the device's slice spells it (and kube-scheduler writes it in ``consumedCapacity``):
    unqualified in the driver's own domain."""
    domain, _, name = qualified.rpartition("/")
    return name if domain == d.driver else qualified


def default_matcher() -> Matcher:
    from gpupool.k8s.objects.dra_cel import device_matches

    return device_matches


@dataclass(frozen=True)
class ClaimAllocation:
    """Devices chosen for one claim (``claim.allocated`` stays as the API server has it); ``results`` empty: the
    claim is allocated already (on ``node``) and the pod is only added to its ``reservedFor``."""

    claim: Claim
    results: tuple[AllocatedDevice, ...]
    node: str
    create: Mapping[str, Any] | None = None  # the claim to create first (extended resources backed by DRA)
    mappings: tuple[Mapping[str, str], ...] = ()  # its pod's status.extendedResourceClaimStatus.requestMappings


@dataclass
class NodeFit:
    node: str
    allocations: list[ClaimAllocation]
    loss: float
    free_after: float  # whole-GPU equivalents left free on the node
    gpus: float  # whole-GPU equivalents newly allocated
    flexibility: float = 0.0  # the taken devices' GPUs' flexibility, weighted by their whole-GPU equivalents

    @property
    def score(self) -> tuple[float, float, float]:
        """Lower is better: the least flexible GPUs, then the least fragmentation, then the fewest GPUs left free
        (best fit)."""
        return (round(self.flexibility, 6), round(self.loss, 6), round(self.free_after, 6))


class _NoFit(Exception):
    """One claim cannot be allocated on a node; the message names the request and why."""


def _round_up(amount: Decimal, policy: Any) -> Decimal | None:
    """``amount`` as the capacity's request policy allows it (None: not allowed)."""
    if policy is None:
        return amount
    if policy.valid_values:
        fits = [v for v in sorted(policy.valid_values) if v >= amount]
        return fits[0] if fits else None
    if policy.min is not None and amount < policy.min:
        amount = policy.min
    if policy.step is not None and policy.step > 0:
        base = policy.min or Decimal(0)
        steps = ((amount - base) / policy.step).to_integral_value(rounding=ROUND_CEILING)
        amount = base + steps * policy.step
    if policy.max is not None and amount > policy.max:
        return None
    return amount


class DraAllocator(FragmentationScores):
    """Allocates claims from a :class:`~gpupool.k8s.cache.dra.DraInventory` (read-only: tries work on a
    :class:`~gpupool.k8s.cache.dra.Usage` copy). ``matcher(selectors, device) -> (matches, error)`` evaluates CEL
    selectors (default: :func:`gpupool.k8s.objects.dra_cel.device_matches`)."""

    def __init__(self, inventory: DraInventory, matcher: Matcher | None = None, step_limit: int = 20000) -> None:
        self.inv = inventory
        self.matcher = matcher  # None: the CEL library, loaded at the first selector
        self.step_limit = step_limit
        self._match_cache: dict[tuple[tuple[str, ...], int], tuple[Device, bool, str | None]] = {}
        self._members: tuple[int, dict[CounterKey, tuple[int, list[Device]]]] | None = None
        self._strand_cache: dict[tuple, Any] = {}
        self._kind_cache: dict[tuple, tuple[Device, frozenset[str]]] = {}

    # -- the pod's claims
    def pod_claims(self, pod: Mapping[str, Any]) -> tuple[list[Claim], str]:
        """The pod's claims (``spec.resourceClaims``), or a reason it must wait (a claim not created yet, being
        deleted, reserved for other pods up to the limit)."""
        ns = str((pod.get("metadata") or {}).get("namespace", "default"))
        out = []
        for entry, name in pod_claim_names(pod):
            if name is None:
                return [], (f"waiting for the ResourceClaim of pod claim '{entry}' (from its template) to be created"
                            " by the resourceclaim controller")
            claim = self.inv.claims.get(f"{ns}/{name}")
            if claim is None:
                why = self.inv.errors.get(f"resourceclaims/{ns}/{name}")
                return [], (f"ResourceClaim {ns}/{name} cannot be read: {why}" if why
                            else f'waiting for ResourceClaim "{name}" (pod claim \'{entry}\') to exist')
            if claim.deleting:
                return [], f"ResourceClaim {ns}/{name} is being deleted"
            out.append(claim)
        ext = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
        if ext:  # the claim made for its extended resources earlier (this scheduler before a restart, or another)
            claim = self.inv.claims.get(f"{ns}/{ext}")
            if claim is None:
                return [], f'waiting for ResourceClaim "{ext}" (its extended resources) to be seen'
            out.append(claim)
        return out, ""

    def extended_claim(self, pod: Mapping[str, Any], backed: Mapping[str, str]
                       ) -> tuple[Claim, Mapping[str, Any], tuple[Mapping[str, str], ...]] | None:
        """The claim to make for the pod's extended resources backed by DRA (``backed``: resource -> class, see
        :func:`~gpupool.k8s.objects.dra.extended_resource_classes`), its body and request mappings; None when the
        pod asks none, or has its claim already."""
        if not backed or ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
                "resourceClaimName"):
            return None
        reqs, mappings = extended_requests(pod, backed)
        if not reqs:
            return None
        meta = pod.get("metadata") or {}
        ns, name = str(meta.get("namespace", "default")), str(meta.get("name", ""))
        claim = Claim(namespace=ns, name=f"{name}-extended-resources-", uid="", resource_version="",
                      requests=tuple(reqs), extended=True)
        return claim, extended_claim_body(pod, reqs), tuple(mappings)

    # -- matching
    def _matches(self, selectors: tuple[str, ...], d: Device) -> tuple[bool, str | None]:
        if not selectors:
            return True, None
        key = (selectors, id(d))
        hit = self._match_cache.get(key)
        if hit is not None and hit[0] is d:
            return hit[1], hit[2]
        if self.matcher is None:
            self.matcher = default_matcher()
        ok, err = self.matcher(selectors, d)
        if len(self._match_cache) > 500_000:
            self._match_cache.clear()
        self._match_cache[key] = (d, ok, err)
        return ok, err

    def _candidates(self, sub: SubRequest, devices: Sequence[Device]) -> list[Device]:
        cls = self.inv.classes.get(sub.device_class)
        if cls is None:
            raise _NoFit(f'DeviceClass "{sub.device_class}" does not exist')
        selectors = tuple(cls.selectors) + tuple(sub.selectors)
        out = []
        for d in devices:
            ok, err = self._matches(selectors, d)
            if err:
                raise _NoFit(f"CEL runtime error on device {d.driver}/{d.pool}/{d.name}: {err}")
            if not ok:
                continue
            if any(t.effect in ("NoSchedule", "NoExecute") and not any(tol.tolerates(t) for tol in sub.tolerations)
                   for t in d.taints):
                continue
            if sub.capacity and not all((cap := d.capacity_of(q)) is not None and cap >= amount
                                        for q, amount in sub.capacity.items()):
                continue  # a capacity request the device cannot give at all (shared or not)
            out.append(d)
        return out

    # -- availability and consumption
    def _consumption(self, d: Device, sub: SubRequest) -> dict[str, Decimal] | None:
        """Capacity a share of shared device ``d`` consumes for ``sub`` (qualified names), None: not allowed."""
        out: dict[str, Decimal] = {}
        for dom, caps in d.capacity.items():
            for name, value in caps.items():
                q = f"{dom}/{name}"
                asked = sub.capacity.get(q, sub.capacity.get(name) if dom == d.driver else None)
                policy = d.capacity_policy.get(q)
                if asked is not None:
                    amount = _round_up(asked, policy)
                    if amount is None:
                        return None
                elif policy is not None and policy.default is not None:
                    amount = policy.default
                else:
                    amount = value
                out[q] = amount
        return out

    def _free(self, d: Device, sub: SubRequest | None, u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]],
              consumption: Mapping[str, Decimal] | None = None) -> bool:
        if sub is not None and sub.admin_access:
            return True
        if d.key in u.exclusive:
            return False
        if d.allow_multiple:
            if consumption is None:
                return False
            used = u.shared.get(d.key, {})
            for q, amount in consumption.items():
                dom, _, name = q.rpartition("/")
                if used.get(q, Decimal(0)) + amount > d.capacity.get(dom, {}).get(name, Decimal(0)):
                    return False
            if u.shares.get(d.key):
                return True  # counters were drawn by its first share
        elif u.shares.get(d.key):
            return False
        return self._counters_fit(d, u, totals)

    @staticmethod
    def _counters_fit(d: Device, u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]],
                      plus: Device | None = None) -> bool:
        for cs, amounts in d.consumes:
            ck = (d.driver, d.pool, cs)
            total = totals.get(ck)
            if total is None:
                return False
            used = u.counters.get(ck, {})
            extra = dict(next((a for s, a in plus.consumes if s == cs), {})) if plus is not None and \
                (plus.driver, plus.pool) == (d.driver, d.pool) else {}
            for c, v in amounts.items():
                if used.get(c, Decimal(0)) + extra.get(c, Decimal(0)) + v > total.get(c, Decimal(0)):
                    return False
        return True

    def _waste(self, d: Device, sub: SubRequest) -> float:
        """A capacity request served by a device taken whole strands the rest of it: the unrequested share of
        the device, in whole-GPU equivalents (0 for a shared device, or a request without capacity)."""
        if d.allow_multiple or not sub.capacity:
            return 0.0
        fractions = [float(amount / cap) for q, amount in sub.capacity.items()
                     if (cap := d.capacity_of(q)) is not None and cap > 0]
        if not fractions:
            return 0.0
        return (1.0 - min(1.0, max(fractions))) * device_value(d, None, self.inv.full_memory.get(d.key))

    def _take(self, d: Device, sub: SubRequest, request_name: str, u: Usage,
              consumption: Mapping[str, Decimal] | None) -> AllocatedDevice:
        r = AllocatedDevice(request=request_name, driver=d.driver, pool=d.pool, device=d.name,
                            admin_access=sub.admin_access,
                            share_id=str(uuid.uuid4()) if d.allow_multiple and not sub.admin_access else None,
                            consumed={_as_device_names(q, d): v for q, v in (consumption or {}).items()}
                            if d.allow_multiple else {})
        u.add(d, r)
        return r

    # -- one claim on one node
    def _node_devices(self, node: str, node_obj: Mapping[str, Any] | None) -> list[Device]:
        out = list(self.inv.node_devices(node))
        bad = agent_unhealthy_uuids(node_obj) if node_obj is not None else frozenset()
        if bad:  # GPUs gpupool's node agent found unhealthy: none of their devices (the GPU, its MIG partitions)
            out = [d for d in out if d.attribute("uuid") not in bad and d.attribute("parentUUID") not in bad]
        for d in self.inv.cluster_devices():
            if d.all_nodes:
                out.append(d)
            elif d.node_selector and node_obj is not None and any(
                    matches_node_selector_term(t, node_obj) for t in d.node_selector.get("nodeSelectorTerms") or ()):
                out.append(d)
        return out

    def _allocate_claim(self, claim: Claim, devices: Sequence[Device], u: Usage,
                        totals: Mapping[CounterKey, Mapping[str, Decimal]]
                        ) -> tuple[list[AllocatedDevice], float, float]:
        steps = [0]
        chosen: list[tuple[str, Device]] = []  # (request name, device)
        results: list[AllocatedDevice] = []
        loss = [0.0]
        flexes: list[float] = []  # per device taken: its GPU's flexibility x its whole-GPU equivalents
        reqs = claim.requests
        cand_cache: dict[tuple[int, int], list[Device]] = {}

        def constraint_ok(req_name: str, d: Device) -> bool:
            for c in claim.constraints:
                if c.requests and req_name not in c.requests:
                    continue
                attr = c.match_attribute or c.distinct_attribute
                if not attr:
                    continue
                v = d.attribute(attr)
                if v is None:
                    return False
                for rn, other in chosen:
                    if c.requests and rn.split("/")[0] not in c.requests:
                        continue
                    ov = other.attribute(attr)
                    if c.match_attribute and ov != v:
                        return False
                    if c.distinct_attribute and ov == v:
                        return False
            return True

        def fill(ri: int) -> bool:
            if ri == len(reqs):
                return True
            req = reqs[ri]
            errors = []
            for ai, sub in enumerate(req.alternatives):
                rname = f"{req.name}/{sub.name}" if req.first_available else req.name
                ck = (ri, ai)
                if ck not in cand_cache:
                    try:
                        cand_cache[ck] = self._candidates(sub, devices)
                    except _NoFit as exc:
                        errors.append(str(exc))
                        cand_cache[ck] = []
                        continue
                cands = cand_cache[ck]
                if sub.mode == ALLOCATION_MODE_ALL:
                    if not cands:
                        errors.append(f"request {rname}: no device matches (allocationMode All)")
                        continue
                    need = len(cands)
                else:
                    need = sub.count
                if need > MAX_DEVICES_PER_CLAIM:
                    errors.append(f"request {rname}: {need} devices is over the limit of {MAX_DEVICES_PER_CLAIM}")
                    continue
                mark = (len(chosen), len(results), loss[0], len(flexes))
                saved = u.copy()
                if pick(rname, sub, cands, need, sub.mode == ALLOCATION_MODE_ALL, ri):
                    return True
                del chosen[mark[0]:], results[mark[1]:], flexes[mark[3]:]
                loss[0] = mark[2]
                u.restore(saved)
                errors.append(f"request {rname}: {len(cands)} matching device(s), "
                              f"not {need} free together" if cands else f"request {rname}: no device matches")
            raise _NoFit("; ".join(errors) or f"request {req.name}: nothing to allocate")

        def pick(rname: str, sub: SubRequest, cands: list[Device], need: int, every: bool, ri: int) -> bool:
            if need == 0:
                return fill(ri + 1)
            steps[0] += 1
            if steps[0] > self.step_limit:
                raise _NoFit(f"request {rname}: search limit of {self.step_limit} steps reached")
            taken = {k.key for _, k in chosen}
            options = []
            for d in cands:
                if d.key in taken:
                    continue
                cons = self._consumption(d, sub) if d.allow_multiple else None
                if not self._free(d, sub, u, totals, cons):
                    if every:
                        return False
                    continue
                if not constraint_ok(rname.split("/")[0], d):
                    continue
                lo = 0.0 if sub.admin_access else self._loss(d, u, totals) + self._waste(d, sub)
                flex = 0 if sub.admin_access else self._flexibility(d, u, totals)
                options.append((flex, lo, self._leftover(d, u, cons), d, cons))
            if len(options) < need:
                return False
            if every:
                options = options[:1]
            else:
                # the least flexible GPU, then the least fragmentation, then the fullest shared device
                options.sort(key=lambda o: (o[0], o[1], o[2]))
            for fl, lo, _, d, cons in options:
                mark = (len(chosen), len(results), loss[0], len(flexes))
                saved = u.copy()
                results.append(self._take(d, sub, rname, u, cons))
                chosen.append((rname, d))
                loss[0] += lo
                flexes.append(fl * device_value(d, None, self.inv.full_memory.get(d.key)))
                rest = [c for c in cands if c is not d] if every else cands
                if pick(rname, sub, rest, need - 1, every, ri):
                    return True
                del chosen[mark[0]:], results[mark[1]:], flexes[mark[3]:]
                loss[0] = mark[2]
                u.restore(saved)
                if not claim.constraints and not every:
                    break  # without constraints, devices of one request are interchangeable for feasibility
            return False

        fill(0)
        return results, loss[0], sum(flexes)

    # -- the pod on one node, and the best node
    def fit(self, claims: Sequence[Claim], node: str, node_obj: Mapping[str, Any] | None,
            usage: Usage, devices: Sequence[Device] | None = None) -> NodeFit | str:
        """Allocate every unallocated claim of a pod on ``node`` (``usage`` is changed: pass a copy). Returns the
        fit, or why not."""
        totals = self.inv.counter_totals()
        if devices is None:
            devices = self._node_devices(node, node_obj)
        allocations: list[ClaimAllocation] = []
        loss = 0.0
        flex = 0.0
        gpus = 0.0
        for claim in claims:
            if claim.allocated is not None or claim.key in self.inv.assumed:
                at = claim.allocated_node if claim.allocated is not None else self.inv.assumed[claim.key][1]
                if at is not None and at != node:
                    return f"ResourceClaim {claim.key} is allocated on node {at}"
                allocations.append(ClaimAllocation(claim, (), node))  # allocated already: reserve it only
                continue
            try:
                results, lo, fl = self._allocate_claim(claim, devices, usage, totals)
            except _NoFit as exc:
                return f"ResourceClaim {claim.key}: {exc}"
            allocations.append(ClaimAllocation(claim, tuple(results), node))
            loss += lo
            flex += fl
            gpus += self.inv.gpu_equivalents(results)
        return NodeFit(node, allocations, loss, self.free_gpus(devices, usage, totals), gpus, flex)

    def best(self, claims: Sequence[Claim], nodes: Sequence[tuple[str, Mapping[str, Any] | None]],
             usage: Usage | None = None) -> NodeFit | str:
        """The best node of ``nodes`` (in order; ties go to the earlier) for the pod's ``claims``, or a reason
        naming how many nodes failed and why (the commonest reasons first)."""
        base = usage if usage is not None else self.inv.usage()
        best: NodeFit | None = None
        reasons: dict[str, int] = {}
        for name, obj in nodes:
            devices = self._node_devices(name, obj)
            # a node without devices allocates nothing, so the books need no copy (a copy is O(cluster))
            res = self.fit(claims, name, obj, base.copy() if devices else base, devices)
            if isinstance(res, str):
                reasons[res] = reasons.get(res, 0) + 1
                continue
            if best is None or res.score < best.score:
                best = res
        if best is not None:
            return best
        if not nodes:
            return "no node passes the pod's other filters"
        parts = sorted(reasons.items(), key=lambda kv: -kv[1])
        return f"0/{len(nodes)} nodes can allocate the pod's claims: " + "; ".join(
            f"{n} node(s): {why}" for why, n in parts[:3])

