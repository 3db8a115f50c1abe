"""``lowest-power``: prefer nodes whose GPU model draws the least peak power (catalog figures)."""

from __future__ import annotations

import numpy as np

from gpupool.catalog import get_model
from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest


class LowestPower(Policy):
    name = "lowest-power"
    description = "baseline: prefer the lowest-power GPU model (catalog peak W; unknown models last)"

    def score_key(self, req: EffectiveRequest) -> tuple:
        return ()

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        watts = np.array([get_model(m).peak_w or np.inf for m in state.model_names] + [0.0])
        return -watts[state.node_model[nodes]]
