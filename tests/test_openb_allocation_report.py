"""benchmarks/openb_allocation.py --report-only: the tables are rewritten from the results file, which keeps the
machine and date of the runs (nothing ran), and the gap columns read the optimum's bound and packing."""

from __future__ import annotations

import json

from conftest import argparse_error, bench_module

alloc = bench_module("openb_allocation.py")


def test_report_only_keeps_the_runs_machine_and_reads_the_optimum(tmp_path) -> None:
    runs = [{"variant": "default", "policy": p, "seed": s, "gpu_allocation_ratio_at_100": a,
             "gpu_allocation_ratio": a, "unallocated_gpus": 10.0, "failed_pods": 3, "first_failure_arrived": 0.9,
             "seconds": 1.0}
            for p, s, a in (("fgd", 42, 0.95), ("fgd", 43, 0.951), ("gpupool", 42, 0.96), ("gpupool", 43, 0.958))]
    machine = {"cpu": "the runs' CPU", "date": "2026-01-01T00:00:00+00:00"}
    (tmp_path / "openb_allocation.json").write_text(json.dumps({"machine": machine, "runs": runs}))
    (tmp_path / "openb_optimum.json").write_text(json.dumps({"runs": [
        {"variant": "default", "seed": s, "bound": 0.97, "packed": 0.969} for s in (42, 43)]}))
    assert alloc.main(["--report-only", "--variants", "default", "--out", str(tmp_path),
                       "--traces", str(tmp_path / "none")]) == 0
    out = json.loads((tmp_path / "openb_allocation.json").read_text())
    assert out["machine"]["cpu"] == "the runs' CPU" and out["machine"]["date"] == machine["date"]
    assert "report_rewritten" in out["machine"]
    assert len(out["runs"]) == 4
    gap = {g["policy"]: g for g in out["gaps"]}
    # gpupool: mean 95.9; bound 97.0 (gap 1.1); best packing 96.9 (gap 1.0)
    assert round(gap["gpupool"]["gap_to_bound"], 6) == 1.1
    assert round(gap["gpupool"]["gap_to_best_packing"], 6) == 1.0
    assert "the runs' CPU" in (tmp_path / "openb_allocation.md").read_text()


def test_no_seeds_is_refused_before_anything_is_written(capsys, tmp_path) -> None:
    out = tmp_path / "out"
    assert "--seeds must be at least 1" in argparse_error(
        alloc.main, capsys, ["--seeds", "0", "--first-seed", "100", "--out", str(out), "--traces", str(tmp_path)])
    assert not out.exists()
