"""Tests of gpupool.engine.autoscale: each rule with hand-computed numbers (arithmetic in the comments)."""

from __future__ import annotations

import math
import re

import pytest

from gpupool.engine.autoscale import (
    DEFAULT_SCALE_DOWN,
    DEFAULT_SCALE_UP,
    AutoscalerSpec,
    MetricTarget,
    Recommender,
    ScalingPolicy,
    ScalingRules,
)

NO_WINDOWS_DOWN = ScalingRules(0.0, DEFAULT_SCALE_DOWN.policies)


def rec(*metrics: MetricTarget, **kw) -> Recommender:
    return Recommender(AutoscalerSpec(metrics=tuple(metrics), **kw))


# ---------------------------------------------------------------- rule 1: per-metric proposal (HPA)
def test_total_metric_is_ceil_total_over_target() -> None:
    r = rec(MetricTarget("concurrency", 8))
    # 40 requests in flight over 3 replicas, target 8 each: ratio 40 / (8 * 3) = 1.67 -> ceil(40 / 8) = 5;
    # default scale-up limit max(ceil(3 * 2), 3 + 4) = 7 does not bind
    out = r.recommend(0, 3, {"concurrency": 40})
    assert out.replicas == 5 and out.proposals == {"concurrency": 5} and out.limited_by is None


def test_tolerance() -> None:
    r = rec(MetricTarget("concurrency", 8))
    # 34 / (8 * 4) = 1.0625: |1.0625 - 1| <= 0.1 -> keep 4 (ceil(34 / 8) = 5 would be proposed otherwise)
    assert r.recommend(0, 4, {"concurrency": 34}).replicas == 4
    # 36 / 32 = 1.125 > 1.1 -> ceil(36 / 8) = ceil(4.5) = 5
    assert r.recommend(15, 4, {"concurrency": 36}).replicas == 5


def test_max_over_metrics_and_scale_up_policy_limit() -> None:
    r = rec(MetricTarget("concurrency", 8), MetricTarget("gpu_util", 60), MetricTarget("queue_depth", 4))
    out = r.recommend(0, 3, {"concurrency": 40, "gpu_util": 90, "queue_depth": 30})
    # concurrency ceil(40/8) = 5; gpu_util ratio 90/60 = 1.5 -> ceil(1.5 * 3) = ceil(4.5) = 5;
    # queue_depth ceil(30/4) = ceil(7.5) = 8 -> max 8;
    # default scale-up: Percent 100 -> ceil(3 * 2) = 6, Pods 4 -> 3 + 4 = 7, select Max -> 7
    assert out.proposals == {"concurrency": 5, "gpu_util": 5, "queue_depth": 8}
    assert out.replicas == 7 and out.limited_by == "scaleUpPolicy"
    assert "queue_depth" in out.reason


def test_missing_metric_makes_no_proposal() -> None:
    r = rec(MetricTarget("concurrency", 8), MetricTarget("gpu_util", 50))
    # only gpu_util: 75 / 50 = 1.5 -> ceil(1.5 * 2) = 3
    out = r.recommend(0, 2, {"gpu_util": 75.0, "concurrency": float("nan")})
    assert out.proposals == {"gpu_util": 3} and out.replicas == 3
    # nothing at all: hold
    out = r.recommend(15, 3, {})
    assert out.replicas == 3 and out.proposals == {}


def test_not_ready_replicas_count_as_zero_on_scale_up() -> None:
    r = rec(MetricTarget("gpu_util", 60))
    # 4 replicas, 2 ready at 90 %: ratio 1.5, recomputed with the 2 not-ready at 0 %: 90 * 2 / (60 * 4) = 0.75
    # -> the direction flips (1.5 > 1, 0.75 < 1): keep 4
    assert r.recommend(0, 4, {"gpu_util": 90}, ready_replicas=2).replicas == 4
    r = rec(MetricTarget("gpu_util", 30))
    # target 30: 90 * 2 / (30 * 4) = 1.5 -> ceil(1.5 * 4) = 6
    assert r.recommend(0, 4, {"gpu_util": 90}, ready_replicas=2).proposals == {"gpu_util": 6}


def test_per_replica_scale_down_uses_ready_replicas() -> None:
    r = rec(MetricTarget("gpu_util", 60), scale_down=NO_WINDOWS_DOWN)
    # 6 replicas, 4 ready at 30 %: ratio 0.5 -> ceil(0.5 * 4) = 2 (not-ready replicas left out)
    assert r.recommend(0, 6, {"gpu_util": 30}, ready_replicas=4).proposals == {"gpu_util": 2}


# ---------------------------------------------------------------- rule 2: latency
def test_latency_over_target_scales_up_proportionally() -> None:
    r = rec(MetricTarget("latency_p99_s", 2.0))
    # p99 3.0 s over a 2.0 s target with 4 replicas: ceil(4 * 3 / 2) = 6 (limit max(8, 8) = 8)
    assert r.recommend(0, 4, {"latency_p99_s": 3.0}).replicas == 6


def test_latency_under_target_never_drives_a_scale_down() -> None:
    r = rec(MetricTarget("latency_p99_s", 2.0), scale_down=NO_WINDOWS_DOWN)
    # 0.5 s under 2.0 s: a proportional rule would say ceil(4 * 0.25) = 1; latency makes no proposal: hold 4
    out = r.recommend(0, 4, {"latency_p99_s": 0.5})
    assert out.replicas == 4 and out.proposals == {}
    r = rec(MetricTarget("latency_p99_s", 2.0), MetricTarget("concurrency", 8), scale_down=NO_WINDOWS_DOWN)
    # with concurrency 12 -> ceil(12 / 8) = 2, the other metric decides: 4 -> 2
    out = r.recommend(0, 4, {"latency_p99_s": 0.5, "concurrency": 12})
    assert out.replicas == 2 and out.proposals == {"concurrency": 2}


# ---------------------------------------------------------------- rule 4: stabilization
def test_scale_down_stabilization_keeps_the_max_of_the_window() -> None:
    r = rec(MetricTarget("concurrency", 8))  # default scale-down window 300 s
    assert r.recommend(0, 5, {"concurrency": 40}).replicas == 5  # ceil(40 / 8) = 5: hold
    cur = 5
    for t in range(15, 300, 15):
        out = r.recommend(t, cur, {"concurrency": 8})  # raw ceil(8 / 8) = 1
        # the window (t - 300, t] still holds the 5 recorded at t = 0 -> max = 5
        assert out.replicas == 5 and out.limited_by == "scaleDownStabilization", t
    # t = 300: window (0, 300] holds only raw 1s -> 1; rate: Percent 100 -> floor(5 * 0) = 0, floor 1 -> 1
    out = r.recommend(300, cur, {"concurrency": 8})
    assert out.replicas == 1


def test_scale_up_stabilization_keeps_the_min_of_the_window() -> None:
    r = rec(MetricTarget("concurrency", 8), scale_up=ScalingRules(60.0, DEFAULT_SCALE_UP.policies))
    assert r.recommend(0, 2, {"concurrency": 16}).replicas == 2  # ceil(16 / 8) = 2
    for t in (15, 30, 45):
        out = r.recommend(t, 2, {"concurrency": 40})  # raw 5; min over (t - 60, t] includes the 2 of t = 0
        assert out.replicas == 2 and out.limited_by == "scaleUpStabilization"
    # t = 60: (0, 60] holds 5, 5, 5, 5 -> 5 (limit max(4, 6) = 6 does not bind)
    assert r.recommend(60, 2, {"concurrency": 40}).replicas == 5


# ---------------------------------------------------------------- rule 4: rate policies
def test_pods_policy_counts_the_changes_of_its_period() -> None:
    up = ScalingRules(0.0, (ScalingPolicy("Pods", 2, 60.0),))
    r = rec(MetricTarget("concurrency", 8), scale_up=up, max_replicas=20)
    # raw ceil(80 / 8) = 10; limit 2 + 2 = 4
    assert r.recommend(0, 2, {"concurrency": 80}).replicas == 4
    # t = 15, current 4: +2 at t = 0 is within 60 s -> period start 4 - 2 = 2 -> limit 2 + 2 = 4: no change
    out = r.recommend(15, 4, {"concurrency": 80})
    assert out.replicas == 4 and out.limited_by == "scaleUpPolicy"
    # t = 60: the event of t = 0 is out of (0, 60] -> start 4 -> limit 6
    assert r.recommend(60, 4, {"concurrency": 80}).replicas == 6


def test_percent_policies_and_select_policy() -> None:
    pols = (ScalingPolicy("Percent", 100, 15.0), ScalingPolicy("Pods", 4, 15.0))
    for select, want in (("Max", 20), ("Min", 14), ("Disabled", 10)):
        r = rec(MetricTarget("concurrency", 8), scale_up=ScalingRules(0.0, pols, select), max_replicas=100)
        # raw ceil(400 / 8) = 50; Percent: ceil(10 * 2) = 20, Pods: 10 + 4 = 14; Max 20, Min 14, Disabled 10
        assert r.recommend(0, 10, {"concurrency": 400}).replicas == want, select
    down = ScalingRules(0.0, (ScalingPolicy("Percent", 30, 60.0),))
    r = rec(MetricTarget("concurrency", 8), scale_down=down)
    # raw ceil(8 / 8) = 1; limit floor(10 * (1 - 0.30)) = 7
    out = r.recommend(0, 10, {"concurrency": 8})
    assert out.replicas == 7 and out.limited_by == "scaleDownPolicy"
    # t = 15, current 7: 3 removed within 60 s -> start 7 + 3 = 10 -> floor(10 * 0.7) = 7: no change
    assert r.recommend(15, 7, {"concurrency": 8}).replicas == 7


def test_min_and_max_replicas() -> None:
    r = rec(MetricTarget("concurrency", 8), max_replicas=6)
    # ceil(100 / 8) = 13; limit max(10, 9) = 10; max 6 binds
    out = r.recommend(0, 5, {"concurrency": 100})
    assert out.replicas == 6 and out.limited_by == "maxReplicas"
    # current above max is brought down to max at once
    assert rec(MetricTarget("concurrency", 8), max_replicas=6).recommend(0, 9, {"concurrency": 72}).replicas == 6
    r = rec(MetricTarget("concurrency", 8), min_replicas=3, scale_down=NO_WINDOWS_DOWN)
    out = r.recommend(0, 5, {"concurrency": 1})  # ceil(1 / 8) = 1 < min 3
    assert out.replicas == 3 and out.limited_by == "minReplicas"


# ---------------------------------------------------------------- rule 3: Knative panic mode
def test_panic_mode_scales_up_fast_never_down_and_exits_after_a_stable_window() -> None:
    spec = AutoscalerSpec(metrics=(MetricTarget("concurrency", 10),), panic_window_s=6.0, stable_window_s=60.0,
                          scale_up=ScalingRules(60.0, DEFAULT_SCALE_UP.policies), scale_down=NO_WINDOWS_DOWN)
    r = Recommender(spec)
    for t in range(0, 60, 2):  # 20 in flight over 2 replicas of target 10: stable and panic ceil(20/10) = 2
        assert r.recommend(t, 2, {"concurrency": 20}).replicas == 2
    out = r.recommend(60, 2, {"concurrency": 100})
    # panic window (54, 60]: 20, 20, 100 -> 140 / 3 = 46.7 -> ceil(4.67) = 5; 5 / 2 = 2.5 >= 2: panic.
    # stable window (0, 60]: 29 x 20 + 100 = 680 over 30 samples = 22.7 -> 3. max(3, 5) = 5; the 60 s
    # scale-up stabilization is bypassed in panic; rate limit max(2 * 2, 2 + 4) = 6 does not bind
    assert out.panic and out.replicas == 5 and out.proposals == {"concurrency": 5}
    cur = 5
    for t in range(62, 122, 2):  # load falls to 10: stable would soon say 2 then 1, but no scale-down in panic
        out = r.recommend(t, cur, {"concurrency": 10})
        assert out.panic and out.replicas == 5, t
    # t = 122: last over-threshold evaluation at t = 60, 122 - 60 = 62 > 60: panic ends. Stable window
    # (62, 122]: 30 samples of 10 -> ceil(10 / 10) = 1; rate Percent 100 -> floor(5 * 0) = 0 -> 1
    out = r.recommend(122, cur, {"concurrency": 10})
    assert not out.panic and out.replicas == 1


def test_no_panic_below_threshold() -> None:
    spec = AutoscalerSpec(metrics=(MetricTarget("concurrency", 10),), panic_window_s=6.0)
    r = Recommender(spec)
    for t in range(0, 60, 2):
        r.recommend(t, 4, {"concurrency": 40})
    out = r.recommend(60, 4, {"concurrency": 70})
    # panic avg (54, 60]: (40 + 40 + 70) / 3 = 50 -> 5; 5 / 4 = 1.25 < 2: no panic.
    # stable avg (0, 60]: (29 x 40 + 70) / 30 = 41 -> ratio 41 / 40 = 1.025 within tolerance: keep 4
    assert not out.panic and out.replicas == 4


# ---------------------------------------------------------------- rule 5: KEDA scale to zero
def test_scale_to_zero_after_cooldown_and_activation_from_zero() -> None:
    r = rec(MetricTarget("concurrency", 10, activation=5), min_replicas=0, cooldown_s=300)
    out = r.recommend(0, 1, {"concurrency": 0})  # idle since the first call (t = 0): 0 s < 300 s
    assert out.replicas == 1 and out.limited_by == "cooldown"
    out = r.recommend(200, 1, {"concurrency": 6})  # 6 > activation 5: active at t = 200
    assert out.replicas == 1
    assert r.recommend(300, 1, {"concurrency": 4}).replicas == 1  # 4 <= 5 but 300 - 200 = 100 s < 300 s
    assert r.recommend(500, 1, {"concurrency": 4}).replicas == 0  # 500 - 200 = 300 s >= cooldown: to zero
    assert r.recommend(515, 0, {"concurrency": 5}).replicas == 0  # 5 is not > 5: stay at zero
    out = r.recommend(530, 0, {"concurrency": 25})  # 25 > 5: activate; ceil(25 / 10) = 3 at once
    assert out.replicas == 3 and "activated" in out.reason


def _replay(r: Recommender, replicas: int, load: dict[float, float], until: float, step: float = 15.0
            ) -> list[tuple[float, int]]:
    """Evaluate every ``step`` s from t = 0 applying each recommendation; ``load``: time -> concurrency from then
    on. Returns the (time, replicas) of every change."""
    changes, t, value = [], 0.0, 0.0
    while t <= until:
        value = load.get(t, value)
        out = r.recommend(t, replicas, {"concurrency": value}).replicas
        if out != replicas:
            changes.append((t, out))
            replicas = out
        t += step
    return changes


def test_scale_to_zero_honours_the_scale_down_policy_keda7204() -> None:
    """KEDA #7204 / #7770: 4 replicas, load gone, scale-down 1 pod per 60 s (HPA default stabilization 300 s),
    cooldown 300 s: 4 -> 3 -> 2 -> 1 at the policy's pace, then 0 (never 4 -> 0 in one step at the cooldown)."""
    one_a_minute = ScalingRules(300.0, (ScalingPolicy("Pods", 1, 60.0),))
    r = rec(MetricTarget("concurrency", 10, activation=0), min_replicas=0, cooldown_s=300, scale_down=one_a_minute)
    # busy at t = 0 (40 in flight: 4 replicas), idle from t = 15; the 300 s window holds 4 until t = 300
    assert _replay(r, 4, {0.0: 40.0, 15.0: 0.0}, until=900) == [(300, 3), (360, 2), (420, 1), (480, 0)]


def test_scale_to_zero_waits_for_the_cooldown_after_reaching_one() -> None:
    one_a_minute = ScalingRules(0.0, (ScalingPolicy("Pods", 1, 60.0),))
    r = rec(MetricTarget("concurrency", 10, activation=0), min_replicas=0, cooldown_s=300, scale_down=one_a_minute)
    # no stabilization: down at once at 1 pod a minute to 1 (t = 135), then 0 at the cooldown (t = 300)
    assert _replay(r, 4, {0.0: 40.0, 15.0: 0.0}, until=900) == [(15, 3), (75, 2), (135, 1), (300, 0)]
    out = rec(MetricTarget("concurrency", 10), min_replicas=0, cooldown_s=30, scale_down=one_a_minute)
    steps = _replay(out, 3, {0.0: 0.0}, until=600)
    assert steps == [(0, 2), (60, 1), (120, 0)]  # cooldown long past: the last step still 60 s after the one before


def test_scale_to_zero_with_the_default_policy_is_one_step() -> None:
    r = rec(MetricTarget("concurrency", 10), min_replicas=0, cooldown_s=300, scale_down=NO_WINDOWS_DOWN)
    # HPA default 100 % per 15 s allows 0 at once: 4 -> 1 (floor 1 under KEDA), then 0 at the cooldown
    assert _replay(r, 4, {0.0: 0.0}, until=600) == [(0, 1), (300, 0)]


def test_scale_from_zero_at_least_one() -> None:
    r = rec(MetricTarget("gpu_util", 60, activation=1), min_replicas=0)
    # a percent metric gives no total to size with: 1 replica
    assert r.recommend(0, 0, {"gpu_util": 30}).replicas == 1


def test_min_replicas_one_never_goes_to_zero() -> None:
    r = rec(MetricTarget("concurrency", 10), scale_down=NO_WINDOWS_DOWN)
    for t in range(0, 1000, 100):
        assert r.recommend(t, 1, {"concurrency": 0}).replicas == 1


# ---------------------------------------------------------------- the CR spec
def test_from_mapping_reads_the_cr_spec() -> None:
    spec = AutoscalerSpec.from_mapping({
        "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
        "minReplicas": 0, "maxReplicas": 12, "tolerance": 0.05, "cooldownPeriod": 120,
        "panicWindowSeconds": 6, "panicThreshold": 200,
        "metrics": [{"name": "concurrency", "target": 8, "activation": 1},
                    {"type": "DCGM_FI_DEV_GPU_UTIL", "target": {"averageUtilization": 70}},
                    {"name": "latency_p99_s", "target": {"value": "2.5"}}],
        "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0,
                                 "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}],
                                 "selectPolicy": "Min"},
                     "scaleDown": {"stabilizationWindowSeconds": 60}},
    })
    assert (spec.min_replicas, spec.max_replicas, spec.tolerance, spec.cooldown_s) == (0, 12, 0.05, 120.0)
    assert spec.panic_window_s == 6.0 and spec.panic_threshold == 2.0
    assert spec.metrics == (MetricTarget("concurrency", 8, 1), MetricTarget("gpu_util", 70),
                            MetricTarget("latency_p99_s", 2.5))
    assert spec.scale_up == ScalingRules(0.0, (ScalingPolicy("Pods", 2, 30.0),), "Min")
    assert spec.scale_down == ScalingRules(60.0, DEFAULT_SCALE_DOWN.policies, "Max")
    assert AutoscalerSpec.from_mapping({}) == AutoscalerSpec()


@pytest.mark.parametrize(("spec", "field"), [
    ({"minReplicas": "two"}, "spec.minReplicas"),
    ({"maxReplicas": 1.5}, "spec.maxReplicas"),
    ({"metrics": [{"name": "concurrency", "target": 8}, {"name": "bogus", "target": 1}]}, "spec.metrics[1].name"),
    ({"metrics": [{"name": "rps", "target": 0}]}, "spec.metrics[0].target"),
    ({"metrics": [{"name": "rps"}]}, "spec.metrics[0].target"),
    ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 0}]}}},
     "spec.behavior.scaleUp.policies[0].periodSeconds"),
    ({"behavior": {"scaleDown": {"selectPolicy": "Fastest"}}}, "spec.behavior.scaleDown.selectPolicy"),
    ({"behavior": {"scaleDown": {"policies": [{"type": "Nodes", "value": 1, "periodSeconds": 15}]}}},
     "spec.behavior.scaleDown.policies[0].type"),
    ({"minReplicas": 5, "maxReplicas": 3}, "spec: maxReplicas 3 must be >= max(1, minReplicas=5)"),
    ({"tolerance": 1.5}, "spec.tolerance"),
    ({"panicWindowSeconds": 90}, "spec.panicWindowSeconds"),
])
def test_from_mapping_names_the_bad_field(spec: dict, field: str) -> None:
    with pytest.raises(ValueError, match=re.escape(field)):
        AutoscalerSpec.from_mapping(spec)


def test_reason_names_the_driver() -> None:
    out = rec(MetricTarget("rps", 10)).recommend(0, 2, {"rps": 55})
    # ceil(55 / 10) = 6
    assert out.replicas == 6 and out.reason.startswith("rps=55") and not out.panic
    assert math.ceil(55 / 10) == out.proposals["rps"]
