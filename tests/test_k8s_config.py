"""`gpupool scheduler --config`: the deploy ConfigMap as it is, strict keys, no kubeconfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.k8s.scheduler_cli import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[1]


def test_configmap_file_is_read_as_deployed(tmp_path: Path) -> None:
    settings = load_config(ROOT / "deploy" / "configmap.yaml")
    assert settings.policy == "gpupool" and settings.scheduler_name == "gpupool" and settings.leader_elect
    changed = tmp_path / "cm.yaml"
    changed.write_text((ROOT / "deploy" / "configmap.yaml").read_text().replace("policy: gpupool",
                                                                                "policy: k8s-default"))
    assert load_config(changed).policy == "k8s-default"


@pytest.mark.parametrize("text, match", [
    ("profiles:\n  - schedulerName: gpupool\n    polcy: fgd\n", "unknown field.*polcy"),
    ("leaderElecton:\n  leaderElect: true\n", "unknown field.*leaderElecton"),
    ("kind: ConfigMap\ndata: {}\n", "data\\['config.yaml'\\]"),
])
def test_config_typos_are_errors(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_config(path)


def test_no_kubeconfig_is_a_clean_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    result = CliRunner().invoke(app, ["scheduler"])
    assert result.exit_code == 2
    assert "no usable Kubernetes configuration" in result.output


def test_the_scheduler_and_extender_warm_the_engine_kernels_before_the_first_pod(caplog) -> None:
    """``run_scheduler`` and ``run_extender`` call ``warm_kernels`` before they serve: every compiled kernel is
    ready (compiled or loaded from numba's cache), logged with the count and the seconds it took."""
    import logging

    from gpupool.engine import kernels
    from gpupool.k8s import extender_cli, scheduler_cli

    log = logging.getLogger("gpupool.test.warm")
    with caplog.at_level(logging.INFO, logger="gpupool.test.warm"):
        scheduler_cli.warm_kernels(log)
    if kernels.enabled():
        (rec,) = [r for r in caplog.records if r.getMessage() == "engine kernels ready"]
        assert rec.kernels == len(kernels.SIGNATURES) and rec.seconds >= 0
    else:
        assert not caplog.records
    assert extender_cli.warm_kernels is scheduler_cli.warm_kernels
    import inspect

    for fn in (scheduler_cli.run_scheduler, extender_cli.run_extender):
        assert "warm_kernels(log)" in inspect.getsource(fn)


@pytest.mark.parametrize("text, message", [
    ("leaderElection:\n  leaderElct: true\n", "2:3: unknown field 'leaderElct' in leaderElection; "
                                               "did you mean 'leaderElect'?"),
    ("telemetry:\n  prometheusUrl: http://p:9090\n", "2:3: unknown field 'prometheusUrl' in telemetry; "
                                                      "did you mean 'prometheusURL'?"),
    ("logging:\n  levle: debug\n", "2:3: unknown field 'levle' in logging; did you mean 'level'?"),
    ("pool:\n  jobOrder: fifo\n   reclaim: true\n", "3:11: invalid YAML: "),
])
def test_config_typos_in_every_section_name_the_line_column_and_field_meant(tmp_path: Path, text: str,
                                                                           message: str) -> None:
    # before: leaderElection, metrics, logging and telemetry took any key (a typo was silently ignored), and a YAML
    # error was PyYAML's multi-line dump
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}:{message}") and "\n" not in str(info.value), str(info.value)
