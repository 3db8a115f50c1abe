"""Node and GPU failures for the simulator, and the checkpoint arithmetic of a restarted job.

Failure process (:class:`FailureModel`): each node, and each GPU of each node, alternates between *up* and
*down*. Up times are exponential (a Poisson failure process, the usual memoryless model) with mean
``node_mtbf_h`` / ``gpu_mtbf_h`` hours; a failed node or GPU comes back after ``repair_h`` hours (fixed, or
exponential with that mean). ``mtbf`` here is the mean *up* time (time from a repair to the next
failure); successive failures of one component are ``mtbf + repair`` apart on average. ``None`` disables
that kind of failure.

Node failures and GPU failures are independent processes; a GPU can be used only while both it and its
node are up. :class:`HealthTracker` replays the events and reports exactly that.

Reproducibility: every component draws from its own NumPy ``Generator`` seeded from
``SeedSequence([seed, node, gpu_slot])``, so the events of node ``i`` depend on the seed and on node ``i``
alone, not on how many other nodes the cluster has or in which order they are generated.

Typical figures (to choose ``*_mtbf_h``; none is built in):

* Meta's Llama 3 report (Llama Team, "The Llama 3 Herd of Models", arXiv 2407.21783, 2024, reliability section): 466 job
  interruptions in a 54-day snapshot of pre-training on 16,384 H100 GPUs (2,048 8-GPU nodes); 419 were
  unexpected, about 78 % of them hardware; faulty GPUs (148) and GPU HBM3 memory (72) were the largest
  causes. That is one unexpected interruption per 2,048 x 54 x 24 / 419 ~ 6,300 node-hours
  (:data:`LLAMA3_NODE_MTBF_H`) and one GPU/HBM3 failure per 16,384 x 54 x 24 / 220 ~ 96,500 GPU-hours
  (:data:`LLAMA3_GPU_MTBF_H`).
* Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning Research Clusters" (Meta FAIR,
  arXiv 2410.21680, HPCA 2025) analyse 11 months of two A100 clusters (over 150 million GPU-hours, 4 million
  jobs), express failures as a rate per node-day and fit the mean time to failure of a job as a function of
  its GPU count; use it to check the rate above against a research-cluster workload.

Checkpoint arithmetic: a job that checkpoints every ``interval`` seconds of progress and fails after
``progress`` seconds restarts from the last checkpoint, :func:`restart_point`, losing :func:`work_lost`.
:func:`young_daly_interval` gives the usual first-order optimal interval.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from gpupool.model import NodeSpec

__all__ = [
    "EVENT_KINDS",
    "LLAMA3_GPU_MTBF_H",
    "LLAMA3_NODE_MTBF_H",
    "FailureEvent",
    "FailureModel",
    "HealthTracker",
    "job_mtbf_h",
    "restart_point",
    "work_lost",
    "young_daly_interval",
]

EventKind = Literal["node_fail", "node_repair", "gpu_fail", "gpu_repair"]

EVENT_KINDS: tuple[str, ...] = ("node_fail", "node_repair", "gpu_fail", "gpu_repair")

_KINDS = frozenset(EVENT_KINDS)

LLAMA3_NODE_MTBF_H: float = 2048 * 54 * 24 / 419
"""~6,335 h: node-hours per unexpected interruption in Meta's Llama 3 pre-training snapshot (see module doc)."""

LLAMA3_GPU_MTBF_H: float = 16384 * 54 * 24 / (148 + 72)
"""~96,500 h: GPU-hours per faulty-GPU or HBM3 interruption in the same snapshot (see module doc)."""

_SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class FailureEvent:
    """One failure or repair at ``time_s`` (seconds from the start of the simulation).

    ``node`` is the node's index in the list given to :meth:`FailureModel.events`; ``gpu`` the device index
    on that node for ``gpu_*`` events, ``None`` for ``node_*`` events. :meth:`sort_key` orders by time,
    then node, then GPU (the node's own events before its GPUs').
    """

    time_s: float
    kind: EventKind
    node: int
    gpu: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"unknown failure event kind {self.kind!r} (known: {', '.join(EVENT_KINDS)})")
        if self.kind.startswith("gpu") == (self.gpu is None):
            raise ValueError(f"{self.kind} event needs gpu {'set' if self.gpu is None else 'None'}")

    def sort_key(self) -> tuple[float, int, int]:
        return (self.time_s, self.node, -1 if self.gpu is None else self.gpu)

    @property
    def is_failure(self) -> bool:
        return self.kind.endswith("_fail")


@dataclass(frozen=True, slots=True)
class FailureModel:
    """Exponential failures of nodes and GPUs, fixed (or exponential) repair times; see the module doc.

    * ``node_mtbf_h``: mean up time of a node, hours (``None``: nodes never fail);
    * ``gpu_mtbf_h``: mean up time of one GPU, hours (``None``: GPUs never fail on their own);
    * ``repair_h``: hours from a failure to its repair (>= 0);
    * ``seed``: seed of the random streams;
    * ``repair_dist``: ``"fixed"`` (every repair takes ``repair_h``) or ``"exponential"`` (mean ``repair_h``).
    """

    node_mtbf_h: float | None
    gpu_mtbf_h: float | None
    repair_h: float
    seed: int
    repair_dist: Literal["fixed", "exponential"] = "fixed"

    def __post_init__(self) -> None:
        for name in ("node_mtbf_h", "gpu_mtbf_h"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive finite number of hours or None, got {value!r}")
        if not (self.repair_h >= 0 and math.isfinite(self.repair_h)):
            raise ValueError(f"repair_h must be >= 0 hours, got {self.repair_h!r}")
        if self.repair_dist not in ("fixed", "exponential"):
            raise ValueError(f"repair_dist must be 'fixed' or 'exponential', got {self.repair_dist!r}")

    def _rng(self, node: int, slot: int) -> np.random.Generator:
        # slot 0: the node itself; slot g + 1: its GPU g.
        return np.random.default_rng(np.random.SeedSequence([self.seed, node, slot]))

    def _component(self, rng: np.random.Generator, mtbf_h: float, horizon_s: float) -> list[tuple[float, float]]:
        """(fail time, repair time) pairs, seconds, for every failure before ``horizon_s``."""
        mean_up = mtbf_h * _SECONDS_PER_HOUR
        repair = self.repair_h * _SECONDS_PER_HOUR
        out: list[tuple[float, float]] = []
        t = 0.0
        while True:
            t += float(rng.exponential(mean_up))
            if t >= horizon_s:
                return out
            down = float(rng.exponential(repair)) if self.repair_dist == "exponential" and repair > 0 else repair
            out.append((t, t + down))
            t += down

    def events(self, nodes: Sequence[NodeSpec], horizon_s: float) -> list[FailureEvent]:
        """Every failure in ``[0, horizon_s)`` and its repair, sorted by :meth:`FailureEvent.sort_key`.

        Events of one component that fall at the same instant (a zero ``repair_h``) stay in their causal
        order: the failure before its repair (the sort is stable over events generated in time order).

        A failure inside the horizon always comes with its repair event, even when the repair falls after
        ``horizon_s``, so that replaying the list never leaves a component down for good. GPU failures are
        drawn for ``range(node.gpu_count)`` of each node.

        Raises ValueError for a negative or non-finite horizon.
        """
        if not (horizon_s >= 0 and math.isfinite(horizon_s)):
            raise ValueError(f"horizon_s must be a finite number >= 0, got {horizon_s!r}")
        out: list[FailureEvent] = []
        for i, spec in enumerate(nodes):
            if self.node_mtbf_h is not None:
                for fail, repair in self._component(self._rng(i, 0), self.node_mtbf_h, horizon_s):
                    out.append(FailureEvent(fail, "node_fail", i))
                    out.append(FailureEvent(repair, "node_repair", i))
            if self.gpu_mtbf_h is not None:
                for g in range(spec.gpu_count):
                    for fail, repair in self._component(self._rng(i, g + 1), self.gpu_mtbf_h, horizon_s):
                        out.append(FailureEvent(fail, "gpu_fail", i, g))
                        out.append(FailureEvent(repair, "gpu_repair", i, g))
        out.sort(key=FailureEvent.sort_key)
        return out

    def expected_failures(self, nodes: Sequence[NodeSpec], horizon_s: float) -> float:
        """Rough expected number of failures within ``horizon_s`` (ignoring the time spent in repair)."""
        hours = horizon_s / _SECONDS_PER_HOUR
        n = len(nodes) * hours / self.node_mtbf_h if self.node_mtbf_h else 0.0
        g = sum(s.gpu_count for s in nodes) * hours / self.gpu_mtbf_h if self.gpu_mtbf_h else 0.0
        return n + g


def job_mtbf_h(num_nodes: int, num_gpus: int, node_mtbf_h: float | None, gpu_mtbf_h: float | None) -> float:
    """Mean hours between interruptions of a job that needs all of ``num_nodes`` nodes and ``num_gpus`` GPUs.

    Independent exponential failures add their rates: ``1 / (num_nodes / node_mtbf + num_gpus / gpu_mtbf)``;
    ``math.inf`` when nothing can fail.
    """
    if num_nodes < 0 or num_gpus < 0:
        raise ValueError("num_nodes and num_gpus must be >= 0")
    rate = (num_nodes / node_mtbf_h if node_mtbf_h else 0.0) + (num_gpus / gpu_mtbf_h if gpu_mtbf_h else 0.0)
    return math.inf if rate == 0 else 1.0 / rate


class HealthTracker:
    """Replays failure events and tells which GPUs can be used (node up and GPU up).

        tracker = HealthTracker(nodes)
        for ev in events:
            for node, gpu, healthy in tracker.apply(ev):
                state.set_gpu_health(node, gpu, healthy)   # only the GPUs whose usability changed
    """

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        self.gpu_count = [s.gpu_count for s in nodes]
        self.node_up = [True] * len(nodes)
        self.gpu_up: list[list[bool]] = [[True] * s.gpu_count for s in nodes]

    def usable(self, node: int, gpu: int) -> bool:
        return self.node_up[node] and self.gpu_up[node][gpu]

    def apply(self, event: FailureEvent) -> list[tuple[int, int, bool]]:
        """Apply ``event``; return ``(node, gpu, usable)`` for each GPU whose usability changed.

        Raises ValueError for an event that contradicts the current state (e.g. a repair of a component
        that is up, or a GPU index the node does not have).
        """
        n = event.node
        if not 0 <= n < len(self.node_up):
            raise ValueError(f"event for node {n} outside 0..{len(self.node_up) - 1}")
        if event.gpu is not None and not 0 <= event.gpu < self.gpu_count[n]:
            raise ValueError(f"event for GPU {event.gpu} of node {n}, which has {self.gpu_count[n]} GPUs")
        before = [self.usable(n, g) for g in range(self.gpu_count[n])]
        if event.kind in ("node_fail", "node_repair"):
            want_up = event.kind == "node_repair"
            if self.node_up[n] == want_up:
                raise ValueError(f"{event.kind} of node {n}, which is already {'up' if want_up else 'down'}")
            self.node_up[n] = want_up
        else:
            g = event.gpu
            assert g is not None
            want_up = event.kind == "gpu_repair"
            if self.gpu_up[n][g] == want_up:
                raise ValueError(f"{event.kind} of GPU {g} on node {n}, which is already {'up' if want_up else 'down'}")
            self.gpu_up[n][g] = want_up
        return [(n, g, not was) for g, was in enumerate(before) if self.usable(n, g) != was]

    def apply_all(self, events: Iterable[FailureEvent]) -> None:
        for ev in events:
            self.apply(ev)

    def usable_gpus(self) -> int:
        return sum(self.usable(n, g) for n in range(len(self.node_up)) for g in range(self.gpu_count[n]))


# ------------------------------------------------------------------------------------------ checkpoints

_EPS = 1e-9


def _check_progress(progress_s: float) -> None:
    if not (progress_s >= 0 and math.isfinite(progress_s)):
        raise ValueError(f"progress must be a finite number of seconds >= 0, got {progress_s!r}")


def restart_point(progress_s: float, interval_s: float) -> float:
    """Progress (seconds) of the last checkpoint taken by a job at ``progress_s``, checkpointing every
    ``interval_s`` seconds of progress: ``floor(progress / interval) * interval``.

    ``interval_s`` <= 0 or infinite means no checkpoints: the job restarts from 0. A progress that is a
    multiple of the interval (within 1e-9 relative) counts as just checkpointed.
    """
    _check_progress(progress_s)
    if not (interval_s > 0 and math.isfinite(interval_s)):
        return 0.0
    k = math.floor(progress_s / interval_s * (1 + _EPS))
    return min(progress_s, k * interval_s)


def work_lost(progress_s_since_start: float, checkpoint_interval_s: float) -> float:
    """Seconds of progress a failure at ``progress_s_since_start`` throws away: the progress since the last
    checkpoint, ``progress - restart_point(progress, interval)`` (all of it without checkpoints)."""
    return progress_s_since_start - restart_point(progress_s_since_start, checkpoint_interval_s)


def young_daly_interval(checkpoint_cost_s: float, mtbf_s: float) -> float:
    """First-order optimal checkpoint interval ``sqrt(2 * C * M)`` for a checkpoint taking ``C`` seconds and
    a mean time between failures ``M`` (Young, CACM 1974; Daly, FGCS 2006, first-order term)."""
    if checkpoint_cost_s < 0 or mtbf_s <= 0:
        raise ValueError("checkpoint_cost_s must be >= 0 and mtbf_s > 0")
    return math.sqrt(2.0 * checkpoint_cost_s * mtbf_s)
