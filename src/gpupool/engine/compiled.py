"""Compiled (numba) kernels for the engine's per-decision refresh of the nodes that changed.

Refreshing a request class's filter mask and scores for the nodes that changed since it was last seen (median
27 per refresh in bench_decisions --scaling, gpupool, 1,000 and 5,000 nodes) costs tens of NumPy calls, each a
microsecond of call overhead on a few dozen rows. Kernels do the integer part in one compiled call each:

* :func:`failure_codes_default`: every node's first failing filter of
  :data:`gpupool.engine.filters.DEFAULT_FILTERS`, as :func:`gpupool.engine.filters.failure_codes` gives it;
  :func:`refresh_codes` refreshes a whole mask-cache entry (codes, mask, code histogram, versions) from the
  cluster's change log in one call;
* :func:`stale_nodes` and :func:`changed_feasible`: the nodes changed since a count, read from the change log
  (:meth:`ClusterState.log_tail`) for the score cache and the best-node heap;
* the FGD / gpupool score refresh (:class:`FGDScorer`): one kernel reads the changed nodes from the cluster's
  arrays and gives their integer scores, GPU choice, share and free GPU share (:func:`_fgd_nodes`), and the
  per-shape fragmented-share cells that :class:`gpupool.frag.FragModel` multiplies with the shape
  probabilities; gpupool's final score (:meth:`FGDScorer._gpupool_final`) reuses the kernel's shares.

Everything in floating point stays with the policy's own NumPy code on arrays of the very shapes the policy
would build (the product with ``prob``, ``_transform``, ``_final_score``): a matrix-vector product through
BLAS rounds differently with the number of rows, so the compiled path hands NumPy the same rows and gets the
same bits. The policy's Python ``score`` stays the source of truth: the compiled path is taken only for the
exact methods it mirrors (a fingerprint of their source, :data:`FGD_FINGERPRINTS`), and tests check it
against the policy's NumPy path, decision by decision (tests/test_decision_cost.py).

Off when numba is not installed or ``GPUPOOL_NO_NUMBA=1``; decisions are the same either way.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import (
    CODE_STRIDE,
    DEFAULT_FILTERS,
    SUB_MEMORY,
    SUB_SICK,
    SUB_SLICED,
    EffectiveRequest,
    GpuFit,
    _spec_allowed,
    _type_allowed,
    allowed_models,
    gpu_fit_matrix,
    node_share,
)
from gpupool.model import MILLI


def _disabled() -> bool:
    return os.environ.get("GPUPOOL_NO_NUMBA", "") not in ("", "0")


AVAILABLE = importlib.util.find_spec("numba") is not None and not _disabled()
"""True when numba is installed and not disabled (``GPUPOOL_NO_NUMBA=1``); it is imported on first use."""

_KERNELS: list[str] = []
_loaded: bool | None = None


def _jit(fn):
    """Mark ``fn`` a kernel: compiled (``numba.njit``) by :func:`enabled` on first use, so that importing the
    engine does not import numba (a second at start-up)."""
    _KERNELS.append(fn.__name__)
    return fn


CACHED: bool | None = None
"""Whether the compiled kernels are cached on disk (None until :func:`enabled` wrapped them). False where numba
finds no writable cache location (a read-only root file system with no home directory and no
``NUMBA_CACHE_DIR``, as in a locked-down container): the kernels then compile in every process (seconds at
start-up, :func:`warm_up`), with a warning, instead of failing."""


def enabled() -> bool:
    """Whether the engine uses the compiled kernels (numba present, ``GPUPOOL_NO_NUMBA`` unset or 0); the first
    call imports numba and wraps the kernels (each compiles on its first call, cached on disk where numba
    finds a writable place: ``NUMBA_CACHE_DIR``, the package's ``__pycache__`` or the user's cache directory;
    else not cached, see :data:`CACHED`)."""
    global _loaded, CACHED
    if _loaded is None:
        _loaded = False
        if AVAILABLE and not _disabled():
            import logging

            log = logging.getLogger(__name__)
            try:
                import numba

                wrapped: dict[str, object] = {}
                cached = True
                g = globals()
                for name in _KERNELS:  # kernels calling kernels find the compiled ones in these globals
                    try:
                        wrapped[name] = numba.njit(cache=cached, nogil=True, boundscheck=False)(g[name])
                    except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
                        if not cached or "cannot cache" not in str(exc):
                            raise
                        log.warning("numba has no writable cache location (%s); the engine's kernels compile in "
                                    "this process and are not kept: set NUMBA_CACHE_DIR to a writable directory",
                                    exc)
                        cached = False
                        wrapped[name] = numba.njit(cache=False, nogil=True, boundscheck=False)(g[name])
            except Exception as exc:  # numba unusable here (a broken install, a bad NUMBA_* setting): NumPy only
                log.warning("the engine's compiled kernels are off, decisions use NumPy only (same decisions, "
                            "slower): %s: %s", type(exc).__name__, exc)
                return False
            g.update(wrapped)  # all kernels at once, or none
            CACHED = cached
            _loaded = True
    return _loaded and not _disabled()


SIGNATURES: dict[str, str] = {
    "_codes_kernel": "i8[] i8 i8 i8 i8 i8 b1 b1 b1 b1 b1[] b1[] b1[] i8[] i8[] i2[] i8[] i8[] i8[] i8[] i4[,] i4[,] "
                     "b1[,] b1[,] i2[,] i8[,] i8[,] i2[]",
    "_refresh_codes": "i8[] i8 i8 i8[] i8[] b1[] i8[] i2[] i8 i8 i8 i8 i8 b1 b1 b1 b1 b1[] b1[] b1[] i8[] i8[] i2[] "
                      "i8[] i8[] i8[] i8[] i4[,] i4[,] b1[,] b1[,] i2[,] i8[,] i8[,] i2[] b1[] i8[]",
    "_stale_nodes": "i8[] i8 i8 i8[] i8[] b1[] i8[]",
    "_changed_feasible": "i8[] i8 i8 b1[] f8[] b1[] i8[] f8[]",
    "_fits": "i8[] i8[] i8 i8 b1 b1[] i4[,] i4[,] b1[,] i2[,] i8[,] i8[,] b1[,]",
    "_after_share_cells": "i8[,] i8 i8[] i2[] i8[] b1 b1[,] i8[] i8[] i8[] i8[] b1[] i8[,,]",
    "_fgd_nodes": "i8[] i4[,] i4[,] b1[,] i2[,] i8[,] i8[,] i8[] i8[] i2[] i8[] i8[] f8[] i8 i8 i8 i8 i8 i8 b1 b1 "
                  "b1[] f8[] b1 b1[,] i8[] i8[] i8[] i8[] b1[] i8[] i8[] b1 b1[] f8[] i8[] i8[,] i8[] i8[]",
    "_before_cells": "i8[] i8[] i8[] i4[,] i8[] i2[] i8[] b1 b1[,] i8[] i8[] i8[] i8[] b1[] i8[] i8[] i8[] i8[,]",
    "_distinct_nodes": "i8[] u8[] i2[] i8[] i8[] i4[,] b1[,] i8[,] i8[,] i8[] i8[] i8[]",
    "_strand_delta": "i8[] i8[] i8[] i8[] i8[] i8 i8 f8 f8 f8[]",
    "_fair_shares_kernel": "i8[] i8[] i8[] i8[] b1[] f8[] f8[] i8[] f8[,] f8[] f8[,] f8[,]",
}
"""The argument types each kernel that Python calls is called with, one word per argument: ``i8`` int64,
``i4`` int32, ``i2`` int16, ``u8`` uint64, ``b1`` bool, ``f8`` float64; ``[]``, ``[,]``, ``[,,]``: a writable
C-contiguous array of 1, 2, 3 dimensions. :func:`warm_up` compiles (or loads from numba's disk cache) exactly
these; tests/test_decision_cost.py fails when a kernel is called with other types, so that this table follows
the code."""

_DTYPES = {"i8": "int64", "i4": "int32", "i2": "int16", "u8": "uint64", "b1": "boolean", "f8": "float64"}
_warm: dict[str, float] | None = None


def kernel_types(spec: str) -> tuple:
    """The numba argument types of a :data:`SIGNATURES` entry (imports numba); raises ValueError naming an
    unknown word."""
    import re

    from numba import types

    out = []
    for word in spec.split():
        m = re.fullmatch(r"(i8|i4|i2|u8|b1|f8)(?:\[(,{0,2})\])?", word)
        if m is None:
            raise ValueError(f"unknown kernel argument type {word!r} in {spec!r}")
        dtype = getattr(types, _DTYPES[m.group(1)])
        out.append(types.Array(dtype, len(m.group(2)) + 1, "C") if m.group(2) is not None else dtype)
    return tuple(out)


def warm_up() -> dict[str, float]:
    """Compile every kernel in :data:`SIGNATURES` now, or load it from numba's disk cache (about a second each
    when not cached, milliseconds when cached), so that no decision pays for it later: without this a kernel
    compiles on its first call, which on a large cluster can come thousands of decisions into a run (the
    dedup of many changed nodes, say) and stall that one decision for most of a second. Idempotent; returns
    seconds per kernel of the first call in this process ({} when the compiled path is off). Drivers that
    care about latency (the live scheduler, the decision benchmarks) call it at start-up."""
    global _warm
    if not enabled():
        return {}
    if _warm is None:
        import time

        g = globals()
        done: dict[str, float] = {}
        for name, spec in SIGNATURES.items():
            t0 = time.perf_counter()
            try:
                g[name].compile(kernel_types(spec))
            except Exception as exc:  # a SIGNATURES entry out of step with its kernel: say which
                raise RuntimeError(f"warm-up of kernel {name} ({spec!r}) failed: {exc}") from exc
            done[name] = time.perf_counter() - t0
        _warm = done
    return dict(_warm)


# --------------------------------------------------------------------------- filters
_MARGIN = 1e-7
"""How close to an integer (score points) a compiled score may come before NumPy's exact path decides; the
compiled and BLAS sums differ by about 1e-12 points."""

# _codes_kernel writes filter i's failure code as the literal (i + 1) * 4 (CODE_STRIDE 4, asserted below)


@_jit
def _fit_count(n, num_gpu, milli, gpu_milli, need_mem, restricts, allowed, usable, gpu_free, healthy, gpu_model,
               mem_cap, mem_free):  # pragma: no cover - compiled
    """How many GPUs of node ``n`` fit, as :func:`gpu_fit_matrix` tests them.

    The same per-GPU test is written out in :func:`_fits` and :func:`_fgd_nodes` too, on purpose: one shared
    kernel called per GPU (numba ``inline="always"`` or not) measured 47 -> 60 us per decision at 1,000 nodes
    (bench_decisions --scaling-one 1000 gpupool, 2026-12-01). The side-by-side decision tests of
    tests/test_decision_cost.py (compiled against NumPy's :func:`gpu_fit_matrix` path) catch a copy that
    drifts."""
    count = 0
    n_models = allowed.shape[0] - 1
    for g in range(usable.shape[1]):
        if gpu_milli > 0:
            if usable[n, g] < milli:
                continue
        elif not (healthy[n, g] and gpu_free[n, g] >= milli):
            continue
        if restricts:
            m = gpu_model[n, g]
            if not allowed[m if m >= 0 else n_models]:
                continue
        if need_mem:
            if not (mem_cap[n, g] > 0 and mem_free[n, g] >= need_mem):
                continue
        elif mem_free[n, g] < mem_cap[n, g] * milli // 1000:
            continue
        count += 1
    return count


@_jit
def _codes_kernel(nodes, cpu, mem, num_gpu, gpu_milli, need_mem, slice_ask, has_spec, has_type, restricts,
                  spec_ok, type_ok, allowed, cpu_free, mem_free, node_model, node_gpu_mem, gpu_count, replicas,
                  slice_milli, usable, gpu_free, healthy, exists, gpu_model, mem_cap, mem_free_g,
                  out):  # pragma: no cover - compiled
    n_models = allowed.shape[0] - 1
    for i in range(nodes.shape[0]):
        n = nodes[i]
        code = 0
        m = node_model[n]
        mi = m if m >= 0 else n_models
        if cpu_free[n] < cpu:
            code = 1 * 4
        elif mem_free[n] < mem:
            code = 2 * 4
        elif num_gpu > 0 and has_spec and not spec_ok[mi]:
            code = 3 * 4
        elif num_gpu > 0 and has_type and not type_ok[mi]:
            code = 4 * 4
        elif num_gpu > 0 and need_mem and not (node_gpu_mem[n] > 0 or gpu_count[n] == 0):
            code = 5 * 4
        elif num_gpu > 0:
            milli = gpu_milli
            if slice_ask and replicas[n] > 1:
                milli = slice_milli[n]
            fit = _fit_count(n, num_gpu, milli, gpu_milli, need_mem, restricts, allowed, usable, gpu_free, healthy,
                             gpu_model, mem_cap, mem_free_g)
            if fit < num_gpu:
                well = 0
                by_share = 0
                for g in range(usable.shape[1]):
                    if healthy[n, g] and exists[n, g]:
                        well += 1
                    if usable[n, g] >= milli:
                        by_share += 1
                sick = well < num_gpu and gpu_count[n] >= num_gpu
                memory = (not sick) and by_share >= num_gpu
                sliced = slice_ask and (not sick) and (not memory) and replicas[n] > 1 and num_gpu > 1
                code = 6 * 4 + (1 if sick else (2 if memory else (3 if sliced else 0)))
        out[i] = code


@_jit
def _refresh_codes(log, start, end, snap, version, mark, idx, new, cpu, mem, num_gpu, gpu_milli, need_mem,
                   slice_ask, has_spec, has_type, restricts, spec_ok, type_ok, allowed, cpu_free, mem_free,
                   node_model, node_gpu_mem, gpu_count, replicas, slice_milli, usable, gpu_free, healthy, exists,
                   gpu_model, mem_cap, mem_free_g, codes, values, counts):  # pragma: no cover - compiled
    """Refresh one mask-cache entry in place: every node of ``log[start:end]`` (all nodes when ``start < 0``)
    whose ``snap`` differs from ``version`` gets its failure code (``codes``, by :func:`_codes_kernel`),
    feasibility (``values``), the code histogram ``counts`` moved from its old code to the new one, and ``snap``
    set to its version. ``mark``: an all-False (n_nodes,) scratch array, left all False; ``idx`` (int64) and
    ``new`` (int16): scratch arrays of at least as many entries as nodes to refresh. Returns how many."""
    k = 0
    if start < 0:
        for n in range(version.shape[0]):
            if snap[n] != version[n]:
                idx[k] = n
                k += 1
    else:
        for i in range(start, end):
            n = log[i]
            if snap[n] != version[n] and not mark[n]:
                mark[n] = True
                idx[k] = n
                k += 1
        for i in range(k):
            mark[idx[i]] = False
    nodes = idx[:k]
    out = new[:k]
    _codes_kernel(nodes, cpu, mem, num_gpu, gpu_milli, need_mem, slice_ask, has_spec, has_type, restricts, spec_ok,
                  type_ok, allowed, cpu_free, mem_free, node_model, node_gpu_mem, gpu_count, replicas, slice_milli,
                  usable, gpu_free, healthy, exists, gpu_model, mem_cap, mem_free_g, out)
    for i in range(k):
        n = nodes[i]
        code = out[i]
        counts[codes[n]] -= 1
        counts[code] += 1
        codes[n] = code
        values[n] = code == 0
        snap[n] = version[n]
    return k


@_jit
def _stale_nodes(log, start, end, snap, version, mark, out):  # pragma: no cover - compiled
    """The nodes of ``log[start:end]`` whose ``snap`` differs from ``version``, each once, ascending, written to
    ``out``; returns how many. ``mark``: an all-False (n_nodes,) scratch array, left all False."""
    k = 0
    for i in range(start, end):
        n = log[i]
        if snap[n] != version[n] and not mark[n]:
            mark[n] = True
            out[k] = n
            k += 1
    for i in range(k):
        mark[out[i]] = False
    out[:k].sort()
    return k


@_jit
def _changed_feasible(log, start, end, mask, scores, mark, nodes_out, neg_out):  # pragma: no cover - compiled
    """The nodes of ``log[start:end]`` that pass ``mask``, each once, ascending (``nodes_out``), and their
    negated ``scores`` (``neg_out``); returns (how many, whether a score is NaN). ``mark`` as above."""
    k = 0
    for i in range(start, end):
        n = log[i]
        if mask[n] and not mark[n]:
            mark[n] = True
            nodes_out[k] = n
            k += 1
    for i in range(k):
        mark[nodes_out[i]] = False
    nodes_out[:k].sort()
    nan = False
    for i in range(k):
        v = scores[nodes_out[i]]
        if v != v:
            nan = True
        neg_out[i] = -v
    return k, nan


def request_args(state: ClusterState, req: EffectiveRequest) -> tuple:
    """The request's arguments to the failure-code kernels (scalars and (n_models + 1,) bool model tables); they
    depend only on the request and the cluster's GPU models, so a caller may keep them per request class."""
    r = req.requested
    has_spec = bool(r.gpu_spec)
    has_type = bool(r.gpu_type_include or r.gpu_type_exclude)
    n_slots = len(state.model_names) + 1
    spec_ok = _spec_allowed(state, r.gpu_spec) if has_spec else np.ones(n_slots, dtype=bool)
    type_ok = _type_allowed(state, req) if has_type and req.num_gpu else np.ones(n_slots, dtype=bool)
    restricts = has_spec or has_type
    allowed = allowed_models(state, req) if restricts and req.num_gpu else np.ones(n_slots, dtype=bool)
    return (r.cpu_milli, r.memory_mib, r.num_gpu, req.gpu_milli, r.gpu_memory_mib, req.is_slice_ask, has_spec,
            has_type, restricts, spec_ok, type_ok, allowed)


def _state_args(state: ClusterState) -> tuple:
    return (state.cpu_free, state.mem_free, state.node_model, state.node_gpu_mem, state.gpu_count, state.gpu_replicas,
            state.slice_milli, state._usable, state.gpu_free, state.gpu_healthy, state.gpu_exists, state.gpu_model,
            state.gpu_mem_cap, state.gpu_mem_free)


def refresh_codes(state: ClusterState, args: tuple, seen: int, snap: np.ndarray, mark: np.ndarray, codes: np.ndarray,
                  values: np.ndarray, counts: np.ndarray) -> int:
    """Bring a mask-cache entry last refreshed at ``changes == seen`` (-1: never) up to date in one compiled call:
    the nodes changed since (from the change log, or a scan of ``snap`` against ``version`` when the log does not
    reach back or is longer than the cluster) get their failure code in ``codes`` ((n_nodes,) int16, see
    :func:`gpupool.engine.filters.failure_codes`), ``values`` ((n_nodes,) bool, code 0) and ``snap``
    ((n_nodes,) int64 versions); ``counts`` (int64, one slot per code) stays the histogram of ``codes``.
    ``args``: :func:`request_args`; ``mark``: (n_nodes,) bool all False. Returns how many nodes it refreshed."""
    tail = state.log_tail(seen) if seen >= 0 else None
    if tail is None or tail[2] - tail[1] > state.n_nodes:
        log, start, end = _NO_LOG, -1, -1
        size = state.n_nodes
    else:
        log, start, end = tail
        size = min(end - start, state.n_nodes)
    return _refresh_codes(log, start, end, snap, state.version, mark, np.empty(size, dtype=np.int64),
                          np.empty(size, dtype=np.int16), *args, *_state_args(state), codes, values, counts)


def stale_nodes(state: ClusterState, seen: int, snap: np.ndarray, mark: np.ndarray) -> np.ndarray | None:
    """Sorted (k,) int64 nodes changed since ``changes == seen`` whose ``snap`` differs from ``version`` (from the
    change log, compiled), or None when the log does not reach back or is longer than the cluster (scan then)."""
    tail = state.log_tail(seen) if seen >= 0 else None
    if tail is None or tail[2] - tail[1] > state.n_nodes:
        return None
    log, start, end = tail
    out = np.empty(end - start, dtype=np.int64)
    return out[:_stale_nodes(log, start, end, snap, state.version, mark, out)]


def changed_feasible(state: ClusterState, seen: int, mask: np.ndarray, scores: np.ndarray,
                     mark: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """((k,) int64 nodes changed since ``changes == seen`` that pass ``mask``, ascending; (k,) float64 their
    negated ``scores``; whether one is NaN), or None when the log does not reach back that far."""
    tail = state.log_tail(seen) if seen >= 0 else None
    if tail is None:
        return None
    log, start, end = tail
    k = min(end - start, state.n_nodes)
    nodes, neg = np.empty(k, dtype=np.int64), np.empty(k)
    count, nan = _changed_feasible(log, start, end, mask, scores, mark, nodes, neg)
    return nodes[:count], neg[:count], nan


_NO_LOG = np.zeros(0, dtype=np.int64)


def uses_default_filters(filters) -> bool:
    """True when ``filters`` are :data:`DEFAULT_FILTERS` (what :func:`failure_codes_default` mirrors)."""
    return len(filters) == len(DEFAULT_FILTERS) and all(
        type(a) is type(b) for a, b in zip(filters, DEFAULT_FILTERS, strict=True))


def failure_codes_default(state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
    """(len(nodes),) int16 :func:`gpupool.engine.filters.failure_codes` for :data:`DEFAULT_FILTERS`, compiled."""
    out = np.empty(len(nodes), dtype=np.int16)
    _codes_kernel(np.asarray(nodes, dtype=np.int64), *request_args(state, req), *_state_args(state), out)
    return out


assert CODE_STRIDE == 4 and len(DEFAULT_FILTERS) == 6  # the literal codes of _codes_kernel
assert (SUB_SICK, SUB_MEMORY, SUB_SLICED) == (1, 2, 3) and isinstance(DEFAULT_FILTERS[5], GpuFit)


# --------------------------------------------------------------------------- FGD / gpupool scores
@_jit
def _fits(nodes, share, gpu_milli, need_mem, restricts, allowed, usable, gpu_free, healthy, gpu_model, mem_cap,
          mem_free, out):  # pragma: no cover - compiled
    """gpu_fit_matrix of ``nodes`` (``share``: node_share of each) into ``out`` (k, G) bool."""
    n_models = allowed.shape[0] - 1
    for i in range(nodes.shape[0]):
        n = nodes[i]
        milli = share[i]
        for g in range(usable.shape[1]):
            ok = True
            if gpu_milli > 0:
                ok = usable[n, g] >= milli
            else:
                ok = healthy[n, g] and gpu_free[n, g] >= milli
            if ok and restricts:
                m = gpu_model[n, g]
                ok = allowed[m if m >= 0 else n_models]
            if ok:
                if need_mem:
                    ok = mem_cap[n, g] > 0 and mem_free[n, g] >= need_mem
                else:
                    ok = mem_free[n, g] >= mem_cap[n, g] * milli // 1000
            out[i, g] = ok


@_jit
def _after_share_cells(free, milli, cpu_a, model, mem_a, use_mem, access, t_milli, t_num, t_cpu, t_mem, t_gpu,
                       out):  # pragma: no cover - compiled
    """FragModel.frag_after_share's (k, G, T) cells: GPU g of node i gives ``milli`` (never below 0)."""
    n_models = access.shape[0] - 1
    n_gpus = free.shape[1]
    for i in range(free.shape[0]):
        m = model[i]
        mi = m if m >= 0 else n_models
        total = 0
        for g in range(n_gpus):
            total += free[i, g]
        for t in range(t_milli.shape[0]):
            tm = t_milli[t]
            count = 0
            small = 0
            for g in range(n_gpus):
                if free[i, g] >= tm:
                    count += 1
                else:
                    small += free[i, g]
            serve = t_gpu[t] and access[mi, t] and cpu_a[i] >= t_cpu[t] and (not use_mem or mem_a[i] >= t_mem[t])
            for g in range(n_gpus):
                x = free[i, g]
                a = x - milli if x > milli else 0
                c = count - (1 if x >= tm else 0) + (1 if a >= tm else 0)
                s = small - (0 if x >= tm else x) + (0 if a >= tm else a)
                if serve and c >= t_num[t]:
                    out[i, g, t] = s
                else:
                    out[i, g, t] = total - (x - a)


@_jit
def _fgd_nodes(nodes, usable, gpu_free, healthy, gpu_model, mem_cap, mem_free_g, cpu_free, mem_free, node_model,
               replicas, slice_milli, before, cpu, mem, mode, gpu_milli, need_mem, num_gpu, slice_ask, restricts,
               allowed, prob, use_mem, access, t_milli, t_num, t_cpu, t_mem, t_gpu, u_milli, t_idx, use_mask, mask,
               scores, choice, cells, share_out, free_out):  # pragma: no cover - compiled
    """FGD's integer scores ``floor(100 * sigmoid((before - after) / 1000))`` of placing the request on each of
    ``nodes`` (read from the cluster's arrays; ``before``: the (n_nodes,) fragmentation now) and, for a
    fractional pod (``mode`` 1), the best GPU of each node; ``mode`` 0: no GPU, 2: whole GPUs / replicas (the
    lowest-index fitting GPUs, as :func:`gpupool.engine.filters.gpu_fit_matrix` tests them, give the node's
    share). Modes 0 and 2 also write the fragmentation cells after placement (``cells``, (k, n_shapes) int64, as
    :meth:`gpupool.frag.FragModel.frag` builds them) for NumPy's exact path; every mode writes each node's share
    (``share_out``, :func:`gpupool.engine.filters.node_share`) and free usable GPU share (``free_out``). The
    fragmentation after placement is summed here in order, which may differ from NumPy's BLAS product in the
    last bits: returns True when any score lies within ``_MARGIN`` of an integer (where such a difference could
    move the floor), and the caller then takes NumPy's exact path. With ``use_mask``, only nodes where the
    (n_nodes,) bool ``mask`` is True count for that, and in modes 1 and 2 only they are scored (the scores of
    the others are never read: they get 0, and no cells). ``u_milli``: the
    distinct shares of the shapes, ``t_idx``: each shape's index in it (GPUs are counted once per distinct
    share, not per shape)."""
    n_models = access.shape[0] - 1
    n_gpus = usable.shape[1]
    n_shapes = t_milli.shape[0]
    n_milli = u_milli.shape[0]
    count = np.empty(n_shapes, dtype=np.int64)
    small = np.empty(n_shapes, dtype=np.int64)
    u_count = np.empty(n_milli, dtype=np.int64)
    u_small = np.empty(n_milli, dtype=np.int64)
    row = np.empty(n_gpus, dtype=np.int64)
    fits = np.empty(n_gpus, dtype=np.bool_)
    unsure = False
    for i in range(nodes.shape[0]):
        n = nodes[i]
        read = not use_mask or mask[n]  # a score that may be read: its floor must be NumPy's
        m = node_model[n]
        mi = m if m >= 0 else n_models
        cpu_a = cpu_free[n] - cpu
        mem_a = mem_free[n] - mem
        milli = gpu_milli
        if num_gpu > 0 and slice_ask and replicas[n] > 1:
            milli = slice_milli[n]
        share_out[i] = milli
        total = 0
        for g in range(n_gpus):
            total += usable[n, g]
        free_out[i] = total
        if not read and mode != 0:  # never read: not scored (no cells either); a pod without GPUs fits most
            scores[i] = 0.0  # nodes and is mostly sent to NumPy's path, so its cells are written for every node
            choice[i] = 0
            continue
        if mode != 0:  # _fits of one node
            for g in range(n_gpus):
                if gpu_milli > 0:
                    ok = usable[n, g] >= milli
                else:
                    ok = healthy[n, g] and gpu_free[n, g] >= milli
                if ok and restricts:
                    gm = gpu_model[n, g]
                    ok = allowed[gm if gm >= 0 else n_models]
                if ok:
                    if need_mem:
                        ok = mem_cap[n, g] > 0 and mem_free_g[n, g] >= need_mem
                    else:
                        ok = mem_free_g[n, g] >= mem_cap[n, g] * milli // 1000
                fits[g] = ok
        if mode == 1:
            for d in range(n_milli):
                c = 0
                sm = 0
                for g in range(n_gpus):
                    x = np.int64(usable[n, g])
                    if x >= u_milli[d]:
                        c += 1
                    else:
                        sm += x
                u_count[d] = c
                u_small[d] = sm
            for t in range(n_shapes):
                count[t] = u_count[t_idx[t]]
                small[t] = u_small[t_idx[t]]
            best = -np.inf
            best_g = 0
            for g in range(n_gpus):
                if not fits[g]:
                    continue
                x = np.int64(usable[n, g])
                a = x - gpu_milli if x > gpu_milli else 0
                after = 0.0
                for t in range(n_shapes):
                    tm = t_milli[t]
                    cell = total - (x - a)
                    if t_gpu[t] and access[mi, t] and cpu_a >= t_cpu[t] and (not use_mem or mem_a >= t_mem[t]):
                        c = count[t] - (1 if x >= tm else 0) + (1 if a >= tm else 0)
                        if c >= t_num[t]:
                            cell = small[t] - (0 if x >= tm else x) + (0 if a >= tm else a)
                    after += cell * prob[t]
                v = 100.0 / (1.0 + math.exp(-(before[n] - after) / 1000.0))
                f = math.floor(v)
                if read and (v - f < _MARGIN or f + 1.0 - v < _MARGIN):
                    unsure = True
                if f > best:
                    best = f
                    best_g = g
            scores[i] = best
            choice[i] = best_g
            continue
        taken = 0
        after_total = 0
        for g in range(n_gpus):
            x = np.int64(usable[n, g])
            if mode == 2 and fits[g] and taken < num_gpu:
                taken += 1
                x -= milli
            row[g] = x
            after_total += x
        for d in range(n_milli):
            c = 0
            sm = 0
            for g in range(n_gpus):
                if row[g] >= u_milli[d]:
                    c += 1
                else:
                    sm += row[g]
            u_count[d] = c
            u_small[d] = sm
        after = 0.0
        terms = 0
        for t in range(n_shapes):
            cell = after_total
            if t_gpu[t] and access[mi, t] and cpu_a >= t_cpu[t] and (not use_mem or mem_a >= t_mem[t]):
                if u_count[t_idx[t]] >= t_num[t]:
                    cell = u_small[t_idx[t]]
            cells[i, t] = cell
            if cell != 0:
                terms += 1
            after += cell * prob[t]
        v = 100.0 / (1.0 + math.exp(-(before[n] - after) / 1000.0))
        f = math.floor(v)
        # Sure when the decrease is exactly NumPy's and exactly 0: a sum of at most one nonzero product is the
        # same bits in any order (BLAS's too), and a zero decrease scores 100 / (1 + exp(0)) = 50.0 exactly in
        # any exp. That is where whole-GPU pods that fragment nothing land: on the floor's boundary.
        if read and (v - f < _MARGIN or f + 1.0 - v < _MARGIN) and not (terms <= 1 and before[n] - after == 0.0):
            unsure = True
        scores[i] = f
        choice[i] = 0
    return unsure


@_jit
def _before_cells(nodes, before_at, version, usable, cpu_free, node_model, mem_free, use_mem, access, t_milli, t_num,
                  t_cpu, t_mem, t_gpu, u_milli, t_idx, pos, out):  # pragma: no cover - compiled
    """The nodes among ``nodes`` whose fragmentation ``before_at`` is not their ``version``: their positions in
    ``nodes`` (``pos``, in order) and the fragmentation cells of their current state (``out[j]`` for ``pos[j]``:
    what :meth:`FragModel.frag` multiplies with the shape probabilities), read from the cluster's arrays;
    returns how many."""
    n_models = access.shape[0] - 1
    n_gpus = usable.shape[1]
    n_milli = u_milli.shape[0]
    u_count = np.empty(n_milli, dtype=np.int64)
    u_small = np.empty(n_milli, dtype=np.int64)
    k = 0
    for j in range(nodes.shape[0]):
        n = nodes[j]
        if before_at[n] == version[n]:
            continue
        pos[k] = j
        i = k
        k += 1
        total = 0
        for g in range(n_gpus):
            total += usable[n, g]
        m = node_model[n]
        mi = m if m >= 0 else n_models
        cpu = cpu_free[n]
        mem = mem_free[n]
        for d in range(n_milli):  # GPUs with at least each distinct share free, and the free share of the others
            c = 0
            sm = 0
            for g in range(n_gpus):
                x = np.int64(usable[n, g])
                if x >= u_milli[d]:
                    c += 1
                else:
                    sm += x
            u_count[d] = c
            u_small[d] = sm
        for t in range(t_milli.shape[0]):
            cell = total
            if t_gpu[t] and access[mi, t] and cpu >= t_cpu[t] and (not use_mem or mem >= t_mem[t]):
                if u_count[t_idx[t]] >= t_num[t]:
                    cell = u_small[t_idx[t]]
            out[i, t] = cell
    return k


@_jit
def _same_key(a, b, node_model, cpu_free, mem_free, gpu_free, healthy, mem_free_g, mem_cap,
              slice_milli):  # pragma: no cover - compiled
    """Whether nodes ``a`` and ``b`` have the same FGD._evaluate_dedup key row."""
    if node_model[a] != node_model[b] or cpu_free[a] != cpu_free[b] or mem_free[a] != mem_free[b]:
        return False
    if slice_milli[a] != slice_milli[b]:
        return False
    for g in range(gpu_free.shape[1]):
        if (gpu_free[a, g] != gpu_free[b, g] or healthy[a, g] != healthy[b, g] or mem_free_g[a, g] != mem_free_g[b, g]
                or mem_cap[a, g] != mem_cap[b, g]):
            return False
    return True


@_jit
def _stable_argsort(h):  # pragma: no cover - compiled
    """``np.argsort(h, kind="stable")`` of a (k,) uint64 array: least-significant-digit radix sort, 8 bits a
    pass (a pass whose byte is the same in every key is skipped), stable, so the same permutation."""
    k = h.shape[0]
    if k < 64:
        return np.argsort(h, kind="mergesort")
    order = np.arange(k)
    tmp = np.empty(k, dtype=np.int64)
    count = np.empty(257, dtype=np.int64)
    for shift in range(0, 64, 8):
        count[:] = 0
        for i in range(k):
            count[((h[i] >> np.uint64(shift)) & np.uint64(255)) + 1] += 1
        if count[1:].max() == k:  # every key has this byte: the pass keeps the order
            continue
        for b in range(256):
            count[b + 1] += count[b]
        for r in range(k):
            i = order[r]
            b = (h[i] >> np.uint64(shift)) & np.uint64(255)
            tmp[count[b]] = i
            count[b] += 1
        order, tmp = tmp, order
    return order


@_jit
def _distinct_nodes(nodes, weights, node_model, cpu_free, mem_free, gpu_free, healthy, mem_free_g, mem_cap,
                    slice_milli, first_out, inverse):  # pragma: no cover - compiled
    """fgd._distinct_rows of FGD._evaluate_dedup's key over ``nodes``, read from the state arrays: the same
    hashes (wrapping uint64 dot product of the key row with ``weights``), ``first`` (returns how many) in
    sorted-hash order with each hash's first row, ``inverse``; returns -1 on a hash collision (the caller then
    takes the policy's own path)."""
    k = nodes.shape[0]
    n_gpus = gpu_free.shape[1]
    h = np.empty(k, dtype=np.uint64)
    # the key row: model, CPU, memory, per GPU free share / health / free memory / memory size, replica share
    for i in range(k):  # (weights in that column order; the sum wraps, so the order of the terms does not matter)
        n = nodes[i]
        acc = (np.uint64(np.int64(node_model[n])) * weights[0] + np.uint64(np.int64(cpu_free[n])) * weights[1]
               + np.uint64(np.int64(mem_free[n])) * weights[2]
               + np.uint64(np.int64(slice_milli[n])) * weights[3 + 4 * n_gpus])
        for g in range(n_gpus):
            acc += (np.uint64(np.int64(gpu_free[n, g])) * weights[3 + g]
                    + np.uint64(np.int64(1 if healthy[n, g] else 0)) * weights[3 + n_gpus + g]
                    + np.uint64(np.int64(mem_free_g[n, g])) * weights[3 + 2 * n_gpus + g]
                    + np.uint64(np.int64(mem_cap[n, g])) * weights[3 + 3 * n_gpus + g])
        h[i] = acc
    order = _stable_argsort(h)  # stable: equal hashes keep row order, so the first is the first row
    n_first = 0
    for r in range(k):
        i = order[r]
        if r == 0 or h[i] != h[order[r - 1]]:
            first_out[n_first] = i
            n_first += 1
        inverse[i] = n_first - 1
    for i in range(k):  # a collision: two different rows with one hash (a first row is its own representative)
        rep = first_out[inverse[i]]
        if rep != i and not _same_key(nodes[i], nodes[rep], node_model, cpu_free, mem_free, gpu_free, healthy,
                                      mem_free_g, mem_cap, slice_milli):
            return -1
    return n_first


def distinct_nodes(state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(first, inverse) as ``fgd._distinct_rows`` gives them for FGD._evaluate_dedup's key of ``nodes``, or None
    on a hash collision."""
    from gpupool.policies.fgd import _HASH_WEIGHTS

    n_cols = 4 + 4 * state.max_gpus
    if n_cols > len(_HASH_WEIGHTS):
        return None
    first = np.empty(len(nodes), dtype=np.int64)
    inverse = np.empty(len(nodes), dtype=np.int64)
    n = _distinct_nodes(nodes, _HASH_WEIGHTS[:n_cols], state.node_model, state.cpu_free, state.mem_free,
                        state.gpu_free, state.gpu_healthy, state.gpu_mem_free, state.gpu_mem_cap, state.slice_milli,
                        first, inverse)
    return None if n < 0 else (first[:n], inverse)


@_jit
def _strand_delta(nodes, gpu_free, demand, cpu_free, mem_free, req_cpu, req_mem, cpu_ratio, mem_ratio,
                  out):  # pragma: no cover - compiled
    """out[i] = GPUs of free share node ``nodes[i]`` strands after the placement minus before
    (:func:`gpupool.policies.gpupool_policy.stranded_gpus`, the same float operations in the same order: the
    feedable share is the smaller of free CPU / ``cpu_ratio`` and free memory / ``mem_ratio``, a ratio of 0
    leaving its resource out). ``gpu_free``, ``demand``: (k,) milli-GPU free before and taken by the pod.
    Returns whether any entry is nonzero."""
    nonzero = False
    for i in range(len(nodes)):
        n = nodes[i]
        fb = np.inf
        fa = np.inf
        if cpu_ratio > 0:
            fb = min(fb, cpu_free[n] / cpu_ratio)
            fa = min(fa, (cpu_free[n] - req_cpu) / cpu_ratio)
        if mem_ratio > 0:
            fb = min(fb, mem_free[n] / mem_ratio)
            fa = min(fa, (mem_free[n] - req_mem) / mem_ratio)
        before = max(0.0, gpu_free[i] - fb) / 1000
        after = max(0.0, (gpu_free[i] - demand[i]) - fa) / 1000
        out[i] = after - before
        if out[i] != 0.0:
            nonzero = True
    return nonzero


def _source_hash(*objs) -> str:
    h = hashlib.sha256()
    for obj in objs:
        h.update(inspect.getsource(obj).encode())
    return h.hexdigest()[:16]


def _mirrored():
    from gpupool.frag import FragModel
    from gpupool.policies.fgd import FGD, _distinct_rows

    return (FGD._evaluate, FGD._evaluate_dedup, FGD.score, FGD._transform, _distinct_rows, FragModel.frag,
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
        from gpupool.policies.gpupool_policy import GpupoolPolicy
        try:
            _final_ok = _source_hash(GpupoolPolicy._final_score) == GPUPOOL_FINAL_FINGERPRINT
        except (OSError, TypeError):
            _final_ok = False
    return _final_ok


def _fgd_final(state, req, nodes, scores, share, gpu_free):
    """FGD._final_score: the scores as they are."""
    return scores


def fingerprint() -> str:
    """The current hash of the mirrored methods' source."""
    return _source_hash(*_mirrored())


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
        from gpupool.policies.fgd import FGD
        from gpupool.policies.gpupool_policy import GpupoolPolicy

        final = type(policy)._final_score
        if final is FGD._final_score:
            return _fgd_final
        if final is GpupoolPolicy._final_score and gpupool_final_current():
            from gpupool.policies.best_fit import MAX_SPEC_GPU
            from gpupool.policies.gpupool_policy import POINTS_PER_GPU

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
        if not _strand_delta(nodes, gpu_free, demand, state.cpu_free, state.mem_free, int(req.cpu_milli),
                             int(req.memory_mib), float(cpu_ratio), float(mem_ratio), out):
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
        if not enabled():
            return False
        from gpupool.frag import FragModel
        from gpupool.policies.fgd import FGD

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
        _fits(nodes, share, req.gpu_milli, r.gpu_memory_mib, restricts, allowed, state._usable, state.gpu_free,
              state.gpu_healthy, state.gpu_model, state.gpu_mem_cap, state.gpu_mem_free, out)
        return out

    def _refresh_before(self, state: ClusterState, nodes: np.ndarray) -> None:
        """The policy's ``_before`` (fragmentation now) of those of ``nodes`` whose state changed since, as
        FGD._evaluate refreshes it: the stale rows, in order, in one product with ``prob`` (same rows to BLAS)."""
        pol = self.policy
        pos = np.empty(len(nodes), dtype=np.int64)
        out = np.empty((len(nodes), self.n_shapes), dtype=np.int64)
        k = _before_cells(nodes, pol._before_at, state.version, state._usable, state.cpu_free, state.node_model,
                          state.mem_free, self.model.use_memory, *self.shapes, *self.by_milli, pos, out)
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
        unsure = _fgd_nodes(nodes, state._usable, state.gpu_free, state.gpu_healthy, state.gpu_model,
                            state.gpu_mem_cap, state.gpu_mem_free, state.cpu_free, state.mem_free, state.node_model,
                            state.gpu_replicas, state.slice_milli, pol._before, r.cpu_milli, r.memory_mib, mode,
                            req.gpu_milli, r.gpu_memory_mib, r.num_gpu, req.is_slice_ask, restricts, allowed,
                            self.prob, self.model.use_memory, *self.shapes, *self.by_milli, mask is not None,
                            _NO_MASK if mask is None else mask, scores, choice, cells, share, gpu_free)
        if not unsure:
            return scores, (choice if mode == 1 else None), share, gpu_free
        before = pol._before[nodes]
        if mode != 1:  # the cells the kernel wrote, through BLAS as FGD._evaluate's frag(after) does
            if mask is not None and mode == 2:  # the kernel left out the nodes outside the mask: all cells now
                _fgd_nodes(nodes, state._usable, state.gpu_free, state.gpu_healthy, state.gpu_model, state.gpu_mem_cap,
                           state.gpu_mem_free, state.cpu_free, state.mem_free, state.node_model, state.gpu_replicas,
                           state.slice_milli, pol._before, r.cpu_milli, r.memory_mib, mode, req.gpu_milli,
                           r.gpu_memory_mib, r.num_gpu, req.is_slice_ask, restricts, allowed, self.prob,
                           self.model.use_memory, *self.shapes, *self.by_milli, False, _NO_MASK, scores, choice, cells,
                           share, gpu_free)
            return pol._transform(before - cells @ self.model.prob), None, share, gpu_free
        free = state._usable[nodes].astype(np.int64)
        cpu_a = state.cpu_free[nodes] - req.cpu_milli
        mem_a = state.mem_free[nodes] - req.memory_mib
        fits = self._fit_matrix(state, req, nodes, share)
        cells3 = np.empty((k, state.max_gpus, self.n_shapes), dtype=np.int64)
        _after_share_cells(free, req.gpu_milli, cpu_a, state.node_model[nodes], mem_a, self.model.use_memory,
                           *self.shapes, cells3)
        fa = cells3 @ self.model.prob
        s = np.where(fits, pol._transform(before[:, None] - fa), -np.inf)
        choice = np.argmax(s, axis=1)
        return s[np.arange(k), choice], choice, share, gpu_free

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray,
              mask: np.ndarray | None = None) -> np.ndarray:
        """(len(nodes),) float64: ``policy.score(state, req, nodes)``. With ``mask`` ((n_nodes,) bool), only the
        scores of nodes where it is True are the policy's: nodes outside it may be left unscored (0.0, GPU choice
        0; the policy's books ``_before`` are kept as ever), and only nodes inside it near a score boundary send the
        refresh to NumPy's exact path. For a caller that never reads those scores: see ``Engine._mask_keyed``."""
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


# --------------------------------------------------------------------------- fair share
# A copy of gpupool.engine.pool.fairshare (fair_shares, _divide, _waterfill, _dom, _cap_row), operation for
# operation in the same order, so that every share is the same float: Python's float is an IEEE double as
# numba's is, and each builtin is spelled out as CPython evaluates it (max(x, 0.0) keeps x unless 0.0 > x;
# min(a, b) keeps a unless b < a; sum() adds left to right from 0; sorted() is stable). The pool scheduler
# calls it once per change of demand (about 50,000 times on the whole Philly trace, where the Python code
# was about 7% of the simulator's time). FAIRSHARE_FINGERPRINT holds the Python code it copies.
_FS_EPS = 1e-9


@_jit
def _fs_dom(x0, x1, x2, n0, n1, n2):  # pragma: no cover - compiled
    a, b, c = x0 / n0, x1 / n1, x2 / n2
    if a >= b and a >= c:
        return a
    return b if b >= c else c


@_jit
def _fs_waterfill(alloc, demand, weight, rem, members, norm):  # pragma: no cover - compiled
    n0, n1, n2 = norm[0], norm[1], norm[2]
    k = alloc.shape[0]
    active = np.empty(k, dtype=np.int64)
    na = 0
    for i in members:
        if _fs_dom(demand[i, 0] - alloc[i, 0], demand[i, 1] - alloc[i, 1], demand[i, 2] - alloc[i, 2],
                   n0, n1, n2) > _FS_EPS:
            active[na] = i
            na += 1
    unit = np.zeros((k, 3))
    t_q = np.zeros(k)
    rate = np.zeros(3)
    used = np.zeros(3)
    for _ in range(4):
        if na == 0:
            return
        rate[:] = 0.0
        for j in range(na):
            i = active[j]
            need0 = demand[i, 0] - alloc[i, 0]
            need1 = demand[i, 1] - alloc[i, 1]
            need2 = demand[i, 2] - alloc[i, 2]
            need0 = 0.0 if 0.0 > need0 else need0
            need1 = 0.0 if 0.0 > need1 else need1
            need2 = 0.0 if 0.0 > need2 else need2
            dom = _fs_dom(need0, need1, need2, n0, n1, n2)
            unit[i, 0] = need0 / dom
            unit[i, 1] = need1 / dom
            unit[i, 2] = need2 / dom
            t_q[i] = dom / weight[i]
            w = weight[i]
            for r in range(3):
                rate[r] += w * unit[i, r]
        keys = np.empty(na)
        for j in range(na):
            keys[j] = t_q[active[j]]
        order = np.argsort(keys, kind="mergesort")
        used[:] = 0.0
        t_prev = 0.0
        level = t_q[active[order[na - 1]]]
        exhausted = -1
        for jj in range(na):
            i = active[order[jj]]
            hit = math.inf
            r_hit = -1
            for r in range(3):
                if rate[r] > _FS_EPS:
                    t_r = t_prev + (rem[r] - used[r]) / rate[r]
                    if t_r < hit:
                        hit = t_r
                        r_hit = r
            if hit < t_q[i] - 1e-12:
                level = t_prev if t_prev > hit else hit
                exhausted = r_hit
                break
            for r in range(3):
                used[r] += rate[r] * (t_q[i] - t_prev)
                rate[r] -= weight[i] * unit[i, r]
            t_prev = t_q[i]
        for j in range(na):
            i = active[j]
            grow = weight[i] * (t_q[i] if t_q[i] < level else level)
            for r in range(3):
                alloc[i, r] += grow * unit[i, r]
                rem[r] -= grow * unit[i, r]
        for r in range(3):
            rem[r] = rem[r] if rem[r] > 0.0 else 0.0
        if exhausted < 0:
            return
        nb = 0
        for j in range(na):
            i = active[j]
            if t_q[i] > level + 1e-12 and unit[i, exhausted] <= _FS_EPS:
                active[nb] = i
                nb += 1
        na = nb


@_jit
def _fs_divide(members, budget, quota_all, demand_all, weight_all, prio_all, norm, out):  # pragma: no cover
    k = members.shape[0]
    demand = np.empty((k, 3))
    quota = np.empty((k, 3))
    weight = np.empty(k)
    prio = np.empty(k, dtype=np.int64)
    for j in range(k):
        m = members[j]
        weight[j] = weight_all[m]
        prio[j] = prio_all[m]
        for r in range(3):
            d = demand_all[m, r]
            d = 0.0 if 0.0 > d else d
            demand[j, r] = d
            q = quota_all[m, r]
            quota[j, r] = d if d < q else q
    alloc = np.zeros((k, 3))
    rem = np.empty(3)
    for r in range(3):
        rem[r] = 0.0 if 0.0 > budget[r] else budget[r]
    levels = np.unique(prio)[::-1]
    total = np.empty(3)
    for level in levels:
        for r in range(3):
            s = 0.0
            for j in range(k):
                if prio[j] == level:
                    s += quota[j, r]
            total[r] = s
        scale = 1.0
        for r in range(3):
            if total[r] > _FS_EPS:
                v = rem[r] / total[r]
                if v < scale:
                    scale = v
        for j in range(k):
            if prio[j] == level:
                for r in range(3):
                    alloc[j, r] += quota[j, r] * scale
        for r in range(3):
            v = rem[r] - total[r] * scale
            rem[r] = v if v > 0.0 else 0.0
    for level in levels:
        at = np.empty(k, dtype=np.int64)
        na = 0
        for j in range(k):
            if prio[j] == level:
                at[na] = j
                na += 1
        _fs_waterfill(alloc, demand, weight, rem, at[:na], norm)
    for j in range(k):
        for r in range(3):
            out[members[j], r] = alloc[j, r]


@_jit
def _fs_cap_row(demand, i, limit):  # pragma: no cover - compiled
    if demand[i, 0] > limit:
        scale = limit / demand[i, 0] if demand[i, 0] > 0 else 1.0
        for r in range(3):
            demand[i, r] = demand[i, r] * scale


@_jit
def _fair_shares_kernel(order, child_ptr, child_idx, top, is_leaf, limit, weight, prio, quota, cap, raw,
                        out):  # pragma: no cover - compiled
    n = raw.shape[0]
    norm = np.empty(3)
    for r in range(3):
        norm[r] = _FS_EPS if _FS_EPS > cap[r] else cap[r]
    demand = np.zeros((n, 3))
    for i in range(n):
        if is_leaf[i]:
            for r in range(3):
                demand[i, r] = raw[i, r]
            _fs_cap_row(demand, i, limit[i])
    for jj in range(order.shape[0] - 1, -1, -1):
        i = order[jj]
        if child_ptr[i + 1] > child_ptr[i]:
            for r in range(3):
                s = 0.0
                for c in child_idx[child_ptr[i]:child_ptr[i + 1]]:
                    s += demand[c, r]
                demand[i, r] = s
            _fs_cap_row(demand, i, limit[i])
    out[:, :] = 0.0
    _fs_divide(top, cap, quota, demand, weight, prio, norm, out)
    budget = np.empty(3)
    for i in order:
        if child_ptr[i + 1] > child_ptr[i]:
            for r in range(3):
                budget[r] = out[i, r]
            _fs_divide(child_idx[child_ptr[i]:child_ptr[i + 1]], budget, quota, demand, weight, prio, norm, out)


FAIRSHARE_FINGERPRINT = "50a2958a6ad8ec74"
"""Hash of the source of the fair-share code :func:`_fair_shares_kernel` copies (``fairshare.fair_shares``,
``_divide``, ``_waterfill``, ``_dom``, ``_cap_row``); when it does not match, the Python code runs."""

_fairshare_ok: bool | None = None


def fairshare_fingerprint() -> str:
    from gpupool.engine.pool import fairshare as fs

    return _source_hash(fs.fair_shares, fs._divide, fs._waterfill, fs._dom, fs._cap_row)


def fairshare_mirror_current() -> bool:
    """True when the fair-share code :func:`_fair_shares_kernel` copies is the one it was written for."""
    global _fairshare_ok
    if _fairshare_ok is None:
        try:
            from gpupool.engine.pool import fairshare as fs

            _fairshare_ok = fairshare_fingerprint() == FAIRSHARE_FINGERPRINT and fs._EPS == _FS_EPS
        except (OSError, TypeError):
            _fairshare_ok = False
    return _fairshare_ok


def fair_shares(tree, cap: np.ndarray, leaf_demand: np.ndarray, quota: np.ndarray) -> np.ndarray:
    """``fairshare.fair_shares(tree, cap, leaf_demand, quota)`` in one compiled call: (n, 3) float64, the same
    floats. The tree's child lists are packed once (``tree._fs_packed``)."""
    packed = getattr(tree, "_fs_packed", None)
    if packed is None:
        ptr = np.zeros(len(tree) + 1, dtype=np.int64)
        for i, kids in enumerate(tree.children):
            ptr[i + 1] = ptr[i] + len(kids)
        idx = np.array([c for kids in tree.children for c in kids], dtype=np.int64)
        packed = (np.array(tree.order, dtype=np.int64), ptr, idx, np.array(tree.top, dtype=np.int64),
                  np.ascontiguousarray(tree.is_leaf), np.ascontiguousarray(tree.limit_gpu, dtype=np.float64),
                  np.ascontiguousarray(tree.weight, dtype=np.float64),
                  np.ascontiguousarray(tree.priority, dtype=np.int64))
        tree._fs_packed = packed
    n = len(tree)
    q = np.ascontiguousarray(quota, dtype=np.float64)
    c = np.ascontiguousarray(cap, dtype=np.float64)
    d = np.ascontiguousarray(leaf_demand, dtype=np.float64)
    if q.shape != (n, 3) or c.shape != (3,) or d.shape != (n, 3):  # the kernel does not check bounds
        return _fairshare_python(tree, cap, leaf_demand, quota)
    out = np.empty((n, 3))
    _fair_shares_kernel(*packed, q, c, d, out)
    if not np.isfinite(out).all():  # a NaN sort key or NaN sign: Python's sorted() and NaN rules, not the copy's
        return _fairshare_python(tree, cap, leaf_demand, quota)
    return out


def _fairshare_python(tree, cap, leaf_demand, quota):
    from gpupool.engine.pool import fairshare as fs

    return fs.fair_shares(tree, cap, leaf_demand, quota)
