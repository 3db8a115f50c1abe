"""Node scoping for the pool scheduler's placements: every pod still goes through the :class:`Engine` and
its placement :class:`Policy` (filters, cached scores, tie-break, device choice); :class:`ScopedPolicy`
only narrows, at pick time, the feasible nodes the policy chooses from.

* ``allowed`` (hard): nodes the pod may use, e.g. every node not reserved for a starving gang, or the
  nodes of one leaf switch for a ``required`` topology constraint. No allowed candidate: the pick raises
  :class:`Vetoed` before anything is allocated (the engine leaves the cluster unchanged).
* ``preferred`` (soft): nodes to use when any of them is feasible (topology ``preferred``), else any.

Because only ``pick`` changes, the engine's per-request-class filter and score caches stay valid.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest
from gpupool.model import Assignment, PodRequest

__all__ = ["DelegatingPolicy", "ScopedPolicy", "Vetoed"]


class Vetoed(Exception):
    """No feasible node is allowed for the pod (raised from :meth:`ScopedPolicy.pick`)."""


class DelegatingPolicy(Policy):
    """Wraps ``inner``: every hook is the inner policy's (filters, scores and their caches stay valid);
    a subclass overrides what it changes (usually :meth:`pick`)."""

    def __init__(self, inner: Policy) -> None:
        self.inner = inner
        self.name = inner.name
        self.description = inner.description
        self.node_local = inner.node_local
        self.tie_break = inner.tie_break
        self.filters = inner.filters

    def effective(self, req: PodRequest) -> EffectiveRequest:
        return self.inner.effective(req)

    def prepare(self, state: ClusterState, workload: Sequence[PodRequest] | None) -> None:
        self.inner.prepare(state, workload)

    def score_key(self, req: EffectiveRequest) -> tuple:
        return self.inner.score_key(req)

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        return self.inner.score(state, req, nodes)

    def pick(self, state: ClusterState, candidates: np.ndarray, scores: np.ndarray,
             rng: np.random.Generator) -> int:
        return self.inner.pick(state, candidates, scores, rng)

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        return self.inner.select_gpus(state, req, node)

    def on_allocate(self, state: ClusterState, assignment: Assignment) -> None:
        self.inner.on_allocate(state, assignment)

    def on_release(self, state: ClusterState, assignment: Assignment) -> None:
        self.inner.on_release(state, assignment)

    def scored_by(self) -> Policy:
        """The inner policy's scorer when this wrapper's subclass keeps ``effective``, ``score_key`` and
        ``score`` as delegated here and its filters are the inner's (so that the engine's compiled scorer,
        chosen for the inner policy, scores what :meth:`score` would); else itself."""
        cls, own = type(self), vars(self)
        if (cls.effective is DelegatingPolicy.effective and cls.score_key is DelegatingPolicy.score_key
                and cls.score is DelegatingPolicy.score and self.filters is self.inner.filters
                and not {"effective", "score_key", "score"} & own.keys()):  # nor replaced on the instance
            return self.inner.scored_by()
        return self


class ScopedPolicy(DelegatingPolicy):
    """Wraps ``inner`` and applies the current ``allowed`` / ``preferred`` masks ((n_nodes,) bool or None)."""

    def __init__(self, inner: Policy) -> None:
        super().__init__(inner)
        self.allowed: np.ndarray | None = None
        self.preferred: np.ndarray | None = None

    def pick(self, state: ClusterState, candidates: np.ndarray, scores: np.ndarray,
             rng: np.random.Generator) -> int:
        if self.allowed is not None:
            keep = self.allowed[candidates]
            if not keep.all():
                if not keep.any():
                    raise Vetoed
                candidates, scores = candidates[keep], scores[keep]
        if self.preferred is not None:
            keep = self.preferred[candidates]
            if keep.any() and not keep.all():
                candidates, scores = candidates[keep], scores[keep]
        return self.inner.pick(state, candidates, scores, rng)
