"""Bound-pod device accounting.

Pods already bound (``spec.nodeName`` set, not finished) are counted on their node. Their devices are
read back from gpupool's own annotations (``gpupool.io/gpu-index`` and ``gpu-milli``, trusted only when
``gpupool.io/node`` equals ``spec.nodeName``); a pod bound by someone else takes the lowest-indexed
devices that fit. So a restarted or newly elected gpupool never hands out a GPU twice. Where the node agent
publishes the kubelet's PodResources map (``gpupool.io/pod-devices``), a device-plugin GPU pod it names is
counted on the GPUs the kubelet gave it (:func:`kubelet_devices`), whatever gpupool's annotation says.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any, TypedDict

import numpy as np

from gpupool.cluster import ClusterState, slice_ask
from gpupool.k8s import (
    ANN_ALIBABA_GPU_COUNT,
    ANN_ALIBABA_GPU_MILLI,
    ANN_GPU_INDEX,
    ANN_GPU_MILLI,
    ANN_KAI_FRACTION,
    ANN_KAI_MEMORY,
    ANN_KAI_NUM_DEVICES,
    ANN_NODE,
    RES_GPU,
    RES_HAMI_GPUCORES,
    RES_HAMI_GPUMEM,
    RES_HAMI_GPUMEM_PERCENT,
    RES_VOLCANO_VGPU_CORES,
    RES_VOLCANO_VGPU_MEMORY,
    RES_VOLCANO_VGPU_NUMBER,
)
from gpupool.k8s.objects.fields import (
    MIB,
    RequestParseError,
    annotations_of,
    mapping,
    node_name_of,
    pod_key,
    pod_resources,
    quantity,
)
from gpupool.k8s.objects.nodes import node_name, warn_once
from gpupool.k8s.objects.pods import PodInfo, hami_devices
from gpupool.model import MILLI, AllocationError, Assignment, PodRequest


# ------------------------------------------------------------------ bound pods
class InventoryInfo(TypedDict):
    """What :func:`build_state` learned besides the state itself.

    * ``pods``: ``namespace/name`` -> :class:`PodInfo` of every counted pod;
    * ``assignments``: ``namespace/name`` -> :class:`Assignment` (same as ``state.assignments``);
    * ``mig_capacity`` / ``mig_used``: node -> {profile: count};
    * ``skipped_nodes``: node -> why it was left out; ``skipped_pods``: pod -> why it was not counted
      (or counted only in part, or counted conservatively);
    * ``nodes``: node name -> the Node object counted under that name.
    """

    pods: dict[str, PodInfo]
    assignments: dict[str, Assignment]
    mig_capacity: dict[str, dict[str, int]]
    mig_used: dict[str, dict[str, int]]
    skipped_nodes: dict[str, str]
    skipped_pods: dict[str, str]
    nodes: dict[str, Mapping[str, Any]]


class NoUsableNodeError(ValueError):
    """:func:`build_state` found no node it can use; ``skipped_nodes`` says why each was left out."""

    def __init__(self, message: str, skipped_nodes: Mapping[str, str]) -> None:
        super().__init__(message)
        self.skipped_nodes = dict(skipped_nodes)


def _skip_key(node: Any, index: int, taken: Mapping[str, str]) -> str:
    name = node_name(node)
    if not name:
        raw = mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("name")
        name = f"{raw!r}" if raw is not None else f"<node #{index} without a name>"
    key, n = name, 2
    while key in taken:
        key, n = f"{name} ({n})", n + 1
    return key


_GPU_RESOURCES = frozenset((RES_GPU, RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES,
                            RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, RES_VOLCANO_VGPU_CORES))
_GPU_ANNOTATIONS = frozenset((ANN_KAI_FRACTION, ANN_KAI_MEMORY, ANN_KAI_NUM_DEVICES, ANN_ALIBABA_GPU_MILLI,
                              ANN_ALIBABA_GPU_COUNT))


def _readable_resources(pod: Mapping[str, Any]) -> tuple[dict[str, Decimal], set[str]]:
    """(effective requests, names of every resource asked): :func:`pod_resources` when the pod reads, else the
    sum of every readable value over all containers and init containers (an over-estimate, never less)."""
    names: set[str] = set()
    total: dict[str, Decimal] = {}
    spec = mapping(pod.get("spec"))
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        for i, c in enumerate(containers if isinstance(containers, list) else []):
            resources = mapping(mapping(c).get("resources"))
            per: dict[str, Decimal] = {}
            for part in ("limits", "requests"):
                for name, value in mapping(resources.get(part)).items():
                    names.add(str(name))
                    try:
                        per[str(name)] = quantity(value, f"spec.{kind}[{i}]")
                    except RequestParseError:
                        continue
            for name, q in per.items():
                total[name] = total.get(name, Decimal(0)) + q
    try:
        return pod_resources(pod), names
    except Exception:  # noqa: BLE001 - an unreadable pod: count what can be read
        return total, names


def _conservative_gpus(pod: Mapping[str, Any], res: Mapping[str, Decimal], names: set[str]) -> int:
    """Whole GPUs a bound pod is counted as holding when its GPU request cannot be read: the largest count any
    of its GPU spellings gives, and at least one when it uses any GPU spelling at all."""
    counts = [math.ceil(res[k]) for k in (RES_GPU, RES_VOLCANO_VGPU_NUMBER) if k in res]
    ann = annotations_of(pod)
    for key in (ANN_KAI_NUM_DEVICES, ANN_ALIBABA_GPU_COUNT):
        text = str(ann.get(key, "")).strip()
        if text.isdigit() and len(text) <= 6:
            counts.append(int(text))
    n = max(counts, default=0)
    if n == 0 and (any(k in ann for k in _GPU_ANNOTATIONS) or names & _GPU_RESOURCES):
        n = 1
    return n


def lenient_info(pod: Mapping[str, Any], error: Exception) -> PodInfo:
    """What a bound pod whose request gpupool cannot read still holds, counted conservatively: its CPU and memory
    as far as they read, and whole GPUs (the count it asks for, or one GPU when its fraction or memory share
    cannot be read), so that its devices are not handed out again."""
    key = pod_key(pod)
    res, names = _readable_resources(pod)
    n = _conservative_gpus(pod, res, names)
    req = PodRequest(name=key, cpu_milli=math.ceil(res.get("cpu", Decimal(0)) * 1000),
                     memory_mib=math.ceil(res.get("memory", Decimal(0)) / MIB), num_gpu=n,
                     gpu_milli=MILLI if n else 0)
    warn_once(key, str(error), "bound pod unreadable; counted conservatively", event="bound_pod_unreadable",
               pod=key, error=str(error), counted=f"cpu,memory,{n} whole GPU(s)")
    return PodInfo(key, req)


def annotated_devices(pod: Mapping[str, Any]) -> tuple[tuple[int, ...], int] | None:
    """(device indices, milli per device) gpupool wrote on a bound pod; None unless they are readable, distinct,
    and ``gpupool.io/node`` names the node the pod is bound to (the pod is then counted as an unannotated one).
    A device annotation that is present but unusable is logged once per pod and problem (warning), naming the
    pod, the annotation and its value (issue 33 item 7: they used to be dropped without a word)."""
    ann = annotations_of(pod)
    node = node_name_of(pod)
    if not node or ANN_GPU_INDEX not in ann:
        return None
    key = pod_key(pod)

    def unusable(field: str, why: str) -> None:
        warn_once(key, f"annotation {field}", f"pod {key}: annotation {field}={str(ann.get(field))[:80]!r} {why}; "
                  "the pod is counted as one without device annotations", pod=key, annotation=field)

    if ann.get(ANN_NODE) != node:
        unusable(ANN_NODE, f"does not name the node the pod is bound to ({node})")
        return None
    text = str(ann[ANN_GPU_INDEX]).strip()
    try:
        gpus = tuple(int(x) for x in text.split(",")) if text else ()
    except ValueError:
        unusable(ANN_GPU_INDEX, "is not a comma list of device indices")
        return None
    try:
        milli = int(str(ann.get(ANN_GPU_MILLI, MILLI) or 0))
    except ValueError:
        unusable(ANN_GPU_MILLI, "is not an integer")
        return None
    if len(gpus) > 1024 or any(g < 0 for g in gpus):
        unusable(ANN_GPU_INDEX, "names a negative index or more than 1024 devices")
        return None
    if not 0 <= milli <= MILLI:
        unusable(ANN_GPU_MILLI, f"is outside 0..{MILLI}")
        return None
    if len(set(gpus)) != len(gpus):  # "5,5,5,5": one card named for several, never a way to book it twice
        unusable(ANN_GPU_INDEX, "names a device more than once")
        return None
    return gpus, milli


def lowest_free_devices(state: ClusterState, req: PodRequest, node: int) -> tuple[int, ...] | None:
    """The lowest-indexed healthy-or-not devices of ``node`` that can take ``req`` (None if there are too few).

    The share per device is :meth:`ClusterState.share_on` (one replica for a whole-GPU ask on a time-sliced
    node); memory is the pod's amount (GPUs of known size only) or its share of the GPU's memory.
    """
    if req.num_gpu == 0:
        return ()
    milli = state.share_on(req, node)
    ok = state.gpu_exists[node] & (state.gpu_free[node] >= milli)
    if req.gpu_memory_mib:
        ok &= (state.gpu_mem_cap[node] > 0) & (state.gpu_mem_free[node] >= req.gpu_memory_mib)
    else:
        ok &= state.gpu_mem_free[node] >= state.gpu_mem_cap[node] * milli // MILLI
    idx = np.flatnonzero(ok)
    if len(idx) < req.num_gpu:
        return None
    return tuple(int(i) for i in idx[: req.num_gpu])


def named_devices(state: ClusterState, info: PodInfo, node: int) -> tuple[int, ...] | None:
    """Device indices of the GPUs another scheduler named for a bound pod (``info.named_devices``, UUIDs),
    through the node's published identities (``NodeSpec.gpu_ids``); None unless every UUID is known, they
    are distinct and there is one per card the pod asks."""
    ids = state.nodes[node].gpu_ids
    uuids = info.named_devices
    if not ids or not uuids or len(uuids) != info.request.num_gpu or len(set(uuids)) != len(uuids):
        return None
    index = {u: i for i, u in enumerate(ids)}
    if any(u not in index for u in uuids):
        return None
    return tuple(index[u] for u in uuids)


def _stacked_slices(state: ClusterState, req: PodRequest, node: int) -> Assignment | None:
    """A pod holding ``k`` replicas of a time-sliced node that cannot have ``k`` distinct GPUs: the replicas
    stacked on as few of the lowest free GPUs as hold them (``ceil(k / m)`` replicas each on ``m`` GPUs), so
    that every replica it holds is counted. None when even that does not fit."""
    replicas = int(state.gpu_replicas[node])
    one = int(state.slice_milli[node])
    if replicas <= 1 or req.gpu_memory_mib or req.gpu_milli != one or req.num_gpu < 2:
        return None
    k = req.num_gpu
    for m in range(k - 1, 0, -1):
        per = -(-k // m)
        if per > replicas:
            break
        stacked = replace(req, num_gpu=m, gpu_milli=min(MILLI, per * one))
        gpus = lowest_free_devices(state, stacked, node)
        if gpus is not None:
            try:
                return state.allocate(stacked, node, gpus)
            except AllocationError:
                continue
    return None


def count_bound_pod(state: ClusterState, info: PodInfo, node: int,
                    annotated: tuple[tuple[int, ...], int] | None) -> tuple[Assignment | None, str]:
    """Allocate a pod already running on ``node`` where it runs, as far as that is known:

    1. on the devices gpupool annotated (``annotated``, from :func:`annotated_devices`) when they are valid;
    2. else on the devices another scheduler named (HAMi's UUIDs in ``info.named_devices``, mapped through
       the node's ``gpu_ids``: :func:`named_devices`);
    3. else conservatively on the lowest free devices that fit (a time-sliced pod's replicas on distinct
       GPUs, else stacked: :func:`_stacked_slices`);
    4. else what fits of it ("counted in part").

    Returns (assignment, "") or (assignment-or-None, what could not be counted as the pod asks).
    """
    req = info.request
    note = ""
    if annotated is not None and req.num_gpu and len(annotated[0]) == req.num_gpu:
        gpus, milli = annotated
        milli = max(milli, req.gpu_milli)  # never less than the pod asks (a stale or hand-written annotation)
        try:
            return state.allocate(req, node, gpus, milli), ""
        except AllocationError as exc:
            note = f"annotated devices unusable ({exc}); "
    elif req.num_gpu and info.named_devices:
        gpus_named = named_devices(state, info, node)
        if gpus_named is not None:
            try:
                return state.allocate(req, node, gpus_named), ""
            except AllocationError as exc:
                note = f"devices named by the pod's annotations unusable ({exc}); "
        else:
            note = "devices named by the pod's annotations not known on the node; counted on the lowest free; "
    gpus = lowest_free_devices(state, req, node)
    if gpus is not None:
        try:
            return state.allocate(req, node, gpus), note.rstrip("; ")
        except AllocationError as exc:
            note += f"{exc}; "
    stacked = _stacked_slices(state, req, node)
    if stacked is not None:
        return stacked, note.rstrip("; ")  # the device plugin may stack replicas: not a miscount
    # Over-committed as gpupool sees it (another scheduler, or a model gpupool does not share): count what fits.
    cpu = min(req.cpu_milli, int(state.cpu_free[node]))
    mem = min(req.memory_mib, int(state.mem_free[node]))
    whole = [g for g in range(state.max_gpus) if state.gpu_exists[node, g] and state.gpu_free[node, g] == MILLI]
    take = whole[: req.num_gpu] if req.gpu_milli == MILLI and state.gpu_replicas[node] <= 1 else []
    partial = PodRequest(req.name, cpu_milli=cpu, memory_mib=mem, num_gpu=len(take), gpu_milli=MILLI if take else 0)
    try:
        a = state.allocate(partial, node, take)
    except AllocationError:  # pragma: no cover - clipped to what is free
        a = None
    return a, note + f"does not fit on {state.node_names[node]} as gpupool counts it; counted in part"


def plugin_gpus(info: PodInfo) -> bool:
    """Does the bound pod hold GPUs the NVIDIA device plugin hands out (``nvidia.com/gpu: N``, whole GPUs or one
    time-slicing replica each), so that the kubelet, not gpupool, chose which? Not a share, a memory amount, a MIG
    device or a pod whose devices HAMi named."""
    r = info.request
    return (r.num_gpu > 0 and not info.mig and not info.named_devices
            and slice_ask(r.gpu_milli, r.gpu_milli, r.gpu_memory_mib))


def kubelet_devices(uuids: Sequence[str], gpu_ids: Sequence[str]) -> tuple[tuple[int, ...], int] | None:
    """(device indices, most devices on one GPU) of the GPU UUIDs the kubelet reports for a pod (one per device it
    gave: a GPU twice when the pod holds two time-slicing replicas of it), through the node's ``gpu_ids``
    (:attr:`~gpupool.model.NodeSpec.gpu_ids`, the agent's GPU list in device-index order). None when a UUID is not
    among them (a MIG device, a GPU the node does not advertise) or there is none."""
    if not uuids or not gpu_ids:
        return None
    index = {u: i for i, u in enumerate(gpu_ids) if u}
    if any(u not in index for u in uuids):
        return None
    counts: dict[int, int] = {}
    for u in uuids:
        counts[index[u]] = counts.get(index[u], 0) + 1
    return tuple(sorted(counts)), max(counts.values())


def bound_order(pod: Mapping[str, Any]) -> tuple:
    # Pods with gpupool's own device annotations first: they claim specific devices; then oldest first.
    meta = mapping(pod.get("metadata"))
    named = annotated_devices(pod) is not None or bool(hami_devices(pod))
    return (not named, str(meta.get("creationTimestamp") or ""), pod_key(pod))


def slices_to_request(req: PodRequest, replicas: int) -> PodRequest:
    """``req`` as it holds a node whose GPUs are time-sliced ``replicas`` ways (``nvidia.com/gpu.replicas``):
    a whole-GPU ask of ``k`` (``nvidia.com/gpu: k``, :func:`gpupool.cluster.slice_ask`) is ``k`` replicas,
    i.e. ``k`` distinct GPUs at ``1000 // replicas`` milli each (memory in proportion). Any other request, or
    ``replicas`` <= 1, is returned unchanged. Units: milli-GPU per device; the result's ``total_gpu_milli``
    is the GPU share the pod really occupies (what a queue should be charged)."""
    if replicas <= 1 or req.num_gpu == 0 or req.gpu_milli != MILLI or req.gpu_memory_mib:
        return req
    return replace(req, gpu_milli=max(1, MILLI // replicas))


def time_sliced(info: PodInfo, replicas: int) -> PodInfo:
    """A bound pod holding ``k`` time-slicing replicas (``nvidia.com/gpu: k``) of GPUs shared ``replicas``
    ways: counted as :func:`slices_to_request` (``k`` distinct GPUs, one replica each; stacked on fewer GPUs
    by :func:`count_bound_pod` when ``k`` distinct ones are not free)."""
    req = slices_to_request(info.request, replicas)
    return info if req is info.request else replace(info, request=req)
