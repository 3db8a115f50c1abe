"""The job simulator's heterogeneity-aware placement: which placement policy to wrap in a
:class:`~gpupool.engine.pool.hetero.HeteroPolicy`, with node speeds from the catalog. Imports the engine's
pool, the catalog, energy figures and the policy registry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from gpupool.catalog import get_model
from gpupool.energy import power_figures
from gpupool.engine.core import Policy
from gpupool.engine.pool.hetero import OBJECTIVES, HeteroPolicy, heterogeneous, model_cost
from gpupool.policies import make_policy
from gpupool.sim.throughput import ThroughputTable

__all__ = ["DEFAULT_OBJECTIVE", "HETERO_PLACEMENTS", "catalog_speeds", "hetero_placement", "job_classes"]

DEFAULT_OBJECTIVE: str | None = None
"""The job simulator's objective when none is given: None, speed-blind placement (opt-in, so that every
outcome pinned before this module, tests/test_jobsim_hashes.py, stays identical). On mixed-models with
the Philly trace (benchmarks/results/hetero.md, seed 42) no objective wins everywhere: on the first 3,000
jobs ``balanced`` has the lowest mean JCT and energy; on the whole trace ``jct`` has (balanced: +26.3 %
mean JCT, +0.7 % energy against it)."""

HETERO_PLACEMENTS = ("gpupool",)
"""Placement policies the job simulator wraps; the placement baselines (round-robin, lowest-power) stay as
they are, since what they do is the point of comparing with them."""


def catalog_speeds(models: Sequence[str], gpu_count: Sequence[int], reference: str | None = None) -> np.ndarray:
    """(n_nodes,) relative speed of each node's GPU model against ``reference`` (None: the model with the most
    GPUs), the catalog's ``relative_throughput`` ratio; 1.0 where either is unknown (as the job simulator)."""
    ref = reference or Counter(m for m, k in zip(models, gpu_count, strict=True) for m in [m] * int(k)
                               ).most_common(1)[0][0]
    ref_tp = get_model(ref).relative_throughput or 0.0
    out = []
    for m in models:
        tp = get_model(m).relative_throughput if m else 0.0
        out.append(tp / ref_tp if (tp and ref_tp) else 1.0)
    return np.array(out, dtype=np.float64)


def hetero_placement(placement: str | Policy, nodes: Sequence, gpu_speed: str, objective: str | None,
                     reference: str | None = None, gpu_utilization: float = 1.0,
                     speed: np.ndarray | None = None) -> str | Policy:
    """The job simulator's placement: ``placement`` wrapped in a :class:`HeteroPolicy` for ``objective``
    (None: :data:`DEFAULT_OBJECTIVE`; None or ``"none"``: never wrap, the speed-blind placement) when
    ``gpu_speed == "catalog"``, the placement is one of
    :data:`HETERO_PLACEMENTS` and the cluster's GPU models differ in speed; else ``placement`` unchanged.
    ``speed``: (n_nodes,) per-node speeds to use instead of the catalog's (a throughput table's ``""`` row;
    then ``gpu_speed`` is not consulted).
    ``nodes``: the cluster's NodeSpecs. Raises ValueError for an unknown objective."""
    if objective is not None and objective not in (*OBJECTIVES, "none"):
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)} or none, got {objective!r}")
    objective = objective or DEFAULT_OBJECTIVE
    if (objective is None or objective == "none" or (gpu_speed != "catalog" and speed is None)
            or not isinstance(placement, str)
            or placement not in HETERO_PLACEMENTS):
        return placement
    models = [n.gpu_model for n in nodes]
    counts = [n.gpu_count for n in nodes]
    if speed is None:
        speed = catalog_speeds(models, counts, reference)
    if not heterogeneous(speed, counts):
        return placement
    idle, peak, _ = power_figures([m or "none" for m in models])
    busy = idle + (peak - idle) * gpu_utilization
    cost = np.where(np.asarray(counts) > 0, model_cost(objective, speed, busy, idle), np.inf)
    return HeteroPolicy(make_policy(placement), cost, objective, speed)


def job_classes(placement: str | Policy, table: ThroughputTable, jobs: Sequence, models: Sequence[str],
                speed: Sequence[float], busy_w: Sequence[float], idle_w: Sequence[float], gpu_count: Sequence[int],
                job_cls: Mapping[str, str]) -> str | Policy:
    """``placement`` given one cost and speed row per job type of ``jobs`` that ``table`` has
    (:meth:`HeteroPolicy.set_job_classes`). A :class:`HeteroPolicy` gets its objective's cost from the type's
    speeds. A speed-blind placement of :data:`HETERO_PLACEMENTS` is wrapped in one that only keeps each type off
    the models where its speed is 0 (every other node costs the same, so it stays speed-blind) when the table
    has such a zero; anything else is returned as it is. ``speed``: the per-node default; ``busy_w`` /
    ``idle_w``: one GPU's power per node; ``job_cls``: job id -> type."""
    counts = np.asarray(gpu_count)
    types = [jt for jt in sorted({getattr(r, "job_type", "") for r in jobs} - {""}) if jt in table.rows]
    rows = {jt: table.node_speeds(jt, models, speed) for jt in types}
    if isinstance(placement, HeteroPolicy):
        classes = {jt: (np.where(counts > 0, model_cost(placement.objective, s, busy_w, idle_w), np.inf), s)
                   for jt, s in rows.items()}
    elif (isinstance(placement, str) and placement in HETERO_PLACEMENTS
          and any(((s <= 0) & (counts > 0)).any() for s in rows.values())):
        runs = {jt: (s > 0).astype(np.float64) for jt, s in rows.items()}
        classes = {jt: (np.where((counts > 0) & (r > 0), 0.0, np.inf), r) for jt, r in runs.items()}
        placement = HeteroPolicy(make_policy(placement), np.where(counts > 0, 0.0, np.inf), "")
    else:
        return placement
    if classes:
        placement.set_job_classes(lambda pj: job_cls.get(pj.name, ""), classes)
    return placement
