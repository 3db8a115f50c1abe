"""Replica recommender for GPU inference services: desired replicas from request metrics. No I/O.

One :class:`Recommender` per scaled workload; call :meth:`Recommender.recommend` every period (e.g. 15 s,
the HPA's ``--horizontal-pod-autoscaler-sync-period``) with the metric values of that moment. It is
stateful only through what the rules below need to remember (recommendation history, scale events, metric
samples, panic and activity times); the caller is expected to apply each recommendation (the next call's
``current_replicas`` tells it whether it did).

Rules, in the order they are applied (each with its source; the code is our own):

1. **Per-metric proposal** (Kubernetes HPA v2, ``pkg/controller/podautoscaler/replica_calculator.go`` and
   the HPA docs "Algorithm details"): ``desired = ceil(current * value / target)``.

   * Totals (``concurrency``, ``queue_depth``, ``rps``: the service-wide value, target per replica) follow
     the HPA's *AverageValue* external metric: ``ratio = total / (target * current)``,
     ``desired = ceil(total / target)``.
   * Per-replica averages (``gpu_util``, ``tensor_active``, ``cpu_util``, percent) follow the HPA's
     resource/pods metric: ``desired = ceil(ratio * ready)``. With ``ready_replicas < current`` the
     not-ready replicas count as 0 % on a scale-up (the ratio is recomputed as ``value * ready /
     (target * current)`` and applied to ``current``) and are left out on a scale-down; a recomputed ratio
     that falls within tolerance or changes direction keeps ``current`` (as the HPA does).
   * Tolerance: ``|ratio - 1| <= tolerance`` (default 0.1) proposes ``current``.
   * A metric absent from ``samples`` (or not a number, NaN, +-Inf, negative) makes no proposal (HPA skips
     invalid metrics); with no proposal at all the replica count is held. A proposal is capped at
     :data:`MAX_PROPOSAL` (a tiny target would otherwise overflow), then by ``max_replicas``.
   * The recommendation is the **max** over the metrics' proposals.

2. **Latency** (``latency_p95_s``, ``latency_p99_s``; gpupool's rule): over target it proposes
   ``ceil(current * value / target)`` like any metric. Under target it makes **no** proposal, so it never
   drives a scale-down: the other metrics decide, and if latency is the only metric present the count is
   held. Reasoning: latency is not proportional to load. At light load it is the bare service time
   (queueing ~0), so a proportional rule would shrink the service whenever the SLO is loose (0.5 s measured
   under a 2 s target would cut replicas by 4x at *any* load) until queueing suddenly explodes; near
   saturation (M/M/c) queueing delay grows without bound, so a small replica cut can multiply latency. The
   HPA docs give no latency rule; the Knative docs recommend concurrency or rps rather than latency for the
   same reason (latency is the outcome to protect, load is the signal to scale on).

3. **Knative KPA panic mode** on ``concurrency`` (knative/serving ``pkg/autoscaler/scaling/autoscaler.go``
   and the Knative "Configuring scale bounds / panic window" docs), when ``panic_window_s`` is set: the
   concurrency proposal uses window *averages* of the samples the Recommender keeps:
   ``stable = ceil(avg_stable_window / target)``, ``panic = ceil(avg_panic_window / target)``. Panic starts
   (or is extended) when ``panic / max(1, ready) >= panic_threshold`` (default 2.0 = Knative's 200 %); while
   panicking the proposal is ``max(stable, panic)`` and never below the largest proposal of this panic
   (Knative's ``maxPanicPods``), the whole recommendation never goes below ``current``, and the scale-up
   stabilization window is bypassed (rate policies still apply: they are explicit user limits). Panic ends
   once a full stable window has passed since the last over-threshold evaluation. The HPA tolerance applies
   to the stable proposal (Knative has none; kept so that concurrency behaves like the other metrics).

4. **HPA behavior** (``pkg/controller/podautoscaler/horizontal.go``: ``stabilizeRecommendationWithBehaviors``,
   ``convertDesiredReplicasWithBehaviorRate``, ``calculateScaleUpLimitWithScalingRules``,
   ``calculateScaleDownLimitWithBehaviors``; HPA docs "Configurable scaling behavior"):

   * Stabilization: the raw (unstabilized) recommendations of the windows are kept; the scale-up bound is
     the **min** over those within the scale-up window, the scale-down bound the **max** over those within
     the scale-down window; the result is ``current`` raised to the up bound and lowered to the down bound.
     The first call seeds the history with ``current`` (the HPA's ``maybeInitScaleDownStabilizationWindow``).
   * Rate policies: for each policy, ``period_start = current - added_in_period + removed_in_period``
     (scale events younger than ``period_s``); scale-up limit ``period_start + value`` (Pods) or
     ``ceil(period_start * (1 + value/100))`` (Percent); scale-down limit ``period_start - value`` (Pods) or
     ``floor(period_start * (1 - value/100))`` (Percent). ``select_policy`` ``Max`` takes the policy
     allowing the biggest change, ``Min`` the smallest, ``Disabled`` forbids that direction. No policies
     means no rate limit (the HPA API always defaults some; see :data:`DEFAULT_SCALE_UP`).
   * Then min/max replicas. A scale event is recorded whenever the recommendation differs from ``current``.

5. **KEDA scale to zero** (KEDA docs "Scaling Deployments": ``minReplicaCount: 0``, ``cooldownPeriod``,
   activation thresholds; ``pkg/scaling/executor/scale_scaledobjects.go``), only with ``min_replicas == 0``:
   while any metric is above its ``activation`` the service is *active* and the HPA rules run with a floor
   of 1 (KEDA gives the HPA ``minReplicas >= 1``); after ``cooldown_s`` with every present metric
   ``<= activation`` (since the last active evaluation, or since the first call) it goes to 0 once the
   scale-down rate policies allow it (KEDA #7204, #7770: never N -> 0 in one step past a policy such as 1 pod
   per 60 s): until then the HPA rules bring it down at the policy's pace with a floor of 1 (4 -> 3 -> 2 ->
   1), and the last step to 0 waits for both the cooldown and the policy. The HPA default (100 % per 15 s)
   allows 0 at once, as before; with scale-down ``Disabled`` (the HPA would never come down) it is KEDA's
   own step, to 0 directly at the cooldown.
   From 0, the first evaluation with a metric ``> activation`` scales to ``max(1, ceil(total / target)``
   over the total metrics``)`` (KEDA scales to 1 and the HPA's next cycle computes ``ceil(total/target)``
   for AverageValue metrics; gpupool does both at once, saving one period on a cold start), capped by
   ``max_replicas``; the activation values are compared with the samples as given (totals for
   concurrency/queue_depth/rps).

``current_replicas`` above ``max_replicas`` (below ``min_replicas``) is brought to the bound at once, as the
HPA does.
"""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "DEFAULT_SCALE_DOWN",
    "DEFAULT_SCALE_UP",
    "LATENCY_METRICS",
    "MAX_PROPOSAL",
    "METRICS",
    "PERCENT_METRICS",
    "TOTAL_METRICS",
    "AutoscalerSpec",
    "MetricTarget",
    "Recommendation",
    "Recommender",
    "ScalingPolicy",
    "ScalingRules",
]

#: Metric names the recommender understands. ``gpu_util`` is the utilisation of the GPU a replica runs on:
#: ``DCGM_FI_DEV_GPU_UTIL`` on a whole GPU, ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` x 100 on a MIG instance (dcgm-exporter
#: #216: DCGM_FI_DEV_GPU_UTIL reads 0 there, which would scale a busy MIG service down); ``tensor_active``
#: ``DCGM_FI_PROF_PIPE_TENSOR_ACTIVE`` x 100; both and ``cpu_util`` in percent (0..100).
METRICS = ("concurrency", "queue_depth", "rps", "latency_p95_s", "latency_p99_s", "gpu_util", "tensor_active",
           "cpu_util")
#: Service-wide totals; the target is per replica (HPA AverageValue).
TOTAL_METRICS = frozenset({"concurrency", "queue_depth", "rps"})
#: Per-replica averages in percent (HPA resource/pods Utilization-style).
PERCENT_METRICS = frozenset({"gpu_util", "tensor_active", "cpu_util"})
#: Service-level latency in seconds (scale up only, see rule 2 of the module docstring).
LATENCY_METRICS = frozenset({"latency_p95_s", "latency_p99_s"})

#: Largest proposal a metric makes: a tiny target or a huge value (1e300 / 1e-300 is +Inf in float) proposes this
#: instead of overflowing ``math.ceil``; maxReplicas caps it anyway. Also the largest ``maxReplicas`` (a Kubernetes
#: replica count is an int32).
MAX_PROPOSAL = 2**31 - 1


#: CR metric ``type``/``name`` spellings accepted by :meth:`AutoscalerSpec.from_mapping` besides METRICS.
_METRIC_ALIASES = {
    "queueDepth": "queue_depth", "queue": "queue_depth", "requestsPerSecond": "rps", "RPS": "rps",
    "latencyP95": "latency_p95_s", "latencyP99": "latency_p99_s", "p95Latency": "latency_p95_s",
    "p99Latency": "latency_p99_s", "gpuUtil": "gpu_util", "gpuUtilization": "gpu_util",
    "DCGM_FI_DEV_GPU_UTIL": "gpu_util", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "gpu_util", "tensorActive": "tensor_active",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active", "cpuUtil": "cpu_util", "cpu": "cpu_util",
    "cpuUtilization": "cpu_util",
}


@dataclass(frozen=True)
class MetricTarget:
    """One scaling metric.

    ``name``: one of :data:`METRICS`. ``target``: per-replica average target (concurrency 8 per replica,
    queue_depth 4, rps 10, gpu_util 70 (%), latency 2.0 (s)); must be > 0. ``activation``: KEDA activation
    threshold; at 0 replicas the service scales from zero only when the value is > activation.
    Raises ValueError on an unknown name or a non-positive target.
    """

    name: str
    target: float
    activation: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in METRICS:
            raise ValueError(f"metric name {self.name!r}: one of {METRICS}")
        if not (math.isfinite(self.target) and self.target > 0):
            raise ValueError(f"metric {self.name}: target must be > 0, got {self.target!r}")
        if not (math.isfinite(self.activation) and self.activation >= 0):
            raise ValueError(f"metric {self.name}: activation must be >= 0, got {self.activation!r}")


@dataclass(frozen=True)
class ScalingPolicy:
    """HPA behavior policy: change at most ``value`` Pods (or ``value`` Percent) per ``period_s`` seconds."""

    type: Literal["Pods", "Percent"]
    value: int
    period_s: float

    def __post_init__(self) -> None:
        if self.type not in ("Pods", "Percent"):
            raise ValueError(f"policy type {self.type!r}: 'Pods' or 'Percent'")
        if self.value <= 0:
            raise ValueError(f"policy value must be > 0, got {self.value!r}")
        if not self.period_s > 0:
            raise ValueError(f"policy periodSeconds must be > 0, got {self.period_s!r}")


@dataclass(frozen=True)
class ScalingRules:
    """HPA ``behavior.scaleUp`` / ``scaleDown``: stabilization window (s), rate policies, policy selection."""

    stabilization_window_s: float
    policies: tuple[ScalingPolicy, ...] = ()
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"

    def __post_init__(self) -> None:
        if not self.stabilization_window_s >= 0:
            raise ValueError(f"stabilizationWindowSeconds must be >= 0, got {self.stabilization_window_s!r}")
        if self.select_policy not in ("Max", "Min", "Disabled"):
            raise ValueError(f"selectPolicy {self.select_policy!r}: 'Max', 'Min' or 'Disabled'")


#: HPA default scale-up behavior (HPA docs "Default Behavior"): no stabilization, at most +100 % or +4 pods
#: per 15 s, whichever is more.
DEFAULT_SCALE_UP = ScalingRules(0.0, (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0)), "Max")
#: HPA default scale-down behavior: 300 s stabilization, at most -100 % per 15 s.
DEFAULT_SCALE_DOWN = ScalingRules(300.0, (ScalingPolicy("Percent", 100, 15.0),), "Max")


@dataclass(frozen=True)
class AutoscalerSpec:
    """What to scale on and within which limits (the ``GpuAutoscaler`` CR spec, parsed).

    ``min_replicas`` 0 enables scale to zero (KEDA semantics, with ``activation`` and ``cooldown_s``);
    ``panic_window_s`` (s) enables Knative panic mode on ``concurrency`` (None = off); ``stable_window_s``
    (s) is Knative's stable window; ``panic_threshold`` the panic ratio (2.0 = 200 %); ``cooldown_s`` (s)
    KEDA's ``cooldownPeriod``; ``tolerance`` the HPA tolerance (0.1). Raises ValueError on bad values.
    """

    min_replicas: int = 1
    max_replicas: int = 10
    metrics: tuple[MetricTarget, ...] = ()
    tolerance: float = 0.1
    scale_up: ScalingRules = DEFAULT_SCALE_UP
    scale_down: ScalingRules = DEFAULT_SCALE_DOWN
    panic_window_s: float | None = None
    stable_window_s: float = 60.0
    panic_threshold: float = 2.0
    cooldown_s: float = 300.0

    def __post_init__(self) -> None:
        if self.min_replicas < 0:
            raise ValueError(f"minReplicas: must be >= 0, got {self.min_replicas}")
        if self.max_replicas > MAX_PROPOSAL:
            raise ValueError(f"maxReplicas: at most {MAX_PROPOSAL} (a Kubernetes replica count is an int32), got "
                             f"{self.max_replicas}")
        if self.max_replicas < max(1, self.min_replicas):
            # two fields disagree: the message names both, not one field as at fault
            raise ValueError(f"maxReplicas {self.max_replicas} must be >= max(1, minReplicas="
                             f"{self.min_replicas})")
        if not 0 <= self.tolerance < 1:
            raise ValueError(f"tolerance: must be within [0, 1), got {self.tolerance!r}")
        names = [m.name for m in self.metrics]
        if len(set(names)) != len(names):
            raise ValueError(f"metrics: a metric is listed twice: {names}")
        if self.panic_window_s is not None and not 0 < self.panic_window_s <= self.stable_window_s:
            raise ValueError(f"panicWindowSeconds: must be within (0, stableWindowSeconds="
                             f"{self.stable_window_s}], got {self.panic_window_s!r}")
        if not self.stable_window_s > 0:
            raise ValueError(f"stableWindowSeconds: must be > 0, got {self.stable_window_s!r}")
        if not self.panic_threshold > 1:
            raise ValueError(f"panicThreshold: must be > 1, got {self.panic_threshold!r}")
        if not self.cooldown_s >= 0:
            raise ValueError(f"cooldownPeriod: must be >= 0, got {self.cooldown_s!r}")

    @classmethod
    def from_mapping(cls, d: Mapping[str, Any]) -> AutoscalerSpec:
        """Parse the ``GpuAutoscaler`` CR spec (camelCase, HPA v2 / KEDA ScaledObject names).

        Keys (all optional): ``minReplicas``, ``maxReplicas``, ``tolerance``, ``metrics``: list of
        ``{name|type, target, activation}`` (``target`` a number, or ``{averageValue|value|
        averageUtilization: n}`` as in HPA v2), ``behavior: {scaleUp|scaleDown: {stabilizationWindowSeconds,
        policies: [{type, value, periodSeconds}], selectPolicy}}`` (a side left out keeps the HPA default;
        a side given without ``policies`` keeps the default policies), ``panicWindowSeconds``,
        ``stableWindowSeconds``, ``panicThreshold`` (ratio, or percent when > 10 as Knative's 200),
        ``cooldownPeriod``. Other keys (e.g. ``scaleTargetRef``, ``slicePolicy``) are ignored.
        Raises ValueError naming the bad field, e.g. ``spec.metrics[1].target: must be > 0``.
        """
        if not isinstance(d, Mapping):
            raise ValueError(f"spec: a mapping expected, got {type(d).__name__}")
        kw: dict[str, Any] = {}
        ints = (("minReplicas", "min_replicas"), ("maxReplicas", "max_replicas"))
        floats = (("tolerance", "tolerance"), ("stableWindowSeconds", "stable_window_s"),
                  ("cooldownPeriod", "cooldown_s"))
        for key, attr in ints:
            if d.get(key) is not None:
                kw[attr] = _int(d[key], f"spec.{key}")
        for key, attr in floats:
            if d.get(key) is not None:
                kw[attr] = _num(d[key], f"spec.{key}")
        if d.get("panicWindowSeconds") is not None:
            kw["panic_window_s"] = _num(d["panicWindowSeconds"], "spec.panicWindowSeconds")
        if d.get("panicThreshold") is not None:
            t = _num(d["panicThreshold"], "spec.panicThreshold")
            if 10 < t <= 100:
                raise ValueError(f"spec.panicThreshold: {t:g} is read as a percentage (above 10), which must be "
                                 f"> 100 (Knative's 200); as a ratio it must be > 1 (2.0)")
            kw["panic_threshold"] = t / 100.0 if t > 10 else t
        if d.get("metrics") is not None:
            raw = d["metrics"]
            if not isinstance(raw, list | tuple):
                raise ValueError("spec.metrics: a list expected")
            kw["metrics"] = tuple(_metric(m, f"spec.metrics[{i}]") for i, m in enumerate(raw))
        behavior = d.get("behavior")
        if behavior is not None:
            if not isinstance(behavior, Mapping):
                raise ValueError("spec.behavior: a mapping expected")
            for key, attr, default in (("scaleUp", "scale_up", DEFAULT_SCALE_UP),
                                       ("scaleDown", "scale_down", DEFAULT_SCALE_DOWN)):
                if behavior.get(key) is not None:
                    kw[attr] = _rules(behavior[key], f"spec.behavior.{key}", default)
        try:
            return cls(**kw)
        except ValueError as e:
            text = str(e)  # "field: why" names one field; other messages are about the spec as a whole
            raise ValueError(f"spec.{text}" if re.match(r"\w+:", text) else f"spec: {text}") from None


def _ceil(x: float) -> int:
    """``ceil(x)`` capped at :data:`MAX_PROPOSAL` (x is finite or +Inf here: invalid samples are dropped before)."""
    return MAX_PROPOSAL if not x < MAX_PROPOSAL else math.ceil(x)


def _valid(v: Any) -> float | None:
    """A metric sample as a float, or None when it is no usable value: not a number, NaN, +-Inf or negative."""
    if isinstance(v, bool):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) and x >= 0 else None


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise ValueError(f"{where}: a number expected, got {v!r}")
    try:
        x = float(v)
    except ValueError:
        raise ValueError(f"{where}: a number expected, got {v!r}") from None
    except OverflowError:  # an int past float range (YAML/JSON allow 10**400)
        x = math.inf
    if not math.isfinite(x):
        raise ValueError(f"{where}: a finite number expected, got {str(v)[:40]}")
    return x


def _int(v: Any, where: str) -> int:
    x = _num(v, where)
    if x != int(x):
        raise ValueError(f"{where}: an integer expected, got {v!r}")
    return int(x)


def _metric(m: Any, where: str) -> MetricTarget:
    if not isinstance(m, Mapping):
        raise ValueError(f"{where}: a mapping expected, got {m!r}")
    name = m.get("name", m.get("type"))
    if not isinstance(name, str):
        raise ValueError(f"{where}.name: a metric name expected, one of {METRICS}")
    name = _METRIC_ALIASES.get(name, name)
    if name not in METRICS:
        raise ValueError(f"{where}.name: unknown metric {name!r}, one of {METRICS}")
    if "target" not in m:
        raise ValueError(f"{where}.target: missing")
    target = m["target"]
    if isinstance(target, Mapping):
        for k in ("averageValue", "value", "averageUtilization"):
            if k in target:
                target = _num(target[k], f"{where}.target.{k}")
                break
        else:
            raise ValueError(f"{where}.target: expected averageValue, value or averageUtilization")
    else:
        target = _num(target, f"{where}.target")
    if target <= 0:
        raise ValueError(f"{where}.target: must be > 0, got {target!r}")
    activation = _num(m.get("activation", 0.0) or 0.0, f"{where}.activation")
    if activation < 0:
        raise ValueError(f"{where}.activation: must be >= 0, got {activation!r}")
    return MetricTarget(name, float(target), activation)


def _rules(r: Any, where: str, default: ScalingRules) -> ScalingRules:
    if not isinstance(r, Mapping):
        raise ValueError(f"{where}: a mapping expected")
    window = default.stabilization_window_s
    if r.get("stabilizationWindowSeconds") is not None:
        window = _num(r["stabilizationWindowSeconds"], f"{where}.stabilizationWindowSeconds")
        if window < 0:
            raise ValueError(f"{where}.stabilizationWindowSeconds: must be >= 0, got {window!r}")
    select = r.get("selectPolicy", default.select_policy) or default.select_policy
    if select not in ("Max", "Min", "Disabled"):
        raise ValueError(f"{where}.selectPolicy: 'Max', 'Min' or 'Disabled', got {select!r}")
    policies = default.policies
    if r.get("policies") is not None:
        raw = r["policies"]
        if not isinstance(raw, list | tuple):
            raise ValueError(f"{where}.policies: a list expected")
        out = []
        for i, p in enumerate(raw):
            w = f"{where}.policies[{i}]"
            if not isinstance(p, Mapping):
                raise ValueError(f"{w}: a mapping expected")
            if p.get("type") not in ("Pods", "Percent"):
                raise ValueError(f"{w}.type: 'Pods' or 'Percent', got {p.get('type')!r}")
            value = _int(p.get("value"), f"{w}.value")
            if value <= 0:
                raise ValueError(f"{w}.value: must be > 0, got {value}")
            period = _num(p.get("periodSeconds"), f"{w}.periodSeconds")
            if period <= 0:
                raise ValueError(f"{w}.periodSeconds: must be > 0, got {period}")
            out.append(ScalingPolicy(p["type"], value, period))
        policies = tuple(out)
    return ScalingRules(window, policies, select)


@dataclass(frozen=True)
class Recommendation:
    """Outcome of one evaluation.

    ``replicas``: desired replicas after all rules; ``reason``: which metric drove it and which rule
    limited it; ``proposals``: metric name -> raw per-metric proposal (metrics with no proposal absent);
    ``panic``: Knative panic mode on; ``limited_by``: the rule that changed the metrics' recommendation,
    one of ``maxReplicas``, ``minReplicas``, ``scaleUpPolicy``, ``scaleDownPolicy``,
    ``scaleUpStabilization``, ``scaleDownStabilization``, ``panic`` (no scale-down in panic),
    ``cooldown`` (waiting out KEDA's cooldown before zero), or None.
    """

    replicas: int
    reason: str
    proposals: dict[str, int] = field(default_factory=dict)
    panic: bool = False
    limited_by: str | None = None


class Recommender:
    """Desired replicas of one workload over time (rules in the module docstring). No I/O."""

    def __init__(self, spec: AutoscalerSpec) -> None:
        self.spec = spec
        self._targets = {m.name: m for m in spec.metrics}
        self._recs: list[tuple[float, int]] = []          # (time, raw recommendation): stabilization
        self._up_events: list[tuple[float, int]] = []     # (time, replicas added)
        self._down_events: list[tuple[float, int]] = []   # (time, replicas removed)
        self._conc: deque[tuple[float, float]] = deque()  # (time, concurrency total): Knative windows
        self._panic_since: float | None = None            # last time over the panic threshold
        self._max_panic = 0
        self._last_active: float | None = None            # KEDA: last time a metric was > activation

    # ------------------------------------------------------------------ proposals
    def _proposal(self, m: MetricTarget, value: float, current: int, ready: int) -> int | None:
        """Rule 1/2: one metric's raw proposal, None for no proposal."""
        tol = self.spec.tolerance
        if m.name in TOTAL_METRICS:
            ratio = value / (m.target * current)
            if abs(ratio - 1) <= tol:
                return current
            return _ceil(value / m.target)
        ratio = value / m.target
        if m.name in LATENCY_METRICS:
            if ratio <= 1 + tol:
                return None  # under target (or within tolerance): never drives a scale-down
            return _ceil(current * ratio)
        # per-replica average (percent), HPA replica_calculator semantics with not-ready replicas
        if abs(ratio - 1) <= tol:
            return current
        if ratio > 1:
            if ready < current:  # not-ready replicas count as 0 %
                ratio = value * ready / (m.target * current)
                if ratio <= 1 + tol:
                    return current
            return max(current, _ceil(ratio * current))
        return min(current, _ceil(ratio * ready))

    def _window_avg(self, now: float, window: float) -> float:
        vals = [v for t, v in self._conc if t > now - window]
        return sum(vals) / len(vals) if vals else 0.0

    # ------------------------------------------------------------------ the cycle
    def recommend(self, now_s: float, current_replicas: int, samples: Mapping[str, float],
                  ready_replicas: int | None = None) -> Recommendation:
        """Desired replicas at time ``now_s`` (s, monotonic) for ``current_replicas``.

        ``samples``: metric name -> current value: a service-wide total for concurrency/queue_depth/rps,
        a per-replica average (percent) for gpu_util/tensor_active/cpu_util, the service-level value (s)
        for latency_*. Names not in the spec are ignored; a spec metric that is missing, not a number, NaN, +-Inf or
        negative (every metric here is a count, a percentage or seconds) makes no proposal, as the HPA skips an
        invalid metric. ``ready_replicas`` (default ``current_replicas``): replicas that are Ready.
        Raises ValueError for negative replica counts.
        """
        spec = self.spec
        cur = int(current_replicas)
        if cur < 0:
            raise ValueError(f"current_replicas must be >= 0, got {current_replicas}")
        ready = cur if ready_replicas is None else max(0, min(int(ready_replicas), cur))
        vals = {n: x for n, v in samples.items() if n in self._targets and (x := _valid(v)) is not None}
        if self._last_active is None:
            self._last_active = now_s
        if not self._recs:  # maybeInitScaleDownStabilizationWindow
            self._recs.append((now_s, cur))
        if "concurrency" in vals and spec.panic_window_s is not None:
            self._conc.append((now_s, vals["concurrency"]))
            while self._conc and self._conc[0][0] <= now_s - spec.stable_window_s:
                self._conc.popleft()
        active = any(v > self._targets[n].activation for n, v in vals.items())
        if active:
            self._last_active = now_s

        # ---- KEDA: from zero / to zero
        if spec.min_replicas == 0:
            if cur == 0:
                if not active:
                    return Recommendation(0, "scaled to zero: no metric above its activation threshold")
                want = max([1] + [_ceil(v / self._targets[n].target) for n, v in vals.items()
                                  if n in TOTAL_METRICS])
                want = min(want, spec.max_replicas)
                self._record(now_s, 0, want)
                self._recs.append((now_s, want))
                drivers = ", ".join(f"{n}={v:g}>{self._targets[n].activation:g}" for n, v in vals.items()
                                    if v > self._targets[n].activation)
                return Recommendation(want, f"activated from zero ({drivers})",
                                      {n: _ceil(v / self._targets[n].target) for n, v in vals.items()
                                       if n in TOTAL_METRICS})
            if vals and not active and now_s - self._last_active >= spec.cooldown_s and (
                    spec.scale_down.select_policy == "Disabled" or self._down_limit(now_s, cur) <= 0):
                self._record(now_s, cur, 0)
                self._recs.clear()
                self._conc.clear()
                self._panic_since, self._max_panic = None, 0
                return Recommendation(0, f"scale to zero: every metric <= activation for "
                                         f"{now_s - self._last_active:g}s >= cooldownPeriod {spec.cooldown_s:g}s")
        floor = max(1, spec.min_replicas)
        if cur == 0:  # min_replicas >= 1: bring up to the minimum
            self._record(now_s, 0, floor)
            return Recommendation(floor, f"current 0 below minReplicas {floor}", limited_by="minReplicas")

        # ---- per-metric proposals (rules 1-3)
        proposals: dict[str, int] = {}
        panic = False
        for name, v in vals.items():
            m = self._targets[name]
            if name == "concurrency" and spec.panic_window_s is not None:
                stable_avg = self._window_avg(now_s, spec.stable_window_s)
                panic_avg = self._window_avg(now_s, spec.panic_window_s)
                dspc = _ceil(stable_avg / m.target)
                dppc = _ceil(panic_avg / m.target)
                if dppc / max(1, ready) >= spec.panic_threshold:
                    self._panic_since = now_s
                elif self._panic_since is not None and now_s - self._panic_since > spec.stable_window_s:
                    self._panic_since, self._max_panic = None, 0
                p = dspc
                if abs(stable_avg / (m.target * cur) - 1) <= spec.tolerance:
                    p = cur
                if self._panic_since is not None:
                    panic = True
                    p = max(p, dppc, self._max_panic)
                    self._max_panic = p
                proposals[name] = p
                continue
            p = self._proposal(m, v, cur, ready)
            if p is not None:
                proposals[name] = p
        if proposals:
            driver = max(proposals, key=lambda n: proposals[n])
            raw = proposals[driver]
            reason = f"{driver}={vals[driver]:g} (target {self._targets[driver].target:g}) proposes {raw}"
        else:
            raw = cur
            reason = "no metric proposes a change (missing metrics, or latency under target): hold"

        # ---- stabilization (rule 4)
        up_w, down_w = spec.scale_up.stabilization_window_s, spec.scale_down.stabilization_window_s
        up_bound = down_bound = raw
        for t, r in self._recs:
            if t > now_s - up_w:
                up_bound = min(up_bound, r)
            if t > now_s - down_w:
                down_bound = max(down_bound, r)
        keep = max(up_w, down_w)
        self._recs = [(t, r) for t, r in self._recs if t > now_s - keep]
        self._recs.append((now_s, raw))
        if panic:
            up_bound = raw  # panic bypasses scale-up stabilization
        stab = cur
        limited: str | None = None
        if stab < up_bound:
            stab = up_bound
        if stab > down_bound:
            stab = down_bound
        if raw > cur and stab < raw:
            limited = "scaleUpStabilization"
        elif raw < cur and stab > raw:
            limited = "scaleDownStabilization"
        if panic and stab < cur:
            stab, limited = cur, "panic"

        # ---- rate policies and min/max (rule 4)
        out = stab
        if stab > cur:
            limit = max(cur, self._up_limit(now_s, cur))
            hi = min(spec.max_replicas, limit)
            if stab > hi:
                out = hi
                limited = "scaleUpPolicy" if limit < spec.max_replicas else "maxReplicas"
        elif stab < cur:
            limit = min(cur, self._down_limit(now_s, cur))
            lo = max(floor, limit)
            if stab < lo:
                out = lo
                limited = "scaleDownPolicy" if limit > floor else "minReplicas"
        if out > spec.max_replicas:
            out, limited = spec.max_replicas, "maxReplicas"
        if out < floor:
            out, limited = floor, "minReplicas"
        if spec.min_replicas == 0 and out == 1 and raw < 1 and vals and not active:
            # held at 1 (the HPA floor under KEDA) until the cooldown has passed, then until the policy allows 0
            limited = "cooldown" if now_s - self._last_active < spec.cooldown_s else "scaleDownPolicy"
        self._record(now_s, cur, out)
        if limited:
            reason += f"; limited by {limited} -> {out}"
        if panic:
            reason += " [panic]"
        return Recommendation(out, reason, proposals, panic, limited)

    # ------------------------------------------------------------------ scale events and rate limits
    def _record(self, now_s: float, cur: int, new: int) -> None:
        if new > cur:
            self._up_events.append((now_s, new - cur))
        elif new < cur:
            self._down_events.append((now_s, cur - new))
        longest = max([p.period_s for p in self.spec.scale_up.policies + self.spec.scale_down.policies],
                      default=0.0)
        self._up_events = [(t, n) for t, n in self._up_events if t > now_s - longest]
        self._down_events = [(t, n) for t, n in self._down_events if t > now_s - longest]

    @staticmethod
    def _changed(events: list[tuple[float, int]], now_s: float, period: float) -> int:
        return sum(n for t, n in events if t > now_s - period)

    def _up_limit(self, now_s: float, cur: int) -> int:
        rules = self.spec.scale_up
        if rules.select_policy == "Disabled":
            return cur
        if not rules.policies:
            return self.spec.max_replicas
        props = []
        for p in rules.policies:
            start = cur - self._changed(self._up_events, now_s, p.period_s) + \
                self._changed(self._down_events, now_s, p.period_s)
            props.append(start + p.value if p.type == "Pods" else -(-start * (100 + p.value) // 100))  # ceil
        return max(props) if rules.select_policy == "Max" else min(props)

    def _down_limit(self, now_s: float, cur: int) -> int:
        rules = self.spec.scale_down
        if rules.select_policy == "Disabled":
            return cur
        if not rules.policies:
            return 0
        props = []
        for p in rules.policies:
            start = cur - self._changed(self._up_events, now_s, p.period_s) + \
                self._changed(self._down_events, now_s, p.period_s)
            props.append(start - p.value if p.type == "Pods" else start * (100 - p.value) // 100)  # floor
        return min(props) if rules.select_policy == "Max" else max(props)
