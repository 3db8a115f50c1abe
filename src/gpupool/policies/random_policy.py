"""``random``: a uniformly random node among those that fit."""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest


class RandomPolicy(Policy):
    name = "random"
    description = "baseline: a uniformly random node among those that fit"

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        return np.zeros(len(nodes))  # all tie: the engine's seeded tie-break picks uniformly
