"""``gpupool autoscale simulate``: table, explanations, JSON, PNG, and clear errors (issue 10)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from gpupool.cli import app

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "examples" / "autoscale" / "reference.yaml"
runner = CliRunner()


def _run(*args: str):
    return runner.invoke(app, ["autoscale", "simulate", *args], env={"COLUMNS": "80"})


def test_simulate_short_run_writes_table_json_and_png(tmp_path: Path) -> None:
    res = _run("--scenario", str(REFERENCE), "--hours", "1", "--policies", "static,hpa-cpu,gpupool",
               "--out", str(tmp_path / "out"), "--json", str(tmp_path / "r.json"), "--quiet")
    assert res.exit_code == 0, res.output
    assert "static" in res.output and "gpupool" in res.output and "hpa-cpu:" in res.output
    assert max(len(line) for line in res.output.splitlines()) <= 80
    doc = json.loads((tmp_path / "r.json").read_text())
    assert [p["policy"] for p in doc["policies"]] == ["static", "hpa-cpu", "gpupool"]
    for p in doc["policies"]:
        assert 0 <= p["slo_attainment"] <= 1 and p["gpu_hours"] > 0 and p["explanation"]
        assert {"ttft_p99_s", "e2e_p50_s", "e2e_p95_s", "e2e_p99_s", "lent_gpu_hours", "replica_changes"} <= set(p)
    assert "seed 42" in doc["title"]
    png = tmp_path / "out" / "autoscale.png"
    assert png.exists() and png.read_bytes()[:4] == b"\x89PNG"


def test_json_to_stdout_and_seed() -> None:
    res = _run("--hours", "0.5", "--policies", "static", "--seed", "7", "--json", "-", "--quiet")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["seed"] == 7 and doc["policies"][0]["policy"] == "static"


def test_unknown_policy_and_bad_files_exit_2(tmp_path: Path) -> None:
    res = _run("--hours", "0.5", "--policies", "nope", "--quiet")
    assert res.exit_code == 2 and "unknown policy nope" in res.output
    bad = tmp_path / "s.yaml"
    bad.write_text("kind: InferenceScenario\nspec: {slo: {e2eSeconds: 0}}\n")
    res = _run("--scenario", str(bad), "--quiet")
    assert res.exit_code == 2 and "s.yaml: spec.slo.e2eSeconds: must be > 0" in res.output
    trace = tmp_path / "t.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,5,x\n")
    res = _run("--hours", "0.5", "--policies", "static", "--trace", str(trace), "--quiet")
    assert res.exit_code == 2 and "t.csv:2: column 'GeneratedTokens'" in res.output


def test_help_fits_80_columns() -> None:
    res = _run("--help")
    assert res.exit_code == 0
    assert all(len(line) <= 80 for line in res.output.splitlines())
    assert "--scenario" in res.output and "--wide" in res.output


def test_wide_prints_every_column_past_80() -> None:
    res = _run("--hours", "0.5", "--policies", "static", "--wide", "--quiet")
    assert res.exit_code == 0, res.output
    header = next(line for line in res.output.splitlines() if "policy" in line and "SLO" in line)
    assert "e2e p50 s" in header and "reclaim s" in header and len(header) > 80
