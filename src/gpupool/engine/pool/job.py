"""A job as the pool scheduler sees it: a gang (PodGroup) of identical pods in one leaf queue.

A job of ``N`` GPUs on nodes of at most ``G`` GPUs becomes ``n_pods`` pods of ``gpus_per_pod`` GPUs each
(:func:`split_gpus`), placed all or nothing (``minMember = n_pods``). An *elastic* job has
``min_pods <= n_pods <= max_pods``: it starts with at least ``min_pods`` (up to ``n_pods``), grows into
idle GPUs up to ``max_pods`` and shrinks back toward ``min_pods`` when others need the GPUs.

Priority follows KAI's classes: ``priority >= NONPREEMPTIBLE_PRIORITY`` (100: build 100, inference 125)
is non-preemptible; lower (train 50, or 0) is preemptible. The scheduler sets each job's threshold from its
config (``PoolConfig.nonpreemptible_priority``). Non-preemptible work runs only within the quota of each
queue on its path that has one; in a queue without a quota (0, the default queue) it takes free capacity.

Topology (KAI ``required``/``preferred``, Volcano ``hard``/``soft``): ``topology`` is ``"preferred"``
(default), ``"required"`` or ``"none"``; ``topology_tier`` the slowest tier the gang should cross
(``"nvlink"``, ``"node"`` or ``"switch"``; see :mod:`gpupool.topology`).

Units: GPUs, milli-CPU, MiB, seconds; attained service in GPU-seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpupool.model import Assignment, PodRequest

__all__ = ["NONPREEMPTIBLE_PRIORITY", "PoolJob", "split_gpus", "PENDING", "RUNNING", "DONE", "REMOVED"]

NONPREEMPTIBLE_PRIORITY = 100
"""Jobs at or above this priority are never preempted (KAI convention); the default of
``PoolConfig.nonpreemptible_priority``."""

PENDING, RUNNING, DONE, REMOVED = "pending", "running", "done", "removed"

_TOPOLOGY_MODES = ("preferred", "required", "none")
_TOPOLOGY_TIERS = ("nvlink", "node", "switch", "spine")


def split_gpus(num_gpu: int, gpus_per_node: int) -> tuple[int, int]:
    """``(n_pods, gpus_per_pod)`` for a job of ``num_gpu`` GPUs on nodes of ``gpus_per_node`` GPUs.

    The fewest equal pods of at most ``gpus_per_node`` GPUs whose sizes divide ``num_gpu`` (12 GPUs on
    8-GPU nodes: 2 pods of 6); if no equal split exists below ``num_gpu`` pods, one GPU per pod.
    Raises ValueError for ``num_gpu`` < 1 or ``gpus_per_node`` < 1.
    """
    if num_gpu < 1 or gpus_per_node < 1:
        raise ValueError(f"need num_gpu >= 1 and gpus_per_node >= 1, got {num_gpu}, {gpus_per_node}")
    for k in range(math.ceil(num_gpu / gpus_per_node), num_gpu + 1):
        if num_gpu % k == 0 and num_gpu // k <= gpus_per_node:
            return k, num_gpu // k
    return num_gpu, 1  # pragma: no cover - k = num_gpu always divides


@dataclass(eq=False, slots=True)
class PoolJob:
    """One job (gang). Fields above the line are the spec; the rest is the scheduler's bookkeeping.

    ``size_estimate``: the job's expected total service in GPU-seconds (a user's run-time estimate x GPUs,
    like a Slurm time limit); None: unknown. The Gittins and remaining orders rank a job that has one by its
    expected remaining service ``size_estimate - attained`` instead of the learned distribution, until it
    has attained its estimate (then by the distribution again: the estimate was too low). While no job size
    is known yet (nothing learned, no prior), estimates are not used: every job scores alike.

    Raises ValueError for an impossible spec (no pods, min > n > max, unknown topology mode or tier, a size
    estimate that is negative or not finite).
    """

    name: str
    queue: str
    gpus_per_pod: int
    n_pods: int
    submit_time: float
    priority: int = 0
    cpu_per_pod: int = 0
    mem_per_pod: int = 0
    min_pods: int = 0  # 0: n_pods (not elastic)
    max_pods: int = 0  # 0: n_pods
    topology: str = "preferred"
    topology_tier: str = "switch"
    size_estimate: float | None = None  # expected total service, GPU-seconds (see the class docstring)
    # ---- scheduler bookkeeping -------------------------------------------------------------
    status: str = PENDING
    q: int = -1  # leaf queue index
    seq: int = -1  # submission sequence (tie-break, unique)
    pods: list[PodRequest] = field(default_factory=list)
    placed: list[Assignment] = field(default_factory=list)
    attained: float = 0.0  # GPU-seconds of service before the current run (x service_rate, see below)
    service_rate: float = 1.0  # service counted per GPU-second run (1.0: GPU-seconds; a speed: reference work)
    las_base: float = 0.0  # attained service at the last Tiresias promotion (levels count from here)
    run_since: float = math.nan
    pending_since: float = math.nan
    last_run_s: float = 0.0
    run_s: float = 0.0  # seconds run in all (every run, every size)
    started_once: bool = False
    level: int = 0
    key: tuple = ()
    reason: str = ""
    preemptions: int = 0
    retry_at: float = -math.inf  # no victim search for this job before then (backoff after a failed one)
    protected_until: float = -math.inf  # not a victim before then (a driver could not evict it)
    evicted_at: float = -math.inf  # when it was last evicted
    backoff: float = 0.0
    nonpreemptible_from: int = NONPREEMPTIBLE_PRIORITY  # priority from which it is not preemptible (set on submit)
    pod_classes: tuple = ()  # the distinct requests of its first min_pods pods (PoolScheduler._pod_classes)

    def __post_init__(self) -> None:
        if self.n_pods < 1 or self.gpus_per_pod < 0:
            raise ValueError(f"job {self.name}: needs n_pods >= 1 and gpus_per_pod >= 0")
        if self.min_pods == 0:
            self.min_pods = self.n_pods
        if self.max_pods == 0:
            self.max_pods = self.n_pods
        if not 1 <= self.min_pods <= self.n_pods <= self.max_pods:
            raise ValueError(f"job {self.name}: need 1 <= min_pods <= n_pods <= max_pods, got "
                             f"{self.min_pods}, {self.n_pods}, {self.max_pods}")
        if self.topology not in _TOPOLOGY_MODES:
            raise ValueError(f"job {self.name}: topology {self.topology!r} not in {_TOPOLOGY_MODES}")
        if self.topology_tier not in _TOPOLOGY_TIERS:
            raise ValueError(f"job {self.name}: topology_tier {self.topology_tier!r} not in {_TOPOLOGY_TIERS}")
        if self.size_estimate is not None and not (math.isfinite(self.size_estimate) and self.size_estimate >= 0):
            raise ValueError(f"job {self.name}: size_estimate must be finite and >= 0 GPU-seconds, "
                             f"got {self.size_estimate}")

    @property
    def elastic(self) -> bool:
        return self.max_pods > self.min_pods

    @property
    def num_gpu(self) -> int:
        """GPUs of the job at its nominal size (``n_pods * gpus_per_pod``)."""
        return self.n_pods * self.gpus_per_pod

    @property
    def running_pods(self) -> int:
        return len(self.placed)

    @property
    def running_gpus(self) -> int:
        return len(self.placed) * self.gpus_per_pod

    @property
    def preemptible(self) -> bool:
        """May the job be evicted: its priority is below ``nonpreemptible_from`` (the scheduler's threshold)."""
        return self.priority < self.nonpreemptible_from

    def attained_at(self, now: float) -> float:
        """Service up to ``now`` (the current run included): GPU-seconds x ``service_rate`` (1.0 unless the
        scheduler's ``service_rate_of`` sets it, e.g. to the speed of the job's GPUs: work done)."""
        if self.status == RUNNING:
            return self.attained + self.running_gpus * self.service_rate * max(0.0, now - self.run_since)
        return self.attained

    def las_at(self, now: float) -> float:
        """Attained service counted for the Tiresias level: since the last promotion (GPU-seconds)."""
        return self.attained_at(now) - self.las_base

    def make_pods(self) -> None:
        """Create the ``max_pods`` pod requests ``<name>/<i>`` (once)."""
        if self.pods:
            return
        self.pods = [
            PodRequest(f"{self.name}/{i}", cpu_milli=self.cpu_per_pod, memory_mib=self.mem_per_pod,
                       num_gpu=self.gpus_per_pod, gpu_milli=1000 if self.gpus_per_pod else 0,
                       priority=self.priority)
            for i in range(self.max_pods)
        ]
