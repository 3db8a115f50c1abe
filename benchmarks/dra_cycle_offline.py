"""The DRA claim stream (``dra_stream.py``) pod by pod through gpupool's own cycle code, no API server: one
scheduling cycle per arriving pod on a :class:`~gpupool.k8s.cache.model.ClusterModel`, next to the offline best
fit (``dra_offline.py``) of the same stream.

    python benchmarks/dra_cycle_offline.py [--seeds 42 7 8 9] [--out benchmarks/results]

Measured per seed: whole-GPU equivalents allocated when the first pod fits nowhere and at the end, and the
cycle time per pod. Writes ``dra_cycle_offline.json`` (the machine named).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import dra_offline
import dra_stream
from _common import json_safe, machine_info
from gpupool.k8s.cache.model import ClusterModel
from gpupool.k8s.cycle.planner import run_cycle


def run(seed: int) -> dict:
    st = dra_stream.build(seed=seed, scheduler_name="gpupool", claims="direct")
    m = ClusterModel(scheduler_name="gpupool", clock=lambda: 0.0, assume_ttl_s=1e9)
    m.replace("nodes", [{**n, "metadata": {**n["metadata"], "resourceVersion": "1"},
                         "status": {"allocatable": json.loads(n["metadata"]["annotations"]["kcp.sim/allocatable"]),
                                    "conditions": [{"type": "Ready", "status": "True"}]}} for n in st.nodes])
    m.replace("resourceslices", st.slices)
    m.replace("deviceclasses", st.classes)
    m.replace("pods", [])
    first = None
    cycle_s = 0.0
    for i, (pod, claim) in enumerate(zip(st.pods, st.claims, strict=True)):
        m.apply("resourceclaims", "ADDED", {**claim, "metadata": {**claim["metadata"], "uid": f"c{i}",
                                                                  "resourceVersion": "1"}})
        m.apply("pods", "ADDED", {**pod, "metadata": {**pod["metadata"], "uid": f"p{i}", "resourceVersion": "1",
                                                      "creationTimestamp": "2026-01-01T00:00:00Z"},
                                  "status": {"phase": "Pending"}})
        t = time.perf_counter()
        placed = {p.pod: p for p in run_cycle(m).placements}
        cycle_s += time.perf_counter() - t
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        if first is None and placed[key].node is None:
            first = {"index": i, "pod": pod["metadata"]["name"],
                     "gpus": round(sum(m.dra.gpu_equivalents(r) for _, r, _ in m.dra.allocations()), 3)}
    end = sum(m.dra.gpu_equivalents(r) for _, r, _ in m.dra.allocations())
    bf = dra_offline.best_fit(st.asks, st.nodes, st.slices)
    return {"pods": len(st.pods), "gpupool": {"first_failure": first, "gpus_at_end": round(end, 3),
                                              "cycle_ms_per_pod": round(1000 * cycle_s / len(st.pods), 1)},
            "offline_best_fit": {"first_failure": bf["first_failure"], "gpus_at_end": bf["gpus_at_end"]}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[42, 7, 8, 9])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = ap.parse_args(argv)
    if not dra_stream.DEFAULT_TRACE.exists():
        print(f"dra_cycle_offline.py: {dra_stream.DEFAULT_TRACE} not found (set GPUPOOL_TRACES)", file=sys.stderr)
        return 3
    results = {}
    for seed in args.seeds:
        results[str(seed)] = r = run(seed)
        g, b = r["gpupool"], r["offline_best_fit"]
        print(f"seed {seed}: gpupool first failure {g['first_failure']}, end {g['gpus_at_end']}, "
              f"{g['cycle_ms_per_pod']} ms/pod; best fit first failure {b['first_failure']}, end {b['gpus_at_end']}",
              file=sys.stderr)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dra_cycle_offline.json").write_text(json.dumps(json_safe(
        {"what": "benchmarks/dra_cycle_offline.py", "machine": machine_info(), "seeds": results}),
        indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
