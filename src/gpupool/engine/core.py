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

import heapq
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.filters import (
    CODE_STRIDE,
    DEFAULT_FILTERS,
    EffectiveRequest,
    FilterPlugin,
    enough_fitting_gpus,
    failure_codes,
    fitting_gpus,
    reason_from_counts,
)
from gpupool.engine.kernels import filters as filter_kernels
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

    def scored_by(self) -> Policy:
        """The policy whose :meth:`effective`, :meth:`score_key` and :meth:`score` this one's are, unchanged:
        itself, or for a wrapper that changes only how a node is picked, the policy it wraps. The engine
        chooses its compiled scorer for that policy (a wrapped FGD or gpupool scores as fast as a bare one)."""
        return self

    def compiled_scorer(self) -> object | None:
        """A compiled scorer of this policy, or None (the default: the engine calls :meth:`score`). Its
        ``score(state, req, nodes, mask=None)`` gives :meth:`score`'s scores bit for bit and keeps the policy's
        books; asked of :meth:`scored_by`'s policy whenever the engine's policy is set (FGD and gpupool have one,
        in their ``fgd_compiled`` module)."""
        return None

    def scores_masked(self) -> bool:
        """Whether the engine may pass its compiled scorer the request class's feasibility mask, so that nodes
        outside it are left unscored (their scores never read); default False. Asked only where
        :meth:`compiled_scorer` gave a scorer and the engine's compiled filter kernels are on."""
        return False


def best_fit_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
    """Devices for ``req`` on ``node``: the fitting GPUs with the least free share, lowest index first."""
    if req.num_gpu == 0:
        return ()
    idx = enough_fitting_gpus(state, req, node)
    free = state.gpu_free[node].tolist()
    return tuple(sorted(idx, key=free.__getitem__)[: req.num_gpu])  # sorted() is stable


def most_free_gpus(state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
    """Devices for ``req`` on ``node``: the fitting GPUs with the most free share (spread)."""
    if req.num_gpu == 0:
        return ()
    free = state.gpu_free[node].tolist()
    return tuple(sorted(fitting_gpus(state, req, node), key=lambda g: -free[g])[: req.num_gpu])  # stable


class _Entry:
    __slots__ = ("snap", "seen", "values", "codes", "counts", "args")

    def __init__(self, n: int) -> None:
        self.snap = np.full(n, -1, dtype=np.int64)  # (n_nodes,) each node's ClusterState.version when refreshed
        self.seen = -1  # state.changes when last refreshed
        self.values: np.ndarray | None = None  # (n_nodes,) the cached mask (bool) or scores (float64)
        # the mask cache's (n_nodes,) int16 failure codes (filters.failure_codes) and their histogram (int64, one
        # slot per code: counts[0] is the number of feasible nodes), kept in step node by node
        self.codes: np.ndarray | None = None
        self.counts: np.ndarray | None = None
        self.args: tuple | None = None  # the request's arguments to the compiled failure codes (request_args)


class _NodeCache:
    """LRU of per-node arrays keyed by request class, refreshed where ``state.version`` moved.

    The nodes to refresh come from the cluster's change log (:meth:`ClusterState.log_tail`): a class seen
    a few changes ago costs those few nodes, not a scan of every node's version. A class not seen for longer
    than the log reaches back (or for more changes than there are nodes; without numba, more than
    ``SCAN_FRACTION`` of the nodes) scans ``version`` as before. With numba the log is read by one compiled
    call (:func:`filter_kernels.stale_nodes`, :func:`filter_kernels.refresh_codes`), not turned into a Python list.
    """

    SCAN_FRACTION = 0.125

    def __init__(self, state: ClusterState, size: int) -> None:
        self.state = state
        self.size = size
        self.entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self.compiled = kernels.enabled()  # find the changed nodes with the compiled kernel
        self.mark = np.zeros(state.n_nodes, dtype=bool)  # scratch of the compiled kernels (all False between calls)

    def entry(self, key: tuple, dtype) -> tuple[_Entry, bool]:
        """(the entry of ``key``, whether it is current), created (all stale) if absent."""
        state = self.state
        entry = self.entries.get(key)
        if entry is None:
            entry = _Entry(state.n_nodes)
            entry.values = np.empty(state.n_nodes, dtype=dtype)
            self.entries[key] = entry
            if len(self.entries) > self.size:
                self.entries.popitem(last=False)
            return entry, False
        self.entries.move_to_end(key)
        return entry, entry.seen == state.changes

    def stale(self, entry: _Entry) -> np.ndarray:
        """Sorted (k,) int64 indices of the nodes whose version moved since ``entry`` was refreshed."""
        state = self.state
        if entry.seen >= 0:
            if self.compiled:  # one pass over the log, whatever its length up to n_nodes
                stale = filter_kernels.stale_nodes(state, entry.seen, entry.snap, self.mark)
                if stale is not None:
                    return stale
            else:
                tail = state.log_tail(entry.seen)
                if tail is not None and tail[2] - tail[1] <= self.SCAN_FRACTION * state.n_nodes:
                    idx = np.unique(tail[0][tail[1]:tail[2]])
                    return idx[entry.snap[idx] != state.version[idx]]
        return (entry.snap != state.version).nonzero()[0]

    def get(self, key: tuple, compute, dtype) -> np.ndarray:
        entry, current = self.entry(key, dtype)
        if current:  # no node changed since the last refresh
            return entry.values
        stale = self.stale(entry)
        state = self.state
        if len(stale):
            entry.values[stale] = compute(stale)
            entry.snap[stale] = state.version[stale]
        entry.seen = state.changes
        return entry.values


class _Best:
    """Best node of one request class for a policy that picks the highest score, first node among ties (the
    ``tie_break = "first"`` of :meth:`Policy.pick`): a heap of ``(-score, node)`` over feasible nodes, pushed
    when a node's score or feasibility is refreshed; an entry whose node no longer has that score or no longer
    passes the filters is dropped when it reaches the top. Built from the best ``Engine.HEAP_KEEP`` nodes only
    (an O(n) NumPy selection, not n Python tuples), with a bound that says when the nodes left out might win
    (then it is rebuilt). Same node as ``candidates[np.argmax(scores)]``."""

    __slots__ = ("heap", "seen", "mask", "scores", "bound")

    def __init__(self) -> None:
        self.heap: list[tuple[float, int]] = []
        self.bound: tuple[float, int] | None = None  # every feasible node outside the heap has a larger key
        self.seen = -1  # state.changes when last brought up to date
        # the cached arrays it was built from: a cache entry made afresh (LRU) recomputes every node, and a
        # recomputed score may differ in its last bits where nothing changed, so the heap is rebuilt then
        self.mask: np.ndarray | None = None
        self.scores: np.ndarray | None = None


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
        self._best: OrderedDict[tuple, _Best] = OrderedDict()  # request class -> best-node heap
        self._cache_size = cache_size
        policy.prepare(state, workload)
        self._configured: Policy | None = None
        self._configure(policy)

    def _configure(self, policy: Policy) -> None:
        """Choose the fast paths for ``policy`` (again whenever ``self.policy`` is replaced, e.g. by the pool
        scheduler's ScopedPolicy, whose own ``pick`` must decide)."""
        if getattr(self, "_masked_scores", False) and policy.filters is not self._filters:
            self._drop_masked_scores()
        self._configured = policy
        self._filters = policy.filters  # what _codes was chosen for (a policy's filters may be replaced later)
        # compiled refresh of the changed nodes (numba), where it reproduces the NumPy code exactly
        self._codes = kernels.enabled() and filter_kernels.uses_default_filters(policy.filters)
        scored = policy.scored_by()  # a wrapper that only picks differently scores as the policy it wraps
        if getattr(self, "_scored", None) is not None and scored is not self._scored:
            self._forget_scores()  # scores of another policy (a wrapper's inner or score replaced)
        self._scored = scored  # looked at again each decision: a wrapper's inner policy may be replaced
        self._scorer = scored.compiled_scorer()
        self._masked_scores = self._scorer is not None and self._codes and scored.scores_masked()
        # the best node from a heap where the policy picks the first best score the base-class way
        self._use_heap = policy.node_local and policy.tie_break == "first" and type(policy).pick is Policy.pick

    def _forget_scores(self) -> None:
        """Forget every cached score and best-node heap."""
        self._score_cache.entries.clear()
        self._best.clear()

    def _drop_masked_scores(self) -> None:
        """:meth:`_forget_scores` and stop masked scoring: scores left out under one set of filters' masks could
        be read under another's (the filters were replaced)."""
        self._forget_scores()
        self._masked_scores = False

    def feasible_mask(self, eff: EffectiveRequest) -> np.ndarray:
        """(n_nodes,) bool: nodes that pass every filter for ``eff`` (cached with each node's failure code)."""
        return self._feasible(eff.key(), eff)

    def _feasible(self, key: tuple, eff: EffectiveRequest) -> np.ndarray:
        cache = self._mask_cache
        entry, current = cache.entry(key, bool)
        if current:
            return entry.values
        state = self.state
        if entry.codes is None:  # every node code 0 until refreshed (all of them are stale)
            entry.codes = np.zeros(state.n_nodes, dtype=np.int16)
            entry.counts = np.zeros((len(self.policy.filters) + 1) * CODE_STRIDE, dtype=np.int64)
            entry.counts[0] = state.n_nodes
        if self._codes and self.policy.filters is self._filters:  # one compiled call
            if entry.args is None:
                entry.args = filter_kernels.request_args(state, eff)
            filter_kernels.refresh_codes(state, entry.args, entry.seen, entry.snap, cache.mark, entry.codes,
                                         entry.values, entry.counts)
        else:
            stale = cache.stale(entry)
            if len(stale):
                codes = failure_codes(state, eff, stale, self.policy.filters)
                size = max(len(entry.counts), int(codes.max()) + 1)
                if size > len(entry.counts):  # a policy whose filters were replaced by more of them
                    entry.counts = np.concatenate([entry.counts, np.zeros(size - len(entry.counts), dtype=np.int64)])
                entry.counts += np.bincount(codes, minlength=size) - np.bincount(entry.codes[stale], minlength=size)
                entry.codes[stale] = codes
                entry.values[stale] = codes == 0
                entry.snap[stale] = state.version[stale]
        entry.seen = state.changes
        return entry.values

    HEAP_KEEP = 128
    """A best-node heap is built from the (about) this many best feasible nodes, not from all of them."""

    def _best_node(self, key: tuple, mask: np.ndarray, scores: np.ndarray) -> int:
        """The first node with the highest score among feasible ones (-1 if none), from the class's heap."""
        state = self.state
        best = self._best.get(key)
        seen = -1
        if best is None:
            best = self._best[key] = _Best()
            if len(self._best) > self._cache_size:
                self._best.popitem(last=False)
        else:
            self._best.move_to_end(key)
            seen = best.seen
        heap = best.heap
        best.seen = state.changes
        if (seen < 0 or best.mask is not mask or best.scores is not scores or len(heap) > 4 * state.n_nodes + 64
                or not self._push_changed(heap, seen, mask, scores)):
            node = self._build_best(best, mask, scores)
            if node is not None:
                return node
        while True:
            while heap:
                top = heap[0]
                neg, node = top
                if mask[node] and scores[node] == -neg:
                    if best.bound is None or top <= best.bound:
                        return node
                    break  # nodes left out of the heap may beat it: rebuild
                heapq.heappop(heap)
            else:
                if best.bound is None:
                    return -1
            node = self._build_best(best, mask, scores)
            if node is not None:
                return node

    def _push_changed(self, heap: list, seen: int, mask: np.ndarray, scores: np.ndarray) -> bool:
        """Push ``(-score, node)`` for every feasible node changed since ``changes == seen``, lowest node first;
        False (nothing pushed) when the change log does not reach back that far."""
        if self._mask_cache.compiled:
            got = filter_kernels.changed_feasible(self.state, seen, mask, scores, self._mask_cache.mark)
            if got is None:
                return False
            nodes, neg, nan = got
            if len(nodes) > 2 * len(heap) + 16 and not nan:  # many: one heapify (the same heap order by value)
                heap.extend(zip(neg.tolist(), nodes.tolist(), strict=True))
                heapq.heapify(heap)
            else:
                push = heapq.heappush
                for item in zip(neg.tolist(), nodes.tolist(), strict=True):
                    push(heap, item)
            return True
        changed = self.state.changed_since(seen)
        if changed is None:
            return False
        push = heapq.heappush
        for node in changed:
            if mask[node]:
                push(heap, (-float(scores[node]), node))
        return True

    def _build_best(self, best: _Best, mask: np.ndarray, scores: np.ndarray) -> int | None:
        """Fill ``best.heap`` with the HEAP_KEEP best feasible nodes by (-score, node) and set ``best.bound`` to the
        last of them (every feasible node left out has a larger key, until it changes and is pushed); returns the
        best node directly (and leaves the heap to be rebuilt) if a score is NaN, else None."""
        best.mask, best.scores = mask, scores
        cand = mask.nonzero()[0]
        sc = scores[cand]
        keep = self.HEAP_KEEP
        if np.isnan(sc).any():  # no order for a heap: what np.argmax picks, and rebuild next time
            best.heap.clear()
            best.seen = -1
            return int(cand[np.argmax(sc)]) if len(cand) else -1
        if len(cand) <= keep:
            best.heap[:] = zip((-sc).tolist(), cand.tolist(), strict=True)
            best.bound = None
        else:
            theta = np.partition(sc, len(sc) - keep)[len(sc) - keep]  # the keep-th highest score
            above = np.flatnonzero(sc > theta)
            ties = np.flatnonzero(sc == theta)[: keep - len(above)]  # lowest nodes first (cand is sorted)
            sel = np.concatenate([above, ties])
            best.heap[:] = zip((-sc[sel]).tolist(), cand[sel].tolist(), strict=True)
            best.bound = (-float(theta), int(cand[ties[-1]]))
        heapq.heapify(best.heap)
        return None

    def _cached_scores(self, eff: EffectiveRequest, mask: np.ndarray | None = None) -> np.ndarray:
        """(n_nodes,) float64 scores of a ``node_local`` policy for ``eff``, refreshed where nodes changed (with
        the compiled scorer where it applies). ``mask``: the request class's current feasibility; where
        ``_masked_scores`` holds, scores outside it are never read and the compiled scorer is told so."""
        state, policy = self.state, self.policy
        key = ("score",) + policy.score_key(eff)
        if self._scorer is None:
            return self._score_cache.get(key, lambda idx: policy.score(state, eff, idx), np.float64)
        score = self._scorer.score
        if self._masked_scores:
            if policy.filters is not self._filters:  # replaced on the policy itself
                self._drop_masked_scores()
            elif mask is not None:
                return self._score_cache.get(key, lambda idx: score(state, eff, idx, mask), np.float64)
        return self._score_cache.get(key, lambda idx: score(state, eff, idx), np.float64)

    def _select(self, req: PodRequest) -> tuple[EffectiveRequest, int, tuple[int, ...]]:
        """One cycle for ``req``: (effective request, node, devices), node -1 if no node passes the filters."""
        policy, state = self.policy, self.state
        if policy is not self._configured or policy.scored_by() is not self._scored:
            self._configure(policy)
        eff = policy.effective(req)
        key = eff.key()
        mask = self._feasible(key, eff)
        if self._use_heap:
            if not self._mask_cache.entries[key].counts[0]:  # no node passes: nothing to score
                return eff, -1, ()
            node = self._best_node(key, mask, self._cached_scores(eff, mask))
            if node < 0:
                return eff, -1, ()
            return eff, node, policy.select_gpus(state, eff, node)
        candidates = mask.nonzero()[0]
        if len(candidates) == 0:
            return eff, -1, ()
        if policy.node_local:
            scores = self._cached_scores(eff, mask)[candidates]
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
        # every node's first failing filter is cached with its mask and refreshed with the node, and so is the
        # histogram of those codes: the message is read from it, not every filter re-run over every GPU
        self._feasible(key, eff)
        reason = reason_from_counts(self.state, eff, self._mask_cache.entries[key].counts, self.policy.filters)
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
