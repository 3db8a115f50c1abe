"""benchmarks/bench_decisions.py --scaling: the verdict lines of decisions_scaling.md and the kernel warm-up.

The benchmark itself (minutes) is not part of the test suite; one tiny scaling row checks that it runs,
warms the kernels before timing and reports what it measured.
"""

from __future__ import annotations

import pytest

from conftest import bench_module
from gpupool.engine import kernels


@pytest.fixture(scope="module")
def bd():
    return bench_module("bench_decisions.py")


def _row(policy: str, nodes: int, us: float, version: str = "current") -> dict:
    return {"version": version, "policy": policy, "nodes": nodes, "us_per_decision": us, "decisions_per_s": 1e6 / us}


def test_verdicts_compare_the_largest_cluster_with_the_smallest(bd) -> None:
    rows = [_row("gpupool", 1000, 50.0), _row("gpupool", 5000, 60.0), _row("gpupool", 20000, 74.0),
            _row("fgd", 1000, 50.0), _row("fgd", 20000, 80.0),
            _row("gpupool", 1000, 10.0, "baseline x"), _row("gpupool", 20000, 100.0, "baseline x")]
    lines = bd.scaling_verdicts(rows)
    assert lines[0] == ("- `gpupool`: 20,000 nodes cost 1.48x 1,000 nodes per decision: met; "
                        "16,667 decisions/s at 5,000 nodes: met.")
    assert lines[1] == "- `fgd`: 20,000 nodes cost 1.60x 1,000 nodes per decision: MISSED."
    slow = bd.scaling_verdicts([_row("gpupool", 1000, 50.0), _row("gpupool", 5000, 101.0),
                                _row("gpupool", 20000, 101.0)])
    assert slow == ["- `gpupool`: 20,000 nodes cost 2.02x 1,000 nodes per decision: MISSED; "
                    "9,901 decisions/s at 5,000 nodes: MISSED."]
    small = bd.scaling_verdicts([_row("gpupool", 300, 50.0), _row("gpupool", 1200, 51.0)])
    assert small == ["- `gpupool`: 1,200 nodes cost 1.02x 300 nodes per decision: the target is for 20,000 "
                     "against 1,000 nodes, not measured here; no 5,000-node row, so the 10,000 decisions/s target "
                     "is not measured."]
    failed = [{"version": "current", "policy": "gpupool", "nodes": 1000, "error": "exit 1: boom"},
              _row("gpupool", 5000, 60.0), _row("gpupool", 20000, 66.0)]
    assert bd.scaling_verdicts(failed) == ["- `gpupool`: the 1,000-node row failed, no ratio; "
                                           "16,667 decisions/s at 5,000 nodes: met."]
    failed[1] = {"version": "current", "policy": "gpupool", "nodes": 5000, "error": "x"}
    assert bd.scaling_verdicts(failed)[0].endswith("the 5,000-node row failed: decisions/s target not measured.")
    assert bd.scaling_verdicts([_row("fgd", 1000, 50.0)]) == ["- `fgd`: one cluster size only (1,000 nodes), no ratio."]
    zero = bd.scaling_verdicts([{**_row("fgd", 1000, 1.0), "us_per_decision": 0.0}, _row("fgd", 20000, 10.0)])
    assert zero == ["- `fgd`: no time measured at 1,000 nodes, no ratio."]
    assert bd._fill_range([{"fill_after_prefill": 0.841}, {"fill_after_prefill": 0.852}, {}]) == "84%-85%"
    assert bd._fill_range([{"error": "x"}]) == "n/a"
    assert bd.scaling_verdicts([_row("gpupool", 1000, 50.0), {"version": "current", "error": "x"}]) == [
        "- `gpupool`: one cluster size only (1,000 nodes), no ratio; no 5,000-node row, so the 10,000 decisions/s "
        "target is not measured."]


@pytest.mark.parametrize("argv, message", [
    (["--scaling", ""], "--scaling: no value"), (["--scaling", "abc"], "invalid int value: 'abc'"),
    (["--scaling", "0"], "0 is not >= 1"), (["--window", "0"], "--window: must be at least 1"),
    (["--warmup", "-1"], "--warmup: must be at least 0"), (["--fill", "0"], "--fill: must be a share"),
    (["--fill", "1.5"], "--fill: must be a share"),
])
def test_bad_scaling_arguments_are_one_error_naming_the_option(bd, argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bd.parse_args(argv)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_repeated_scaling_sizes_run_once(bd) -> None:
    assert bd.parse_args(["--scaling", "100,100,200"]).scaling == "100,200"


def test_a_scaling_row_warms_the_kernels_first_and_hashes_its_decisions(bd) -> None:
    row = bd.measure_scaling(60, "gpupool", 42, 0.5, 20, 40)
    assert row["decisions"] == 40 and row["scheduled"] + row["unschedulable"] == 40
    assert len(row["decisions_sha256"]) == 16
    if kernels.enabled():
        assert row["warm_up_s"] >= 0.0 and kernels.warm_up().keys() == kernels.SIGNATURES.keys()
    else:
        assert row["warm_up_s"] == 0.0
    again = bd.measure_scaling(60, "gpupool", 42, 0.5, 20, 40)
    assert again["decisions_sha256"] == row["decisions_sha256"]
