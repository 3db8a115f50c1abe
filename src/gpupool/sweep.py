"""Parallel what-if sweeps: the (policy, seed) runs of ``gpupool compare`` on the local cores or on a Ray cluster.

Each run is a pure function of its (policy, seed) and the inputs the caller closed over (every run builds its
own cluster state and scheduler from them), so running them in other processes gives the same results as a
serial loop; :func:`run_sweep` returns them in the order of ``items`` whatever order they finish in.

* ``executor="local"``: :class:`concurrent.futures.ProcessPoolExecutor` with ``workers`` processes started
  by ``fork`` (the run function, usually a closure over the loaded trace and cluster, is inherited, not
  pickled; results come back pickled). Where ``fork`` is not available (Windows, macOS spawn default), or
  with one worker or one run, the runs go serially in this process.
* ``executor="ray"``: one Ray task per run on the cluster ``ray.init()`` connects to (``RAY_ADDRESS``, else a
  local one); Ray pickles the run function with cloudpickle. Ray is an optional extra
  (``pip install 'gpupool[ray]'``), imported only here; without it :class:`SweepError` says how to install it.

Progress: ``on_done(k, result)`` after each run finishes (k: its index in ``items``). Ctrl-C: pending runs are
cancelled and :class:`SweepInterrupted` carries the results of the longest finished prefix of ``items``
(what a serial loop would have had).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from typing import Any

__all__ = ["EXECUTORS", "SweepError", "SweepInterrupted", "default_workers", "run_sweep"]

EXECUTORS = ("local", "ray")

RunFn = Callable[[str, int, Callable[[int, int], None]], Any]
"""``run_one(policy, seed, tick)``: one run; ``tick(done, total)`` reports progress inside it (ignored in
worker processes)."""

_TASK: RunFn | None = None  # the run function of the sweep in progress (inherited by forked workers)


class SweepError(Exception):
    """A sweep cannot run as asked (unknown executor, Ray not installed)."""


class SweepInterrupted(Exception):  # noqa: N818 (an interruption, not an error)
    """Ctrl-C during a sweep; ``results``: the results of the longest finished prefix of the items."""

    def __init__(self, results: list[Any]) -> None:
        super().__init__(f"interrupted after {len(results)} runs")
        self.results = results


def default_workers() -> int:
    """The cores this process may use (``os.sched_getaffinity`` where available, else ``os.cpu_count``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover (not Linux)
        return max(1, os.cpu_count() or 1)


def _no_tick(done: int, total: int) -> None:
    return None


def _call(name: str, seed: int) -> Any:
    assert _TASK is not None
    return _TASK(name, seed, _no_tick)


def _ray_call(run_one: RunFn, name: str, seed: int) -> Any:
    return run_one(name, seed, _no_tick)


def _prefix(done: dict[int, Any], n: int) -> list[Any]:
    out = []
    for k in range(n):
        if k not in done:
            break
        out.append(done[k])
    return out


def run_sweep(items: Sequence[tuple[str, int]], run_one: RunFn, *, workers: int | None = None,
              executor: str = "local", on_done: Callable[[int, Any], None] | None = None) -> list[Any]:
    """``run_one(policy, seed, tick)`` for every ``(policy, seed)`` of ``items``; results in ``items`` order.

    ``workers``: processes (None: :func:`default_workers`; local executor only). An exception raised by a run
    is raised here (the first in ``items`` order among those that failed before the sweep stopped) after
    the pending runs are cancelled. Raises :class:`SweepError` for an unknown executor or a missing Ray,
    :class:`SweepInterrupted` on Ctrl-C.
    """
    if executor not in EXECUTORS:
        raise SweepError(f"unknown executor {executor!r}; known: {', '.join(EXECUTORS)}")
    if workers is not None and workers < 1:
        raise SweepError(f"workers must be >= 1, got {workers}")
    if executor == "ray":
        return _run_ray(items, run_one, on_done)
    n_workers = min(workers or default_workers(), len(items))
    if n_workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return _run_serial(items, run_one, on_done)
    global _TASK
    _TASK = run_one
    done: dict[int, Any] = {}
    pool = ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("fork"))
    try:
        futures = {pool.submit(_call, name, s): k for k, (name, s) in enumerate(items)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=futures.__getitem__):
                k = futures[fut]
                exc = fut.exception()
                if exc is not None:
                    for other in pending:
                        other.cancel()
                    raise exc
                done[k] = fut.result()
                if on_done is not None:
                    on_done(k, done[k])
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        raise SweepInterrupted(_prefix(done, len(items))) from None
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _TASK = None
    return [done[k] for k in range(len(items))]


def _run_serial(items: Sequence[tuple[str, int]], run_one: RunFn,
                on_done: Callable[[int, Any], None] | None) -> list[Any]:
    results: list[Any] = []
    try:
        for k, (name, s) in enumerate(items):
            results.append(run_one(name, s, _no_tick))
            if on_done is not None:
                on_done(k, results[-1])
    except KeyboardInterrupt:
        raise SweepInterrupted(results) from None
    return results


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise SweepError("--executor ray needs Ray, an optional extra: pip install 'gpupool[ray]' "
                         f"({exc})") from None
    return ray


def _run_ray(items: Sequence[tuple[str, int]], run_one: RunFn,
             on_done: Callable[[int, Any], None] | None) -> list[Any]:
    ray = _import_ray()
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS") or None, ignore_reinit_error=True,
                 log_to_driver=False)
    task = ray.remote(_ray_call)
    fn = ray.put(run_one)
    refs = {task.remote(fn, name, s): k for k, (name, s) in enumerate(items)}
    done: dict[int, Any] = {}
    pending = list(refs)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            for ref in ready:
                k = refs[ref]
                done[k] = ray.get(ref)
                if on_done is not None:
                    on_done(k, done[k])
    except KeyboardInterrupt:
        for ref in pending:
            ray.cancel(ref)
        raise SweepInterrupted(_prefix(done, len(items))) from None
    except Exception:
        for ref in pending:
            ray.cancel(ref)
        raise
    return [done[k] for k in range(len(items))]
