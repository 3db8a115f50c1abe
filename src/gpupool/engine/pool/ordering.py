"""Order of jobs within a queue: FIFO, or Tiresias' discretized two-dimensional least attained service.

* :class:`FifoOrder`: by submission time (then submission sequence).
* :class:`TiresiasOrder`: Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning",
  USENIX NSDI 2019, Sec. 4 (2D-LAS with discretized priority queues). A job's *attained service* is
  GPUs x seconds it has run (the "2D" of 2D-LAS: spatial and temporal size); it needs no knowledge of the
  job's length. Jobs sit in ``K = len(thresholds) + 1`` priority levels: level ``k`` holds jobs whose
  attained service lies in ``[thresholds[k-1], thresholds[k])`` GPU-seconds; a job starts at level 0 and
  is demoted as it runs. Lower levels go first; within a level, FIFO by submission (the paper's choice,
  which bounds the preemptions a job can suffer). Starvation: a job whose current wait exceeds
  ``promote_knob`` x the time it has run so far (and at least ``promote_min_s``) goes back to level 0
  (the paper's PROMOTEKNOB, which compares the wait with the job's executed time: a job that has run
  for hours must wait many hours, so big jobs do not take turns every few minutes).

  Default thresholds ``(3600, 36000)`` GPU-seconds (one GPU-hour and ten): the paper's evaluation uses
  two queues with a threshold found by a sweep; reimplementations on the Philly/Helios traces use one
  threshold of 18,000 GPU-seconds (5 GPU-hours; Hu et al., "Characterization and Prediction of Deep
  Learning Workloads in Large-Scale GPU Datacenters", SC'21, artifact ``tiresias.py``). Two thresholds
  around that value separate the many short Philly jobs (median 1,144 s on one GPU) from the long tail.

Keys are tuples; a smaller key runs first. Both orders are pure functions of the job's fields.
:mod:`gpupool.engine.pool.gittins` adds Tiresias-G (Gittins index within these levels), whose keys also
depend on the job sizes learned so far.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Protocol

__all__ = ["DEFAULT_THRESHOLDS", "ORDERS", "SIZE_ORDERS", "FifoOrder", "JobOrder", "TiresiasOrder"]

DEFAULT_THRESHOLDS: tuple[float, ...] = (3600.0, 36000.0)
"""Tiresias level boundaries, GPU-seconds of attained service."""


class JobOrder(Protocol):
    name: str
    preemptive: bool

    def level(self, attained_gpu_s: float) -> int: ...

    def next_boundary(self, attained_gpu_s: float) -> float: ...


class FifoOrder:
    """First in, first out: one level; never preempts for order's sake."""

    name = "fifo"
    preemptive = False

    def level(self, attained_gpu_s: float) -> int:
        return 0

    def next_boundary(self, attained_gpu_s: float) -> float:
        return math.inf


class TiresiasOrder:
    """Discretized 2D-LAS (see the module docstring).

    ``thresholds``: increasing GPU-second boundaries between levels. ``promote_knob``: a waiting job whose
    wait exceeds ``promote_knob`` x its last run goes back to level 0 (``None`` disables promotion).
    Raises ValueError for non-increasing or non-positive thresholds.
    """

    name = "tiresias"
    preemptive = True

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, promote_knob: float | None = 8.0,
                 promote_min_s: float = 600.0) -> None:
        t = tuple(float(x) for x in thresholds)
        if any(x <= 0 for x in t) or any(b <= a for a, b in zip(t, t[1:], strict=False)):
            raise ValueError(f"Tiresias thresholds must be positive and increasing, got {thresholds}")
        self.thresholds = t
        self.promote_knob = promote_knob
        self.promote_min_s = promote_min_s

    def level(self, attained_gpu_s: float) -> int:
        """Priority level (0 = highest) of a job that has attained ``attained_gpu_s`` GPU-seconds."""
        return bisect.bisect_right(self.thresholds, attained_gpu_s)

    def next_boundary(self, attained_gpu_s: float) -> float:
        """Attained service (GPU-s) at which the job drops a level (inf at the last level)."""
        i = bisect.bisect_right(self.thresholds, attained_gpu_s)
        return self.thresholds[i] if i < len(self.thresholds) else math.inf

    def promoted(self, waited_s: float, run_s: float) -> bool:
        """True when a job that has waited ``waited_s`` after running ``run_s`` seconds in all goes back to
        level 0."""
        if self.promote_knob is None or run_s <= 0:
            return False
        return waited_s >= max(self.promote_knob * run_s, self.promote_min_s)


ORDERS = ("fifo", "tiresias", "gittins", "remaining")
"""Job order names :func:`make_order` knows (``las`` is an alias of ``tiresias``)."""
SIZE_ORDERS = ("gittins", "remaining")
"""Orders that rank jobs by their expected size (learned online, or from a size prior)."""
