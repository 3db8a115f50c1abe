"""The cost of fairness: a run with per-queue fair share against the same jobs in one queue.

With one queue per tenant (a Philly virtual cluster), the pool scheduler gives each queue its fair share
(DRF over quotas, reclaim across queues); with one queue, the job order alone decides (the
counterfactual). :func:`one_queue` turns a trace into that counterfactual, :func:`fairness_cost` compares
the two runs per queue (by each job's queue in the fair-share run) and overall: mean and p95 JCT
(hours; p95 by linear interpolation, as ``numpy.percentile``), and the difference fair share - one queue
(positive: fairness costs that much; negative: the queue gains from it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["fairness_cost", "fairness_table", "one_queue"]


def one_queue(records: Sequence[Any]) -> list[Any]:
    """The same jobs with every queue name cleared (the simulator then builds one ``default`` queue with
    the whole cluster as quota). Works on JobRecord / JobSpec dataclasses."""
    return [dataclasses.replace(r, queue="") for r in records]


def _stats(jct_s: Sequence[float]) -> dict[str, float]:
    x = np.asarray(jct_s, dtype=float)
    x = x[np.isfinite(x)] / 3600.0
    if not x.size:
        return {"jobs": 0, "mean_jct_h": float("nan"), "p95_jct_h": float("nan")}
    return {"jobs": int(x.size), "mean_jct_h": float(x.mean()), "p95_jct_h": float(np.percentile(x, 95))}


def fairness_cost(fair_jobs: Sequence[dict], one_jobs: Sequence[dict]) -> dict[str, Any]:
    """Per queue and overall JCT with fair share (``fair_jobs``) and with one queue (``one_jobs``): the
    ``jobs`` lists of two :class:`~gpupool.sim.jobs.JobSimResult` of the same trace (matched by
    ``job_id``; the queue is the one of the fair-share run). Unfinished jobs (NaN JCT) are left out.

    Returns ``{"overall": row, "queues": {name: row}}``, each row ``{"jobs", "fair_mean_jct_h",
    "one_queue_mean_jct_h", "mean_cost_h", "fair_p95_jct_h", "one_queue_p95_jct_h", "p95_cost_h"}``.
    Raises ValueError when the runs do not hold the same job ids.
    """
    one = {j["job_id"]: j["jct"] for j in one_jobs}
    if set(one) != {j["job_id"] for j in fair_jobs}:
        raise ValueError("the fair-share and one-queue runs do not hold the same jobs")
    groups: dict[str, tuple[list[float], list[float]]] = {}
    for j in fair_jobs:
        f, o = groups.setdefault(j["queue"], ([], []))
        f.append(j["jct"])
        o.append(one[j["job_id"]])

    def row(f: list[float], o: list[float]) -> dict[str, float]:
        a, b = _stats(f), _stats(o)
        return {"jobs": len(f), "fair_mean_jct_h": a["mean_jct_h"], "one_queue_mean_jct_h": b["mean_jct_h"],
                "mean_cost_h": a["mean_jct_h"] - b["mean_jct_h"], "fair_p95_jct_h": a["p95_jct_h"],
                "one_queue_p95_jct_h": b["p95_jct_h"], "p95_cost_h": a["p95_jct_h"] - b["p95_jct_h"]}

    every_f = [x for f, _ in groups.values() for x in f]
    every_o = [x for _, o in groups.values() for x in o]
    queues = {q: row(*groups[q]) for q in sorted(groups, key=lambda q: (-len(groups[q][0]), q))}
    return {"overall": row(every_f, every_o), "queues": queues}


def fairness_table(policy: str, cost: dict[str, Any]) -> Any:
    """A rich Table of :func:`fairness_cost`: one row per queue, then the whole trace."""
    from rich.table import Table

    t = Table(title=f"cost of fairness, {policy}: fair share per queue vs one queue (JCT, hours)",
              title_justify="left")
    for h in ("queue", "jobs", "mean fair", "mean 1-queue", "mean cost", "p95 fair", "p95 1-queue",
              "p95 cost"):
        t.add_column(h, justify="left" if h == "queue" else "right")

    def add(name: str, r: dict[str, float], **kw: Any) -> None:
        t.add_row(name, f"{r['jobs']:,}", f"{r['fair_mean_jct_h']:.2f}", f"{r['one_queue_mean_jct_h']:.2f}",
                  f"{r['mean_cost_h']:+.2f}", f"{r['fair_p95_jct_h']:.2f}", f"{r['one_queue_p95_jct_h']:.2f}",
                  f"{r['p95_cost_h']:+.2f}", **kw)

    for q, r in cost["queues"].items():
        add(q[:24], r)
    add("all queues", cost["overall"], style="bold")
    return t
