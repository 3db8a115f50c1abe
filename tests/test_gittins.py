"""Tiresias-G job order: Gittins index (hand-computed values), online size model, prior files, the
preemption bound, and a small simulation where Gittins beats FIFO and LAS on mean JCT."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.pool.config import make_order
from gpupool.engine.pool.gittins import GittinsOrder, SizeModel, SizeTable, parse_sizes
from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.ordering import TiresiasOrder
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import PoolConfig, PoolScheduler, job_policy
from gpupool.model import NodeSpec
from gpupool.policies import make_policy
from gpupool.sim.fairness import fairness_cost, one_queue
from gpupool.sim.jobs import JobSimConfig, run_jobs
from gpupool.topology import TopologyConfig
from gpupool.traces import JobRecord

H = 3600.0
FLAT = TopologyConfig(factors={t: 1.0 for t in ("nvlink", "node", "switch", "spine")})


def one_gpu() -> list[NodeSpec]:
    return [NodeSpec("n0", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=1, gpu_model="V100M32",
                     nvlink_domain="n0", rack="r0", switch="leaf0")]


def sim(pool: PoolConfig | None, records: list[JobRecord], nodes: list[NodeSpec] | None = None):
    cfg = JobSimConfig(restart_overhead_s=0.0, topology=FLAT, sample_interval_s=0, pool=pool)
    return run_jobs(nodes or one_gpu(), records, "gpupool", config=cfg)


def jct(res) -> dict[str, float]:
    return {j["job_id"]: j["jct"] for j in res.jobs}


# ------------------------------------------------------------------------------------------ the index
def test_gittins_index_by_hand_on_three_sizes():
    t = SizeTable([4.0, 1.0, 2.0])  # sorted: 1, 2, 4 GPU-seconds
    # a=0, delta=1: P(S <= 1) = 1/3; E[min(S, 1)] = (1 + 1 + 1)/3 = 1 -> G = 1/3
    assert t.gittins(0.0, 1.0) == pytest.approx(1 / 3)
    # a=1, delta=1: S > 1 is {2, 4}; P(S - 1 <= 1) = 1/2; E[min(S - 1, 1)] = (1 + 1)/2 = 1 -> 1/2
    assert t.gittins(1.0, 1.0) == pytest.approx(0.5)
    # a=2, delta=1: only 4 is left, it does not end within 1 -> P = 0 -> G = 0
    assert t.gittins(2.0, 1.0) == 0.0
    # a=2, delta=2: 4 ends within 2 -> P = 1, E = 2 -> G = 1/2
    assert t.gittins(2.0, 2.0) == pytest.approx(0.5)
    # a=0.5, delta=2: S > 0.5 all three; ends within 2.5: {1, 2} -> P = 2/3;
    # E = (0.5 + 1.5 + 2)/3 = 4/3 -> G = (2/3)/(4/3) = 1/2
    assert t.gittins(0.5, 2.0) == pytest.approx(0.5)
    assert t.gittins(4.0, 1.0) == 0.0  # beyond every size
    assert SizeTable([]).gittins(0.0, 1.0) == 0.0
    with pytest.raises(ValueError):
        t.gittins(0.0, 0.0)


def test_expected_remaining_by_hand():
    t = SizeTable([1.0, 2.0, 4.0])
    assert t.remaining(0.0) == pytest.approx(7 / 3)
    assert t.remaining(1.0) == pytest.approx(2.0)  # (2 + 4)/2 - 1
    assert t.remaining(3.0) == pytest.approx(1.0)
    assert math.isinf(t.remaining(4.0))
    with pytest.raises(ValueError):
        SizeTable([1.0, -2.0])


def test_gittins_prefers_a_job_close_to_a_common_size():
    # eight 2-h jobs and two 20-h ones: at 1.5 h attained the job is likely a 2-h one about to end
    t = SizeTable([7200.0] * 8 + [72000.0] * 2)
    assert t.gittins(5400.0, 3600.0) > t.gittins(3600.0, 3600.0) > t.gittins(10800.0, 3600.0) == 0.0


# ----------------------------------------------------------------------------------- online model
def test_size_model_learns_per_queue_with_pooled_fallback_and_prior():
    m = SizeModel(prior=[100.0], min_samples=3, refresh_every=1)
    assert m.table("a").n == 1  # the prior only, pooled
    v = m.version
    assert m.observe("a", 10.0) and m.version == v + 1
    m.observe("a", 20.0)
    assert m.table("a") is m.pooled and m.pooled.n == 3  # "a" has 2 < 3 sizes of its own
    m.observe("a", 30.0)
    assert list(m.table("a").s) == [10.0, 20.0, 30.0]  # its own, without the prior
    assert m.table("b") is m.pooled and m.pooled.n == 4  # prior + every queue's sizes
    # per (queue, GPU count) once it has enough sizes
    for s in (1.0, 2.0, 3.0):
        m.observe("a", s, gpus=8)
    assert list(m.table("a", 8).s) == [1.0, 2.0, 3.0]
    assert m.table("a", 1) is m.table("a")


def test_size_model_rebuilds_in_batches():
    m = SizeModel(min_samples=1, refresh_every=5)
    rebuilt = [m.observe("q", float(k)) for k in range(12)]
    assert rebuilt == [True, False, False, False, False, True, False, False, False, False, True, False]
    assert m.table("q").n == 11  # the 12th size waits for the next rebuild


def test_order_scores_and_names():
    order = make_order("gittins", (3600.0,), None, delta=3600.0, model=SizeModel(min_samples=1))
    assert isinstance(order, GittinsOrder) and isinstance(order, TiresiasOrder) and order.name == "gittins"
    assert order.score("q", 0.0) == 0.0  # nothing known: FIFO within a level, as Tiresias-L
    for s in [7200.0] * 8 + [72000.0] * 2:
        order.model.observe("q", s)
    order.model.rebuild()
    assert order.score("q", 5400.0) < order.score("q", 3600.0)  # higher index, smaller score
    assert order.score("q", 80000.0) == 80000.0  # beyond every size: as long again
    rem = make_order("remaining", model=SizeModel(prior=[10.0, 30.0]))
    assert rem.name == "remaining" and rem.score("q", 0.0) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="unknown job order"):
        make_order("sjf")


def test_parse_sizes_formats_and_errors():
    assert parse_sizes("# prior\n100\n\n2.5e3\n") == [100.0, 2500.0]
    assert parse_sizes("size_gpu_s,x\n10,a\n20,b\n") == [10.0, 20.0]
    assert parse_sizes("duration,num_gpu\n100,4\n") == [400.0]
    assert parse_sizes("duration,num_gpus\n100,4\n") == [400.0]
    # a slice of the Philly trace as it is: gpu_time is GPU-seconds
    philly = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,2,132.0,11cb48\n"
    assert parse_sizes(philly, "philly.csv") == [132.0]
    with pytest.raises(ValueError, match="p.txt:3"):
        parse_sizes("1\n2\nabc\n", "p.txt")
    with pytest.raises(ValueError, match="header"):
        parse_sizes("foo,bar\n1,2\n", "p.csv")
    with pytest.raises(ValueError, match="no job sizes"):
        parse_sizes("# nothing\n", "e.txt")


# ---------------------------------------------------------------------------------- in the scheduler
def _three_jobs() -> list[JobRecord]:
    # One GPU. L (20 h) at t=0, M (2 h) at 0.5 h, X (0.5 h) at 2.5 h; LAS levels split at 3,600 GPU-s.
    # L runs to 1 h (level 1), M preempts it and runs to 2.5 h (level 1 from 2 h, 5,400 GPU-s attained),
    # X preempts M. When X ends at 3 h, L (3,600 attained) and M (5,400) wait in level 1.
    return [JobRecord("L", 0.0, 20 * H, 1, "", 2), JobRecord("M", 0.5 * H, 2 * H, 1, "", 3),
            JobRecord("X", 2.5 * H, 0.5 * H, 1, "", 4)]


def test_gittins_beats_fifo_and_las_on_mean_jct():
    base = PoolConfig(thresholds=(3600.0,), promote_knob=None, gittins_delta=3600.0)
    prior = tuple([7200.0] * 8 + [72000.0] * 2)  # most jobs take 2 h, some 20 h
    fifo = sim(job_policy("fifo")[1], _three_jobs())
    las = sim(base, _three_jobs())
    git = sim(replace(base, order="gittins", size_prior=prior), _three_jobs())
    # LAS keeps FIFO within level 1: L runs 3 h -> 22 h, M after it; Gittins sees M 30 min from a
    # typical end (index 0.8 / 2,160 s vs 0.8 / 3,600 s for L) and runs it first: M ends at 3.5 h
    assert jct(las)["M"] == pytest.approx(22.0 * H)
    assert jct(git)["M"] == pytest.approx(3.0 * H)
    assert jct(git)["L"] == pytest.approx(22.5 * H)
    mean = {name: sum(jct(r).values()) / 3 for name, r in (("fifo", fifo), ("las", las), ("gittins", git))}
    assert mean["gittins"] < mean["las"] and mean["gittins"] < mean["fifo"]


def test_gittins_learns_sizes_online_from_finished_jobs():
    # without a prior, the same order learns from the 2-h jobs that finished before the test trio
    early = [JobRecord(f"e{k}", k * 2 * H, 2 * H - 60.0, 1, "", 10 + k) for k in range(6)]
    late = [replace(r, submit_time=r.submit_time + 12 * H) for r in _three_jobs()]
    base = PoolConfig(thresholds=(3600.0,), promote_knob=None, gittins_delta=3600.0, size_min_samples=1)
    las = jct(sim(base, early + late))
    git = jct(sim(replace(base, order="gittins"), early + late))
    assert git["M"] < las["M"] and sum(git.values()) < sum(las.values())


def test_preemption_bound_caps_evictions_per_job():
    # a 10-h job demoted after 600 GPU-s; a 10-minute job arrives every hour and preempts it
    recs = [JobRecord("long", 0.0, 10 * H, 1, "", 2)] + [
        JobRecord(f"s{k}", k * H, 600.0, 1, "", 3 + k) for k in range(1, 7)]
    base = PoolConfig(thresholds=(600.0,), promote_knob=None, min_run_s=0.0)
    free = {j["job_id"]: j for j in sim(base, recs).jobs}
    capped = {j["job_id"]: j for j in sim(replace(base, max_preemptions=2), recs).jobs}
    protected = {j["job_id"]: j for j in sim(replace(base, protect_after_s=2.5 * H), recs).jobs}
    assert free["long"]["preemptions"] == 6
    assert capped["long"]["preemptions"] == 2
    # run 1 h, preempted; 50 min, preempted (1 h 50 m); 50 min more -> 2 h 40 m >= 2.5 h: protected
    assert protected["long"]["preemptions"] == 2
    assert capped["s6"]["jct"] > free["s6"]["jct"]  # the bound has a price: short jobs wait


def test_size_estimates_rank_by_expected_remaining_service():
    # the trio of _three_jobs under "remaining" with nothing learned before X ends: without estimates, L (3,600
    # GPU-s attained) goes before M (5,400) as LAS would (each scores its attained service); with exact
    # estimates M has 1,800 GPU-s left against L's 68,400 and runs first, ending at 3.5 h
    base = PoolConfig(order="remaining", thresholds=(3600.0,), promote_knob=None)
    cfg = JobSimConfig(restart_overhead_s=0.0, topology=FLAT, sample_interval_s=0, pool=base)
    blind = jct(run_jobs(one_gpu(), _three_jobs(), "gpupool", config=cfg))
    exact = run_jobs(one_gpu(), _three_jobs(), "gpupool", config=replace(cfg, size_estimate_error=0.0))
    assert blind["M"] == pytest.approx(22.0 * H)
    assert jct(exact)["M"] == pytest.approx(3.0 * H)
    assert sum(jct(exact).values()) < sum(blind.values())
    assert exact.metrics["config"]["size_estimate_error"] == 0.0
    # estimates come from a generator of their own: a noisy run draws nothing from the simulator's stream
    noisy = run_jobs(one_gpu(), _three_jobs(), "gpupool", config=replace(cfg, size_estimate_error=0.5))
    assert {j["job_id"] for j in noisy.jobs if j["status"] == "finished"} == {"L", "M", "X"}


def test_size_estimate_overrun_falls_back_to_learned_sizes():
    state = ClusterState(one_gpu())
    sched = PoolScheduler(state, make_policy("gpupool"), QueueTree([QueueSpec(name="q")]),
                          PoolConfig(order="remaining", size_prior=(1000.0, 9000.0)))
    job = PoolJob("j", "q", 1, 1, 0.0, size_estimate=2000.0)
    plain = PoolJob("p", "q", 1, 1, 0.0)
    sched.submit(job, 0.0)
    sched.submit(plain, 0.0)
    assert sched._score(job, 500.0, 500.0) == pytest.approx(1500.0)  # its own estimate less what it had
    # past its estimate (too low), the job is ranked as one without: by the learned distribution
    assert sched._score(job, 2500.0, 2500.0) == pytest.approx(sched._score(plain, 2500.0, 2500.0))
    assert sched._score(plain, 500.0, 500.0) == pytest.approx((1000.0 + 9000.0) / 2 - 500.0)


@pytest.mark.parametrize("bad", [-1.0, math.inf, math.nan])
def test_size_estimate_bad_values_are_refused(bad):
    with pytest.raises(ValueError, match="size_estimate must be finite"):
        PoolJob("j", "q", 1, 1, 0.0, size_estimate=bad)
    with pytest.raises(ValueError, match="size_estimate_error must be a finite number"):
        run_jobs(one_gpu(), _three_jobs(), "gpupool", config=JobSimConfig(size_estimate_error=bad))


def test_existing_orders_keep_their_keys():
    assert make_order("tiresias").name == "tiresias" and type(make_order("las")) is TiresiasOrder
    assert PoolConfig().order == "tiresias"  # the default job policy is unchanged


# ------------------------------------------------------------------------------- cost of fairness
def test_fairness_cost_per_queue_and_overall():
    # two tenants on one GPU: "a" has a long job first, "b" a short one after it
    recs = [JobRecord("a1", 0.0, 4 * H, 1, "a", 2), JobRecord("b1", 60.0, H, 1, "b", 3)]
    fair = sim(None, recs)
    one = sim(None, one_queue(recs))
    cost = fairness_cost(fair.jobs, one.jobs)
    assert set(cost["queues"]) == {"a", "b"}
    for q in ("a", "b"):
        r = cost["queues"][q]
        assert r["mean_cost_h"] == pytest.approx(r["fair_mean_jct_h"] - r["one_queue_mean_jct_h"])
    o = cost["overall"]
    assert o["jobs"] == 2
    assert o["fair_mean_jct_h"] == pytest.approx(sum(j["jct"] for j in fair.jobs) / 2 / H)
    with pytest.raises(ValueError):
        fairness_cost(fair.jobs, one.jobs[:1])


# -------------------------------------------------------------------------------------------- the CLI
def test_cli_job_model_switches_and_fairness_cost(tmp_path):
    import json

    from typer.testing import CliRunner

    from gpupool.cli import app

    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(24):
        gpus, dur = (1, 1, 2, 4)[i % 4], 600 + 900 * (i % 5)
        rows.append(f"2017-10-01 10:{i:02d}:00,{dur},{gpus},{dur * gpus},{'ab'[i % 2]}")
    trace = tmp_path / "p.csv"
    trace.write_text("\n".join(rows) + "\n")
    prior = tmp_path / "prior.txt"
    prior.write_text("600\n1500\n2400\n")
    small = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples" / "clusters" / "small.yaml"
    runner = CliRunner()
    args = ["compare", "--jobs", trace, "--cluster", small, "-p", "gpupool,gittins", "--restart-overhead", "0",
            "--no-topology-slowdown", "--gpus-per-pod", "1", "--las-thresholds", "600,3600", "--min-run", "0",
            "--max-preemptions", "3", "--size-prior", prior, "--fairness-cost", "--json", "-", "-q"]
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert [r["policy"] for r in doc["results"]] == ["gpupool", "gittins"]
    for r in doc["results"]:
        cost = r["fairness_cost"]
        assert set(cost["queues"]) == {"a", "b"} and cost["overall"]["jobs"] == 24
        assert r["finished_jobs"] == 24
    bad = runner.invoke(app, [str(a) for a in ["simulate", "--jobs", trace, "--cluster", small,
                                                "--las-thresholds", "10,5"]])
    assert bad.exit_code != 0 and "increasing" in bad.output
    bad = runner.invoke(app, [str(a) for a in ["simulate", "--jobs", trace, "--cluster", small, "--one-queue",
                                                "--fairness-cost"]])
    assert bad.exit_code != 0 and "--fairness-cost" in bad.output
    bad = runner.invoke(app, ["simulate", "--job-order", "gittins"])  # pod traces: job-only flag
    assert bad.exit_code != 0 and "--job-order" in bad.output


def test_parse_sizes_bad_input_named():
    assert parse_sizes("\ufeff100\n200\n") == [100.0, 200.0]  # a UTF-8 BOM is not part of the first number
    assert parse_sizes('\ufeffduration,"num_gpu"\n"100",2\n') == [200.0]  # csv quoting
    for text in ("inf\n", "nan\n", "1e400\n"):  # a first line of numbers is data: the finite error
        with pytest.raises(ValueError, match="p.txt:1: job size must be finite"):
            parse_sizes(text, "p.txt")
    with pytest.raises(ValueError, match="p.txt:2: without a header, one job size per line; got 2 fields"):
        parse_sizes("1\n2,3\n", "p.txt")
    with pytest.raises(ValueError, match="p.csv:3: column 'num_gpu': GPU count must be finite and > 0, got -1"):
        parse_sizes("duration,num_gpu\n100,4\n100,-1\n", "p.csv")
    with pytest.raises(ValueError, match="p.csv:2: column 'gpus': GPU count .* got 0"):
        parse_sizes("duration,gpus\n100,0\n", "p.csv")
    with pytest.raises(ValueError, match="p.csv:2: column 'duration': duration must be finite and >= 0, got -5"):
        parse_sizes("duration,num_gpu\n-5,2\n", "p.csv")
    with pytest.raises(ValueError, match="p.csv:2: not a job size"):
        parse_sizes("duration,num_gpu\n100\n", "p.csv")
