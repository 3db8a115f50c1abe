"""Parallel what-if sweeps (gpupool.sweep, `gpupool compare --jobs-parallel/--executor`): the same results as a
serial run, in the same order; errors and Ctrl-C handled; a clear error when Ray is not installed."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool import sweep
from gpupool.cli import app

REPO = Path(__file__).resolve().parents[1]
MIXED = REPO / "examples" / "clusters" / "mixed-models.yaml"
runner = CliRunner()


def work(name: str, seed: int, tick) -> tuple[str, int, int, int]:
    """A deterministic run that also says which process ran it."""
    total = sum((seed * 7919 + k * len(name)) % 97 for k in range(20_000))
    return name, seed, total, os.getpid()


def test_parallel_equals_serial_in_item_order() -> None:
    items = [(p, s) for p in ("fifo", "gpupool", "lowest-power") for s in (1, 2, 3)]
    serial = sweep.run_sweep(items, work, workers=1)
    done: list[int] = []
    parallel = sweep.run_sweep(items, work, workers=2, on_done=lambda k, r: done.append(k))
    assert [r[:3] for r in parallel] == [r[:3] for r in serial]
    assert {r[3] for r in serial} == {os.getpid()}
    assert os.getpid() not in {r[3] for r in parallel}  # really ran in worker processes
    assert sorted(done) == list(range(len(items)))


def fails(name: str, seed: int, tick) -> int:
    if seed == 2:
        raise ValueError(f"{name} seed {seed}: bad input")
    return seed


def test_a_failing_run_raises_its_error() -> None:
    with pytest.raises(ValueError, match="seed 2: bad input"):
        sweep.run_sweep([("a", 1), ("a", 2), ("a", 3)], fails, workers=2)


def interrupts(name: str, seed: int, tick) -> int:
    if seed == 1:
        raise KeyboardInterrupt
    return seed


def test_ctrl_c_keeps_the_finished_prefix() -> None:
    with pytest.raises(sweep.SweepInterrupted) as info:
        sweep.run_sweep([("a", 0), ("a", 1), ("a", 2)], interrupts, workers=2)
    assert info.value.results in ([0], [])


def test_bad_arguments() -> None:
    with pytest.raises(sweep.SweepError, match="unknown executor"):
        sweep.run_sweep([("a", 1)], work, executor="slurm")
    with pytest.raises(sweep.SweepError, match="workers must be >= 1"):
        sweep.run_sweep([("a", 1)], work, workers=0)


def test_ray_executor_without_ray_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError, as where it is not installed
    with pytest.raises(sweep.SweepError, match=r"pip install 'gpupool\[ray\]'"):
        sweep.run_sweep([("a", 1)], work, executor="ray")
    res = runner.invoke(app, ["compare", "--jobs", str(_trace_path()), "--cluster", str(MIXED),
                              "--executor", "ray", "--quiet", "--json", "-"])
    assert res.exit_code != 0 and "gpupool[ray]" in res.output


def _trace_path() -> Path:
    path = Path(os.environ.get("PYTEST_TMP", "/tmp")) / f"gpupool-sweep-{os.getpid()}.csv"
    rows = ["timestamp,duration,num_gpus,gpu_time,cluster"]
    for i in range(40):
        gpus = (1, 1, 2, 4, 8, 16)[i % 6]
        dur = 900 + 400 * (i % 7)
        rows.append(f"2017-10-01 {10 + i // 60:02d}:{i % 60:02d}:00,{dur},{gpus},{dur * gpus},{'abc'[i % 3]}")
    path.write_text("\n".join(rows) + "\n")
    return path


VOLATILE = ("wall_seconds", "events_per_second")


def _strip(doc: dict) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in doc["results"]]


def test_compare_parallel_equals_serial(tmp_path: Path) -> None:
    """`compare --jobs-parallel 2` writes the same records (every metric, per queue, unfinished) as
    `--jobs-parallel 1`, objectives and seeds included, and prints what each objective traded."""
    trace = _trace_path()
    args = ["compare", "--jobs", str(trace), "--cluster", str(MIXED), "--gpu-speed", "catalog", "--seeds", "1,2",
            "--policies", "gpupool,lowest-power", "--objective", "jct,balanced", "--quiet"]
    one = runner.invoke(app, [*args, "--jobs-parallel", "1", "--json", str(tmp_path / "one.json")])
    two = runner.invoke(app, [*args, "--jobs-parallel", "2", "--json", str(tmp_path / "two.json")])
    assert one.exit_code == 0, one.output
    assert two.exit_code == 0, two.output
    a, b = (json.loads((tmp_path / f).read_text()) for f in ("one.json", "two.json"))
    assert [(r["policy"], r["seed"]) for r in a["results"]] == [
        ("gpupool@jct", 1), ("gpupool@jct", 2), ("gpupool@balanced", 1), ("gpupool@balanced", 2),
        ("lowest-power", 1), ("lowest-power", 2)]
    assert _strip(a) == _strip(b)
    assert "gpupool@balanced: mean JCT" in two.output and "vs gpupool@jct" in two.output
    bad = runner.invoke(app, [*args, "--jobs-parallel", "0"])
    assert bad.exit_code != 0 and "--jobs-parallel must be within [1, 256]" in bad.output
    bad = runner.invoke(app, [*args[:-1], "--objective", "fast"])
    assert bad.exit_code != 0 and "--objective must be" in bad.output
