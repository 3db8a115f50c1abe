"""The autoscaling scenario suite (issue 30): shapes, the scenario each builds, a short run, the CLI."""

from __future__ import annotations

import numpy as np
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.sim.inference_suite import SHAPES, Shape, profile, run_suite, suite_markdown, suite_scenario


def test_profile_is_piecewise_linear_and_flat_after_the_last_point() -> None:
    p = profile([(0, 1), (10, 11)])
    assert np.allclose(p.rate(np.array([0.0, 300.0, 600.0, 3600.0])), [1, 6, 11, 11])
    assert p.peak(3600) == 11 and p.trough_rps == 1


def test_suite_has_the_issue_shapes_on_both_mixes() -> None:
    names = {s.name for s in SHAPES}
    assert len(SHAPES) >= 9 and {"step-up", "flash-crowd", "from-zero", "idle-return", "oscillation"} <= names
    assert {s.mix for s in SHAPES} == {"chat", "code"}
    flash = next(s for s in SHAPES if s.name == "flash-crowd")
    env = profile(flash.points)
    assert env.rate(np.array([20 * 60 + 10.0]))[0] / env.rate(np.array([20 * 60.0]))[0] >= 10 - 1e-9


def test_from_zero_scenario_lets_the_zero_capable_policies_start_at_zero() -> None:
    sc = suite_scenario(next(s for s in SHAPES if s.from_zero))
    assert sc.policies["gpupool"]["autoscaler"]["minReplicas"] == 0
    assert sc.policies["keda-queue"]["autoscaler"]["minReplicas"] == 0
    assert sc.policies["hpa-gpu"]["autoscaler"]["minReplicas"] == 1
    assert sc.pool_gpus == 8 and sc.slo_s == 15


def test_short_suite_runs_every_policy_per_seed() -> None:
    shape = Shape("tiny", "2 rps", 10, ((0, 2),))
    cells = run_suite([shape], seeds=(1, 2), policies=["static", "gpupool"])
    assert [(c.seed, c.policy) for c in cells] == [(1, "static"), (1, "gpupool"), (2, "static"), (2, "gpupool")]
    assert all(0 < c.attainment <= 1 and c.gpu_hours > 0 for c in cells)
    text = "\n".join(suite_markdown(cells))
    assert "| tiny |" in text and "seeds 1 / 2" in text


def test_cli_suite_refuses_bad_seeds_and_unknown_policies() -> None:
    r = CliRunner().invoke(app, ["autoscale", "simulate", "--suite", "--seeds", "x"])
    assert r.exit_code == 2 and "--seeds" in r.output
    r = CliRunner().invoke(app, ["autoscale", "simulate", "--suite", "--policies", "nope"])
    assert r.exit_code == 2 and "nope" in r.output


def test_cli_suite_refuses_single_scenario_options() -> None:
    r = CliRunner().invoke(app, ["autoscale", "simulate", "--suite", "--hours", "1"])
    assert r.exit_code == 2 and "--hours" in r.output and "--suite" in r.output
