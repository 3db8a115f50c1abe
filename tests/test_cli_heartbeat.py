"""A long CLI run whose stderr is not a terminal prints a progress line every interval, even while no run reports
progress (issue 31: piped long runs went silent for minutes). Waits are on conditions (lines seen), with generous
ceilings, never on the machine's speed."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.cli.common import PROGRESS_INTERVAL_ENV, RunProgress

ROOT = Path(__file__).resolve().parents[1]
CEILING_S = 600.0  # a loaded 2-core machine compiling numba's kernels first; a quiet one sees lines in seconds


def _wait_for(condition, ceiling: float = CEILING_S, step: float = 0.01) -> None:
    deadline = time.monotonic() + ceiling
    while not condition():
        assert time.monotonic() < deadline, "condition not met within the ceiling"
        time.sleep(step)


def test_heartbeat_lines_without_any_update_and_none_after_exit(capsys):
    seen: list[str] = []

    def lines() -> list[str]:
        seen.extend(capsys.readouterr().err.splitlines())
        return seen

    with RunProgress(3, quiet=False, interval=0.05, tty=False) as progress:
        progress.begin(0, "one long run")
        _wait_for(lambda: len(lines()) >= 2)  # no update() since begin: the heartbeat wrote them
        beat = progress._heartbeat
    assert beat is not None and not beat.is_alive() and progress._heartbeat is None
    lines()
    assert all(line.startswith("progress: one long run [1/3]: 0.0/3 runs (0%), elapsed ") for line in seen), seen
    assert all(line.endswith("ETA unknown") for line in seen)  # nothing done: no invented ETA


def test_no_heartbeat_on_a_terminal_or_quiet(capsys):
    for kwargs in ({"quiet": True, "tty": False}, {"quiet": False, "tty": True}):
        with RunProgress(2, interval=0.01, **kwargs) as progress:
            assert progress._heartbeat is None
    assert "progress: " not in capsys.readouterr().err  # (rich may write a bare newline for its bar)


def test_bad_interval_variable_is_one_line_error(tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_INTERVAL_ENV, "soon")
    result = CliRunner().invoke(app, ["compare", "-p", "best-fit", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert f"{PROGRESS_INTERVAL_ENV}='soon': expected seconds" in result.output


def test_piped_compare_prints_progress_lines_while_it_runs(tmp_path):
    """`gpupool compare` with stdout and stderr pipes (as under `| tee`, nohup or CI): progress lines reach stderr
    while it runs; the process is stopped once two are seen."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **{PROGRESS_INTERVAL_ENV: "0.5"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool.cli", "compare", "-p", "best-fit,spread,fgd", "--seeds", "1,2,3",
         "--json", str(tmp_path / "r.json"), "--out", str(tmp_path / "plots")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    got: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [got.put(line) for line in proc.stderr], daemon=True)
    reader.start()
    progress: list[str] = []
    other: list[str] = []
    try:
        deadline = time.monotonic() + CEILING_S
        while len(progress) < 2:
            assert proc.poll() is None or not got.empty(), f"exited {proc.returncode} first: {other}"
            try:
                line = got.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no two progress lines within {CEILING_S} s: {progress + other}")
            (progress if line.startswith("progress: ") else other).append(line.rstrip("\n"))
        still_running = proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
    assert still_running, "the run ended before its second progress line: it was not a long run"
    assert all("runs (" in p and "elapsed" in p and "ETA" in p for p in progress), progress
    assert "Traceback" not in "".join(other)
