"""Replicas on their way count as capacity coming (issue 30, item 5). No I/O.

While replicas load (``ready < current``: pod start, weights, CUDA graphs; 90 s for an 8B model), requests
queue. The in-flight total (``concurrency``: running + waiting) then grows with the backlog every period,
and a rule that sizes on it (``ceil(concurrency / target)``, Knative's panic mode) orders more replicas each
cycle although those already ordered will serve the arrivals: from zero at 3 rps the order went
2 -> 6 -> 12 -> 16 replicas (the whole pool) in 45 s before the first one was ready.

:func:`with_capacity_coming` rewrites the ``concurrency`` sample for the recommender while replicas load: the
service needs replicas for the **arrival rate** (``rps`` over its target per replica) plus enough to drain the
**backlog** (``queue_depth``) within ``drain_s`` at that per-replica rate; the concurrency sample is capped at
that many replicas' worth (``replicas x concurrency target``). When every replica is ready the samples are
used as measured. This is gpupool's rule (the HPA and Knative size on the measured total as it is).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from gpupool.engine.autoscale import AutoscalerSpec

__all__ = ["with_capacity_coming"]


def with_capacity_coming(samples: Mapping[str, float], spec: AutoscalerSpec, current: int, ready: int,
                         drain_s: float = 60.0) -> tuple[dict[str, float], str | None]:
    """The samples to give :meth:`Recommender.recommend`, and a note when the concurrency was capped.

    ``samples``: metric name -> service-wide total (``concurrency``, ``rps`` requests/s, ``queue_depth``);
    ``spec``: the autoscaler spec whose ``concurrency`` and ``rps`` targets (per replica) are used;
    ``current`` replicas ordered, ``ready`` of them serving; ``drain_s``: seconds in which the replicas
    should clear the backlog (at 0 replicas the same rule sizes the activation from zero). Without an
    ``rps`` sample or target, or a ``concurrency`` target, or with every replica ready, the samples are
    returned unchanged. Raises ValueError on a negative ``drain_s``.
    """
    if not drain_s > 0:
        raise ValueError(f"drain_s must be > 0, got {drain_s!r}")
    out = dict(samples)
    targets = {m.name: m.target for m in spec.metrics}
    if (ready >= current and current > 0) or "concurrency" not in out or "rps" not in out:
        return out, None
    if "concurrency" not in targets or "rps" not in targets:
        return out, None
    per_rps = targets["rps"]
    need = math.ceil(out["rps"] / per_rps - 1e-9)
    queue = out.get("queue_depth", 0.0)
    need += math.ceil(queue / (per_rps * drain_s) - 1e-9)
    need = max(1, need)
    cap = need * targets["concurrency"]
    if out["concurrency"] <= cap:
        return out, None
    note = (f"{max(0, current - ready)} replica(s) on their way: concurrency {out['concurrency']:g} counted as "
            f"{cap:g} ({need} replicas for {out['rps']:g} rps and a backlog of {queue:g} in {drain_s:g} s)")
    out["concurrency"] = cap
    return out, note
