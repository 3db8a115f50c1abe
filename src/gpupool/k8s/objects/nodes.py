"""Nodes (as the API returns them) -> :class:`~gpupool.model.NodeSpec` (bound pods are counted by
:mod:`gpupool.k8s.cache.devices`, node eligibility is :mod:`gpupool.k8s.cache.eligibility`).

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
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.catalog import SHARED_SUFFIX, resolve_name
from gpupool.k8s import (
    ANN_HAMI_NODE_REGISTER,
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
    RES_MIG_PREFIX,
)
from gpupool.k8s.objects.agent_report import read_inventory
from gpupool.k8s.objects.fields import (
    MIB,
    MIG_PROFILE,
    RequestParseError,
    expect_list,
    expect_mapping,
    mapping,
    quantity,
)
from gpupool.model import MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, MILLI, NodeSpec

log = logging.getLogger("gpupool.k8s.inventory")


UNKNOWN_GPU_MODEL = "unknown-gpu"


class NodeParseError(RequestParseError):
    """A node whose capacity gpupool cannot read (the node is left out)."""


# ------------------------------------------------------------------ nodes
# The accessors never raise (a field of the wrong type reads as absent); check_node_shape reports such fields.
def node_labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    labels = mapping(mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("labels"))
    return {str(k): "" if v is None else str(v) for k, v in labels.items()}


def _allocatable(node: Mapping[str, Any]) -> Mapping[str, Any]:
    status = mapping(node.get("status") if isinstance(node, Mapping) else None)
    return mapping(status.get("allocatable") or status.get("capacity"))


def node_name(node: Any) -> str:
    """``metadata.name`` of a node ("" when it is missing or not a string)."""
    name = mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("name")
    return name if isinstance(name, str) else ""


def check_node_shape(node: Any) -> str:
    """The node's name; raises :class:`NodeParseError` naming the first field whose type is wrong."""
    if not isinstance(node, Mapping):
        raise NodeParseError(f"node: expected a mapping, got {type(node).__name__}")
    raw = mapping(node.get("metadata")).get("name")
    name = raw if isinstance(raw, str) else ""
    try:
        meta = expect_mapping(node.get("metadata"), "metadata")
        if not isinstance(raw, str) or not raw:
            raise RequestParseError("metadata.name: expected a non-empty string" +
                                    (f", got {type(raw).__name__} {raw!r}" if raw is not None else ""))
        expect_mapping(meta.get("labels"), "metadata.labels")
        spec = expect_mapping(node.get("spec"), "spec")
        expect_list(spec.get("taints"), "spec.taints")
        status = expect_mapping(node.get("status"), "status")
        expect_mapping(status.get("allocatable"), "status.allocatable")
        expect_mapping(status.get("capacity"), "status.capacity")
        expect_list(status.get("conditions"), "status.conditions")
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
    ann = mapping(mapping(node.get("metadata") if isinstance(node, Mapping) else None).get("annotations"))
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


SHARING_STRATEGIES = ("none", "time-slicing", "mps")
"""Values of GFD's ``nvidia.com/gpu.sharing-strategy`` label."""


def _warn_unreadable_labels(name: str, labels: Mapping[str, str]) -> None:
    """Log once per node and label a GPU label gpupool reads that is present but unreadable (issue 33 item 7: they
    were ignored without a word): ``nvidia.com/gpu.replicas`` and ``gpu.count`` not a whole number in range,
    ``gpu.sharing-strategy`` not one of GFD's values. What is then used instead is said in the line."""
    for label, high, fallback in ((LABEL_GPU_REPLICAS, MILLI, "allocatable / gpu.count, else not shared"),
                                  (LABEL_GPU_COUNT, 4096, "allocatable")):
        if label in labels and _label_int(labels, label, high) is None:
            warn_once(name, label, f"node {name}: label {label}={str(labels[label])[:80]!r} is not a whole number "
                      f"in 1..{high}; using {fallback}", event="node_label_unreadable", node=name, label=label)
    sharing = labels.get(LABEL_GPU_SHARING)
    if sharing is not None and sharing not in SHARING_STRATEGIES:
        warn_once(name, LABEL_GPU_SHARING, f"node {name}: label {LABEL_GPU_SHARING}={str(sharing)[:80]!r} is not one "
                  f"of {', '.join(SHARING_STRATEGIES)}; the GPUs are taken as not shared",
                  event="node_label_unreadable", node=name, label=LABEL_GPU_SHARING)


def _gpu_memory_label(name: str, labels: Mapping[str, str]) -> int:
    """GFD's ``nvidia.com/gpu.memory`` (MiB per GPU); 0 when absent. An unreadable value is ignored (0: the
    catalog's figure, or unknown) and logged once, naming the label."""
    if LABEL_GPU_MEMORY not in labels:
        return 0
    value = _label_int(labels, LABEL_GPU_MEMORY, MAX_MEMORY_MIB)
    if value is None:
        warn_once(name, "gpu.memory", f"node {name}: label {LABEL_GPU_MEMORY}={labels[LABEL_GPU_MEMORY]!r} is not a "
                   "whole number of MiB; ignored", event="node_label_unreadable", node=name, label=LABEL_GPU_MEMORY)
        return 0
    return value


def _agent_uuid(g: Mapping[str, Any]) -> str:
    """The GPU's UUID in the agent's inventory, "" when it has none (a GPU lost before the agent read it)."""
    u = g.get("uuid")
    return u if isinstance(u, str) else ""


def _agent_gpus(node: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The GPUs of gpupool's node agent inventory annotation (index order), [] when absent or unreadable. A GPU
    without a UUID (none, or ``""``) is kept when the agent calls it unhealthy (lost before it could be read: it
    still counts); an entry whose UUID is not a string is not read."""
    meta = node.get("metadata") if isinstance(node.get("metadata"), Mapping) else {}
    doc = read_inventory(meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else None)
    if doc is None:
        return []
    gpus = [g for g in doc["gpus"] if isinstance(g, Mapping) and (
        _agent_uuid(g) or (g.get("uuid") in (None, "") and not _agent_healthy(g)))]
    named = [_agent_uuid(g) for g in gpus if _agent_uuid(g)]
    if len(set(named)) != len(named):
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
    (``gpupool.io/gpu-inventory``): every GPU when it lists as many as are advertised, each with a UUID; the
    healthy ones when the device plugin withdrew the unhealthy ones (as many healthy as advertised); else ()
    (unknown)."""
    gpus = _whole_gpus(_agent_gpus(node))
    if len(gpus) == advertised and all(_agent_uuid(g) for g in gpus):
        return tuple(str(g["uuid"]) for g in gpus)
    healthy = [g for g in gpus if _agent_healthy(g)]
    if len(healthy) == advertised and len(gpus) > advertised:
        return tuple(str(g["uuid"]) for g in healthy)
    return ()


def agent_healthy_count(node: Mapping[str, Any]) -> int | None:
    """How many whole GPUs the node agent's inventory calls healthy; None when the node has no agent
    inventory listing whole GPUs, or when its ``nvidia.com/gpu`` counts MIG devices (MIG ``single`` strategy
    with GPUs in MIG mode), so that the two cannot be compared."""
    listed = _agent_gpus(node)
    gpus = _whole_gpus(listed)
    if not gpus or (node_labels(node).get(LABEL_MIG_STRATEGY) == "single" and len(gpus) != len(listed)):
        return None
    return sum(1 for g in gpus if _agent_healthy(g))


def agent_unhealthy_uuids(node: Mapping[str, Any]) -> frozenset[str]:
    """UUIDs of the GPUs the node agent's inventory calls unhealthy (whole or in MIG mode): DRA devices of those
    GPUs (their ``uuid``, or a MIG device's ``parentUUID``) are not allocated."""
    return frozenset(_agent_uuid(g) for g in _agent_gpus(node) if _agent_uuid(g) and not _agent_healthy(g))


def agent_marked(node: Mapping[str, Any], spec: NodeSpec) -> tuple[int, ...]:
    """Device indices (gpupool's) of the GPUs the node agent marked unhealthy, matched by UUID
    (``spec.gpu_ids``). When the agent marks GPUs that cannot be matched to advertised devices (no
    identities, counts differ) and there are more of them than the device plugin withdrew, every GPU of the
    node is marked: a failed GPU is never handed out in a healthy one's place."""
    gpus = _whole_gpus(_agent_gpus(node))
    bad = [_agent_uuid(g) for g in gpus if not _agent_healthy(g)]
    if not bad or not spec.gpu_count:
        return ()
    if spec.gpu_ids:
        return tuple(i for i, u in enumerate(spec.gpu_ids) if u and u in bad)
    withdrawn = len(gpus) - spec.gpu_count
    if 0 < len(bad) <= withdrawn:
        return ()
    return tuple(range(spec.gpu_count))


def node_spec_from_node(node: Mapping[str, Any]) -> NodeSpec:
    """A Node (API dict) -> :class:`NodeSpec`: allocatable CPU/memory, physical GPUs, model, GPU memory,
    time-slicing replicas, device identities, topology.

    GPUs: ``status.allocatable["nvidia.com/gpu"]`` (what kubelet admits; a failed GPU drops out of it)
    divided by the time-slicing replicas (:func:`_replicas`), never more than gpupool's node agent calls
    healthy when its inventory cannot be matched to the advertised devices (:func:`agent_healthy_count`: a
    GPU lost before the agent started is still advertised). On a HAMi node (``hami.io/node-nvidia-register``)
    the allocatable count is vGPU slots, so the GPUs are the healthy registered devices (never more than the
    allocatable slots allow), with their UUIDs as ``gpu_ids``. GPU memory: GFD's ``nvidia.com/gpu.memory``
    (else HAMi's registered ``devmem``) wins over the catalog; neither nor a catalog model = unknown.
    Raises :class:`NodeParseError` when a capacity figure is unreadable.
    """
    name = check_node_shape(node)
    labels = node_labels(node)
    alloc = _allocatable(node)
    where = f"node {name}: status.allocatable"
    try:
        cpu = int(quantity(alloc.get("cpu", 0), f'{where}["cpu"]') * 1000)
        mem = int(quantity(alloc.get("memory", 0), f'{where}["memory"]') / MIB)
        slots = int(quantity(alloc.get(RES_GPU, 0), f'{where}["{RES_GPU}"]'))
    except RequestParseError as exc:
        raise NodeParseError(str(exc)) from None
    _warn_unreadable_labels(name, labels)
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
        healthy_gpus = agent_healthy_count(node) if not ids else None
        if healthy_gpus is not None and healthy_gpus < gpus:
            # device-plugin #231: a GPU lost before the agent (re)started is still advertised; the agent's
            # report, not allocatable, says how many GPUs work
            warn_once(name, "agent-fewer-healthy", f"node {name}: allocatable says {gpus} GPU(s), the node agent "
                      f"calls {healthy_gpus} healthy; counting {healthy_gpus}", event="node_gpus_capped_by_agent",
                      node=name, allocatable=gpus, healthy=healthy_gpus)
            gpus = healthy_gpus
            ids = agent_gpu_ids(node, gpus) if gpus else ()
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
                n = int(quantity(value, res))
            except RequestParseError:
                continue
            if n > 0:
                out[res[len(RES_MIG_PREFIX):]] = n
    return out


def mig_strategy(node: Mapping[str, Any]) -> str:
    return node_labels(node).get(LABEL_MIG_STRATEGY, "none")


_WARNED: dict[tuple[str, str], None] = {}  # (object, problem) already logged at warning level (bounded)


def warn_once(what: str, problem: str, message: str, **extra: Any) -> None:
    """Log ``message`` at warning level the first time ``what`` shows ``problem`` (not again every cycle)."""
    if (what, problem) in _WARNED:
        return
    if len(_WARNED) >= 4096:
        _WARNED.clear()
    _WARNED[(what, problem)] = None
    log.warning(message, extra=extra)
