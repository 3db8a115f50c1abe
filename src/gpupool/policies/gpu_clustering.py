"""``gpu-clustering``: put pods of the same GPU-request kind together.

Score rules of the FGD simulator's GpuClustering plugin (ATC'23 artifact,
``gpu_clustering_score.go``). Kinds: shared, 1, 2, 4, 8 and other GPU counts. A node holding only
pods of the pod's kind scores in (75, 100], a node holding that kind among others in (50, 75], an
idle node in (25, 50], others in (0, 25]; within a band, fuller nodes score higher.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest
from gpupool.model import MILLI, Assignment

MAX_SPEC_GPU = 8000
KINDS = {1: 1, 2: 2, 4: 3, 8: 4}  # kind index by whole-GPU count; 0 = shared, 5 = other


def gpu_kind(num_gpu: int, gpu_milli: int) -> int:
    if num_gpu == 1 and gpu_milli < MILLI:
        return 0
    return KINDS.get(num_gpu, 5)


class GpuClustering(Policy):
    name = "gpu-clustering"
    description = "GPU-aware: cluster pods of the same GPU-request kind on the same nodes"

    def prepare(self, state: ClusterState, workload) -> None:
        self.kind_count = np.zeros((state.n_nodes, 6), dtype=np.int64)  # GPU pods per kind and node

    def score_key(self, req: EffectiveRequest) -> tuple:
        return (req.num_gpu, req.gpu_milli)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if req.num_gpu == 0:
            return np.zeros(len(nodes))
        kind = gpu_kind(req.num_gpu, req.gpu_milli)
        counts = self.kind_count[nodes]
        kinds_present = (counts > 0).sum(axis=1)
        left = state.usable_gpu_free(nodes).sum(axis=1)
        fill = 25 * (MAX_SPEC_GPU - left) // MAX_SPEC_GPU
        band = np.where(
            counts[:, kind] > 0,
            np.where(kinds_present == 1, 75, 50),
            np.where(kinds_present == 0, 25, 0),
        )
        return (fill + band).astype(np.float64)

    def on_allocate(self, state: ClusterState, assignment: Assignment) -> None:
        if assignment.gpus:
            kind = gpu_kind(len(assignment.gpus), assignment.requested_gpu_milli)
            self.kind_count[assignment.node, kind] += 1

    def on_release(self, state: ClusterState, assignment: Assignment) -> None:
        if assignment.gpus:
            kind = gpu_kind(len(assignment.gpus), assignment.requested_gpu_milli)
            self.kind_count[assignment.node, kind] -= 1
