"""Per-job-type speeds, LAS over work done and moves to faster GPUs (issue 32; gpupool.sim.throughput,
gpupool.sim.gavel, gpupool.sim.migration)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpupool.model import NodeSpec
from gpupool.sim.gavel import GAVEL_JOB_TYPES, generate_jobs, load_gavel_trace, table_from_gavel
from gpupool.sim.jobs import JobSimConfig, JobSpec, run_jobs
from gpupool.sim.migration import MigrationConfig, MoveCandidate, plan_moves
from gpupool.sim.throughput import ThroughputTable, load_throughput_table
from gpupool.topology import TIERS, TopologyConfig

FLAT = TopologyConfig(factors={t: 1.0 for t in TIERS})
SHIPPED = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "gavel_throughputs.json"


def nodes(fast: int = 1, slow: int = 1) -> list[NodeSpec]:
    return ([NodeSpec(f"fast-{i}", 64000, 256000, 4, "V100") for i in range(fast)]
            + [NodeSpec(f"slow-{i}", 64000, 256000, 4, "K80") for i in range(slow)])


def cfg(**kw) -> JobSimConfig:
    table = ThroughputTable({"": {"V100": 1.0, "K80": 0.5}, "lm": {"V100": 1.0, "K80": 0.0},
                             "rec": {"V100": 1.0, "K80": 2.0}}, "V100")
    return JobSimConfig(restart_overhead_s=0.0, topology=FLAT, throughputs=table, sample_interval_s=0.0, **kw)


def test_table_rejects_a_bad_speed_naming_type_and_model(tmp_path) -> None:
    with pytest.raises(ValueError, match="job type 'lm', model 'K80'"):
        ThroughputTable({"lm": {"K80": -1.0}})
    p = tmp_path / "t.json"
    p.write_text('{"rows": []}')
    with pytest.raises(ValueError, match="rows"):
        load_throughput_table(p)
    p.write_text('{"rows": {"a": {"V100": 1}}}')
    assert load_throughput_table(p).speed("a", "V100", 0.3) == 1.0
    assert load_throughput_table(p).speed("b", "V100", 0.3) == 0.3  # no row, no "" row: the default


def test_a_job_runs_at_its_types_speed_and_never_where_its_type_cannot() -> None:
    # the fast node is busy with a long job; "lm" cannot run on K80 so it waits for V100; "rec" runs on K80 at 2x
    jobs = [JobSpec("hog", 0, 10_000, 4, job_type="lm"), JobSpec("rec", 1, 1000, 4, job_type="rec"),
            JobSpec("lm2", 2, 1000, 4, job_type="lm")]
    res = run_jobs(nodes(), jobs, "gpupool", config=cfg(objective="jct"))
    by = {j["job_id"]: j for j in res.jobs}
    assert all(n.startswith("fast") for n in by["lm2"]["nodes"])
    assert by["lm2"]["start"] > 501  # never on the idle K80 node
    assert all(n.startswith("slow") for n in by["rec"]["nodes"])
    assert by["rec"]["end"] - by["rec"]["start"] == pytest.approx(500)  # 1000 s of V100 work at 2x on K80


def test_without_a_type_the_default_row_is_the_per_model_speed() -> None:
    res = run_jobs(nodes(fast=0), [JobSpec("a", 0, 1000, 2)], "gpupool", config=cfg())
    assert res.jobs[0]["end"] == pytest.approx(2000)  # K80 at 0.5


def test_plan_moves_needs_gain_room_and_the_minimum_run() -> None:
    sp = np.array([1.0, 1.0, 0.25, 0.25])
    c = MoveCandidate("j", 0.25, remaining_work=3600.0, ran_s=4000.0, pods=2, gpus_per_pod=1, node_speed=sp)
    room = lambda _c: np.array([1, 1, 0, 0])  # noqa: E731
    assert plan_moves([c], room, MigrationConfig()) == [("j", 1.0)]
    assert plan_moves([c], lambda _c: np.array([1, 0, 0, 0]), MigrationConfig()) == []  # gang: all or nothing
    young = MoveCandidate("j", 0.25, 3600.0, 100.0, 2, 1, sp)
    assert plan_moves([young], room, MigrationConfig()) == []  # hysteresis
    short = MoveCandidate("j", 0.25, 30.0, 4000.0, 2, 1, sp)  # 120 s left here: the restart costs more
    assert plan_moves([short], room, MigrationConfig(restart_s=120.0)) == []
    two = [c, MoveCandidate("k", 0.25, 7200.0, 4000.0, 2, 1, sp)]
    free = np.array([1, 1, 0, 0])

    def take(cand, v) -> bool:
        free[cand.node_speed == v] = 0
        return True
    assert plan_moves(two, lambda _c: free.copy(), MigrationConfig(), take) == [("k", 1.0)]  # longest first, once
    with pytest.raises(ValueError, match="min_gain"):
        MigrationConfig(min_gain=1.0)


def test_a_job_on_slow_gpus_moves_when_fast_ones_free_up() -> None:
    jobs = [JobSpec("short", 0, 3600, 4), JobSpec("long", 1, 100_000, 4)]
    base = run_jobs(nodes(), jobs, "gpupool", config=cfg(objective="jct"))
    moved = run_jobs(nodes(), jobs, "gpupool", config=cfg(objective="jct", migration=MigrationConfig()))
    b = {j["job_id"]: j for j in base.jobs}
    m = {j["job_id"]: j for j in moved.jobs}
    assert all(n.startswith("slow") for n in b["long"]["nodes"])
    assert all(n.startswith("fast") for n in m["long"]["nodes"])
    assert moved.metrics["moves"] == 1 and moved.metrics["moves_to_faster"] == 1
    assert moved.metrics["move_lost_gpu_hours"] == pytest.approx(120 * 4 / 3600)
    # 3599 s on K80 at 0.5 (1799.5 s of work), then 98,200.5 s at 1.0 after a 120 s restart
    assert m["long"]["end"] == pytest.approx(3600 + 120 + 98_200.5)
    assert m["long"]["end"] < b["long"]["end"]
    assert "moves" not in base.metrics  # opt-in: nothing reported without it


def test_las_over_work_counts_service_at_the_gpus_speed() -> None:
    from gpupool.engine.pool.job import PoolJob

    j = PoolJob("a", "q", 1, 2, 0.0)
    j.status, j.run_since, j.placed, j.service_rate = "running", 0.0, [object(), object()], 0.5
    assert j.attained_at(100.0) == pytest.approx(100.0)  # 2 GPUs x 100 s x 0.5
    jobs = [JobSpec(f"j{i}", i, 20_000, 4) for i in range(3)]
    a = run_jobs(nodes(fast=0, slow=2), jobs, "gpupool", config=cfg(las_work=True))
    assert a.metrics["config"]["las_work"] is True and a.metrics["finished_jobs"] == 3


def test_gavel_generator_and_table() -> None:
    assert len(GAVEL_JOB_TYPES) == 26
    jobs = generate_jobs(400, 3.0, 0)
    assert jobs == generate_jobs(400, 3.0, 0) and jobs != generate_jobs(400, 3.0, 1)
    sizes = {j.num_gpu for j in jobs}
    assert sizes <= {1, 2, 4, 8} and len(sizes) == 4
    assert all(31.6 * 60 * 0.999 <= j.duration <= 60 * 10 ** 4 for j in jobs)
    assert 100 < jobs[-1].submit_time / 3600 < 170  # ~133 h for 400 jobs at 3/h
    doc = json.loads(SHIPPED.read_text())
    t = ThroughputTable(doc["rows"])
    assert all(j.job_type in t.rows for j in jobs)
    assert any(r["K80"] == 0.0 for r in t.rows.values()) and any(r["P100"] > 1.0 for r in t.rows.values())


def test_gavel_table_and_trace_loader(tmp_path) -> None:
    doc = {"v100": {"('LM (batch size 5)', 1)": {"null": 10.0}}, "k80": {"('LM (batch size 5)', 1)": {"null": 2.0}}}
    t, ref = table_from_gavel(doc)
    assert t.rows["LM (batch size 5) x1"] == {"V100": 1.0, "P100": 0.0, "K80": 0.2}
    p = tmp_path / "g.trace"
    p.write_text("LM (batch size 5)\tpython main.py\tlm\t--steps\t1\t36000\t1\t1\t-1.000000\t60.0\n")
    (j,) = load_gavel_trace(p, ref)
    assert (j.duration, j.submit_time, j.job_type) == (3600.0, 60.0, "LM (batch size 5) x1")
    p.write_text("LM (batch size 5)\tx\n")
    with pytest.raises(ValueError, match="g.trace:1: expected 10"):
        load_gavel_trace(p, ref)


def test_speed_blind_placement_keeps_a_type_off_models_it_cannot_run_on() -> None:
    # the K80 node is idle, the V100 node busy: "lm" (speed 0 on K80) waits for the V100 even speed-blind
    jobs = [JobSpec("hog", 0, 5000, 4, job_type="rec"), JobSpec("lm", 1, 1000, 4, job_type="lm")]
    res = run_jobs(nodes(), jobs, "gpupool", config=cfg())
    by = {j["job_id"]: j for j in res.jobs}
    assert res.metrics["unfinished_jobs"] == 0
    assert by["lm"]["nodes"] == ["fast-0"] or by["hog"]["nodes"] == ["fast-0"]
    assert all(n.startswith("fast") for n in by["lm"]["nodes"])


def test_scheduler_move_places_the_whole_gang_on_the_allowed_nodes_or_back() -> None:
    from gpupool.cluster import ClusterState
    from gpupool.engine.pool.job import PoolJob
    from gpupool.engine.pool.queues import QueueSpec, QueueTree
    from gpupool.engine.pool.scheduler import PoolScheduler
    from gpupool.policies import make_policy

    st = ClusterState(nodes(fast=1, slow=1))
    sched = PoolScheduler(st, make_policy("gpupool"), QueueTree([QueueSpec(name="q", quota=8)]))
    job = PoolJob("j", "q", 1, 2, 0.0)
    sched.submit(job, 0.0)
    sched.cycle(0.0)
    was = {a.node for a in job.placed}
    other = np.array([i not in was for i in range(2)])
    assert sched.move(job, other, 10.0) is True
    assert {a.node for a in job.placed} == {int(np.flatnonzero(other)[0])}
    assert job.attained == pytest.approx(20.0) and job.run_since == 10.0 and sched.free_gpus == 6
    assert sched.move(job, np.zeros(2, dtype=bool), 20.0) is False  # nowhere allowed: back where it fits
    assert job.status == "running" and len(job.placed) == 2 and sched.free_gpus == 6


def test_cli_runs_the_new_switches_and_names_a_bad_table(tmp_path) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app
    from test_jobsim_cli import philly_csv

    trace = tmp_path / "philly.csv"
    trace.write_text(philly_csv())
    cluster = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "mixed-models.yaml"
    table = tmp_path / "t.json"
    table.write_text('{"rows": {"": {"T4": 0.1}}}')
    out = tmp_path / "r.json"
    args = ["compare", "--jobs", str(trace), "--cluster", str(cluster), "--policies", "gpupool", "--objective", "jct",
            "--throughputs", str(table), "--las-work", "--migrate", "--json", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rec = json.loads(out.read_text())["results"][0]
    assert rec["config"]["las_work"] is True and "moves" in rec and rec["config"]["throughput_rows"] == 1
    table.write_text('{"rows": {"lm": {"T4": -1}}}')
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "job type 'lm', model 'T4'" in res.output


def test_a_waiting_job_reserves_only_models_its_type_can_run_on() -> None:
    # "lm2" waits for the busy V100 (it cannot run on K80); its reservation must not hold the idle K80 node,
    # so "rec", which arrives after it, runs there at once (2x)
    jobs = [JobSpec("hog", 0, 10_000, 4, job_type="lm"), JobSpec("lm2", 1, 1000, 4, job_type="lm"),
            JobSpec("rec", 2, 1000, 4, job_type="rec")]
    res = run_jobs(nodes(), jobs, "gpupool", config=cfg(objective="jct"))
    by = {j["job_id"]: j for j in res.jobs}
    assert by["rec"]["start"] == pytest.approx(2) and by["rec"]["nodes"] == ["slow-0"]
    assert by["lm2"]["nodes"] == ["fast-0"]
