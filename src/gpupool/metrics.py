"""Cluster-level metrics of a placement (pure functions of a :class:`ClusterState`).

* GPU allocation ratio: milli-GPU that placed pods asked for / total milli-GPU (0..1). A policy that
  hands a whole GPU to a fractional pod (``k8s-default``) holds more than it uses: that surplus is
  ``reserved_gpu_ratio - gpu_allocation_ratio``.
* Unallocated GPUs: free GPU capacity, in GPUs, on healthy devices.
* Fragmented GPUs: the part of the free capacity that the workload's typical GPU requests cannot use
  (Weng et al., ATC'23, Sec. 3; see :mod:`gpupool.frag`), in GPUs. Typical pods here are the GPU pods
  only, so an empty cluster has zero fragmentation.
* Load imbalance: coefficient of variation (std / mean) of per-node GPU allocation (held share /
  node GPU capacity) over GPU nodes; 0 when perfectly even.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from gpupool.cluster import ClusterState
from gpupool.frag import FragModel, typical_pods
from gpupool.model import MILLI, PodRequest


@dataclass(frozen=True)
class ClusterMetrics:
    gpu_allocation_ratio: float
    reserved_gpu_ratio: float
    unallocated_gpus: float
    fragmented_gpus: float
    load_imbalance: float
    placed_pods: int

    def to_dict(self) -> dict:
        return asdict(self)


def gpu_allocation_ratio(state: ClusterState) -> float:
    """Requested milli-GPU of placed pods / total milli-GPU (0..1); 0 for a GPU-less cluster."""
    if state.total_gpu_milli == 0:
        return 0.0
    used = sum(a.used_gpu_milli for a in state.assignments.values())
    return used / state.total_gpu_milli


def load_imbalance(state: ClusterState) -> float:
    """Coefficient of variation of per-node GPU allocation over GPU nodes (0 if none or all idle)."""
    gpu_nodes = state.gpu_count > 0
    if not gpu_nodes.any():
        return 0.0
    held = (MILLI * state.gpu_count - state.gpu_free.sum(axis=1))[gpu_nodes]
    per_node = held / (MILLI * state.gpu_count[gpu_nodes])
    mean = per_node.mean()
    return float(per_node.std() / mean) if mean > 0 else 0.0


def fragmented_gpus(state: ClusterState, workload: Sequence[PodRequest]) -> float:
    """Free GPU capacity (in GPUs) that the workload's typical GPU pods cannot use."""
    gpu_pods = [p for p in workload if p.num_gpu > 0]
    if not gpu_pods or state.total_gpus == 0:
        return 0.0
    model = FragModel(typical_pods(gpu_pods, include_cpu_pods=False), state.model_names)
    frag = model.frag(state.usable_gpu_free(), state.cpu_free, state.node_model)
    return float(frag.sum() / MILLI)


def cluster_metrics(state: ClusterState, workload: Sequence[PodRequest]) -> ClusterMetrics:
    """All cluster-level metrics at once."""
    free = int(state.usable_gpu_free().sum())
    return ClusterMetrics(
        gpu_allocation_ratio=gpu_allocation_ratio(state),
        reserved_gpu_ratio=(state.allocated_gpu_milli() / state.total_gpu_milli) if state.total_gpu_milli else 0.0,
        unallocated_gpus=free / MILLI,
        fragmented_gpus=fragmented_gpus(state, workload),
        load_imbalance=load_imbalance(state),
        placed_pods=len(state.assignments),
    )
