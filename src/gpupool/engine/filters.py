"""Filter plugins: which nodes can host a pod at all (kube-scheduler's Filter extension point).

Each filter returns a (len(nodes),) bool mask over a subset of node indices, vectorized, and names the
reason a node fails (shown in the unschedulable message the way kube-scheduler shows it:
``0/1213 nodes are available: 17 Insufficient cpu, 1196 Insufficient GPU share.``).

Filters depend only on the node's own state and the request, so the engine caches their masks and
re-evaluates only nodes whose ``version`` changed.

GPU memory of unknown size (no node figure, model not in the catalog; ``gpu_mem_cap == 0``): a pod asking
an amount of GPU memory (``gpu_memory_mib``) never fits such GPUs and is told so
(:data:`UNKNOWN_MEMORY_REASON`); whole-GPU pods fit them; a share-only pod (``gpu_milli < 1000`` without a
memory amount, e.g. KAI ``gpu-fraction``) fits by share alone: its memory is that fraction of whatever the
GPU has, enforced (or not) by the sharing mechanism, so nothing is booked that could be over-booked.

Per-card shares: ``num_gpu > 1`` with ``gpu_milli < 1000`` needs ``num_gpu`` distinct GPUs each with that
share and memory free. Time-sliced nodes (``ClusterState.gpu_replicas`` > 1): a whole-GPU ask of ``N`` is
``N`` replicas, one replica's share (``ClusterState.slice_milli``) on each of ``N`` distinct GPUs
(:func:`node_share`).
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpupool.cluster import ClusterState, slice_ask
from gpupool.model import MILLI, PodRequest

UNKNOWN_MEMORY_REASON = "GPU memory unknown (no nvidia.com/gpu.memory label, model not in catalog)"
"""Why a pod asking an amount of GPU memory does not fit GPUs whose memory size nobody reported."""


@dataclass(frozen=True, slots=True)
class EffectiveRequest:
    """The request as a policy sees it (``k8s-default`` rounds a fractional share up to a whole GPU).

    ``gpu_milli`` is the share taken on each GPU; ``requested`` keeps the original pod request.
    """

    requested: PodRequest
    gpu_milli: int

    @property
    def num_gpu(self) -> int:
        return self.requested.num_gpu

    @property
    def cpu_milli(self) -> int:
        return self.requested.cpu_milli

    @property
    def memory_mib(self) -> int:
        return self.requested.memory_mib

    @property
    def is_fractional(self) -> bool:
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def is_slice_ask(self) -> bool:
        """True when the ask is in device-plugin units (whole GPUs, no memory amount): on a time-sliced node
        each unit is one replica of a distinct GPU (:func:`gpupool.cluster.slice_ask`)."""
        return slice_ask(self.requested.gpu_milli, self.gpu_milli, self.requested.gpu_memory_mib)

    def key(self) -> tuple:
        """Hashable identity of everything filters and node-local scores read from the request."""
        r = self.requested
        return (r.cpu_milli, r.memory_mib, r.num_gpu, self.gpu_milli, r.gpu_memory_mib, r.gpu_spec,
                r.gpu_milli, r.gpu_type_include, r.gpu_type_exclude)


def node_share(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
    """(len(nodes),) int64 milli-GPU each device of each node gives ``req``: ``req.gpu_milli``, except one
    replica's share (``state.slice_milli``) for a whole-GPU ask on a time-sliced node."""
    milli = np.full(len(nodes), req.gpu_milli, dtype=np.int64)
    if req.num_gpu and req.is_slice_ask:
        sliced = state.gpu_replicas[nodes] > 1
        milli = np.where(sliced, state.slice_milli[nodes], milli)
    return milli


class FilterPlugin(Protocol):
    """``mask(state, req, nodes)`` -> (len(nodes),) bool: True where the node passes.

    A filter may set a class attribute ``static = True`` when its verdict depends only on the node's object and
    the request (labels, taints, GPU model), never on what runs there: :func:`capacity_fit` then applies it to
    tell a pod that no node can ever take from one that waits for room."""

    reason: str

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray: ...


class CpuFit:
    reason = "Insufficient cpu"

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        return state.cpu_free[nodes] >= req.cpu_milli


class MemoryFit:
    reason = "Insufficient memory"

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        return state.mem_free[nodes] >= req.memory_mib


_MODEL_TEXTS: weakref.WeakKeyDictionary[ClusterState, tuple[tuple[str, ...], ...]] = weakref.WeakKeyDictionary()


def model_texts(state: ClusterState) -> tuple[tuple[str, ...], ...]:
    """Per model index of ``state``: the upper-case names GPU type selection matches against (the model's
    own name and the product names nodes of that model report, ``NodeSpec.gpu_product``). Cached per state
    (models and products never change within one :class:`ClusterState`)."""
    cached = _MODEL_TEXTS.get(state)
    if cached is None:
        texts: list[set[str]] = [{_type_text(m)} for m in state.model_names]
        for spec in state.nodes:
            if spec.gpu_count > 0 and spec.gpu_product:
                texts[state.model_index[spec.gpu_model]].add(_type_text(spec.gpu_product))
        cached = tuple(tuple(sorted(t)) for t in texts)
        _MODEL_TEXTS[state] = cached
    return cached


def _type_text(name: str) -> str:
    """A GPU model / product / type name as type selection compares it: upper case, whitespace runs as ``-``
    (GFD writes ``NVIDIA-A100-SXM4-80GB`` where NVML and HAMi say ``NVIDIA A100-SXM4-80GB``)."""
    return re.sub(r"\s+", "-", name.strip()).upper()


def type_matches(texts: tuple[str, ...], types: tuple[str, ...]) -> bool:
    """True when one of ``types`` is a case-insensitive substring of one of ``texts`` (as :func:`_type_text`
    writes them), the way HAMi matches ``nvidia.com/use-gputype`` against the device type."""
    return any(_type_text(t) in text for t in types for text in texts if _type_text(t))


def _type_allowed(state: ClusterState, req: EffectiveRequest) -> np.ndarray:
    """(n_models + 1,) bool: models GPU type selection (include / exclude substrings) lets the pod use."""
    r = req.requested
    out = np.ones(len(state.model_names) + 1, dtype=bool)
    for i, texts in enumerate(model_texts(state)):
        if r.gpu_type_include and not type_matches(texts, r.gpu_type_include):
            out[i] = False
        elif r.gpu_type_exclude and type_matches(texts, r.gpu_type_exclude):
            out[i] = False
    out[-1] = False
    return out


def _restricts_models(req: EffectiveRequest) -> bool:
    r = req.requested
    return bool(r.gpu_spec or r.gpu_type_include or r.gpu_type_exclude)


def allowed_models(state: ClusterState, req: EffectiveRequest) -> np.ndarray:
    """(n_models + 1,) bool: which model indices the pod accepts (``gpu_spec`` and GPU type selection); the
    last slot (index -1) is "no GPU"."""
    out = _spec_allowed(state, req.requested.gpu_spec)
    if req.requested.gpu_type_include or req.requested.gpu_type_exclude:
        out &= _type_allowed(state, req)
    return out


def _spec_allowed(state: ClusterState, spec: tuple[str, ...]) -> np.ndarray:
    """(n_models + 1,) bool: models named in ``spec`` (all models when it is empty); the last slot False."""
    if not spec:
        out = np.ones(len(state.model_names) + 1, dtype=bool)
    else:
        out = np.zeros(len(state.model_names) + 1, dtype=bool)
        for model in spec:
            idx = state.model_index.get(model)
            if idx is not None:
                out[idx] = True
    out[-1] = False
    return out


# public names of the two model tables, for the compiled filter kernels (gpupool.engine.kernels.filters)
spec_allowed = _spec_allowed
type_allowed = _type_allowed


class GpuModelMatch:
    reason = "GPU model not in gpu_spec"
    static = True  # the node's GPU model: its verdict does not change with load (see capacity_fit)

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0 or not req.requested.gpu_spec:
            return np.ones(len(nodes), dtype=bool)
        return _spec_allowed(state, req.requested.gpu_spec)[state.node_model[nodes]]


class GpuTypeMatch:
    """HAMi-style GPU type selection (``nvidia.com/use-gputype`` / ``nouse-gputype``)."""

    reason = "GPU type not selected (use-gputype / nouse-gputype)"
    static = True

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        r = req.requested
        if req.num_gpu == 0 or not (r.gpu_type_include or r.gpu_type_exclude):
            return np.ones(len(nodes), dtype=bool)
        return _type_allowed(state, req)[state.node_model[nodes]]


class GpuMemoryKnown:
    """A pod asking an amount of GPU memory (``gpu_memory_mib``) cannot be placed on GPUs of unknown memory
    size (no node figure, model not in the catalog): it passes nodes where some GPU's memory is known.
    Whole-GPU and share-only pods pass every node (their share is a fraction of whatever memory the GPU has;
    the device plugin or HAMi enforces it)."""

    reason = UNKNOWN_MEMORY_REASON
    static = True

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0 or not req.requested.gpu_memory_mib:
            return np.ones(len(nodes), dtype=bool)
        return (state.node_gpu_mem[nodes] > 0) | (state.gpu_count[nodes] == 0)


def gpu_fit_matrix(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
    """(len(nodes), max_gpus) bool: GPUs that are healthy, of an allowed model, with enough share and memory.

    The share is :func:`node_share` (one replica on a time-sliced node for a whole-GPU ask); memory is the
    pod's amount (only GPUs of known memory size), else its share of the GPU's memory (0 when unknown).
    """
    milli = node_share(state, req, nodes)[:, None]  # (k, 1)
    if req.gpu_milli > 0:  # the usable share is 0 on unhealthy and absent GPUs, so they fail this test
        ok = state.usable_gpu_free(nodes) >= milli
    else:
        ok = state.gpu_healthy[nodes] & (state.gpu_free[nodes] >= milli)
    if _restricts_models(req):
        ok &= allowed_models(state, req)[state.gpu_model[nodes]]
    mem_cap = state.gpu_mem_cap[nodes]
    if req.requested.gpu_memory_mib:
        need = req.requested.gpu_memory_mib
        ok &= (mem_cap > 0) & (state.gpu_mem_free[nodes] >= need)
    else:
        need = mem_cap * milli // MILLI
        ok &= state.gpu_mem_free[nodes] >= need
    return ok


def fitting_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> list[int]:
    """Device indices of one node that :func:`gpu_fit_matrix` marks True, lowest first.

    Same test, on the node's rows as Python ints (cheaper than the vectorized form for a single node).
    """
    milli = state.share_on(req.requested, node, req.gpu_milli)  # node_share of one node
    spec = _restricts_models(req)
    need_mem = req.requested.gpu_memory_mib
    free = state.gpu_free[node].tolist()
    healthy = state.gpu_healthy[node].tolist()
    mem_cap = state.gpu_mem_cap[node].tolist()
    mem_free = state.gpu_mem_free[node].tolist()
    if spec:
        allowed = allowed_models(state, req).tolist()
        model = state.gpu_model[node].tolist()
    out = []
    for g in range(len(free)):
        if not healthy[g] or free[g] < milli:
            continue
        if spec and not allowed[model[g]]:
            continue
        if need_mem:
            if not (mem_cap[g] > 0 and mem_free[g] >= need_mem):
                continue
        elif mem_free[g] < mem_cap[g] * milli // MILLI:
            continue
        out.append(g)
    return out


class GpuFit:
    reason = "Insufficient GPU share"
    FEW_NODES = 2

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0:
            return np.ones(len(nodes), dtype=bool)
        if len(nodes) <= self.FEW_NODES:  # cheaper node by node
            return np.array([len(fitting_gpus(state, req, n)) >= req.num_gpu for n in nodes.tolist()], dtype=bool)
        return gpu_fit_matrix(state, req, nodes).sum(axis=1) >= req.num_gpu


DEFAULT_FILTERS: tuple[FilterPlugin, ...] = (CpuFit(), MemoryFit(), GpuModelMatch(), GpuTypeMatch(), GpuMemoryKnown(),
                                             GpuFit())


def enough_fitting_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> list[int]:
    """:func:`fitting_gpus` of ``node``, at least ``req.num_gpu`` of them; raises ValueError naming the node and
    the pod when fewer fit (the filters rule that out before a node is chosen)."""
    idx = fitting_gpus(state, req, node)
    if len(idx) < req.num_gpu:
        raise ValueError(f"node {state.node_names[node]} cannot host {req.requested.name}")
    return idx


def feasible(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
             filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> np.ndarray:
    """(len(nodes),) bool: nodes passing every filter."""
    if not filters:
        return np.ones(len(nodes), dtype=bool)
    ok = np.array(filters[0].mask(state, req, nodes), dtype=bool)  # a copy: the filter's array stays as is
    for f in filters[1:]:
        ok &= f.mask(state, req, nodes)
    return ok


def _gpu_fit_causes(state: ClusterState, req: EffectiveRequest,
                    idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(sick, memory, sliced), each (len(idx),) bool, for nodes ``idx`` that GpuFit rejected: too few healthy
    GPUs, the share fits on enough GPUs but GPU memory lacks, or too few distinct time-sliced GPUs (exclusive)."""
    healthy = (state.gpu_healthy[idx] & state.gpu_exists[idx]).sum(axis=1)
    sick = (healthy < req.num_gpu) & (state.gpu_count[idx] >= req.num_gpu)
    share = node_share(state, req, idx)
    by_share = (state.usable_gpu_free(idx) >= share[:, None]).sum(axis=1)  # GPUs with the share free
    memory = ~sick & (by_share >= req.num_gpu)  # the share fits on enough GPUs: memory is what lacks
    sliced = ~sick & ~memory & (state.gpu_replicas[idx] > 1) & (req.num_gpu > 1) if req.is_slice_ask else \
        np.zeros(len(idx), dtype=bool)
    return sick, memory, sliced


def _gpu_fit_parts(state: ClusterState, req: EffectiveRequest, fails: np.ndarray, parts: list[str]) -> int:
    """Say apart why nodes failed :class:`GpuFit`: unhealthy GPUs (they wait for repair), GPU memory (the share
    fits but the memory does not), too few distinct GPUs with a free time-slice; returns how many nodes are
    left for the plain "Insufficient GPU share"."""
    idx = np.flatnonzero(fails)
    if not len(idx):
        return 0
    sick, memory, sliced = _gpu_fit_causes(state, req, idx)
    if sick.any():
        parts.append(f"{int(sick.sum())} node(s) had unhealthy GPUs")
    if memory.any():
        parts.append(f"{int(memory.sum())} Insufficient GPU memory")
    if sliced.any():
        parts.append(f"{int(sliced.sum())} node(s) had fewer than {req.num_gpu} distinct GPUs with a free "
                     "time-slice (each replica asked goes to its own GPU)")
    return int((~sick & ~memory & ~sliced).sum())


def _reason_text(state: ClusterState, req: EffectiveRequest, parts: list[str]) -> str:
    """The unschedulable message from the per-filter ``parts``, plus a missing GPU model or type."""
    if req.num_gpu and req.requested.gpu_spec and not any(
        m in state.model_index for m in req.requested.gpu_spec
    ):
        parts.append(f"no node has GPU model {'|'.join(req.requested.gpu_spec)}")
    include = req.requested.gpu_type_include
    if req.num_gpu and include and not any(type_matches(t, include) for t in model_texts(state)):
        parts.append(f"no node has GPU type {'|'.join(include)}")
    return f"0/{state.n_nodes} nodes are available: " + (", ".join(parts) or "no node passed") + "."


def unschedulable_reason(state: ClusterState, req: EffectiveRequest,
                         filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> str:
    """kube-scheduler style message: how many nodes each filter rejected (first failing filter per node)."""
    nodes = np.arange(state.n_nodes)
    remaining = np.ones(state.n_nodes, dtype=bool)
    parts = []
    for f in filters:
        fails = remaining & ~f.mask(state, req, nodes)
        count = int(fails.sum())
        if count and isinstance(f, GpuFit):
            count = _gpu_fit_parts(state, req, fails, parts)
        if count:
            parts.append(f"{count} {f.reason}")
        remaining &= ~fails
    return _reason_text(state, req, parts)


# --------------------------------------------------------------------------- failure codes
# A node's *failure code* says which filter rejected it first, so that the unschedulable message is a count
# of codes (cached with the node, refreshed where it changed) instead of every filter re-run over every GPU:
# 0 passes every filter; filter ``i`` (0-based, in order) rejecting it gives ``(i + 1) * CODE_STRIDE + sub``,
# ``sub`` 0 for the filter's own reason and, for :class:`GpuFit`, one of the finer reasons below.
CODE_STRIDE = 4
SUB_SICK, SUB_MEMORY, SUB_SLICED = 1, 2, 3


def failure_codes(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
                  filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> np.ndarray:
    """(len(nodes),) int16 failure code of each node (0: passes every filter; see ``CODE_STRIDE``): the first
    filter that rejects it and, for :class:`GpuFit`, whether unhealthy GPUs, GPU memory or too few distinct
    time-sliced GPUs is the finer cause (as :func:`unschedulable_reason` tells them apart)."""
    codes = np.zeros(len(nodes), dtype=np.int16)
    failed = np.flatnonzero(~feasible(state, req, nodes, filters))
    if not len(failed):  # usually: every changed node passes, nothing to tell apart
        return codes
    sub = nodes[failed]  # each filter again, on the failed nodes only
    sub_codes = np.zeros(len(failed), dtype=np.int16)
    for i, f in enumerate(filters):
        fails = ~np.asarray(f.mask(state, req, sub), dtype=bool) & (sub_codes == 0)
        if not fails.any():
            continue
        sub_codes[fails] = (i + 1) * CODE_STRIDE
        if isinstance(f, GpuFit):
            idx = np.flatnonzero(fails)
            sick, memory, sliced = _gpu_fit_causes(state, req, sub[idx])
            sub_codes[idx] += np.where(sick, SUB_SICK, np.where(memory, SUB_MEMORY, np.where(sliced, SUB_SLICED, 0)))
    codes[failed] = sub_codes
    return codes


def reason_from_counts(state: ClusterState, req: EffectiveRequest, counts: np.ndarray,
                       filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> str:
    """:func:`unschedulable_reason`'s message from ``counts`` = ``np.bincount`` of every node's
    :func:`failure_codes` (length at least ``(len(filters) + 1) * CODE_STRIDE``); the same text."""
    parts = []
    for i, f in enumerate(filters):
        base = (i + 1) * CODE_STRIDE
        count = int(counts[base])
        if isinstance(f, GpuFit):
            sick, memory, sliced = (int(counts[base + s]) for s in (SUB_SICK, SUB_MEMORY, SUB_SLICED))
            if sick:
                parts.append(f"{sick} node(s) had unhealthy GPUs")
            if memory:
                parts.append(f"{memory} Insufficient GPU memory")
            if sliced:
                parts.append(f"{sliced} node(s) had fewer than {req.num_gpu} distinct GPUs with a free "
                             "time-slice (each replica asked goes to its own GPU)")
        if count:
            parts.append(f"{count} {f.reason}")
    return _reason_text(state, req, parts)


# --------------------------------------------------------------------------- capacity (load left out)
def capacity_fit(state: ClusterState, req: EffectiveRequest,
                 filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> tuple[np.ndarray, str]:
    """Where ``req`` could ever go, whatever runs: ``(pods, reason)``.

    ``pods``: (n_nodes,) int64, an upper bound of how many pods like ``req`` each node could hold emptied (every
    GPU idle and counted, healthy or not): 0 where a ``static`` filter (see :class:`FilterPlugin`) rejects the
    node, where its CPU or memory capacity (milli-CPU, MiB) is below the ask, or where it has fewer GPUs of an
    allowed model (and, for a GPU memory ask, of that much memory) than the pod asks. Filters without
    ``static`` (free CPU, memory, GPU share, MIG devices in use) are left out: they change with load.
    ``reason``: when no node can hold one such pod, kube-scheduler's message with the first cause per node
    (``0/3 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 1 Insufficient memory.``);
    else "". Never raises for a valid state and request."""
    n = state.n_nodes
    nodes = np.arange(n)
    r = req.requested
    big = np.int64(1 << 30)
    causes: list[tuple[str, np.ndarray]] = []
    for f in filters:
        if getattr(f, "static", False):
            causes.append((f.reason, ~np.asarray(f.mask(state, req, nodes), dtype=bool)))
    pods = np.full(n, big, dtype=np.int64)
    if r.cpu_milli:
        pods = np.minimum(pods, state.cpu_cap // r.cpu_milli)
        causes.append(("Insufficient cpu", state.cpu_cap < r.cpu_milli))
    if r.memory_mib:
        pods = np.minimum(pods, state.mem_cap // r.memory_mib)
        causes.append(("Insufficient memory", state.mem_cap < r.memory_mib))
    g = req.num_gpu
    if g:
        usable = state.gpu_exists.copy()
        if _restricts_models(req):
            usable &= allowed_models(state, req)[state.gpu_model]
        if r.gpu_memory_mib:
            usable &= state.gpu_mem_cap >= r.gpu_memory_mib
        count = usable.sum(axis=1).astype(np.int64)
        if req.is_slice_ask:  # one replica of a distinct GPU per unit asked on a time-sliced node
            per_gpu = state.gpu_replicas
        else:
            per_gpu = np.full(n, max(1, MILLI // max(1, req.gpu_milli)), dtype=np.int64)
        pods = np.minimum(pods, np.where(count >= g, count * per_gpu // g, 0))
        causes.append((f"Insufficient GPUs (fewer than {g}" + (" of the model asked" if _restricts_models(req) else "")
                       + (f" with {r.gpu_memory_mib} MiB of memory" if r.gpu_memory_mib else "") + " on the node)",
                       count < g))
    for _, bad in causes:
        pods[bad] = 0
    if (pods > 0).any():
        return pods, ""
    parts = []
    left = np.ones(n, dtype=bool)
    for text, bad in causes:
        hit = left & bad
        if hit.any():
            parts.append(f"{int(hit.sum())} {text}")
            left &= ~hit
    return pods, _reason_text(state, req, parts)
