"""``round-robin``: the next node in turn that fits, regardless of load (a naive pool's baseline)."""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest
from gpupool.model import Assignment


class RoundRobin(Policy):
    name = "round-robin"
    description = "baseline: next node in turn that fits, regardless of load"
    node_local = False

    def __init__(self) -> None:
        self.next_node = 0

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        # distance (in turn order) from the pointer; the nearest node wins
        return -((nodes - self.next_node) % state.n_nodes).astype(np.float64)

    def on_allocate(self, state: ClusterState, assignment: Assignment) -> None:
        self.next_node = (assignment.node + 1) % state.n_nodes
