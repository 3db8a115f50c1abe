"""Presentation of simulator runs: flat result records, per-policy summaries, rich tables, JSON, plots.

Everything here is pure presentation; nothing runs a simulation. The CLI (:mod:`gpupool.cli`) turns
each :class:`~gpupool.sim.inflation.InflationResult` (or replay result) into a :class:`Run` with
:func:`run_from_inflation` / :func:`run_from_replay`, then uses :func:`summarize`, :func:`results_table`,
:func:`why_lines`, :func:`json_document` and the ``plot_*`` functions.

Ratios are fractions (0..1) in records and JSON, percentages only in tables and plots. A metric that
does not apply, or never happened (no pod failed, demand never reached 100 % of capacity), is NaN in
memory and ``null`` in JSON.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table
from rich.text import Text

NAN = float("nan")

METRIC_KEYS = (
    "gpu_allocation_ratio",
    "gpu_allocation_ratio_at_100",
    "reserved_gpu_ratio",
    "unallocated_gpus",
    "fragmented_gpus",
    "idle_reserved_gpus",
    "failed_pods",
    "first_failure_arrived",
    "load_imbalance",
    "decisions_per_second",
    "mean_gpu_allocation",
    "peak_gpu_allocation",
    "mean_pending_s",
    "p95_pending_s",
)
"""Numeric keys of a result record that :func:`summarize` averages over seeds."""

TOP_REASONS = 5


# --------------------------------------------------------------------------------------------------
# Records


@dataclass
class Run:
    """One policy on one seed: a flat ``record`` (JSON-ready but for NaN) and a plot curve.

    ``curve_x``/``curve_y`` are the allocation curve, downsampled: arrived GPU demand vs GPU allocation
    (fractions of capacity) for ``inflation``, time in seconds vs GPU allocation for ``replay``.
    ``reasons`` counts the failed pods by reason, numbers stripped (see :func:`reason_key`);
    ``rejections`` the nodes each filter rejected, summed over the failed pods (:func:`node_rejections`).
    """

    protocol: str
    record: dict[str, Any]
    curve_x: np.ndarray = field(default_factory=lambda: np.empty(0))
    curve_y: np.ndarray = field(default_factory=lambda: np.empty(0))
    reasons: Counter = field(default_factory=Counter)
    rejections: Counter = field(default_factory=Counter)

    @property
    def policy(self) -> str:
        return self.record["policy"]

    @property
    def seed(self) -> int:
        return self.record["seed"]


_AVAILABLE_PREFIX = re.compile(r"^\s*\d+/\d+ nodes are available:\s*")
_NUMBER = re.compile(r"\b\d+(?:\.\d+)?\b")


def reason_key(reason: str) -> str:
    """An unschedulable message with its numbers stripped, so that messages of one kind group together.

    ``"0/1213 nodes are available: 1209 Insufficient cpu, 4 Insufficient GPU share."`` becomes
    ``"Insufficient cpu, Insufficient GPU share"``. Numbers inside words (GPU model names such as
    ``V100M16``) are kept.
    """
    text = _AVAILABLE_PREFIX.sub("", reason or "")
    text = _NUMBER.sub("", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\s+([,.;:])", r"\1", text)
    text = text.strip(" .")
    return text or "(no reason given)"


def reason_counts(failed: Iterable[dict]) -> Counter:
    """Failed pods counted by :func:`reason_key` of their ``reason``."""
    return Counter(reason_key(str(f.get("reason", ""))) for f in failed)


_PART = re.compile(r"^(\d+) (.+)$")


def node_rejections(failed: Iterable[dict]) -> Counter:
    """Nodes rejected per filter, summed over the failed pods' kube-scheduler style messages.

    ``"0/4 nodes are available: 3 Insufficient cpu, 1 Insufficient GPU share."`` adds 3 to
    ``"Insufficient cpu"`` and 1 to ``"Insufficient GPU share"``. Parts without a count are ignored.
    This tells which resource ran out, where :func:`reason_key` only tells which combination.
    """
    total: Counter = Counter()
    for f in failed:
        text = _AVAILABLE_PREFIX.sub("", str(f.get("reason", ""))).strip().rstrip(".")
        for part in text.split(","):
            m = _PART.match(part.strip())
            if m:
                total[m.group(2).strip()] += int(m.group(1))
    return total


def top_reasons(counts: Counter, n: int = TOP_REASONS) -> list[dict[str, Any]]:
    """The ``n`` most common reasons as ``[{"reason": ..., "count": ...}]``, most common first."""
    return [{"reason": r, "count": c} for r, c in counts.most_common(n)]


def downsample(x: np.ndarray, y: np.ndarray, max_points: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` evenly spaced samples of a curve, keeping the first and the last point."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if len(x) <= max_points:
        return x.copy(), y.copy()
    idx = np.unique(np.linspace(0, len(x) - 1, max_points).round().astype(int))
    return x[idx], y[idx]


def _metric(metrics: Any, name: str) -> float:
    value = getattr(metrics, name, None) if metrics is not None else None
    return NAN if value is None else float(value)


def _common_record(res: Any, protocol: str, capacity_gpus: float | None,
                   extra_failed: Sequence[dict] = ()) -> tuple[dict[str, Any], Counter, Counter]:
    metrics = getattr(res, "metrics", None)
    failed = list(getattr(res, "failed", []) or []) + list(extra_failed)
    counts = reason_counts(failed)
    rejections = node_rejections(failed)
    reserved = _metric(metrics, "reserved_gpu_ratio")
    used = _metric(metrics, "gpu_allocation_ratio")
    idle = (reserved - used) * capacity_gpus if capacity_gpus else NAN
    return {
        "policy": res.policy,
        "seed": int(res.seed),
        "protocol": protocol,
        "n_pods": int(res.n_pods),
        "placed_pods": int(metrics.placed_pods) if metrics is not None else None,
        "gpu_allocation_ratio": _metric(metrics, "gpu_allocation_ratio"),
        "gpu_allocation_ratio_at_100": NAN,
        "reserved_gpu_ratio": _metric(metrics, "reserved_gpu_ratio"),
        "unallocated_gpus": _metric(metrics, "unallocated_gpus"),
        "fragmented_gpus": _metric(metrics, "fragmented_gpus"),
        "idle_reserved_gpus": max(idle, 0.0) if math.isfinite(idle) else NAN,
        "capacity_gpus": float(capacity_gpus) if capacity_gpus else NAN,
        "failed_pods": len(failed),
        "failed_reasons": top_reasons(counts),
        "node_rejections": dict(rejections.most_common()),
        "first_failure_arrived": NAN,
        "first_failure_time_s": NAN,
        "load_imbalance": _metric(metrics, "load_imbalance"),
        "decisions_per_second": float(getattr(res, "decisions_per_second", NAN)),
        "mean_gpu_allocation": NAN,
        "peak_gpu_allocation": NAN,
        "mean_pending_s": NAN,
        "p95_pending_s": NAN,
    }, counts, rejections


def run_from_inflation(res: Any, capacity_gpus: float | None = None, max_points: int = 500) -> Run:
    """A :class:`Run` from an :class:`~gpupool.sim.inflation.InflationResult`.

    ``capacity_gpus`` (the cluster's GPU count) turns the reserved-but-unused share into
    ``idle_reserved_gpus``; without it that key is NaN.
    """
    record, counts, rejections = _common_record(res, "inflation", capacity_gpus)
    if res.metrics is None and len(res.allocation):
        record["gpu_allocation_ratio"] = float(res.allocation[-1])
    record["gpu_allocation_ratio_at_100"] = float(res.allocation_at_100)
    record["first_failure_arrived"] = float(res.first_failure_arrived)
    x, y = downsample(res.arrived, res.allocation, max_points)
    return Run("inflation", record, x, y, counts, rejections)


def run_from_replay(res: Any, capacity_gpus: float | None = None, max_points: int = 500) -> Run:
    """A :class:`Run` from a replay result (``gpupool.sim.replay.ReplayResult``).

    Uses its ``policy, seed, n_pods, failed, metrics, decisions_per_second, mean_pending_s,
    p95_pending_s, times, allocation`` and, when present, ``mean_allocation`` (time-weighted) and
    ``peak_allocation``; ``gpu_allocation_ratio_at_100`` and ``first_failure_arrived`` do not apply
    (NaN). The time of the first failure is kept (``first_failure_time_s``) when the failures carry a
    ``time``. ``capacity_gpus`` as for :func:`run_from_inflation`.
    """
    # pods never placed and still waiting when the trace ends failed too
    pending = list(getattr(res, "still_pending", None) or [])
    record, counts, rejections = _common_record(res, "replay", capacity_gpus, extra_failed=pending)
    record["still_pending_pods"] = len(pending)
    record["mean_pending_s"] = float(getattr(res, "mean_pending_s", NAN))
    record["p95_pending_s"] = float(getattr(res, "p95_pending_s", NAN))
    record["mean_gpu_allocation"] = float(getattr(res, "mean_allocation", NAN))
    record["peak_gpu_allocation"] = float(getattr(res, "peak_allocation", NAN))
    failed = list(res.failed or [])
    if failed and isinstance(failed[0], dict) and failed[0].get("time") is not None:
        record["first_failure_time_s"] = float(failed[0]["time"])
    times = np.asarray(getattr(res, "times", np.empty(0)), dtype=float)
    alloc = np.asarray(getattr(res, "allocation", np.empty(0)), dtype=float)
    n = min(len(times), len(alloc))
    x, y = downsample(times[:n], alloc[:n], max_points)
    return Run("replay", record, x, y, counts, rejections)


# --------------------------------------------------------------------------------------------------
# Summary over seeds


def _stats(values: Sequence[float]) -> tuple[float, float]:
    arr = np.array([NAN if v is None else float(v) for v in values], dtype=float)
    arr = arr[np.isfinite(arr)]
    if len(arr) == 0:
        return NAN, NAN
    std = float(arr.std(ddof=1)) if len(arr) > 1 else 0.0
    return float(arr.mean()), std


def summarize(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Per-policy means over seeds, in the order policies first appear in ``runs``.

    Each entry has ``policy``, ``seeds``, every key of :data:`METRIC_KEYS` (mean over the seeds where it
    is defined, NaN where it is defined for none) with its sample standard deviation as ``<key>_std``
    (0 for one seed), ``failed_reasons`` and ``node_rejections`` summed over the seeds, and
    ``runs_with_failures``.
    """
    by_policy: dict[str, list[Run]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    out = []
    for policy, group in by_policy.items():
        entry: dict[str, Any] = {"policy": policy, "seeds": [r.seed for r in group], "n_seeds": len(group)}
        for key in METRIC_KEYS:
            mean, std = _stats([r.record.get(key) for r in group])
            entry[key] = mean
            entry[f"{key}_std"] = std
        total: Counter = Counter()
        rejected: Counter = Counter()
        for r in group:
            total.update(r.reasons)
            rejected.update(r.rejections)
        entry["failed_reasons"] = top_reasons(total)
        entry["node_rejections"] = dict(rejected.most_common())
        entry["runs_with_failures"] = sum(1 for r in group if r.record["failed_pods"] > 0)
        out.append(entry)
    return out


def score(entry: dict[str, Any], protocol: str) -> float:
    """The number policies are ranked by (higher is better): the allocation at 100 % arrived for
    inflation (the final allocation when demand never reached capacity); the time-weighted mean
    allocation for replay (the allocation at the last arrival when there is none)."""
    return _score(entry, protocol)[0]


def _score(entry: dict[str, Any], protocol: str) -> tuple[float, str]:
    if protocol == "inflation" and math.isfinite(entry["gpu_allocation_ratio_at_100"]):
        return entry["gpu_allocation_ratio_at_100"], "GPU alloc at 100% arrived"
    if protocol == "replay" and math.isfinite(entry.get("mean_gpu_allocation", NAN)):
        return entry["mean_gpu_allocation"], "mean GPU alloc over time"
    value = entry["gpu_allocation_ratio"]
    label = "final GPU alloc" if protocol == "inflation" else "GPU alloc at last arrival"
    return (value if math.isfinite(value) else -math.inf), label


# --------------------------------------------------------------------------------------------------
# JSON


def jsonable(obj: Any) -> Any:
    """``obj`` with NaN/inf floats as ``None``, numpy scalars/arrays as Python values, paths as str."""
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return [jsonable(v) for v in obj.tolist()]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Path):
        return str(obj)
    return obj


def json_document(protocol: str, nodes: str, pods: str, ratio: float | None, runs: Sequence[Run],
                  summary: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document: run parameters, one result per policy and seed, the per-policy summary."""
    return jsonable({
        "protocol": protocol,
        "nodes": nodes,
        "pods": pods,
        "ratio": ratio,
        "seeds": sorted({r.seed for r in runs}),
        "results": [r.record for r in runs],
        "summary": list(summary),
    })


def dumps(doc: Any) -> str:
    """Strict JSON text (NaN is an error here; :func:`jsonable` has already turned it into null)."""
    return json.dumps(jsonable(doc), indent=2, allow_nan=False) + "\n"


# --------------------------------------------------------------------------------------------------
# Tables


def _fmt(mean: float, std: float, n_seeds: int, *, pct: bool = False, digits: int = 1,
         thousands: bool = False) -> str:
    if mean is None or not math.isfinite(mean):
        return "—"
    scale = 100.0 if pct else 1.0
    unit = "%" if pct else ""
    if thousands:
        text = f"{mean * scale:,.0f}"
    else:
        text = f"{mean * scale:.{digits}f}"
    if n_seeds > 1 and std is not None and math.isfinite(std):
        spread = f"{std * scale:,.0f}" if thousands else f"{std * scale:.{digits}f}"
        return f"{text} ± {spread}{unit}"
    return text + unit


def policies_table(rows: Sequence[dict[str, str]]) -> Table:
    """The ``gpupool policies`` table: name, kind, description."""
    table = Table(title="Placement policies", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("description")
    styles = {"default": "bold green", "baseline": "yellow", "GPU-aware": "cyan"}
    for row in rows:
        table.add_row(row["name"], Text(row["kind"], style=styles.get(row["kind"], "")), row["description"])
    return table


def results_table(summary: Sequence[dict[str, Any]], protocol: str, title: str = "") -> Table:
    """One row per policy, side by side; mean (± sample std when several seeds). Best values in bold.

    Inflation columns: GPU allocation when arrived demand reaches 100 % of capacity, final allocation,
    unallocated and fragmented GPUs, failed pods, arrived demand at the first failure, load imbalance
    (CV of per-node GPU allocation) and decisions/s. Replay shows the time-weighted mean, the peak and
    the last-arrival GPU allocation, and mean and p95 pending time, instead of the arrival-based columns.
    """
    table = Table(title=title or None, title_justify="left")
    # (header, key, better, format kwargs); better: +1 higher is better, -1 lower, 0 no highlight
    cols: list[tuple[str, str, int, dict]] = [
        ("policy", "policy", 0, {}),
    ]
    if protocol == "inflation":
        cols += [
            ("GPU alloc\n@100% arrived", "gpu_allocation_ratio_at_100", 1, {"pct": True}),
            ("final\nGPU alloc", "gpu_allocation_ratio", 1, {"pct": True}),
        ]
    else:
        cols += [
            ("mean GPU alloc\n(over time)", "mean_gpu_allocation", 1, {"pct": True}),
            ("peak\nGPU alloc", "peak_gpu_allocation", 1, {"pct": True}),
            ("GPU alloc at\nlast arrival", "gpu_allocation_ratio", 1, {"pct": True}),
        ]
    cols += [
        ("unallocated\nGPUs", "unallocated_gpus", -1, {}),
        ("fragmented\nGPUs", "fragmented_gpus", -1, {}),
        ("failed\npods", "failed_pods", -1, {"digits": 0}),
    ]
    if protocol == "inflation":
        cols.append(("first failure at\n(% arrived)", "first_failure_arrived", 1, {"pct": True}))
    else:
        cols += [
            ("mean\npending (s)", "mean_pending_s", -1, {}),
            ("p95\npending (s)", "p95_pending_s", -1, {}),
        ]
    cols += [
        ("load imbalance\n(CV)", "load_imbalance", -1, {"digits": 3}),
        ("decisions/s", "decisions_per_second", 0, {"thousands": True}),
    ]
    for header, key, _, _ in cols:
        if key == "policy":
            table.add_column(header, style="bold", no_wrap=True)
        else:
            table.add_column(header, justify="right")

    best: dict[str, float] = {}
    for _, key, better, _ in cols:
        if better == 0:
            continue
        values = [e[key] for e in summary if math.isfinite(e[key])]
        if key == "first_failure_arrived":
            # a policy without any failure beats every first failure; highlight only if all failed
            if any(not math.isfinite(e[key]) for e in summary):
                continue
        if values and len(summary) > 1:
            best[key] = max(values) if better > 0 else min(values)

    for entry in summary:
        n = entry["n_seeds"]
        cells: list[Any] = []
        for _, key, _, kwargs in cols:
            if key == "policy":
                cells.append(entry["policy"])
                continue
            text = _fmt(entry[key], entry.get(f"{key}_std"), n, **kwargs)
            if key == "first_failure_arrived" and not math.isfinite(entry[key]):
                text = "none"
            is_best = key in best and math.isfinite(entry[key]) and math.isclose(entry[key], best[key])
            cells.append(Text(text, style="bold green" if is_best else ""))
        table.add_row(*cells)
    return table


def why_lines(summary: Sequence[dict[str, Any]], protocol: str, max_lines: int = 4,
              margin: float = 0.01) -> list[str]:
    """Short explanations for the worst policies (at most ``max_lines``, worst first).

    A policy is explained when its :func:`score` is at least ``margin`` below the best one. Each line
    gives its score, its most common unschedulable reason (numbers stripped), which filters turned the
    nodes down (share of all node rejections of its failed pods), how much GPU it holds
    beyond what its pods asked for (whole GPUs handed to fractional pods), when it first failed and its
    load imbalance.
    """
    if len(summary) < 2:
        return []
    ranked = sorted(summary, key=lambda e: score(e, protocol))
    top = score(ranked[-1], protocol)
    lines = []
    for entry in ranked[: len(ranked) - 1]:
        s = score(entry, protocol)
        if len(lines) >= max_lines or not (s <= top - margin):
            break
        what = _score(entry, protocol)[1]
        parts = [f"{entry['policy']} ({100 * s:.1f}% {what}, {100 * (top - s):.1f} pts below best)"]
        surplus = entry["reserved_gpu_ratio"] - entry["gpu_allocation_ratio"]
        if math.isfinite(surplus) and surplus > 0.005:
            parts.append(
                f"holds {100 * entry['reserved_gpu_ratio']:.1f}% of GPU capacity but its pods use "
                f"{100 * entry['gpu_allocation_ratio']:.1f}% (whole GPUs for fractional pods)"
            )
        if entry["failed_reasons"]:
            first = entry["failed_reasons"][0]
            total = sum(r["count"] for r in entry["failed_reasons"])
            failed = entry["failed_pods"]
            share = first["count"] / (failed * entry["n_seeds"]) if failed else first["count"] / total
            text = f"{failed:.0f} failed pods, {100 * share:.0f}% '{first['reason']}'"
            rejected = entry.get("node_rejections") or {}
            n_rej = sum(rejected.values())
            shares = [f"{100 * c / n_rej:.0f}% {r}" for r, c in rejected.items() if n_rej and c / n_rej >= 0.01]
            if shares:
                text += f" (node rejections: {', '.join(shares[:3])})"
            parts.append(text)
        if protocol == "inflation" and math.isfinite(entry["first_failure_arrived"]):
            parts.append(f"first failure at {100 * entry['first_failure_arrived']:.0f}% arrived")
        if math.isfinite(entry["fragmented_gpus"]):
            parts.append(f"{entry['fragmented_gpus']:.0f} fragmented GPUs")
        if math.isfinite(entry["load_imbalance"]):
            parts.append(f"imbalance CV {entry['load_imbalance']:.3f}")
        lines.append("; ".join(parts))
    return lines


def best_line(summary: Sequence[dict[str, Any]], protocol: str, margin: float = 0.01) -> str:
    """``"best: <policy> (<score>% ...)"``; a "no clear winner" line when all scores are within
    ``margin``; ``""`` for an empty summary."""
    if not summary:
        return ""
    ranked = sorted(summary, key=lambda e: score(e, protocol))
    best, worst = ranked[-1], ranked[0]
    s, what = _score(best, protocol)
    if not math.isfinite(s):
        return ""
    if len(ranked) > 1 and s - score(worst, protocol) < margin:
        return f"no clear winner: every policy is within {100 * margin:.0f} pt of {100 * s:.1f}% {what}"
    return f"best: {best['policy']} ({100 * s:.1f}% {what})"


# --------------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg canvas; no pyplot global state)


def _figure(width: float = 8.0, height: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _line_style(i: int) -> dict[str, Any]:
    """Distinct colour/line-style pairs for up to 30 lines (tab10 colours, then dash-dot, then dotted)."""
    from matplotlib import colormaps

    return {"color": colormaps["tab10"](i % 10), "linestyle": ("-", "-.", ":")[(i // 10) % 3]}


def _first_seed_runs(runs: Sequence[Run]) -> list[Run]:
    seen: dict[str, Run] = {}
    for run in runs:
        seen.setdefault(run.policy, run)
    return list(seen.values())


def plot_allocation_vs_arrived(runs: Sequence[Run], path: Path) -> Path:
    """GPU allocation (%) against arrived GPU demand (% of capacity), one line per policy (each
    policy's first seed), with the ideal y = x dashed up to 100 %."""
    fig = _figure()
    ax = fig.add_subplot()
    xmax = 100.0
    for i, run in enumerate(_first_seed_runs(runs)):
        if len(run.curve_x) == 0:
            continue
        ax.plot(100 * run.curve_x, 100 * run.curve_y, label=f"{run.policy} (seed {run.seed})", linewidth=1.4,
                **_line_style(i))
        xmax = max(xmax, float(100 * run.curve_x.max()))
    ax.plot([0, 100, xmax], [0, 100, 100], linestyle="--", color="grey", linewidth=1, label="ideal")
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 105)
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title("GPU allocation vs arrived demand (inflation)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", ncol=2 if len(runs) > 6 else 1)
    fig.savefig(path)
    return path


def plot_allocation_over_time(runs: Sequence[Run], path: Path) -> Path:
    """GPU allocation (%) over trace time, one line per policy (each policy's first seed); the y axis
    stops a little above the highest allocation reached (at most 105 %)."""
    fig = _figure()
    ax = fig.add_subplot()
    tmax = max((float(r.curve_x.max()) for r in runs if len(r.curve_x)), default=0.0)
    unit, div = ("days", 86400.0) if tmax > 2 * 86400 else ("hours", 3600.0) if tmax > 2 * 3600 else ("s", 1.0)
    for i, run in enumerate(_first_seed_runs(runs)):
        if len(run.curve_x) == 0:
            continue
        ax.plot(run.curve_x / div, 100 * run.curve_y, label=f"{run.policy} (seed {run.seed})", linewidth=1.2,
                drawstyle="steps-post", **_line_style(i))  # allocation holds until the next event
    ymax = max((float(100 * r.curve_y.max()) for r in runs if len(r.curve_y)), default=100.0)
    ax.set_ylim(0, min(105.0, max(1.0, 1.15 * ymax)))  # zoom in on lightly loaded replays
    ax.set_xlabel(f"trace time ({unit})")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title("GPU allocation over time (replay)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", ncol=2 if len(runs) > 6 else 1)
    fig.savefig(path)
    return path


def plot_unallocated(summary: Sequence[dict[str, Any]], path: Path) -> Path:
    """Stacked bars per policy (means over seeds) of the GPU capacity no pod uses at the end of the run:
    fragmented free GPUs (free share the typical pods cannot use), other free GPUs, and GPUs held but
    unused (whole GPUs handed to fractional pods, ``k8s-default``). The std over seeds of the unallocated
    GPUs is drawn as an error bar."""
    fig = _figure(max(6.0, 0.7 * len(summary) + 2), 4.8)
    ax = fig.add_subplot()
    names = [e["policy"] for e in summary]
    x = np.arange(len(names))

    def col(key: str) -> np.ndarray:
        return np.nan_to_num(np.array([e.get(key, NAN) for e in summary], dtype=float))

    unalloc, frag, idle = col("unallocated_gpus"), col("fragmented_gpus"), col("idle_reserved_gpus")
    frag = np.minimum(frag, unalloc)
    err = np.array([e["unallocated_gpus_std"] if e["n_seeds"] > 1 else 0.0 for e in summary], dtype=float)
    err = np.nan_to_num(err)
    ax.bar(x, frag, width=0.7, color="#de2d26", label="free, fragmented")
    ax.bar(x, unalloc - frag, bottom=frag, width=0.7, color="#9ecae1", label="free, usable",
           yerr=err if err.any() else None, capsize=3)
    if idle.any():
        ax.bar(x, idle, bottom=unalloc, width=0.7, color="#fd8d3c", hatch="//",
               label="held but unused (whole GPU for a fraction)")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("GPUs")
    ax.set_title("GPUs not used by any pod at the end of the run (lower is better)")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.savefig(path)
    return path


# --------------------------------------------------------------------------------------------------
# Job-level runs (``gpupool simulate/compare --jobs``): records, summary, table, plots

JOB_METRIC_KEYS = (
    "mean_jct_s",
    "p95_jct_s",
    "mean_queueing_delay_s",
    "makespan_s",
    "gpu_utilization",
    "jain_fairness",
    "jain_fairness_capped",
    "preemptions",
    "deadlocks",
    "energy_kwh",
    "events_per_second",
    "lost_gpu_hours",
    "worst_quota_deficit",
    "longest_quota_shortfall_s",
    "unfinished_jobs",
)
"""Numeric keys of a job-run record that :func:`summarize_jobs` averages over seeds."""


@dataclass
class JobRun:
    """One job-level policy on one seed: a flat JSON-ready ``record`` and the curves to plot.

    ``jct``: (n_finished,) job completion times (s); ``share_times`` (k,) and ``share_alloc`` (k, q): GPUs
    held per leaf queue over time, ``queue_names`` (q,) in that column order.
    """

    record: dict[str, Any]
    jct: np.ndarray = field(default_factory=lambda: np.empty(0))
    share_times: np.ndarray = field(default_factory=lambda: np.empty(0))
    share_alloc: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    share_fair: np.ndarray = field(default_factory=lambda: np.empty((0, 0)))
    queue_names: tuple[str, ...] = ()

    @property
    def policy(self) -> str:
        return self.record["policy"]


def run_from_jobs(res: Any) -> JobRun:
    """A :class:`JobRun` from a :class:`gpupool.sim.jobs.JobSimResult`."""
    record = {"policy": res.policy, "seed": int(res.seed), "n_jobs": int(res.n_jobs), **res.metrics,
              "queues": res.queues, "unfinished": res.unfinished}
    return JobRun(record, np.asarray(res.jct, dtype=float), np.asarray(res.share_times, dtype=float),
                  np.asarray(res.share_alloc, dtype=float), np.asarray(res.share_fair, dtype=float),
                  tuple(res.queue_names))


def summarize_jobs(runs: Sequence[JobRun]) -> list[dict[str, Any]]:
    """Per-policy means (and sample std, ``<key>_std``) over seeds of :data:`JOB_METRIC_KEYS`."""
    by_policy: dict[str, list[JobRun]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    out = []
    for policy, group in by_policy.items():
        entry: dict[str, Any] = {"policy": policy, "seeds": [r.record["seed"] for r in group], "n_seeds": len(group)}
        for key in JOB_METRIC_KEYS:
            mean, std = _stats([r.record.get(key) for r in group])
            entry[key] = mean
            entry[f"{key}_std"] = std
        out.append(entry)
    return out


def jobs_table(summary: Sequence[dict[str, Any]], title: str = "") -> Table:
    """One row per job-level policy: JCT, queueing delay, makespan, utilization, fairness, preemptions,
    deadlocks, energy, events/s; mean (± std over seeds). Best values in bold green."""
    table = Table(title=title or None, title_justify="left")
    cols: list[tuple[str, str, int, dict]] = [
        ("mean JCT\n(h)", "mean_jct_s", -1, {"scale": 1 / 3600}),
        ("p95 JCT\n(h)", "p95_jct_s", -1, {"scale": 1 / 3600}),
        ("mean queueing\ndelay (h)", "mean_queueing_delay_s", -1, {"scale": 1 / 3600, "digits": 2}),
        ("makespan\n(days)", "makespan_s", -1, {"scale": 1 / 86400}),
        ("GPU\nutilization", "gpu_utilization", 1, {"pct": True}),
        ("Jain\nfairness", "jain_fairness", 1, {"digits": 3}),
        ("worst quota\ndeficit", "worst_quota_deficit", -1, {"pct": True}),
        ("longest quota\nshortfall (h)", "longest_quota_shortfall_s", -1, {"scale": 1 / 3600}),
        ("preemptions", "preemptions", 0, {"digits": 0, "thousands": True}),
        ("deadlocks", "deadlocks", -1, {"digits": 0}),
        ("energy\n(MWh)", "energy_kwh", -1, {"scale": 1 / 1000}),
        ("events/s", "events_per_second", 0, {"digits": 0, "thousands": True}),
    ]
    table.add_column("policy", style="bold", no_wrap=True)
    for header, _, _, _ in cols:
        table.add_column(header, justify="right")
    best: dict[str, float] = {}
    for _, key, better, _ in cols:
        values = [e[key] for e in summary if math.isfinite(e[key])]
        if better and values and len(summary) > 1:
            best[key] = max(values) if better > 0 else min(values)
    for entry in summary:
        cells: list[Any] = [entry["policy"]]
        for _, key, _, kw in cols:
            kw = dict(kw)
            scale = kw.pop("scale", 1.0)
            std = entry.get(f"{key}_std")
            text = _fmt(entry[key] * scale, std * scale if std is not None else std, entry["n_seeds"], **kw)
            is_best = key in best and math.isfinite(entry[key]) and math.isclose(entry[key], best[key])
            cells.append(Text(text, style="bold green" if is_best else ""))
        table.add_row(*cells)
    return table


def jobs_json_document(jobs: str, cluster: str, queues: str | None, runs: Sequence[JobRun],
                       summary: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document of a job-level run: inputs, one record per policy and seed, summary."""
    return jsonable({"protocol": "jobs", "jobs": jobs, "cluster": cluster, "queues": queues,
                     "results": [r.record for r in runs], "summary": list(summary)})


def plot_jct_cdf(runs: Sequence[JobRun], path: Path) -> Path:
    """Empirical CDF of job completion time (log x axis, hours), one line per policy (first seed)."""
    fig = _figure()
    ax = fig.add_subplot()
    seen: dict[str, JobRun] = {}
    for run in runs:
        seen.setdefault(run.policy, run)
    for i, run in enumerate(seen.values()):
        jct = np.sort(run.jct[np.isfinite(run.jct)]) / 3600.0
        if len(jct) == 0:
            continue
        y = np.arange(1, len(jct) + 1) / len(jct)
        jct = np.maximum(jct, 1e-3)
        ax.plot(jct, y, label=f"{run.policy} (mean {jct.mean():.1f} h)", linewidth=1.4, **_line_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT distribution")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    fig.savefig(path)
    return path


def plot_queue_share(runs: Sequence[JobRun], path: Path, max_queues: int = 10) -> Path:
    """GPUs held per queue over time (stacked), one panel per policy (first seed); the largest
    ``max_queues`` queues by GPU-time, the rest summed as "other"."""
    seen: dict[str, JobRun] = {}
    for run in runs:
        seen.setdefault(run.policy, run)
    panels = [r for r in seen.values() if len(r.share_times)]
    fig = _figure(9.0, 2.6 * max(1, len(panels)) + 0.6)
    if not panels:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no queue samples", ha="center", va="center")
        fig.savefig(path)
        return path
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    for ax, run in zip(axes, panels, strict=True):
        t = run.share_times
        unit, div = ("days", 86400.0) if t.max(initial=0) > 2 * 86400 else ("hours", 3600.0)
        alloc = run.share_alloc
        order = np.argsort(-alloc.sum(axis=0), kind="stable")
        top = order[:max_queues]
        rest = order[max_queues:]
        series = [alloc[:, k] for k in top]
        labels = [run.queue_names[k] for k in top]
        if len(rest):
            series.append(alloc[:, rest].sum(axis=1))
            labels.append("other")
        ax.stackplot(t / div, *series, labels=labels, step="post")
        ax.set_ylabel("GPUs held")
        ax.set_title(f"{run.policy}: GPUs per queue over time", fontsize=9)
        ax.grid(alpha=0.3)
        ax.set_xlabel(f"trace time ({unit})")
    axes[0].legend(fontsize=7, loc="upper right", ncol=2)
    fig.savefig(path)
    return path
