"""Run records (one flat record per policy and seed, with reasons and curves) and their JSON form.
Imports no other module of :mod:`gpupool.report`."""

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

from gpupool.provenance import run_meta

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
        "meta": run_meta(),
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

