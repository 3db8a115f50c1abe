"""``spread``: least-loaded first: the node whose usable GPUs have the most free share, and on it the
GPU with the most free share (CPU pods: the node with the most free CPU)."""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy, most_free_gpus
from gpupool.engine.filters import EffectiveRequest
from gpupool.model import MILLI


class Spread(Policy):
    name = "spread"
    description = "GPU-aware: least-loaded node and GPU first (balances load, strands whole GPUs)"

    def score_key(self, req: EffectiveRequest) -> tuple:
        return (req.num_gpu > 0,)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0:
            return state.cpu_free[nodes] / np.maximum(state.cpu_cap[nodes], 1)
        usable = state.gpu_healthy[nodes]
        free = np.where(usable, state.gpu_free[nodes], 0).sum(axis=1)
        return free / np.maximum(usable.sum(axis=1) * MILLI, 1)

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        return most_free_gpus(state, req, node)
