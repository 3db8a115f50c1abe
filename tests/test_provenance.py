"""Every JSON result carries ``meta``: version, commit (from a git checkout), time and machine."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool import __version__
from gpupool.cli import app
from gpupool.provenance import run_meta, source_commit

ROOT = Path(__file__).resolve().parents[1]


def _head() -> str | None:
    if shutil.which("git") is None:
        return None
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return out.stdout.strip() if out.returncode == 0 else None


def test_run_meta_names_version_commit_time_and_machine() -> None:
    meta = run_meta()
    assert meta["gpupool"] == __version__
    assert meta["commit"] == _head()  # this checkout's commit (None where git or the checkout is absent)
    assert meta["dirty"] in (True, False, None)
    when = dt.datetime.fromisoformat(meta["time"])
    assert when.tzinfo is not None and abs((dt.datetime.now(dt.UTC) - when).total_seconds()) < 600
    assert meta["machine"]["cores"] and meta["machine"]["python"] and meta["machine"]["cpu"]


def test_no_commit_outside_a_git_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on the PATH: a wheel installed anywhere
    source_commit.cache_clear()
    try:
        assert source_commit() is None
        assert run_meta()["commit"] is None
    finally:
        source_commit.cache_clear()


@pytest.mark.parametrize("args", [
    ["scheduler", "--dry-run", "--snapshot", str(ROOT / "examples/snapshots/cluster.yaml"), "--json", "-"],
    ["autoscale", "simulate", "--hours", "0.25", "--policies", "static", "--quiet", "--json", "-"],
])
def test_json_outputs_carry_meta(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["meta"]["gpupool"] == __version__ and doc["meta"]["command"]


def test_compare_and_job_documents_carry_meta() -> None:
    from gpupool import report

    placement = report.json_document("inflation", "nodes.csv", "pods.csv", 1.3, [], [])
    jobs = report.jobs_json_document("philly.csv", "cluster.yaml", None, [], [])
    for doc in (placement, jobs):
        assert doc["meta"]["gpupool"] == __version__ and "time" in doc["meta"]
        json.dumps(doc, allow_nan=False)  # strict JSON, as written
