"""Per-policy summaries over seeds, and the scores that rank them.
Imports :mod:`gpupool.report.records` within the report package."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from gpupool.report.records import METRIC_KEYS, NAN, Run, top_reasons

# --------------------------------------------------------------------------------------------------
# Summary over seeds


def stats(values: Sequence[float]) -> tuple[float, float]:
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
            mean, std = stats([r.record.get(key) for r in group])
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
    return score_and_label(entry, protocol)[0]


def score_and_label(entry: dict[str, Any], protocol: str) -> tuple[float, str]:
    if protocol == "inflation" and math.isfinite(entry["gpu_allocation_ratio_at_100"]):
        return entry["gpu_allocation_ratio_at_100"], "GPU alloc at 100% arrived"
    if protocol == "replay" and math.isfinite(entry.get("mean_gpu_allocation", NAN)):
        return entry["mean_gpu_allocation"], "mean GPU alloc over time"
    value = entry["gpu_allocation_ratio"]
    label = "final GPU alloc" if protocol == "inflation" else "GPU alloc at last arrival"
    return (value if math.isfinite(value) else -math.inf), label

