"""The Tiresias peer benchmark's converter and log parser (benchmarks/tiresias/convert.py).

The full side-by-side run (benchmarks/tiresias/run.py) needs Python 2.7 and the peer's source; it is not
part of the test suite. These tests check the formats on a few rows, without the peer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import argparse_error, bench_module
from gpupool.traces.errors import TraceFormatError
from gpupool.traces.jobs import JobRecord, load_philly_jobs

ROOT = Path(__file__).resolve().parent.parent


conv = bench_module("tiresias/convert.py", "tiresias_convert")

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 07:01:55,66.0,1,66.0,11cb48
2017-10-09 06:13:03,2951.0,4,11804.0,6214e9
2017-10-09 06:13:03,100.0,2,200.0,6214e9
2017-10-09 06:00:00,7200.0,64,460800.0,6c71a0
2017-10-09 08:00:00,10.0,1,10.0,6c71a0
"""


@pytest.fixture
def philly(tmp_path: Path) -> list[JobRecord]:
    p = tmp_path / "philly.csv"
    p.write_text(PHILLY)
    return load_philly_jobs(p)


def test_window_rebases_and_keeps_order(philly: list[JobRecord]) -> None:
    w = conv.select_window(philly, first=3)
    # sorted by submission: 06:00 (64 GPUs, line 5), 06:13:03 (line 3), 06:13:03 (line 4), ...
    assert [j.line for j in w] == [5, 3, 4]
    assert [j.submit_time for j in w] == [0.0, 783.0, 783.0]
    assert [j.queue for j in w] == ["", "", ""]
    # offset and a GPU filter applied before the window
    w2 = conv.select_window(philly, first=10, offset=1, max_gpus=32)
    assert [j.line for j in w2] == [4, 2, 6]
    assert w2[0].submit_time == 0.0 and w2[1].submit_time == 2932.0
    with pytest.raises(ValueError, match="empty window"):
        conv.select_window(philly, first=1, offset=99)
    with pytest.raises(ValueError, match="first >= 1"):
        conv.select_window(philly, first=0)


def test_trace_round_trip(tmp_path: Path, philly: list[JobRecord]) -> None:
    w = conv.select_window(philly, first=5, max_gpus=32)
    path = conv.write_tiresias_trace(w, tmp_path / "jobs.csv")
    lines = path.read_text().splitlines()
    assert lines[0] == "job_id,num_gpu,submit_time,iterations,model_name,duration,interval"
    # every number is a digit string (Tiresias converts only those), interval = gap to the next job
    assert lines[1] == "3,4,0,2951,resnet50,2951,0"
    assert lines[2] == "4,2,0,100,resnet50,100,2932"
    assert lines[3] == "2,1,2932,66,resnet50,66,3485"
    assert lines[-1] == "6,1,6417,10,resnet50,10,0"
    back = conv.read_tiresias_trace(path)
    assert [(j.line, j.submit_time, j.duration, j.num_gpu) for j in back] == \
        [(j.line, j.submit_time, j.duration, j.num_gpu) for j in w]
    stats = conv.trace_stats(w, capacity_gpus=8)
    assert stats["jobs"] == 4 and stats["max_gpus"] == 4
    assert stats["gpu_hours"] == pytest.approx((11804 + 200 + 66 + 10) / 3600)


def test_writer_rejects_what_tiresias_would_misread(tmp_path: Path) -> None:
    frac = [JobRecord("a", 0.5, 10.0, 1, "", 2)]
    with pytest.raises(ValueError, match="submit_time 0.5"):
        conv.write_tiresias_trace(frac, tmp_path / "x.csv")
    unsorted = [JobRecord("a", 10.0, 10.0, 1, "", 2), JobRecord("b", 5.0, 10.0, 1, "", 3)]
    with pytest.raises(ValueError, match="not sorted"):
        conv.write_tiresias_trace(unsorted, tmp_path / "x.csv")
    dup = [JobRecord("a", 0.0, 10.0, 1, "", 2), JobRecord("b", 5.0, 10.0, 1, "", 2)]
    with pytest.raises(ValueError, match="used twice"):
        conv.write_tiresias_trace(dup, tmp_path / "x.csv")


def test_reader_bad_input_names_file_line_column(tmp_path: Path) -> None:
    p = tmp_path / "bad.csv"
    p.write_text("job_id,num_gpu,submit_time,iterations,model_name,duration,interval\n"
                 "1,2,0,5,resnet50,5,1\n"
                 "2,2,1.5,5,resnet50,5,0\n")
    with pytest.raises(TraceFormatError) as err:
        conv.read_tiresias_trace(p)
    assert (err.value.line, err.value.column) == (3, "submit_time")
    assert "bad.csv:3" in str(err.value)
    p.write_text("job_id,num_gpu,submit_time\n1,2,0\n")
    with pytest.raises(TraceFormatError, match="missing"):
        conv.read_tiresias_trace(p)


def test_cluster_spec(tmp_path: Path) -> None:
    p = conv.write_cluster_spec(tmp_path / "spec.csv", nodes=48)
    assert p.read_text() == ("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n"
                             "1,48,8,128,256\n")
    assert conv.write_cluster_spec(tmp_path / "s2.csv", 40, switches=4).read_text().splitlines()[1] == \
        "4,10,8,128,256"
    with pytest.raises(ValueError, match="multiple"):
        conv.write_cluster_spec(tmp_path / "s3.csv", 10, switches=4)


# The job log as Tiresias' log.py writes it: the `count` scheme adds `resume` (rows from a dlas-gpu run).
LOG_HEADER = "time,job_id,num_gpu,submit_time,start_time,end_time,executed_time,JCT,duration,pending_time,preempt"
JOB_LOG_COUNT = LOG_HEADER + """,resume,promote
120,7,1,0,0,120,120,120,120,0,0,1,0
4000,9,8,100,100,4000,3900,3900,3000,900,2,3,0
7700,8,2,0,50,7700,7650,7700,3000,4700,1,2,0
"""
# ... and the yarn scheme's (fifo) without it.
JOB_LOG_YARN = LOG_HEADER + """,promote
66,3,1,0,0,66,66,66,66,0,0,0
"""


def test_job_log_parser(tmp_path: Path) -> None:
    p = tmp_path / "job.csv"
    p.write_text(JOB_LOG_COUNT)
    jobs = conv.read_job_log(p)
    assert [(j.job_id, j.jct, j.preemptions) for j in jobs] == [(7, 120.0, 0), (9, 3900.0, 2), (8, 7700.0, 1)]
    s = conv.jct_summary([j.jct for j in jobs], [j.submit for j in jobs], [j.end for j in jobs])
    assert s["jobs"] == 3
    assert s["mean_jct_h"] == pytest.approx((120 + 3900 + 7700) / 3 / 3600)
    assert s["makespan_h"] == pytest.approx(7700 / 3600)
    assert s["p99_jct_h"] <= s["max_jct_h"] == pytest.approx(7700 / 3600)
    p.write_text(JOB_LOG_YARN)
    assert conv.read_job_log(p)[0].jct == 66.0


def test_job_log_parser_rejects_inconsistent_jct(tmp_path: Path) -> None:
    p = tmp_path / "job.csv"
    header = JOB_LOG_YARN.splitlines()[0]
    p.write_text(header + "\n66,3,1,0,0,66,66,65,66,0,0,0\n")
    with pytest.raises(TraceFormatError) as err:
        conv.read_job_log(p)
    assert (err.value.line, err.value.column) == (2, "JCT")
    p.write_text(JOB_LOG_YARN + JOB_LOG_YARN.splitlines()[1] + "\n")
    with pytest.raises(TraceFormatError, match="duplicate"):
        conv.read_job_log(p)


def test_gpupool_spec_parsing() -> None:
    pytest.importorskip("numpy")
    run = bench_module("tiresias/run.py", "tiresias_run")
    assert run.parse_gpupool_spec("gpupool") == ("gpupool", {})
    assert run.parse_gpupool_spec("gpupool+thresholds=3250+min_run_s=0") == \
        ("gpupool", {"thresholds": (3250,), "min_run_s": 0})
    assert run.parse_gpupool_spec("gpupool+order=gittins+promote_knob=None") == \
        ("gpupool", {"order": "gittins", "promote_knob": None})
    assert run.split_specs("fifo,gpupool+thresholds=(3250,7200),x") == ["fifo", "gpupool+thresholds=(3250,7200)", "x"]
    with pytest.raises(ValueError, match="KEY=VALUE"):
        run.parse_gpupool_spec("gpupool+nonsense=1")
    cfg = run.matched_config("fifo", {})
    assert cfg.restart_overhead_s == 0.0 and set(cfg.topology.factors.values()) == {1.0}


def test_committed_results_render() -> None:
    """The committed results file renders to the table (peer and gpupool rows at both sizes)."""
    import json

    results = ROOT / "benchmarks" / "results" / "tiresias_peer.json"
    if not results.exists():
        pytest.skip("no committed tiresias_peer.json")
    run = bench_module("tiresias/run.py", "tiresias_run")
    report = json.loads(results.read_text())
    md = run.markdown(report)
    assert f"at {report['tiresias']['commit']}" in md and "NumPy" in md
    rows = [line for line in md.splitlines() if line.startswith("| ") and "JCT" not in line]
    assert len(rows) == len({(r["simulator"], r["policy"]) for r in report["results"]})
    assert all(r["same_jobs_as_window"] for r in report["results"])
    assert all(r["finished_jobs"] == report["window"]["jobs"] for r in report["results"])


@pytest.fixture(scope="module")
def run_mod():
    pytest.importorskip("numpy")
    return bench_module("tiresias/run.py", "tiresias_run")


@pytest.mark.parametrize(("argv", "words"), [
    (["--gpus-per-node", "0"], ["--gpus-per-node", "0"]),
    (["--gpus-per-node", "-8"], ["--gpus-per-node", "-8"]),
    (["--nodes-per-rack", "-1"], ["--nodes-per-rack", "-1"]),
    (["--parallel", "0"], ["--parallel"]),
    (["--max-gpus", "0"], ["--max-gpus", "0"]),
    (["--first", "0"], ["--first"]),
    (["--offset", "-1"], ["--offset", "-1"]),
    (["--gpus", ""], ["--gpus", "no cluster size"]),
    (["--gpus", ","], ["--gpus", "no cluster size"]),
    (["--gpus", "abc"], ["--gpus", "'abc'"]),
    (["--gpus", "12"], ["--gpus", "multiple"]),
    (["--switches", "x"], ["--switches", "'x'"]),
    (["--switches", "7"], ["--switches"]),
    (["--peer", "bogus"], ["--peer", "bogus"]),
    (["--peer=", "--gpupool", ""], ["nothing to run"]),
    (["--gpupool", "gpupool+thresholds=nan"], ["--gpupool", "thresholds=nan"]),
    (["--gpupool", "gpupool+thresholds=(1,x)"], ["--gpupool", "thresholds"]),
    (["--gpupool", "nosuch"], ["--gpupool", "nosuch"]),
    (["--gpupool", "gpupool+nonsense=1"], ["--gpupool", "KEY=VALUE"]),
    (["--tiresias-src", "/nope/Tiresias"], ["--tiresias-src", "/nope/Tiresias"]),
    (["--python2", "/nope/python2.7"], ["--python2", "/nope/python2.7"]),
    (["--python2", sys.executable], ["--python2", "not a working Python 2.7"]),
])
def test_run_bad_options_name_the_option(run_mod, capsys, tmp_path: Path, argv: list[str],
                                         words: list[str]) -> None:
    """Each bad option ends the run with one argparse-style line (exit 2), before anything runs or is written."""
    msg = argparse_error(run_mod.main, capsys, [*argv, "--out", str(tmp_path / "out")])
    assert all(w in msg for w in words), msg
    assert not (tmp_path / "out").exists()


def test_run_bad_trace_window_and_render(run_mod, capsys, tmp_path: Path) -> None:
    trace = tmp_path / "philly.csv"
    trace.write_text(PHILLY)
    base = ["--trace", str(trace), "--peer=", "--gpupool", "fifo", "--out", str(tmp_path / "out")]
    msg = argparse_error(run_mod.main, capsys, [*base, "--max-gpus", "1", "--offset", "2"])
    assert "--offset" in msg and "--max-gpus 1" in msg
    trace.write_text(PHILLY + "2017-10-09 09:00:00,abc,1,10.0,6c71a0\n")
    msg = argparse_error(run_mod.main, capsys, base)
    assert "--trace" in msg and "philly.csv" in msg
    bad = tmp_path / "r.json"
    for text in ("{}", "not json"):
        bad.write_text(text)
        msg = argparse_error(run_mod.main, capsys, ["--render", str(bad)])
        assert "--render" in msg and "r.json" in msg, msg
    assert not bad.with_suffix(".md").exists()
    msg = argparse_error(run_mod.main, capsys, ["--render", str(tmp_path / "nope.json")])
    assert "--render" in msg and "nope.json" in msg


def test_run_tiny_gpupool_only(run_mod, tmp_path: Path) -> None:
    """Good input still runs (gpupool side only, 5 jobs) and says "1 switch" in the table."""
    trace = tmp_path / "philly.csv"
    trace.write_text(PHILLY)
    out = tmp_path / "out"
    assert run_mod.main(["--trace", str(trace), "--peer=", "--gpupool", "fifo", "--gpus", "64",
                         "--switches", "1", "--out", str(out), "--name", "t"]) == 0
    assert "Tiresias: 1 switch)" in (out / "t.md").read_text()


def test_help_fits_and_names_defaults(run_mod, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        run_mod.main(["--help"])
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    text = " ".join(out.split())
    for words in ("--gpus-per-node GPUS_PER_NODE GPUs per node", "pinned 959f9b08f44f",
                  "default fifo,dlas-gpu,dlas-gpu-gittins", "(default benchmarks/results", "runs at once (default 1)"):
        assert words in text, words


def test_cached_checkout_records_its_own_origin(run_mod, tmp_path: Path) -> None:
    """With a cached checkout, a different --tiresias-src is not used, and the results record the origin."""
    src = tmp_path / "peer"
    (src / "simulator").mkdir(parents=True)
    (src / "simulator" / "run_sim.py").write_text("print(1)\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(src)]
    import subprocess

    subprocess.run([*git[:5], "init", "-q", str(src)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "x"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    cache = tmp_path / "cache"
    cache.mkdir()
    sim, used = run_mod.fetch_tiresias(str(src), commit, cache)
    assert used == str(src) and (sim / "run_sim.py").exists()
    sim2, used2 = run_mod.fetch_tiresias("/elsewhere", commit, cache)
    assert sim2 == sim and used2.startswith(str(src)) and "cached checkout" in used2
