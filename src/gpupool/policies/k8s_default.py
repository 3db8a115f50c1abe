"""``k8s-default``: what the default kube-scheduler does with GPUs.

``nvidia.com/gpu`` is an integer extended resource, so a pod asking for a fraction of a GPU is given a
whole one; nodes are scored by NodeResourcesLeastAllocated on CPU and memory (equal weights,
``(allocatable - requested) * 100 / allocatable``, integer), which spreads pods; the device plugin
hands out the lowest-index free GPUs.
"""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, enough_fitting_gpus
from gpupool.model import MILLI, PodRequest


class K8sDefault(Policy):
    name = "k8s-default"
    description = "baseline: kube-scheduler as is: integer GPUs (a fraction takes a whole GPU), LeastAllocated"

    def effective(self, req: PodRequest) -> EffectiveRequest:
        return EffectiveRequest(req, MILLI if req.num_gpu else 0)

    def score_key(self, req: EffectiveRequest) -> tuple:
        return (req.cpu_milli, req.memory_mib)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        cpu_cap = np.maximum(state.cpu_cap[nodes], 1)
        mem_cap = np.maximum(state.mem_cap[nodes], 1)
        cpu = np.maximum(state.cpu_free[nodes] - req.cpu_milli, 0) * 100 // cpu_cap
        mem = np.maximum(state.mem_free[nodes] - req.memory_mib, 0) * 100 // mem_cap
        return ((cpu + mem) // 2).astype(np.float64)

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        """The lowest-index fitting GPUs (the device plugin's order), by the filters' own per-GPU test.

        On a time-sliced node a whole-GPU request takes one replica's share, not a whole free GPU, so the
        test is :func:`~gpupool.engine.filters.fitting_gpus` (which knows the node's sharing), not
        ``free >= 1000``. Raises ValueError naming the node when too few GPUs fit (the filters rule that out).
        """
        if req.num_gpu == 0:
            return ()
        return tuple(enough_fitting_gpus(state, req, node)[: req.num_gpu])
