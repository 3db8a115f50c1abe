"""The ``inflation`` protocol of the FGD paper (Weng et al., USENIX ATC'23, Sec. 6.1, "workload
inflation"; artifact ``TunePodsByNodeTotalResource``).

The trace's pods are shuffled with the seed; then pods resampled from the trace (same seed) are
appended until the submitted GPU demand would pass ``ratio`` x cluster GPU capacity (or, for a trace
that already asks for more, random pods are removed until it no longer does). Pods are placed one at
a time and never leave; a pod that fits nowhere fails and is dropped. The run records, after every
pod, the arrived GPU demand and the GPU allocation, both as fractions of capacity.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.core import Engine, Policy
from gpupool.metrics import ClusterMetrics, cluster_metrics
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy

MAX_INFLATION_RATIO = 10.0
"""Largest inflation ratio (submitted GPU demand / cluster GPU capacity). The workload is built before the first
placement: at 10**9 x capacity that is billions of pod copies (a hang with memory growing); past a few x capacity
every further pod is refused anyway (the FGD paper stops at 1.3)."""


def build_inflation_workload(pods: Sequence[PodRequest], capacity_milli: int, ratio: float = 1.3,
                             seed: int = 0) -> list[PodRequest]:
    """Shuffle ``pods`` and resample (or thin) them until their GPU demand is about ``ratio`` x capacity.

    Resampled copies are named ``<name>-tuned-<i>``. Raises ValueError on an empty trace or a ratio outside
    (0, :data:`MAX_INFLATION_RATIO`].
    """
    if not pods:
        raise ValueError("the pod trace is empty")
    if not (math.isfinite(ratio) and 0 < ratio <= MAX_INFLATION_RATIO):
        raise ValueError(f"inflation ratio must be within (0, {MAX_INFLATION_RATIO:g}], got {ratio:g}")
    rng = np.random.default_rng(seed)
    out = [pods[i] for i in rng.permutation(len(pods))]
    target = ratio * capacity_milli
    total = sum(p.total_gpu_milli for p in out)
    if total > target:
        while total > target and out:
            victim = out.pop(int(rng.integers(len(out))))
            total -= victim.total_gpu_milli
        return out
    if not any(p.total_gpu_milli for p in pods):
        return out
    i = 0
    while True:
        pick = pods[int(rng.integers(len(pods)))]
        if total + pick.total_gpu_milli > target:
            break
        total += pick.total_gpu_milli
        out.append(replace(pick, name=f"{pick.name}-tuned-{i}"))
        i += 1
    return out


@dataclass
class InflationResult:
    """One policy's run under the inflation protocol.

    ``arrived`` and ``allocation`` are (n_pods,) float64 fractions of cluster GPU capacity after each
    pod: the GPU demand submitted so far, and the GPU share held by placed pods (what they asked for).
    """

    policy: str
    seed: int
    n_pods: int
    arrived: np.ndarray
    allocation: np.ndarray
    failed: list[dict] = field(default_factory=list)
    metrics: ClusterMetrics | None = None
    decision_seconds: float = 0.0

    @property
    def allocation_at_100(self) -> float:
        """GPU allocation when arrived demand first reaches 100% of capacity (NaN if it never does)."""
        hit = np.flatnonzero(self.arrived >= 1.0 - 1e-12)
        return float(self.allocation[hit[0]]) if len(hit) else float("nan")

    @property
    def first_failure_arrived(self) -> float:
        """Arrived demand (fraction of capacity) at the first failed pod (NaN if none failed)."""
        return self.failed[0]["arrived"] if self.failed else float("nan")

    @property
    def decisions_per_second(self) -> float:
        return self.n_pods / self.decision_seconds if self.decision_seconds > 0 else float("nan")


def run_inflation(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], policy: str | Policy,
                  seed: int = 42, ratio: float = 1.3,
                  progress: Callable[[int, int], None] | None = None) -> InflationResult:
    """Run one policy on one seed; ``pods`` is the trace (also the typical workload FGD learns from).

    ``progress(done, total)`` is called every few hundred pods.
    """
    state = ClusterState(nodes)
    if state.total_gpu_milli == 0:
        raise ValueError("the inflation protocol needs a cluster with GPUs")
    pol = make_policy(policy) if isinstance(policy, str) else policy
    engine = Engine(state, pol, seed=seed, workload=pods)
    workload = build_inflation_workload(pods, state.total_gpu_milli, ratio, seed)
    n = len(workload)
    arrived = np.empty(n)
    allocation = np.empty(n)
    capacity = float(state.total_gpu_milli)
    demand = 0
    held = 0
    failed: list[dict] = []
    spent = 0.0
    if kernels.enabled():
        kernels.warm_up()  # compiled (or loaded from numba's cache) now: decision_seconds times decisions only
    for i, pod in enumerate(workload):
        t0 = time.perf_counter()
        decision = engine.place(pod)
        spent += time.perf_counter() - t0
        demand += pod.total_gpu_milli
        if decision.assignment is not None:
            held += pod.total_gpu_milli
        else:
            failed.append({"pod": pod.name, "reason": decision.reason, "arrived": demand / capacity,
                           "num_gpu": pod.num_gpu, "gpu_milli": pod.gpu_milli})
        arrived[i] = demand / capacity
        allocation[i] = held / capacity
        if progress is not None and (i % 250 == 0 or i == n - 1):
            progress(i + 1, n)
    return InflationResult(
        policy=pol.name, seed=seed, n_pods=n, arrived=arrived, allocation=allocation, failed=failed,
        metrics=cluster_metrics(state, pods), decision_seconds=spent,
    )
