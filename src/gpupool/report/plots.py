"""Matplotlib plots of placement runs: allocation curves and unallocated GPUs.
Imports :mod:`gpupool.report.records` and :mod:`gpupool.report.tables` (fmt_mean) within the report package."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.report.records import NAN, Run
from gpupool.report.tables import fmt_mean

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


def new_figure(width: float = 8.0, height: float = 5.0):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def line_style(i: int) -> dict[str, Any]:
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


def figure_title(fig: Any, main: str, context: str) -> None:
    fig.suptitle(f"{main}\n{context}" if context else main, fontsize=11)


def legend_outside(fig: Any, handles: Sequence[Any], labels: Sequence[str], title: str | None = None,
                   below: bool = False) -> None:
    """One figure legend outside every axes: at the right, or ``below`` the axes in columns."""
    if not handles:
        return
    if below:  # side by side while they fit the figure's width (about 11 characters an inch at size 8)
        width_chars = 11 * fig.get_figwidth()
        ncol = min(3, len(handles))
        while ncol > 1 and sum(sorted((len(str(x)) + 6 for x in labels), reverse=True)[:ncol]) > width_chars:
            ncol -= 1
        fig.legend(handles, labels, loc="outside lower center", fontsize=8, title=title, title_fontsize=8,
                   ncol=ncol)
    else:
        fig.legend(handles, labels, loc="outside right upper", fontsize=8, title=title, title_fontsize=8,
                   ncol=2 if len(handles) > 24 else 1)


def first_seed_runs(runs: Sequence[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for run in runs:
        seen.setdefault(run.policy, run)
    return list(seen.values())


def run_seeds(runs: Sequence[Any]) -> list[int]:
    return [int(r.record["seed"]) for r in runs if r.record.get("seed") is not None]


def allocation_vs_arrived_figure(runs: Sequence[Run], *, trace: str | Path | None = None,
                                 ratio: float | None = None) -> Any:
    """The figure of :func:`plot_allocation_vs_arrived`: the whole curve on the left, a zoom near 100 %
    arrived on the right (where the best policies part), one legend outside both."""
    fig = new_figure(12.0, 5.2)
    ax, zoom = fig.subplots(1, 2, width_ratios=[3, 2])
    xmax = 100.0
    near: list[float] = []
    for i, run in enumerate(first_seed_runs(runs)):
        if len(run.curve_x) == 0:
            continue
        x, y = 100 * run.curve_x, 100 * run.curve_y
        for a in (ax, zoom):
            a.plot(x, y, label=f"{run.policy} (seed {run.seed})", linewidth=1.4, **line_style(i))
        xmax = max(xmax, float(x.max()))
    lo_x, hi_x = 90.0, min(xmax, 110.0) if xmax > 100 else 100.0
    for run in first_seed_runs(runs):
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
    zoom.set_ylabel("GPU allocation (%)")
    from matplotlib.ticker import FormatStrFormatter, MaxNLocator  # matplotlib loads only when a plot is drawn

    zoom.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    zoom.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    zoom.set_title(f"zoom: {lo_x:.0f}–{hi_x:.0f}% arrived", fontsize=9)
    figure_title(fig, "GPU allocation vs arrived demand", plot_context(trace, run_seeds(runs), ratio, "inflation"))
    handles, labels = ax.get_legend_handles_labels()
    legend_outside(fig, handles, labels)
    return fig


def plot_allocation_vs_arrived(runs: Sequence[Run], path: Path, *, trace: str | Path | None = None,
                               ratio: float | None = None) -> Path:
    """GPU allocation (%) against arrived GPU demand (% of capacity), one line per policy (each
    policy's first seed), with the ideal y = x dashed up to 100 % and a zoom near 100 % arrived."""
    allocation_vs_arrived_figure(runs, trace=trace, ratio=ratio).savefig(path)
    return path


def allocation_over_time_figure(runs: Sequence[Run], *, trace: str | Path | None = None) -> Any:
    """The figure of :func:`plot_allocation_over_time`."""
    fig = new_figure(10.0, 5.0)
    ax = fig.add_subplot()
    tmax = max((float(r.curve_x.max()) for r in runs if len(r.curve_x)), default=0.0)
    unit, div = ("days", 86400.0) if tmax > 2 * 86400 else ("hours", 3600.0) if tmax > 2 * 3600 else ("s", 1.0)
    for i, run in enumerate(first_seed_runs(runs)):
        if len(run.curve_x) == 0:
            continue
        ax.plot(run.curve_x / div, 100 * run.curve_y, label=f"{run.policy} (seed {run.seed})", linewidth=1.2,
                drawstyle="steps-post", **line_style(i))  # allocation holds until the next event
    ymax = max((float(100 * r.curve_y.max()) for r in runs if len(r.curve_y)), default=100.0)
    ax.set_ylim(0, min(105.0, max(1.0, 1.15 * ymax)))  # zoom in on lightly loaded replays
    ax.set_xlabel(f"trace time ({unit})")
    ax.set_ylabel("GPU allocation (% of capacity)")
    ax.grid(alpha=0.3)
    figure_title(fig, "GPU allocation over time", plot_context(trace, run_seeds(runs), None, "replay"))
    legend_outside(fig, *ax.get_legend_handles_labels())
    return fig


def plot_allocation_over_time(runs: Sequence[Run], path: Path, *, trace: str | Path | None = None) -> Path:
    """GPU allocation (%) over trace time, one line per policy (each policy's first seed); the y axis
    stops a little above the highest allocation reached (at most 105 %)."""
    allocation_over_time_figure(runs, trace=trace).savefig(path)
    return path


def unallocated_figure(summary: Sequence[dict[str, Any]], *, trace: str | Path | None = None,
                       ratio: float | None = None, protocol: str | None = None) -> Any:
    """The figure of :func:`plot_unallocated`."""
    fig = new_figure(max(7.0, 0.7 * len(summary) + 3), 5.0)
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
    ax.bar_label(bars, labels=[fmt_mean(v, NAN, 1) for v in unalloc], fontsize=7, padding=2)
    if has_idle:
        held = ax.bar(x + width / 2, idle, width=width, color="#fd8d3c", hatch="//",
                      label="held but unused (whole GPU for a fraction; not unallocated)")
        ax.bar_label(held, labels=[fmt_mean(v, NAN, 1) if v > 0.05 else "" for v in idle], fontsize=7, padding=2)
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("GPUs")
    ax.grid(axis="y", alpha=0.3)
    figure_title(fig, "GPUs not used by any pod at the end of the run (lower is better)",
                 plot_context(trace, [s for e in summary for s in e.get("seeds", [])], ratio, protocol))
    legend_outside(fig, *ax.get_legend_handles_labels(), below=True)
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

