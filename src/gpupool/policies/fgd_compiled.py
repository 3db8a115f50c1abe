"""The compiled FGD / gpupool scorer (:class:`FGDScorer`, reached through ``FGD.compiled_scorer``) and the
source fingerprints of the policy code it mirrors. Imports the FGD and gpupool policies and the engine's kernels."""

from __future__ import annotations

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.filters import EffectiveRequest, allowed_models, gpu_fit_matrix, node_share
from gpupool.engine.kernels import fgd as fgd_kernels
from gpupool.engine.kernels import source_hash
from gpupool.frag import FragModel
from gpupool.model import MILLI
from gpupool.policies.best_fit import MAX_SPEC_GPU
from gpupool.policies.fgd import FGD, HASH_WEIGHTS, distinct_rows, register_compiled_scorer
from gpupool.policies.gpupool_policy import POINTS_PER_GPU, GpupoolPolicy


def _mirrored():
    return (FGD._evaluate, FGD._evaluate_dedup, FGD.score, FGD._transform, distinct_rows, FragModel.frag,
            FragModel._frag_few, FragModel._combine, FragModel.frag_after_share, FragModel.__init__, gpu_fit_matrix,
            node_share)


FGD_FINGERPRINTS = ("aa61e8288d1d60eb", "d0c94cebb36fb023")
"""Hashes of the source of the NumPy code :class:`FGDScorer` mirrors (``_mirrored``), each version checked
against the kernels by tests/test_decision_cost.py; when none matches (someone changed the policy), the compiled
path is not used until the kernels are checked again and the new hash added here."""

_fingerprint_ok: bool | None = None

GPUPOOL_FINAL_FINGERPRINT = "6ae4b6abda34b30b"
"""Hash of the source of ``GpupoolPolicy._final_score``, which :meth:`FGDScorer._gpupool_final` copies; when it
does not match, the policy's own method is called."""

_final_ok: bool | None = None


def gpupool_final_current() -> bool:
    """True when ``GpupoolPolicy._final_score`` is the code :meth:`FGDScorer._gpupool_final` copies."""
    global _final_ok
    if _final_ok is None:
        try:
            _final_ok = source_hash(GpupoolPolicy._final_score) == GPUPOOL_FINAL_FINGERPRINT
        except (OSError, TypeError):
            _final_ok = False
    return _final_ok


def _fgd_final(state, req, nodes, scores, share, gpu_free):
    """FGD._final_score: the scores as they are."""
    return scores


def fingerprint() -> str:
    """The current hash of the mirrored methods' source."""
    return source_hash(*_mirrored())


def fgd_mirror_current() -> bool:
    """True when the FGD / FragModel code the compiled scorer mirrors is the one it was written for."""
    global _fingerprint_ok
    if _fingerprint_ok is None:
        try:
            _fingerprint_ok = fingerprint() in FGD_FINGERPRINTS
        except (OSError, TypeError):  # no source to read (frozen install): do not trust the mirror
            _fingerprint_ok = False
    return _fingerprint_ok


class FGDScorer:
    """``policy.score(state, req, nodes)`` for :class:`gpupool.policies.fgd.FGD` and subclasses that keep its
    evaluation (``gpupool``), with the integer work compiled; the same scores, the same GPU choices and the
    same books (``_before``, ``_choices``) as the policy's own ``score``."""

    def __init__(self, policy) -> None:
        self.policy = policy
        self.model = None
        self._load()
        self._pressure: np.ndarray | None = None  # _gpupool_final: the policy's pressure array last seen ...
        self._pressure_any = False  # ... and whether any of it is nonzero
        self.final = self._final_for(policy)

    def _final_for(self, policy):
        """The policy's ``_final_score`` from the node shares and free GPU share the kernel already has: the
        identity for FGD's, a copy of gpupool's (:data:`GPUPOOL_FINAL_FINGERPRINT`) for it; None: call the policy."""
        final = type(policy)._final_score
        if final is FGD._final_score:
            return _fgd_final
        if final is GpupoolPolicy._final_score and gpupool_final_current():
            # module constants, imported once here rather than at every call (a hot path)
            self._max_spec_gpu, self._points_per_gpu = MAX_SPEC_GPU, POINTS_PER_GPU
            return self._gpupool_final
        return None

    @staticmethod
    def _strand_change(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray, gpu_free: np.ndarray,
                       demand: np.ndarray, cpu_ratio: float, mem_ratio: float) -> np.ndarray | None:
        """(k,) float64 ``stranded_gpus`` after minus before, as ``GpupoolPolicy._final_score`` computes it, from
        one kernel call (:func:`_strand_delta`); None when it is zero on every node (then the policy's
        ``scores - w * 0.0`` is ``scores``, bit for bit), as it always is where no pod asks more CPU per GPU than
        its node has."""
        out = np.empty(len(nodes), dtype=np.float64)
        if not fgd_kernels.strand_delta(nodes, gpu_free, demand, state.cpu_free, state.mem_free,
                                        int(req.cpu_milli), int(req.memory_mib), float(cpu_ratio), float(mem_ratio),
                                        out):
            return None
        return out

    def _gpupool_final(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray, scores: np.ndarray,
                       share: np.ndarray, gpu_free: np.ndarray) -> np.ndarray:
        """GpupoolPolicy._final_score, line for line, with ``node_share(state, req, nodes)`` = ``share`` and
        ``state.usable_gpu_free(nodes).sum(axis=1)`` = ``gpu_free`` ((k,) int64 each, from the kernel)."""
        pol = self.policy
        demand = req.num_gpu * share
        pressure = pol.pressure
        if pressure is not self._pressure:  # prepare() assigns a new array, never changes one in place: its
            self._pressure, self._pressure_any = pressure, bool(pressure.any())  # any() once, not per call
        if self._pressure_any:
            gpus = demand / MILLI
            scores = scores - pol.kappa * self._points_per_gpu * pressure[state.node_model[nodes]] * gpus
        if pol.strand_weight and (pol.cpu_ratio or pol.mem_ratio):  # stranded_gpus after minus before
            change = self._strand_change(state, req, nodes, gpu_free, demand, pol.cpu_ratio, pol.mem_ratio)
            if change is not None:
                scores = scores - pol.strand_weight * change
        gpu_left = (gpu_free - demand) / self._max_spec_gpu
        return scores - pol.pack_epsilon * gpu_left

    def _load(self) -> None:
        """Take the shapes of the policy's current FragModel (again after a new ``prepare``)."""
        model = self.model = self.policy.model
        self.shapes = (np.ascontiguousarray(model.access), np.ascontiguousarray(model.milli, dtype=np.int64),
                       np.ascontiguousarray(model.num, dtype=np.int64), np.ascontiguousarray(model.cpu, dtype=np.int64),
                       np.ascontiguousarray(model.mem, dtype=np.int64), np.ascontiguousarray(model.gpu_shape))
        self.n_shapes = len(model.prob)
        self.prob = np.ascontiguousarray(model.prob, dtype=np.float64)
        u_milli, t_idx = np.unique(self.shapes[1], return_inverse=True)  # the distinct shares of the shapes
        self.by_milli = (np.ascontiguousarray(u_milli, dtype=np.int64),
                         np.ascontiguousarray(t_idx.reshape(-1), dtype=np.int64))

    @staticmethod
    def supports(policy) -> bool:
        """True when the compiled scorer reproduces ``policy.score`` exactly (see :data:`FGD_FINGERPRINTS`)."""
        if not kernels.enabled():
            return False
        cls = type(policy)
        return (isinstance(policy, FGD) and cls._evaluate is FGD._evaluate and cls.score is FGD.score
                and not getattr(policy, "gpu_best_fit", False) and getattr(policy, "integer_scores", True)
                and cls._evaluate_dedup is FGD._evaluate_dedup and type(policy.model) is FragModel
                and fgd_mirror_current())

    def _fit_matrix(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray, share: np.ndarray):
        r = req.requested
        restricts = bool(r.gpu_spec or r.gpu_type_include or r.gpu_type_exclude)
        allowed = allowed_models(state, req) if restricts else _ALL_MODELS
        out = np.empty((len(nodes), state.max_gpus), dtype=bool)
        fgd_kernels.fits(nodes, share, req.gpu_milli, r.gpu_memory_mib, restricts, allowed, state._usable,
                         state.gpu_free, state.gpu_healthy, state.gpu_model, state.gpu_mem_cap, state.gpu_mem_free, out)
        return out

    def _refresh_before(self, state: ClusterState, nodes: np.ndarray) -> None:
        """The policy's ``_before`` (fragmentation now) of those of ``nodes`` whose state changed since, as
        FGD._evaluate refreshes it: the stale rows, in order, in one product with ``prob`` (same rows to BLAS)."""
        pol = self.policy
        pos = np.empty(len(nodes), dtype=np.int64)
        out = np.empty((len(nodes), self.n_shapes), dtype=np.int64)
        k = fgd_kernels.before_cells(nodes, pol._before_at, state.version, state._usable, state.cpu_free,
                                     state.node_model, state.mem_free, self.model.use_memory, *self.shapes,
                                     *self.by_milli, pos, out)
        if k:
            idx = nodes if k == len(nodes) else nodes[pos[:k]]
            # the first k rows (C-contiguous): NumPy casts them to a new float64 array for BLAS, as it does a
            # (k, n_shapes) array of their own, so the products are the same bits
            pol._before[idx] = out[:k] @ self.model.prob
            pol._before_at[idx] = state.version[idx]

    def _evaluate(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
                  mask: np.ndarray | None = None):
        """FGD._evaluate, same rows to NumPy for every floating-point step: (scores (k,), chosen GPU (k,) of a
        fractional pod else None, node share (k,) int64, free usable GPU share (k,) int64). With ``mask`` (see
        :meth:`score`) only its nodes' scores are exact."""
        pol = self.policy
        self._refresh_before(state, nodes)
        r = req.requested
        mode = 0 if req.num_gpu == 0 else (1 if req.is_fractional else 2)
        restricts = bool(r.gpu_spec or r.gpu_type_include or r.gpu_type_exclude)
        allowed = allowed_models(state, req) if restricts and mode else _ALL_MODELS
        k = len(nodes)
        scores = np.empty(k)
        choice = np.empty(k, dtype=np.int64)
        cells = np.empty((k, self.n_shapes), dtype=np.int64) if mode != 1 else _NO_CELLS
        share = np.empty(k, dtype=np.int64)
        gpu_free = np.empty(k, dtype=np.int64)
        unsure = fgd_kernels.fgd_nodes(nodes, state._usable, state.gpu_free, state.gpu_healthy, state.gpu_model,
                                       state.gpu_mem_cap, state.gpu_mem_free, state.cpu_free, state.mem_free,
                                       state.node_model, state.gpu_replicas, state.slice_milli, pol._before,
                                       r.cpu_milli, r.memory_mib, mode, req.gpu_milli, r.gpu_memory_mib, r.num_gpu,
                                       req.is_slice_ask, restricts, allowed, self.prob, self.model.use_memory,
                                       *self.shapes, *self.by_milli, mask is not None,
                                       _NO_MASK if mask is None else mask, scores, choice, cells, share, gpu_free)
        if not unsure:
            return scores, (choice if mode == 1 else None), share, gpu_free
        before = pol._before[nodes]
        if mode != 1:  # the cells the kernel wrote, through BLAS as FGD._evaluate's frag(after) does
            if mask is not None and mode == 2:  # the kernel left out the nodes outside the mask: all cells now
                fgd_kernels.fgd_nodes(nodes, state._usable, state.gpu_free, state.gpu_healthy, state.gpu_model,
                                      state.gpu_mem_cap, state.gpu_mem_free, state.cpu_free, state.mem_free,
                                      state.node_model, state.gpu_replicas, state.slice_milli, pol._before,
                                      r.cpu_milli, r.memory_mib, mode, req.gpu_milli, r.gpu_memory_mib, r.num_gpu,
                                      req.is_slice_ask, restricts, allowed, self.prob, self.model.use_memory,
                                      *self.shapes, *self.by_milli, False, _NO_MASK, scores, choice, cells, share,
                                      gpu_free)
            return pol._transform(before - cells @ self.model.prob), None, share, gpu_free
        free = state._usable[nodes].astype(np.int64)
        cpu_a = state.cpu_free[nodes] - req.cpu_milli
        mem_a = state.mem_free[nodes] - req.memory_mib
        fits = self._fit_matrix(state, req, nodes, share)
        cells3 = np.empty((k, state.max_gpus, self.n_shapes), dtype=np.int64)
        fgd_kernels.after_share_cells(free, req.gpu_milli, cpu_a, state.node_model[nodes], mem_a,
                                      self.model.use_memory, *self.shapes, cells3)
        fa = cells3 @ self.model.prob
        s = np.where(fits, pol._transform(before[:, None] - fa), -np.inf)
        choice = np.argmax(s, axis=1)
        return s[np.arange(k), choice], choice, share, gpu_free

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
              mask: np.ndarray | None = None) -> np.ndarray:
        """(len(nodes),) float64: ``policy.score(state, req, nodes)``. With ``mask`` ((n_nodes,) bool), only the
        scores of nodes where it is True are the policy's: nodes outside it may be left unscored (0.0, GPU choice
        0; the policy's books ``_before`` are kept as ever), and only nodes inside it near a score boundary send the
        refresh to NumPy's exact path. For a caller that never reads those scores: see ``FGD.scores_masked``."""
        pol = self.policy
        if pol.model is not self.model:
            self._load()
        nodes = np.asarray(nodes, dtype=np.int64)
        if len(nodes) >= pol.DEDUP_MIN_NODES:  # FGD._evaluate_dedup: nodes in identical states evaluated once
            distinct = distinct_nodes(state, nodes)
            if distinct is None:  # a hash collision: the policy's own (exact) path
                return pol.score(state, req, nodes)
            first, inverse = distinct
            scores, choice, share, gpu_free = self._evaluate(state, req, nodes[first], mask)
            # nodes with one key row have one share and one free GPU share (the row holds the free share and health
            # of every GPU and the replica share): the representative's are every member's
            scores, share, gpu_free = scores[inverse], share[inverse], gpu_free[inverse]
            choice = None if choice is None else choice[inverse]
        else:
            scores, choice, share, gpu_free = self._evaluate(state, req, nodes, mask)
        if choice is not None:
            key = pol.score_key(req)
            chosen = pol._choices.get(key)
            if chosen is None:
                chosen = pol._choices[key] = np.zeros(state.n_nodes, dtype=np.int16)
            chosen[nodes] = choice
        if self.final is not None:
            return self.final(state, req, nodes, scores, share, gpu_free)
        return pol._final_score(state, req, nodes, scores)


_ALL_MODELS = np.ones(1, dtype=bool)  # placeholder: never read when restricts is False
_NO_CELLS = np.zeros((0, 0), dtype=np.int64)  # placeholder: a fractional pod's cells are not written
_NO_MASK = np.zeros(0, dtype=bool)  # placeholder: no mask (never read)
assert MILLI == 1000  # the kernels divide by 1000 as MILLI


def distinct_nodes(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, inverse) as ``fgd._distinct_rows`` gives them for FGD._evaluate_dedup's key of ``nodes``, or None
    on a hash collision."""
    n_cols = 4 + 4 * state.max_gpus
    if n_cols > len(HASH_WEIGHTS):
        return None
    first = np.empty(len(nodes), dtype=np.int64)
    inverse = np.empty(len(nodes), dtype=np.int64)
    n = fgd_kernels.distinct_nodes_kernel(nodes, HASH_WEIGHTS[:n_cols], state.node_model, state.cpu_free,
                                          state.mem_free, state.gpu_free, state.gpu_healthy, state.gpu_mem_free,
                                          state.gpu_mem_cap, state.slice_milli, first, inverse)
    return None if n < 0 else (first[:n], inverse)


register_compiled_scorer(FGDScorer)
