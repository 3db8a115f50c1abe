"""Job-level replay of whole traces: JCT, queueing delay, fairness, energy and simulated events per second.

Method
------
For each (trace, policy) pair the driver starts a fresh subprocess of this script (``--one TRACE POLICY``),
one core and one thread (the BLAS/OpenMP thread variables are set to 1 before NumPy is imported, and the
child is pinned to one CPU where the OS allows it), so that no run inherits another's caches.

Traces and clusters (``shared/traces``, ``examples/clusters``):

* ``philly``: the whole Microsoft Philly trace as flattened by Pollux (82,247 jobs, 15 virtual clusters,
  which become 15 queues with quotas in proportion to their GPU-time demand) on ``philly.yaml``
  (80 nodes, 512 GPUs: 1.37 x the trace's average load).
* ``itp04``: Microsoft ITP cluster04 (15,802 jobs, one queue) on ``itp-cluster04.yaml`` (88 nodes,
  704 GPUs: 1.42 x its average load).

Each run is :func:`gpupool.sim.jobs.run_jobs` with the default :class:`~gpupool.sim.jobs.JobSimConfig`
(checkpoint every 1,800 s of progress, 30 s restart overhead, checkpoint on eviction, no failures, trace
durations on every GPU model) and the policy's own scheduler configuration. **Events** are the
simulator's job events: arrival, start, finish, preempt, fail, resize. **events/s** = events / wall time
of the event loop (loading the trace and the cluster is not counted); **events per CPU second** = events /
CPU time of the whole run (``time.process_time``: setup and metrics included), the figure to compare on a
machine shared with other work. The engine's numba kernels are compiled or loaded from numba's cache before
the run (``kernels.warm_up``, not counted), so that a cold cache does not put compilation in the loop.
The wall time spent inside
``Engine.place`` (placement of every pod by the placement policy) is measured separately, to show how
much of the loop is placement and how much the pool scheduler and the simulator.

Output: ``jobs.json`` and ``jobs.md`` in ``--out`` (default ``benchmarks/results``).

Target: >= 50,000 simulated events per second on one core for the whole Philly trace.

Usage::

    python benchmarks/bench_jobs.py                              # both traces, fifo, round-robin, gpupool
    python benchmarks/bench_jobs.py --traces itp04 --policies gpupool
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from _common import json_safe, machine_info, pin_one_cpu  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("GPUPOOL_TRACES", REPO.parent / "shared" / "traces"))
TRACES = {
    "philly": (TRACES_DIR / "philly_pollux" / "philly.csv", REPO / "examples" / "clusters" / "philly.yaml"),
    "itp04": (TRACES_DIR / "msr_itp_elasticflow" / "cluster04.csv",
              REPO / "examples" / "clusters" / "itp-cluster04.yaml"),
}
POLICIES = ("fifo", "round-robin", "gpupool")
TARGET_EVENTS_PER_S = 50_000
KEYS = ("mean_jct_s", "p95_jct_s", "mean_queueing_delay_s", "makespan_s", "gpu_utilization", "jain_fairness",
        "jain_fairness_capped",
        "preemptions", "deadlocks", "energy_kwh", "events", "wall_seconds", "events_per_second", "finished_jobs",
        "unfinished_jobs", "worst_quota_deficit", "worst_quota_deficit_raw", "longest_quota_shortfall_s",
        "lost_gpu_hours", "restarts", "preemptions_by_action")
QUEUE_KEYS = ("quota_gpus", "jobs", "mean_gpus", "quota_deficit", "quota_deficit_raw", "quota_shortfall_time_share",
              "quota_shortfall_longest_s", "mean_jct_s", "preemptions")


def measure_one(trace: str, policy: str, seed: int, max_jobs: int | None) -> dict:
    from gpupool.clusterspec import load_cluster_yaml
    from gpupool.engine import kernels
    from gpupool.engine.core import Engine
    from gpupool.sim.jobs import run_jobs
    from gpupool.traces import load_jobs

    kernels.warm_up()  # kernels compiled or loaded now, not inside the first event that needs one
    trace_path, cluster_path = TRACES[trace]
    nodes = load_cluster_yaml(cluster_path)
    jobs = load_jobs(trace_path)
    if max_jobs:
        jobs = jobs[:max_jobs]
    spent = [0.0, 0]
    place = Engine.place

    def timed_place(self, req):  # wall time inside the engine (placement policy + filters + allocate)
        t0 = time.perf_counter()
        try:
            return place(self, req)
        finally:
            spent[0] += time.perf_counter() - t0
            spent[1] += 1

    Engine.place = timed_place
    cpu0 = time.process_time()
    res = run_jobs(nodes, jobs, policy, seed=seed)
    cpu = time.process_time() - cpu0  # CPU time of the whole run (setup, loop, metrics): robust on a shared machine
    Engine.place = place
    row = {"trace": trace, "policy": policy, "seed": seed, "jobs": len(jobs), "nodes": len(nodes),
           "gpus": sum(n.gpu_count for n in nodes)}
    row.update({k: res.metrics[k] for k in KEYS})
    row["cpu_seconds"] = cpu
    row["events_per_cpu_second"] = res.metrics["events"] / cpu if cpu > 0 else math.nan
    row["engine_place_calls"] = spent[1]
    row["engine_place_seconds"] = spent[0]
    row["engine_share"] = spent[0] / res.metrics["wall_seconds"] if res.metrics["wall_seconds"] else math.nan
    row["queues"] = {name: {k: q[k] for k in QUEUE_KEYS} for name, q in res.queues.items()}
    row["events_by_kind"] = res.metrics["events_by_kind"]
    row["scheduler_stats"] = res.metrics["scheduler_stats"]
    row["maxrss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return row


def _fmt(x, digits: int = 1) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    return f"{x:,.{digits}f}"


def markdown(rows: list[dict], machine: dict) -> str:
    lines = [
        "# Job-level replay: whole traces",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores, load average at start {machine['load_average']}; "
        f"Python {machine['python']}, NumPy {machine['numpy']}; {machine['date']}.",
        "One process, one thread, one (trace, policy) per subprocess. Default simulator settings "
        "(checkpoint every 1,800 s, 30 s restart overhead, no failures). See `bench_jobs.py` for the method.",
        "",
        "| trace | policy | jobs | GPUs | mean JCT (h) | p95 JCT (h) | mean queueing delay (h) | makespan (d) "
        "| GPU util | Jain (capped) | worst quota deficit | longest shortfall (min) | preemptions (moves) "
        "| deadlocks | energy (MWh) | events | events/s | events/CPU s | engine share |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['trace']} | {r['policy']} | {r['jobs']:,} | {r['gpus']:,} | {_fmt(r['mean_jct_s'] / 3600)} "
            f"| {_fmt(r['p95_jct_s'] / 3600)} | {_fmt(r['mean_queueing_delay_s'] / 3600, 2)} "
            f"| {_fmt(r['makespan_s'] / 86400)} | {100 * r['gpu_utilization']:.1f}% | {_fmt(r['jain_fairness'], 3)} "
            f"({_fmt(r['jain_fairness_capped'], 3)}) "
            f"| {100 * r['worst_quota_deficit']:.2f}% | {_fmt(r['longest_quota_shortfall_s'] / 60)} "
            f"| {r['preemptions']:,} ({r['preemptions_by_action'].get('consolidated', 0):,}) | {r['deadlocks']} "
            f"| {_fmt(r['energy_kwh'] / 1000)} | {r['events']:,} | {_fmt(r['events_per_second'], 0)} "
            f"| {_fmt(r.get('events_per_cpu_second'), 0)} | {100 * r['engine_share']:.0f}% |")
    lines += [
        "",
        "`Jain`: Jain's index over queues of GPU-time held / GPU-time of fair share (capped: each ratio capped at "
        "1, so that only queues that got less than their share count). "
        "`engine share`: fraction of the event loop's wall time spent inside `Engine.place` (placing pods with "
        "the placement policy). `worst quota deficit`: over the queues, the largest share of "
        "`min(demand, quota)` GPU-time the queue did not get while one of its waiting jobs fitted in what was "
        "left of its quota (GPUs held idle for its own reserved gang count as held; "
        "`worst_quota_deficit_raw` in the JSON: any shortfall); `longest shortfall`: the longest time a queue "
        "spent in such a shortfall. `preemptions (moves)`: evictions, of which moves by consolidation (the "
        "job restarts at once on another node from the checkpoint it took on eviction).",
        "",
        f"Target: >= {TARGET_EVENTS_PER_S:,} simulated events/s on one core (whole Philly trace).",
    ]
    tail = []
    for r in rows:
        if r["trace"] == "philly":
            best = max(r["events_per_second"], r.get("events_per_cpu_second") or 0.0)
            verdict = "meets" if best >= TARGET_EVENTS_PER_S else "BELOW"
            tail.append(f"- `{r['policy']}`: {r['events_per_second']:,.0f} events/s "
                        f"({r.get('events_per_cpu_second') or math.nan:,.0f} per CPU second): {verdict} the target.")
    lines += tail
    lines += ["", "## Quota attainment per queue", "",
              "Queues with a quota. `in-quota deficit`: share of the queue's `min(demand, quota)` GPU-time it did "
              "not hold while one of its waiting jobs fitted in what was left of its quota (GPUs reserved idle "
              "for the queue's own starving gang count as held); `raw`: any shortfall, also while its waiting "
              "jobs were too big for the quota left; `time short`: share of the run in an in-quota shortfall; "
              "`longest`: the longest such shortfall.", ""]
    for r in rows:
        qs = {k: v for k, v in (r.get("queues") or {}).items() if v["quota_gpus"] > 0}
        if not qs:
            continue
        lines += [f"### {r['trace']} / {r['policy']}", "",
                  "| queue | quota (GPUs) | jobs | mean GPUs held | in-quota deficit | raw | time short "
                  "| longest (min) |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for name, q in sorted(qs.items(), key=lambda kv: (-kv[1]["quota_deficit"], kv[0])):
            lines.append(
                f"| {name} | {q['quota_gpus']:g} | {q['jobs']:,} | {_fmt(q['mean_gpus'])} "
                f"| {100 * q['quota_deficit']:.2f}% | {100 * q['quota_deficit_raw']:.2f}% "
                f"| {100 * q['quota_shortfall_time_share']:.2f}% | {_fmt(q['quota_shortfall_longest_s'] / 60)} |")
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"






def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--traces", default=",".join(TRACES), help="comma list of: " + ", ".join(TRACES))
    p.add_argument("--policies", default=",".join(POLICIES), help="comma list of job-level policies")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--max-jobs", type=int, default=None, help="only the first N jobs of each trace")
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per (trace, policy) subprocess")
    p.add_argument("--one", nargs=2, metavar=("TRACE", "POLICY"), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        pin_one_cpu()
        row = measure_one(args.one[0], args.one[1], args.seed, args.max_jobs)
        sys.stdout.write(json.dumps(json_safe(row)) + "\n")
        return 0
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    for t in traces:
        if t not in TRACES:
            sys.exit(f"unknown trace {t!r}; known: {', '.join(TRACES)}")
        if not TRACES[t][0].exists():
            sys.exit(f"trace file {TRACES[t][0]} not found (set GPUPOOL_TRACES to the traces folder)")
    machine = machine_info()
    rows = []
    for t in traces:
        for pol in policies:
            cmd = [sys.executable, __file__, "--one", t, pol, "--seed", str(args.seed)]
            if args.max_jobs:
                cmd += ["--max-jobs", str(args.max_jobs)]
            print(f"{t} / {pol} ...", file=sys.stderr, flush=True)
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
            if out.returncode != 0:
                sys.exit(f"{t} / {pol} failed:\n{out.stderr}")
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"  {row['events']:,} events in {row['wall_seconds']:.1f} s: {row['events_per_second']:,.0f}/s "
                  f"({row['events_per_cpu_second']:,.0f} per CPU second); "
                  f"mean JCT {row['mean_jct_s'] / 3600:.1f} h", file=sys.stderr, flush=True)
            rows.append(row)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"machine": machine, "seed": args.seed, "max_jobs": args.max_jobs, "target_events_per_s": TARGET_EVENTS_PER_S,
           "rows": rows}
    (args.out / "jobs.json").write_text(json.dumps(json_safe(doc), indent=2) + "\n")
    (args.out / "jobs.md").write_text(markdown(rows, machine))
    print(f"wrote {args.out / 'jobs.json'} and {args.out / 'jobs.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
