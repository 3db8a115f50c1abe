"""``gpupool simulate/compare --jobs``: job traces on a cluster file, with queues; JSON, plots, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli import app

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]
SMALL = REPO / "examples" / "clusters" / "small.yaml"
REQUIRED = ("policy", "seed", "mean_jct_s", "p95_jct_s", "mean_queueing_delay_s", "makespan_s", "gpu_utilization",
            "jain_fairness", "preemptions", "deadlocks", "energy_kwh", "events_per_second")


def philly_csv(n: int = 30) -> str:
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(n):
        gpus = (1, 1, 2, 4, 8)[i % 5]
        dur = 600 + 90 * (i % 7)
        rows.append(f"2017-10-01 {10 + i // 60:02d}:{i % 60:02d}:00,{dur},{gpus},{dur * gpus},{'abc'[i % 3]}")
    return "\n".join(rows) + "\n"


def itp_csv(n: int = 20) -> str:
    rows = ["job_id,submission_time,duration,num_gpu"]
    rows += [f"job{i},{60 * i},{900 + 30 * i},{(1, 2, 4)[i % 3]}" for i in range(n)]
    return "\n".join(rows) + "\n"


@pytest.fixture
def traces(tmp_path: Path) -> dict[str, Path]:
    philly = tmp_path / "philly.csv"
    itp = tmp_path / "itp.csv"
    philly.write_text(philly_csv())
    itp.write_text(itp_csv())
    queues = tmp_path / "queues.yaml"
    queues.write_text("queues:\n  - {name: a, quota: 8}\n  - {name: b, quota: 8, weight: 2}\n  - {name: c}\n")
    return {"philly": philly, "itp": itp, "queues": queues, "dir": tmp_path}


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def test_compare_jobs_json_has_every_policy_and_metric(traces):
    res = invoke("compare", "--jobs", traces["philly"], "--cluster", SMALL, "--json", "-", "--quiet")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["protocol"] == "jobs"
    assert [r["policy"] for r in doc["results"]] == ["fifo", "round-robin", "gpupool"]
    for record in doc["results"]:
        for key in REQUIRED:
            assert key in record
        assert set(record["queues"]) == {"a", "b", "c"}  # one queue per Philly virtual cluster
        assert record["deadlocks"] == 0 and record["finished_jobs"] == 30


def test_simulate_with_queue_file_seeds_and_plots(traces):
    out = traces["dir"] / "plots"
    js = traces["dir"] / "r.json"
    res = invoke("simulate", "--jobs", traces["philly"], "--format", "philly", "--cluster", SMALL, "--queues",
                 traces["queues"], "--seeds", "1,2", "--out", out, "--json", js, "-q")
    assert res.exit_code == 0, res.output
    assert "JCT" in res.stdout and "gpupool" in res.stdout
    assert (out / "jct_distribution.png").stat().st_size > 0 and (out / "queue_share.png").stat().st_size > 0
    doc = json.loads(js.read_text())
    assert [r["seed"] for r in doc["results"]] == [1, 2]
    assert doc["queues"].endswith("queues.yaml")
    assert doc["results"][0]["queues"]["b"]["weight"] == 2


def test_itp_is_detected_and_failures_are_reported(traces):
    res = invoke("simulate", "--jobs", traces["itp"], "--cluster", SMALL, "--node-mtbf-hours", "2",
                 "--checkpoint-interval", "300", "--json", "-", "-q")
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout)["results"][0]
    assert record["queues"].keys() == {"default"}
    assert record["finished_jobs"] + record["unfinished_jobs"] == 20
    assert record["failure_events"] > 0


@pytest.mark.parametrize(("args", "message"), [
    (["--jobs", "{philly}"], "--jobs needs --cluster"),
    (["--jobs", "{philly}", "--cluster", "{missing}"], "cannot read"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--policy", "best-fit"], "unknown job policy 'best-fit'"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--format", "itp"], "column"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--nodes", "{philly}"], "does not apply to job traces"),
    (["--cluster", SMALL], "applies only with --jobs"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--queues", "{badq}"], "parent 'nope' is not defined"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--queues", "{otherq}"], "no leaf queue for trace queue"),
    (["--jobs", "{philly}", "--cluster", "{badcluster}"], "badcluster.yaml"),
    (["--jobs", "{philly}", "--cluster", SMALL, "--elastic-fraction", "2"], "--elastic-fraction"),
    (["--jobs", "{philly}", "--cluster", "{cpuonly}"], "the cluster has no GPUs"),
])
def test_errors_name_the_problem(traces, args, message):
    d = traces["dir"]
    (d / "badq.yaml").write_text("queues:\n  - {name: a, parent: nope}\n")
    (d / "otherq.yaml").write_text("queues:\n  - {name: zzz}\n")
    (d / "badcluster.yaml").write_text("apiVersion: gpupool.io/v1alpha1\nkind: Cluster\nspec: {nodePools: []}\n")
    (d / "cpuonly.yaml").write_text("apiVersion: gpupool.io/v1alpha1\nkind: Cluster\nmetadata: {name: c}\nspec:\n"
                                    "  nodePools:\n"
                                    "    - {name: cpu, count: 2, cpuCores: 64, memoryGiB: 256}\n")
    subs = {"{philly}": traces["philly"], "{missing}": d / "missing.yaml", "{badq}": d / "badq.yaml",
            "{otherq}": d / "otherq.yaml", "{badcluster}": d / "badcluster.yaml", "{cpuonly}": d / "cpuonly.yaml"}
    res = invoke("simulate", *[subs.get(str(a), a) for a in args])
    assert res.exit_code == 2, res.output
    assert message in res.output
