"""Dynamic Resource Allocation objects (``resource.k8s.io/v1``) -> typed records, parsed once per version.

ResourceSlices become :class:`Device` records (with their pool's completeness), DeviceClasses become
:class:`DeviceClass`, ResourceClaims become :class:`Claim` (the spec's requests and constraints, and the
allocation in its status). Field names follow the v1 API (Kubernetes 1.34+, as served by 1.36); sources: the
Kubernetes API reference for ``resource.k8s.io/v1`` and ``k8s.io/dynamic-resource-allocation/structured``.
Imports nothing of gpupool.k8s above ``objects``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpupool.k8s.objects.fields import RequestParseError, expect_list, expect_mapping, meta_of, quantity

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
DRA_API = f"{DRA_GROUP}/{DRA_VERSION}"
FINALIZER_DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
"""Finalizer the scheduler puts on a claim it allocates; the resourceclaim controller deallocates such a claim
once no pod holds it (and only such claims), then removes the finalizer."""
ANN_EXTENDED_RESOURCE_CLAIM = "resource.kubernetes.io/extended-resource-claim"
"""Marks the claim the scheduler creates for a pod's DRA-backed extended resources (1.34+)."""
MAX_DEVICES_PER_CLAIM = 32  # resource.k8s.io/v1 AllocationResultsMaxSize
ALLOCATION_MODE_EXACT = "ExactCount"
ALLOCATION_MODE_ALL = "All"


class SemVer(str):
    """A ``version`` attribute value (semantic version string); CEL compares it with ``semver()``."""


AttrValue = bool | int | str | SemVer


@dataclass(frozen=True)
class DeviceTaint:
    key: str
    value: str
    effect: str  # NoSchedule | NoExecute | None (1.36: "None" records a taint without effect)


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""  # empty: every effect

    def tolerates(self, taint: DeviceTaint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key
        return self.key == taint.key and self.value == taint.value


@dataclass(frozen=True)
class CapacityPolicy:
    """``capacity[name].requestPolicy``: how much of a shared device's capacity a request consumes."""

    default: Decimal | None = None
    valid_values: tuple[Decimal, ...] = ()
    min: Decimal | None = None
    max: Decimal | None = None
    step: Decimal | None = None


@dataclass(frozen=True)
class Device:
    """One device of a ResourceSlice.

    ``attributes`` and ``capacity`` are keyed by domain, then by name (an unqualified name in the slice
    belongs to the driver's domain), as CEL selectors see them (``device.attributes["gpu.nvidia.com"].type``).
    ``consumes`` lists (counter set, {counter: amount}) of a partitionable device. Capacity values are
    Kubernetes quantities (``Decimal``; memory in bytes).
    """

    driver: str
    pool: str
    name: str
    node: str | None
    attributes: Mapping[str, Mapping[str, AttrValue]]
    capacity: Mapping[str, Mapping[str, Decimal]]
    capacity_policy: Mapping[str, CapacityPolicy] = field(default_factory=dict)  # qualified name -> policy
    consumes: tuple[tuple[str, Mapping[str, Decimal]], ...] = ()
    taints: tuple[DeviceTaint, ...] = ()
    allow_multiple: bool = False
    all_nodes: bool = False
    node_selector: Mapping[str, Any] | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        """(driver, pool, device): the identity an allocation result names."""
        return (self.driver, self.pool, self.name)

    def attribute(self, qualified: str) -> AttrValue | None:
        """The value of ``domain/name`` (or an unqualified name in the driver's domain), None if absent."""
        domain, _, name = qualified.rpartition("/")
        return self.attributes.get(domain or self.driver, {}).get(name)

    def capacity_of(self, qualified: str) -> Decimal | None:
        domain, _, name = qualified.rpartition("/")
        return self.capacity.get(domain or self.driver, {}).get(name)


@dataclass(frozen=True)
class CounterSet:
    """``sharedCounters[]`` of a slice: the amounts partitionable devices of the pool draw from."""

    name: str
    counters: Mapping[str, Decimal]


@dataclass(frozen=True)
class Slice:
    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    node: str | None
    devices: tuple[Device, ...]
    counter_sets: tuple[CounterSet, ...] = ()
    all_nodes: bool = False


@dataclass(frozen=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...]  # CEL expressions
    extended_resource_name: str | None = None


@dataclass(frozen=True)
class SubRequest:
    """One alternative of ``firstAvailable``, or the ``exactly`` request itself (``name`` then the request's)."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    mode: str = ALLOCATION_MODE_EXACT
    count: int = 1
    admin_access: bool = False
    tolerations: tuple[Toleration, ...] = ()
    capacity: Mapping[str, Decimal] = field(default_factory=dict)  # qualified name -> amount requested


@dataclass(frozen=True)
class Request:
    name: str
    alternatives: tuple[SubRequest, ...]  # one for ``exactly``; firstAvailable's list, in order
    first_available: bool = False


@dataclass(frozen=True)
class Constraint:
    requests: tuple[str, ...]  # empty: all requests
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True)
class AllocatedDevice:
    request: str  # "req" or "req/sub"
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str | None = None
    consumed: Mapping[str, Decimal] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.device)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    resource_version: str
    requests: tuple[Request, ...]
    constraints: tuple[Constraint, ...] = ()
    allocated: tuple[AllocatedDevice, ...] | None = None  # None: not allocated
    allocated_node: str | None = None  # from the allocation's nodeSelector (metadata.name In [node])
    reserved_for: tuple[tuple[str, str], ...] = ()  # (pod name, uid)
    finalizers: tuple[str, ...] = ()
    deleting: bool = False
    owner_pod_uid: str | None = None  # the pod a template's claim belongs to
    extended: bool = False  # created by the scheduler for DRA-backed extended resources

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class DraParseError(RequestParseError):
    """A DRA object gpupool cannot read; names the object and field."""


# ------------------------------------------------------------------ parsing
def _qualify(name: str, driver: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return (domain or driver, short)


def _attr_value(v: Any, where: str) -> AttrValue:
    m = expect_mapping(v, where)
    for k in ("bool", "int", "string", "version"):
        if k in m and m[k] is not None:
            val = m[k]
            if k == "bool":
                if not isinstance(val, bool):
                    raise DraParseError(f"{where}.bool: {val!r} is not a boolean")
                return val
            if k == "int":
                if isinstance(val, bool) or not isinstance(val, int):
                    raise DraParseError(f"{where}.int: {val!r} is not an integer")
                return val
            if k == "version":
                return SemVer(str(val))
            return str(val)
    raise DraParseError(f"{where}: no value (one of bool, int, string, version)")


def _quantities(m: Any, where: str) -> dict[str, Decimal]:
    out = {}
    for k, v in expect_mapping(m, where).items():
        val = v.get("value") if isinstance(v, Mapping) else v
        out[str(k)] = quantity(val, f"{where}.{k}")
    return out


def _taints(items: Any, where: str) -> tuple[DeviceTaint, ...]:
    out = []
    for t in expect_list(items, where):
        out.append(DeviceTaint(str(t.get("key", "")), str(t.get("value", "") or ""), str(t.get("effect", ""))))
    return tuple(out)


def parse_tolerations(items: Any, where: str) -> tuple[Toleration, ...]:
    out = []
    for t in expect_list(items, where):
        out.append(Toleration(str(t.get("key", "") or ""), str(t.get("operator", "Equal") or "Equal"),
                              str(t.get("value", "") or ""), str(t.get("effect", "") or "")))
    return tuple(out)


def _policy(m: Mapping[str, Any] | None, where: str) -> CapacityPolicy | None:
    if not m:
        return None
    rng = m.get("validRange") or {}
    return CapacityPolicy(
        default=quantity(m["default"], f"{where}.default") if m.get("default") is not None else None,
        valid_values=tuple(quantity(v, f"{where}.validValues") for v in m.get("validValues") or ()),
        min=quantity(rng["min"], f"{where}.validRange.min") if rng.get("min") is not None else None,
        max=quantity(rng["max"], f"{where}.validRange.max") if rng.get("max") is not None else None,
        step=quantity(rng["step"], f"{where}.validRange.step") if rng.get("step") is not None else None,
    )


def parse_slice(obj: Mapping[str, Any]) -> Slice:
    """A ResourceSlice -> :class:`Slice`; :class:`DraParseError` names the field at fault."""
    name = str(meta_of(obj).get("name", ""))
    where = f"ResourceSlice {name}"
    spec = expect_mapping(obj.get("spec"), f"{where}: spec")
    driver = str(spec.get("driver") or "")
    if not driver:
        raise DraParseError(f"{where}: spec.driver is empty")
    pool = expect_mapping(spec.get("pool"), f"{where}: spec.pool")
    pool_name = str(pool.get("name") or "")
    if not pool_name:
        raise DraParseError(f"{where}: spec.pool.name is empty")
    node = spec.get("nodeName") or None
    all_nodes = bool(spec.get("allNodes"))
    devices = []
    for i, d in enumerate(expect_list(spec.get("devices"), f"{where}: spec.devices")):
        dw = f"{where}: spec.devices[{i}]"
        attrs: dict[str, dict[str, AttrValue]] = {}
        for k, v in expect_mapping(d.get("attributes"), f"{dw}.attributes").items():
            dom, short = _qualify(str(k), driver)
            attrs.setdefault(dom, {})[short] = _attr_value(v, f"{dw}.attributes.{k}")
        cap: dict[str, dict[str, Decimal]] = {}
        policies: dict[str, CapacityPolicy] = {}
        for k, v in expect_mapping(d.get("capacity"), f"{dw}.capacity").items():
            dom, short = _qualify(str(k), driver)
            vm = expect_mapping(v, f"{dw}.capacity.{k}")
            cap.setdefault(dom, {})[short] = quantity(vm.get("value"), f"{dw}.capacity.{k}.value")
            pol = _policy(vm.get("requestPolicy"), f"{dw}.capacity.{k}.requestPolicy")
            if pol is not None:
                policies[f"{dom}/{short}"] = pol
        consumes = tuple(
            (str(c.get("counterSet", "")), _quantities(c.get("counters"), f"{dw}.consumesCounters[{j}].counters"))
            for j, c in enumerate(expect_list(d.get("consumesCounters"), f"{dw}.consumesCounters")))
        devices.append(Device(
            driver=driver, pool=pool_name, name=str(d.get("name") or ""),
            node=d.get("nodeName") or node, attributes=attrs, capacity=cap, capacity_policy=policies,
            consumes=consumes, taints=_taints(d.get("taints"), f"{dw}.taints"),
            allow_multiple=bool(d.get("allowMultipleAllocations")),
            all_nodes=bool(d.get("allNodes")) or (all_nodes and not d.get("nodeName")),
            node_selector=d.get("nodeSelector") or spec.get("nodeSelector") or None))
    counter_sets = tuple(
        CounterSet(str(c.get("name", "")), _quantities(c.get("counters"), f"{where}: spec.sharedCounters[{j}]"))
        for j, c in enumerate(expect_list(spec.get("sharedCounters"), f"{where}: spec.sharedCounters")))
    try:
        generation = int(pool.get("generation") or 0)
        count = int(pool.get("resourceSliceCount") or 1)
    except (TypeError, ValueError):
        raise DraParseError(f"{where}: spec.pool.generation/resourceSliceCount are not integers") from None
    return Slice(name=name, driver=driver, pool=pool_name, generation=generation, slice_count=count, node=node,
                 devices=tuple(devices), counter_sets=counter_sets, all_nodes=all_nodes)


def parse_device_class(obj: Mapping[str, Any]) -> DeviceClass:
    name = str(meta_of(obj).get("name", ""))
    spec = expect_mapping(obj.get("spec"), f"DeviceClass {name}: spec")
    sels = []
    for i, s in enumerate(expect_list(spec.get("selectors"), f"DeviceClass {name}: spec.selectors")):
        expr = (s.get("cel") or {}).get("expression")
        if not isinstance(expr, str) or not expr.strip():
            raise DraParseError(f"DeviceClass {name}: spec.selectors[{i}].cel.expression is empty")
        sels.append(expr)
    return DeviceClass(name=name, selectors=tuple(sels), extended_resource_name=spec.get("extendedResourceName"))


def _selectors(items: Any, where: str) -> tuple[str, ...]:
    out = []
    for i, s in enumerate(expect_list(items, where)):
        expr = (s.get("cel") or {}).get("expression")
        if not isinstance(expr, str) or not expr.strip():
            raise DraParseError(f"{where}[{i}].cel.expression is empty")
        out.append(expr)
    return tuple(out)


def _sub_request(name: str, m: Mapping[str, Any], where: str) -> SubRequest:
    cls = m.get("deviceClassName")
    if not cls:
        raise DraParseError(f"{where}.deviceClassName is empty")
    mode = m.get("allocationMode") or ALLOCATION_MODE_EXACT
    if mode not in (ALLOCATION_MODE_EXACT, ALLOCATION_MODE_ALL):
        raise DraParseError(f'{where}.allocationMode: "{mode}" is not ExactCount or All')
    count = m.get("count", 1) if mode == ALLOCATION_MODE_EXACT else 0
    if mode == ALLOCATION_MODE_EXACT and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise DraParseError(f"{where}.count: {count!r} is not a positive integer")
    caps = (m.get("capacity") or {}).get("requests") or {}
    return SubRequest(name=name, device_class=str(cls), selectors=_selectors(m.get("selectors"), f"{where}.selectors"),
                      mode=mode, count=int(count), admin_access=bool(m.get("adminAccess")),
                      tolerations=parse_tolerations(m.get("tolerations"), f"{where}.tolerations"),
                      capacity={str(k): quantity(v, f"{where}.capacity.requests.{k}") for k, v in caps.items()})


def _allocation(status: Mapping[str, Any], where: str) -> tuple[tuple[AllocatedDevice, ...] | None, str | None]:
    alloc = status.get("allocation")
    if not alloc:
        return None, None
    results = []
    for r in expect_list((alloc.get("devices") or {}).get("results"), f"{where}.allocation.devices.results"):
        consumed = {str(k): quantity(v, f"{where}.consumedCapacity.{k}")
                    for k, v in (r.get("consumedCapacity") or {}).items()}
        results.append(AllocatedDevice(str(r.get("request", "")), str(r.get("driver", "")), str(r.get("pool", "")),
                                       str(r.get("device", "")), bool(r.get("adminAccess")), r.get("shareID"),
                                       consumed))
    node = None
    for term in (alloc.get("nodeSelector") or {}).get("nodeSelectorTerms") or ():
        for f in list(term.get("matchFields") or ()) + list(term.get("matchExpressions") or ()):
            if f.get("key") in ("metadata.name", "kubernetes.io/hostname") and f.get("operator") == "In" \
                    and len(f.get("values") or ()) == 1:
                node = str(f["values"][0])
    return tuple(results), node


def parse_claim(obj: Mapping[str, Any]) -> Claim:
    """A ResourceClaim -> :class:`Claim`; :class:`DraParseError` names the field at fault."""
    meta = meta_of(obj)
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    where = f"ResourceClaim {ns}/{name}"
    devices = expect_mapping(expect_mapping(obj.get("spec"), f"{where}: spec").get("devices"),
                             f"{where}: spec.devices")
    requests = []
    for i, r in enumerate(expect_list(devices.get("requests"), f"{where}: spec.devices.requests")):
        rw = f"{where}: spec.devices.requests[{i}]"
        rname = str(r.get("name") or "")
        if r.get("exactly"):
            requests.append(Request(rname, (_sub_request(rname, r["exactly"], f"{rw}.exactly"),)))
        elif r.get("firstAvailable"):
            subs = tuple(_sub_request(str(s.get("name") or ""), s, f"{rw}.firstAvailable[{j}]")
                         for j, s in enumerate(expect_list(r["firstAvailable"], f"{rw}.firstAvailable")))
            requests.append(Request(rname, subs, first_available=True))
        elif r.get("deviceClassName"):  # v1beta1 shape, still served through conversion
            requests.append(Request(rname, (_sub_request(rname, r, rw),)))
        else:
            raise DraParseError(f"{rw}: neither exactly nor firstAvailable")
    constraints = []
    for c in expect_list(devices.get("constraints"), f"{where}: spec.devices.constraints"):
        constraints.append(Constraint(tuple(str(x) for x in c.get("requests") or ()),
                                      c.get("matchAttribute"), c.get("distinctAttribute")))
    status = expect_mapping(obj.get("status"), f"{where}: status")
    allocated, node = _allocation(status, f"{where}: status")
    owner = None
    for ref in meta.get("ownerReferences") or ():
        if ref.get("kind") == "Pod" and ref.get("controller"):
            owner = ref.get("uid")
    return Claim(
        namespace=ns, name=name, uid=str(meta.get("uid", "")), resource_version=str(meta.get("resourceVersion", "")),
        requests=tuple(requests), constraints=tuple(constraints), allocated=allocated, allocated_node=node,
        reserved_for=tuple((str(r.get("name", "")), str(r.get("uid", "")))
                           for r in status.get("reservedFor") or () if r.get("resource", "pods") == "pods"),
        finalizers=tuple(meta.get("finalizers") or ()), deleting=bool(meta.get("deletionTimestamp")),
        owner_pod_uid=owner, extended=ANN_EXTENDED_RESOURCE_CLAIM in (meta.get("annotations") or {}))


def pod_claim_names(pod: Mapping[str, Any]) -> list[tuple[str, str | None]]:
    """The pod's ``spec.resourceClaims``: (entry name, ResourceClaim name or None while the controller has not
    created the template's claim yet). A claim from a template is named in ``status.resourceClaimStatuses``."""
    spec = pod.get("spec") or {}
    statuses = {s.get("name"): s.get("resourceClaimName")
                for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()}
    out: list[tuple[str, str | None]] = []
    for e in spec.get("resourceClaims") or ():
        if e.get("resourceClaimName"):
            out.append((str(e.get("name")), str(e["resourceClaimName"])))
        elif e.get("resourceClaimTemplateName"):
            out.append((str(e.get("name")), statuses.get(e.get("name"))))
    return out


def claim_allocation_status(devices: Sequence[AllocatedDevice], node: str) -> dict[str, Any]:
    """``status.allocation`` for ``devices`` on ``node`` as kube-scheduler writes it (matchFields on
    ``metadata.name``)."""
    results = []
    for d in devices:
        r: dict[str, Any] = {"request": d.request, "driver": d.driver, "pool": d.pool, "device": d.device}
        if d.admin_access:
            r["adminAccess"] = True
        if d.share_id:
            r["shareID"] = d.share_id
        if d.consumed:
            r["consumedCapacity"] = {k: str(v) for k, v in d.consumed.items()}
        results.append(r)
    return {"devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}}


# ------------------------------------------------------------------ extended resources backed by DRA (1.34+)
IMPLICIT_EXTENDED_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Every DeviceClass also backs the extended resource ``deviceclass.resource.kubernetes.io/<class name>``."""


def extended_resource_classes(classes: Mapping[str, DeviceClass]) -> dict[str, str]:
    """Extended resource name -> DeviceClass backing it: ``spec.extendedResourceName`` (the first class by name
    when several name one resource) and the implicit ``deviceclass.resource.kubernetes.io/<class>``."""
    out: dict[str, str] = {}
    for name in sorted(classes):
        c = classes[name]
        out.setdefault(IMPLICIT_EXTENDED_PREFIX + name, name)
        if c.extended_resource_name:
            out.setdefault(c.extended_resource_name, name)
    return out


def extended_requests(pod: Mapping[str, Any], backed: Mapping[str, str]) -> tuple[list[Request], list[dict[str, str]]]:
    """The device requests kube-scheduler puts in the claim it makes for a pod's extended resources backed by DRA,
    and the pod's ``status.extendedResourceClaimStatus.requestMappings``: one request per container (init
    containers first) and resource, named ``container-<container index>-request-<index of the resource among the
    container's sorted request names>``, ``ExactCount`` of the requested amount, sorted by name (the spelling of
    kube-scheduler's dynamicresources plugin, KEP-5004)."""
    spec = pod.get("spec") or {}
    containers = list(spec.get("initContainers") or ()) + list(spec.get("containers") or ())
    reqs: list[Request] = []
    mappings: list[dict[str, str]] = []
    for i, c in enumerate(containers):
        res = (c.get("resources") or {}) if isinstance(c, Mapping) else {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        keys = sorted(asked)
        for ridx, rname in enumerate(keys):
            cls = backed.get(rname)
            if cls is None:
                continue
            try:
                count = int(quantity(asked[rname], rname))
            except RequestParseError:
                continue
            if count <= 0:
                continue
            req_name = f"container-{i}-request-{ridx}"
            reqs.append(Request(req_name, (SubRequest(req_name, cls, count=count),)))
            mappings.append({"containerName": str(c.get("name", "")), "resourceName": rname,
                             "requestName": req_name})
    reqs.sort(key=lambda r: r.name)
    return reqs, mappings


def extended_claim_body(pod: Mapping[str, Any], requests: Sequence[Request]) -> dict[str, Any]:
    """The ResourceClaim kube-scheduler creates for a pod's extended resources backed by DRA: ``generateName``
    ``<pod>-extended-resources-``, the annotation :data:`ANN_EXTENDED_RESOURCE_CLAIM`, owned by the pod (so it
    goes with it)."""
    meta = pod.get("metadata") or {}
    return {"apiVersion": DRA_API, "kind": "ResourceClaim",
            "metadata": {"generateName": f"{meta.get('name', '')}-extended-resources-",
                         "namespace": meta.get("namespace", "default"),
                         "annotations": {ANN_EXTENDED_RESOURCE_CLAIM: "true"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta.get("name", ""),
                                              "uid": meta.get("uid", ""), "controller": True,
                                              "blockOwnerDeletion": True}]},
            "spec": {"devices": {"requests": [
                {"name": r.name, "exactly": {"deviceClassName": r.alternatives[0].device_class,
                                             "allocationMode": ALLOCATION_MODE_EXACT,
                                             "count": r.alternatives[0].count}} for r in requests]}}}
