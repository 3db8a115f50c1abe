"""The cache's records (one per Node, one per Pod, one per assumed pod) and what a pod is charged to its queue."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.cluster import ClusterState, slice_ask
from gpupool.k8s.objects.fields import RequestParseError
from gpupool.k8s.objects.pods import PodInfo
from gpupool.model import MILLI, Assignment, NodeSpec


# ------------------------------------------------------------------ records
@dataclass
class NodeRecord:
    """One Node as gpupool reads it (``spec`` None: unreadable, ``error`` says why)."""

    name: str
    obj: Mapping[str, Any]
    rv: str
    spec: NodeSpec | None
    error: str = ""
    replicas: int = 1
    mig_cap: dict[str, int] = field(default_factory=dict)
    eligibility: str = ""  # canonical JSON of what node eligibility reads (labels, taints, cordon, Ready)
    marked: tuple[int, ...] = ()  # devices the node's agent marked unhealthy (gpupool.io/gpu-inventory)
    # namespace/name -> GPU UUIDs the kubelet gave each pod (the agent's gpupool.io/pod-devices); None: no map, or
    # no device identities on the node to read it with
    kubelet_pods: dict[str, tuple[str, ...]] | None = None

    @property
    def capacity_key(self) -> tuple:
        """What, when it changes, needs the state rebuilt (the node's rows in the arrays change shape)."""
        s = self.spec
        return (None if s is None else (s.cpu_milli, s.memory_mib, s.gpu_count, s.gpu_model,
                                        getattr(s, "gpu_memory_mib", 0), s.nvlink_domain, s.rack, s.switch,
                                        s.gpu_ids),
                self.replicas, tuple(sorted(self.mig_cap.items())))


@dataclass
class PodRecord:
    """One Pod: its parsed request (``info``; ``error`` when unreadable), binding and what it holds.

    ``key`` is ``namespace/name`` (``namespace/name#2`` for the second object of one name in a snapshot
    file: both hold resources). ``held`` is the key of its assignment in the state while counted.
    """

    key: str
    base: str
    obj: Mapping[str, Any]
    uid: str
    rv: str
    info: PodInfo | None
    error: RequestParseError | None
    node: str  # spec.nodeName ("" while pending)
    terminal: bool
    waiting: bool  # pending and naming this scheduler (or its spec is unreadable)
    counted: bool = False
    charge: int = 0  # milli-GPU charged to its queue while counted
    note: str = ""
    kubelet: bool = False  # counted on the devices the kubelet reports it holds (PodResources)
    unsettled: bool = False  # a device-plugin GPU pod on a node with a kubelet map that does not name it yet


@dataclass
class Assumption:
    """A pod gpupool placed and is binding: it holds its devices until the watch shows it bound."""

    uid: str
    node: str
    since: float
    bound_at: float | None = None
    mig: tuple[tuple[str, int], ...] = ()


def queue_charge(info: PodInfo, assignment: Assignment | None, state: ClusterState | None) -> int:
    """milli-GPU a pod is charged to its queue: the GPU fraction it occupies on the devices it holds.

    A share is charged per GPU as ``max(share taken, memory / the GPU's memory)``: a pod asking 70,000 MiB of
    an 81,559 MiB card (HAMi ``nvidia.com/gpumem``, KAI ``gpu-memory``) is charged 859 milli, not the 1 milli
    share it declares. Where the GPU's memory is unknown, a memory-sized share is charged a whole GPU.
    Without an assignment (not placed yet) the declared share is charged, a lower bound: a whole-GPU ask
    that may land on a time-sliced node (``state`` given) is charged the smallest replica in the cluster.
    A MIG device counts its compute slices (``3g.40gb`` = 3/7 GPU).
    """
    req = info.request
    mig = info.gpu_milli_total - req.total_gpu_milli
    if not req.num_gpu:
        return mig
    if assignment is None or not assignment.gpus:
        if state is not None and slice_ask(req.gpu_milli, req.gpu_milli, req.gpu_memory_mib):
            # a whole-GPU ask takes one replica of a time-sliced GPU: the smallest slice is the lower bound
            return req.num_gpu * int(state.slice_milli.min()) + mig
        return req.total_gpu_milli + mig
    if state is None:
        return len(assignment.gpus) * assignment.gpu_milli + mig
    total = 0
    caps = state.gpu_mem_cap[assignment.node]
    for g in assignment.gpus:
        share = assignment.gpu_milli  # what the device gave (one replica of a time-sliced GPU: its slice)
        if req.gpu_memory_mib:
            cap = int(caps[g])
            share = max(share, min(MILLI, math.ceil(req.gpu_memory_mib * MILLI / cap)) if cap else MILLI)
        total += share
    return total + mig
