"""docs/metrics.md names every metric family each component exposes, and nothing else."""

from __future__ import annotations

import re
from pathlib import Path

from gpupool.agent import exporter
from gpupool.k8s.autoscaler.controller import AutoscalerMetrics
from gpupool.k8s.metrics import SchedulerMetrics

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def _documented() -> dict[str, set[str]]:
    """Section name -> the families in the first column of its table."""
    out: dict[str, set[str]] = {}
    for section in DOC.read_text(encoding="utf-8").split("\n## ")[1:]:
        title, body = section.split("\n", 1)
        out[title.strip()] = set(re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \|", body, re.M))
    return out


def _families(registry) -> set[str]:
    return {fam.name for fam in registry.collect()}


def test_every_family_is_documented_under_its_component() -> None:
    doc = _documented()
    agent = {name for name, _, _ in exporter.METRICS} | {exporter.XID_METRIC[0], exporter.HEALTHY_METRIC[0],
                                                        exporter.UPDATED_METRIC[0], exporter.POD_RESOURCES_METRIC[0]}
    assert doc["Scheduler"] == _families(SchedulerMetrics().registry)
    assert doc["Node agent"] == agent
    assert doc["GpuAutoscaler controller"] == _families(AutoscalerMetrics().registry)


def test_alerts_name_only_documented_series() -> None:
    doc = _documented()
    known = set().union(*(doc[k] for k in ("Scheduler", "Node agent", "GpuAutoscaler controller")))
    alerts = DOC.read_text(encoding="utf-8").split("## What to alert on", 1)[1]
    used = set(re.findall(r"\b((?:gpupool|DCGM)_[A-Za-z0-9_]+)", alerts))
    base = {re.sub(r"_(total|bucket|sum|count)$", "", name) for name in used}
    assert base <= known, base - known
