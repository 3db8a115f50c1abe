"""Tables that fit the terminal (issue 13, points 3 and 7): no number cut at 80/100/120 columns, a note
naming the columns left out, ``wide=True`` keeps them all, failure figures when failures were injected."""

from __future__ import annotations

import io
import re

import pytest
from rich.console import Console

from gpupool import report
from gpupool.report import JOB_METRIC_KEYS, METRIC_KEYS

POLICIES = ["gpupool", "k8s-default", "best-fit", "worst-fit", "first-fit", "random", "fgd", "dot-product",
            "gpu-packing", "topology-aware", "lowest-power", "round-robin"]
WIDTHS = (80, 100, 120)
# a cut cell or header: an ellipsis anywhere in the rendered table
CUT = re.compile(r"…")


def _inflation_entry(i: int, n_seeds: int) -> dict:
    e = {"policy": POLICIES[i], "seeds": list(range(n_seeds)), "n_seeds": n_seeds}
    values = {
        "gpu_allocation_ratio": 0.9123 - i / 100, "gpu_allocation_ratio_at_100": 0.4712 + i / 100,
        "reserved_gpu_ratio": 0.95, "unallocated_gpus": 1234.56 + i, "fragmented_gpus": 222.2 * i,
        "idle_reserved_gpus": 456.7 if POLICIES[i] == "k8s-default" else 0.0, "failed_pods": 22213.0 + i,
        "first_failure_arrived": 0.8765, "load_imbalance": 0.123456, "decisions_per_second": 123456.7,
        "mean_gpu_allocation": 0.6543, "peak_gpu_allocation": 0.9876, "mean_pending_s": 12345.6,
        "p95_pending_s": 98765.4,
    }
    for key in METRIC_KEYS:
        e[key] = values[key]
        e[f"{key}_std"] = 0.0123 * values[key]
    e["failed_reasons"], e["node_rejections"], e["runs_with_failures"] = [], {}, n_seeds
    return e


def _jobs_entry(i: int, n_seeds: int, failures: bool) -> dict:
    e = {"policy": POLICIES[i], "seeds": list(range(n_seeds)), "n_seeds": n_seeds}
    values = {
        "mean_jct_s": 323.4 * 3600, "p95_jct_s": 2222.2 * 3600, "p99_jct_s": 3333.3 * 3600,
        "mean_queueing_delay_s": 47.12 * 3600,
        "makespan_s": 166.6 * 86400, "gpu_utilization": 0.507 + i / 100, "jain_fairness": 0.8123,
        "jain_fairness_capped": 0.9, "preemptions": 12345.0, "deadlocks": 0.0, "energy_kwh": 215_000.0,
        "events_per_second": 54321.0, "lost_gpu_hours": 4321.0 if failures else 0.0,
        "failure_events": 321.0 if failures else 0.0, "job_failures": 1234.0 if failures else 0.0,
        "restarts": 1200.0 if failures else 0.0, "worst_quota_deficit": 0.2345,
        "longest_quota_shortfall_s": 55.5 * 3600, "unfinished_jobs": 0.0,
    }
    for key in JOB_METRIC_KEYS:
        e[key] = values[key]
        e[f"{key}_std"] = 0.0123 * values[key]
    return e


def render(renderable, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def flat(text: str) -> str:
    """The text with line breaks and runs of spaces as single spaces (the note line wraps)."""
    return " ".join(text.split())


def assert_nothing_cut(text: str) -> None:
    bad = [line for line in text.splitlines() if CUT.search(line)]
    assert not bad, "cut cells:\n" + "\n".join(bad)


def assert_lines_fit(text: str, width: int) -> None:
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("protocol", ["inflation", "replay"])
@pytest.mark.parametrize("n_seeds", [1, 3])
def test_results_table_fits_without_cutting_numbers(width, protocol, n_seeds):
    summary = [_inflation_entry(i, n_seeds) for i in range(12)]
    title = f"{protocol} protocol: 1,213 nodes / 6,212 GPUs (data/openb_node_list_gpu_node.csv), seeds 1, 2, 3"
    table = report.results_table(summary, protocol, title)
    text = render(table, width)
    assert_nothing_cut(text)
    assert_lines_fit(text, width)
    for policy in POLICIES:
        assert policy in text
    # the headline metric is always there, with its numbers in full
    assert ("47.1" in text) if protocol == "inflation" else ("65.4" in text)
    full = render(report.results_table(summary, protocol, title, wide=True), 400)
    _, dropped = table.build(width)
    if dropped:
        assert "left out to fit" in flat(text) and "--wide or --json" in flat(text)
        for name in dropped:
            assert name in flat(text)
    else:
        assert "left out" not in text
    assert "left out" not in full
    assert "dec/s" in full and "imbal." in full


def test_results_table_wide_keeps_every_column_and_narrow_drops_least_important_first():
    summary = [_inflation_entry(i, 3) for i in range(12)]
    table = report.results_table(summary, "inflation")
    full, none = table.build(None)
    assert none == []
    narrow, dropped = table.build(80)
    assert len(narrow.columns) < len(full.columns)
    assert dropped[-1] == "decisions/s" or "decisions/s" in dropped
    assert "GPU alloc @100% arrived" not in dropped
    wide, dropped_wide = report.results_table(summary, "inflation", wide=True).build(80)
    assert dropped_wide == [] and len(wide.columns) == len(full.columns)


def test_results_table_held_unused_column_only_when_some_policy_holds_unused_gpus():
    summary = [_inflation_entry(i, 1) for i in range(3)]
    assert "held," in render(report.results_table(summary, "inflation", wide=True), 300)
    for e in summary:
        e["idle_reserved_gpus"] = 0.0
    assert "held," not in render(report.results_table(summary, "inflation", wide=True), 300)


def test_results_table_keeps_old_signature_and_first_failure_none():
    summary = [_inflation_entry(i, 1) for i in range(2)]
    summary[0]["first_failure_arrived"] = float("nan")
    text = render(report.results_table(summary, "inflation", "title"), 200)
    assert "none" in text and "title" in text


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("failures", [False, True])
@pytest.mark.parametrize("n_seeds", [1, 3])
def test_jobs_table_fits_without_cutting_numbers(width, failures, n_seeds):
    summary = [_jobs_entry(i, n_seeds, failures) for i in range(12)]
    table = report.jobs_table(summary, "job trace philly.csv (117,325 jobs) on philly.yaml")
    text = render(table, width)
    assert_nothing_cut(text)
    assert_lines_fit(text, width)
    _, dropped = table.build(width)
    if dropped:
        assert "left out to fit" in flat(text) and "--wide or --json" in flat(text)
    if failures:
        assert "lost" in text  # the lost GPU-hours survive even at 80 columns
        assert "4,321" in text


def test_jobs_table_failure_columns_only_when_failures_were_injected():
    without = render(report.jobs_table([_jobs_entry(i, 1, False) for i in range(3)], wide=True), 400)
    assert "restarts" not in without.replace("\n", " ") and "lost" not in without and "killed" not in without
    preempted = [{**_jobs_entry(i, 1, False), "restarts": 40.0, "lost_gpu_hours": 12.0} for i in range(3)]
    only_preemptions = render(report.jobs_table(preempted, wide=True), 400)  # restarts after preemptions only
    assert "killed" not in only_preemptions and "lost" not in only_preemptions
    with_ = render(report.jobs_table([_jobs_entry(i, 1, True) for i in range(3)], wide=True), 400)
    for word in ("failures", "killed", "re-", "lost", "GPU-h", "1,234", "1,200", "4,321", "321"):
        assert word in with_


def test_jobs_summary_carries_failure_figures():
    runs = [report.JobRun({"policy": "fifo", "seed": s, "job_failures": 3 + s, "restarts": 2, "failure_events": 5,
                           "lost_gpu_hours": 1.5}) for s in (1, 2)]
    entry = report.summarize_jobs(runs)[0]
    assert entry["job_failures"] == pytest.approx(4.5)
    assert entry["restarts"] == 2 and entry["failure_events"] == 5 and entry["lost_gpu_hours"] == 1.5


def test_policies_table_accepts_wide_and_wraps_descriptions():
    rows = [{"name": p, "kind": "baseline", "description": "a long description " * 8} for p in POLICIES]
    for wide in (False, True):
        text = render(report.policies_table(rows, wide=wide), 80)
        assert_nothing_cut(text)
        assert all(p in text for p in POLICIES)


def test_jobs_table_quota_columns_only_with_more_than_one_queue():
    many = render(report.jobs_table([_jobs_entry(i, 1, False) for i in range(3)], wide=True), 400)
    assert "quota" in many and "shortf." in many
    one = render(report.jobs_table([{**_jobs_entry(i, 1, False), "n_queues": 1} for i in range(3)], wide=True), 400)
    assert "quota" not in one and "shortf." not in one  # one queue: a shortfall would be idle capacity
    runs = [report.JobRun({"policy": "fifo", "seed": 1, "queues": {"default": {}}}),
            report.JobRun({"policy": "gpupool", "seed": 1, "queues": {"a": {}, "b": {}}})]
    assert [e["n_queues"] for e in report.summarize_jobs(runs)] == [1, 2]
