"""Moving running jobs to faster GPUs (issue 32 item 1): checkpoint a running job and restart it on a faster GPU
model when that pays, as Gavel gets by re-allocating every round (Narayanan et al., OSDI'20) but only when the
move is worth its restart.

At a scheduling cycle (each arrival and finish: a faster GPU frees up then), after the scheduler has placed what
it could, a running job of ``G`` pods on GPUs of speed ``s`` (its class's, :mod:`gpupool.sim.throughput`), with
``W`` reference-seconds of work left, moves to a model of speed ``v > s`` whose nodes have room for its whole
gang now (all or nothing), when

    restart_s + W / v  <  (1 - min_gain) x W / s

and it has run at least ``min_run_s`` since it last started (hysteresis: no thrash). The fastest such model is
planned; jobs with the most time to save go first, each moved before the next is planned. The move itself is the
scheduler's (:meth:`~gpupool.engine.pool.scheduler.PoolScheduler.move`): the job is checkpointed, its gang
released and placed again at once on nodes of that speed (all or nothing; where it no longer fits, back
where it was, counted as a move not to faster GPUs). The restart stalls it ``restart_s``; those GPU-seconds are
reported as lost to moves. The GPUs it left are free for the cycle that follows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MigrationConfig", "MoveCandidate", "plan_moves"]


@dataclass(frozen=True)
class MigrationConfig:
    """``restart_s``: stall of a moved job's restart (checkpoint save + load, container start), s;
    ``min_run_s``: least run since its last start before a job may move, s; ``min_gain``: least share of its
    remaining time a move must save (0..1). ValueError for a negative or non-finite figure, or min_gain >= 1."""

    restart_s: float = 120.0
    min_run_s: float = 1800.0
    min_gain: float = 0.1

    def __post_init__(self) -> None:
        for name in ("restart_s", "min_run_s", "min_gain"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"migration {name} must be a finite number >= 0, got {v!r}")
        if self.min_gain >= 1:
            raise ValueError(f"migration min_gain must be < 1, got {self.min_gain!r}")


@dataclass(frozen=True)
class MoveCandidate:
    """A running job as the planner sees it: ``key`` (the driver's handle), ``speed`` of its GPUs now,
    ``remaining_work`` reference-seconds, ``ran_s`` since its last start, ``pods`` / ``gpus_per_pod``, and
    ``node_speed`` (n_nodes,) its class's speed on each node."""

    key: object
    speed: float
    remaining_work: float
    ran_s: float
    pods: int
    gpus_per_pod: int
    node_speed: np.ndarray


def plan_moves(cands: Sequence[MoveCandidate], fits: Callable[[MoveCandidate], np.ndarray],
               cfg: MigrationConfig, move: Callable[[MoveCandidate, float], bool] | None = None
               ) -> list[tuple[object, float]]:
    """``[(key, target speed)]`` of the jobs moved now, the longest time saved first. ``fits(c)``: (n_nodes,)
    pods of ``c``'s shape each node could take now (the scheduler's ``fits_per_node``), asked again for each
    job, after the moves before it; ``move(c, v)``: carry the move out at once (True if the gang landed on
    speed ``v``), so that the next job sees the room it took and the room it left; None: plan only (every
    job against the same ``fits``)."""
    out: list[tuple[object, float]] = []
    ready = [c for c in cands if c.ran_s >= cfg.min_run_s and c.speed > 0 and c.remaining_work > 0]
    ready.sort(key=lambda c: -c.remaining_work / c.speed)
    for c in ready:
        faster = np.unique(c.node_speed[c.node_speed > c.speed])[::-1]
        if not len(faster):
            continue
        stay = c.remaining_work / c.speed
        f = None
        for v in faster.tolist():
            if cfg.restart_s + c.remaining_work / v >= (1.0 - cfg.min_gain) * stay:
                break  # slower levels save even less
            if f is None:
                f = fits(c)
            if int(f[c.node_speed == v].sum()) >= c.pods:
                if move is None or move(c, v):
                    out.append((c.key, v))
                break
    return out
