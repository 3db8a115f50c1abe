"""``best-fit``: the node left with the least free CPU and GPU after placement.

Score from the FGD simulator's BestFit plugin (Weng et al., ATC'23 artifact,
``pkg/simulator/plugin/best_fit_score.go``): ``(1 - sum_i w_i (free_i - req_i) / maxSpec_i) * 100``
over CPU and total GPU share, ``w = (0.5, 0.5)``, ``maxSpec = (128 cores, 8 GPUs)``, truncated to an
integer as kube-scheduler scores are. Devices: the fitting GPU with the least free share.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, node_share

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000


class BestFit(Policy):
    name = "best-fit"
    description = "GPU-aware: the node left with the least free CPU and GPU share (FGD paper's baseline)"

    def score_key(self, req: EffectiveRequest) -> tuple:
        return (req.cpu_milli, req.num_gpu * req.gpu_milli, req.is_slice_ask)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        cpu_left = state.cpu_free[nodes] - req.cpu_milli
        gpu_left = state.usable_gpu_free(nodes).sum(axis=1) - req.num_gpu * node_share(state, req, nodes)
        waste = 0.5 * cpu_left / MAX_SPEC_CPU + 0.5 * gpu_left / MAX_SPEC_GPU
        return np.trunc((1.0 - waste) * 100.0)
