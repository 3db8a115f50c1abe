"""GPU fragmentation, as defined by Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC 2023, Sec. 3 (and its simulator,
``hkust-adsl/kubernetes-scheduler-simulator``, ``pkg/utils/frag.go``).

A node's free GPU share is *fragmented for a task* when the task cannot use it:

* the task cannot run on the node at all (too little CPU, no GPU of an allowed model, too few GPUs
  with enough free share): all the node's free GPU share is fragmented;
* the task asks for no GPU: all free GPU share counts as fragmented for it (it cannot use any);
* otherwise, the free share of each GPU that is smaller than the task's per-GPU ask is fragmented.

The node's fragmentation is the expectation over the workload's *typical pods* (the most frequent
request shapes covering 95% of pods, with their frequencies). Everything here is vectorized: a
"node state" is a row of free GPU shares plus free CPU (and optionally memory) and a GPU model.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.model import PodRequest


@dataclass(frozen=True)
class TypicalPods:
    """Typical pod shapes of a workload, most frequent first.

    * ``cpu_milli``, ``memory_mib``, ``num_gpu``, ``gpu_milli``: (T,) int64 per shape
    * ``gpu_spec``: per shape, the allowed GPU models (empty: any)
    * ``prob``: (T,) float64, frequencies renormalized to sum to 1
    """

    cpu_milli: np.ndarray
    memory_mib: np.ndarray
    num_gpu: np.ndarray
    gpu_milli: np.ndarray
    gpu_spec: tuple[tuple[str, ...], ...]
    prob: np.ndarray

    def __len__(self) -> int:
        return len(self.prob)

    def access(self, model_names: Sequence[str]) -> np.ndarray:
        """(n_models + 1, T) bool: shape t may use GPU model m; the last row is "no GPU" (False)."""
        out = np.ones((len(model_names) + 1, len(self)), dtype=bool)
        for t, spec in enumerate(self.gpu_spec):
            if spec:
                out[:, t] = [m in spec for m in model_names] + [False]
        out[-1, :] = False
        return out


def typical_pods(pods: Sequence[PodRequest], threshold: float = 0.95, include_cpu_pods: bool = True,
                 with_memory: bool = False) -> TypicalPods:
    """The most frequent request shapes covering ``threshold`` of ``pods``.

    A shape is (cpu, per-GPU milli, GPU count, gpu_spec); with ``with_memory`` each shape also carries
    the median memory of its pods (MiB), else 0. Shapes are
    ranked by count (ties: larger shape first, as the FGD simulator's ``GetTypicalPods`` does) and
    taken one by one until their cumulative share reaches ``threshold``; frequencies are renormalized.
    Raises ValueError on an empty workload.
    """
    counts: Counter[tuple] = Counter()
    memories: dict[tuple, list[int]] = {}
    for p in pods:
        if not include_cpu_pods and p.num_gpu == 0:
            continue
        shape = (p.cpu_milli, p.gpu_milli, p.num_gpu, p.gpu_spec)
        counts[shape] += 1
        memories.setdefault(shape, []).append(p.memory_mib)
    total = sum(counts.values())
    if total == 0:
        raise ValueError("typical pods of an empty workload")
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], "|".join(kv[0][3])),
                    reverse=True)
    chosen = []
    cum = 0
    for shape, cnt in ranked:
        if cum >= threshold * total:
            break
        chosen.append((shape, cnt))
        cum += cnt
    prob = np.array([c for _, c in chosen], dtype=np.float64) / cum
    return TypicalPods(
        cpu_milli=np.array([s[0] for s, _ in chosen], dtype=np.int64),
        memory_mib=np.array([int(np.median(memories[s])) if with_memory else 0 for s, _ in chosen],
                            dtype=np.int64),
        num_gpu=np.array([s[2] for s, _ in chosen], dtype=np.int64),
        gpu_milli=np.array([s[1] for s, _ in chosen], dtype=np.int64),
        gpu_spec=tuple(s[3] for s, _ in chosen),
        prob=prob,
    )


class FragModel:
    """Vectorized fragmentation of node states for one workload and one cluster's model list.

    ``frag(free, cpu, model[, mem])`` takes (k, G) free milli-GPU, (k,) free milli-CPU, (k,) model
    index (-1: CPU-only) and, if the typical pods carry memory, (k,) free MiB; returns (k,) float64
    expected fragmented milli-GPU.
    """

    def __init__(self, typical: TypicalPods, model_names: Sequence[str], use_memory: bool = False) -> None:
        self.typical = typical
        self.use_memory = use_memory
        self.access = typical.access(model_names)  # (M+1, T)
        self.cpu = typical.cpu_milli
        self.mem = typical.memory_mib
        self.num = typical.num_gpu
        self.milli = typical.gpu_milli
        self.prob = typical.prob
        self.gpu_shape = typical.gpu_milli > 0  # (T,)
        # the same per shape as Python values, for _frag_few; shapes no node can serve are left out
        self._shapes = [(t, int(self.milli[t]), int(self.num[t]), int(self.cpu[t]), int(self.mem[t]))
                        for t in range(len(typical)) if self.gpu_shape[t]]
        self._access = self.access.tolist()

    FEW_CELLS = 128
    """At most this many (node, GPU, shape) cells, :meth:`frag` counts in Python (NumPy calls on tiny
    arrays cost more than the arithmetic)."""

    def _combine(self, total, count, small, cpu, model, mem) -> np.ndarray:
        """Expected fragmentation from per-shape GPU counts/slivers; arrays broadcast over leading axes."""
        ok = self.access[model] & (cpu[..., None] >= self.cpu) & (count >= self.num)
        if self.use_memory and mem is not None:
            ok &= mem[..., None] >= self.mem
        ok &= self.gpu_shape
        return np.where(ok, small, total[..., None]) @ self.prob

    def frag(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray,
             mem: np.ndarray | None = None) -> np.ndarray:
        free = np.asarray(free, dtype=np.int64)
        if 0 < free.size * len(self.prob) <= self.FEW_CELLS:
            return self._frag_few(free, cpu, model, mem)
        total = free.sum(axis=1)  # (k,)
        ge = free[:, :, None] >= self.milli  # (k, G, T)
        count = ge.sum(axis=1)  # (k, T)
        small = np.where(ge, 0, free[:, :, None]).sum(axis=1)  # (k, T): share of GPUs too small for t
        return self._combine(total, count, small, cpu, model, mem)

    def _frag_few(self, free: np.ndarray, cpu: np.ndarray, model: np.ndarray,
                  mem: np.ndarray | None) -> np.ndarray:
        """:meth:`frag` for a few nodes: the same (k, T) matrix of fragmented shares, built in Python, and
        the same product with ``prob`` (so the same float64 result)."""
        n_shapes = len(self.prob)
        use_mem = self.use_memory and mem is not None
        mems = mem.tolist() if use_mem else None
        out = []
        for i, (row, c, m) in enumerate(zip(free.tolist(), cpu.tolist(), model.tolist(), strict=True)):
            total = sum(row)
            access = self._access[m]
            cells = [total] * n_shapes  # a shape the node cannot serve: all its free share is fragmented
            for t, milli, num, cpu_t, mem_t in self._shapes:
                if not access[t] or c < cpu_t or (use_mem and mems[i] < mem_t):
                    continue
                count = small = 0
                for x in row:
                    if x >= milli:
                        count += 1
                    else:
                        small += x
                if count >= num:
                    cells[t] = small
            out.append(cells)
        return np.array(out, dtype=np.int64) @ self.prob

    def frag_after_share(self, free: np.ndarray, milli: int, cpu_after: np.ndarray, model: np.ndarray,
                         mem_after: np.ndarray | None = None) -> np.ndarray:
        """(k, G) fragmentation after taking ``milli`` from GPU g of each node (one GPU changes).

        Same result as calling :meth:`frag` on each of the G modified states, at a G-th of the cost:
        only GPU g's contribution to the per-shape counts and slivers is swapped.
        """
        free = np.asarray(free, dtype=np.int64)
        after = np.maximum(free - milli, 0)  # (k, G): GPU g's free share if the pod lands on it
        ge = free[:, :, None] >= self.milli  # (k, G, T)
        ge_a = after[:, :, None] >= self.milli
        count = ge.sum(axis=1)[:, None, :] - ge + ge_a  # (k, G, T)
        sliver = np.where(ge, 0, free[:, :, None])
        small = sliver.sum(axis=1)[:, None, :] - sliver + np.where(ge_a, 0, after[:, :, None])
        total = free.sum(axis=1)[:, None] - (free - after)  # (k, G)
        mem_b = None if mem_after is None else mem_after[:, None]
        return self._combine(total, count, small, cpu_after[:, None], model[:, None], mem_b)


def cluster_fragmentation(state, model: FragModel) -> np.ndarray:
    """(n_nodes,) float64 expected fragmented milli-GPU of every node of a ClusterState."""
    return model.frag(state.usable_gpu_free(), state.cpu_free, state.node_model, state.mem_free)
