"""Filter plugins: which nodes can host a pod at all (kube-scheduler's Filter extension point).

Each filter returns a (len(nodes),) bool mask over a subset of node indices, vectorized, and names the
reason a node fails (shown in the unschedulable message the way kube-scheduler shows it:
``0/1213 nodes are available: 17 Insufficient cpu, 1196 Insufficient GPU share.``).

Filters depend only on the node's own state and the request, so the engine caches their masks and
re-evaluates only nodes whose ``version`` changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.model import MILLI, PodRequest


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

    def key(self) -> tuple:
        """Hashable identity of everything filters and node-local scores read from the request."""
        r = self.requested
        return (r.cpu_milli, r.memory_mib, r.num_gpu, self.gpu_milli, r.gpu_memory_mib, r.gpu_spec)


class FilterPlugin(Protocol):
    """``mask(state, req, nodes)`` -> (len(nodes),) bool: True where the node passes."""

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


def allowed_models(state: ClusterState, req: EffectiveRequest) -> np.ndarray:
    """(n_models + 1,) bool: which model indices the pod accepts; the last slot (index -1) is "no GPU"."""
    spec = req.requested.gpu_spec
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


class GpuModelMatch:
    reason = "GPU model not in gpu_spec"

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0 or not req.requested.gpu_spec:
            return np.ones(len(nodes), dtype=bool)
        return allowed_models(state, req)[state.node_model[nodes]]


def gpu_fit_matrix(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
    """(len(nodes), max_gpus) bool: GPUs that are healthy, of an allowed model, with enough share and memory."""
    milli = req.gpu_milli
    if milli > 0:  # the usable share is 0 on unhealthy and absent GPUs, so they fail this test
        ok = state.usable_gpu_free(nodes) >= milli
    else:
        ok = state.gpu_healthy[nodes] & (state.gpu_free[nodes] >= milli)
    if req.requested.gpu_spec:
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
    milli = req.gpu_milli
    spec = req.requested.gpu_spec
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


DEFAULT_FILTERS: tuple[FilterPlugin, ...] = (CpuFit(), MemoryFit(), GpuModelMatch(), GpuFit())


def feasible(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
             filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> np.ndarray:
    """(len(nodes),) bool: nodes passing every filter."""
    if not filters:
        return np.ones(len(nodes), dtype=bool)
    ok = np.array(filters[0].mask(state, req, nodes), dtype=bool)  # a copy: the filter's array stays as is
    for f in filters[1:]:
        ok &= f.mask(state, req, nodes)
    return ok


def unschedulable_reason(state: ClusterState, req: EffectiveRequest,
                         filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS) -> str:
    """kube-scheduler style message: how many nodes each filter rejected (first failing filter per node)."""
    nodes = np.arange(state.n_nodes)
    remaining = np.ones(state.n_nodes, dtype=bool)
    parts = []
    for f in filters:
        fails = remaining & ~f.mask(state, req, nodes)
        count = int(fails.sum())
        if count:
            parts.append(f"{count} {f.reason}")
        remaining &= ~fails
    if req.num_gpu and req.requested.gpu_spec and not any(
        m in state.model_index for m in req.requested.gpu_spec
    ):
        parts.append(f"no node has GPU model {'|'.join(req.requested.gpu_spec)}")
    return f"0/{state.n_nodes} nodes are available: " + (", ".join(parts) or "no node passed") + "."
