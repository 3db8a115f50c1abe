"""``gpu-packing``: fill partly used GPUs first, then free GPUs on used nodes, then idle nodes.

Score rules of the FGD simulator's GpuPacking plugin (ATC'23 artifact, ``gpu_packing_score.go``),
from high to low: (1) the pod fits on already shared GPUs: ``100 - sum(free% of used GPUs)/10``, at
least 50; (2) it needs fully free GPUs of a used node: ``50 - #free GPUs used``, at least 33;
(3) the node is idle: ``33 - #GPUs``. Devices: the fitting GPUs with the least free share.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, gpu_fit_matrix
from gpupool.model import MILLI


class GpuPacking(Policy):
    name = "gpu-packing"
    description = "GPU-aware: shared GPUs first, then free GPUs of used nodes, then idle nodes"

    def score_key(self, req: EffectiveRequest) -> tuple:
        r = req.requested
        return (req.num_gpu, req.gpu_milli, r.gpu_spec, r.gpu_memory_mib, r.gpu_milli, r.gpu_type_include,
                r.gpu_type_exclude)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0:
            return np.zeros(len(nodes))
        free = state.gpu_free[nodes].astype(np.int64)
        exists = state.gpu_exists[nodes]
        fully_free = (free == MILLI) & exists
        n_full = fully_free.sum(axis=1)
        idle = n_full == state.gpu_count[nodes]
        fits = gpu_fit_matrix(state, req, nodes)
        # the GPUs the packing choice would use: fitting ones, least free first
        key = np.where(fits, free, MILLI + 1)
        order = np.argsort(key, axis=1, kind="stable")[:, : req.num_gpu]
        chosen_free = np.take_along_axis(free, order, axis=1)
        chosen_fit = np.take_along_axis(fits, order, axis=1)
        uses_full = ((chosen_free == MILLI) & chosen_fit).sum(axis=1)
        pct = (np.where(chosen_fit, chosen_free, 0) * 100 // MILLI).sum(axis=1)
        case1 = np.maximum(100 - pct // 10, 50)
        case2 = np.maximum(50 - uses_full, 33)
        case3 = np.maximum(33 - n_full, n_full)
        score = np.where(idle, case3, np.where(uses_full > 0, case2, case1))
        return score.astype(np.float64)
