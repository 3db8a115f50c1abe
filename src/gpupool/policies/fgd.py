"""``fgd``: Fragmentation Gradient Descent (Weng et al., "Beware of Fragmentation: Scheduling
GPU-Sharing Workloads with Fragmentation Gradient Descent", USENIX ATC 2023, Sec. 4).

Each candidate placement is scored by how much it *increases* the node's expected GPU
fragmentation over the workload's typical pods (:mod:`gpupool.frag`); the placement (node, and for a
fractional pod the GPU on it) with the smallest increase wins. As in the paper's artifact
(``fgd_score.go``) the score is ``int(sigmoid((frag_before - frag_after) / 1000) * 100)``, an integer
kube-scheduler score, ties between nodes and between GPUs broken by lowest index; whole-GPU
pods take the lowest-index free GPUs.

Tie-break: FGD scores tie often (a CPU-only pod changes no node's fragmentation unless it exhausts
that node's CPU, so every node ties). Breaking those ties at random, as kube-scheduler's
``selectHost`` does, spreads CPU-only pods over all nodes and strands GPUs on nodes whose CPU ran
out: 89.45% allocation at 100% arrived demand on openb default (seed 42; ``fgd-random-ties`` in
benchmarks/results/openb_allocation.md) instead of the paper's 95.2%.
Breaking them by node order packs those pods and reproduces the published figures (README).

Typical pods: the shapes covering 95% of the workload's pods,
CPU-only pods included (artifact defaults: ``podPopularityThreshold: 95``, ``isInvolvedCpuPods: true``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, fitting_gpus, gpu_fit_matrix, node_share
from gpupool.engine.kernels.filters import uses_default_filters
from gpupool.frag import FragModel, TypicalPods, typical_pods
from gpupool.model import MILLI, PodRequest

DEFAULT_TYPICAL = TypicalPods(
    cpu_milli=np.array([0]), memory_mib=np.array([0]), num_gpu=np.array([1]),
    gpu_milli=np.array([MILLI]), gpu_spec=((),), prob=np.array([1.0]),
)
"""Used when no workload is known: one whole GPU per pod (every partly used GPU is a fragment)."""


_HASH_WEIGHTS = np.random.default_rng(0x5EED).integers(0, 2**63, 256, dtype=np.uint64) * np.uint64(2) + np.uint64(1)


def _distinct_rows(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index of the first row of each distinct row, (n,) index of each row's distinct row) of an integer
    matrix, as ``np.unique(key, axis=0, return_index=True, return_inverse=True)`` gives them (up to order).

    Rows are hashed to one int64 each (a dot product with fixed random odd multipliers, wrapping) and the hashes
    made unique, which is 1-D and tens of times cheaper than ``np.unique`` over rows; a hash collision is
    caught by comparing every row with its representative, and then the exact row-wise form is used.
    """
    k = np.ascontiguousarray(key, dtype=np.int64)
    weights = _HASH_WEIGHTS[: k.shape[1]] if k.shape[1] <= len(_HASH_WEIGHTS) else (
        np.random.default_rng(k.shape[1]).integers(0, 2**63, k.shape[1], dtype=np.uint64) * np.uint64(2) + np.uint64(1))
    with np.errstate(over="ignore"):
        h = (k.view(np.uint64) * weights).sum(axis=1, dtype=np.uint64)
    _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if not (k[first][inverse] == k).all():  # a collision: fall back to the exact form
        _, first, inverse = np.unique(k, axis=0, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    return first, inverse


# public names for the compiled scorer (gpupool.policies.fgd_compiled), which mirrors this dedup
HASH_WEIGHTS = _HASH_WEIGHTS
distinct_rows = _distinct_rows


_COMPILED_SCORER: list = [None]  # the one registered compiled scorer class (register_compiled_scorer)


def register_compiled_scorer(scorer: type) -> None:
    """Register the compiled scorer of the FGD family: a class with ``supports(policy) -> bool`` and
    ``scorer(policy)``. :mod:`gpupool.policies.fgd_compiled` registers its ``FGDScorer`` when the policies package
    is imported; it reads FGD and GpupoolPolicy, so this module cannot import it (the imports point one way)."""
    _COMPILED_SCORER[0] = scorer


class FGD(Policy):
    name = "fgd"
    description = "GPU-aware: fragmentation gradient descent (Weng et al., USENIX ATC'23)"

    tie_break = "first"
    use_memory = False  # the artifact's fragmentation reads CPU and GPU only
    integer_scores = True  # kube-scheduler integer scores, as in the artifact
    gpu_best_fit = False
    """Fractional pods: between GPUs of a node with equal scores, the one left with the least free share
    (else the lowest index, as the artifact)."""

    def __init__(self, typical: TypicalPods | None = None, threshold: float = 0.95) -> None:
        self.typical = typical
        self.threshold = threshold
        self.model: FragModel | None = None

    def prepare(self, state: ClusterState, workload: Sequence[PodRequest] | None) -> None:
        typical = self.typical
        if typical is None:
            typical = (typical_pods(workload, self.threshold, with_memory=self.use_memory)
                       if workload else DEFAULT_TYPICAL)
        self.model = FragModel(typical, state.model_names, use_memory=self.use_memory)
        # fragmentation of each node as it is now, refreshed where ClusterState.version moved
        self._before = np.zeros(state.n_nodes)
        self._before_at = np.full(state.n_nodes, -1, dtype=np.int64)
        # GPU chosen on each node for a fractional request class, computed with its score
        self._choices: dict[tuple, np.ndarray] = {}

    def score_key(self, req: EffectiveRequest) -> tuple:
        mem = req.memory_mib if self.use_memory else 0
        r = req.requested
        return (req.cpu_milli, mem, req.num_gpu, req.gpu_milli, r.gpu_spec, r.gpu_memory_mib, r.gpu_milli,
                r.gpu_type_include, r.gpu_type_exclude)

    def _transform(self, decrease: np.ndarray) -> np.ndarray:
        """Score of a fragmentation decrease (milli-GPU): higher is better."""
        if self.integer_scores:
            return np.floor(100.0 / (1.0 + np.exp(-decrease / 1000.0)))
        return decrease

    def _evaluate(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray):
        """(scores (k,), chosen GPU per node (k,) for a fractional pod, else None)."""
        assert self.model is not None, "prepare() was not called"
        frag = self.model.frag
        free = state.usable_gpu_free(nodes).astype(np.int64)
        cpu = state.cpu_free[nodes]
        mem = state.mem_free[nodes]
        model = state.node_model[nodes]
        stale = self._before_at[nodes] != state.version[nodes]
        if stale.all():  # usually: the nodes to score are the ones that just changed
            self._before[nodes] = frag(free, cpu, model, mem)
            self._before_at[nodes] = state.version[nodes]
        elif stale.any():
            idx = nodes[stale]
            self._before[idx] = frag(free[stale], cpu[stale], model[stale], mem[stale])
            self._before_at[idx] = state.version[idx]
        before = self._before[nodes]
        cpu_a = cpu - req.cpu_milli
        mem_a = mem - req.memory_mib
        if req.num_gpu == 0:
            return self._transform(before - frag(free, cpu_a, model, mem_a)), None
        if req.is_fractional:
            fits = gpu_fit_matrix(state, req, nodes)
            fa = self.model.frag_after_share(free, req.gpu_milli, cpu_a, model, mem_a)  # (k, G)
            s = np.where(fits, self._transform(before[:, None] - fa), -np.inf)
            if self.gpu_best_fit:  # among the node's best GPUs, the one left with the least free share
                choice = np.argmax(s - 1e-4 * (free - req.gpu_milli) / MILLI, axis=1)
            else:
                choice = np.argmax(s, axis=1)
            return s[np.arange(len(nodes)), choice], choice
        # whole GPUs, a per-card share over several GPUs, or replicas of a time-sliced node (node_share)
        share = node_share(state, req, nodes)
        if len(nodes) <= self.FEW_NODES:
            after = free.copy()
            for i, node in enumerate(nodes.tolist()):
                for g in fitting_gpus(state, req, node)[: req.num_gpu]:
                    after[i, g] -= share[i]
        else:  # the same, vectorized: the lowest-index fitting GPUs give their share
            fits = gpu_fit_matrix(state, req, nodes)
            take = fits & (np.cumsum(fits, axis=1) <= req.num_gpu)
            after = np.where(take, free - share[:, None], free)
        return self._transform(before - frag(after, cpu_a, model, mem_a)), None

    FEW_NODES = 4
    """Up to this many nodes to score, the devices a whole-GPU pod would take are found node by node."""

    DEDUP_MIN_NODES = 1024
    """Above this many nodes to score, nodes in identical states are evaluated once."""

    def _evaluate_dedup(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray):
        """:meth:`_evaluate` over the distinct node states among ``nodes`` only (same result).

        A fresh request class is scored on every node; most nodes of a cluster are in one of a few
        states (idle nodes of each shape), so this turns thousands of evaluations into tens.
        """
        if len(nodes) < self.DEDUP_MIN_NODES:
            return self._evaluate(state, req, nodes)
        key = np.column_stack([state.node_model[nodes], state.cpu_free[nodes], state.mem_free[nodes],
                               state.gpu_free[nodes], state.gpu_healthy[nodes], state.gpu_mem_free[nodes],
                               state.gpu_mem_cap[nodes], state.slice_milli[nodes]])
        first, inverse = _distinct_rows(key)
        scores, choice = self._evaluate(state, req, nodes[first])
        return scores[inverse], (None if choice is None else choice[inverse])

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        scores, choice = self._evaluate_dedup(state, req, nodes)
        if choice is not None:
            key = self.score_key(req)
            chosen = self._choices.get(key)
            if chosen is None:
                chosen = self._choices[key] = np.zeros(state.n_nodes, dtype=np.int16)
            chosen[nodes] = choice
        return self._final_score(state, req, nodes, scores)

    def _final_score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
                     scores: np.ndarray) -> np.ndarray:
        """Hook for subclasses: the node score from the fragmentation score."""
        return scores

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        """The GPU(s) scored for ``node``; the engine refreshes this class's scores just before, so the
        GPU chosen while scoring is current."""
        if req.num_gpu == 0:
            return ()
        if req.is_fractional:
            chosen = self._choices.get(self.score_key(req))
            if chosen is not None:
                gpu = int(chosen[node])
                if state.gpu_free[node, gpu] >= req.gpu_milli and state.gpu_healthy[node, gpu]:
                    return (gpu,)
            _, choice = self._evaluate(state, req, np.array([node]))
            return (int(choice[0]),)
        return tuple(fitting_gpus(state, req, node)[: req.num_gpu])

    def compiled_scorer(self) -> object | None:
        """The compiled scorer (:class:`gpupool.policies.fgd_compiled.FGDScorer`, registered with
        :func:`register_compiled_scorer`) where it reproduces :meth:`score` exactly (``FGDScorer.supports``: numba
        on, the evaluation FGD's own, the mirrored source current), else None."""
        scorer = _COMPILED_SCORER[0]
        return scorer(self) if scorer is not None and scorer.supports(self) else None

    def scores_masked(self) -> bool:
        """Whether a score-cache entry of this policy serves one mask-cache entry only and the engine reads its
        scores only where that mask is True: the score key holds everything the mask key does (FGD's key with
        memory, ``use_memory``), the request is the pod's (``effective``), and the filters are the default ones,
        which read only the node's own state (a node's feasibility changes only with its ``version``, which
        refreshes its score). The compiled scorer then scores only the nodes inside the mask
        (``FGDScorer.score``'s ``mask``)."""
        return (getattr(self, "use_memory", False) and getattr(self.score_key, "__func__", None) is FGD.score_key
                and getattr(self.effective, "__func__", None) is Policy.effective
                and uses_default_filters(self.filters))
