"""``gpupool``: gpupool's default placement policy: FGD plus GPU-model scarcity, GPU packing and CPU stranding.

Starts from FGD (Weng et al., ATC'23; :mod:`gpupool.policies.fgd`: integer fragmentation-gradient
scores, ties by node order) and adds four things, each measured in the README (openb traces,
inflation protocol, 10 seeds):

1. **GPU-model scarcity.** Pods restricted to a few GPU models (``gpu_spec``) can only use those
   models; pods that accept any model should leave them alone. From the typical pods, the
   *pressure* on model ``m`` is the share of GPU demand restricted to model sets containing ``m``,
   divided by the capacity share of that set, summed over such sets (1.0: constrained pods alone
   would fill the model). A placement on model ``m`` loses ``kappa * 25 * pressure(m)`` score points
   per GPU it takes (25 points of FGD's score are about 1,000 milli-GPU of fragmentation near the
   sigmoid's centre, so at pressure 1 taking a GPU of a scarce model costs as much as fragmenting a
   whole GPU). On openb ``gpuspec33`` FGD leaves 626 G2 GPUs idle while T4-, P100- and G3-only pods
   fail; with this term those pods find their GPUs. Without ``gpu_spec`` in the workload the
   pressure is zero and the term does nothing.
2. **GPU packing among ties.** Between placements with equal scores, the node left with the least
   free GPU share wins (then node order, as FGD), which keeps emptier nodes whole for multi-GPU and
   whole-GPU pods. Only the GPU share counts here: adding CPU to this tie-break packed CPU-poor
   nodes first and stranded their GPUs on ``gpushare100``.
3. **Memory-aware fragmentation.** A typical pod that fits a node's GPUs and CPU but not its free
   host memory cannot use those GPUs either (FGD reads CPU only); each typical shape carries the
   median memory of its pods (:func:`gpupool.frag.typical_pods`).
4. **CPU stranding** (``strand_weight``): a placement loses ``strand_weight`` points per GPU of free share
   it *strands*, i.e. that its node's free CPU can no longer feed at the workload's CPU per GPU
   (:func:`stranded_gpus` after minus before). FGD sees CPU only through the typical pods that no longer
   fit; this term sees a node's CPU running out *before* it does, and lets CPU-only and CPU-heavy pods
   use nodes whose GPUs are already stranded. Counting the stranding left after the placement (not the
   change) lost 0.2 point against FGD on ``gpushare100``; the change won on every variant. 25 points per
   GPU (:data:`POINTS_PER_GPU`) counts a stranded GPU like a fragmented one; 3 and 10 measured the same
   within 0.1 point except on ``multigpu50`` (25 best). ``strand_memory`` adds host memory (no change).
   Where every GPU pod asks at most its node's CPU per GPU (the job simulator's pods ask half the
   smallest node ratio), nothing is ever stranded and the term is exactly zero.

Options measured for the gap to the offline optimum (issue 12; ``benchmarks/openb_allocation.py``
ablations, ``benchmarks/optimum.py`` for the optimum), each a class attribute:

* ``typical_threshold``: 1.0 scores fragmentation against every shape of the workload (FGD: the shapes
  covering 95% of pods).
* ``gpu_best_fit`` (device choice): a fractional pod goes, among the GPUs of its node that score the same,
  to the one it leaves with the least free share (FGD: the lowest index).
* ``demand_weighted``: typical shapes weighed by GPU demand instead of pod count (lost 1.2 points on
  ``default``: it sacrifices the many small pods to keep whole GPUs for the few large ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest, node_share
from gpupool.frag import FragModel, TypicalPods
from gpupool.model import MILLI, PodRequest
from gpupool.policies.best_fit import MAX_SPEC_GPU
from gpupool.policies.fgd import FGD

POINTS_PER_GPU = 25.0
"""FGD score points (of 100) per GPU of fragmentation near the sigmoid's centre: 100 * 0.25."""


def model_pressure(typical: TypicalPods, state: ClusterState) -> np.ndarray:
    """(n_models + 1,) float64 demand pressure on each GPU model of ``state`` (last slot: no GPU, 0).

    For every typical shape restricted to a model set S (``gpu_spec``), its share of the typical GPU
    demand divided by S's share of cluster GPU capacity is added to every model of S. Shapes without
    ``gpu_spec``, CPU-only shapes and models absent from the cluster add nothing.
    """
    pressure = np.zeros(len(state.model_names) + 1)
    demand = typical.prob * typical.num_gpu * typical.gpu_milli
    if demand.sum() <= 0 or state.total_gpus == 0:
        return pressure
    share = demand / demand.sum()
    capacity = np.array([state.gpu_count[state.node_model == m].sum() for m in range(len(state.model_names))],
                        dtype=np.float64) / state.total_gpus
    for t, spec in enumerate(typical.gpu_spec):
        if not spec or share[t] == 0:
            continue
        models = sorted({state.model_index[m] for m in spec if m in state.model_index})
        if models and capacity[models].sum() > 0:
            pressure[models] += share[t] / capacity[models].sum()
    return pressure


def per_gpu_milli(workload: Sequence[PodRequest] | None, resource: str = "cpu_milli") -> float:
    """How much of ``resource`` (a PodRequest field: ``cpu_milli`` or ``memory_mib``) the workload's GPU pods
    ask per milli-GPU they ask (0.0 without GPU pods): what a node needs to put its free GPU share to use,
    at the workload's mix."""
    gpu = [p for p in workload or () if p.num_gpu]
    demand = sum(p.num_gpu * p.gpu_milli for p in gpu)
    return sum(getattr(p, resource) for p in gpu) / demand if demand else 0.0


def stranded_gpus(gpu_free: np.ndarray, cpu_free: np.ndarray, cpu_per_gpu: float,
                  mem_free: np.ndarray | None = None, mem_per_gpu: float = 0.0) -> np.ndarray:
    """(k,) float64 GPUs of free share that the nodes' free CPU (and memory) cannot feed.

    ``gpu_free`` (k,) free milli-GPU, ``cpu_free`` (k,) free milli-CPU, ``mem_free`` (k,) free MiB per node;
    ``cpu_per_gpu`` milli-CPU and ``mem_per_gpu`` MiB the workload's GPU pods ask per milli-GPU
    (:func:`per_gpu_milli`). The GPU share the CPU can feed is ``cpu_free / cpu_per_gpu`` (likewise memory;
    the smaller counts); what lies beyond it is stranded: ``max(0, gpu_free - feedable) / 1000``. A ratio of
    0 leaves its resource out (no GPU pods: nothing is stranded).
    """
    feedable = np.full(len(gpu_free), np.inf)
    if cpu_per_gpu > 0:
        feedable = np.minimum(feedable, cpu_free / cpu_per_gpu)
    if mem_free is not None and mem_per_gpu > 0:
        feedable = np.minimum(feedable, mem_free / mem_per_gpu)
    return np.maximum(0.0, gpu_free - feedable) / MILLI


class GpupoolPolicy(FGD):
    name = "gpupool"
    description = ("gpupool default: FGD + GPU-model scarcity (gpu_spec pressure) + GPU packing among ties "
                   "+ CPU stranding")

    use_memory = True
    kappa = 1.0
    """Weight of the scarcity term (score points per GPU at pressure 1, in units of POINTS_PER_GPU)."""
    pack_epsilon = 1e-6
    """Weight of the packing tie-break; small enough never to overturn a score point."""
    typical_threshold = 0.95
    """Share of the workload's pods the typical shapes cover (FGD's 95%; 1.0: every shape)."""
    strand_weight = POINTS_PER_GPU
    """Score points per GPU the placement *strands* (:func:`stranded_gpus` after minus before: free GPU share
    its node's free CPU can no longer feed at the workload's CPU per GPU); 0: off."""
    strand_memory = False
    """Count host memory too in the stranding term (the GPU share neither CPU nor memory can feed)."""
    demand_weighted = False
    """Weigh each typical shape by its GPU demand (count x GPUs x share) instead of its pod count."""

    def __init__(self, typical: TypicalPods | None = None, threshold: float | None = None) -> None:
        super().__init__(typical, self.typical_threshold if threshold is None else threshold)

    def prepare(self, state: ClusterState, workload: Sequence[PodRequest] | None) -> None:
        super().prepare(state, workload)
        assert self.model is not None
        if self.demand_weighted:
            t = self.model.typical
            weight = t.prob * np.maximum(t.num_gpu * t.gpu_milli, 1)
            self.model = FragModel(replace(t, prob=weight / weight.sum()), state.model_names,
                                   use_memory=self.use_memory)
        self.pressure = model_pressure(self.model.typical, state)
        self.cpu_ratio = per_gpu_milli(workload, "cpu_milli") if self.strand_weight else 0.0
        self.mem_ratio = per_gpu_milli(workload, "memory_mib") if self.strand_weight and self.strand_memory else 0.0

    def _final_score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
                     scores: np.ndarray) -> np.ndarray:
        demand = req.num_gpu * node_share(state, req, nodes)  # (k,) milli-GPU the pod takes on each node
        if self.pressure.any():  # else the scarcity term is all +0.0, which leaves the scores as they are
            gpus = demand / MILLI
            scores = scores - self.kappa * POINTS_PER_GPU * self.pressure[state.node_model[nodes]] * gpus
        gpu_free = state.usable_gpu_free(nodes).sum(axis=1)
        if self.strand_weight and (self.cpu_ratio or self.mem_ratio):
            cpu, mem = state.cpu_free[nodes], state.mem_free[nodes]
            before = stranded_gpus(gpu_free, cpu, self.cpu_ratio, mem, self.mem_ratio)
            after = stranded_gpus(gpu_free - demand, cpu - req.cpu_milli, self.cpu_ratio, mem - req.memory_mib,
                                  self.mem_ratio)
            scores = scores - self.strand_weight * (after - before)
        gpu_left = (gpu_free - demand) / MAX_SPEC_GPU
        return scores - self.pack_epsilon * gpu_left


class GpupoolCombined(GpupoolPolicy):
    """``gpupool-combined``: :class:`GpupoolPolicy` plus every workload shape and GPU best-fit in a node.

    The configuration that measured best against the offline bound (``benchmarks/optimum.py``; numbers in
    benchmarks/results/openb_allocation.md). Not the default: it gains on ``gpuspec33`` only (every shape
    counts the rare ``gpu_spec`` shapes), and it has no compiled scorer (``gpu_best_fit``), so its decisions
    cost several times the default's.
    """

    name = "gpupool-combined"
    description = "gpupool + every workload shape + GPU best-fit in a node (opt-in; no compiled scorer)"
    typical_threshold = 1.0
    gpu_best_fit = True
