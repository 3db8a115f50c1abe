"""``gpupool``: gpupool's default placement policy, fragmentation gradient descent and beyond.

Starts from FGD (Weng et al., ATC'23) and adds (each measured in the README):

1. exact fragmentation deltas instead of the artifact's integer sigmoid scores, so placements that
   FGD sees as ties are told apart;
2. memory-aware fragmentation: a typical pod that fits a node's GPUs and CPU but not its memory
   cannot use those GPUs either (FGD counts only CPU);
3. a best-fit tie-break among equal fragmentation deltas, which keeps idle nodes whole for
   multi-GPU pods.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest
from gpupool.policies.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU
from gpupool.policies.fgd import FGD


class GpupoolPolicy(FGD):
    name = "gpupool"
    description = "gpupool default: FGD with exact deltas, memory-aware fragmentation, best-fit tie-break"

    use_memory = True
    integer_scores = False
    tie_break = 1e-3

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        base = self._evaluate(state, req, nodes)[0]
        if not self.tie_break:
            return base
        cpu_left = (state.cpu_free[nodes] - req.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (state.usable_gpu_free()[nodes].sum(axis=1) - req.num_gpu * req.gpu_milli) / MAX_SPEC_GPU
        return base - self.tie_break * (cpu_left + gpu_left)
