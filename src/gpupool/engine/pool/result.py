"""What one cycle of the pool scheduler decided: :class:`CycleResult`. Imports the job and the model only."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpupool.engine.pool.job import PoolJob
from gpupool.model import Assignment

__all__ = ["CycleResult"]


@dataclass
class CycleResult:
    """What one cycle decided, for the driver to carry out.

    * ``started``: jobs placed this cycle (``job.placed`` holds their pods' assignments);
    * ``preempted``: ``(job, reason)`` evicted back to their queue (reason names the action and preemptor);
    * ``resized``: ``(job, old_pods, new_pods)`` for elastic jobs that grew or shrank.
    * ``evictions``: ``(victim, pods given up, action, preemptor)`` for every eviction and shrink, in order,
      ``action`` one of ``reclaimed``, ``preempted``, ``consolidated``, ``shrunk``: what a driver that must
      carry evictions out one preemptor at a time (Kubernetes) groups by preemptor.
    """

    now: float
    started: list[PoolJob] = field(default_factory=list)
    preempted: list[tuple[PoolJob, str]] = field(default_factory=list)
    resized: list[tuple[PoolJob, int, int]] = field(default_factory=list)
    evictions: list[tuple[PoolJob, list[Assignment], str, PoolJob | None]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.started or self.preempted or self.resized)
