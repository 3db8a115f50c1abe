"""The ``replay`` protocol: pods arrive at their ``creation_time`` and leave at their ``deletion_time``.

Event-driven (a heap of arrivals and deletions; at equal times deletions go before arrivals). A pod
that fits nowhere on arrival waits in a pending queue, ordered by ``priority`` (higher first) and
then by arrival (FIFO), and is retried whenever resources are released: after all deletions at one
instant are processed, one retry pass walks the queue in that order before the next arrival. A pod
still pending when its ``deletion_time`` comes fails (it never ran) with the last unschedulable
reason seen for it. Pods without a ``deletion_time`` stay (running or pending) until the end; pods
without a ``creation_time`` are rejected (use the inflation protocol, :mod:`gpupool.sim.inflation`,
for traces without times such as openb ``multigpu50``).

Retry passes are exact and cheap. Feasibility is monotone (placing a pod never makes another fit),
so between two releases a pending pod that did not fit still does not, and after a release it can
fit only on a node that released something. A pass therefore tests each pending request class
(:meth:`EffectiveRequest.key`) against the released nodes only, calls the engine only for a class
that now fits there, and stops trying a class for the rest of the pass as soon as one of its pods
does not fit: other pods of the same class would not fit either. The result is the same as retrying
every pending pod, with one pass per release instant.

The run records, at every event instant, the GPU allocation ratio (milli-GPU asked for by running
pods / cluster capacity) and the number of pending pods; the stored curve is downsampled to at most
:data:`MAX_POINTS` points, while ``mean_allocation`` and ``peak_allocation`` are computed from the full
curve.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.core import Engine, Policy
from gpupool.engine.filters import EffectiveRequest, feasible
from gpupool.metrics import ClusterMetrics, cluster_metrics
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy

MAX_POINTS = 2000
"""Most points kept in the recorded curves (``times``, ``allocation``, ``pending``)."""

PROGRESS_EVERY = 250
"""``progress`` is called every this many events (and after the last one)."""

# event kinds: at equal times a deletion (0) sorts before an arrival (1)
_DELETE = 0
_ARRIVE = 1

# pod states
_NOT_ARRIVED = 0
_PENDING = 1
_RUNNING = 2
_FINISHED = 3
_FAILED = 4


@dataclass
class ReplayResult:
    """One policy's run under the replay protocol.

    * ``times`` (s), ``allocation`` (0..1, requested milli-GPU of running pods / capacity) and
      ``pending`` (pods waiting) after each event instant, downsampled to at most :data:`MAX_POINTS`.
    * ``failed``: pods whose ``deletion_time`` came while they were still pending, in that order, as
      dicts ``pod, reason, time`` (the deletion time, s) plus ``creation_time``, ``num_gpu``, ``gpu_milli``.
    * ``pending_times`` (s): ``start - creation_time`` of every pod that started (0 for a pod placed
      on arrival), in order of start.
    * ``metrics``: the cluster just after the last arrival event (or where the run stopped, if
      ``max_events`` cut it short before then).
    * ``decisions``: ``Engine.place`` calls; ``decision_seconds``: the time spent in them.
    * ``n_finished``, ``n_running``, ``n_pending``, ``n_not_arrived`` describe every pod at the end of
      the run; with ``len(failed)`` they add up to ``n_pods``. ``n_running``/``n_pending`` are pods
      without a ``deletion_time`` (or, when ``truncated``, pods whose deletion had not come yet).
    * ``state``: the final cluster state (not part of :meth:`to_dict`).
    """

    policy: str
    seed: int
    n_pods: int
    times: np.ndarray
    allocation: np.ndarray
    pending: np.ndarray
    failed: list[dict] = field(default_factory=list)
    pending_times: np.ndarray = field(default_factory=lambda: np.empty(0))
    metrics: ClusterMetrics | None = None
    decisions: int = 0
    decision_seconds: float = 0.0
    n_finished: int = 0
    n_running: int = 0
    n_pending: int = 0
    still_pending: list[dict] = field(default_factory=list)
    """Pods never placed and still waiting at the end (no deletion_time), with their last reason."""
    n_not_arrived: int = 0
    events: int = 0
    truncated: bool = False
    state: ClusterState | None = field(default=None, repr=False, compare=False)
    _mean_allocation: float | None = field(default=None, repr=False)
    _peak_allocation: float | None = field(default=None, repr=False)

    @property
    def n_failed(self) -> int:
        return len(self.failed)

    @property
    def decisions_per_second(self) -> float:
        return self.decisions / self.decision_seconds if self.decision_seconds > 0 else float("nan")

    @property
    def mean_pending_s(self) -> float:
        """Mean wait (s) of the pods that started (NaN if none did)."""
        return float(self.pending_times.mean()) if len(self.pending_times) else float("nan")

    @property
    def p95_pending_s(self) -> float:
        """95th percentile wait (s) of the pods that started (NaN if none did)."""
        return float(np.percentile(self.pending_times, 95)) if len(self.pending_times) else float("nan")

    @property
    def mean_allocation(self) -> float:
        """Time-weighted mean GPU allocation between the first and the last event (NaN if no event)."""
        if self._mean_allocation is not None:
            return self._mean_allocation
        return _time_weighted_mean(self.times, self.allocation)

    @property
    def peak_allocation(self) -> float:
        """Highest GPU allocation reached at any event (NaN if no event)."""
        if self._peak_allocation is not None:
            return self._peak_allocation
        return float(self.allocation.max()) if len(self.allocation) else float("nan")

    def to_dict(self) -> dict:
        """JSON-ready summary and curves (NaN becomes ``None``; the cluster state is left out)."""
        out = {
            "protocol": "replay",
            "policy": self.policy,
            "seed": self.seed,
            "n_pods": self.n_pods,
            "n_finished": self.n_finished,
            "n_failed": self.n_failed,
            "n_running": self.n_running,
            "n_pending": self.n_pending,
            "n_not_arrived": self.n_not_arrived,
            "events": self.events,
            "truncated": self.truncated,
            "decisions": self.decisions,
            "decision_seconds": self.decision_seconds,
            "decisions_per_second": self.decisions_per_second,
            "mean_pending_s": self.mean_pending_s,
            "p95_pending_s": self.p95_pending_s,
            "mean_allocation": self.mean_allocation,
            "peak_allocation": self.peak_allocation,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "times": [float(x) for x in self.times],
            "allocation": [float(x) for x in self.allocation],
            "pending": [int(x) for x in self.pending],
            "pending_times": [float(x) for x in self.pending_times],
            "failed": [dict(f) for f in self.failed],
        }
        return _json_clean(out)


def _json_clean(value):
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, dict):
        return {k: _json_clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_clean(v) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return _json_clean(float(value))
    return value


def _time_weighted_mean(times: np.ndarray, values: np.ndarray) -> float:
    """Mean of a step function (``values[i]`` holds from ``times[i]`` to ``times[i+1]``)."""
    if len(values) == 0:
        return float("nan")
    span = float(times[-1] - times[0])
    if span <= 0:
        return float(values[-1])
    return float(np.dot(values[:-1], np.diff(times)) / span)


def _downsample(n: int, max_points: int = MAX_POINTS) -> np.ndarray:
    """Indices of at most ``max_points`` evenly spaced points of ``n``, first and last included."""
    if n <= max_points:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, max_points).round().astype(np.int64))


def _check_pods(pods: Sequence[PodRequest]) -> None:
    seen: set[str] = set()
    missing = [p.name for p in pods if p.creation_time is None]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(
            f"pod {missing[0]} has no creation_time{more}; the replay protocol needs arrival times "
            "(use the inflation protocol for traces without times)"
        )
    for p in pods:
        if p.name in seen:
            raise ValueError(f"duplicate pod name {p.name!r}")
        seen.add(p.name)
        if not math.isfinite(p.creation_time):
            raise ValueError(f"pod {p.name}: creation_time {p.creation_time} is not finite")
        if p.deletion_time is not None:
            if not math.isfinite(p.deletion_time):
                raise ValueError(f"pod {p.name}: deletion_time {p.deletion_time} is not finite (use None)")
            if p.deletion_time < p.creation_time:
                raise ValueError(
                    f"pod {p.name}: deletion_time {p.deletion_time:g} s before creation_time {p.creation_time:g} s"
                )


def run_replay(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], policy: str | Policy,
               seed: int = 42, progress: Callable[[int, int], None] | None = None,
               max_events: int | None = None) -> ReplayResult:
    """Replay ``pods`` on a fresh cluster of ``nodes`` with one policy and seed.

    ``pods`` is also the typical workload FGD-style policies learn from. ``max_events`` stops the run
    after that many events (arrivals and deletions; ``truncated`` is then set). ``progress(done, total)``
    is called every :data:`PROGRESS_EVERY` events and after the last one.

    Raises ValueError for a pod without a (finite) ``creation_time``, a ``deletion_time`` before the
    ``creation_time``, a duplicate pod name, or a negative ``max_events``.
    """
    _check_pods(pods)
    if max_events is not None and max_events < 0:
        raise ValueError(f"max_events must be >= 0, got {max_events}")
    state = ClusterState(nodes)
    pol = make_policy(policy) if isinstance(policy, str) else policy
    engine = Engine(state, pol, seed=seed, workload=pods)
    filters = pol.filters
    n = len(pods)
    capacity = float(state.total_gpu_milli)

    status = np.zeros(n, dtype=np.int8)
    class_of: list[tuple | None] = [None] * n
    queues: dict[tuple, list[tuple[int, int, int]]] = {}  # class -> heap of (-priority, arrival, pod)
    class_eff: dict[tuple, EffectiveRequest] = {}  # class -> an EffectiveRequest of it
    class_reason: dict[tuple, str] = {}  # class -> last unschedulable reason
    pending_times: list[float] = []
    failed: list[dict] = []
    decisions = 0
    spent = 0.0
    if kernels.enabled():
        kernels.warm_up()  # compiled (or loaded from numba's cache) now: decision_seconds times decisions only
    held = 0
    n_pending = 0
    n_running = 0
    n_finished = 0
    arrivals = 0
    arrival_seq = 0
    released: set[int] = set()
    metrics: ClusterMetrics | None = None

    events: list[tuple[float, int, int, int]] = [(float(p.creation_time), _ARRIVE, i, i) for i, p in enumerate(pods)]
    heapq.heapify(events)
    seq = n
    total_events = n + sum(1 for p in pods if p.deletion_time is not None)
    if max_events is not None:
        total_events = min(total_events, max_events)

    rec_t: list[float] = []
    rec_a: list[float] = []
    rec_p: list[int] = []

    def place(i: int, now: float) -> str:
        """Try pod ``i``; on success mark it running and return ``""``, else return the reason."""
        nonlocal decisions, spent, held, n_running
        pod = pods[i]
        t0 = time.perf_counter()
        decision = engine.place(pod)
        spent += time.perf_counter() - t0
        decisions += 1
        if decision.assignment is None:
            return decision.reason or "unschedulable"
        status[i] = _RUNNING
        n_running += 1
        held += pod.total_gpu_milli
        pending_times.append(now - float(pod.creation_time))
        return ""

    def retry_pass(now: float) -> None:
        """One pass over the pending queue after releases on the nodes in ``released``."""
        nonlocal n_pending
        nodes_arr = np.fromiter(sorted(released), dtype=np.int64, count=len(released))
        released.clear()
        merge: list[tuple[int, int, tuple]] = []
        for key in list(queues):
            q = queues[key]
            while q and status[q[0][2]] != _PENDING:
                heapq.heappop(q)
            if not q:
                del queues[key]
                continue
            merge.append((q[0][0], q[0][1], key))
        heapq.heapify(merge)
        while merge:
            _, _, key = heapq.heappop(merge)
            # a class that did not fit anywhere before these releases can fit only on a released node
            if not feasible(state, class_eff[key], nodes_arr, filters).any():
                continue
            q = queues[key]
            i = q[0][2]
            reason = place(i, now)
            if reason:
                class_reason[key] = reason
                continue
            heapq.heappop(q)
            n_pending -= 1
            while q and status[q[0][2]] != _PENDING:
                heapq.heappop(q)
            if q:
                heapq.heappush(merge, (q[0][0], q[0][1], key))
            else:
                del queues[key]

    done = 0
    truncated = False
    while events:
        if max_events is not None and done >= max_events:
            truncated = True
            break
        now, kind, _, i = heapq.heappop(events)
        done += 1
        pod = pods[i]
        if kind == _ARRIVE:
            arrivals += 1
            reason = place(i, now)
            if reason:
                eff = pol.effective(pod)
                key = eff.key()
                class_of[i] = key
                class_reason[key] = reason
                if key not in queues:
                    queues[key] = []
                    class_eff[key] = eff
                heapq.heappush(queues[key], (-pod.priority, arrival_seq, i))
                status[i] = _PENDING
                n_pending += 1
            arrival_seq += 1
            if pod.deletion_time is not None:
                heapq.heappush(events, (float(pod.deletion_time), _DELETE, seq, i))
                seq += 1
            if arrivals == n:
                metrics = cluster_metrics(state, pods)
        else:
            st = status[i]
            if st == _RUNNING:
                assignment = engine.release(pod.name)
                released.add(assignment.node)
                held -= pod.total_gpu_milli
                status[i] = _FINISHED
                n_running -= 1
                n_finished += 1
            elif st == _PENDING:
                status[i] = _FAILED
                n_pending -= 1
                failed.append({
                    "pod": pod.name, "reason": class_reason[class_of[i]], "time": now,
                    "creation_time": float(pod.creation_time), "num_gpu": pod.num_gpu,
                    "gpu_milli": pod.gpu_milli,
                })
        if released and n_pending and not (events and events[0][0] == now and events[0][1] == _DELETE):
            retry_pass(now)
        elif released and not n_pending:
            released.clear()
        alloc = held / capacity if capacity else 0.0
        if rec_t and rec_t[-1] == now:
            rec_a[-1] = alloc
            rec_p[-1] = n_pending
        else:
            rec_t.append(now)
            rec_a.append(alloc)
            rec_p.append(n_pending)
        if progress is not None and (done % PROGRESS_EVERY == 0 or not events or done == total_events):
            progress(done, total_events)

    if metrics is None:
        metrics = cluster_metrics(state, pods)
    times = np.array(rec_t, dtype=np.float64)
    allocation = np.array(rec_a, dtype=np.float64)
    pending = np.array(rec_p, dtype=np.int64)
    mean_alloc = _time_weighted_mean(times, allocation)
    peak = float(allocation.max()) if len(allocation) else float("nan")
    keep = _downsample(len(times))
    still_pending = [{"pod": pods[i].name, "reason": class_reason.get(class_of[i], "unschedulable"),
                      "creation_time": pods[i].creation_time, "num_gpu": pods[i].num_gpu,
                      "gpu_milli": pods[i].gpu_milli}
                     for i in np.flatnonzero(status == _PENDING)]
    return ReplayResult(
        still_pending=still_pending,
        policy=pol.name, seed=seed, n_pods=n,
        times=times[keep], allocation=allocation[keep], pending=pending[keep],
        failed=failed, pending_times=np.array(pending_times, dtype=np.float64), metrics=metrics,
        decisions=decisions, decision_seconds=spent,
        n_finished=n_finished, n_running=n_running, n_pending=n_pending, n_not_arrived=n - arrivals,
        events=done, truncated=truncated, state=state,
        _mean_allocation=mean_alloc, _peak_allocation=peak,
    )


__all__ = ["MAX_POINTS", "ReplayResult", "run_replay"]
