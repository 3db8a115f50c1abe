"""Rich tables: the policy lists, the results table, the why-lines and the best-policy line.
Imports :mod:`gpupool.report.records` and :mod:`gpupool.report.summary` within the report package."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, ConsoleOptions, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from gpupool.report.records import NAN
from gpupool.report.summary import score, score_and_label

# --------------------------------------------------------------------------------------------------
# Tables


def fmt_mean(mean: float, std: float, n_seeds: int, *, pct: bool = False, digits: int = 1,
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
class Col:
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

    def __init__(self, title: str, columns: Sequence[Col], n_rows: int, wide: bool = False,
                 styles: Sequence[dict[str, str]] = ()) -> None:
        self.title = title
        self.columns = list(columns)
        self.n_rows = n_rows
        self.wide = wide
        self.styles = list(styles)

    def _table(self, cols: Sequence[Col], wrap: bool) -> Table:
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
        dropped: list[Col] = []
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


def metric_column(summary: Sequence[dict[str, Any]], header: str, key: str, better: int, priority: int,
                  name: str, scale: float = 1.0, skip_best: bool = False, missing: str | None = None,
                  **fmt: Any) -> Col:
    cells = []
    for e in summary:
        value = e.get(key, NAN)
        std = e.get(f"{key}_std")
        if missing is not None and not math.isfinite(value):
            cells.append(missing)
            continue
        cells.append(fmt_mean(value * scale, std * scale if std is not None else std, e["n_seeds"], unit=False, **fmt))
    return Col(header, cells, priority, _best_flags(summary, key, better, skip_best), name)


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
    cols = [Col("policy", [e["policy"] for e in summary], 0, name="policy")]

    def add(header: str, key: str, better: int, priority: int, name: str, **kw: Any) -> None:
        cols.append(metric_column(summary, header, key, better, priority, name, **kw))

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
        what = score_and_label(entry, protocol)[1]
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
    s, what = score_and_label(best, protocol)
    if not math.isfinite(s):
        return ""
    if len(ranked) > 1 and s - score(worst, protocol) < margin:
        return f"no clear winner: every policy is within {100 * margin:.0f} pt of {100 * s:.1f}% {what}"
    return f"best: {best['policy']} ({100 * s:.1f}% {what})"

