"""The autoscaling scenario suite (issue 30): arrival shapes the reference day does not have, every policy
side by side, several seeds, on the chat and the prompt-heavy token mixes.

Each shape is a piecewise-linear request rate (:class:`Profile`), run on the Azure LLM trace time-warped onto
it (the conversation trace: the chat mix; the code trace in ``shared/traces/azure_llm_2023``: the
prompt-heavy mix, mean prompt ~2,000 tokens). The service and the SLO are the reference scenario's
(Llama-3.1-8B on H200, 99 % of requests within 15 s end to end), the pool is 8 H200. The peers are the
project's recommender driven as the anchors configure it: static for the peak, HPA on
``DCGM_FI_DEV_GPU_UTIL`` at 75 %, KEDA on ``vllm:num_requests_waiting`` at 5, Knative KPA at 44.8 in flight
(70 % of containerConcurrency 64); ``gpupool`` is the right-sized recommender as the reference configures it,
``gpupool-whole`` the same on whole GPUs only (what right-sizing saved or cost is the difference).
Scenarios are short (1-2 h) so that the whole suite runs in minutes; the shapes are what matters. A shape
that would start at a high rate starts with a 10 min warm-up ramp: every autoscaled policy starts at its
minimum, and a start under full load measured the simulator's cold start, not the shape.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .inference import Envelope
from .inference_policies import Scenario, parse_scenario
from .inference_report import ScenarioRun, run_scenario

__all__ = ["POLICIES", "SHAPES", "Profile", "Shape", "SuiteCell", "profile", "run_suite", "suite_markdown",
           "suite_scenario", "suite_table"]


@dataclass(frozen=True)
class Profile(Envelope):
    """A request rate given as points ``((t_s, rps), ...)``, linear in between, flat after the last point.
    ``trough_rps`` / ``peak_rps`` are the lowest / highest point (for the report)."""

    points: tuple[tuple[float, float], ...] = ()

    def rate(self, t_s: np.ndarray) -> np.ndarray:
        """(n,) requests/s at times ``t_s`` (s from the start)."""
        xs = np.array([p[0] for p in self.points], dtype=np.float64)
        ys = np.array([p[1] for p in self.points], dtype=np.float64)
        return np.interp(np.asarray(t_s, dtype=np.float64), xs, ys)


def profile(points: Sequence[tuple[float, float]]) -> Profile:
    """A :class:`Profile` from ``(minute, rps)`` points."""
    pts = tuple((m * 60.0, float(r)) for m, r in points)
    rates = [r for _, r in pts]
    return Profile(min(rates), max(rates), 0.0, (), pts)


@dataclass(frozen=True)
class Shape:
    """One scenario of the suite: ``points`` (minute, rps), ``minutes`` long, ``mix`` ``chat`` or ``code``;
    ``from_zero``: the autoscaled policies that can (gpupool, KEDA, Knative) start at and may go to 0."""

    name: str
    what: str
    minutes: float
    points: tuple[tuple[float, float], ...]
    mix: str = "chat"
    from_zero: bool = False


def _oscillation(period_min: float, lo: float, hi: float, minutes: float) -> tuple[tuple[float, float], ...]:
    pts: list[tuple[float, float]] = []
    t = 0.0
    while t <= minutes:
        pts += [(t, lo), (t + period_min / 2 - 1, lo), (t + period_min / 2, hi), (t + period_min - 1, hi)]
        t += period_min
    return tuple(pts)


#: The suite's shapes (rates in requests/s; one whole H200 serves ~6 rps of the chat mix within half the SLO).
SHAPES: tuple[Shape, ...] = (
    Shape("step-up", "2 -> 12 rps at 20 min", 80, ((0, 2), (20, 2), (20.05, 12))),
    Shape("step-down", "warm-up to 12 rps, 12 -> 2 rps at 30 min, back to 12 at 70 min", 100,
          ((0, 1), (10, 12), (30, 12), (30.05, 2), (70, 2), (70.05, 12))),
    Shape("ramp", "1 -> 14 rps over 40 min, down over 40 min", 90, ((0, 1), (5, 1), (45, 14), (85, 1))),
    Shape("flash-crowd", "1.5 -> 15 rps within 10 s, for 10 min", 60,
          ((0, 1.5), (20, 1.5), (20 + 10 / 60, 15), (30, 15), (30 + 10 / 60, 1.5))),
    Shape("oscillation", "2 <-> 10 rps, 20 min period", 100, _oscillation(20, 2, 10, 100)),
    Shape("idle-return", "warm-up to 6 rps, 0.1 rps for 45 min, back to 6 rps within 30 s", 100,
          ((0, 0.5), (10, 6), (20, 6), (20.5, 0.1), (65, 0.1), (65.5, 6))),
    Shape("from-zero", "nothing for 12 min (past the 5 min cooldown: at zero), then 3 rps", 45,
          ((0, 0), (12, 0), (12.05, 3)), from_zero=True),
    Shape("day-chat", "a day compressed into 2 h: 0.5 -> 10 rps and back, chat mix", 120,
          ((0, 0.5), (30, 2), (60, 10), (90, 4), (120, 0.5))),
    Shape("day-code", "the same day on the code trace (prompt-heavy: mean prompt ~2,000 tokens)", 120,
          ((0, 0.25), (30, 1), (60, 5), (90, 2), (120, 0.25)), mix="code"),
    Shape("flash-code", "0.8 -> 8 rps within 10 s for 10 min, code trace", 60,
          ((0, 0.8), (20, 0.8), (20 + 10 / 60, 8), (30, 8), (30 + 10 / 60, 0.8)), mix="code"),
)

#: Policy name -> the scenario's policy entry (``maxReplicas`` and the pool: 8 H200).
POLICIES: dict[str, dict[str, Any]] = {
    "gpupool": {"kind": "rightsized", "headroom": 0.5,
                "autoscaler": {"minReplicas": 1, "maxReplicas": 16, "panicWindowSeconds": 30,
                               "stableWindowSeconds": 120, "panicThreshold": 200}},
    "gpupool-whole": {"kind": "rightsized", "headroom": 0.5, "slices": ["1xH200"],
                      "autoscaler": {"minReplicas": 1, "maxReplicas": 16, "panicWindowSeconds": 30,
                                     "stableWindowSeconds": 120, "panicThreshold": 200}},
    "static": {"kind": "static", "slice": "1xH200", "replicas": "auto"},
    "hpa-gpu": {"kind": "recommender", "slice": "1xH200", "style": "HPA on DCGM_FI_DEV_GPU_UTIL: ",
                "autoscaler": {"minReplicas": 1, "maxReplicas": 8,
                               "metrics": [{"name": "gpu_util", "target": {"averageUtilization": 75}}]}},
    "keda-queue": {"kind": "recommender", "slice": "1xH200", "style": "KEDA on vllm:num_requests_waiting: ",
                   "autoscaler": {"minReplicas": 1, "maxReplicas": 8, "cooldownPeriod": 300,
                                  "metrics": [{"name": "queue_depth", "target": 5}]}},
    "knative": {"kind": "recommender", "slice": "1xH200", "style": "Knative KPA on concurrency: ",
                "reconcileSeconds": 2, "scrapeSeconds": 2,
                "autoscaler": {"minReplicas": 1, "maxReplicas": 8, "stableWindowSeconds": 60,
                               "panicWindowSeconds": 6, "panicThreshold": 200,
                               "metrics": [{"name": "concurrency", "target": 44.8}],
                               "behavior": {"scaleUp": {"stabilizationWindowSeconds": 0,
                                                        "policies": [{"type": "Percent", "value": 1000,
                                                                      "periodSeconds": 2}]},
                                            "scaleDown": {"stabilizationWindowSeconds": 60}}}},
}

#: Policies that scale to zero in a ``from_zero`` shape (HPA does not: minReplicas >= 1 without a feature gate).
ZERO_CAPABLE = ("gpupool", "gpupool-whole", "keda-queue", "knative")


def suite_scenario(shape: Shape, policies: Sequence[str] | None = None) -> Scenario:
    """The :class:`Scenario` of ``shape`` with ``policies`` (default: all of :data:`POLICIES`)."""
    pols = {n: copy.deepcopy(POLICIES[n]) for n in (policies or POLICIES)}
    if shape.from_zero:
        for n in ZERO_CAPABLE:
            if n in pols:
                pols[n]["autoscaler"]["minReplicas"] = 0
    doc = {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "InferenceScenario", "metadata": {"name": shape.name},
        "spec": {
            "durationHours": shape.minutes / 60.0, "seed": 7, "gpuModel": "H200", "poolGpus": 8,
            "slo": {"e2eSeconds": 15, "attainment": 0.99},
            "workload": {"source": "azure-llm", "trace": "embedded", "troughRps": 1, "peakRps": 1},
            "replica": {"startupSeconds": 90, "cpuRequestCores": 4},
            "metrics": {"scrapeSeconds": 15, "lagSeconds": 15, "reconcileSeconds": 15},
            "lending": {"enabled": False},
            "policies": pols,
        },
    }
    sc = parse_scenario(doc, f"suite:{shape.name}")
    sc.envelope = profile(shape.points)
    return sc


@dataclass
class SuiteCell:
    """One (shape, seed, policy) run: SLO attainment (share of requests within the SLO), GPU-hours."""

    shape: str
    seed: int
    policy: str
    attainment: float
    meets_slo: bool
    gpu_hours: float
    replicas_max: int
    extra: dict[str, Any] = field(default_factory=dict)


def run_suite(shapes: Sequence[Shape] = SHAPES, seeds: Sequence[int] = (7, 8, 9),
              policies: Sequence[str] | None = None, *, code_trace: str | Path | None = None,
              progress: Callable[[str], None] | None = None) -> list[SuiteCell]:
    """Run every shape x seed x policy; returns the cells in that order.

    ``code_trace``: the Azure LLM code trace CSV for the ``code`` mix (shapes on it are skipped when None).
    Raises InferenceConfigError / TraceFormatError as :func:`run_scenario`."""
    cells: list[SuiteCell] = []
    for shape in shapes:
        if shape.mix == "code" and code_trace is None:
            continue
        sc = suite_scenario(shape, policies)
        for seed in seeds:
            if progress is not None:
                progress(f"{shape.name} seed {seed}")
            run = run_scenario(sc, seed=seed, trace=code_trace if shape.mix == "code" else None)
            cells += _cells(run, shape, seed)
    return cells


def _cells(run: ScenarioRun, shape: Shape, seed: int) -> list[SuiteCell]:
    out = []
    for row in run.rows:
        att = float(row["slo_attainment"])
        extra = {k: row[k] for k in ("e2e_p99_s", "cold_starts", "rightsizing") if k in row}
        out.append(SuiteCell(shape.name, seed, row["policy"], att, bool(row["meets_slo"]),
                             float(row["gpu_hours"]), int(row["replicas_max"]), extra))
    return out


def suite_table(cells: Sequence[SuiteCell]) -> dict[str, dict[str, Any]]:
    """Per policy: ``meets`` {seed: scenarios meeting the SLO}, ``scenarios`` (per seed), ``gpu_hours``
    {seed: total over the shapes}, ``min_attainment``."""
    table: dict[str, dict[str, Any]] = {}
    for c in cells:
        t = table.setdefault(c.policy, {"meets": {}, "scenarios": {}, "gpu_hours": {}, "min_attainment": math.inf})
        t["meets"][c.seed] = t["meets"].get(c.seed, 0) + int(c.meets_slo)
        t["scenarios"][c.seed] = t["scenarios"].get(c.seed, 0) + 1
        t["gpu_hours"][c.seed] = round(t["gpu_hours"].get(c.seed, 0.0) + c.gpu_hours, 2)
        t["min_attainment"] = min(t["min_attainment"], c.attainment)
    return table


def suite_markdown(cells: Sequence[SuiteCell]) -> list[str]:
    """The suite as Markdown lines: the summary per policy (scenarios meeting the SLO per seed, GPU-hours
    per seed), then one row per shape (per policy: worst SLO attainment over the seeds, mean GPU-hours)."""
    table = suite_table(cells)
    pols = list(table)
    seeds = sorted({c.seed for c in cells})
    lines = ["| | " + " | ".join(pols) + " |", "|---|" + "---|" * len(pols)]
    lines.append(f"| scenarios meeting the SLO (of {table[pols[0]]['scenarios'][seeds[0]]}), seeds "
                 + " / ".join(map(str, seeds)) + " | "
                 + " | ".join(" / ".join(str(table[p]["meets"].get(s, 0)) for s in seeds) for p in pols) + " |")
    lines.append("| GPU-hours over the scenarios, seeds " + " / ".join(map(str, seeds)) + " | "
                 + " | ".join(" / ".join(f"{table[p]['gpu_hours'].get(s, 0):.1f}" for s in seeds) for p in pols)
                 + " |")
    if "gpupool" in table and "gpupool-whole" in table:
        diff = [table["gpupool-whole"]["gpu_hours"].get(s, 0) - table["gpupool"]["gpu_hours"].get(s, 0) for s in seeds]
        lines += ["", "Right-sizing (gpupool vs gpupool-whole, the same recommender on whole GPUs only) saved "
                  + " / ".join(f"{d:+.1f}" for d in diff) + " GPU-h (seeds " + " / ".join(map(str, seeds))
                  + "; negative: it cost) and met the SLO in "
                  + " / ".join(str(table["gpupool"]["meets"].get(s, 0)) for s in seeds) + " vs "
                  + " / ".join(str(table["gpupool-whole"]["meets"].get(s, 0)) for s in seeds) + " scenarios."]
    lines += ["", "Per scenario: worst SLO attainment over the seeds / mean GPU-hours (bold: misses the SLO "
              "on some seed).", "", "| scenario | " + " | ".join(pols) + " |", "|---|" + "---:|" * len(pols)]
    for shape in dict.fromkeys(c.shape for c in cells):
        row = []
        for p in pols:
            cs = [c for c in cells if c.shape == shape and c.policy == p]
            if not cs:
                row.append("")
                continue
            worst = min(c.attainment for c in cs)
            txt = f"{worst:.2%} / {sum(c.gpu_hours for c in cs) / len(cs):.2f}"
            row.append(txt if all(c.meets_slo for c in cs) else f"**{txt}**")
        lines.append(f"| {shape} | " + " | ".join(row) + " |")
    return lines
