"""Job-trace runs: records, summaries, the table, JSON and plots (JCT CDF, queue share).
Imports the other modules of :mod:`gpupool.report`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.provenance import run_meta
from gpupool.report.plots import (
    OTHER_COLOR,
    PALETTE,
    figure_title,
    first_seed_runs,
    legend_outside,
    line_style,
    new_figure,
    plot_context,
    run_seeds,
)
from gpupool.report.records import NAN, jsonable
from gpupool.report.summary import stats
from gpupool.report.tables import Col, FitTable, metric_column

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
            mean, std = stats([r.record.get(key) for r in group])
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
    cols = [Col("policy", [e["policy"] for e in summary], 0, name="policy")]

    def add(header: str, key: str, better: int, priority: int, name: str, **kw: Any) -> None:
        cols.append(metric_column(summary, header, key, better, priority, name, **kw))

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
    return jsonable({"meta": run_meta(), "protocol": "jobs", "jobs": jobs, "cluster": cluster, "queues": queues,
                     "results": [r.record for r in runs], "summary": list(summary)})


def jct_cdf_figure(runs: Sequence[JobRun], *, trace: str | Path | None = None) -> Any:
    """The figure of :func:`plot_jct_cdf`."""
    fig = new_figure(10.0, 5.0)
    ax = fig.add_subplot()
    for i, run in enumerate(first_seed_runs(runs)):
        jct = np.sort(run.jct[np.isfinite(run.jct)]) / 3600.0
        if len(jct) == 0:
            continue
        y = np.arange(1, len(jct) + 1) / len(jct)
        jct = np.maximum(jct, 1e-3)
        ax.plot(jct, y, label=f"{run.policy} (mean {jct.mean():.1f} h)", linewidth=1.4, **line_style(i))
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.grid(alpha=0.3, which="both")
    figure_title(fig, "JCT distribution", plot_context(trace, run_seeds(runs), None, "jobs"))
    legend_outside(fig, *ax.get_legend_handles_labels())
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

    panels = [r for r in first_seed_runs(runs) if len(r.share_times)]
    fig = new_figure(11.0, 2.6 * max(1, len(panels)) + 0.9)
    context = plot_context(trace, run_seeds(runs), None, "jobs")
    if not panels:
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "no queue samples", ha="center", va="center")
        figure_title(fig, "GPUs per queue over time", context)
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
    legend_outside(fig, handles, legend_labels, title="queue")
    figure_title(fig, "GPUs per queue over time", context)
    return fig


def plot_queue_share(runs: Sequence[JobRun], path: Path, max_queues: int = 10, *,
                     trace: str | Path | None = None) -> Path:
    """GPUs held per queue over time (stacked), one panel per policy (first seed); the largest
    ``max_queues`` queues by GPU-time over all policies, the rest summed as "other" (grey). Each band has
    its fair share (dashed) and quota (dotted) drawn on the band's own base, so that the band's top edge
    above or below the line is the queue above or below its share; one legend outside the panels."""
    queue_share_figure(runs, trace=trace, max_queues=max_queues).savefig(path)
    return path
