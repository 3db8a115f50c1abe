"""Bad input to the job-model switches of `simulate --jobs` / `compare --jobs`: one-line errors, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli import app

runner = CliRunner()
SMALL = Path(__file__).resolve().parents[1] / "examples" / "clusters" / "small.yaml"


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(8):
        gpus, dur = (1, 2)[i % 2], 600 + 300 * i
        rows.append(f"2017-10-01 10:{i:02d}:00,{dur},{gpus},{dur * gpus},{'ab'[i % 2]}")
    path = tmp_path / "p.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def _run(cmd: str, trace: Path, *args: str):
    return runner.invoke(app, [cmd, "--jobs", str(trace), "--cluster", str(SMALL), "-q", *map(str, args)])


def _error(res, *words: str) -> str:
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


@pytest.mark.parametrize(("flag", "value"), [("--restart-overhead", "inf"), ("--restart-overhead", "1e300"),
                                             ("--restart-overhead", "nan"), ("--min-run", "inf"),
                                             ("--protect-after-hours", "inf")])
def test_non_finite_or_huge_durations_are_rejected(trace, flag, value):
    _error(_run("simulate", trace, flag, value), flag, str(float(value)))


@pytest.mark.parametrize("value", ["nan,100", "nan", "inf", "1e400", "100,inf", "0,5", "10,5"])
def test_las_thresholds_finite_positive_increasing(trace, value):
    _error(_run("simulate", trace, "--las-thresholds", value), "--las-thresholds", value)


def test_one_queue_with_a_queue_file_is_rejected(trace, tmp_path):
    queues = tmp_path / "q.yaml"
    queues.write_text("queues:\n  - name: a\n  - name: b\n")
    _error(_run("simulate", trace, "--one-queue", "--queues", queues), "--one-queue", "--queues")


def test_job_order_over_a_size_ordered_policy_is_rejected(trace):
    _error(_run("compare", trace, "-p", "gpupool,gittins", "--job-order", "fifo"),
           "--job-order fifo", "gittins policy's own order (gittins)", "-p gpupool --job-order fifo",
           "--promote-knob 1")
    assert _run("compare", trace, "-p", "gpupool,gittins", "--job-order", "gittins").exit_code == 0


def test_size_prior_without_a_size_order_is_rejected(trace, tmp_path):
    prior = tmp_path / "prior.txt"
    prior.write_text("600\n1200\n")
    _error(_run("compare", trace, "-p", "fifo,round-robin,gpupool", "--size-prior", prior), "--size-prior")
    assert _run("simulate", trace, "-p", "gpupool", "--job-order", "remaining", "--size-prior", prior).exit_code == 0


def test_preemption_switches_on_non_preemptive_policies_warn(trace):
    res = _run("compare", trace, "-p", "fifo,round-robin", "--max-preemptions", "2", "--las-thresholds", "100,200")
    assert res.exit_code == 0, res.output
    warning = [ln for ln in res.output.splitlines() if ln.startswith("warning:")]
    assert len(warning) == 1 and "--max-preemptions" in warning[0] and "--las-thresholds" in warning[0]
    res = _run("compare", trace, "-p", "gpupool", "--max-preemptions", "2")
    assert res.exit_code == 0 and "warning:" not in res.output


def test_non_utf8_size_prior_names_the_file(trace, tmp_path):
    prior = tmp_path / "prior.txt"
    prior.write_bytes(b"600\n\xff\xfe12\n")
    _error(_run("simulate", trace, "-p", "gittins", "--size-prior", prior), "--size-prior", str(prior), "UTF-8")


def test_one_queue_header_and_json_config_record_the_job_model(trace, tmp_path):
    res = runner.invoke(app, ["simulate", "--jobs", str(trace), "--cluster", str(SMALL), "--one-queue", "-q"])
    assert res.exit_code == 0, res.output
    assert "queues: one queue" in res.output and "one per trace queue" not in res.output
    prior = tmp_path / "prior.txt"
    prior.write_text("600\n1200\n")
    out = tmp_path / "r.json"
    res = _run("compare", trace, "-p", "gpupool,gittins", "--one-queue", "--min-run", "60", "--max-preemptions", "2",
               "--protect-after-hours", "1", "--las-thresholds", "100,200", "--gpus-per-pod", "1",
               "--no-topology-slowdown", "--size-prior", prior, "--json", out)
    assert res.exit_code == 0, res.output
    cfgs = {r["policy"]: r["config"] for r in json.loads(out.read_text())["results"]}
    assert cfgs["gpupool"]["job_order"] == "tiresias" and cfgs["gittins"]["job_order"] == "gittins"
    for c in cfgs.values():
        assert c["las_thresholds"] == [100.0, 200.0] and c["min_run_s"] == 60.0 and c["max_preemptions"] == 2
        assert c["protect_after_s"] == 3600.0 and c["one_queue"] is True and c["gpus_per_pod"] == 1
        assert c["topology_slowdown"] is False and c["size_prior"] == str(prior) and c["size_prior_n"] == 2


def test_an_error_is_the_only_line_and_order_names_are_checked_first(trace):
    _error(_run("simulate", trace, "-p", "fifo", "--max-preemptions", "2", "--min-run", "inf"), "--min-run")
    _error(_run("simulate", trace, "-p", "gittins", "--job-order", "bogus"), "--job-order must be one of")


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_size_estimates_must_be_finite_and_non_negative(trace, value):
    _error(_run("simulate", trace, "-p", "gittins", "--size-estimates", value), "--size-estimates")


def test_size_estimates_need_a_size_order_and_are_recorded(trace, tmp_path):
    _error(_run("compare", trace, "-p", "fifo,gpupool", "--size-estimates", "1"), "--size-estimates",
           "ranks jobs by size")
    out = tmp_path / "r.json"
    res = _run("compare", trace, "-p", "gittins", "--size-estimates", "0", "--json", out)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())["results"]
    assert row["config"]["size_estimate_error"] == 0.0 and row["finished_jobs"] == 8


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan", "soon"])
def test_promote_knob_must_be_positive_finite_or_none(trace, value):
    _error(_run("simulate", trace, "-p", "gpupool", "--promote-knob", value), "--promote-knob")


def test_promote_knob_reaches_the_scheduler_and_the_json(trace, tmp_path):
    out = tmp_path / "r.json"
    res = _run("compare", trace, "-p", "gpupool", "--job-order", "remaining", "--promote-knob", "1",
               "--size-estimates", "1", "--json", out)
    assert res.exit_code == 0, res.output
    (row,) = json.loads(out.read_text())["results"]
    assert row["config"]["promote_knob"] == 1.0 and row["config"]["job_order"] == "remaining"
    assert row["p95_jct_s"] <= row["p99_jct_s"] <= row["makespan_s"]  # the tail, in the JSON as in the table
    res = _run("compare", trace, "-p", "gpupool", "--promote-knob", "none", "--json", out)
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["results"][0]["config"]["promote_knob"] is None


def test_the_table_title_names_the_model_switches(trace):
    res = runner.invoke(app, ["compare", "--jobs", str(trace), "--cluster", str(SMALL), "-q", "-p", "gpupool",
                              "--job-order", "remaining", "--promote-knob", "1", "--no-topology-slowdown"],
                        env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    title = " ".join(res.output.split())
    assert "model: --no-topology-slowdown --job-order remaining --promote-knob 1" in title
    plain = runner.invoke(app, ["compare", "--jobs", str(trace), "--cluster", str(SMALL), "-q", "-p", "gpupool"])
    assert plain.exit_code == 0 and "model:" not in plain.output
