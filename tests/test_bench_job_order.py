"""Bad input to benchmarks/bench_job_order.py: one argparse-style line naming the option, exit 2, nothing run.

The full benchmark (minutes per window) is not part of the test suite; one run on a 5-job trace checks
that good input still runs and writes both files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import argparse_error, bench_module

ROOT = Path(__file__).resolve().parent.parent

PHILLY = """timestamp,duration,num_gpus,gpu_time,cluster
2017-10-09 06:00:00,66.0,1,66.0,11cb48
2017-10-09 06:10:00,2951.0,4,11804.0,6214e9
2017-10-09 06:13:03,100.0,2,200.0,6214e9
2017-10-09 07:00:00,7200.0,16,115200.0,6c71a0
2017-10-09 08:00:00,10.0,1,10.0,6c71a0
"""


@pytest.fixture(scope="module")
def bjo():
    return bench_module("bench_job_order.py")


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    p = tmp_path / "philly.csv"
    p.write_text(PHILLY)
    return p


@pytest.mark.parametrize(("argv", "words"), [
    (["--offsets", "abc"], ["--offsets", "'abc'"]),
    (["--offsets", ""], ["--offsets", "no value"]),
    (["--offsets", "-5"], ["--offsets", "-5"]),
    (["--gpus", "abc"], ["--gpus", "'abc'"]),
    (["--gpus", "0"], ["--gpus", "0", "multiple of 8"]),
    (["--gpus", "4"], ["--gpus", "4"]),
    (["--gpus", "-8"], ["--gpus", "-8"]),
    (["--gpus", "12"], ["--gpus", "12"]),
    (["--jobs", "-3"], ["--jobs", "-3"]),
    (["--jobs", "0"], ["--jobs"]),
    (["--places", "bogus"], ["--places", "'bogus'"]),
    (["--orders", ""], ["--orders", "no value"]),
    (["--orders", ","], ["--orders", "no value"]),
    (["--orders", "nope"], ["--orders", "'nope'"]),
])
def test_bad_lists_name_the_option(bjo, capsys, tmp_path: Path, argv: list[str], words: list[str]) -> None:
    msg = argparse_error(bjo.main, capsys, [*argv, "--out", str(tmp_path / "out")])
    assert all(w in msg for w in words), msg
    assert not (tmp_path / "out").exists()


def test_bad_trace(bjo, capsys, tmp_path: Path, trace: Path) -> None:
    out = ["--out", str(tmp_path / "out"), "--peer-results"]
    msg = argparse_error(bjo.main, capsys, ["--trace", str(tmp_path), *out])
    assert "--trace" in msg and str(tmp_path) in msg
    trace.write_text(PHILLY + "2017-10-09 09:00:00,abc,1,10.0,6c71a0\n")
    msg = argparse_error(bjo.main, capsys, ["--trace", str(trace), *out])
    assert "--trace" in msg and "philly.csv" in msg and ":7" in msg
    msg = argparse_error(bjo.main, capsys, ["--trace", str(tmp_path / "nope.csv"), *out])
    assert "--trace" in msg and "nope.csv" in msg
    trace.write_text(PHILLY)
    msg = argparse_error(bjo.main, capsys, ["--trace", str(trace), "--offsets", "5", *out])
    assert "--offsets" in msg and "5" in msg


def test_bad_rescore_and_peer_results(bjo, capsys, tmp_path: Path) -> None:
    out = ["--out", str(tmp_path / "out")]
    msg = argparse_error(bjo.main, capsys, ["--rescore", str(tmp_path / "nope.json"), "--peer-results", *out])
    assert "--rescore" in msg and "nope.json" in msg
    bad = tmp_path / "bad.json"
    bad.write_text("not json")
    msg = argparse_error(bjo.main, capsys, ["--rescore", str(bad), "--peer-results", *out])
    assert "--rescore" in msg and "bad.json" in msg
    for text in ("{}", "[]", '{"windows": [{"offset": 0}]}'):
        bad.write_text(text)
        msg = argparse_error(bjo.main, capsys, ["--rescore", str(bad), "--peer-results", *out])
        assert "--rescore" in msg and "not a job_order.json" in msg
    msg = argparse_error(bjo.main, capsys, ["--peer-results", str(tmp_path / "nope.json"), *out])
    assert "--peer-results" in msg and "nope.json" in msg
    for text in ("not json", "[]", '{"window": {}}'):
        bad.write_text(text)
        msg = argparse_error(bjo.main, capsys, ["--peer-results", str(bad), *out])
        assert "--peer-results" in msg and "bad.json" in msg
    assert not (tmp_path / "out").exists()


def test_help_shows_trace_and_out_defaults(bjo, capsys) -> None:
    with pytest.raises(SystemExit):
        bjo.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "default ../shared/traces/philly_pollux/philly.csv)" in text
    assert "(default benchmarks/results)" in text


def test_tiny_run_and_rescore(bjo, tmp_path: Path, trace: Path) -> None:
    pytest.importorskip("numpy")
    out = tmp_path / "out"
    assert bjo.main(["--trace", str(trace), "--jobs", "5", "--offsets", "0", "--gpus", "16", "--orders", "las",
                     "--places", "count", "--peer-results", "--out", str(out)]) == 0
    doc = json.loads((out / "job_order.json").read_text())
    assert [(w["gpus"], [r["order"] for r in w["rows"]]) for w in doc["windows"]] == [(16, ["las"])]
    assert doc["windows"][0]["rows"][0]["finished"] == 5
    assert bjo.main(["--rescore", str(out / "job_order.json"), "--peer-results", "--out", str(out)]) == 0


def test_checks_compare_unrounded_figures(bjo) -> None:
    # a p95 at the floor equal to the peer's up to float noise passes; one 0.004 h above it (the same after
    # rounding to the tables' 2 decimals) fails: no side is rounded before the comparison
    ref = {"tiresias-G": {"mean_jct_h": 3.8202, "p95_jct_h": 6.267708333333337},
           "tiresias-L": {"p99_jct_h": 81.5, "makespan_h": 642.0}}
    row = {"mean_jct_h": 3.8162, "p95_jct_h": 6.267708333333336, "p99_jct_h": 76.2, "makespan_h": 641.4}
    assert all(bjo.check(row, ref).values())
    worse = dict(row, p95_jct_h=6.2717, mean_jct_h=3.8240)
    c = bjo.check(worse, ref)
    assert c["p95_le_G"] is False and c["mean_le_G"] is False
