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

Priority is ``spec.priority``, which the API server's Priority admission plugin sets from the pod's
PriorityClass; a pod without it (a manifest or snapshot that did not pass admission) naming one of the two
built-in classes takes its value (``system-cluster-critical`` 2000000000, ``system-node-critical``
2000001000), else 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from gpupool.k8s import (
    ANN_HAMI_DEVICES_ALLOCATED,
    ANN_HAMI_DEVICES_TO_ALLOCATE,
    ANN_HAMI_NODE,
    ANN_KAI_MIN_MEMBER,
    ANN_KAI_POD_GROUP,
    ANN_MIN_MEMBER,
    ANN_VOLCANO_GROUP,
    ANN_VOLCANO_GROUP_ALT,
    ANN_VOLCANO_QUEUE,
    LABEL_KAI_QUEUE,
    LABEL_KUEUE_QUEUE,
    LABEL_POD_GROUP,
    LABEL_RUNAI_QUEUE,
)
from gpupool.k8s.objects.fields import (
    MAX_QUANTITY,
    MIB,
    MIG_PROFILE,
    RequestParseError,
    annotations_of,
    check_pod_shape,
    expect_mapping,
    int_annotation,
    labels_of,
    mapping,
    meta_of,
    node_name_of,
    object_key,
    parse_time,
    pod_key,
    pod_resources,
    spec_of,
)
from gpupool.k8s.objects.gpu_asks import gpu_ask, gpu_spec_of, gpu_types_of
from gpupool.model import MILLI, InvalidRequestError, PodRequest


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
    spelling: str = ""  # how the GPU ask is written (GpuAsk.spelling: "nvidia.com/gpu", "hami", "kai gpu-fraction")

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


BUILTIN_PRIORITY_CLASSES = {"system-cluster-critical": 2_000_000_000, "system-node-critical": 2_000_001_000}
"""The PriorityClasses every Kubernetes cluster has, and their values."""


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
        spec = spec_of(pod)
        priority = spec.get("priority")
        if priority is None:  # not through admission: a built-in class still has its value
            priority = BUILTIN_PRIORITY_CLASSES.get(str(spec.get("priorityClassName") or ""), 0)
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
            qos=str(mapping(pod.get("status")).get("qosClass") or ""),
            priority=priority,
            creation_time=parse_time(meta_of(pod).get("creationTimestamp")),
            labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
            gpu_type_include=include,
            gpu_type_exclude=exclude,
        )
        return PodInfo(key, request, ask.mig, pod_group_of(pod), queue_of(pod), min_member_of(pod),
                       hami_devices(pod) if ask.num_gpu else (), ask.spelling)
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
    return f"{meta_of(pod).get('namespace') or 'default'}/{name}"


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
            return int_annotation(ann[key], f'annotation {key}="{ann[key]}"', 1)
    return None


def parse_pod_group(obj: Mapping[str, Any]) -> tuple[str, int]:
    """A PodGroup (scheduler-plugins or Volcano) -> (``namespace/name``, minMember >= 1)."""
    key = object_key(obj)
    if not isinstance(obj, Mapping):
        raise RequestParseError(f"PodGroup {key}: expected a mapping")
    try:
        expect_mapping(obj.get("metadata"), "metadata")
        spec = expect_mapping(obj.get("spec"), "spec")
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
    name = meta_of(obj).get("name", "")
    where = f"Queue {name}: spec"
    spec = expect_mapping(obj.get("spec") if isinstance(obj, Mapping) else None, where)
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
