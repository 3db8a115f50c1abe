"""Pods (as the API returns them, plain dicts) -> what they ask of gpupool.

A cluster switching to gpupool keeps its manifests, so every spelling platform teams already use is
read here (sources: the public docs and source of NVIDIA KAI-Scheduler, HAMi, Volcano, Kueue,
kubernetes-sigs/scheduler-plugins, NVIDIA k8s-device-plugin / GPU Feature Discovery and Alibaba's FGD
simulator; the constants are in :mod:`gpupool.k8s`):

============================================  ===============================================
spelling                                      meaning in gpupool
============================================  ===============================================
limits ``nvidia.com/gpu: N``                  N whole GPUs (N replicas on a time-sliced node:
                                              see :func:`gpupool.cluster.slice_ask`)
annotation ``gpu-fraction: "0.25"`` (KAI)     one GPU, 250 milli (``gpu-fraction-num-devices: N``:
                                              N distinct GPUs, 250 milli of each)
annotation ``gpu-memory: "2000"`` (KAI)       one GPU, 2000 MiB of its memory (share 1 milli, so
                                              memory is the constraint); ``"20Gi"`` also read;
                                              with ``gpu-fraction-num-devices: N``, N GPUs
limits ``nvidia.com/gpu`` + ``gpucores``,     HAMi vGPU: N GPUs, share = cores % (else memory %),
``gpumem`` (MiB), ``gpumem-percentage``       memory per GPU from ``gpumem``
limits ``volcano.sh/vgpu-number/-memory/``    the same, Volcano's spelling
``-cores``
annotations ``alibabacloud.com/gpu-milli``,   the openb trace's own spelling
``alibabacloud.com/gpu-count``
limits ``nvidia.com/mig-<profile>: 1``        one MIG device of that profile (MIG "mixed"
                                              strategy; counted per node, no GPU share)
annotation ``gpupool.io/gpu-model``           allowed GPU models (catalog names or GFD products)
annotations ``nvidia.com/use-gputype``,       HAMi / Volcano GPU type selection: comma-separated
``nvidia.com/nouse-gputype``                  case-insensitive substrings of the model / product
============================================  ===============================================

Several GPUs with a share of each (HAMi ``nvidia.com/gpu: 2`` + ``gpumem``/``gpucores``, Volcano
``vgpu-number: 2``, KAI ``gpu-fraction-num-devices: 2`` with a fraction or ``gpu-memory``, Alibaba
``gpu-count: 2`` with ``gpu-milli``) are ``num_gpu`` distinct GPUs, each with that share and memory.
HAMi and Volcano vGPU limits are read per container, as HAMi allocates them (see :func:`_hami_like`).

Gangs: the scheduler-plugins label ``scheduling.x-k8s.io/pod-group``, Volcano's annotation
``scheduling.k8s.io/group-name`` (or ``scheduling.volcano.sh/group-name``), KAI's ``pod-group-name``.
Queues: the labels ``kueue.x-k8s.io/queue-name``, ``kai.scheduler/queue`` (``runai/queue``) or
Volcano's annotation ``scheduling.volcano.sh/queue-name``, each naming a gpupool ``Queue``.

Whatever cannot be read raises :class:`RequestParseError` whose message names the pod, the field or
annotation and what is wrong with it, e.g. ``pod default/a: annotation gpu-fraction="1.5": must be a
number in (0, 1]``. The pod then stays pending with that message; nothing else is affected.

CPU, memory and extended resources follow kube-scheduler's effective request: the sum over
containers (plus sidecar init containers), or the largest init container if that is more, plus the
pod overhead; a resource given only as a limit counts as its request.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpupool.catalog import resolve_name
from gpupool.k8s import (
    ANN_ALIBABA_GPU_COUNT,
    ANN_ALIBABA_GPU_MILLI,
    ANN_GPU_MODEL,
    ANN_HAMI_DEVICES_ALLOCATED,
    ANN_HAMI_DEVICES_TO_ALLOCATE,
    ANN_HAMI_NODE,
    ANN_HAMI_NOUSE_GPUTYPE,
    ANN_HAMI_USE_GPUTYPE,
    ANN_KAI_FRACTION,
    ANN_KAI_MEMORY,
    ANN_KAI_MIN_MEMBER,
    ANN_KAI_NUM_DEVICES,
    ANN_KAI_POD_GROUP,
    ANN_MIN_MEMBER,
    ANN_VOLCANO_GROUP,
    ANN_VOLCANO_GROUP_ALT,
    ANN_VOLCANO_QUEUE,
    LABEL_KAI_QUEUE,
    LABEL_KUEUE_QUEUE,
    LABEL_POD_GROUP,
    LABEL_RUNAI_QUEUE,
    RES_GPU,
    RES_HAMI_GPUCORES,
    RES_HAMI_GPUMEM,
    RES_HAMI_GPUMEM_PERCENT,
    RES_MIG_PREFIX,
    RES_VOLCANO_VGPU_CORES,
    RES_VOLCANO_VGPU_MEMORY,
    RES_VOLCANO_VGPU_NUMBER,
)
from gpupool.model import MILLI, GpupoolError, InvalidRequestError, PodRequest

MIB = 1 << 20
MIG_PROFILE = re.compile(r"(\d)g\.(\d+)gb(\+me)?")


class RequestParseError(GpupoolError, ValueError):
    """A pod (or PodGroup, Queue) whose request gpupool cannot read; the message names the field at fault."""


# ------------------------------------------------------------------ small accessors
# They never raise: a field of the wrong type reads as absent. :func:`check_pod_shape` (run by
# :func:`describe_pod`) is what reports such a field.
_EMPTY: Mapping[str, Any] = {}


def _mapping(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else _EMPTY


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("metadata")) if isinstance(obj, Mapping) else _EMPTY


def _spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return _mapping(obj.get("spec")) if isinstance(obj, Mapping) else _EMPTY


def object_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of any namespaced object (``default`` namespace when none is given)."""
    meta = _meta(obj)
    name = meta.get("name")
    return f"{meta.get('namespace') or 'default'}/{'' if name is None else name}"


def pod_key(pod: Mapping[str, Any]) -> str:
    """``namespace/name`` (the name gpupool gives the pod's :class:`PodRequest`)."""
    return object_key(pod)


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _mapping(_meta(obj).get("annotations"))


def labels_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return _mapping(_meta(obj).get("labels"))


def node_name_of(pod: Mapping[str, Any]) -> str:
    """``spec.nodeName`` ("" while the pod is not bound)."""
    name = _spec(pod).get("nodeName")
    return str(name) if name else ""


def is_terminal(pod: Mapping[str, Any]) -> bool:
    """True once the pod has finished (``Succeeded`` / ``Failed``) and holds nothing any more."""
    status = pod.get("status") if isinstance(pod, Mapping) else None
    return _mapping(status).get("phase") in ("Succeeded", "Failed")


def spec_unreadable(pod: Mapping[str, Any]) -> bool:
    """True when the pod's ``spec`` is there but not a mapping (which scheduler it names cannot be told)."""
    return not isinstance(pod, Mapping) or (pod.get("spec") is not None and not isinstance(pod.get("spec"), Mapping))


def is_waiting_for(pod: Mapping[str, Any], scheduler_name: str) -> bool:
    """True for a pod that ``scheduler_name`` should place now.

    Unbound, not finished, not being deleted, without scheduling gates, and naming that scheduler.
    """
    spec = _spec(pod)
    return (
        spec.get("schedulerName", "default-scheduler") == scheduler_name
        and not spec.get("nodeName")
        and not spec.get("schedulingGates")
        and not _meta(pod).get("deletionTimestamp")
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


def _expect_mapping(value: Any, where: str) -> Mapping[str, Any]:
    """``value`` (None: empty) if it is a mapping, else :class:`RequestParseError` naming ``where``."""
    if value is None:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise RequestParseError(f"{where}: expected a mapping, got {type(value).__name__} {_shown(value)}")
    return value


def _expect_list(value: Any, where: str, of_mappings: bool = True) -> list[Any]:
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
    for i, term in enumerate(_expect_list(terms, where)):
        for part in ("matchExpressions", "matchFields"):
            for j, expr in enumerate(_expect_list(term.get(part), f"{where}[{i}].{part}")):
                _expect_list(expr.get("values"), f"{where}[{i}].{part}[{j}].values", of_mappings=False)


def check_pod_shape(pod: Any) -> None:
    """Raise :class:`RequestParseError` naming the first field of ``pod`` whose type is wrong (a mapping where
    a list belongs, ...); the accessors above read such a field as absent, this is what reports it."""
    if not isinstance(pod, Mapping):
        raise RequestParseError(f"expected a mapping, got {type(pod).__name__}")
    meta = _expect_mapping(pod.get("metadata"), "metadata")
    for name in ("name", "namespace"):
        if meta.get(name) is not None and not isinstance(meta.get(name), str):
            raise RequestParseError(f"metadata.{name}: expected a string, got {_shown(meta.get(name))}")
    _expect_mapping(meta.get("labels"), "metadata.labels")
    _expect_mapping(meta.get("annotations"), "metadata.annotations")
    spec = _expect_mapping(pod.get("spec"), "spec")
    _expect_mapping(pod.get("status"), "status")
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(_expect_list(spec.get(kind), f"spec.{kind}")):
            resources = _expect_mapping(c.get("resources"), f"spec.{kind}[{i}].resources")
            for part in ("limits", "requests"):
                _expect_mapping(resources.get(part), f"spec.{kind}[{i}].resources.{part}")
    _expect_mapping(spec.get("overhead"), "spec.overhead")
    _expect_mapping(spec.get("nodeSelector"), "spec.nodeSelector")
    _expect_list(spec.get("tolerations"), "spec.tolerations")
    affinity = _expect_mapping(spec.get("affinity"), "spec.affinity")
    for kind in ("nodeAffinity", "podAffinity", "podAntiAffinity"):
        _expect_mapping(affinity.get(kind), f"spec.affinity.{kind}")
    required = _expect_mapping(_mapping(affinity.get("nodeAffinity")).get(
        "requiredDuringSchedulingIgnoredDuringExecution"),
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution")
    check_selector_terms(required.get("nodeSelectorTerms"),
                         "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms")
    _expect_list(spec.get("topologySpreadConstraints"), "spec.topologySpreadConstraints")


# ------------------------------------------------------------------ quantities
MAX_QUANTITY = Decimal(2) ** 63  # Kubernetes stores quantities as int64 (milli-units for CPU)


def _quantity(value: Any, where: str) -> Decimal:
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


def _whole(value: Any, where: str, minimum: int = 0) -> int:
    q = _quantity(value, where)
    if q != q.to_integral_value():
        raise RequestParseError(f'{where}: "{value}" is not a whole number')
    if q < minimum:
        raise RequestParseError(f'{where}: "{value}" must be at least {minimum}')
    return int(q)


def _number(value: str, where: str) -> float:
    """A finite float, else :class:`RequestParseError` with message ``where``."""
    try:
        x = float(str(value).strip())
    except ValueError:
        raise RequestParseError(where) from None
    if not math.isfinite(x):
        raise RequestParseError(where)
    return x


def _int_annotation(value: str, where: str, lo: int, hi: int | None = None) -> int:
    text = str(value).strip()
    if not re.fullmatch(r"[+-]?\d+", text):
        raise RequestParseError(f"{where}: must be a whole number" + (f" in {lo}..{hi}" if hi else f" >= {lo}"))
    if len(text.lstrip("+-")) > 18:
        raise RequestParseError(f"{where}: must be" + (f" in {lo}..{hi}" if hi else f" >= {lo}") + ": too large")
    x = int(text)
    if x < lo or (hi is not None and x > hi):
        raise RequestParseError(f"{where}: must be" + (f" in {lo}..{hi}" if hi else f" >= {lo}"))
    return x


def _memory_mib(value: Any, where: str) -> int:
    """GPU memory: a plain number is MiB (KAI, HAMi); a quantity with a unit (``20Gi``) is bytes."""
    text = str(value).strip()
    q = _quantity(text, where)
    if re.fullmatch(r"[0-9.]+([eE][+-]?[0-9]+)?", text):  # a plain number (1e3 too, a quantity's exponent form): MiB
        mib = math.ceil(q)
    else:
        mib = math.ceil(q / MIB)
    if mib <= 0:
        raise RequestParseError(f"{where}: must be a positive amount of MiB")
    return mib


# ------------------------------------------------------------------ resources
def _container_requests(container: Mapping[str, Any], where: str) -> dict[str, Decimal]:
    resources = _expect_mapping(container.get("resources"), f"{where}.resources")
    out: dict[str, Decimal] = {}
    for kind in ("limits", "requests"):  # requests override limits; a limit alone counts as the request
        for name, value in _expect_mapping(resources.get(kind), f"{where}.resources.{kind}").items():
            out[name] = _quantity(value, f'{where}.resources.{kind}["{name}"]')
    return out


def pod_resources(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """Effective request of every resource (CPU in cores, memory in bytes, extended resources as counts)."""
    spec = _expect_mapping(pod.get("spec"), "spec")
    total: dict[str, Decimal] = {}

    def add(into: dict[str, Decimal], res: Mapping[str, Decimal]) -> None:
        for k, v in res.items():
            into[k] = into.get(k, Decimal(0)) + v

    for i, c in enumerate(_expect_list(spec.get("containers"), "spec.containers")):
        add(total, _container_requests(c, f"spec.containers[{i}]"))
    init_max: dict[str, Decimal] = {}
    for i, c in enumerate(_expect_list(spec.get("initContainers"), "spec.initContainers")):
        res = _container_requests(c, f"spec.initContainers[{i}]")
        if c.get("restartPolicy") == "Always":  # sidecar: runs beside the app containers
            add(total, res)
        else:
            for k, v in res.items():
                init_max[k] = max(init_max.get(k, Decimal(0)), v)
    for k, v in init_max.items():
        total[k] = max(total.get(k, Decimal(0)), v)
    for name, value in _expect_mapping(spec.get("overhead"), "spec.overhead").items():
        total[name] = total.get(name, Decimal(0)) + _quantity(value, f'spec.overhead["{name}"]')
    return total


# ------------------------------------------------------------------ GPU spellings
@dataclass(frozen=True, slots=True)
class GpuAsk:
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    spelling: str = ""


def _hami_container(res: Mapping[str, Decimal], count_key: str, mem_key: str, pct_key: str | None,
                    cores_key: str, spelling: str, where: str = "") -> GpuAsk:
    """One container's vGPU ask (HAMi / Volcano): ``count_key`` cards, each with the share from the cores
    (else memory) percentage and ``mem_key`` MiB of memory. ``where`` prefixes field names in errors."""
    prefix = f"{where}." if where else ""
    if count_key not in res:
        extra = [k for k in (mem_key, pct_key, cores_key) if k and k in res]
        raise RequestParseError(f'{prefix}resources["{extra[0]}"] given without resources["{count_key}"]')
    n = _whole(res[count_key], f'{prefix}resources["{count_key}"]', minimum=1)
    cores = _whole(res[cores_key], f'{prefix}resources["{cores_key}"]') if cores_key in res else 0
    pct = _whole(res[pct_key], f'{prefix}resources["{pct_key}"]') if pct_key and pct_key in res else 0
    mem = _whole(res[mem_key], f'{prefix}resources["{mem_key}"]') if mem_key in res else 0
    for key, value in ((cores_key, cores), (pct_key, pct)):
        if key and key in res and not 1 <= value <= 100:
            raise RequestParseError(f'{prefix}resources["{key}"]={value}: must be a percentage in 1..100')
    if mem_key in res and mem <= 0:
        raise RequestParseError(f'{prefix}resources["{mem_key}"]: must be a positive amount of MiB')
    if cores:
        milli = max(cores, pct) * 10  # with both, the larger: memory in proportion covers the percentage
    elif pct:
        milli = pct * 10  # memory in proportion to the share
    elif mem:
        milli = 1  # memory is the constraint
    else:
        milli = MILLI  # a vGPU without limits takes all of the GPU's memory: a whole GPU
    return GpuAsk(n, milli, mem, (), spelling)


def _gpu_containers(pod: Mapping[str, Any]) -> list[tuple[str, dict[str, Decimal], bool]]:
    """(field path, resources, runs beside the app) of every container and init container; sidecar init
    containers (``restartPolicy: Always``) run beside the app containers, other init containers before them."""
    spec = _expect_mapping(pod.get("spec"), "spec")
    out: list[tuple[str, dict[str, Decimal], bool]] = []
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(_expect_list(spec.get(kind), f"spec.{kind}")):
            where = f"spec.{kind}[{i}]"
            concurrent = kind == "containers" or c.get("restartPolicy") == "Always"
            out.append((where, _container_requests(c, where), concurrent))
    return out


def _hami_like(pod: Mapping[str, Any], count_key: str, mem_key: str, pct_key: str | None,
               cores_key: str, spelling: str) -> GpuAsk:
    """A vGPU pod (HAMi / Volcano), read per container as HAMi allocates: each container asking
    ``count_key: N`` gets N cards of its own with its ``mem_key`` MiB and cores share on each.

    gpupool books one share per card for the whole pod: the containers' cards add up (distinct cards,
    never one container's memory doubled onto a card), each card booked with the largest share and the
    largest memory any container asks per card (exact when the containers ask the same per card, an
    over-estimate otherwise). Init containers run before the app containers, so they count as the larger of
    their own ask and the app containers' total. Raises :class:`RequestParseError` when one container gives
    a memory amount and another a share of memory in proportion (no single per-card booking holds both),
    naming both containers.
    """
    asks: list[tuple[str, GpuAsk, bool]] = []
    keys = {k for k in (count_key, mem_key, pct_key, cores_key) if k}
    for where, res, concurrent in _gpu_containers(pod):
        if keys & res.keys():
            asks.append((where, _hami_container(res, count_key, mem_key, pct_key, cores_key, spelling, where),
                         concurrent))
    if not asks:
        return GpuAsk(spelling=spelling)
    beside = sum(a.num_gpu for _, a, concurrent in asks if concurrent)
    before = max((a.num_gpu for _, a, concurrent in asks if not concurrent), default=0)
    milli = max(a.gpu_milli for _, a, _ in asks)
    sized = [(w, a) for w, a, _ in asks if a.gpu_memory_mib]
    proportional = [(w, a) for w, a, _ in asks if not a.gpu_memory_mib and a.gpu_milli < MILLI]
    if sized and proportional:
        raise RequestParseError(
            f'{sized[0][0]} asks {sized[0][1].gpu_memory_mib} MiB of GPU memory per card but {proportional[0][0]} '
            f"a share of the GPU's memory in proportion ({proportional[0][1].gpu_milli} milli): gpupool books one "
            "share per card for the pod; give every GPU container the same kind of memory limit"
        )
    mem = max((a.gpu_memory_mib for _, a in sized), default=0)
    return GpuAsk(max(beside, before), milli, mem, (), spelling)


def _kai(ann: Mapping[str, str], res: Mapping[str, Decimal]) -> GpuAsk:
    if RES_GPU in res:
        raise RequestParseError(
            f'annotation {ANN_KAI_FRACTION if ANN_KAI_FRACTION in ann else ANN_KAI_MEMORY} together with '
            f'resources["{RES_GPU}"]: a fractional (KAI) pod must not also ask for whole GPUs'
        )
    if ANN_KAI_FRACTION in ann and ANN_KAI_MEMORY in ann:
        raise RequestParseError(f"annotations {ANN_KAI_FRACTION} and {ANN_KAI_MEMORY} are both set: give one")
    n = 1
    if ANN_KAI_NUM_DEVICES in ann:
        n = _int_annotation(ann[ANN_KAI_NUM_DEVICES], f'annotation {ANN_KAI_NUM_DEVICES}="{ann[ANN_KAI_NUM_DEVICES]}"',
                            1)
    if ANN_KAI_FRACTION in ann:
        raw = ann[ANN_KAI_FRACTION]
        where = f'annotation {ANN_KAI_FRACTION}="{raw}"'
        f = _number(raw, f"{where}: must be a number in (0, 1]")
        if not 0 < f <= 1:
            raise RequestParseError(f"{where}: must be a number in (0, 1]")
        milli = max(1, min(MILLI, round(f * MILLI)))
        return GpuAsk(n, milli, 0, (), "kai gpu-fraction")  # n distinct GPUs, that fraction of each
    raw = ann[ANN_KAI_MEMORY]
    mem = _memory_mib(raw, f'annotation {ANN_KAI_MEMORY}="{raw}"')
    return GpuAsk(n, 1, mem, (), "kai gpu-memory")  # n distinct GPUs, that much memory on each


def _alibaba(ann: Mapping[str, str]) -> GpuAsk:
    milli = MILLI
    n = 1
    if ANN_ALIBABA_GPU_MILLI in ann:
        raw = ann[ANN_ALIBABA_GPU_MILLI]
        milli = _int_annotation(raw, f'annotation {ANN_ALIBABA_GPU_MILLI}="{raw}"', 1, MILLI)
    if ANN_ALIBABA_GPU_COUNT in ann:
        raw = ann[ANN_ALIBABA_GPU_COUNT]
        n = _int_annotation(raw, f'annotation {ANN_ALIBABA_GPU_COUNT}="{raw}"', 0)
    if n == 0:
        return GpuAsk(spelling="alibaba")
    return GpuAsk(n, milli, 0, (), "alibaba")  # n distinct GPUs, that share of each


def _mig(res: Mapping[str, Decimal]) -> GpuAsk:
    mig: list[tuple[str, int]] = []
    for name, value in sorted(res.items()):
        if not name.startswith(RES_MIG_PREFIX):
            continue
        profile = name[len(RES_MIG_PREFIX):]
        if not MIG_PROFILE.fullmatch(profile):
            raise RequestParseError(f'resources["{name}"]: "{profile}" is not a MIG profile like 1g.10gb')
        count = _whole(value, f'resources["{name}"]')
        if count:
            mig.append((profile, count))
    return GpuAsk(0, 0, 0, tuple(mig), "mig")


def gpu_ask(pod: Mapping[str, Any], res: Mapping[str, Decimal] | None = None) -> GpuAsk:
    """The GPU part of a pod's request, from whichever spelling it uses (:class:`RequestParseError` if two
    spellings disagree or one is malformed)."""
    if res is None:
        res = pod_resources(pod)
    ann = annotations_of(pod)
    spellings = []
    if any(k.startswith(RES_MIG_PREFIX) for k in res):
        spellings.append("mig")
    if ANN_KAI_FRACTION in ann or ANN_KAI_MEMORY in ann:
        spellings.append("kai")
    if any(k in res for k in (RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES)):
        spellings.append("hami")
    if any(k in res for k in (RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, RES_VOLCANO_VGPU_CORES)):
        spellings.append("volcano")
    if ANN_ALIBABA_GPU_MILLI in ann or ANN_ALIBABA_GPU_COUNT in ann:
        spellings.append("alibaba")
    names = {
        "mig": "nvidia.com/mig-* resources",
        "kai": f"annotation {ANN_KAI_FRACTION}/{ANN_KAI_MEMORY} (KAI)",
        "hami": "nvidia.com/gpumem/gpucores resources (HAMi)",
        "volcano": "volcano.sh/vgpu-* resources (Volcano)",
        "alibaba": "alibabacloud.com/gpu-* annotations",
    }
    if len(spellings) > 1:
        raise RequestParseError(
            "conflicting GPU requests: " + " and ".join(names[s] for s in spellings) + "; use one spelling"
        )
    kind = spellings[0] if spellings else ""
    if kind == "mig":
        if RES_GPU in res and _whole(res[RES_GPU], f'resources["{RES_GPU}"]'):
            raise RequestParseError(
                f'resources["{RES_GPU}"] together with nvidia.com/mig-* resources: ask for one or the other'
            )
        return _mig(res)
    if kind == "kai":
        return _kai(ann, res)
    if kind == "hami":
        return _hami_like(pod, RES_GPU, RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES, "hami")
    if kind == "volcano":
        if RES_GPU in res and _whole(res[RES_GPU], f'resources["{RES_GPU}"]'):
            raise RequestParseError(
                f'conflicting GPU requests: volcano.sh/vgpu-* resources (Volcano) and resources["{RES_GPU}"]; '
                "use one spelling"
            )
        return _hami_like(pod, RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, None, RES_VOLCANO_VGPU_CORES,
                          "volcano")
    if kind == "alibaba":
        if RES_GPU in res:
            raise RequestParseError(
                f'alibabacloud.com/gpu-* annotations together with resources["{RES_GPU}"]: use one spelling'
            )
        return _alibaba(ann)
    if RES_GPU in res:
        n = _whole(res[RES_GPU], f'resources["{RES_GPU}"]')
        return GpuAsk(n, MILLI if n else 0, 0, (), "nvidia.com/gpu")
    return GpuAsk()


def gpu_spec_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Allowed GPU models from ``gpupool.io/gpu-model`` (catalog keys where known, else as written)."""
    raw = annotations_of(pod).get(ANN_GPU_MODEL)
    if raw is None:
        return ()
    names = [x.strip() for x in str(raw).split(",") if x.strip()]
    if not names:
        raise RequestParseError(f'annotation {ANN_GPU_MODEL}="{raw}": no GPU model named')
    return tuple(resolve_name(n) or n for n in names)


def gpu_types_of(pod: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include, exclude): GPU type selection from HAMi's (and Volcano vGPU's) ``nvidia.com/use-gputype`` and
    ``nvidia.com/nouse-gputype`` annotations, comma-separated substrings matched case-insensitively against
    the GPU model and product name (``"A100"`` selects ``NVIDIA-A100-SXM4-80GB``). A blank value selects
    nothing, as in HAMi (every type contains the empty string)."""
    ann = annotations_of(pod)
    out: list[tuple[str, ...]] = []
    for key in (ANN_HAMI_USE_GPUTYPE, ANN_HAMI_NOUSE_GPUTYPE):
        raw = ann.get(key)
        out.append(tuple(x.strip() for x in str(raw).split(",") if x.strip()) if raw is not None else ())
    return out[0], out[1]


# ------------------------------------------------------------------ the pod as a whole
@dataclass(frozen=True, slots=True)
class PodInfo:
    """Everything gpupool reads from one pod.

    ``mig``: MIG devices asked, (profile, count) pairs; ``pod_group``: the gang's ``namespace/name``;
    ``queue``: the gpupool Queue's name; ``min_member``: the gang size the pod itself declares
    (used when no PodGroup object exists). ``named_devices``: GPU UUIDs another scheduler recorded for a
    bound pod (HAMi's ``hami.io/vgpu-devices-allocated``, trusted only when ``hami.io/vgpu-node`` is the node
    the pod is bound to; see :func:`hami_devices`), one per card the pod holds, in container order.
    """

    key: str
    request: PodRequest
    mig: tuple[tuple[str, int], ...] = ()
    pod_group: str | None = None
    queue: str | None = None
    min_member: int | None = None
    named_devices: tuple[str, ...] = ()

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPU; a MIG device counts its compute slices (``3g.40gb`` = 3/7 GPU)."""
        mig = sum(int(MIG_PROFILE.fullmatch(p).group(1)) * MILLI // 7 * c for p, c in self.mig)  # type: ignore[union-attr]
        return self.request.total_gpu_milli + mig


def hami_devices(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """GPU UUIDs HAMi (or Volcano's HAMi-based vGPU) allocated to a bound pod, one per card, in container
    order: ``hami.io/vgpu-devices-allocated`` (else ``hami.io/vgpu-devices-to-allocate``), containers
    separated by ``;``, devices by ``:``, each ``UUID,Type,usedmem,usedcores``. ``()`` unless the pod is bound
    and ``hami.io/vgpu-node`` names that node, or when the value cannot be read (the pod is then counted
    conservatively on the lowest free devices)."""
    ann = annotations_of(pod)
    node = node_name_of(pod)
    if not node or ann.get(ANN_HAMI_NODE) != node:
        return ()
    raw = ann.get(ANN_HAMI_DEVICES_ALLOCATED) or ann.get(ANN_HAMI_DEVICES_TO_ALLOCATE)
    if not isinstance(raw, str) or len(raw) > 65536:
        return ()
    out: list[str] = []
    for container in raw.split(";"):
        for device in container.split(":"):
            uuid = device.split(",", 1)[0].strip()
            if uuid:
                out.append(uuid)
    return tuple(out)


def _with_pod(exc: Exception, pod: Mapping[str, Any]) -> RequestParseError:
    return RequestParseError(f"pod {pod_key(pod)}: {exc}")


def describe_pod(pod: Mapping[str, Any]) -> PodInfo:
    """Read everything gpupool needs from ``pod``; raises :class:`RequestParseError` naming the field at fault."""
    key = pod_key(pod)
    try:
        check_pod_shape(pod)
        res = pod_resources(pod)
        ask = gpu_ask(pod, res)
        cpu = math.ceil(res.get("cpu", Decimal(0)) * 1000)
        mem = math.ceil(res.get("memory", Decimal(0)) / MIB)
        spec = _spec(pod)
        priority = spec.get("priority") or 0
        if not isinstance(priority, int):
            raise RequestParseError(f"spec.priority={priority!r}: not an integer")
        labels = labels_of(pod)
        include, exclude = gpu_types_of(pod) if ask.num_gpu else ((), ())
        request = PodRequest(
            name=key,
            cpu_milli=cpu,
            memory_mib=mem,
            num_gpu=ask.num_gpu,
            gpu_milli=ask.gpu_milli,
            gpu_spec=gpu_spec_of(pod) if ask.num_gpu else (),
            gpu_memory_mib=ask.gpu_memory_mib,
            qos=str(_mapping(pod.get("status")).get("qosClass") or ""),
            priority=priority,
            creation_time=parse_time(_meta(pod).get("creationTimestamp")),
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            gpu_type_include=include,
            gpu_type_exclude=exclude,
        )
        return PodInfo(key, request, ask.mig, pod_group_of(pod), queue_of(pod), min_member_of(pod),
                       hami_devices(pod) if ask.num_gpu else ())
    except RequestParseError as exc:
        raise _with_pod(exc, pod) from None
    except InvalidRequestError as exc:  # PodRequest's own checks (already name the pod)
        raise RequestParseError(str(exc)) from None
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, ArithmeticError) as exc:
        # Whatever else a malformed object trips over: this pod alone is invalid.
        raise RequestParseError(f"pod {key}: invalid object: {type(exc).__name__}: {exc}") from None


def parse_pod(pod: Mapping[str, Any]) -> PodRequest:
    """``pod`` (the API's JSON as a dict) -> :class:`PodRequest` named ``namespace/name``.

    Raises :class:`RequestParseError` with a message naming the pod and exactly which field or
    annotation is wrong. A pod asking only for MIG devices gets a request without GPUs (MIG devices
    are counted per node, see :func:`describe_pod`).
    """
    return describe_pod(pod).request


# ------------------------------------------------------------------ gangs and queues
def pod_group_of(pod: Mapping[str, Any]) -> str | None:
    """``namespace/name`` of the pod's gang, from the scheduler-plugins label, Volcano's or KAI's annotation."""
    name = labels_of(pod).get(LABEL_POD_GROUP)
    ann = annotations_of(pod)
    for key in (ANN_VOLCANO_GROUP, ANN_VOLCANO_GROUP_ALT, ANN_KAI_POD_GROUP):
        if not name:
            name = ann.get(key)
    if not name:
        return None
    return f"{_meta(pod).get('namespace') or 'default'}/{name}"


def queue_of(pod: Mapping[str, Any]) -> str | None:
    """Name of the gpupool Queue the pod charges (Kueue, KAI or Volcano spelling); None if none."""
    labels = labels_of(pod)
    for key in (LABEL_KUEUE_QUEUE, LABEL_KAI_QUEUE, LABEL_RUNAI_QUEUE):
        if labels.get(key):
            return str(labels[key])
    q = annotations_of(pod).get(ANN_VOLCANO_QUEUE)
    return str(q) if q else None


def min_member_of(pod: Mapping[str, Any]) -> int | None:
    """Gang size declared on the pod itself (``gpupool.io/min-member`` or KAI's ``kai.scheduler/batch-min-member``)."""
    ann = annotations_of(pod)
    for key in (ANN_MIN_MEMBER, ANN_KAI_MIN_MEMBER):
        if key in ann:
            return _int_annotation(ann[key], f'annotation {key}="{ann[key]}"', 1)
    return None


def parse_pod_group(obj: Mapping[str, Any]) -> tuple[str, int]:
    """A PodGroup (scheduler-plugins or Volcano) -> (``namespace/name``, minMember >= 1)."""
    key = object_key(obj)
    if not isinstance(obj, Mapping):
        raise RequestParseError(f"PodGroup {key}: expected a mapping")
    try:
        _expect_mapping(obj.get("metadata"), "metadata")
        spec = _expect_mapping(obj.get("spec"), "spec")
    except RequestParseError as exc:
        raise RequestParseError(f"PodGroup {key}: {exc}") from None
    raw = spec.get("minMember", 1)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise RequestParseError(f"PodGroup {key}: spec.minMember={raw!r}: must be a whole number >= 1")
    return key, raw


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """A gpupool ``Queue`` (group gpupool.io): GPU ``quota`` and ``limit`` in milli-GPU (``limit`` None =
    unlimited), fair-share ``weight``, ``parent`` queue ("" for a root) and ``priority``."""

    name: str
    quota_milli: int = 0
    limit_milli: int | None = None
    weight: float = 1.0
    parent: str = ""
    priority: int = 0


def _gpus_milli(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise RequestParseError(f"{where}={value!r}: not a number of GPUs")
    if str(value).strip() in ("-1", "-1.0"):
        return None  # KAI's "unlimited"
    try:
        q = Decimal(str(parse_quantity(str(value))))
        finite = q.is_finite()
    except (ValueError, TypeError, ArithmeticError):
        finite = False
    if not finite or q > MAX_QUANTITY:
        raise RequestParseError(f"{where}={value!r}: not a number of GPUs") from None
    if q < 0:
        raise RequestParseError(f"{where}={value!r}: must be >= 0 (or -1 for unlimited)")
    return int(q * MILLI)


def parse_queue(obj: Mapping[str, Any]) -> QueueSpec:
    """A ``queues.gpupool.io`` object -> :class:`QueueSpec` (quota/limit in GPUs: ``4``, ``"2.5"``, ``"500m"``)."""
    name = _meta(obj).get("name", "")
    where = f"Queue {name}: spec"
    spec = _expect_mapping(obj.get("spec") if isinstance(obj, Mapping) else None, where)
    quota = _gpus_milli(spec.get("quota"), f"{where}.quota") or 0
    limit = _gpus_milli(spec.get("limit"), f"{where}.limit")
    weight_raw = spec.get("weight", 1)
    try:
        weight = float(weight_raw)
    except (TypeError, ValueError):
        raise RequestParseError(f"{where}.weight={weight_raw!r}: not a number") from None
    if not math.isfinite(weight) or weight < 0:
        raise RequestParseError(f"{where}.weight={weight_raw!r}: must be >= 0")
    parent = spec.get("parent") or ""
    priority = spec.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise RequestParseError(f"{where}.priority={priority!r}: not a whole number")
    return QueueSpec(str(name), quota, limit, weight, str(parent), priority)


__all__ = [
    "RequestParseError", "PodInfo", "QueueSpec", "GpuAsk",
    "parse_pod", "describe_pod", "pod_key", "pod_group_of", "queue_of", "min_member_of",
    "parse_pod_group", "parse_queue", "pod_resources", "gpu_ask", "gpu_spec_of", "gpu_types_of", "hami_devices",
    "annotations_of", "labels_of", "node_name_of", "is_terminal", "is_waiting_for", "parse_time",
    "check_pod_shape", "check_selector_terms", "object_key", "spec_unreadable",
]
