"""Tests of the ``gpupool`` command line (typer CliRunner) and of the report helpers it uses."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool import report
from gpupool.cli import app
from gpupool.policies import BASELINES, DEFAULT_POLICY, REGISTRY

runner = CliRunner()

NODES = """\
sn,cpu_milli,memory_mib,gpu,model
n0,32000,131072,4,V100M16
n1,32000,131072,4,V100M16
n2,16000,65536,2,T4
"""

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
)
POD_SHAPES = [  # (cpu_milli, memory_mib, num_gpu, gpu_milli, qos)
    (4000, 8192, 1, 1000, "LS"),
    (2000, 4096, 1, 500, "BE"),
    (2000, 4096, 1, 250, "BE"),
    (8000, 16384, 2, 1000, "LS"),
    (1000, 2048, 0, 0, "BE"),
    (3000, 8192, 1, 700, "Burstable"),
]


def pods_csv(n: int = 18) -> str:
    lines = [POD_HEADER]
    for i in range(n):
        cpu, mem, gpus, milli, qos = POD_SHAPES[i % len(POD_SHAPES)]
        created = 100 * i
        lines.append(f"p{i:03d},{cpu},{mem},{gpus},{milli},,{qos},Running,{created},{created + 450},{created}")
    return "\n".join(lines) + "\n"


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Path, Path]:
    nodes = tmp_path / "nodes.csv"
    pods = tmp_path / "pods.csv"
    nodes.write_text(NODES, encoding="utf-8")
    pods.write_text(pods_csv(), encoding="utf-8")
    return nodes, pods


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args])


def strict_json(text: str):
    def no_constant(name: str):
        raise AssertionError(f"invalid JSON constant {name}")

    return json.loads(text, parse_constant=no_constant)


RESULT_KEYS = {
    "policy", "seed", "gpu_allocation_ratio", "gpu_allocation_ratio_at_100", "unallocated_gpus",
    "fragmented_gpus", "failed_pods", "failed_reasons", "load_imbalance", "reserved_gpu_ratio",
    "decisions_per_second", "first_failure_arrived",
}


def in_unit(value) -> bool:
    return value is not None and 0.0 <= value <= 1.0 + 1e-9


def test_job_trace_help_names_every_job_policy():
    import re

    import typer

    from gpupool.engine.pool.scheduler import JOB_POLICIES

    commands = typer.main.get_command(app).commands
    for cmd in ("simulate", "compare"):
        (opt,) = [p for p in commands[cmd].params if "--jobs" in p.opts]
        for name in JOB_POLICIES:
            assert re.search(rf"\b{re.escape(name)}\b", opt.help), (cmd, name, opt.help)
    for name in JOB_POLICIES:
        assert name in commands["simulate"].help


def test_policies_lists_the_job_policies_too():
    from gpupool.engine.pool.scheduler import DEFAULT_JOB_POLICIES, JOB_POLICIES

    result = invoke("policies")
    assert result.exit_code == 0, result.output
    assert "Placement policies" in result.output and "Job policies" in result.output
    assert "gittins" in result.output
    only = invoke("policies", "--jobs")
    assert only.exit_code == 0 and "Placement policies" not in only.output and "gittins" in only.output
    rows = strict_json(invoke("policies", "--json", "--jobs").stdout)
    assert [r["name"] for r in rows] == list(JOB_POLICIES)
    assert {r["name"] for r in rows if r["compared_by_default"]} == set(DEFAULT_JOB_POLICIES)
    assert {r["name"]: r["placement"] for r in rows}["round-robin"] == "round-robin"
    assert all(r["description"] for r in rows)


# --------------------------------------------------------------------------------------------------
# policies


def test_policies_table_lists_every_policy_with_its_kind():
    result = invoke("policies")
    assert result.exit_code == 0, result.output
    for name in REGISTRY:
        assert name in result.output
    for kind in ("baseline", "GPU-aware", "default"):
        assert kind in result.output


def test_policies_json():
    result = invoke("policies", "--json")
    assert result.exit_code == 0, result.output
    rows = strict_json(result.stdout)
    assert [r["name"] for r in rows] == list(REGISTRY)
    kinds = {r["name"]: r["kind"] for r in rows}
    assert kinds[DEFAULT_POLICY] == "default"
    assert all(kinds[b] == "baseline" for b in BASELINES)
    assert kinds["fgd"] == "GPU-aware"
    assert kinds["load-aware"] == "inference"  # the README's kind: it is meant for inference replicas
    assert all(r["description"] for r in rows)


# --------------------------------------------------------------------------------------------------
# compare / simulate


def test_compare_tiny_trace_json_and_plots(tiny, tmp_path):
    nodes, pods = tiny
    out = tmp_path / "plots"
    json_file = tmp_path / "res" / "compare.json"
    result = invoke(
        "compare", "--nodes", nodes, "--pods", pods, "--policies", "best-fit,k8s-default,random",
        "--seeds", "1,2", "--ratio", "1.3", "--json", json_file, "--out", out,
    )
    assert result.exit_code == 0, result.output
    # the table: one row per policy, mean ± std for two seeds
    for name in ("best-fit", "k8s-default", "random"):
        assert name in result.stdout
    assert "±" in result.stdout

    doc = strict_json(json_file.read_text(encoding="utf-8"))
    assert doc["protocol"] == "inflation"
    assert doc["nodes"] == str(nodes) and doc["pods"] == str(pods)
    assert doc["ratio"] == 1.3
    assert len(doc["results"]) == 6
    assert [(r["policy"], r["seed"]) for r in doc["results"]] == [
        ("best-fit", 1), ("best-fit", 2), ("k8s-default", 1), ("k8s-default", 2), ("random", 1), ("random", 2),
    ]
    for r in doc["results"]:
        assert RESULT_KEYS <= set(r), RESULT_KEYS - set(r)
        assert in_unit(r["gpu_allocation_ratio"])
        assert in_unit(r["gpu_allocation_ratio_at_100"])
        assert in_unit(r["reserved_gpu_ratio"])
        assert r["reserved_gpu_ratio"] >= r["gpu_allocation_ratio"] - 1e-9
        assert isinstance(r["failed_pods"], int) and r["failed_pods"] >= 0
        assert 0 <= r["unallocated_gpus"] <= 10 and 0 <= r["fragmented_gpus"] <= r["unallocated_gpus"] + 1e-9
        assert r["load_imbalance"] >= 0
        assert sum(x["count"] for x in r["failed_reasons"]) <= r["failed_pods"]
        if r["failed_pods"]:
            assert r["failed_reasons"] and r["first_failure_arrived"] is not None
            assert not any(ch.isdigit() for ch in r["failed_reasons"][0]["reason"])
        else:
            assert r["first_failure_arrived"] is None
    # demand reaches 1.3 x capacity, so something must fail on 10 GPUs
    assert all(r["failed_pods"] > 0 for r in doc["results"])
    assert [s["policy"] for s in doc["summary"]] == ["best-fit", "k8s-default", "random"]
    for s in doc["summary"]:
        assert s["seeds"] == [1, 2]
        assert in_unit(s["gpu_allocation_ratio"]) and in_unit(s["gpu_allocation_ratio_at_100"])

    for name in ("allocation_vs_arrived.png", "unallocated_gpus.png"):
        png = out / name
        assert png.is_file() and png.stat().st_size > 1000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeated_seed_option_equals_comma_list(tiny, tmp_path):
    nodes, pods = tiny
    docs = []
    for seeds in (["--seed", "3", "--seed", "4"], ["--seeds", "3,4"]):
        json_file = tmp_path / f"s{len(docs)}.json"
        result = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit", *seeds, "--json", json_file)
        assert result.exit_code == 0, result.output
        docs.append(strict_json(json_file.read_text(encoding="utf-8")))
    assert docs[0]["seeds"] == docs[1]["seeds"] == [3, 4]
    strip = [[{k: v for k, v in r.items() if k != "decisions_per_second"} for r in d["results"]] for d in docs]
    assert strip[0] == strip[1]


def test_a_seed_option_with_no_seed_is_an_error(tiny):
    nodes, pods = tiny
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit", "--seeds", ",")
    assert result.exit_code == 2 and "no seed" in result.output  # was: seed 42, silently


def test_json_to_stdout(tiny):
    nodes, pods = tiny
    result = invoke("simulate", "--nodes", nodes, "--pods", pods, "--policy", "spread", "--json", "-")
    assert result.exit_code == 0, result.output
    doc = strict_json(result.stdout)
    assert doc["results"][0]["policy"] == "spread" and doc["results"][0]["seed"] == 42


def test_simulate_embedded_trace_best_fit(tmp_path):
    json_file = tmp_path / "sim.json"
    result = invoke("simulate", "--policy", "best-fit", "--seed", "42", "--json", json_file, "--quiet")
    assert result.exit_code == 0, result.output
    assert "best-fit" in result.stdout and "1,213 nodes" in result.stdout
    doc = strict_json(json_file.read_text(encoding="utf-8"))
    assert doc["nodes"] == "embedded" and doc["pods"] == "embedded"
    (r,) = doc["results"]
    assert r["policy"] == "best-fit" and r["seed"] == 42
    assert 0.85 < r["gpu_allocation_ratio_at_100"] <= r["gpu_allocation_ratio"] + 1e-9 <= 1.0 + 1e-9
    assert r["failed_pods"] > 0 and r["failed_reasons"]
    assert r["decisions_per_second"] > 0


def test_replay_tiny_trace(tiny, tmp_path):
    nodes, pods = tiny
    out = tmp_path / "replay"
    json_file = tmp_path / "replay.json"
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "--protocol", "replay",
                    "--policies", "best-fit,k8s-default", "--json", json_file, "--out", out)
    assert result.exit_code == 0, result.output
    doc = strict_json(json_file.read_text(encoding="utf-8"))
    assert doc["protocol"] == "replay" and doc["ratio"] is None
    for r in doc["results"]:
        assert RESULT_KEYS <= set(r)
        assert r["gpu_allocation_ratio_at_100"] is None
        assert in_unit(r["gpu_allocation_ratio"])
    assert (out / "allocation_over_time.png").stat().st_size > 1000
    assert (out / "unallocated_gpus.png").stat().st_size > 1000


def test_replay_unavailable(tiny, monkeypatch):
    nodes, pods = tiny
    monkeypatch.setitem(sys.modules, "gpupool.sim.replay", None)  # makes the import fail
    result = invoke("simulate", "--nodes", nodes, "--pods", pods, "--protocol", "replay")
    assert result.exit_code == 2
    assert "replay protocol not available" in result.output


# --------------------------------------------------------------------------------------------------
# errors


def test_malformed_pods_file_exit_2_names_file_line_column(tiny):
    nodes, pods = tiny
    lines = pods.read_text(encoding="utf-8").splitlines()
    fields = lines[2].split(",")
    fields[4] = "abc"  # gpu_milli of the second pod, physical line 3
    lines[2] = ",".join(fields)
    pods.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "--policies", "best-fit")
    assert result.exit_code == 2
    assert f"{pods}:3:" in result.output
    assert "gpu_milli" in result.output and "abc" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_missing_file_exit_2(tmp_path):
    result = invoke("simulate", "--nodes", tmp_path / "nope.csv", "--policy", "best-fit")
    assert result.exit_code == 2
    assert "nope.csv" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("args", [
    ("simulate", "--policy", "no-such-policy"),
    ("compare", "--policies", "best-fit,no-such-policy"),
])
def test_unknown_policy_exit_2(args):
    result = invoke(*args)
    assert result.exit_code == 2
    assert "unknown policy 'no-such-policy'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", [("--seeds", "1,x"), ("--ratio", "0")])
def test_bad_numbers_exit_2(tiny, args):
    nodes, pods = tiny
    result = invoke("simulate", "--nodes", nodes, "--pods", pods, "--policy", "best-fit", *args)
    assert result.exit_code == 2
    assert "error:" in result.output


def test_help_texts():
    for cmd in ([], ["policies"], ["simulate"], ["compare"]):
        result = invoke(*cmd, "--help")
        assert result.exit_code == 0, result.output
    text = invoke("compare", "--help").output
    for option in ("--policies", "--nodes", "--pods", "--protocol", "--seed", "--ratio", "--out", "--json", "--quiet"):
        assert option in text


# --------------------------------------------------------------------------------------------------
# report helpers


def test_reason_key_strips_numbers_but_not_model_names():
    assert report.reason_key("0/1213 nodes are available: 1209 Insufficient cpu, 4 Insufficient GPU share.") == (
        "Insufficient cpu, Insufficient GPU share"
    )
    assert report.reason_key("0/3 nodes are available: 3 GPU model not in gpu_spec, no node has GPU model "
                             "V100M16|V100M32.") == "GPU model not in gpu_spec, no node has GPU model V100M16|V100M32"
    counts = report.node_rejections([
        {"reason": "0/4 nodes are available: 3 Insufficient cpu, 1 Insufficient GPU share."},
        {"reason": "0/4 nodes are available: 4 Insufficient GPU share."},
    ])
    assert counts == {"Insufficient cpu": 3, "Insufficient GPU share": 5}


def test_jsonable_turns_nan_into_null():
    import numpy as np

    doc = report.jsonable({"a": math.nan, "b": [np.float64(math.inf), np.int64(3)], "c": 0.5})
    assert doc == {"a": None, "b": [None, 3], "c": 0.5}
    assert strict_json(report.dumps({"x": math.nan})) == {"x": None}


def test_downsample_keeps_ends():
    import numpy as np

    x = np.arange(10_000, dtype=float)
    xs, ys = report.downsample(x, x * 2, max_points=100)
    assert len(xs) <= 100 and xs[0] == 0 and xs[-1] == 9_999 and np.array_equal(ys, xs * 2)


# --------------------------------------------------------------------------------------------------
# issue 13: help at 80 columns, output paths checked first, progress, Ctrl-C, --wide


def _commands() -> list[list[str]]:
    import typer.main

    group = typer.main.get_command(app)
    return [[]] + [[name] for name in group.commands]  # type: ignore[attr-defined]


@pytest.mark.parametrize("cmd", _commands(), ids=lambda c: " ".join(c) or "gpupool")
def test_help_fits_80_columns_and_cuts_no_option(cmd):
    import typer.main

    result = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    text = result.output
    assert "…" not in text and "<bool>" not in text
    too_long = [line for line in text.splitlines() if len(line) > 80]
    assert not too_long, too_long
    command = typer.main.get_command(app)
    if cmd:
        command = command.commands[cmd[0]]  # type: ignore[attr-defined]
    for param in command.params:
        for opt in param.opts + param.secondary_opts:
            assert opt in text, opt


def test_subcommand_short_help_option():
    for cmd in _commands()[1:]:
        assert runner.invoke(app, [*cmd, "-h"], env={"COLUMNS": "80"}).exit_code == 0


@pytest.fixture
def no_loading(monkeypatch):
    """Fail the test if a trace is loaded: output paths must be checked before."""
    import gpupool.cli.jobs as cli_jobs
    import gpupool.cli.placement as cli_placement

    def boom(*_a, **_k):
        raise AssertionError("the trace was loaded before the output paths were checked")

    monkeypatch.setattr(cli_placement, "load_traces", boom)
    monkeypatch.setattr(cli_jobs, "load_jobs", boom)


def _bad_outputs(tmp_path: Path) -> list[tuple[str, str]]:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    a_dir = tmp_path / "adir"
    a_dir.mkdir()
    return [
        ("--out", "/proc/x"), ("--json", "/proc/x/r.json"), ("--json", "/proc/x"),
        ("--out", str(a_file)), ("--out", str(a_file / "sub")), ("--json", str(a_file / "r.json")),
        ("--json", str(a_dir)),
    ]


@pytest.mark.parametrize("mode", ["pods", "jobs-philly"])
def test_unwritable_output_paths_fail_at_once_exit_2(tmp_path, mode, no_loading):
    import time

    repo = Path(__file__).resolve().parents[1]
    trace = tmp_path / "philly.csv"
    trace.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 10:00:00,60,1,60,a\n")
    base = (["compare", "--jobs", str(trace), "--cluster", str(repo / "examples" / "clusters" / "small.yaml")]
            if mode != "pods" else ["compare", "-p", "best-fit"])
    for flag, value in _bad_outputs(tmp_path):
        start = time.monotonic()
        result = runner.invoke(app, [*base, flag, value])
        elapsed = time.monotonic() - start
        assert result.exit_code == 2, (flag, value, result.output)
        assert elapsed < 1.0
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and flag in lines[0], lines
        assert "Traceback" not in result.output


def test_missing_json_parent_is_created(tiny, tmp_path):
    nodes, pods = tiny
    js = tmp_path / "new" / "dir" / "r.json"
    result = invoke("simulate", "--nodes", nodes, "--pods", pods, "-p", "best-fit", "--json", js, "-q")
    assert result.exit_code == 0, result.output
    assert json.loads(js.read_text())["results"]
    assert not [p for p in js.parent.iterdir() if p.name.startswith(".gpupool-write-test")]


def _interrupt_after_first(monkeypatch, module: str, attr: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    real = getattr(mod, attr)
    calls = {"n": 0}

    def run(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, attr, run)


def test_ctrl_c_writes_the_finished_runs_exit_130(tiny, tmp_path, monkeypatch):
    _interrupt_after_first(monkeypatch, "gpupool.sim.inflation", "run_inflation")
    nodes, pods = tiny
    js, out = tmp_path / "r.json", tmp_path / "plots"
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit,spread,fgd",
                    "--json", js, "--out", out, "--jobs-parallel", "1")  # serial: the patch counts calls here
    assert result.exit_code == 130, result.output
    doc = json.loads(js.read_text())
    assert doc["interrupted"] is True and doc["runs_planned"] == 3
    assert [r["policy"] for r in doc["results"]] == ["best-fit"]
    assert "best-fit" in result.stdout and "spread" not in result.stdout.split("why")[0]
    assert "interrupted (Ctrl-C) after 1 of 3 runs" in result.output
    assert (out / "unallocated_gpus.png").exists()


def test_ctrl_c_before_any_run_writes_nothing(tiny, tmp_path, monkeypatch):
    import gpupool.sim.inflation as inflation

    def stop(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(inflation, "run_inflation", stop)
    nodes, pods = tiny
    js = tmp_path / "r.json"
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit,spread", "--json", js)
    assert result.exit_code == 130
    assert "nothing written" in result.output and not js.exists()


def test_ctrl_c_in_a_job_comparison(tmp_path, monkeypatch):
    _interrupt_after_first(monkeypatch, "gpupool.sim.jobs", "run_jobs")
    repo = Path(__file__).resolve().parents[1]
    trace = tmp_path / "philly.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    rows += [f"2017-10-01 10:{i:02d}:00,600,1,600,a" for i in range(10)]
    trace.write_text("\n".join(rows) + "\n")
    js = tmp_path / "jobs.json"
    result = invoke("compare", "--jobs", trace, "--cluster", repo / "examples" / "clusters" / "small.yaml",
                    "--json", js, "--jobs-parallel", "1")  # serial: the patch counts calls in this process
    assert result.exit_code == 130, result.output
    doc = json.loads(js.read_text())
    assert doc["interrupted"] is True and len(doc["results"]) == 1
    assert "interrupted (Ctrl-C) after 1 of" in result.output


def test_progress_lines_when_not_a_terminal(capsys):
    from gpupool.cli.common import RunProgress as _RunProgress

    now = [0.0]
    with _RunProgress(4, quiet=False, interval=15.0, clock=lambda: now[0], tty=False) as progress:
        progress.begin(0, "fgd (seed 42)")
        now[0] = 10.0
        progress.update(0.5)  # before the interval: silent
        now[0] = 20.0
        progress.update(1.0)
        now[0] = 25.0
        progress.update(1.5)  # 5 s after the last line: silent
        now[0] = 40.0
        progress.begin(2, "spread (seed 42)")
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "progress: fgd (seed 42) [1/4]: 1.0/4 runs (25%), elapsed 20s, ETA 1m00s",
        "progress: spread (seed 42) [3/4]: 2.0/4 runs (50%), elapsed 40s, ETA 40s",
    ]


def test_progress_quiet_and_terminal_write_no_lines(capsys):
    from gpupool.cli.common import RunProgress as _RunProgress

    for kwargs in ({"quiet": True, "tty": False}, {"quiet": True, "tty": True}):
        with _RunProgress(2, interval=0.0, **kwargs) as progress:
            progress.begin(0, "x")
            progress.update(1.0)
    assert capsys.readouterr().err == ""


def test_progress_lines_in_a_real_run(tiny, monkeypatch):
    import gpupool.cli.common as cli

    monkeypatch.setattr(cli, "LOG_PROGRESS_INTERVAL_S", 0.0)
    nodes, pods = tiny
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit,spread")
    assert result.exit_code == 0, result.output
    progress = [line for line in result.output.splitlines() if line.startswith("progress: ")]
    assert progress and all("ETA" in line and "elapsed" in line and "/2 runs" in line for line in progress)
    quiet = invoke("compare", "--nodes", nodes, "--pods", pods, "-p", "best-fit,spread", "-q")
    assert "progress: " not in quiet.output


def test_wide_is_passed_to_the_table(tiny, monkeypatch):
    seen = {}
    real = report.results_table

    def spy(summary, protocol, title="", *, wide=False):
        seen["wide"] = wide
        return real(summary, protocol, title, **({"wide": wide} if "wide" in real.__code__.co_varnames else {}))

    monkeypatch.setattr(report, "results_table", spy)
    nodes, pods = tiny
    assert invoke("simulate", "--nodes", nodes, "--pods", pods, "-p", "best-fit", "--wide").exit_code == 0
    assert seen == {"wide": True}
    assert invoke("simulate", "--nodes", nodes, "--pods", pods, "-p", "best-fit").exit_code == 0
    assert seen == {"wide": False}


@pytest.mark.parametrize("columns", ["0", "5", "39", " 120", "abc", "", "²"])
def test_a_useless_columns_value_is_ignored_when_piped(columns):
    """COLUMNS of 0, a handful, spaces or no number: the piped tables keep their own width instead of being
    drawn 0-5 columns wide (nothing printed) or crashing."""
    result = CliRunner().invoke(app, ["policies"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    assert "gpupool-combined" in result.output and "gittins" in result.output
    assert max(map(len, result.output.splitlines())) > 100


def test_a_bad_lines_value_beside_a_good_columns_value_is_ignored():
    result = CliRunner().invoke(app, ["policies", "--jobs"], env={"COLUMNS": "100", "LINES": "²"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 100 and "gittins" in result.output


def test_a_sensible_columns_value_is_honoured_when_piped():
    result = CliRunner().invoke(app, ["policies"], env={"COLUMNS": "60"})
    assert result.exit_code == 0 and max(map(len, result.output.splitlines())) <= 60


@pytest.mark.parametrize("args, message", [
    # before: --ratio 1e9 built the inflated workload (10**9 x capacity) before the first placement: a hang at 0 %
    # with memory growing; --jobs-parallel 100000 forked a process per run; --size-estimates 1e300 overflowed exp
    (("--ratio", "1e9"), "--ratio must be within (0, 10] (a multiple of the cluster's GPU capacity), got 1e+09"),
    (("--ratio", "nan"), "--ratio must be a finite number within (0, 10]"),
    (("--ratio", "0"), "--ratio must be within (0, 10]"),
    (("--jobs-parallel", "100000"), "--jobs-parallel must be within [1, 256] (processes), got 100000"),
    (("--jobs-parallel", "0"), "--jobs-parallel must be within [1, 256] (processes), got 0"),
    (("--jobs", "j.csv", "--size-estimates", "1e300"), "--size-estimates must be within [0, 10], got 1e+300"),
    # --repair-hours 1e300 with failures: a 3 s run took 67 s (the clock crawls to repairs that never come)
    (("--jobs", "j.csv", "--repair-hours", "1e300"), "--repair-hours must be within [0, 8760], got 1e+300"),
])
def test_numbers_out_of_bounds_are_one_line_naming_option_value_and_range(tiny, args, message):
    import time

    nodes, pods = tiny
    start = time.monotonic()
    result = invoke("compare", "--nodes", nodes, "--pods", pods, "--policies", "best-fit", "-q", *args)
    assert time.monotonic() - start < 30  # refused as the option is read, nothing built
    assert result.exit_code == 2
    assert result.output.startswith(f"error: {message}"), result.output
    assert len(result.output.splitlines()) == 1


def test_help_states_the_bounds():
    text = " ".join(invoke("compare", "--help").output.split())
    assert "(0 < R <= 10)" in text and "1 to 256" in text and "at most 10" in text and "(0 to 8760, a year)" in text


def test_the_inflation_ratio_is_bounded_in_the_library_too():
    from gpupool.model import PodRequest
    from gpupool.sim.inflation import MAX_INFLATION_RATIO, build_inflation_workload

    pods = [PodRequest("p", cpu_milli=1000, memory_mib=1024, num_gpu=1, gpu_milli=1000)]
    with pytest.raises(ValueError, match=r"within \(0, 10\], got 1e\+09"):
        build_inflation_workload(pods, 8000, 1e9)
    assert len(build_inflation_workload(pods, 8000, MAX_INFLATION_RATIO)) == 80
