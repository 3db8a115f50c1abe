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

from gpupool.report.jobs import (
    JOB_METRIC_KEYS,
    JobRun,
    jct_cdf_figure,
    jobs_json_document,
    jobs_table,
    plot_jct_cdf,
    plot_queue_share,
    queue_share_figure,
    run_from_jobs,
    summarize_jobs,
)
from gpupool.report.plots import (
    OTHER_COLOR,
    PALETTE,
    allocation_over_time_figure,
    allocation_vs_arrived_figure,
    line_style,
    plot_allocation_over_time,
    plot_allocation_vs_arrived,
    plot_context,
    plot_unallocated,
    unallocated_figure,
)
from gpupool.report.records import (
    METRIC_KEYS,
    NAN,
    TOP_REASONS,
    Run,
    downsample,
    dumps,
    json_document,
    jsonable,
    node_rejections,
    reason_counts,
    reason_key,
    run_from_inflation,
    run_from_replay,
    top_reasons,
)
from gpupool.report.summary import score, summarize
from gpupool.report.tables import (
    FitTable,
    best_line,
    fmt_mean,
    job_policies_table,
    policies_table,
    results_table,
    why_lines,
)

__all__ = [
    "FitTable", "JOB_METRIC_KEYS", "JobRun", "METRIC_KEYS", "NAN", "OTHER_COLOR", "PALETTE", "Run", "TOP_REASONS",
    "allocation_over_time_figure", "allocation_vs_arrived_figure", "best_line", "downsample", "dumps",
    "jct_cdf_figure", "job_policies_table", "jobs_json_document", "jobs_table", "json_document", "jsonable",
    "node_rejections", "plot_allocation_over_time", "plot_allocation_vs_arrived", "plot_context", "plot_jct_cdf",
    "plot_queue_share", "plot_unallocated", "policies_table", "queue_share_figure", "reason_counts", "reason_key",
    "results_table", "run_from_inflation", "run_from_jobs", "run_from_replay", "score", "summarize",
    "summarize_jobs", "top_reasons", "unallocated_figure", "why_lines",
]

# the old private names, still read by tests/test_report_plots.py
_fmt = fmt_mean
_line_style = line_style
