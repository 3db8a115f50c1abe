"""``single-node``: everything onto the head node while it fits, then the next one (first fit)."""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest


class SingleNode(Policy):
    name = "single-node"
    description = "baseline: pile everything onto one head node while it fits, then the next"

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        return -nodes.astype(np.float64)
