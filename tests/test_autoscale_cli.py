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


def test_typos_in_a_scenario_are_refused_with_line_column_and_the_key_meant(tmp_path: Path) -> None:
    # before: maxReplica / minReplica were ignored (the policy ran with the defaults) and the run went on
    text = REFERENCE.read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.strip() == "minReplicas: 1")
    bad = tmp_path / "typo.yaml"
    bad.write_text(text.replace("minReplicas: 1", "minReplica: 1", 1))
    res = _run("--scenario", str(bad), "--hours", "0.5", "--quiet")
    assert res.exit_code == 2, res.output
    column = lines[first].index("minReplicas") + 1
    assert res.output == (f"error: typo.yaml:{first + 1}:{column}: unknown field 'minReplica' in "
                          "spec.policies.hpa-cpu.autoscaler; did you mean 'minReplicas'?\n")
    bad.write_text(text.replace("maxReplicas: 4", "maxReplica: 4"))
    res = _run("--scenario", str(bad), "--hours", "0.5", "--quiet")
    assert res.exit_code == 2 and "did you mean 'maxReplicas'?" in res.output and "more unknown field" in res.output
    for old, new, meant in (("peakHour: 14", "peakHours: 14", "peakHour"), ("  seed: 42", "  sed: 42", "seed"),
                            ("kind: static", "kind: static\n      replica: 2", "replicas")):
        bad.write_text(text.replace(old, new, 1))
        res = _run("--scenario", str(bad), "--hours", "0.5", "--quiet")
        assert res.exit_code == 2 and f"did you mean {meant!r}?" in res.output, res.output
        assert len(res.output.splitlines()) == 1


def test_a_bad_indent_in_a_scenario_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "indent.yaml"
    bad.write_text(REFERENCE.read_text().replace("  seed: 42", "   seed: 42", 1))
    res = _run("--scenario", str(bad), "--quiet")
    assert res.exit_code == 2
    assert len(res.output.splitlines()) == 1 and res.output.startswith("error: indent.yaml:") and "invalid YAML" in \
        res.output, res.output


def test_a_typo_in_a_throughput_table_names_the_line_column_and_key_meant(tmp_path: Path) -> None:
    # before: an optional key misspelt was ignored, a required one was reported "missing" with no hint
    table = ROOT / "src" / "gpupool" / "data" / "inference_throughput.yaml"
    bad = tmp_path / "tp.yaml"
    bad.write_text(table.read_text().replace("  parameters: 8.03e9", "  parameter: 8.03e9", 1))
    res = _run("--throughput", str(bad), "--hours", "0.5", "--policies", "static", "--quiet")
    assert res.exit_code == 2
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if text.startswith("  parameter:"))
    assert res.output == f"error: tp.yaml:{line}:3: unknown field 'parameter' in model; did you mean 'parameters'?\n"
