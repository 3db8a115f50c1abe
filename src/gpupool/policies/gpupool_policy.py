"""``gpupool``: gpupool's default placement policy: fragmentation gradient descent plus packing.

Starts from FGD (Weng et al., ATC'23; :mod:`gpupool.policies.fgd`) and changes three things, each
measured in the README (openb traces, inflation protocol, 10 seeds):

1. **Exact fragmentation deltas blended with a best-fit term.** The score of a placement is
   ``decrease of expected fragmentation (GPUs) - w * (CPU left / 128 cores + GPU share left / 8 GPUs)``
   with ``w = 0.05``. FGD's integer sigmoid scores make many placements tie and break the ties by node
   order; the blend instead prefers, among placements that fragment about equally, the node that is
   left fullest, which keeps emptier nodes whole for multi-GPU pods and packs CPU-only pods onto
   nodes whose GPUs are already taken.
2. **Memory-aware fragmentation.** A typical pod that would fit a node's GPUs and CPU but not its
   free memory cannot use those GPUs either (FGD looks at CPU only); each typical shape carries the
   median memory of its pods.
3. **Deterministic tie-break** by node order (as FGD here), so runs are reproducible per seed.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest
from gpupool.policies.best_fit import MAX_SPEC_CPU, MAX_SPEC_GPU
from gpupool.policies.fgd import FGD


class GpupoolPolicy(FGD):
    name = "gpupool"
    description = "gpupool default: FGD with exact deltas blended with best-fit, memory-aware fragmentation"

    use_memory = True
    integer_scores = False
    pack_weight = 0.05
    """Weight of the best-fit term, in GPUs of fragmentation per unit of normalized leftover."""

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        decrease_gpus = self._evaluate(state, req, nodes)[0] / 1000.0
        cpu_left = (state.cpu_free[nodes] - req.cpu_milli) / MAX_SPEC_CPU
        gpu_left = (state.usable_gpu_free()[nodes].sum(axis=1) - req.num_gpu * req.gpu_milli) / MAX_SPEC_GPU
        return decrease_gpus - self.pack_weight * (cpu_left + gpu_left)
