"""Compiled filter kernels: every node's first failing default filter (:func:`failure_codes_default`,
:func:`refresh_codes`) and the nodes changed since a count (:func:`stale_nodes`, :func:`changed_feasible`).
Imports the engine's filters and the cluster only."""

from __future__ import annotations

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
    allowed_models,
    spec_allowed,
    type_allowed,
)
from gpupool.engine.kernels.registry import jit as _jit

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
    spec_ok = spec_allowed(state, r.gpu_spec) if has_spec else np.ones(n_slots, dtype=bool)
    type_ok = type_allowed(state, req) if has_type and req.num_gpu else np.ones(n_slots, dtype=bool)
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
