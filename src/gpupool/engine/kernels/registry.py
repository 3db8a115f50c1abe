"""The registry of the engine's numba kernels: :func:`jit` marks a kernel in its kernel module, and
:func:`gpupool.engine.kernels.enabled` compiles every marked kernel. Imports nothing of gpupool."""

from __future__ import annotations

KERNELS: dict[str, list[str]] = {}
"""The kernels of each kernel module: module name -> the names :func:`jit` marked in it, in order."""


def jit(fn):
    """Mark ``fn`` a kernel: compiled (``numba.njit``) by :func:`enabled` on first use, so that importing the
    engine does not import numba (a second at start-up)."""
    KERNELS.setdefault(fn.__module__, []).append(fn.__name__)
    return fn
