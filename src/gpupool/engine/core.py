"""The scheduling engine: filter, score, pick a node, pick the devices. No I/O.

The cycle follows the kube-scheduler framework (Filter -> Score -> select host -> Reserve): a
:class:`Policy` supplies the score and the device choice, the shared filters
(:mod:`gpupool.engine.filters`) decide feasibility, and ties between equally scored nodes are broken
at random with the engine's seeded generator, as kube-scheduler's ``selectHost`` does.

Speed: filters and *node-local* scores (those that depend only on the node's own state and the
request) are cached per request class; a cached entry remembers the ``ClusterState.version`` of each
node it was computed at, and a later pod of the same class recomputes only the nodes that changed
since. Policies whose choice depends on more than one node at a time (``round-robin``, ``random``,
``single-node``) set ``node_local = False`` and are scored afresh every cycle.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import (
    DEFAULT_FILTERS,
    EffectiveRequest,
    FilterPlugin,
    feasible,
    fitting_gpus,
    unschedulable_reason,
)
from gpupool.model import MILLI, Assignment, PodRequest


@dataclass(frozen=True, slots=True)
class Decision:
    """Outcome of one scheduling cycle: an assignment, or ``None`` with the reason."""

    pod: str
    assignment: Assignment | None
    reason: str = ""

    @property
    def scheduled(self) -> bool:
        return self.assignment is not None


class Policy:
    """Base class of a placement policy (one file each under :mod:`gpupool.policies`).

    Subclasses override :meth:`score` (higher is better, vectorized over a subset of nodes) and,
    where the device choice matters, :meth:`select_gpus`. Defaults: request as asked, GPUs chosen
    best-fit (fractional pods onto the fitting GPU with the least free share, whole GPUs lowest index
    first).
    """

    name: str = "base"
    description: str = ""
    node_local: bool = True
    tie_break: str = "random"  # between equal best scores: "random" (kube-scheduler) or "first" node
    filters: tuple[FilterPlugin, ...] = DEFAULT_FILTERS

    def effective(self, req: PodRequest) -> EffectiveRequest:
        return EffectiveRequest(req, req.gpu_milli)

    def prepare(self, state: ClusterState, workload: Sequence[PodRequest] | None) -> None:
        """Called once before a run with the cluster and, where known, the expected workload."""

    def score_key(self, req: EffectiveRequest) -> tuple:
        """What of the request the score reads (pods with equal keys share cached scores)."""
        return req.key()

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        """(len(nodes),) float64 scores for feasible ``nodes``; higher is better."""
        return np.zeros(len(nodes))

    def pick(self, state: ClusterState, candidates: np.ndarray, scores: np.ndarray,
             rng: np.random.Generator) -> int:
        """Choose among feasible ``candidates`` (node indices) given their ``scores``."""
        if self.tie_break == "first":
            return int(candidates[np.argmax(scores)])
        best = scores.max()
        ties = candidates[scores == best]
        if len(ties) == 1:
            return int(ties[0])
        return int(ties[rng.integers(len(ties))])

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        return best_fit_gpus(state, req, node)

    def on_allocate(self, state: ClusterState, assignment: Assignment) -> None:
        """Hook after a pod is placed (for policies that keep their own per-node books)."""

    def on_release(self, state: ClusterState, assignment: Assignment) -> None:
        """Hook after a pod leaves."""


def best_fit_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
    """Devices for ``req`` on ``node``: the fitting GPUs with the least free share, lowest index first."""
    if req.num_gpu == 0:
        return ()
    idx = fitting_gpus(state, req, node)
    if len(idx) < req.num_gpu:
        raise ValueError(f"node {state.node_names[node]} cannot host {req.requested.name}")
    free = state.gpu_free[node].tolist()
    return tuple(sorted(idx, key=free.__getitem__)[: req.num_gpu])  # sorted() is stable


def most_free_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
    """Devices for ``req`` on ``node``: the fitting GPUs with the most free share (spread)."""
    if req.num_gpu == 0:
        return ()
    free = state.gpu_free[node].tolist()
    return tuple(sorted(fitting_gpus(state, req, node), key=lambda g: -free[g])[: req.num_gpu])  # stable


class _Entry:
    __slots__ = ("snap", "seen", "values")

    def __init__(self, n: int) -> None:
        self.snap = np.full(n, -1, dtype=np.int64)
        self.seen = -1  # state.changes when last refreshed
        self.values: np.ndarray | None = None


class _NodeCache:
    """LRU of per-node arrays keyed by request class, refreshed where ``state.version`` moved."""

    def __init__(self, state: ClusterState, size: int) -> None:
        self.state = state
        self.size = size
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()

    def get(self, key: tuple, compute, dtype) -> np.ndarray:
        state = self.state
        entry = self.entries.get(key)
        if entry is None:
            entry = _Entry(state.n_nodes)
            entry.values = np.empty(state.n_nodes, dtype=dtype)
            self.entries[key] = entry
            if len(self.entries) > self.size:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(key)
            if entry.seen == state.changes:  # no node changed since the last refresh
                return entry.values
        stale = (entry.snap != state.version).nonzero()[0]
        if len(stale):
            entry.values[stale] = compute(stale)
            entry.snap[stale] = state.version[stale]
        entry.seen = state.changes
        return entry.values


class Engine:
    """Schedules pods one at a time on a :class:`ClusterState` with a :class:`Policy`.

    ``seed`` drives the tie-break between equally scored nodes (and random policies).
    """

    def __init__(self, state: ClusterState, policy: Policy, seed: int = 0, cache_size: int = 512,
                 workload: Sequence[PodRequest] | None = None) -> None:
        self.state = state
        self.policy = policy
        self.rng = np.random.default_rng(seed)
        self._mask_cache = _NodeCache(state, cache_size)
        self._score_cache = _NodeCache(state, cache_size)
        self._reasons: dict[tuple, tuple[int, str]] = {}  # request class -> (state.changes, reason)
        policy.prepare(state, workload)

    def feasible_mask(self, eff: EffectiveRequest) -> np.ndarray:
        """(n_nodes,) bool: nodes that pass every filter for ``eff`` (cached)."""
        state, filters = self.state, self.policy.filters
        return self._mask_cache.get(eff.key(), lambda idx: feasible(state, eff, idx, filters), bool)

    def _select(self, req: PodRequest) -> tuple[EffectiveRequest, int, tuple[int, ...]]:
        """One cycle for ``req``: (effective request, node, devices), node -1 if no node passes the filters."""
        policy, state = self.policy, self.state
        eff = policy.effective(req)
        mask = self.feasible_mask(eff)
        candidates = mask.nonzero()[0]
        if len(candidates) == 0:
            return eff, -1, ()
        if policy.node_local:
            all_scores = self._score_cache.get(
                ("score",) + policy.score_key(eff), lambda idx: policy.score(state, eff, idx), np.float64
            )
            scores = all_scores[candidates]
        else:
            scores = policy.score(state, eff, candidates)
        node = policy.pick(state, candidates, scores, self.rng)
        return eff, node, policy.select_gpus(state, eff, node)

    def schedule(self, req: PodRequest) -> Decision:
        """Decide where ``req`` goes without changing the cluster."""
        eff, node, gpus = self._select(req)
        if node < 0:
            return Decision(req.name, None, self.unschedulable_reason(eff))
        milli = eff.gpu_milli if req.num_gpu else 0
        preview = Assignment(req.name, node, self.state.node_names[node], gpus, milli, 0, req.gpu_milli,
                             req.cpu_milli, req.memory_mib)
        return Decision(req.name, preview)

    def place(self, req: PodRequest) -> Decision:
        """Schedule ``req`` and, if a node was found, allocate it there."""
        state = self.state
        placed = state.assignments.get(req.name)
        if placed is not None:
            return Decision(req.name, None, f"pod {req.name} is already placed on {placed.node_name}")
        eff, node, gpus = self._select(req)
        if node < 0:
            return Decision(req.name, None, self.unschedulable_reason(eff))
        assignment = state.allocate(req, node, gpus, eff.gpu_milli if gpus else None)
        self.policy.on_allocate(state, assignment)
        return Decision(req.name, assignment)

    def unschedulable_reason(self, eff: EffectiveRequest) -> str:
        """Why no node passes the filters for ``eff`` (kube-scheduler's message), remembered per request class
        until any node changes: a burst of pods that fit nowhere costs one scan over the nodes, not one each."""
        key = eff.key()
        hit = self._reasons.get(key)
        if hit is not None and hit[0] == self.state.changes:
            return hit[1]
        reason = unschedulable_reason(self.state, eff, self.policy.filters)
        if len(self._reasons) >= 256:
            self._reasons.clear()
        self._reasons[key] = (self.state.changes, reason)
        return reason

    def release(self, pod: str) -> Assignment:
        """Remove a placed pod and return what it held."""
        assignment = self.state.release(pod)
        self.policy.on_release(self.state, assignment)
        return assignment


__all__ = ["Decision", "Engine", "Policy", "best_fit_gpus", "most_free_gpus", "MILLI"]
