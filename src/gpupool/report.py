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
from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
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
         thousands: bool = False, unit: bool = True) -> str:
    """``mean`` (± ``std`` over several seeds) as table text; ``pct``: a fraction shown in percent, with the
    ``%`` sign unless ``unit`` is False (the header names the unit)."""
    if mean is None or not math.isfinite(mean):
        return "—"
    scale = 100.0 if pct else 1.0
    sign = "%" if pct and unit else ""
    if thousands:
        text = f"{mean * scale:,.0f}"
    else:
        text = f"{mean * scale:.{digits}f}"
    if n_seeds > 1 and std is not None and math.isfinite(std):
        spread = f"{std * scale:,.0f}" if thousands else f"{std * scale:.{digits}f}"
        return f"{text} ± {spread}{sign}"
    return text + sign


@dataclass
class _Col:
    """One column of a :class:`FitTable`: ``header`` (units in it, not in the cells), ``cells`` (one text
    per row), ``bold`` (rows highlighted as best), ``priority`` (0 is never dropped; the highest number
    goes first when the table does not fit, the rightmost first among equals), ``name`` for the note."""

    header: str
    cells: list[str]
    priority: int
    bold: list[bool] = field(default_factory=list)
    name: str = ""
    left: bool = False


class FitTable:
    """A rich renderable table that fits the width it is rendered at.

    Numbers are never wrapped or cut (no ``47.…``): when all columns do not fit, the least important ones
    are left out, and a note line under the table names them and says that ``--wide`` or ``--json`` shows
    them. ``wide=True`` keeps every column (cells then wrap at spaces where the width is too small, but
    are not cut). Build a table for a given width with :meth:`build`.
    """

    def __init__(self, title: str, columns: Sequence[_Col], n_rows: int, wide: bool = False,
                 styles: Sequence[dict[str, str]] = ()) -> None:
        self.title = title
        self.columns = list(columns)
        self.n_rows = n_rows
        self.wide = wide
        self.styles = list(styles)

    def _table(self, cols: Sequence[_Col], wrap: bool) -> Table:
        table = Table(title=self.title or None, title_justify="left")
        for c in cols:
            if c.priority == 0:
                table.add_column(c.header, style="bold", no_wrap=True)
            elif c.left:
                table.add_column(c.header, overflow="fold")
            else:
                table.add_column(c.header, justify="right", no_wrap=not wrap, overflow="fold")
        for i in range(self.n_rows):
            cells: list[Any] = []
            for c in cols:
                style = "bold green" if c.bold and c.bold[i] else ""
                if self.styles and i < len(self.styles):
                    style = self.styles[i].get(c.name, style)
                cells.append(Text(c.cells[i], style=style) if c.priority else c.cells[i])
            table.add_row(*cells)
        return table

    @staticmethod
    def _width(console: Console, table: Table) -> int:
        return Measurement.get(console, console.options.update_width(100_000), table).maximum

    def build(self, width: int | None, console: Console | None = None) -> tuple[Table, list[str]]:
        """The table for ``width`` columns (None: every column) and the names of the columns left out."""
        if width is None or self.wide:
            return self._table(self.columns, wrap=True), []
        console = console or Console(width=width)
        kept = list(self.columns)
        dropped: list[_Col] = []
        while True:
            table = self._table(kept, wrap=False)
            if self._width(console, table) <= width:
                return table, [c.name for c in sorted(dropped, key=self.columns.index)]
            candidates = [c for c in kept if c.priority > 1]
            if not candidates:
                # even the essential columns do not fit: wrap cells at spaces (never cut them)
                return self._table(kept, wrap=True), [c.name for c in sorted(dropped, key=self.columns.index)]
            worst = max(candidates, key=lambda c: (c.priority, kept.index(c)))
            kept.remove(worst)
            dropped.append(worst)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = options.max_width
        table, dropped = self.build(width, console)
        yield table
        if dropped:
            yield Text(f"{len(dropped)} column{'s' if len(dropped) > 1 else ''} left out to fit {width} columns: "
                       f"{', '.join(dropped)}; --wide or --json shows {'them' if len(dropped) > 1 else 'it'}",
                       style="dim")

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        table, _ = self.build(options.max_width, console)
        return Measurement.get(console, options, table)


def _best_flags(summary: Sequence[dict[str, Any]], key: str, better: int, skip: bool = False) -> list[bool]:
    values = [e[key] for e in summary if math.isfinite(e.get(key, NAN))]
    if not better or skip or not values or len(summary) < 2:
        return [False] * len(summary)
    best = max(values) if better > 0 else min(values)
    return [math.isfinite(e.get(key, NAN)) and math.isclose(e[key], best) for e in summary]


def _metric_column(summary: Sequence[dict[str, Any]], header: str, key: str, better: int, priority: int,
                   name: str, scale: float = 1.0, skip_best: bool = False, missing: str | None = None,
                   **fmt: Any) -> _Col:
    cells = []
    for e in summary:
        value = e.get(key, NAN)
        std = e.get(f"{key}_std")
        if missing is not None and not math.isfinite(value):
            cells.append(missing)
            continue
        cells.append(_fmt(value * scale, std * scale if std is not None else std, e["n_seeds"], unit=False, **fmt))
    return _Col(header, cells, priority, _best_flags(summary, key, better, skip_best), name)


def policies_table(rows: Sequence[dict[str, str]], wide: bool = False) -> Table:
    """The ``gpupool policies`` table: name, kind, description (descriptions wrap at word boundaries;
    ``wide`` is accepted for symmetry with the other tables, nothing is left out here)."""
    table = Table(title="Placement policies", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("description", overflow="fold")
    styles = {"default": "bold green", "baseline": "yellow", "GPU-aware": "cyan"}
    for row in rows:
        table.add_row(row["name"], Text(row["kind"], style=styles.get(row["kind"], "")), row["description"])
    return table


def job_policies_table(rows: Sequence[dict[str, Any]]) -> Table:
    """The job policies of ``gpupool policies``: name, the placement policy their pods go through, and the
    description; the ones ``compare --jobs`` runs without ``--policies`` are marked."""
    table = Table(title="Job policies (simulate / compare --jobs; * compared by default)", title_justify="left")
    table.add_column("policy", style="bold", no_wrap=True)
    table.add_column("placement", no_wrap=True)
    table.add_column("description", overflow="fold")
    for row in rows:
        name = row["name"] + (" *" if row["compared_by_default"] else "")
        table.add_row(name, row["placement"], row["description"])
    return table


def results_table(summary: Sequence[dict[str, Any]], protocol: str, title: str = "", *,
                  wide: bool = False) -> FitTable:
    """One row per policy, side by side; mean (± sample std when several seeds). Best values in bold.

    Inflation columns: GPU allocation when arrived demand reaches 100 % of capacity, final allocation,
    unallocated GPUs, GPUs held but unused (whole GPUs handed to fractional pods; only when some policy
    has them), fragmented GPUs, failed pods, arrived demand at the first failure, load imbalance (CV of
    per-node GPU allocation) and decisions/s. Replay shows the time-weighted mean, the peak and the
    last-arrival GPU allocation, and mean and p95 pending time, instead of the arrival-based columns.
    The table fits the width it is printed at (see :class:`FitTable`); ``wide`` keeps every column.
    """
    cols = [_Col("policy", [e["policy"] for e in summary], 0, name="policy")]

    def add(header: str, key: str, better: int, priority: int, name: str, **kw: Any) -> None:
        cols.append(_metric_column(summary, header, key, better, priority, name, **kw))

    if protocol == "inflation":
        add("alloc @100%\narrived (%)", "gpu_allocation_ratio_at_100", 1, 1, "GPU alloc @100% arrived", pct=True)
        add("final\nalloc (%)", "gpu_allocation_ratio", 1, 3, "final GPU alloc", pct=True)
    else:
        add("mean\nalloc (%)", "mean_gpu_allocation", 1, 1, "mean GPU alloc", pct=True)
        add("peak\nalloc (%)", "peak_gpu_allocation", 1, 4, "peak GPU alloc", pct=True)
        add("alloc @last\narrival (%)", "gpu_allocation_ratio", 1, 3, "GPU alloc at last arrival", pct=True)
    add("unalloc.\nGPUs", "unallocated_gpus", -1, 2, "unallocated GPUs")
    if any(e.get("idle_reserved_gpus", NAN) > 0.05 for e in summary):
        add("held,\nunused", "idle_reserved_gpus", -1, 4, "GPUs held but unused")
    add("frag.\nGPUs", "fragmented_gpus", -1, 5, "fragmented GPUs")
    add("failed\npods", "failed_pods", -1, 2, "failed pods", digits=0)
    if protocol == "inflation":
        # a policy without any failure beats every first failure; highlight only if all failed
        add("1st fail\n(% arr.)", "first_failure_arrived", 1, 3, "first failure (% arrived)", pct=True,
            skip_best=any(not math.isfinite(e["first_failure_arrived"]) for e in summary), missing="none")
    else:
        add("mean\npend (s)", "mean_pending_s", -1, 3, "mean pending (s)")
        add("p95\npend (s)", "p95_pending_s", -1, 5, "p95 pending (s)")
    add("imbal.\n(CV)", "load_imbalance", -1, 6, "load imbalance (CV)", digits=3)
    add("dec/s", "decisions_per_second", 0, 7, "decisions/s", thousands=True)
    return FitTable(title, cols, len(summary), wide=wide)


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
# Plots (matplotlib, Agg canvas; no pyplot global state). Each ``plot_*`` writes the figure its
# ``*_figure`` builder returns; titles name the trace (file stem), the seeds, the ratio and the protocol
# when given; legends sit outside the data.

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#f0027f", "#08306b", "#e6ab02", "#67001f", "#66c2a5", "#6a3d9a", "#a6cee3", "#b2df8a", "#fdbf6f",
)
"""20 distinct colours: tab10, then ten that differ from every tab10 colour (black, magenta, navy, gold...)."""

OTHER_COLOR = "#d9d9d9"


def _figure(width: float = 8.0, height: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _line_style(i: int) -> dict[str, Any]:
    """A distinct colour for each of the first 20 lines (:data:`PALETTE`; the second ten also dashed), then
    the colours again dotted and dash-dotted: every pair of the first 60 lines differs."""
    return {"color": PALETTE[i % len(PALETTE)], "linestyle": ("-", "--", ":")[(i // 10) % 3] if i < 30
            else ("-.", ":", "--")[(i // 20) % 3]}


def _seeds_text(seeds: Iterable[int]) -> str:
    seeds = sorted(set(int(s) for s in seeds))
    if not seeds:
        return ""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if len(seeds) > 5 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def plot_context(trace: str | Path | None = None, seeds: Iterable[int] = (), ratio: float | None = None,
                 protocol: str | None = None) -> str:
    """The second title line of a plot: ``trace <stem> · seed(s) ... · ratio r · <protocol> protocol``
    (parts that are not known are left out)."""
    parts = []
    if trace:
        parts.append(f"trace {Path(str(trace)).stem}")
    seeds_text = _seeds_text(seeds)
    if seeds_text:
        parts.append(seeds_text)
    if ratio is not None and math.isfinite(ratio):
        parts.append(f"ratio {ratio:g}")
    if protocol:
        parts.append(f"{protocol} protocol")
    return " · ".join(parts)


def _title(fig: Any, main: str, context: str) -> None:
    fig.suptitle(f"{main}\n{context}" if context else main, fontsize=11)


def _legend_outside(fig: Any, handles: Sequence[Any], labels: Sequence[str], title: str | None = None,
                    below: bool = False) -> None:
    """One figure legend outside every axes: at the right, or ``below`` the axes in columns."""
    if not handles:
        return
    if below:
        fig.legend(handles, labels, loc="outside lower center", fontsize=8, title=title, title_fontsize=8,
                   ncol=min(3, len(handles)))
    else:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, title=title, title_fontsize=8,
                   ncol=2 if len(handles) > 24 else 1)


def _first_seed_runs(runs: Sequence[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for run in runs:
        seen.setdefault(run.policy, run)
    return list(seen.values())


def _run_seeds(runs: Sequence[Any]) -> list[int]:
    return [int(r.record["seed"]) for r in runs if r.record.get("seed") is not None]


def allocation_vs_arrived_figure(runs: Sequence[Run], *, trace: str | Path | None = None,
                                 ratio: float | None = None) -> Any:
    """The figure of :func:`plot_allocation_vs_arrived`: the whole curve on the left, a zoom near 100 %
    arrived on the right (where the best policies part), one legend outside both."""
    fig = _figure(12.0, 5.2)
    ax, zoom = fig.subplots(1, 2, width_ratios=[3, 2])
    xmax = 100.0
    near: list[float] = []
    for i, run in enumerate(_first_seed_runs(runs)):
        if len(run.curve_x) == 0:
            continue
        x, y = 100 * run.curve_x, 100 * run.curve_y
        for a in (ax, zoom):
            a.plot(x, y, label=f"{run.policy} (seed {run.seed})", linewidth=1.4, **_line_style(i))
        xmax = max(xmax, float(x.max()))
    lo_x, hi_x = 90.0, min(xmax, 110.0) if xmax > 100 else 100.0
    for run in _first_seed_runs(runs):
        x, y = 100 * run.curve_x, 100 * run.curve_y
        sel = (x >= lo_x) & (x <= hi_x)
        near.extend(y[sel].tolist())
    for a in (ax, zoom):
        a.plot([0, 100, xmax], [0, 100, 100], linestyle="--", color="grey", linewidth=1, label="ideal")
        a.grid(alpha=0.3)
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, 105)
    ax.axvspan(lo_x, hi_x, color="grey", alpha=0.08)
    ax.set_xlabel("arrived GPU demand (% of cluster GPU capacity)")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.set_title("whole run", fontsize=9)
    zoom.set_xlim(lo_x, hi_x)
    if near:
        ylo, yhi = min(near), max(near)
        pad = max(0.5, 0.1 * (yhi - ylo))
        zoom.set_ylim(max(0.0, ylo - pad), min(101.0, yhi + pad))
    zoom.axvline(100, color="grey", linewidth=0.8)
    zoom.set_xlabel("arrived GPU demand (%)")
    zoom.set_title(f"zoom: {lo_x:.0f}–{hi_x:.0f}% arrived", fontsize=9)
    _title(fig, "GPU allocation vs arrived demand", plot_context(trace, _run_seeds(runs), ratio, "inflation"))
    handles, labels = ax.get_legend_handles_labels()
    _legend_outside(fig, handles, labels)
    return fig


def plot_allocation_vs_arrived(runs: Sequence[Run], path: Path, *, trace: str | Path | None = None,
                               ratio: float | None = None) -> Path:
    """GPU allocation (%) against arrived GPU demand (% of capacity), one line per policy (each
    policy's first seed), with the ideal y = x dashed up to 100 % and a zoom near 100 % arrived."""
    allocation_vs_arrived_figure(runs, trace=trace, ratio=ratio).savefig(path)
    return path


def allocation_over_time_figure(runs: Sequence[Run], *, trace: str | Path | None = None) -> Any:
    """The figure of :func:`plot_allocation_over_time`."""
    fig = _figure(10.0, 5.0)
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
    ax.grid(alpha=0.3)
    _title(fig, "GPU allocation over time", plot_context(trace, _run_seeds(runs), None, "replay"))
    _legend_outside(fig, *ax.get_legend_handles_labels())
    return fig


def plot_allocation_over_time(runs: Sequence[Run], path: Path, *, trace: str | Path | None = None) -> Path:
    """GPU allocation (%) over trace time, one line per policy (each policy's first seed); the y axis
    stops a little above the highest allocation reached (at most 105 %)."""
    allocation_over_time_figure(runs, trace=trace).savefig(path)
    return path


def unallocated_figure(summary: Sequence[dict[str, Any]], *, trace: str | Path | None = None,
                       ratio: float | None = None, protocol: str | None = None) -> Any:
    """The figure of :func:`plot_unallocated`."""
    fig = _figure(max(7.0, 0.7 * len(summary) + 3), 5.0)
    ax = fig.add_subplot()
    names = [e["policy"] for e in summary]
    x = np.arange(len(names))

    def col(key: str) -> np.ndarray:
        return np.nan_to_num(np.array([e.get(key, NAN) for e in summary], dtype=float))

    unalloc, frag, idle = col("unallocated_gpus"), col("fragmented_gpus"), col("idle_reserved_gpus")
    frag = np.minimum(frag, unalloc)
    err = np.array([e.get("unallocated_gpus_std", 0.0) if e["n_seeds"] > 1 else 0.0 for e in summary], dtype=float)
    err = np.nan_to_num(err)
    has_idle = bool((idle > 0.05).any())
    width = 0.4 if has_idle else 0.7
    left = x - width / 2 if has_idle else x
    ax.bar(left, frag, width=width, color="#de2d26", label="unallocated: free, fragmented")
    bars = ax.bar(left, unalloc - frag, bottom=frag, width=width, color="#9ecae1", label="unallocated: free, usable",
                  yerr=err if err.any() else None, capsize=3)
    # the number on each bar is the table's "unalloc. GPUs"
    ax.bar_label(bars, labels=[_fmt(v, NAN, 1) for v in unalloc], fontsize=7, padding=2)
    if has_idle:
        held = ax.bar(x + width / 2, idle, width=width, color="#fd8d3c", hatch="//",
                      label="held but unused (whole GPU for a fraction; not unallocated)")
        ax.bar_label(held, labels=[_fmt(v, NAN, 1) if v > 0.05 else "" for v in idle], fontsize=7, padding=2)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("GPUs")
    ax.grid(axis="y", alpha=0.3)
    _title(fig, "GPUs not used by any pod at the end of the run (lower is better)",
           plot_context(trace, [s for e in summary for s in e.get("seeds", [])], ratio, protocol))
    _legend_outside(fig, *ax.get_legend_handles_labels(), below=True)
    return fig


def plot_unallocated(summary: Sequence[dict[str, Any]], path: Path, *, trace: str | Path | None = None,
                     ratio: float | None = None, protocol: str | None = None) -> Path:
    """Bars per policy (means over seeds) of the GPU capacity no pod uses at the end of the run.

    The stacked bar is the table's unallocated GPUs (its number is written on top): fragmented free GPUs
    (free share the typical pods cannot use) and other free GPUs, with the std over seeds as an error bar.
    GPUs held but unused (whole GPUs handed to fractional pods, ``k8s-default``) are not free, so they are
    a separate bar beside it (the table's "held, unused" column), not stacked on it."""
    unallocated_figure(summary, trace=trace, ratio=ratio, protocol=protocol).savefig(path)
    return path


# --------------------------------------------------------------------------------------------------
# Job-level runs (``gpupool simulate/compare --jobs``): records, summary, table, plots

JOB_METRIC_KEYS = (
    "mean_jct_s",
    "p95_jct_s",
    "p99_jct_s",
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
    "failure_events",
    "job_failures",
    "restarts",
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
    jct = np.asarray(res.jct, dtype=float)
    record = {"policy": res.policy, "seed": int(res.seed), "n_jobs": int(res.n_jobs), **res.metrics,
              "p99_jct_s": float(np.percentile(jct, 99)) if len(jct) else NAN,  # the tail (linear interpolation)
              "queues": res.queues, "unfinished": res.unfinished}
    return JobRun(record, jct, np.asarray(res.share_times, dtype=float),
                  np.asarray(res.share_alloc, dtype=float), np.asarray(res.share_fair, dtype=float),
                  tuple(res.queue_names))


def summarize_jobs(runs: Sequence[JobRun]) -> list[dict[str, Any]]:
    """Per-policy means (and sample std, ``<key>_std``) over seeds of :data:`JOB_METRIC_KEYS`."""
    by_policy: dict[str, list[JobRun]] = {}
    for run in runs:
        by_policy.setdefault(run.policy, []).append(run)
    out = []
    for policy, group in by_policy.items():
        entry: dict[str, Any] = {"policy": policy, "seeds": [r.record["seed"] for r in group], "n_seeds": len(group),
                                 "n_queues": max(len(r.record.get("queues") or {"": 0}) for r in group)}
        for key in JOB_METRIC_KEYS:
            mean, std = _stats([r.record.get(key) for r in group])
            entry[key] = mean
            entry[f"{key}_std"] = std
        out.append(entry)
    return out


def _failures_injected(summary: Sequence[dict[str, Any]]) -> bool:
    """Whether any run had node/GPU failures (restarts and lost GPU-hours alone come from preemptions too,
    which every preemptive policy has: they are in the JSON)."""
    keys = ("failure_events", "job_failures")
    return any(math.isfinite(e.get(k, NAN)) and e.get(k, NAN) > 0 for e in summary for k in keys)


def jobs_table(summary: Sequence[dict[str, Any]], title: str = "", *, wide: bool = False) -> FitTable:
    """One row per job-level policy: JCT, queueing delay, makespan, utilization, fairness, quota deficit
    and shortfall (when a run had more than one queue: with one, they would measure idle capacity),
    preemptions, deadlocks, energy, events/s; with failure injection (any run had node/GPU failures) also the
    failures, the jobs they killed, the restarts and the GPU-hours lost. Mean (± std over seeds); best values
    in bold green. Fits the width it is printed at (:class:`FitTable`)."""
    cols = [_Col("policy", [e["policy"] for e in summary], 0, name="policy")]

    def add(header: str, key: str, better: int, priority: int, name: str, **kw: Any) -> None:
        cols.append(_metric_column(summary, header, key, better, priority, name, **kw))

    add("mean\nJCT (h)", "mean_jct_s", -1, 1, "mean JCT (h)", scale=1 / 3600)
    add("p95\nJCT (h)", "p95_jct_s", -1, 4, "p95 JCT (h)", scale=1 / 3600)
    add("p99\nJCT (h)", "p99_jct_s", -1, 6, "p99 JCT (h)", scale=1 / 3600)
    add("mean\nwait (h)", "mean_queueing_delay_s", -1, 2, "mean queueing delay (h)", scale=1 / 3600, digits=2)
    add("makespan\n(d)", "makespan_s", -1, 3, "makespan (days)", scale=1 / 86400)
    add("GPU\nutil (%)", "gpu_utilization", 1, 1, "GPU utilization", pct=True)
    add("Jain", "jain_fairness", 1, 3, "Jain fairness", digits=3)
    if any(e.get("n_queues", 2) > 1 for e in summary):  # one queue: a "shortfall" is idle capacity, no quota's
        add("quota\ndeficit (%)", "worst_quota_deficit", -1, 4, "worst quota deficit", pct=True)
        add("longest\nshortf. (h)", "longest_quota_shortfall_s", -1, 6, "longest quota shortfall (h)",
            scale=1 / 3600)
    add("pre-\nempt.", "preemptions", 0, 5, "preemptions", digits=0, thousands=True)
    add("dead-\nlocks", "deadlocks", -1, 6, "deadlocks", digits=0)
    add("energy\n(MWh)", "energy_kwh", -1, 5, "energy (MWh)", scale=1 / 1000)
    if _failures_injected(summary):
        add("node/GPU\nfailures", "failure_events", 0, 4, "node/GPU failures", digits=0, thousands=True)
        add("jobs\nkilled", "job_failures", -1, 3, "jobs killed by failures", digits=0, thousands=True)
        add("re-\nstarts", "restarts", -1, 5, "restarts", digits=0, thousands=True)
        add("lost\nGPU-h", "lost_gpu_hours", -1, 2, "lost GPU-hours", digits=0, thousands=True)
    add("events/s", "events_per_second", 0, 7, "events/s", digits=0, thousands=True)
    return FitTable(title, cols, len(summary), wide=wide)


def jobs_json_document(jobs: str, cluster: str, queues: str | None, runs: Sequence[JobRun],
                       summary: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``--json`` document of a job-level run: inputs, one record per policy and seed, summary."""
    return jsonable({"protocol": "jobs", "jobs": jobs, "cluster": cluster, "queues": queues,
                     "results": [r.record for r in runs], "summary": list(summary)})


def jct_cdf_figure(runs: Sequence[JobRun], *, trace: str | Path | None = None) -> Any:
    """The figure of :func:`plot_jct_cdf`."""
    fig = _figure(10.0, 5.0)
    ax = fig.add_subplot()
    for i, run in enumerate(_first_seed_runs(runs)):
        jct = np.sort(run.jct[np.isfinite(run.jct)]) / 3600.0
        if len(jct) == 0:
            continue
        y = np.arange(1, len(jct) + 1) / len(jct)
        jct = np.maximum(jct, 1e-3)
        ax.plot(jct, y, label=f"{run.policy} (mean {jct.mean():.1f} h)", linewidth=1.4, **_line_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3, which="both")
    _title(fig, "JCT distribution", plot_context(trace, _run_seeds(runs), None, "jobs"))
    _legend_outside(fig, *ax.get_legend_handles_labels())
    return fig


def plot_jct_cdf(runs: Sequence[JobRun], path: Path, *, trace: str | Path | None = None) -> Path:
    """Empirical CDF of job completion time (log x axis, hours), one line per policy (first seed)."""
    jct_cdf_figure(runs, trace=trace).savefig(path)
    return path


def _queue_colors(names: Sequence[str]) -> dict[str, str]:
    """A colour per queue name (grey is kept for "other")."""
    palette = [c for c in PALETTE if c != "#7f7f7f"]
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def queue_share_figure(runs: Sequence[JobRun], *, trace: str | Path | None = None, max_queues: int = 10) -> Any:
    """The figure of :func:`plot_queue_share`."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    panels = [r for r in _first_seed_runs(runs) if len(r.share_times)]
    fig = _figure(11.0, 2.6 * max(1, len(panels)) + 0.9)
    context = plot_context(trace, _run_seeds(runs), None, "jobs")
    if not panels:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no queue samples", ha="center", va="center")
        _title(fig, "GPUs per queue over time", context)
        return fig
    # one queue order and colour for every panel: the largest queues by GPU-time over all policies
    names = list(panels[0].queue_names)
    total = np.zeros(len(names))
    for run in panels:
        if run.share_alloc.ndim == 2 and run.share_alloc.shape[1] == len(names):
            total += run.share_alloc.sum(axis=0)
    order = [int(k) for k in np.argsort(-total, kind="stable")]
    top, rest = order[:max_queues], order[max_queues:]
    colors = _queue_colors([names[k] for k in top])
    axes = fig.subplots(len(panels), 1, squeeze=False, sharex=True)[:, 0]
    any_fair = any_quota = False
    for ax, run in zip(axes, panels, strict=True):
        t = run.share_times
        unit, div = ("days", 86400.0) if t.max(initial=0) > 2 * 86400 else ("hours", 3600.0)
        alloc = run.share_alloc
        fair = run.share_fair if run.share_fair.shape == alloc.shape else None
        qinfo = run.record.get("queues") or {}
        quota = np.array([float((qinfo.get(n) or {}).get("quota_gpus", NAN)) for n in run.queue_names])
        groups = [[k] for k in top] + ([rest] if rest else [])
        labels = [names[k] for k in top] + (["other"] if rest else [])
        series = [alloc[:, g].sum(axis=1) for g in groups]
        ax.stackplot(t / div, *series, labels=labels, step="post",
                     colors=[colors[n] for n in labels if n != "other"] + ([OTHER_COLOR] if rest else []))
        base = np.zeros(len(t))
        for g, label, s in zip(groups, labels, series, strict=True):
            color = "#555555" if label == "other" else colors[label]
            # reference lines drawn on the band's own base: the band's top edge against its fair share / quota
            if fair is not None:
                ax.step(t / div, base + fair[:, g].sum(axis=1), where="post", color=color, linestyle="--",
                        linewidth=0.9)
                any_fair = True
            q = quota[g]
            if np.isfinite(q).all() and len(q):
                ax.step(t / div, base + q.sum(), where="post", color=color, linestyle=":", linewidth=0.9)
                any_quota = True
            base = base + s
        ax.set_ylabel("GPUs held")
        ax.set_title(f"{run.policy} (seed {run.record.get('seed')})", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel(f"trace time ({unit})")
    handles: list[Any] = [Patch(color=colors[n]) for n in labels if n != "other"]
    if rest:
        handles.append(Patch(color=OTHER_COLOR))
    legend_labels = list(labels)
    if any_fair:
        handles.append(Line2D([], [], color="black", linestyle="--", linewidth=0.9))
        legend_labels.append("fair share (dashed, on the band's base)")
    if any_quota:
        handles.append(Line2D([], [], color="black", linestyle=":", linewidth=0.9))
        legend_labels.append("quota (dotted, on the band's base)")
    _legend_outside(fig, handles, legend_labels, title="queue")
    _title(fig, "GPUs per queue over time", context)
    return fig


def plot_queue_share(runs: Sequence[JobRun], path: Path, max_queues: int = 10, *,
                     trace: str | Path | None = None) -> Path:
    """GPUs held per queue over time (stacked), one panel per policy (first seed); the largest
    ``max_queues`` queues by GPU-time over all policies, the rest summed as "other" (grey). Each band has
    its fair share (dashed) and quota (dotted) drawn on the band's own base, so that the band's top edge
    above or below the line is the queue above or below its share; one legend outside the panels."""
    queue_share_figure(runs, trace=trace, max_queues=max_queues).savefig(path)
    return path
