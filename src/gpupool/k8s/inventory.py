"""Nodes (as the API returns them) -> :class:`~gpupool.model.NodeSpec`, and the engine's state with every
pod already bound counted, whoever bound it.

GPU inventory, from what the NVIDIA device plugin and GPU Feature Discovery (GFD) publish:

* GPUs: ``status.allocatable["nvidia.com/gpu"]`` (what kubelet admits; a GPU the plugin marks unhealthy
  drops out of it). Under time-slicing / MPS (``nvidia.com/gpu.replicas`` > 1, product ``...-SHARED``)
  the allocatable count is GPUs x replicas; gpupool counts physical GPUs and shares them itself.
* MIG: with ``nvidia.com/mig.strategy=single`` each MIG device is an ``nvidia.com/gpu`` (product
  ``...-MIG-1g.10gb``) and is treated as a GPU of that opaque model; with ``mixed`` the
  ``nvidia.com/mig-<profile>`` resources are counted per node (:func:`mig_capacity`) and the GPUs left in
  ``nvidia.com/gpu`` are ordinary GPUs.
* Model: ``nvidia.com/gpu.product`` resolved through :mod:`gpupool.catalog` (``NVIDIA-H100-80GB-HBM3`` ->
  ``H100``); an unknown product stays an opaque model (no memory figure: memory-sized requests do not
  fit it). ``nvidia.com/gpu.clique`` is the NVLink domain.

Pods already bound (``spec.nodeName`` set, not finished) are counted on their node. Their devices are
read back from gpupool's own annotations (``gpupool.io/gpu-index`` and ``gpu-milli``, trusted only when
``gpupool.io/node`` equals ``spec.nodeName``); a pod bound by someone else takes the lowest-indexed
devices that fit. So a restarted or newly elected gpupool never hands out a GPU twice.

Node eligibility per pod (kube-scheduler's NodeUnschedulable, TaintToleration and NodeAffinity
plugins, and the MIG device count) is here too, as filter plugins for the engine.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, TypedDict

import numpy as np

from gpupool.catalog import SHARED_SUFFIX, resolve_name
from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest
from gpupool.k8s import (
    ANN_ALIBABA_GPU_COUNT,
    ANN_ALIBABA_GPU_MILLI,
    ANN_GPU_INDEX,
    ANN_GPU_MILLI,
    ANN_HAMI_NODE_REGISTER,
    ANN_KAI_FRACTION,
    ANN_KAI_MEMORY,
    ANN_KAI_NUM_DEVICES,
    ANN_NODE,
    LABEL_ALIBABA_MODEL,
    LABEL_GPU_CLIQUE,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY,
    LABEL_GPU_PRODUCT,
    LABEL_GPU_REPLICAS,
    LABEL_GPU_SHARING,
    LABEL_MIG_STRATEGY,
    LABEL_NVLINK_DOMAIN,
    LABEL_RACK,
    LABEL_SWITCH,
    RES_GPU,
    RES_HAMI_GPUCORES,
    RES_HAMI_GPUMEM,
    RES_HAMI_GPUMEM_PERCENT,
    RES_MIG_PREFIX,
    RES_VOLCANO_VGPU_CORES,
    RES_VOLCANO_VGPU_MEMORY,
    RES_VOLCANO_VGPU_NUMBER,
)
from gpupool.k8s.requests import (
    MIB,
    MIG_PROFILE,
    PodInfo,
    RequestParseError,
    _expect_list,
    _expect_mapping,
    _mapping,
    _quantity,
    annotations_of,
    describe_pod,
    hami_devices,
    node_name_of,
    pod_key,
    pod_resources,
)
from gpupool.model import MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, MILLI, AllocationError, Assignment, NodeSpec, PodRequest

log = logging.getLogger("gpupool.k8s.inventory")

UNKNOWN_GPU_MODEL = "unknown-gpu"


class NodeParseError(RequestParseError):
    """A node whose capacity gpupool cannot read (the node is left out)."""


# ------------------------------------------------------------------ nodes
# The accessors never raise (a field of the wrong type reads as absent); check_node_shape reports such fields.
def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    labels = _mapping(_mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("labels"))
    return {str(k): "" if v is None else str(v) for k, v in labels.items()}


def _allocatable(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = _mapping(node.get("status") if isinstance(node, Mapping) else None)
    return _mapping(status.get("allocatable") or status.get("capacity"))


def node_name(node: Any) -> str:
    """``metadata.name`` of a node ("" when it is missing or not a string)."""
    name = _mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("name")
    return name if isinstance(name, str) else ""


def check_node_shape(node: Any) -> str:
    """The node's name; raises :class:`NodeParseError` naming the first field whose type is wrong."""
    if not isinstance(node, Mapping):
        raise NodeParseError(f"node: expected a mapping, got {type(node).__name__}")
    raw = _mapping(node.get("metadata")).get("name")
    name = raw if isinstance(raw, str) else ""
    try:
        meta = _expect_mapping(node.get("metadata"), "metadata")
        if not isinstance(raw, str) or not raw:
            raise RequestParseError("metadata.name: expected a non-empty string" +
                                    (f", got {type(raw).__name__} {raw!r}" if raw is not None else ""))
        _expect_mapping(meta.get("labels"), "metadata.labels")
        spec = _expect_mapping(node.get("spec"), "spec")
        _expect_list(spec.get("taints"), "spec.taints")
        status = _expect_mapping(node.get("status"), "status")
        _expect_mapping(status.get("allocatable"), "status.allocatable")
        _expect_mapping(status.get("capacity"), "status.capacity")
        _expect_list(status.get("conditions"), "status.conditions")
    except RequestParseError as exc:
        label = name or (repr(raw) if raw is not None else "(no name)")
        raise NodeParseError(f"node {label}: {exc}") from None
    return name


def _gpu_model(labels: Mapping[str, str]) -> str:
    """Catalog key of the node's GPU product label (GFD ``nvidia.com/gpu.product``, else Alibaba's card model),
    the product itself (without GFD's ``-SHARED``) when the catalog does not know it, "" without a label."""
    product = labels.get(LABEL_GPU_PRODUCT) or labels.get(LABEL_ALIBABA_MODEL) or ""
    if not product:
        return ""
    key = resolve_name(product)
    if key is not None:
        return key
    return product[: -len(SHARED_SUFFIX)] if product.upper().endswith(SHARED_SUFFIX) else product


def _gpu_product(labels: Mapping[str, str]) -> str:
    """The product name the node reports (without GFD's ``-SHARED`` suffix), "" without a label."""
    product = (labels.get(LABEL_GPU_PRODUCT) or labels.get(LABEL_ALIBABA_MODEL) or "").strip()
    return product[: -len(SHARED_SUFFIX)] if product.upper().endswith(SHARED_SUFFIX) else product


def _label_int(labels: Mapping[str, str], key: str, high: int) -> int | None:
    """A whole-number label in 1..``high``; None when absent or unreadable (the caller falls back)."""
    text = str(labels.get(key, "")).strip()
    if not text.isdigit() or len(text) > 18:
        return None
    value = int(text)
    return value if 1 <= value <= high else None


def _replicas(labels: Mapping[str, str], allocatable_gpus: int | None = None) -> int:
    """Time-slicing / MPS replicas per physical GPU (1 = not shared), from GFD's labels.

    Shared when ``nvidia.com/gpu.sharing-strategy`` is ``time-slicing`` or ``mps`` or the product ends in
    ``-SHARED``; then ``nvidia.com/gpu.replicas``, else (label missing or unreadable) allocatable GPUs /
    ``nvidia.com/gpu.count`` when ``allocatable_gpus`` is given and both are known. Device-plugin replicas
    are slots of a physical GPU, never cards.
    """
    sharing = labels.get(LABEL_GPU_SHARING, "")
    shared = sharing in ("time-slicing", "mps") or labels.get(LABEL_GPU_PRODUCT, "").upper().endswith(SHARED_SUFFIX)
    if not shared:
        return 1
    replicas = _label_int(labels, LABEL_GPU_REPLICAS, MILLI)
    if replicas is None and allocatable_gpus:
        count = _label_int(labels, LABEL_GPU_COUNT, 4096)
        if count and allocatable_gpus > count:
            replicas = max(1, min(MILLI, allocatable_gpus // count))
    return replicas if replicas and replicas > 1 else 1


@dataclass(frozen=True, slots=True)
class RegisteredGpu:
    """One GPU of HAMi's node registration (``hami.io/node-nvidia-register``): ``uuid``, ``split`` (vGPU
    slots the device plugin advertises for it: slots, never cards), ``memory_mib``, ``type`` and health."""

    uuid: str
    split: int
    memory_mib: int
    type: str
    healthy: bool


def hami_registered_gpus(node: Mapping[str, Any]) -> list[RegisteredGpu] | None:
    """The node's GPUs in device order from HAMi's ``hami.io/node-nvidia-register`` annotation, either format
    (a JSON list of ``{"id", "index", "count", "devmem", "type", "health"}`` objects, HAMi >= 2.4; or
    ``UUID,count,devmem,devcore,type,numa,health:`` per device before). None when the annotation is absent
    or unreadable (the caller falls back to allocatable and GFD labels)."""
    ann = _mapping(_mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("annotations"))
    raw = ann.get(ANN_HAMI_NODE_REGISTER)
    if not isinstance(raw, str) or not raw.strip():
        return None
    out: list[tuple[int, RegisteredGpu]] = []
    try:
        text = raw.strip()
        if text.startswith("["):
            for i, d in enumerate(json.loads(text)):
                if not isinstance(d, Mapping) or not isinstance(d.get("id"), str):
                    return None
                health = d.get("health", True)
                out.append((int(d.get("index", i)), RegisteredGpu(
                    d["id"], int(d.get("count", 1) or 1), int(d.get("devmem", 0) or 0), str(d.get("type", "")),
                    health is True or str(health).lower() == "true")))
        else:
            for i, item in enumerate(x for x in text.split(":") if x.strip()):
                f = [x.strip() for x in item.split(",")]
                if len(f) < 5 or not f[0]:
                    return None
                out.append((i, RegisteredGpu(f[0], int(f[1] or 1), int(f[2] or 0), f[4],
                                             len(f) < 7 or f[6].lower() != "false")))
    except (ValueError, TypeError, OverflowError):
        return None
    out.sort(key=lambda x: x[0])
    return [g for _, g in out]


def _gpu_memory_label(name: str, labels: Mapping[str, str]) -> int:
    """GFD's ``nvidia.com/gpu.memory`` (MiB per GPU); 0 when absent. An unreadable value is ignored (0: the
    catalog's figure, or unknown) and logged once, naming the label."""
    if LABEL_GPU_MEMORY not in labels:
        return 0
    value = _label_int(labels, LABEL_GPU_MEMORY, MAX_MEMORY_MIB)
    if value is None:
        _warn_once(name, "gpu.memory", f"node {name}: label {LABEL_GPU_MEMORY}={labels[LABEL_GPU_MEMORY]!r} is not a "
                   "whole number of MiB; ignored", event="node_label_unreadable", node=name, label=LABEL_GPU_MEMORY)
        return 0
    return value


def _agent_gpus(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPUs of gpupool's node agent inventory annotation (index order), [] when absent or unreadable."""
    from gpupool.agent.report import read_inventory

    meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    doc = read_inventory(meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else None)
    if doc is None:
        return []
    gpus = [g for g in doc["gpus"] if isinstance(g, Mapping) and isinstance(g.get("uuid"), str) and g.get("uuid")]
    if len({g["uuid"] for g in gpus}) != len(gpus):
        return []  # a UUID twice: the inventory cannot name devices
    try:
        return sorted(gpus, key=lambda g: int(g.get("index", 0)))
    except (TypeError, ValueError, OverflowError):  # an index that is no whole number (1e400, NaN, "x")
        return []


def _agent_healthy(g: Mapping[str, Any]) -> bool:
    """The GPU's ``healthy`` flag, read as HAMi's register is (``false`` / ``"false"`` / ``0`` -> unhealthy)."""
    v = g.get("healthy", True)
    return not (v is False or (isinstance(v, str) and v.strip().lower() in ("false", "0", "no"))
                or (isinstance(v, int | float) and not isinstance(v, bool) and v == 0))


def _whole_gpus(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The GPUs the device plugin advertises as ``nvidia.com/gpu``: not those in MIG mode (their MIG devices are
    advertised as ``nvidia.com/mig-<profile>`` in the mixed strategy)."""
    out = []
    for g in gpus:
        mig = g.get("mig")
        if isinstance(mig, Mapping) and mig.get("enabled") is True:
            continue
        out.append(g)
    return out


def agent_gpu_ids(node: Mapping[str, Any], advertised: int) -> tuple[str, ...]:
    """UUIDs of the ``advertised`` devices in device-index order, from the node agent's inventory
    (``gpupool.io/gpu-inventory``): every GPU when it lists as many as are advertised; the healthy ones when
    the device plugin withdrew the unhealthy ones (as many healthy as advertised); else () (unknown)."""
    gpus = _whole_gpus(_agent_gpus(node))
    if len(gpus) == advertised:
        return tuple(str(g["uuid"]) for g in gpus)
    healthy = [g for g in gpus if _agent_healthy(g)]
    if len(healthy) == advertised and len(gpus) > advertised:
        return tuple(str(g["uuid"]) for g in healthy)
    return ()


def agent_marked(node: Mapping[str, Any], spec: NodeSpec) -> tuple[int, ...]:
    """Device indices (gpupool's) of the GPUs the node agent marked unhealthy, matched by UUID
    (``spec.gpu_ids``). When the agent marks GPUs that cannot be matched to advertised devices (no
    identities, counts differ) and there are more of them than the device plugin withdrew, every GPU of the
    node is marked: a failed GPU is never handed out in a healthy one's place."""
    gpus = _whole_gpus(_agent_gpus(node))
    bad = {str(g["uuid"]) for g in gpus if not _agent_healthy(g)}
    if not bad or not spec.gpu_count:
        return ()
    if spec.gpu_ids:
        return tuple(i for i, u in enumerate(spec.gpu_ids) if u in bad)
    withdrawn = len(gpus) - spec.gpu_count
    if 0 < len(bad) <= withdrawn:
        return ()
    return tuple(range(spec.gpu_count))


def node_spec_from_node(node: Mapping[str, Any]) -> NodeSpec:
    """A Node (API dict) -> :class:`NodeSpec`: allocatable CPU/memory, physical GPUs, model, GPU memory,
    time-slicing replicas, device identities, topology.

    GPUs: ``status.allocatable["nvidia.com/gpu"]`` (what kubelet admits; a failed GPU drops out of it)
    divided by the time-slicing replicas (:func:`_replicas`). On a HAMi node (``hami.io/node-nvidia-register``)
    the allocatable count is vGPU slots, so the GPUs are the healthy registered devices (never more than the
    allocatable slots allow), with their UUIDs as ``gpu_ids``. GPU memory: GFD's ``nvidia.com/gpu.memory``
    (else HAMi's registered ``devmem``) wins over the catalog; neither nor a catalog model = unknown.
    Raises :class:`NodeParseError` when a capacity figure is unreadable.
    """
    name = check_node_shape(node)
    labels = _labels(node)
    alloc = _allocatable(node)
    where = f"node {name}: status.allocatable"
    try:
        cpu = int(_quantity(alloc.get("cpu", 0), f'{where}["cpu"]') * 1000)
        mem = int(_quantity(alloc.get("memory", 0), f'{where}["memory"]') / MIB)
        slots = int(_quantity(alloc.get(RES_GPU, 0), f'{where}["{RES_GPU}"]'))
    except RequestParseError as exc:
        raise NodeParseError(str(exc)) from None
    replicas = _replicas(labels, slots)
    gpus = slots // replicas
    gpu_memory = _gpu_memory_label(name, labels)
    ids: tuple[str, ...] = ()
    product = _gpu_product(labels)
    registered = hami_registered_gpus(node) if slots else None
    if registered:
        healthy = [g for g in registered if g.healthy]
        gpus = min(len(healthy), slots)  # the healthy registered devices (vGPU slots are not cards)
        ids = tuple(g.uuid for g in healthy[:gpus])
        replicas = 1
        if gpus and not gpu_memory:
            gpu_memory = max(0, min(g.memory_mib for g in healthy[:gpus]))
        if gpus and not product and healthy[0].type:
            product = healthy[0].type
    if gpus and not registered:
        ids = agent_gpu_ids(node, gpus) or ids
    model = _gpu_model(labels) if gpus else ""
    if gpus and not model:
        model = (resolve_name(product) or product) if product else UNKNOWN_GPU_MODEL
    return NodeSpec(
        name=name,
        cpu_milli=cpu,
        memory_mib=mem,
        gpu_count=min(gpus, MAX_GPUS_PER_NODE),
        gpu_model=model,
        nvlink_domain=labels.get(LABEL_GPU_CLIQUE) or labels.get(LABEL_NVLINK_DOMAIN, ""),
        rack=labels.get(LABEL_RACK, ""),
        switch=labels.get(LABEL_SWITCH, ""),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        gpu_memory_mib=gpu_memory if gpus else 0,
        gpu_replicas=replicas if gpus else 1,
        gpu_product=product if gpus else "",
        gpu_ids=ids,
    )


def mig_capacity(node: Mapping[str, Any]) -> dict[str, int]:
    """MIG devices the node offers per profile (``nvidia.com/mig-<profile>`` allocatable, ``mixed`` strategy)."""
    out: dict[str, int] = {}
    for res, value in _allocatable(node).items():
        res = str(res)
        if res.startswith(RES_MIG_PREFIX) and MIG_PROFILE.fullmatch(res[len(RES_MIG_PREFIX):]):
            try:
                n = int(_quantity(value, res))
            except RequestParseError:
                continue
            if n > 0:
                out[res[len(RES_MIG_PREFIX):]] = n
    return out


def mig_strategy(node: Mapping[str, Any]) -> str:
    return _labels(node).get(LABEL_MIG_STRATEGY, "none")


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
        raw = _mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("name")
        name = f"{raw!r}" if raw is not None else f"<node #{index} without a name>"
    key, n = name, 2
    while key in taken:
        key, n = f"{name} ({n})", n + 1
    return key


_GPU_RESOURCES = frozenset((RES_GPU, RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES,
                            RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, RES_VOLCANO_VGPU_CORES))
_GPU_ANNOTATIONS = frozenset((ANN_KAI_FRACTION, ANN_KAI_MEMORY, ANN_KAI_NUM_DEVICES, ANN_ALIBABA_GPU_MILLI,
                              ANN_ALIBABA_GPU_COUNT))
_WARNED: dict[tuple[str, str], None] = {}  # (object, problem) already logged at warning level (bounded)


def _warn_once(what: str, problem: str, message: str, **extra: Any) -> None:
    """Log ``message`` at warning level the first time ``what`` shows ``problem`` (not again every cycle)."""
    if (what, problem) in _WARNED:
        return
    if len(_WARNED) >= 4096:
        _WARNED.clear()
    _WARNED[(what, problem)] = None
    log.warning(message, extra=extra)


def _readable_resources(pod: Mapping[str, Any]) -> tuple[dict[str, Decimal], set[str]]:
    """(effective requests, names of every resource asked): :func:`pod_resources` when the pod reads, else the
    sum of every readable value over all containers and init containers (an over-estimate, never less)."""
    names: set[str] = set()
    total: dict[str, Decimal] = {}
    spec = _mapping(pod.get("spec"))
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        for i, c in enumerate(containers if isinstance(containers, list) else []):
            resources = _mapping(_mapping(c).get("resources"))
            per: dict[str, Decimal] = {}
            for part in ("limits", "requests"):
                for name, value in _mapping(resources.get(part)).items():
                    names.add(str(name))
                    try:
                        per[str(name)] = _quantity(value, f"spec.{kind}[{i}]")
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


def _lenient_info(pod: Mapping[str, Any], error: Exception) -> PodInfo:
    """What a bound pod whose request gpupool cannot read still holds, counted conservatively: its CPU and memory
    as far as they read, and whole GPUs (the count it asks for, or one GPU when its fraction or memory share
    cannot be read), so that its devices are not handed out again."""
    key = pod_key(pod)
    res, names = _readable_resources(pod)
    n = _conservative_gpus(pod, res, names)
    req = PodRequest(name=key, cpu_milli=math.ceil(res.get("cpu", Decimal(0)) * 1000),
                     memory_mib=math.ceil(res.get("memory", Decimal(0)) / MIB), num_gpu=n,
                     gpu_milli=MILLI if n else 0)
    _warn_once(key, str(error), "bound pod unreadable; counted conservatively", event="bound_pod_unreadable",
               pod=key, error=str(error), counted=f"cpu,memory,{n} whole GPU(s)")
    return PodInfo(key, req)


def annotated_devices(pod: Mapping[str, Any]) -> tuple[tuple[int, ...], int] | None:
    """(device indices, milli per device) gpupool wrote on a bound pod; None unless they are readable and
    ``gpupool.io/node`` names the node the pod is bound to."""
    ann = annotations_of(pod)
    node = node_name_of(pod)
    if not node or ann.get(ANN_NODE) != node or ANN_GPU_INDEX not in ann:
        return None
    try:
        text = str(ann[ANN_GPU_INDEX]).strip()
        gpus = tuple(int(x) for x in text.split(",")) if text else ()
        milli = int(str(ann.get(ANN_GPU_MILLI, MILLI) or 0))
    except ValueError:
        return None
    if len(gpus) > 1024:
        return None
    if any(g < 0 for g in gpus) or not (0 <= milli <= MILLI):
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


def _bound_order(pod: Mapping[str, Any]) -> tuple:
    # Pods with gpupool's own device annotations first: they claim specific devices; then oldest first.
    meta = _mapping(pod.get("metadata"))
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


def _time_sliced(info: PodInfo, replicas: int) -> PodInfo:
    """A bound pod holding ``k`` time-slicing replicas (``nvidia.com/gpu: k``) of GPUs shared ``replicas``
    ways: counted as :func:`slices_to_request` (``k`` distinct GPUs, one replica each; stacked on fewer GPUs
    by :func:`count_bound_pod` when ``k`` distinct ones are not free)."""
    req = slices_to_request(info.request, replicas)
    return info if req is info.request else replace(info, request=req)


def build_state(nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod,
                ) -> tuple[ClusterState, InventoryInfo]:
    """The engine's state for ``nodes`` with every bound, unfinished pod in ``pods`` counted.

    The same books as the live scheduler's and the dry run's: the objects go through a
    :class:`~gpupool.k8s.state.ClusterModel` (one code path). Nodes gpupool cannot read are left out
    (``skipped_nodes``); raises :class:`NoUsableNodeError` (a ValueError) when no node is left. On a node
    whose GPUs are time-sliced (``nvidia.com/gpu.replicas``), a pod bound with ``nvidia.com/gpu: k`` counts
    ``k / replicas`` of one GPU. ``describe`` reads a pod. Returns (state, :class:`InventoryInfo`).
    """
    from gpupool.k8s.state import ClusterModel  # state builds on this module

    model = ClusterModel(scheduler_name="", describe=describe)
    model.replace("nodes", list(nodes))
    model.replace("pods", [p for p in pods if isinstance(p, Mapping)])
    state = model.refresh()
    info = model.inventory()
    if state is None:
        skipped = info["skipped_nodes"]
        raise NoUsableNodeError("no usable node" + (f" ({len(skipped)} unreadable)" if skipped else ""), skipped)
    return state, info


# ------------------------------------------------------------------ node eligibility (per pod)
def node_ready(node: Mapping[str, Any]) -> bool:
    """False when the node's ``Ready`` condition exists and is not ``True``."""
    conditions = _mapping(node.get("status")).get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if not isinstance(cond, Mapping):
            continue
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """kube's ToleratesTaint: some toleration matches the taint's key, value and effect."""
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if op == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _match_expression(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    raw = expr.get("values")
    values = [str(v) for v in raw] if isinstance(raw, list) else []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def matches_node_selector_term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """One ``nodeSelectorTerm``: all its matchExpressions (labels) and matchFields (``metadata.name``) hold."""
    if not isinstance(term, Mapping):
        return False
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(exprs, list) or not isinstance(fields, list):
        return False
    if not exprs and not fields:
        return False  # an empty term matches no node
    labels = _labels(node)
    name = node_name(node)
    for e in exprs:
        if not isinstance(e, Mapping) or not _match_expression(e, labels.get(str(e.get("key", "")))):
            return False
    for f in fields:
        if not isinstance(f, Mapping) or f.get("key") != "metadata.name" or not _match_expression(f, name):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may go, as its spec says; ``key`` identifies pods that see the same eligible nodes."""

    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: str = ""  # canonical JSON of requiredDuringScheduling nodeSelectorTerms ("" = none)
    tolerations: str = "[]"  # canonical JSON
    mig: tuple[tuple[str, int], ...] = ()

    @property
    def key(self) -> tuple:
        return (self.node_selector, self.required_terms, self.tolerations, self.mig)


def constraints_of(pod: Mapping[str, Any], mig: tuple[tuple[str, int], ...] = ()) -> Constraints:
    spec = _mapping(pod.get("spec"))
    selector = tuple(sorted((str(k), str(v)) for k, v in _mapping(spec.get("nodeSelector")).items()))
    required = _mapping(_mapping(_mapping(spec.get("affinity")).get("nodeAffinity"))
                        .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not isinstance(terms, list):
        terms = []  # unreadable terms match no node (describe_pod reports them)
    raw = spec.get("tolerations")
    tolerations = [t for t in (raw if isinstance(raw, list) else []) if isinstance(t, Mapping)
                   and t.get("effect") in (None, "", "NoSchedule", "NoExecute")]
    return Constraints(
        node_selector=selector,
        required_terms=json.dumps(terms, sort_keys=True, default=str) if terms is not None else "",
        tolerations=json.dumps(tolerations, sort_keys=True, default=str),
        mig=tuple(mig),
    )


@dataclass(frozen=True, slots=True)
class ConstrainedRequest(EffectiveRequest):
    """An :class:`EffectiveRequest` that also carries the pod's :class:`Constraints` (part of its cache key)."""

    constraints: Constraints = field(default_factory=Constraints)

    def key(self) -> tuple:
        return EffectiveRequest.key(self) + self.constraints.key


class Eligibility:
    """Node eligibility of pods, as engine filter plugins (:attr:`filters`), kept across cycles.

    ``nodes`` are the Node dicts in the order of ``state.node_names``. What eligibility reads of each node
    (labels, NoSchedule/NoExecute taints, cordon, Ready) is read once per node version; masks are cached
    per distinct :class:`Constraints` and refreshed only for nodes changed since (:meth:`update_node`), so a
    cycle costs what changed. Nodes without taints pass the taint check for every pod, and pods without a
    selector or required affinity match every node, without a per-node loop. The MIG count is checked live
    against ``state.assignments`` so that pods placed earlier in the cycle (or in the same gang) are counted.
    """

    CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

    def __init__(self, state: ClusterState, nodes: Mapping[str, Mapping[str, Any]],
                 mig_capacity: Mapping[str, Mapping[str, int]] | None = None,
                 mig_used: Mapping[str, Mapping[str, int]] | None = None) -> None:
        self.state = state
        self.nodes = [nodes[name] for name in state.node_names]
        self.mig_capacity = {state.node_index[n]: dict(c) for n, c in (mig_capacity or {}).items()
                             if n in state.node_index}
        self.mig_used = {state.node_index[n]: dict(c) for n, c in (mig_used or {}).items() if n in state.node_index}
        self.pending_mig: dict[str, tuple[tuple[str, int], ...]] = {}
        n = len(self.nodes)
        self.gen = np.zeros(n, dtype=np.int64)  # bumped by update_node
        self.ready = np.ones(n, dtype=bool)
        self.cordoned = np.zeros(n, dtype=bool)
        self.taints: list[list[Mapping[str, Any]]] = [[] for _ in range(n)]
        self.tainted = np.zeros(n, dtype=bool)
        self.labels: list[Mapping[str, str]] = [{} for _ in range(n)]
        for i in range(n):
            self._read(i)
        # Constraints key -> (gen snapshot, schedulable, taints tolerated, affinity matched)
        self._masks: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.filters = (_SchedulableFilter(self), _TaintFilter(self), _AffinityFilter(self), _MigFilter(self))

    def _read(self, i: int) -> None:
        node = self.nodes[i]
        spec = _mapping(node.get("spec"))
        self.ready[i] = node_ready(node)
        self.cordoned[i] = bool(spec.get("unschedulable"))
        taints = spec.get("taints")
        self.taints[i] = [t for t in (taints if isinstance(taints, list) else [])
                          if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")]
        self.tainted[i] = bool(self.taints[i])
        self.labels[i] = _labels(node)

    def update_node(self, i: int, node: Mapping[str, Any]) -> None:
        """Node ``i``'s object changed (labels, taints, cordon, Ready): re-read it; masks refresh its row."""
        self.nodes[i] = node
        self._read(i)
        self.gen[i] += 1

    def _rows(self, c: Constraints, idx: np.ndarray, tolerations: list[Any], terms: Any,
              sched: np.ndarray, taint_ok: np.ndarray, aff: np.ndarray) -> None:
        tolerate_cordon = tolerates(tolerations, self.CORDON)
        sched[idx] = self.ready[idx] & (~self.cordoned[idx] | tolerate_cordon)
        taint_ok[idx] = True  # untainted nodes; only the tainted ones are looked at one by one
        for i in idx[self.tainted[idx]].tolist():
            taint_ok[i] = all(tolerates(tolerations, t) for t in self.taints[i])
        if not c.node_selector and terms is None:
            aff[idx] = True
            return
        for i in idx.tolist():
            labels = self.labels[i]
            if any(labels.get(k) != v for k, v in c.node_selector):
                aff[i] = False
            elif terms is not None and not any(matches_node_selector_term(t, self.nodes[i]) for t in terms):
                aff[i] = False
            else:
                aff[i] = True

    def masks(self, c: Constraints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(schedulable, taints tolerated, affinity matched): (n_nodes,) bool each."""
        key = c.key[:3]
        cached = self._masks.get(key)
        if cached is not None:
            snap, sched, taint_ok, aff = cached
            stale = (snap != self.gen).nonzero()[0]
            if len(stale) == 0:
                return sched, taint_ok, aff
        else:
            n = len(self.nodes)
            snap = np.full(n, -1, dtype=np.int64)
            sched, taint_ok, aff = np.ones(n, dtype=bool), np.ones(n, dtype=bool), np.ones(n, dtype=bool)
            stale = np.arange(n)
            if len(self._masks) >= 4096:
                self._masks.pop(next(iter(self._masks)))  # the oldest entry (insertion order), not all
            self._masks[key] = (snap, sched, taint_ok, aff)
        tolerations = json.loads(c.tolerations)
        terms = json.loads(c.required_terms) if c.required_terms else None
        self._rows(c, stale, tolerations, terms, sched, taint_ok, aff)
        snap[stale] = self.gen[stale]
        return sched, taint_ok, aff

    def mig_free(self, node: int, profile: str) -> int:
        cap = self.mig_capacity.get(node, {}).get(profile, 0)
        used = self.mig_used.get(node, {}).get(profile, 0)
        for pod, mig in self.pending_mig.items():
            a = self.state.assignments.get(pod)
            if a is not None and a.node == node:
                used += sum(c for p, c in mig if p == profile)
        return cap - used


def _constraints(req: EffectiveRequest) -> Constraints | None:
    return getattr(req, "constraints", None)


class _EligibilityFilter:
    reason = ""
    slot = 0

    def __init__(self, book: Eligibility) -> None:
        self.book = book

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        c = _constraints(req)
        if c is None:
            return np.ones(len(nodes), dtype=bool)
        return self.book.masks(c)[self.slot][nodes]


class _SchedulableFilter(_EligibilityFilter):
    reason = "node(s) were unschedulable or not ready"
    slot = 0


class _TaintFilter(_EligibilityFilter):
    reason = "node(s) had untolerated taint"
    slot = 1


class _AffinityFilter(_EligibilityFilter):
    reason = "node(s) didn't match Pod's node affinity/selector"
    slot = 2


class _MigFilter(_EligibilityFilter):
    reason = "Insufficient MIG devices"

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        c = _constraints(req)
        if c is None or not c.mig:
            return np.ones(len(nodes), dtype=bool)
        return np.array([all(self.book.mig_free(int(n), p) >= k for p, k in c.mig) for n in nodes], dtype=bool)


__all__ = [
    "node_spec_from_node", "build_state", "mig_capacity", "mig_strategy", "InventoryInfo", "NodeParseError",
    "annotated_devices", "lowest_free_devices", "count_bound_pod", "named_devices", "slices_to_request",
    "hami_registered_gpus", "RegisteredGpu", "node_ready", "tolerates",
    "matches_node_selector_term", "Constraints", "constraints_of", "ConstrainedRequest", "Eligibility",
    "UNKNOWN_GPU_MODEL", "NoUsableNodeError", "check_node_shape", "node_name",
]
