"""gpupool beside Gavel (issue 32 item 4): Gavel's Continuous-Multiple workload (Narayanan et al., OSDI'20;
stanford-futuredata/gavel, generated as its ``scheduler/utils.py`` ``generate_job`` does:
:func:`gpupool.sim.gavel.generate_jobs`) on 36 V100 + 36 P100 + 36 K80, with Gavel's per-job-type throughputs
(``benchmarks/data/gavel_throughputs.json``, derived from Gavel's ``scheduler/simulation_throughputs.json``,
MIT licence, notice inside). Gavel's simulation model matched: no topology slowdown, GPUs placed one per pod,
no restart cost for preemptions; moves (the new mode) pay ``restart_s`` each.

    python benchmarks/gavel_compare.py --seeds 0,1,2,3 --jobs 400 --rate 3

Runs: ``gpupool`` (speed-blind, the default), ``gpupool@jct`` (``--objective jct``, per-job-type speeds for
placement), ``gpupool@jct+work+move`` (the same with LAS over work done and moves to faster GPUs). Results:
benchmarks/results/gavel_compare.{json,md} with the machine. Gavel itself is not run here (its simulator needs
cvxpy solvers and hours per seed); the issue's Gavel figures (measured by the session that filed it) are quoted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import json_safe, machine_info  # noqa: E402

TABLE = REPO / "benchmarks" / "data" / "gavel_throughputs.json"
OUT = REPO / "benchmarks" / "results"
RUNS = ("gpupool", "gpupool@jct", "gpupool@jct+work", "gpupool@jct+move", "gpupool@jct+work+move")
GAVEL = {  # issue 32, means over four seeds of Gavel run unmodified (h, h, h, h, ratio)
    "Gavel max_min_fairness_perf": (17.9, 94, 163, 293, 0.44),
    "Gavel finish_time_fairness_perf": (18.4, 97, 162, 291, 0.45),
    "Gavel max_min_fairness (speed-blind)": (24.3, 127, 241, 386, 0.41),
}


_QUOTED = "issue 32, its own four seeds, not rerun"


def cluster() -> list:
    from gpupool.model import NodeSpec

    return [NodeSpec(f"{m.lower()}-{i}", 64000, 512 * 1024, 4, m) for m in ("V100", "P100", "K80") for i in range(9)]


def one(run: str, seed: int, n: int, rate: float, world: str = "type") -> dict:
    from gpupool.sim.gavel import generate_jobs
    from gpupool.sim.jobs import JobSimConfig, run_jobs
    from gpupool.sim.migration import MigrationConfig
    from gpupool.sim.throughput import ThroughputTable
    from gpupool.topology import TIERS, TopologyConfig

    doc = json.loads(TABLE.read_text())
    rows = dict(doc["rows"])
    models = ("V100", "P100", "K80")
    rows[""] = {m: statistics.fmean(r[m] for r in doc["rows"].values()) for m in models}  # jobs without a type
    if world == "model":  # one speed per GPU model (the mean over the job types), for every job
        rows = {"": rows[""]}
    table = ThroughputTable(rows, "V100")
    jobs = generate_jobs(n, rate, seed)
    _, _, mode = run.partition("@")
    objective, *flags = mode.split("+") if mode else (None,)
    cfg = JobSimConfig(restart_overhead_s=0.0, topology=TopologyConfig(factors={t: 1.0 for t in TIERS}),
                       max_gpus_per_pod=1, throughputs=table, objective=objective, sample_interval_s=0.0)
    if "work" in flags:
        cfg = replace(cfg, las_work=True)
    if "move" in flags:
        cfg = replace(cfg, migration=MigrationConfig())
    t0 = time.perf_counter()
    res = run_jobs(cluster(), jobs, "gpupool", seed=seed, config=cfg)
    m = res.metrics
    jct = sorted(res.jct.tolist())
    p99 = jct[min(len(jct) - 1, int(round(0.99 * (len(jct) - 1))))] if jct else float("nan")
    return {"run": run, "world": world, "seed": seed, "jobs": n, "mean_jct_h": m["mean_jct_s"] / 3600,
            "p95_jct_h": m["p95_jct_s"] / 3600,
            "p99_jct_h": p99 / 3600, "makespan_h": m["makespan_s"] / 3600, "utilization": m["gpu_utilization"],
            "unfinished": m["unfinished_jobs"], "preemptions": m["preemptions"], "moves": m.get("moves", 0),
            "moves_to_faster": m.get("moves_to_faster", 0), "move_lost_gpu_hours": m.get("move_lost_gpu_hours", 0.0),
            "wall_s": time.perf_counter() - t0}


def render(doc: dict) -> str:
    all_rows = doc["rows"]
    seeds = sorted({r["seed"] for r in all_rows})
    lines = ["# gpupool beside Gavel: Continuous-Multiple, 36 V100 + 36 P100 + 36 K80", "",
             f"{doc['jobs']} jobs per seed, Poisson {doc['rate']} jobs/h, seeds {seeds}; Gavel's per-job-type "
             "throughputs; Gavel's simulation model matched (see benchmarks/gavel_compare.py). Means over the seeds.",
             ""]
    for world in ("type", "model"):
        rows = [r for r in all_rows if r.get("world", "type") == world]
        if rows:
            lines += _table(rows, world)
    lines += ["", "Per seed:", "", "| run | world | seed | mean JCT h | p95 h | p99 h | makespan h | utilisation | "
              "moves |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in all_rows:
        lines.append(f"| {r['run']} | {r.get('world', 'type')} | {r['seed']} | {r['mean_jct_h']:.1f} | "
                     f"{r['p95_jct_h']:.0f} | {r['p99_jct_h']:.0f} | {r['makespan_h']:.0f} | {r['utilization']:.2f} | "
                     f"{r['moves']} |")
    mi = doc["machine"]
    lines += ["", f"Machine: {mi['cpu']}, {mi['cores']} cores (shared, load average {mi['load_average']}), Python "
              f"{mi['python']}, {mi['date']}. The issue's Gavel figures come from its own generator and seeds; the "
              "gpupool rows here use this generator with the same seeds, so the workloads are drawn alike but "
              "were not checked job for job against Gavel's trace output.", ""]
    return "\n".join(lines)


def _table(rows: list[dict], world: str) -> list[str]:
    title = ("per-job-type speeds (Gavel's table)" if world == "type"
             else "one speed per GPU model (the mean of Gavel's table over job types)")
    lines = [f"## {title}", "", "| run | mean JCT h | p95 h | p99 h | makespan h | utilisation | moves (to faster) | "
             "GPU-h lost to moves | unfinished |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for run in RUNS:
        rs = [r for r in rows if r["run"] == run]
        if not rs:
            continue
        mean = {k: statistics.fmean(r[k] for r in rs) for k in ("mean_jct_h", "p95_jct_h", "p99_jct_h", "makespan_h",
                                                                  "utilization", "moves", "moves_to_faster",
                                                                  "move_lost_gpu_hours", "unfinished")}
        lines.append(f"| {run} | {mean['mean_jct_h']:.1f} | {mean['p95_jct_h']:.0f} | {mean['p99_jct_h']:.0f} | "
                     f"{mean['makespan_h']:.0f} | {mean['utilization']:.2f} | {mean['moves']:.0f} "
                     f"({mean['moves_to_faster']:.0f}) | {mean['move_lost_gpu_hours']:.1f} | "
                     f"{mean['unfinished']:.1f} |")
    if world == "type":
        for name, (m, p95, p99, mk, u) in GAVEL.items():
            lines.append(f"| {name} ({_QUOTED}) | {m} | {p95} | {p99} | {mk} | {u} | | | |")
    else:
        lines.append(f"| Gavel's best with one speed per model ({_QUOTED}) | 19.6 | | | | | | | |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--jobs", type=int, default=400)
    ap.add_argument("--rate", type=float, default=3.0, help="jobs per hour (Poisson)")
    ap.add_argument("--runs", default=",".join(RUNS))
    ap.add_argument("--worlds", default="type,model", help="type: per-job-type speeds; model: one per GPU model")
    ap.add_argument("--name", default="gavel_compare", help="results file name (benchmarks/results/NAME.{json,md})")
    ap.add_argument("--render", action="store_true", help="only rewrite NAME.md from NAME.json")
    args = ap.parse_args()
    if args.render:
        doc = json.loads((OUT / f"{args.name}.json").read_text())
        (OUT / f"{args.name}.md").write_text(render(doc))
        return
    rows = [one(run, int(s), args.jobs, args.rate, w) for w in args.worlds.split(",") for s in args.seeds.split(",")
            for run in args.runs.split(",")]
    doc = {"jobs": args.jobs, "rate": args.rate, "rows": rows, "machine": machine_info()}
    OUT.mkdir(exist_ok=True)
    (OUT / f"{args.name}.json").write_text(json.dumps(json_safe(doc), indent=1) + "\n")
    (OUT / f"{args.name}.md").write_text(render(doc))
    print((OUT / f"{args.name}.md").read_text())


if __name__ == "__main__":
    main()
