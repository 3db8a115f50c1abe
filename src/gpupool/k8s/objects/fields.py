"""Reading fields of Kubernetes API dicts: accessors that never raise, shape checks, quantities and a pod's
effective resources; :class:`RequestParseError`. Imports nothing of gpupool.k8s but its conventions."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpupool.model import GpupoolError

MIB = 1 << 20
MIG_PROFILE = re.compile(r"(\d)g\.(\d+)gb(\+me)?")


class RequestParseError(GpupoolError, ValueError):
    """A pod (or PodGroup, Queue) whose request gpupool cannot read; the message names the field at fault."""


# ------------------------------------------------------------------ small accessors
# They never raise: a field of the wrong type reads as absent. :func:`check_pod_shape` (run by
# :func:`describe_pod`) is what reports such a field.
_EMPTY: Mapping[str, Any] = {}


def mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else _EMPTY


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(obj.get("metadata")) if isinstance(obj, Mapping) else _EMPTY


def spec_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping(obj.get("spec")) if isinstance(obj, Mapping) else _EMPTY


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of any namespaced object (``default`` namespace when none is given)."""
    meta = meta_of(obj)
    name = meta.get("name")
    return f"{meta.get('namespace') or 'default'}/{'' if name is None else name}"


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` (the name gpupool gives the pod's :class:`PodRequest`)."""
    return object_key(pod)


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return mapping(meta_of(obj).get("annotations"))


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return mapping(meta_of(obj).get("labels"))


def node_name_of(pod: Mapping[str, Any]) -> str:
    """``spec.nodeName`` ("" while the pod is not bound)."""
    name = spec_of(pod).get("nodeName")
    return str(name) if name else ""


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """True once the pod has finished (``Succeeded`` / ``Failed``) and holds nothing any more."""
    status = pod.get("status") if isinstance(pod, Mapping) else None
    return mapping(status).get("phase") in ("Succeeded", "Failed")


def deletion_time(pod: Mapping[str, Any]) -> float | None:
    """When a pod being deleted (``metadata.deletionTimestamp``: the time its grace period ends) must be gone,
    seconds since the epoch; None when it is not being deleted. An unreadable stamp reads as 0 (overdue)."""
    stamp = meta_of(pod).get("deletionTimestamp") if isinstance(pod, Mapping) else None
    if not stamp:
        return None
    at = parse_time(stamp)
    return 0.0 if at is None else at


def spec_unreadable(pod: Mapping[str, Any]) -> bool:
    """True when the pod's ``spec`` is there but not a mapping (which scheduler it names cannot be told)."""
    return not isinstance(pod, Mapping) or (pod.get("spec") is not None and not isinstance(pod.get("spec"), Mapping))


def is_waiting_for(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """True for a pod that ``scheduler_name`` should place now.

    Unbound, not finished, not being deleted, without scheduling gates, and naming that scheduler.
    """
    spec = spec_of(pod)
    return (
        spec.get("schedulerName", "default-scheduler") == scheduler_name
        and not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and not meta_of(pod).get("deletionTimestamp")
        and not is_terminal(pod)
    )


def parse_time(value: Any) -> float | None:
    """RFC 3339 timestamp (``2024-05-01T12:00:00Z``) -> seconds since the epoch; None if absent or unreadable."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


# ------------------------------------------------------------------ object shapes
def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def expect_mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` (None: empty) if it is a mapping, else :class:`RequestParseError` naming ``where``."""
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise RequestParseError(f"{where}: expected a mapping, got {type(value).__name__} {_shown(value)}")
    return value


def expect_list(value: Any, where: str, of_mappings: bool = True) -> list[Any]:
    """``value`` (None: empty) if it is a list (of mappings), else :class:`RequestParseError` naming ``where``."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise RequestParseError(f"{where}: expected a list, got {type(value).__name__} {_shown(value)}")
    if of_mappings:
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                raise RequestParseError(f"{where}[{i}]: expected a mapping, got {type(item).__name__} {_shown(item)}")
    return value


def check_selector_terms(terms: Any, where: str) -> None:
    """``nodeSelectorTerms`` (a list of terms, each with lists of matchExpressions / matchFields)."""
    for i, term in enumerate(expect_list(terms, where)):
        for part in ("matchExpressions", "matchFields"):
            for j, expr in enumerate(expect_list(term.get(part), f"{where}[{i}].{part}")):
                expect_list(expr.get("values"), f"{where}[{i}].{part}[{j}].values", of_mappings=False)


def check_pod_shape(pod: Any) -> None:
    """Raise :class:`RequestParseError` naming the first field of ``pod`` whose type is wrong (a mapping where
    a list belongs, ...); the accessors above read such a field as absent, this is what reports it."""
    if not isinstance(pod, Mapping):
        raise RequestParseError(f"expected a mapping, got {type(pod).__name__}")
    meta = expect_mapping(pod.get("metadata"), "metadata")
    for name in ("name", "namespace"):
        if meta.get(name) is not None and not isinstance(meta.get(name), str):
            raise RequestParseError(f"metadata.{name}: expected a string, got {_shown(meta.get(name))}")
    expect_mapping(meta.get("labels"), "metadata.labels")
    expect_mapping(meta.get("annotations"), "metadata.annotations")
    spec = expect_mapping(pod.get("spec"), "spec")
    expect_mapping(pod.get("status"), "status")
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(expect_list(spec.get(kind), f"spec.{kind}")):
            resources = expect_mapping(c.get("resources"), f"spec.{kind}[{i}].resources")
            for part in ("limits", "requests"):
                expect_mapping(resources.get(part), f"spec.{kind}[{i}].resources.{part}")
    expect_mapping(spec.get("overhead"), "spec.overhead")
    expect_mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    expect_list(spec.get("tolerations"), "spec.tolerations")
    affinity = expect_mapping(spec.get("affinity"), "spec.affinity")
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        expect_mapping(affinity.get(kind), f"spec.affinity.{kind}")
    required = expect_mapping(mapping(affinity.get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"),
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution")
    check_selector_terms(required.get("nodeSelectorTerms"),
                         "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms")
    expect_list(spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints")


# ------------------------------------------------------------------ quantities
MAX_QUANTITY = Decimal(2) ** 63  # Kubernetes stores quantities as int64 (milli-units for CPU)


def quantity(value: Any, where: str) -> Decimal:
    """A finite, non-negative Kubernetes quantity (NaN and Infinity are not quantities)."""
    try:
        q = Decimal(parse_quantity(value if isinstance(value, str | int | float) else str(value)))
        finite = q.is_finite()
    except (ValueError, TypeError, ArithmeticError):
        finite = False
    if not finite:
        raise RequestParseError(f'{where}: "{value}" is not a Kubernetes quantity') from None
    if q < 0:
        raise RequestParseError(f'{where}: "{value}" is negative')
    if q > MAX_QUANTITY:
        raise RequestParseError(f'{where}: "{value}" is too large')
    return q


def whole(value: Any, where: str, minimum: int = 0) -> int:
    q = quantity(value, where)
    if q != q.to_integral_value():
        raise RequestParseError(f'{where}: "{value}" is not a whole number')
    if q < minimum:
        raise RequestParseError(f'{where}: "{value}" must be at least {minimum}')
    return int(q)


def number(value: str, where: str) -> float:
    """A finite float, else :class:`RequestParseError` with message ``where``."""
    try:
        x = float(str(value).strip())
    except ValueError:
        raise RequestParseError(where) from None
    if not math.isfinite(x):
        raise RequestParseError(where)
    return x


def int_annotation(value: str, where: str, lo: int, hi: int | None = None) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise RequestParseError(f"{where}: must be a whole number" + (f" in {lo}..{hi}" if hi else f" >= {lo}"))
    if len(text.lstrip("+-")) > 18:
        raise RequestParseError(f"{where}: must be" + (f" in {lo}..{hi}" if hi else f" >= {lo}") + ": too large")
    x = int(text)
    if x < lo or (hi is not None and x > hi):
        raise RequestParseError(f"{where}: must be" + (f" in {lo}..{hi}" if hi else f" >= {lo}"))
    return x


def memory_mib(value: Any, where: str) -> int:
    """GPU memory: a plain number is MiB (KAI, HAMi); a quantity with a unit (``20Gi``) is bytes."""
    text = str(value).strip()
    q = quantity(text, where)
    if re.fullmatch(r"[0-9.]+([eE][+-]?[0-9]+)?", text):  # a plain number (1e3 too, a quantity's exponent form): MiB
        mib = math.ceil(q)
    else:
        mib = math.ceil(q / MIB)
    if mib <= 0:
        raise RequestParseError(f"{where}: must be a positive amount of MiB")
    return mib


# ------------------------------------------------------------------ resources
def container_requests(container: Mapping[str, Any], where: str) -> dict[str, Decimal]:
    resources = expect_mapping(container.get("resources"), f"{where}.resources")
    out: dict[str, Decimal] = {}
    for kind in ("limits", "requests"):  # requests override limits; a limit alone counts as the request
        for name, value in expect_mapping(resources.get(kind), f"{where}.resources.{kind}").items():
            out[name] = quantity(value, f'{where}.resources.{kind}["{name}"]')
    return out


def pod_resources(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective request of every resource (CPU in cores, memory in bytes, extended resources as counts)."""
    spec = expect_mapping(pod.get("spec"), "spec")
    total: dict[str, Decimal] = {}

    def add(into: dict[str, Decimal], res: Mapping[str, Decimal]) -> None:
        for k, v in res.items():
            into[k] = into.get(k, Decimal(0)) + v

    for i, c in enumerate(expect_list(spec.get("containers"), "spec.containers")):
        add(total, container_requests(c, f"spec.containers[{i}]"))
    init_max: dict[str, Decimal] = {}
    for i, c in enumerate(expect_list(spec.get("initContainers"), "spec.initContainers")):
        res = container_requests(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":  # sidecar: runs beside the app containers
            add(total, res)
        else:
            for k, v in res.items():
                init_max[k] = max(init_max.get(k, Decimal(0)), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, Decimal(0)), v)
    for name, value in expect_mapping(spec.get("overhead"), "spec.overhead").items():
        total[name] = total.get(name, Decimal(0)) + quantity(value, f'spec.overhead["{name}"]')
    return total
