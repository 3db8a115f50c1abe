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

Layout: this package is the loader (:func:`enabled`, :func:`warm_up`, :data:`SIGNATURES`); the kernels are in
:mod:`.filters`, :mod:`.fgd` and :mod:`.fairshare`, each marked in its module (:mod:`.registry`). The FGD scorer
and its fingerprints are in the FGD policy's ``fgd_compiled`` module, the fair-share dispatch is in
:mod:`gpupool.engine.pool.fairshare`. Imports no policy and no pool code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys

from gpupool.engine.kernels import fairshare, fgd, filters  # noqa: F401 - every kernel module registers its kernels
from gpupool.engine.kernels.registry import KERNELS


def _disabled() -> bool:
    return os.environ.get("GPUPOOL_NO_NUMBA", "") not in ("", "0")


AVAILABLE = importlib.util.find_spec("numba") is not None and not _disabled()
"""True when numba is installed and not disabled (``GPUPOOL_NO_NUMBA=1``); it is imported on first use."""

_loaded: bool | None = None


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

                wrapped: dict[str, dict[str, object]] = {}  # kernel module -> kernel name -> compiled kernel
                cached = True
                for module, names in KERNELS.items():
                    g = vars(sys.modules[module])
                    own = wrapped[module] = {}
                    for name in names:
                        try:
                            own[name] = numba.njit(cache=cached, nogil=True, boundscheck=False)(g[name])
                        except RuntimeError as exc:  # numba: "cannot cache function ...: no locator available"
                            if not cached or "cannot cache" not in str(exc):
                                raise
                            log.warning("numba has no writable cache location (%s); the engine's kernels compile "
                                        "in this process and are not kept: set NUMBA_CACHE_DIR to a writable "
                                        "directory", exc)
                            cached = False
                            own[name] = numba.njit(cache=False, nogil=True, boundscheck=False)(g[name])
            except Exception as exc:  # numba unusable here (a broken install, a bad NUMBA_* setting): NumPy only
                log.warning("the engine's compiled kernels are off, decisions use NumPy only (same decisions, "
                            "slower): %s: %s", type(exc).__name__, exc)
                return False
            for module, own in wrapped.items():  # all kernels at once, or none
                g = vars(sys.modules[module])  # kernels calling kernels find the compiled ones in their module's
                plain = {id(g[name]): kernel for name, kernel in own.items()}  # globals, under their names and
                g.update({k: plain[id(v)] for k, v in g.items() if id(v) in plain})  # their public aliases
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

        done: dict[str, float] = {}
        for name, spec in SIGNATURES.items():
            t0 = time.perf_counter()
            try:
                kernel(name).compile(kernel_types(spec))
            except Exception as exc:  # a SIGNATURES entry out of step with its kernel: say which
                raise RuntimeError(f"warm-up of kernel {name} ({spec!r}) failed: {exc}") from exc
            done[name] = time.perf_counter() - t0
        _warm = done
    return dict(_warm)


def kernel(name: str):
    """The kernel ``name`` (as :data:`SIGNATURES` names it) as it is called now: compiled once :func:`enabled`
    wrapped it, else the Python function; raises KeyError for a name no kernel module registered."""
    for module, names in KERNELS.items():
        if name in names:
            return vars(sys.modules[module])[name]
    raise KeyError(f"no kernel {name!r}")


def source_hash(*objs) -> str:
    """The hash of the source of ``objs``, which a kernel copying Python code pins (a fingerprint)."""
    h = hashlib.sha256()
    for obj in objs:
        h.update(inspect.getsource(obj).encode())
    return h.hexdigest()[:16]
