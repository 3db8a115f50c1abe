"""Runs a scenario's policies on one workload and reports them: summary rows, explanations, table, JSON, plot.

:func:`run_scenario` is what ``gpupool autoscale simulate`` and ``benchmarks/autoscale_reference.py`` call.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.traces.azure_llm import load_azure_llm, load_embedded_azure_llm

from .inference import (
    InferenceConfigError,
    PolicyResult,
    ThroughputTable,
    Workload,
    load_throughput_table,
    percentiles,
    simulate,
    synthetic_arrivals,
    trace_arrivals,
)
from .inference_policies import RecommenderPolicy, RightSizedPolicy, Scenario, StaticPolicy, TokenStats, build_policy

__all__ = ["ScenarioRun", "explain", "plot_run", "results_table", "run_scenario", "summary"]


@dataclass
class ScenarioRun:
    """A scenario's policies run on one workload: ``results`` and ``rows`` in policy order."""

    scenario: Scenario
    workload: Workload
    table: ThroughputTable
    seed: int
    policies: dict[str, Any]
    results: list[PolicyResult]
    rows: list[dict[str, Any]] = field(default_factory=list)
    explanations: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False

    @property
    def title(self) -> str:
        sc = self.scenario
        src = "Azure LLM conv trace" if sc.workload.get("source", "azure-llm") == "azure-llm" else "synthetic Poisson"
        return (f"scenario {sc.name}: {src}, {self.workload.duration_s / 3600:g} h, {len(self.workload):,} requests, "
                f"seed {self.seed}, {self.table.model.name} on {self.table.gpu_model}, SLO e2e <= {sc.slo_s:g} s "
                f"for >= {sc.attainment:.0%}")


def make_workload(sc: Scenario, seed: int, duration_s: float, trace: str | Path | None = None) -> Workload:
    """The scenario's requests: the Azure trace (``trace`` or ``spec.workload.trace``; ``embedded``: the
    shipped one) time-warped onto the envelope, or synthetic Poisson arrivals with the trace's token sizes."""
    path = trace if trace is not None else sc.workload.get("trace", "embedded")
    tr = load_embedded_azure_llm() if str(path) == "embedded" else load_azure_llm(path)
    if sc.workload.get("source", "azure-llm") == "synthetic":
        return synthetic_arrivals(sc.envelope, duration_s, seed, tr.prompt_tokens, tr.output_tokens,
                                  f"synthetic, token sizes from {tr.source}")
    return trace_arrivals(tr.time_s, tr.prompt_tokens, tr.output_tokens, sc.envelope, duration_s, seed, tr.source)


def run_scenario(sc: Scenario, *, policies: Sequence[str] | None = None, seed: int | None = None,
                 hours: float | None = None, trace: str | Path | None = None,
                 throughput: str | Path | None = None,
                 progress: Callable[[int, str, float], None] | None = None) -> ScenarioRun:
    """Run ``policies`` (default: all of the scenario's, in file order) on the scenario's workload.

    ``hours`` shortens the day (the envelope is kept: the first ``hours`` of it; at most the scenario's
    ``durationHours``). ``progress(k, policy, fraction)`` is called as each run advances. Raises
    InferenceConfigError (bad scenario or policy name, ``hours`` out of range), TraceFormatError (bad trace).
    Ctrl-C stops after the finished policies (``interrupted``).
    """
    names = list(policies) if policies else list(sc.policies)
    unknown = [p for p in names if p not in sc.policies]
    if unknown:
        raise InferenceConfigError(f"unknown policy {', '.join(unknown)} (the scenario has: {', '.join(sc.policies)})")
    seed = sc.seed if seed is None else seed
    if seed < 0:
        raise InferenceConfigError(f"--seed must be >= 0, got {seed}")
    duration = sc.duration_s if hours is None else hours * 3600.0
    if not 0 < duration < math.inf:
        raise InferenceConfigError(f"--hours must be a finite number > 0, got {hours}")
    if duration > sc.duration_s + 1e-6:
        raise InferenceConfigError(f"--hours must be <= the scenario's durationHours ({sc.duration_s / 3600:g}), "
                                   f"got {hours:g}")
    table = load_throughput_table(throughput if throughput is not None else sc.throughput, sc.gpu_model)
    wl = make_workload(sc, seed, duration, trace)
    if len(wl) == 0:
        raise InferenceConfigError("the workload has no requests (rates too low for the duration)")
    stats = TokenStats.of(wl.prompt_tokens, wl.output_tokens)
    built = {n: build_policy(n, sc, table, stats) for n in names}
    weights = {name: 1.0 for name in table.slices}
    for p in built.values():
        if isinstance(p, RightSizedPolicy):
            weights.update({k: max(c.rps, 1e-6) for k, c in p.capacities.items()})
    run = ScenarioRun(sc, wl, table, seed, built, [])
    try:
        for k, name in enumerate(names):
            def tick(f: float, k: int = k, name: str = name) -> None:
                if progress is not None:
                    progress(k, name, f)
            tick(0.0)
            run.results.append(simulate(wl, table, built[name], slo_s=sc.slo_s, replica=sc.replica,
                                        lending=sc.lending, pool_gpus=sc.pool_gpus, lag_s=sc.lag_s, seed=seed,
                                        capacity_weight=weights, tick=tick))
    except KeyboardInterrupt:
        run.interrupted = True
    run.rows = [summary(r, sc) for r in run.results]
    static_h = next((row["gpu_hours"] for row in run.rows if isinstance(built[row["policy"]], StaticPolicy)), None)
    for row in run.rows:
        row["vs_static"] = row["gpu_hours"] / static_h if static_h else None
    for r in run.results:
        run.explanations[r.policy] = explain(r, built[r.policy], run)
    return run


def summary(r: PolicyResult, sc: Scenario) -> dict[str, Any]:
    """One policy's numbers (JSON-ready): latency percentiles (s), SLO attainment, GPU-hours, lending."""
    e2e = r.e2e_s
    ok = np.where(np.isnan(e2e), False, e2e <= sc.slo_s)
    t50, t95, t99 = percentiles(r.ttft_s)
    e50, e95, e99 = percentiles(e2e)
    attain = float(ok.mean()) if len(ok) else 0.0
    rec = np.asarray(r.reclaims)
    return {
        "policy": r.policy,
        "requests": r.n_requests,
        "slo_attainment": attain,
        "meets_slo": attain >= sc.attainment,
        "ttft_p50_s": t50, "ttft_p95_s": t95, "ttft_p99_s": t99,
        "e2e_p50_s": e50, "e2e_p95_s": e95, "e2e_p99_s": e99,
        "gpu_hours": r.gpu_hours,
        "replicas_min": r.min_replicas, "replicas_max": r.max_replicas,
        "replica_changes": r.replica_changes, "slice_changes": r.slice_changes,
        "slices_replica_hours": {k: round(v, 3) for k, v in r.slices_used.items()},
        "lent_gpu_hours": r.lent_gpu_hours,
        "reclaims": int(rec.size),
        "reclaim_p50_s": float(np.percentile(rec, 50)) if rec.size else None,
        "reclaim_max_s": float(rec.max()) if rec.size else None,
        "crashes": r.crashes, "retried_requests": r.retried, "unfinished": r.unfinished,
        "max_metrics": {k: round(v, 3) for k, v in r.max_metric.items()},
        "wall_s": round(r.wall_s, 2),
    }


def _worst_hour(r: PolicyResult, slo_s: float) -> str:
    t = np.asarray(r.series["t_s"])
    p99 = np.asarray(r.series["p99_s"], dtype=float)
    if t.size == 0 or np.all(np.isnan(p99)):
        return ""
    k = int(np.nanargmax(p99))
    if p99[k] <= slo_s:
        return ""
    h = t[k] / 3600.0
    return f"; worst at {int(h):02d}:{int(round((h % 1) * 60)) % 60:02d} (window p99 {p99[k]:.0f} s)"


def explain(r: PolicyResult, policy: Any, run: ScenarioRun) -> str:
    """One line in words: why a policy misses the SLO, or what meeting it cost."""
    sc = run.scenario
    row = summary(r, sc)
    slo = sc.slo_s
    lat = (f"p99 {row['e2e_p99_s']:.1f} s {'<=' if row['e2e_p99_s'] <= slo else '>'} SLO {slo:g} s, "
           f"{row['slo_attainment']:.2%} of requests within it")
    if r.unfinished:
        lat += f", {r.unfinished} unfinished"
    parts: list[str] = []
    if isinstance(policy, RecommenderPolicy):
        for m in policy.spec.metrics:
            peak = r.max_metric.get(m.name)
            if peak is None:
                continue
            if m.name in ("gpu_util", "cpu_util", "tensor_active"):
                rel = "<" if peak < m.target else ">="
                parts.append(f"{m.name.replace('_', ' ')} peaked at {peak:.0f}% {rel} target {m.target:g}%")
            else:
                parts.append(f"{m.name} peaked at {peak:.1f} in total (target {m.target:g} per replica)")
        cap = policy.spec.max_replicas
        if r.max_replicas <= 1 and r.max_replicas < cap:
            parts.append(f"never scaled past {r.max_replicas} replica(s) (max {cap})")
        elif r.max_replicas >= cap:
            parts.append(f"reached maxReplicas {cap}")
        else:
            parts.append(f"{r.min_replicas}-{r.max_replicas} replicas")
        if policy.trace.limited:
            top = max(policy.trace.limited, key=lambda k: policy.trace.limited[k])
            parts.append(f"most often limited by {top}")
    elif isinstance(policy, RightSizedPolicy):
        used = sorted(r.slices_used.items(), key=lambda kv: -kv[1])
        parts.append("slices " + ", ".join(f"{k} {v:.1f} replica-h" for k, v in used))
        parts.append(f"{r.min_replicas}-{r.max_replicas} replicas, {r.slice_changes} slice change(s)")
    elif isinstance(policy, StaticPolicy):
        parts.append(policy.describe())
    if row["meets_slo"]:
        cost = f"meets the SLO ({lat}) with {row['gpu_hours']:.1f} GPU-h"
        if r.lent_gpu_hours > 0:
            cost += f", lent {r.lent_gpu_hours:.1f} GPU-h"
            if r.reclaims:
                cost += f" (reclaimed {len(r.reclaims)}x, at most {max(r.reclaims):.0f} s)"
        return f"{r.policy}: {cost}; " + "; ".join(parts)
    why = "; ".join(parts)
    return f"{r.policy}: MISSES the SLO: {why}; {lat}{_worst_hour(r, slo)}"


def verdict(run: ScenarioRun, winner: str = "gpupool", without: str = "gpupool-whole") -> list[str]:
    """Lines on the issue's "done when": does ``winner`` meet the SLO with the fewest GPU-hours among the
    policies that meet it, and how much of that is right-sizing (``without``: the same recommender on
    whole GPUs)."""
    rows = {row["policy"]: row for row in run.rows}
    if winner not in rows:
        return []
    w = rows[winner]
    out = []
    meeting = [row for row in run.rows if row["meets_slo"] and row["policy"] != winner]
    if not w["meets_slo"]:
        return [f"{winner} misses the SLO ({w['slo_attainment']:.2%} < {run.scenario.attainment:.0%})"]
    cheaper = [row["policy"] for row in meeting if row["gpu_hours"] <= w["gpu_hours"]]
    if cheaper:
        out.append(f"{winner} meets the SLO but is not the cheapest: {', '.join(cheaper)} use as few "
                   "GPU-hours or fewer")
    else:
        best = min(meeting, key=lambda row: row["gpu_hours"]) if meeting else None
        line = f"{winner} meets the SLO with the fewest GPU-hours ({w['gpu_hours']:.1f})"
        if best is not None:
            line += f"; next: {best['policy']} {best['gpu_hours']:.1f} GPU-h"
        out.append(line)
    if without in rows:
        wo = rows[without]
        others = [row for row in meeting if row["policy"] != without]
        best_other = min((row["gpu_hours"] for row in others), default=math.inf)
        saved = wo["gpu_hours"] - w["gpu_hours"]
        line = f"right-sizing saves {saved:.1f} GPU-h over the same recommender on whole GPUs ({without})"
        if wo["meets_slo"] and wo["gpu_hours"] >= best_other:
            line += "; without right-sizing gpupool would not beat the other policies: it wins through right-sizing"
        out.append(line)
    return out


def results_table(run: ScenarioRun, *, wide: bool = False) -> Any:
    """A rich Table of the policies (80 columns; ``wide``: every column)."""
    from rich.table import Table

    t = Table(title=run.title if wide else f"{run.scenario.name}: SLO e2e <= {run.scenario.slo_s:g} s, "
              f"seed {run.seed}, {len(run.workload):,} requests", title_justify="left")
    cols = [("policy", "left"), ("SLO", "right"), ("in SLO" if wide else "in %", "right")]
    if wide:
        cols += [("e2e p50 s", "right"), ("e2e p95 s", "right")]
    cols += [("p99 s", "right"), ("TTFT99 s", "right")]
    cols += [("GPU-h", "right"), ("vs static", "right")] if wide else [("GPU-h", "right")]
    cols += [("replicas", "right")]
    if wide:
        cols += [("changes", "right"), ("slice ch.", "right")]
    cols += [("lent GPU-h", "right"), ("reclaim s", "right")]
    for name, just in cols:
        t.add_column(name, justify=just, no_wrap=name == "policy")
    for row in run.rows:
        cells = [row["policy"], "ok" if row["meets_slo"] else "MISS",
                 f"{row['slo_attainment']:.2%}" if wide else f"{100 * row['slo_attainment']:.1f}"]
        if wide:
            cells += [f"{row['e2e_p50_s']:.2f}", f"{row['e2e_p95_s']:.1f}"]
        cells += [f"{row['e2e_p99_s']:.1f}", f"{row['ttft_p99_s']:.2f}", f"{row['gpu_hours']:.1f}"]
        if wide:
            cells += ["" if row["vs_static"] is None else f"{row['vs_static']:.0%}"]
        cells += [f"{row['replicas_min']}-{row['replicas_max']}"]
        if wide:
            cells += [str(row["replica_changes"]), str(row["slice_changes"])]
        rmax = row["reclaim_max_s"]
        cells += [f"{row['lent_gpu_hours']:.1f}", "-" if rmax is None else f"{rmax:.0f}"]
        t.add_row(*cells)
    return t


def to_json(run: ScenarioRun, step_s: float = 300.0) -> dict[str, Any]:
    """JSON-ready dict: scenario, per-policy summary and explanation, series every ``step_s``."""
    sc = run.scenario
    out: dict[str, Any] = {
        "scenario": sc.name, "source": sc.source, "title": run.title, "seed": run.seed,
        "duration_h": run.workload.duration_s / 3600.0, "requests": len(run.workload),
        "workload": run.workload.source, "model": run.table.model.name, "gpu_model": run.table.gpu_model,
        "throughput_table": run.table.source, "slo": {"e2e_s": sc.slo_s, "attainment": sc.attainment},
        "pool_gpus": sc.pool_gpus if math.isfinite(sc.pool_gpus) else None,
        "interrupted": run.interrupted,
        "policies": [],
        "verdict": verdict(run),
    }
    for row, r in zip(run.rows, run.results, strict=True):
        p = run.policies[r.policy]
        t = np.asarray(r.series["t_s"])
        at = np.searchsorted(t, np.arange(0.0, run.workload.duration_s + 1, step_s))
        keep = np.unique(at.clip(0, max(0, t.size - 1)))
        series = {k: [None if (isinstance(v[i], float) and math.isnan(v[i])) else v[i] for i in keep]
                  for k, v in r.series.items()} if t.size else {}
        out["policies"].append({**row, "describe": p.describe(), "note": sc.notes.get(r.policy, ""),
                                "explanation": run.explanations[r.policy], "series_5min": series})
    return out


def plot_run(run: ScenarioRun, path: Path) -> None:
    """PNG: request rate, p99 end-to-end latency (5-min windows, log scale, SLO line) and GPUs in use per
    policy over the day, titled with the scenario, trace and seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 10), sharex=True, gridspec_kw={"height_ratios": [1, 2, 2]})
    wl = run.workload
    edges = np.arange(0.0, wl.duration_s + 300.0, 300.0)
    counts, _ = np.histogram(wl.arrival_s, bins=edges)
    axes[0].plot(edges[:-1] / 3600, counts / 300.0, color="black", lw=1)
    axes[0].set_ylabel("requests/s\n(5 min)")
    colors = plt.get_cmap("tab10").colors
    for k, r in enumerate(run.results):
        c = colors[k % len(colors)]
        # p99 of the completions in 5-min windows, from the per-request arrays
        done = wl.arrival_s + np.nan_to_num(r.e2e_s, nan=np.inf)
        idx = np.digitize(done, edges) - 1
        e2e = np.nan_to_num(r.e2e_s, nan=np.inf)
        p99 = np.full(len(edges) - 1, np.nan)
        order = np.argsort(idx, kind="stable")
        sidx = idx[order]
        bounds = np.searchsorted(sidx, np.arange(len(edges)))
        for b in range(len(edges) - 1):
            lo, hi = bounds[b], bounds[b + 1]
            if hi > lo:
                p99[b] = np.percentile(e2e[order[lo:hi]], 99)
        axes[1].plot(edges[:-1] / 3600, p99, color=c, lw=1, label=r.policy)
        axes[2].step(np.asarray(r.series["t_s"]) / 3600, r.series["gpus"], where="post", color=c, lw=1.2,
                     label=f"{r.policy} ({r.gpu_hours:.1f} GPU-h)")
    axes[1].axhline(run.scenario.slo_s, color="red", ls="--", lw=1, label=f"SLO {run.scenario.slo_s:g} s")
    axes[1].set_yscale("log")
    axes[1].set_ylabel("p99 end-to-end\nlatency (s, 5 min)")
    axes[2].set_ylabel("GPUs in use\n(replicas x slice)")
    axes[2].set_xlabel("hour of the day")
    for ax in axes[1:]:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.grid(alpha=0.3)
    axes[0].grid(alpha=0.3)
    fig.suptitle(run.title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
