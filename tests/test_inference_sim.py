"""The inference simulator (gpupool.sim.inference, issue 10 items 4-5): trace loader, throughput table,
arrivals, replica mechanics against hand-computed numbers, policies, lending, and the reference scenario's
"done when"."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pytest

from gpupool.engine.autoscale import AutoscalerSpec, MetricTarget
from gpupool.engine.rightsize import slice_catalog
from gpupool.sim.inference import (
    Burst,
    Envelope,
    InferenceConfigError,
    LendingSpec,
    ReplicaSpec,
    Workload,
    load_throughput_table,
    simulate,
    synthetic_arrivals,
    trace_arrivals,
)
from gpupool.sim.inference_policies import (
    RecommenderPolicy,
    StaticPolicy,
    TokenStats,
    load_scenario,
    parse_scenario,
    slice_capacity,
)
from gpupool.sim.inference_report import run_scenario, verdict
from gpupool.traces.azure_llm import load_azure_llm, load_embedded_azure_llm
from gpupool.traces.errors import TraceFormatError

ROOT = Path(__file__).resolve().parents[1]
SHARED_CONV = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
REFERENCE = ROOT / "examples" / "autoscale" / "reference.yaml"
TABLE = load_throughput_table()


# ---------------------------------------------------------------- trace loader


def test_embedded_trace_is_the_conversation_trace() -> None:
    tr = load_embedded_azure_llm()
    assert len(tr) == 19_366
    assert tr.time_s[0] == 0.0 and np.all(np.diff(tr.time_s) >= 0)
    assert 3400 < tr.span_s < 3600
    assert tr.prompt_tokens.min() >= 1 and tr.output_tokens.min() >= 1
    assert tr.start == "2023-11-16 18:15:46.6805900"


@pytest.mark.skipif(not SHARED_CONV.exists(), reason="../shared is not checked out beside this repository")
def test_embedded_copy_equals_shared_trace() -> None:
    a, b = load_embedded_azure_llm(), load_azure_llm(SHARED_CONV)
    assert np.array_equal(a.time_s, b.time_s) and np.array_equal(a.output_tokens, b.output_tokens)
    assert np.array_equal(a.prompt_tokens, b.prompt_tokens)


@pytest.mark.parametrize(("body", "line", "column", "words"), [
    ("2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:4x.1,3,4\n", 3, "TIMESTAMP", "expected a time"),
    ("2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47.1,-3,4\n", 3, "ContextTokens", "expected a value >= 1"),
    ("2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47.1,3,0\n", 3, "GeneratedTokens", ">= 1"),
    ("2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:45.1,3,4\n", 3, "TIMESTAMP", "backwards"),
    ("2023-11-16 18:15:46.68,10\n", 2, None, "expected 3 fields"),
])
def test_loader_names_file_line_and_column(tmp_path: Path, body: str, line: int, column: str | None,
                                           words: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
    with pytest.raises(TraceFormatError) as e:
        load_azure_llm(f)
    assert e.value.line == line and e.value.column == column and words in str(e.value)
    assert str(e.value).startswith(f"bad.csv:{line}:")


def test_loader_reads_gzip_and_rejects_bad_header(tmp_path: Path) -> None:
    f = tmp_path / "t.csv.gz"
    f.write_bytes(gzip.compress(b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5,6\n"
                                b"2023-11-16 18:00:01.5,7,8\n"))
    tr = load_azure_llm(f)
    assert list(tr.time_s) == [0.0, 1.5] and list(tr.prompt_tokens) == [5, 7]
    g = tmp_path / "h.csv"
    g.write_text("TIMESTAMP,Prompt,GeneratedTokens\n")
    with pytest.raises(TraceFormatError, match="column 'Prompt'"):
        load_azure_llm(g)


# ---------------------------------------------------------------- throughput table


def test_table_costs_and_memory_agree_with_the_engine_catalog() -> None:
    cat = {o.name: o for o in slice_catalog("H200")}
    for name, sl in TABLE.slices.items():
        assert name in cat, name
        assert sl.gpu_fraction == pytest.approx(cat[name].gpu_fraction, abs=1e-3), name
        assert sl.memory_mib == pytest.approx(cat[name].memory_mib, abs=1), name


def test_table_mig_rows_follow_the_stated_derivation() -> None:
    """MIG rows: memory-bound step x 8/memory slices, prefill x SMs/132 of the whole-GPU row (header)."""
    whole = TABLE.slices["1xH200"]
    for name, sms, mem_slices in (("3g.71gb", 60, 4), ("2g.35gb", 32, 2), ("1g.35gb", 26, 2), ("4g.71gb", 64, 4)):
        sl = TABLE.slices[name]
        assert sl.step_s == pytest.approx(whole.step_s * 8 / mem_slices, rel=0.01)
        assert sl.prefill_tps == pytest.approx(25000 * sms / 132, rel=0.01)
    assert not TABLE.fits("1g.18gb") and TABLE.fits("2g.35gb")


def test_table_errors_name_the_field(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("model: {name: m, weights_mib: 100, overhead_mib: 0, kv_bytes_per_token: 1024, min_kv_tokens: 1,"
                 " max_num_seqs: 8}\ngpus: {H200: {slices: {x: {kind: whole, gpu_fraction: 1,"
                 " prefill_tokens_per_s: -5, decode_step_ms: 1, decode_step_ms_per_seq: 0, memory_mib: 1000}}}}\n")
    with pytest.raises(InferenceConfigError, match=r"t.yaml: gpus.H200.slices.x.prefill_tokens_per_s"):
        load_throughput_table(f)
    with pytest.raises(InferenceConfigError, match="no throughput for GPU model 'A100'"):
        load_throughput_table(None, "A100")


# ---------------------------------------------------------------- arrivals


def test_trace_arrivals_follow_the_envelope_and_are_deterministic() -> None:
    tr = load_embedded_azure_llm()
    env = Envelope(1.0, 5.0, 14.0, (Burst(10 * 3600, 1200, 3.0),))
    a = trace_arrivals(tr.time_s, tr.prompt_tokens, tr.output_tokens, env, 86_400, 7, "t")
    b = trace_arrivals(tr.time_s, tr.prompt_tokens, tr.output_tokens, env, 86_400, 7, "t")
    c = trace_arrivals(tr.time_s, tr.prompt_tokens, tr.output_tokens, env, 86_400, 8, "t")
    assert np.array_equal(a.arrival_s, b.arrival_s) and not np.array_equal(a.arrival_s, c.arrival_s)
    grid = np.arange(0, 86_400, 1.0)
    expected = env.rate(grid).sum()
    assert len(a) == pytest.approx(expected, rel=0.01)
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[-1] < 86_400
    night = np.sum((a.arrival_s >= 1.5 * 3600) & (a.arrival_s < 2.5 * 3600))
    noon = np.sum((a.arrival_s >= 13.5 * 3600) & (a.arrival_s < 14.5 * 3600))
    burst = np.sum((a.arrival_s >= 10 * 3600 + 120) & (a.arrival_s < 10 * 3600 + 1080)) / 960
    assert noon / night == pytest.approx(5.0, rel=0.1)
    assert burst / env.rate(np.array([10.3 * 3600]))[0] == pytest.approx(1.0, rel=0.15)
    s = synthetic_arrivals(env, 86_400, 3, tr.prompt_tokens, tr.output_tokens)
    assert len(s) == pytest.approx(expected, rel=0.02)


# ---------------------------------------------------------------- replica mechanics (hand-computed)


def _wl(times: list[float], prompt: list[int], out: list[int], duration: float = 600.0) -> Workload:
    return Workload(np.array(times, float), np.array(prompt), np.array(out), duration, "hand")


def _static(n: int = 1, sl: str = "1xH200") -> StaticPolicy:
    return StaticPolicy("static", sl, n)


def test_one_request_prefill_then_decode() -> None:
    whole = TABLE.slices["1xH200"]
    r = simulate(_wl([10.0], [2500], [101]), TABLE, _static(), slo_s=10)
    assert r.ttft_s[0] == pytest.approx(2500 / 25000)  # 0.1 s of prefill
    assert r.e2e_s[0] == pytest.approx(0.1 + 100 * whole.step(1))  # 100 more tokens at 4.58 ms
    assert r.gpu_hours == pytest.approx(600 / 3600)


def test_continuous_batching_two_requests() -> None:
    """B arrives while A decodes: A pauses for B's prefill, then both decode at step(2)."""
    whole = TABLE.slices["1xH200"]
    r = simulate(_wl([0.0, 0.05], [1000, 1000], [201, 201]), TABLE, _static(), slo_s=10)
    pa = 1000 / 25000  # 0.04 s
    a_tokens_before_b = (0.05 - pa) / whole.step(1)  # A decodes alone from 0.04 to 0.05
    b_done_prefill = 0.05 + pa
    assert r.ttft_s[1] == pytest.approx(pa)
    # both decode at step(2) until B finishes its 200 tokens; A, ahead, finishes first
    a_left = 200 - a_tokens_before_b
    assert r.e2e_s[0] == pytest.approx(b_done_prefill + a_left * whole.step(2), rel=1e-6)
    b_end = b_done_prefill + a_left * whole.step(2) + (200 - a_left) * whole.step(1)
    assert r.e2e_s[1] + 0.05 == pytest.approx(b_end, rel=1e-6)


def test_batch_cap_and_kv_limit_queue_requests() -> None:
    n = TABLE.model.max_num_seqs + 1
    r = simulate(_wl([0.0] * n, [10] * n, [500] * n), TABLE, _static(), slo_s=100)
    # the last one waits for a slot: its TTFT is at least one completion of a 500-token request
    assert r.ttft_s[-1] > 499 * TABLE.slices["1xH200"].step(TABLE.model.max_num_seqs) * 0.99
    big = int(TABLE.slices["2g.35gb"].kv_tokens(TABLE.model) * 0.6)
    r2 = simulate(_wl([0.0, 0.0], [big, big], [10, 10]), TABLE, _static(1, "2g.35gb"), slo_s=100)
    assert r2.ttft_s[1] > r2.e2e_s[0]  # the KV cache holds one at a time


def test_startup_delay_and_crash_retries() -> None:
    pol = RecommenderPolicy("r", "1xH200", AutoscalerSpec(min_replicas=1, max_replicas=3,
                                                          metrics=(MetricTarget("concurrency", 2),)))
    times = list(np.linspace(0, 500, 400))
    r = simulate(_wl(times, [500] * 400, [300] * 400, 900), TABLE, pol, slo_s=100, lag_s=0,
                 replica=ReplicaSpec(startup_s=60.0, crash_mtbf_h=0.05), seed=3)
    assert r.crashes >= 1 and r.retried >= 1
    assert r.unfinished == 0 and np.all(np.isfinite(r.e2e_s))
    assert r.max_replicas >= 2


def test_cpu_util_stays_low_while_the_gpu_saturates() -> None:
    tr = load_embedded_azure_llm()
    env = Envelope(20.0, 20.0)
    wl = trace_arrivals(tr.time_s, tr.prompt_tokens, tr.output_tokens, env, 1800, 1, "t")
    spec = AutoscalerSpec(max_replicas=4, metrics=(MetricTarget("cpu_util", 50),))
    pol = RecommenderPolicy("hpa-cpu", "1xH200", spec)
    r = simulate(wl, TABLE, pol, slo_s=15, lag_s=15)
    assert r.max_metric["gpu_util"] == pytest.approx(100.0)
    assert r.max_metric["cpu_util"] < 35.0
    assert r.max_replicas == 1  # never scaled: CPU stays under its target


def test_lending_and_bounded_reclaim() -> None:
    pol = RecommenderPolicy("q", "1xH200", AutoscalerSpec(max_replicas=4, metrics=(MetricTarget("rps", 3.0),)))
    times = list(np.arange(0, 1800, 2.0)) + list(np.arange(1800, 2400, 0.1))
    n = len(times)
    lend = LendingSpec(True, 300.0, (10.0, 45.0), 30.0)
    r = simulate(_wl(times, [500] * n, [100] * n, 3000), TABLE, pol, slo_s=60, pool_gpus=4, lending=lend, lag_s=0)
    assert r.lent_gpu_hours > 0.5  # 3 idle GPUs lent from 300 s on
    assert r.reclaims and max(r.reclaims) <= 30.0 + 1e-9 and min(r.reclaims) >= 10.0
    static = simulate(_wl(times, [500] * n, [100] * n, 3000), TABLE, _static(4), slo_s=60, pool_gpus=4,
                      lending=lend)
    assert static.lent_gpu_hours == 0.0


def test_lending_lends_every_idle_gpu_of_the_pool() -> None:
    """2 static replicas in a pool of 4: both idle GPUs are lent once idle for lend_after_s (the whole pool counts,
    not pool - 1)."""
    lend = LendingSpec(True, 300.0, (10.0, 45.0), 30.0)
    r = simulate(_wl([10.0], [500], [100], 3900.0), TABLE, _static(2), slo_s=60, pool_gpus=4, lending=lend)
    assert r.lent_gpu_hours == pytest.approx(2 * (3900.0 - 300.0) / 3600, rel=0.02)


def test_capacity_model_orders_slices() -> None:
    stats = TokenStats(1155.0, 211.0, 601.0)
    caps = {n: slice_capacity(TABLE.slices[n], TABLE.model, 15.0, stats) for n in ("1xH200", "3g.71gb", "2g.35gb")}
    assert caps["1xH200"].rps > caps["3g.71gb"].rps > caps["2g.35gb"].rps == 0.0
    assert caps["1xH200"].e2e_p99_s <= 7.5 and caps["1xH200"].batch <= TABLE.model.max_num_seqs


def test_scenario_errors_name_the_field() -> None:
    with pytest.raises(InferenceConfigError, match=r"s.yaml: spec.slo.e2eSeconds: must be > 0"):
        parse_scenario({"kind": "InferenceScenario", "spec": {"slo": {"e2eSeconds": -1}}}, "s.yaml")
    doc = {"kind": "InferenceScenario", "spec": {"slo": {"e2eSeconds": 5}, "workload": {"troughRps": 1, "peakRps": 2},
                                                 "policies": {"x": {"kind": "magic"}}}}
    with pytest.raises(InferenceConfigError, match=r"spec.policies.x.kind"):
        parse_scenario(doc, "s.yaml")


# ---------------------------------------------------------------- the reference scenario ("done when")


@pytest.fixture(scope="module")
def reference_run():
    return run_scenario(load_scenario(REFERENCE))


def test_reference_scenario_done_when(reference_run) -> None:
    """The issue's condition on the full reference day: gpupool meets the SLO for >= 99 % of requests with
    fewer GPU-hours than static peak and than every other policy that meets it; HPA on CPU misses it and
    says why."""
    rows = {r["policy"]: r for r in reference_run.rows}
    assert set(rows) >= {"static", "hpa-cpu", "hpa-gpu", "keda-queue", "knative", "gpupool"}
    g = rows["gpupool"]
    assert g["slo_attainment"] >= 0.99 and g["meets_slo"]
    assert g["gpu_hours"] < rows["static"]["gpu_hours"]
    for name, row in rows.items():
        if name != "gpupool" and row["meets_slo"]:
            assert g["gpu_hours"] < row["gpu_hours"], name
    cpu = rows["hpa-cpu"]
    assert not cpu["meets_slo"] and cpu["e2e_p99_s"] > reference_run.scenario.slo_s
    why = reference_run.explanations["hpa-cpu"]
    assert "MISSES" in why and "cpu util peaked at" in why and "< target 50%" in why
    assert "never scaled past 1 replica" in why
    lines = verdict(reference_run)
    assert lines and lines[0].startswith("gpupool meets the SLO with the fewest GPU-hours")
    # elastic lending: the autoscaled policies lend the idle GPUs, reclaims are bounded by the grace period
    assert g["lent_gpu_hours"] > 0 and (g["reclaim_max_s"] or 0) <= reference_run.scenario.lending.grace_s
    assert len(reference_run.workload) > 200_000


def test_reference_scenario_is_fast_enough(reference_run) -> None:
    """Per-policy CPU-bound simulation time stays well under a minute for the whole reference day."""
    assert sum(r.wall_s for r in reference_run.results) < 240  # generous: 2 shared cores under contention
    assert all(math.isfinite(r.gpu_hours) for r in reference_run.results)


def test_synthetic_scenario_with_crashes_runs_every_policy_kind() -> None:
    doc = {"kind": "InferenceScenario", "metadata": {"name": "syn"}, "spec": {
        "durationHours": 1, "seed": 5, "poolGpus": 3, "slo": {"e2eSeconds": 15},
        "workload": {"source": "synthetic", "troughRps": 2, "peakRps": 6, "peakHour": 0.5,
                     "bursts": [{"startHour": 0.5, "minutes": 5, "factor": 2}]},
        "replica": {"startupSeconds": 30, "crashMtbfHours": 0.5},
        "policies": {
            "static": {"kind": "static", "replicas": "auto"},
            "keda": {"kind": "recommender", "autoscaler": {"minReplicas": 0, "maxReplicas": 9,
                                                           "metrics": [{"name": "queue_depth", "target": 2}]}},
            "gpupool": {"kind": "rightsized", "autoscaler": {"maxReplicas": 8}},
        }}}
    run = run_scenario(parse_scenario(doc, "syn.yaml"))
    rows = {r["policy"]: r for r in run.rows}
    assert "synthetic" in run.workload.source and len(run.workload) > 5000
    assert sum(r["crashes"] for r in rows.values()) >= 1
    assert all(r["unfinished"] == 0 for r in rows.values())
    assert rows["keda"]["replicas_max"] <= 3  # maxReplicas 9 cut to the 3-GPU pool
    assert run.explanations["gpupool"].startswith("gpupool: ")


def test_scale_to_zero_in_the_simulator_follows_the_scale_down_policy_keda7204() -> None:
    """KEDA #7204 in the inference simulator: load for two minutes, then none; scale-down 1 pod per 60 s,
    cooldown 300 s, minReplicas 0: the replicas come down one at a time, at least 60 s apart, to 0."""
    from gpupool.engine.autoscale import ScalingPolicy, ScalingRules

    n = 1200
    wl = _wl([i * 0.1 for i in range(n)], [200] * n, [200] * n, duration=1500.0)  # 10 req/s for 120 s
    spec = AutoscalerSpec(metrics=(MetricTarget("concurrency", 2, activation=0),), min_replicas=0, max_replicas=4,
                          cooldown_s=300, scale_down=ScalingRules(300.0, (ScalingPolicy("Pods", 1, 60.0),)))
    r = simulate(wl, TABLE, RecommenderPolicy("keda", "1xH200", spec), slo_s=60)
    t, reps = r.series["t_s"], [int(x) for x in r.series["replicas"]]
    assert max(reps) >= 3 and reps[-1] == 0
    peak = reps.index(max(reps))
    drops = [(t[i], reps[i - 1] - reps[i]) for i in range(peak + 1, len(reps)) if reps[i] < reps[i - 1]]
    assert all(d == 1 for _, d in drops), drops
    assert all(b - a >= 60 for (a, _), (b, _) in zip(drops, drops[1:], strict=False)), drops
