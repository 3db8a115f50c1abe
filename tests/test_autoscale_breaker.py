"""Hostile input for the inference-autoscaling features: the Recommender, the RightSizer, the Prometheus answer
parser, the GpuAutoscaler controller and ``gpupool autoscale simulate``.

Each case is something a real cluster or a user can hand us (an exporter reporting -1 or +Inf, a Prometheus
answer whose timestamp is not a number, a capacity table with NaN, an unwritable ``--json``, a non-UTF-8
scenario); the expectation is the house rule: no crash, a clear error naming the field / file, exit code 2 for
usage errors, nothing lost. Property tests (hypothesis) check the Recommender's and the RightSizer's invariants.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.engine.autoscale import AutoscalerSpec, MetricTarget, Recommender, ScalingRules
from gpupool.engine.rightsize import RightSizer, slice_catalog
from gpupool.k8s.autoscaler.prometheus import PrometheusError, parse_response, reduce_samples

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "examples" / "autoscale" / "reference.yaml"
runner = CliRunner()
INF, NAN = float("inf"), float("nan")


# ------------------------------------------------------------------ Recommender: bad metric values
@pytest.mark.parametrize("value", [INF, -INF, NAN, -1.0, -1e300, "abc", None])
@pytest.mark.parametrize("metric", ["concurrency", "gpu_util", "latency_p99_s"])
def test_invalid_sample_makes_no_proposal_and_never_raises(metric: str, value) -> None:
    target = {"concurrency": 8.0, "gpu_util": 70.0, "latency_p99_s": 2.0}[metric]
    rec = Recommender(AutoscalerSpec(metrics=(MetricTarget(metric, target),)))
    r = rec.recommend(0.0, 3, {metric: value})
    assert r.replicas == 3 and metric not in r.proposals


def test_invalid_sample_beside_a_valid_one_lets_the_valid_one_decide() -> None:
    rec = Recommender(AutoscalerSpec(metrics=(MetricTarget("concurrency", 8), MetricTarget("gpu_util", 70))))
    r = rec.recommend(0.0, 2, {"concurrency": INF, "gpu_util": 140.0})
    assert r.replicas == 4 and set(r.proposals) == {"gpu_util"}


def test_inf_and_negative_with_panic_mode_and_scale_from_zero() -> None:
    panic = Recommender(AutoscalerSpec(metrics=(MetricTarget("concurrency", 8),), panic_window_s=6.0))
    assert panic.recommend(0.0, 2, {"concurrency": INF}).replicas == 2
    assert panic.recommend(15.0, 2, {"concurrency": -40.0}).replicas == 2
    zero = Recommender(AutoscalerSpec(min_replicas=0, metrics=(MetricTarget("concurrency", 8),)))
    assert zero.recommend(0.0, 0, {"concurrency": INF}).replicas == 0  # an invalid value does not activate


def test_tiny_target_or_huge_value_is_capped_at_max_replicas_not_overflow() -> None:
    spec = AutoscalerSpec.from_mapping({"maxReplicas": 7, "metrics": [{"name": "rps", "target": 1e-320}]})
    assert Recommender(spec).recommend(0.0, 1, {"rps": 5.0}).replicas == 5  # HPA default rate: +4 pods per 15 s
    rec = Recommender(AutoscalerSpec(max_replicas=7, metrics=(MetricTarget("gpu_util", 1e-300),),
                                     scale_up=ScalingRules(0.0)))
    r = rec.recommend(0.0, 1, {"gpu_util": 1e300})
    assert r.replicas == 7 and r.limited_by == "maxReplicas"
    z = Recommender(AutoscalerSpec(min_replicas=0, max_replicas=3, metrics=(MetricTarget("rps", 1e-300),)))
    assert z.recommend(0.0, 0, {"rps": 1e300}).replicas == 3


# ------------------------------------------------------------------ Recommender: invariants (hypothesis)
_values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=0, max_value=1e4))
_step = st.fixed_dictionaries({}, optional={"concurrency": _values, "gpu_util": _values, "queue_depth": _values})


@st.composite
def _specs(draw):
    lo = draw(st.integers(0, 5))
    hi = draw(st.integers(max(1, lo), 12))
    panic = draw(st.one_of(st.none(), st.sampled_from([6.0, 30.0])))
    up = ScalingRules(draw(st.sampled_from([0.0, 30.0, 120.0])))
    down = ScalingRules(draw(st.sampled_from([0.0, 60.0, 300.0])))
    return AutoscalerSpec(min_replicas=lo, max_replicas=hi, panic_window_s=panic, scale_up=up, scale_down=down,
                          metrics=(MetricTarget("concurrency", 8.0, activation=draw(st.sampled_from([0.0, 2.0]))),
                                   MetricTarget("gpu_util", 70.0), MetricTarget("queue_depth", 4.0)),
                          cooldown_s=draw(st.sampled_from([0.0, 120.0])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_specs(), start=st.integers(0, 20), steps=st.lists(st.tuples(st.sampled_from([5.0, 15.0, 61.0]), _step),
                                                              min_size=1, max_size=25))
def test_recommender_invariants(spec: AutoscalerSpec, start: int, steps) -> None:
    """min <= desired <= max (0 allowed only with minReplicas 0); no scale-down while in panic; a scale-down never
    goes below the highest raw recommendation of the scale-down stabilization window."""
    rec = Recommender(spec)
    now, cur = 0.0, start
    history: list[tuple[float, int]] = []  # (time, raw recommendation) as the recommender saw them
    for dt, samples in steps:
        now += dt
        r = rec.recommend(now, cur, samples)
        assert isinstance(r.replicas, int)
        assert r.replicas <= spec.max_replicas
        assert r.replicas >= spec.min_replicas
        if r.replicas == 0:
            assert spec.min_replicas == 0
        if r.panic:
            assert r.replicas >= min(cur, spec.max_replicas)
        if 0 < r.replicas < cur and r.replicas > max(1, spec.min_replicas) and r.limited_by is None:
            window = spec.scale_down.stabilization_window_s
            recent = [raw for t, raw in history if t > now - window]
            assert all(r.replicas >= min(raw, cur) for raw in recent), (history, r)
        raw = max(r.proposals.values()) if r.proposals else cur
        history.append((now, raw))
        cur = r.replicas


# ------------------------------------------------------------------ RightSizer
_OPTS = slice_catalog("H200")


@pytest.mark.parametrize("bad", [NAN, INF, -INF, "12", None])
def test_rightsizer_skips_an_option_with_an_unusable_capacity(bad) -> None:
    caps = {o.name: 10.0 for o in _OPTS}
    cheapest = "1g.18gb"
    caps[cheapest] = bad
    choice = RightSizer(_OPTS).choose(0.0, 5.0, caps, memory_need_mib=1000)
    assert choice.option.name != cheapest and choice.replicas >= 1 and math.isfinite(choice.gpu_cost)


def test_rightsizer_rejects_infinite_demand_and_bad_arguments_with_value_error() -> None:
    caps = {o.name: 10.0 for o in _OPTS}
    with pytest.raises(ValueError, match="demand"):
        RightSizer(_OPTS).choose(0.0, INF, caps, 1000)
    with pytest.raises(ValueError, match="min_replicas"):
        RightSizer(_OPTS).choose(0.0, 1.0, caps, 1000, min_replicas=-3)
    with pytest.raises(ValueError, match="min_dwell_s"):
        RightSizer(_OPTS, min_dwell_s=NAN)
    with pytest.raises(ValueError, match="memory_need_mib"):
        RightSizer(_OPTS).choose(0.0, 1.0, caps, -5)


def test_rightsizer_demand_too_big_for_any_option_is_a_value_error_not_overflow() -> None:
    caps = {o.name: 1e-300 for o in _OPTS}
    with pytest.raises(ValueError, match="replicas"):
        RightSizer(_OPTS).choose(0.0, 1e308, caps, 1000)


@settings(max_examples=200, deadline=None)
@given(demand=st.floats(0, 1e6), need=st.integers(0, 1_300_000), min_rep=st.integers(0, 4),
       caps=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.floats(0.01, 1e4)),
                     min_size=len(_OPTS), max_size=len(_OPTS)),
       times=st.lists(st.floats(0, 5000), min_size=1, max_size=6))
def test_rightsizer_never_picks_an_option_with_too_little_memory(demand, need, min_rep, caps, times) -> None:
    rs = RightSizer(_OPTS, hysteresis=0.2, min_dwell_s=600.0)
    table = {o.name: c for o, c in zip(_OPTS, caps, strict=True)}
    for now in sorted(times):
        try:
            choice = rs.choose(now, demand, table, need, min_replicas=min_rep)
        except ValueError:
            continue
        assert choice.option.memory_mib >= need
        cap = table[choice.option.name]
        assert isinstance(cap, float) and math.isfinite(cap) and cap > 0
        assert choice.replicas >= min_rep and choice.replicas * cap >= demand - 1e-6 * max(1.0, demand)


# ------------------------------------------------------------------ Prometheus answers
def _vec(value) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": value}]}}


@pytest.mark.parametrize("payload", [
    _vec(["x", "2"]), _vec([None, "2"]), _vec("ab"), _vec({"a": 1}),
    {"status": "success", "data": {"resultType": "scalar", "result": ["x", "2"]}},
    {"status": "success", "data": {"resultType": "scalar", "result": "ab"}},
    {"status": "success", "data": {"resultType": "vector", "result": [{"metric": "job", "value": [1, "2"]}]}},
])
def test_malformed_prometheus_answer_is_a_format_error(payload) -> None:
    with pytest.raises(PrometheusError) as err:
        parse_response(payload, "q")
    assert err.value.error_type == "format" and "'q'" in str(err.value)


def test_reduce_with_an_unknown_reducer_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="median"):
        reduce_samples(parse_response(_vec([1, "2"])), "median")


# ------------------------------------------------------------------ controller: one bad object, the others go on
def test_controller_bad_metric_values_do_not_scale_and_do_not_block_the_others() -> None:
    pytest.importorskip("kmock")
    from test_autoscaler_controller import NS, World  # the mock API server and the Prometheus stub

    world = World()
    try:
        for name in ("a", "b", "c"):
            world.deployment(name=name, replicas=2)
        world.autoscaler("a", scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "a"},
                         metrics=[{"name": "concurrency", "query": "neg", "target": 8}])
        world.autoscaler("b", scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "b"},
                         metrics=[{"name": "concurrency", "query": "weird", "target": 8}])
        world.autoscaler("c", scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "c"},
                         metrics=[{"name": "concurrency", "query": "good", "target": 8}])
        world.stub.set("neg", -50.0)
        world.stub.set("good", 64.0)
        plain = world.stub.answer  # a 200 answer whose sample time is not a number, as a broken proxy may send
        world.stub.answer = lambda params: ((200, _vec(["not-a-time", "5"])) if params.get("query") == "weird"
                                            else plain(params))
        ctl = world.controller()
        ctl.reflector.start()
        from test_k8s_scheduler import wait_for
        wait_for(lambda: len(ctl._objects()) == 3)
        outcomes = {o.key: o for o in ctl.run_pass()}
        assert ctl.recorder.flush(5)
        assert outcomes[f"{NS}/a"].result == "no_metrics" and world.replicas("a") == 2
        assert "negative" in outcomes[f"{NS}/a"].reason
        assert outcomes[f"{NS}/b"].result == "no_metrics" and world.replicas("b") == 2
        # 64 / 8 = 8 wanted, the HPA default scale-up rate allows 2 + max(100 %, 4 pods) = 6 at once
        assert outcomes[f"{NS}/c"].result == "scaled" and world.replicas("c") == 6
    finally:
        world.close()


# ------------------------------------------------------------------ gpupool autoscale simulate
def _run(*args: str):
    return runner.invoke(app, ["autoscale", "simulate", "--quiet", *args], env={"COLUMNS": "80"})


def test_unwritable_json_is_refused_before_the_run(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("running as a user who can write anywhere")
        res = _run("--scenario", str(REFERENCE), "--hours", "0.05", "--policies", "static",
                   "--json", str(ro / "r.json"))
    finally:
        ro.chmod(0o700)
    assert res.exit_code == 2, res.output
    assert "--json" in res.output and "Traceback" not in res.output


def test_json_into_a_missing_place_is_exit_2(tmp_path: Path) -> None:
    res = _run("--scenario", str(REFERENCE), "--hours", "0.05", "--policies", "static",
               "--json", "/proc/gpupool-breaker/r.json")
    assert res.exit_code == 2 and "--json" in res.output, res.output


@pytest.mark.parametrize("args, message", [
    (["--hours", "inf"], "--hours"),
    (["--hours", "30"], "durationHours (24)"),  # "the first H hours of the scenario's day": no longer than it
    (["--seed", "-1"], "--seed"),
    (["--throughput", "/nonexistent/t.yaml"], "--throughput"),
    (["--trace", "/nonexistent/t.csv"], "--trace"),
])
def test_bad_options_exit_2_naming_the_option(args: list[str], message: str) -> None:
    res = _run("--scenario", str(REFERENCE), "--policies", "static", "--hours", "0.05", *args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("which", ["scenario", "throughput"])
def test_non_utf8_scenario_or_throughput_file_is_exit_2(tmp_path: Path, which: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"\xff\xfekind: x\n")
    args = ["--scenario", str(bad)] if which == "scenario" else ["--scenario", str(REFERENCE),
                                                                  "--throughput", str(bad)]
    res = _run(*args, "--policies", "static", "--hours", "0.05")
    assert res.exit_code == 2, res.output
    assert "bad.yaml" in res.output and "UTF-8" in res.output


def test_negative_seed_in_the_scenario_names_the_field(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(REFERENCE.read_text().replace("seed: 42", "seed: -3"))
    res = _run("--scenario", str(sc), "--policies", "static", "--hours", "0.05")
    assert res.exit_code == 2 and "spec.seed" in res.output, res.output


def test_missing_trace_in_the_scenario_is_exit_2(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(REFERENCE.read_text().replace("trace: embedded", f"trace: {tmp_path / 'none.csv'}"))
    res = _run("--scenario", str(sc), "--policies", "static", "--hours", "0.05")
    assert res.exit_code == 2 and "none.csv" in res.output, res.output


def test_one_request_trace_names_the_file(tmp_path: Path) -> None:
    tr = tmp_path / "one.csv"
    tr.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.68,10,5\r\n")
    res = _run("--scenario", str(REFERENCE), "--policies", "static", "--hours", "0.05", "--trace", str(tr))
    assert res.exit_code == 2 and "one.csv" in res.output and "at least 2 requests" in res.output, res.output


# ------------------------------------------------------------------ GpuAutoscaler spec parsing
def _cr(**spec):
    base = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"}, "maxReplicas": 5,
            "metrics": [{"name": "gpu_util", "target": 70}]}
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "GpuAutoscaler",
            "metadata": {"name": "a", "namespace": "ns"}, "spec": {**base, **spec}}


_SLICE = {"gpuModel": "H200", "demandMetric": "gpu_util", "capacityPerReplica": {"1g.18gb": 1.0}}


@pytest.mark.parametrize("spec, field, words", [
    ({"minReplicas": 6}, "spec", "maxReplicas 5 must be >= max(1, minReplicas=6)"),
    ({"maxReplicas": 1e300}, "spec.maxReplicas", "int32"),
    ({"metrics": [{"name": "gpu_util", "target": 10**400}]}, "spec.metrics[0].target", "finite"),
    ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 15}]}}},
     "spec.behavior.scaleUp.policies[0].value", "must be > 0"),
    ({"panicThreshold": 50}, "spec.panicThreshold", "percentage"),
    ({"minReplicas": 10**400}, "spec.minReplicas", "finite"),  # OverflowError in float()
    ({"behavior": {"scaleDown": {"policies": [{"type": "Pods", "value": 10**400, "periodSeconds": 15}]}}},
     "spec.behavior.scaleDown.policies[0].value", "finite"),
    ({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": ["Deployment"], "name": "llm"}},
     "spec.scaleTargetRef.kind", "Deployment"),  # unhashable: TypeError
    ({"slicePolicy": {**_SLICE, "hysteresis": 5}}, "spec.slicePolicy.hysteresis", "[0, 1)"),
    ({"slicePolicy": {**_SLICE, "memoryMiB": 10**7}}, "spec.slicePolicy.memoryMiB", "largest: 1g.18gb"),
])
def test_bad_gpu_autoscaler_specs_name_the_field_once(spec, field: str, words: str) -> None:
    from gpupool.k8s.autoscaler.crd import SpecError, parse_gpu_autoscaler

    with pytest.raises(SpecError) as err:
        parse_gpu_autoscaler(_cr(**spec))
    assert err.value.field == field and words in str(err.value)
    assert not str(err.value).startswith(f"{field}: {field}") and "spec: spec:" not in str(err.value)


@pytest.mark.parametrize("obj", [None, [], "GpuAutoscaler"])
def test_a_gpu_autoscaler_that_is_not_a_mapping_is_a_spec_error(obj) -> None:
    from gpupool.k8s.autoscaler.crd import SpecError, parse_gpu_autoscaler

    with pytest.raises(SpecError):
        parse_gpu_autoscaler(obj)


def test_peak_hour_past_the_day_names_the_field(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(REFERENCE.read_text().replace("peakHour: 14", "peakHour: 30"))
    res = _run("--scenario", str(sc), "--policies", "static", "--hours", "0.05")
    assert res.exit_code == 2 and "spec.workload.peakHour" in res.output, res.output


@pytest.mark.parametrize("spec", [{"tolerance": 1}, {"maxReplicas": 2**31}, {"minReplicas": 2**31, "maxReplicas": 5},
                                  {"slicePolicy": {**_SLICE, "hysteresis": 1}}])
def test_crd_schema_refuses_what_the_controller_would_refuse(spec) -> None:
    """The CRD's bounds match the parser's: the API server refuses at apply time what would be an InvalidSpec."""
    jsonschema = pytest.importorskip("jsonschema")
    from gpupool.k8s.autoscaler.crd import SpecError, parse_gpu_autoscaler
    from test_deploy import validate_gpuautoscaler

    with pytest.raises(SpecError):
        parse_gpu_autoscaler(_cr(**spec))
    with pytest.raises(jsonschema.ValidationError):
        validate_gpuautoscaler(_cr(**spec))


@pytest.mark.parametrize("args, option", [
    (["--sync-period", "inf"], "--sync-period"),  # Event.wait(inf) raises OverflowError in the reconcile thread
    (["--prometheus-timeout", "inf"], "--prometheus-timeout"),  # int(inf) in every query's timeout parameter
    (["--prometheus-retries", "1000000"], "--prometheus-retries"),
])
def test_autoscaler_cli_refuses_unbounded_periods(args: list[str], option: str) -> None:
    res = runner.invoke(app, ["autoscaler", "--prometheus-url", "http://p:9090", "--kubeconfig",
                              "/nonexistent/kubeconfig", *args])
    assert res.exit_code == 2 and option in res.output and "no usable Kubernetes" not in res.output, res.output


@pytest.mark.parametrize("old, new, words", [
    ("replicas: auto", "replicas: 100000000", "spec.policies.static.replicas: at most 10,000"),  # was a hang
    ("replicas: auto", "replicas: 0", "spec.policies.static.replicas: must be >= 1"),
    ("peakRps: 6.0 ", "peakRps: 1000000000000.0 ", "more than the simulator's 20,000,000"),  # was memory
    ("durationHours: 24", "durationHours: 100000", "spec.durationHours: at most 744"),  # a 3.6e8-point grid
    ("checkpointSeconds: [10, 45]", "checkpointSeconds: [10, .inf]", "spec.lending.checkpointSeconds"),
])
def test_huge_or_impossible_scenario_numbers_exit_2(tmp_path: Path, old: str, new: str, words: str) -> None:
    text = REFERENCE.read_text()
    assert old in text
    sc = tmp_path / "s.yaml"
    sc.write_text(text.replace(old, new, 1))
    hours = ["--hours", "0.05"]  # durationHours 1e5 with --hours 0.05 ran out of memory sizing the static policy
    res = _run("--scenario", str(sc), "--policies", "static", *hours)
    assert res.exit_code == 2 and words in res.output, res.output


def test_rightsized_hysteresis_of_one_or_more_names_the_field(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    text = REFERENCE.read_text()
    old = "      headroom: 0.5\n      autoscaler: *gpupool"
    assert old in text
    sc.write_text(text.replace(old, "      headroom: 0.5\n      hysteresis: 1.5\n      autoscaler: *gpupool", 1))
    res = _run("--scenario", str(sc), "--policies", "gpupool", "--hours", "0.05")
    assert res.exit_code == 2 and "spec.policies.gpupool.hysteresis" in res.output, res.output


def test_rightsized_slices_as_a_string_is_not_read_letter_by_letter(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(REFERENCE.read_text().replace("slices: [1xH200]", "slices: 1xH200", 1))
    res = _run("--scenario", str(sc), "--policies", "gpupool-whole", "--hours", "0.05")
    assert res.exit_code == 2 and "spec.policies.gpupool-whole.slices: a list" in res.output, res.output


def test_min_replicas_past_the_simulator_bound_names_the_field(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    text = REFERENCE.read_text()
    old = "        minReplicas: 1\n        maxReplicas: 4\n        metrics: [{name: cpu_util"
    assert old in text
    sc.write_text(text.replace(old, old.replace("minReplicas: 1", "minReplicas: 100000000")
                               .replace("maxReplicas: 4", "maxReplicas: 100000000"), 1))
    sc.write_text(sc.read_text().replace("poolGpus: 4 ", "poolGpus: 100000000 ", 1))
    res = _run("--scenario", str(sc), "--policies", "hpa-cpu", "--hours", "0.05")
    assert res.exit_code == 2 and "hpa-cpu.autoscaler.minReplicas: at most 10,000" in res.output, res.output


def test_a_trace_of_one_instant_names_the_file(tmp_path: Path) -> None:
    tr = tmp_path / "same.csv"
    tr.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n2023-11-16 18:15:46,10,5\n")
    res = _run("--scenario", str(REFERENCE), "--policies", "static", "--hours", "0.05", "--trace", str(tr))
    assert res.exit_code == 2 and "same.csv" in res.output and "same timestamp" in res.output, res.output


@pytest.mark.parametrize("scale", [{"spec": {"replicas": "three"}}, {"spec": {"replicas": -2}}, ["not", "a", "scale"],
                                   {"spec": {"replicas": 2.5}}])
def test_a_scale_answer_that_is_not_a_replica_count_is_failed_get_scale(scale) -> None:
    pytest.importorskip("kmock")
    from test_autoscaler_controller import World

    world = World()
    try:
        world.deployment(replicas=2)
        world.autoscaler()
        world.stub.set("llm_concurrency", 64.0)
        ctl = world.controller()
        ctl._read_scale = lambda cfg: scale  # what a broken proxy in front of the API server may answer
        out = world.reconcile(ctl)
        assert out.result == "failed_get_scale" and "not a replica count" in out.reason
        assert world.replicas() == 2 and world.events("FailedGetScale")
    finally:
        world.close()


def test_policies_listed_twice_run_once_and_an_empty_list_is_refused() -> None:
    res = _run("--scenario", str(REFERENCE), "--policies", "static,static", "-p", "static", "--hours", "0.05",
               "--json", "-")
    assert res.exit_code == 0, res.output
    assert res.output.count('"policy": "static"') == 1
    res = _run("--scenario", str(REFERENCE), "--policies", ",", "--hours", "0.05")
    assert res.exit_code == 2 and "--policies" in res.output, res.output


class _RawPrometheus:
    """A server on 127.0.0.1 that answers every query with ``body`` (status, content type) after ``delay_s``."""

    def __init__(self, status: int, body: bytes, ctype: str = "text/html", delay_s: float = 0.0) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                import time as _t

                _t.sleep(delay_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", ctype)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass  # the client gave up (timeout)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status, body, ctype, delay, kind", [
    (200, b"<html><body>Welcome to nginx</body></html>", "text/html", 0.0, "format"),  # wrong upstream, 200
    (200, b"", "application/json", 0.0, "format"),  # empty body
    (200, b'{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "5"]}',
     "application/json", 0.0, "format"),  # truncated JSON
    (200, b'{"status": "success"}', "application/json", 2.5, "transport"),  # slower than the client's timeout
])
def test_prometheus_client_bad_answers_are_prometheus_errors(status, body, ctype, delay, kind) -> None:
    import time as _t

    from gpupool.k8s.autoscaler.prometheus import PrometheusClient

    server = _RawPrometheus(status, body, ctype, delay)
    client = PrometheusClient(server.url, timeout=1.0, retries=0)
    try:
        t0 = _t.monotonic()
        with pytest.raises(PrometheusError) as err:
            client.value("up")
        assert err.value.error_type == kind and _t.monotonic() - t0 < 2.0  # bounded by the timeout
    finally:
        client.close()
        server.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_specs(), start=st.integers(1, 20), steps=st.lists(st.tuples(st.sampled_from([5.0, 15.0, 61.0]), _step),
                                                              min_size=1, max_size=25))
def test_recommender_scale_up_never_exceeds_the_lowest_recommendation_of_its_window(spec, start, steps) -> None:
    """HPA scale-up stabilization: outside panic (which bypasses it) and the minReplicas floor, a scale-up goes no
    higher than the lowest raw recommendation of the scale-up window (this one included)."""
    rec = Recommender(spec)
    now, cur = 0.0, start
    for dt, samples in steps:
        now += dt
        r = rec.recommend(now, cur, samples)
        if cur > 0 and r.replicas > cur and not r.panic and r.replicas > max(1, spec.min_replicas):
            window = spec.scale_up.stabilization_window_s
            recent = [raw for t, raw in rec._recs[:-1] if t > now - window] + [rec._recs[-1][1]]  # + this one
            assert r.replicas <= min(recent), (rec._recs, r)
        cur = r.replicas
