"""``dot-product``: Tetris-style alignment of the node's free vector with the pod's request.

As in the FGD simulator's DotProduct plugin with ``merge`` dimensions and ``max`` normalization
(Grandl et al., "Multi-resource packing for cluster schedulers", SIGCOMM 2014; ATC'23 artifact
``dot_product_score.go``): vectors ``[cpu, total GPU share]`` divided by ``(128 cores, 8 GPUs)``; score
``(1 - <free, req> / 2) * 100`` as an integer: the node whose free resources align *least* with the
request is preferred, which packs. Devices: the fitting GPU with the least free share.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, node_share
from gpupool.policies.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU


class DotProduct(Policy):
    name = "dot-product"
    description = "GPU-aware: Tetris dot product of free and requested CPU/GPU (packs aligned nodes)"

    def score_key(self, req: EffectiveRequest) -> tuple:
        return (req.cpu_milli, req.num_gpu * req.gpu_milli, req.is_slice_ask)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        cpu = state.cpu_free[nodes] / MAX_SPEC_CPU
        gpu = state.usable_gpu_free(nodes).sum(axis=1) / MAX_SPEC_GPU
        dot = cpu * (req.cpu_milli / MAX_SPEC_CPU) + gpu * (req.num_gpu * node_share(state, req, nodes) / MAX_SPEC_GPU)
        return np.trunc((1.0 - dot / 2.0) * 100.0)
