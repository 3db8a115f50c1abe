"""Job order beside Tiresias-L and Tiresias-G: gpupool's orders on windows of the Philly trace (issue 14).

Method
------
Jobs: ``--jobs`` consecutive Philly jobs from each ``--offsets`` (default 0, 5,000, 10,000 and 15,000: the
first window is the one issue 14 measured Tiresias on; the others were not used to choose any setting),
submission times from the window's first job, whole seconds (as ``benchmarks/tiresias/convert.py``
writes them for the peer), one queue. Cluster: ``--gpus`` (default 384 and 320) on 8-GPU V100 nodes.
Model matched to the Tiresias simulator: no restart overhead, topology speed factor 1.0 on every tier, no
failures, seed 42. JCT = end - submit; percentiles by linear interpolation; makespan = last end - first
submission (all in hours).

Placement (``place``): ``count`` splits every job into 1-GPU pods that may land anywhere
(``JobSimConfig.max_gpus_per_pod = 1``: what the peer's Tiresias-L/G runs do with ``--scheme=count``, which
only counts free GPUs), ``node``: gpupool's own gangs of whole-node pods (a 4-GPU job on one node, a 16-GPU
job on two whole nodes).

Orders (``PoolConfig`` of the ``gpupool`` job policy with these overrides):

* ``las``: gpupool's default 2D-LAS (thresholds 3,600 / 36,000 GPU-s, promotion knob 8);
* ``las-tiresias``: 2D-LAS with Tiresias' constants (3,250 / 7,200 GPU-s, no promotion): the Tiresias-L
  proxy;
* ``gittins`` (the ``gittins`` job policy): Gittins index within the default LAS levels, sizes learned
  online from finished jobs (no prior: nothing about the window is known in advance), promotion knob 1 (a
  job that waited as long as it ran goes back to level 0); the knob was chosen on the first window;
* ``gittins-knob8``: the same with gpupool's default knob 8;
* ``gittins-bounded``: ``gittins``, and no job is preempted more than 20 times nor once it has run 100 h;
* ``remaining``: shortest expected remaining service within the levels (same online sizes);
* ``remaining-est1``: shortest expected remaining service within the levels, promotion knob 1, every job
  carrying a size estimate as a user's run-time limit would (``JobSimConfig.size_estimate_error`` 1.0: its
  size x exp(N(0, 1)), so typically off by up to a factor e; the learned sizes once a job overran it);
* ``remaining-exact``: the same with every job's exact size known at submission (error 0.0; as every
  estimate, used from the first job that finished on: before, all jobs score alike). This row is
  **clairvoyant**: no scheduler knows this; it shows what knowing job sizes can win within the LAS levels,
  and is marked so in the tables (its checks say whether even exact sizes reach the targets).

Tiresias' own figures come from the peer benchmark's results (``--peer-results``, default every
``benchmarks/results/tiresias_peer*.json``, written by ``benchmarks/tiresias/run.py``; other windows:
``run.py --offset N --name tiresias_peer_wN``), else, for the first window only, from the table in issue 14 (labelled
so). The check (``done_when``) compares, per window and cluster, each gpupool row with Tiresias-G's mean
and p95 and Tiresias-L's p99 and makespan (the ``las-tiresias`` proxy's makespan when the peer's is
missing, labelled so).

``--fairness`` adds the cost of fairness (:mod:`gpupool.sim.fairness`) with gpupool's shipped model (30 s
restart overhead, topology slowdown, whole-node gangs) on the first window and the first ``--gpus``: one
queue per Philly virtual cluster against one queue, for the ``gpupool`` and ``gittins`` job policies.
``--rescore JSON`` recomputes references and checks of an earlier result (e.g. once more peer windows ran).

Output: ``job_order.json`` and ``job_order.md`` in ``--out`` (default ``benchmarks/results``).

Usage::

    .venv/bin/python benchmarks/bench_job_order.py --fairness           # 4 windows x 2 clusters, ~6 min
    .venv/bin/python benchmarks/bench_job_order.py --offsets 0 --gpus 384 --orders las,gittins
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from _common import int_at_least, int_list, json_safe, machine_info

REPO = Path(__file__).resolve().parents[1]
PHILLY = REPO.parent / "shared" / "traces" / "philly_pollux" / "philly.csv"
RESULTS = REPO / "benchmarks" / "results"

ORDERS: dict[str, dict] = {
    "las": {},
    "las-tiresias": {"thresholds": (3250.0, 7200.0), "promote_knob": None},
    "gittins": {"order": "gittins", "promote_knob": 1.0},
    "gittins-knob8": {"order": "gittins"},
    "gittins-bounded": {"order": "gittins", "promote_knob": 1.0, "max_preemptions": 20,
                        "protect_after_s": 100 * 3600.0},
    "remaining": {"order": "remaining"},
    "remaining-est1": {"order": "remaining", "promote_knob": 1.0},
    "remaining-exact": {"order": "remaining", "promote_knob": 1.0},
}
"""Order name -> PoolConfig overrides of the ``gpupool`` job policy."""

SIM_OPTIONS: dict[str, dict] = {
    "remaining-est1": {"size_estimate_error": 1.0},
    "remaining-exact": {"size_estimate_error": 0.0},
}
"""Order name -> JobSimConfig overrides: jobs that carry an estimate of their size (``PoolJob.size_estimate``)."""
CLAIRVOYANT = frozenset({"remaining-exact"})
"""Rows that know every job's exact size in advance: a bound on what size knowledge can win, not a policy."""

ISSUE14 = {  # issue 14's table (Tiresias simulator at its pinned commit, first 5,000 jobs): mean, p95, p99 (h)
    384: {"tiresias-L": (12.47, 26.68, 314.0), "tiresias-G": (10.94, 13.24, 371.0)},
    320: {"tiresias-L": (13.77, 34.25, 364.0), "tiresias-G": (12.06, 13.24, 407.0)},
}


def window(jobs: list, first: int, offset: int) -> list:
    """``jobs[offset:offset + first]``, submission from the window's first job, whole seconds, one queue."""
    from gpupool.traces.jobs import JobRecord

    w = jobs[offset:offset + first]
    if not w:
        raise SystemExit(f"empty window at offset {offset}")
    t0 = w[0].submit_time
    return [JobRecord(j.job_id, float(round(j.submit_time - t0)), float(max(1, round(j.duration))), j.num_gpu, "",
                      j.line) for j in w]


def cluster(gpus: int) -> list:
    from gpupool.clusterspec import cluster_from_dict

    return cluster_from_dict({"apiVersion": "gpupool.io/v1alpha1", "kind": "Cluster",
                              "metadata": {"name": f"g8-{gpus}"},
                              "spec": {"nodePools": [{"name": "g8", "count": gpus // 8, "gpuModel": "V100M16",
                                                      "gpusPerNode": 8, "cpuCores": 128, "memoryGiB": 1024,
                                                      "nvlink": True}]}})


def summary(res) -> dict:
    done = [j for j in res.jobs if j["status"] == "finished"]
    jct = np.array([j["jct"] for j in done]) / 3600.0
    sub = np.array([j["submit"] for j in done]) / 3600.0
    end = np.array([j["end"] for j in done]) / 3600.0
    pre = [j["preemptions"] for j in done]
    return {"finished": len(done), "unfinished": len(res.jobs) - len(done), "mean_jct_h": float(jct.mean()),
            "p95_jct_h": float(np.percentile(jct, 95)), "p99_jct_h": float(np.percentile(jct, 99)),
            "max_jct_h": float(jct.max()), "makespan_h": float(end.max() - sub.min()),
            "preemptions": int(sum(pre)), "max_preemptions_per_job": int(max(pre))}


def run_one(jobs: list, gpus: int, order: str, place: str) -> dict:
    from gpupool.engine.pool.scheduler import job_policy
    from gpupool.sim.jobs import JobSimConfig, run_jobs
    from gpupool.topology import TIERS, TopologyConfig

    _, pool = job_policy("gpupool")
    cfg = JobSimConfig(pool=replace(pool, **ORDERS[order]), restart_overhead_s=0.0,
                       topology=TopologyConfig(factors={t: 1.0 for t in TIERS}),
                       max_gpus_per_pod=1 if place == "count" else None, **SIM_OPTIONS.get(order, {}))
    t0 = time.perf_counter()
    res = run_jobs(cluster(gpus), jobs, "gpupool", seed=42, config=cfg)
    row = {"order": order, "place": place, "gpus": gpus, **summary(res), "wall_s": time.perf_counter() - t0}
    return row


def fairness_section(trace: list, n: int, gpus: int, policies: tuple[str, ...] = ("gpupool", "gittins")) -> dict:
    """The cost of fairness with gpupool's shipped model (30 s restart overhead, topology slowdown, whole-node
    gangs): the first ``n`` jobs with one queue per Philly virtual cluster (quotas by GPU-time demand) and
    in one queue, per job policy (:func:`gpupool.sim.fairness.fairness_cost`)."""
    from gpupool.sim.fairness import fairness_cost, one_queue
    from gpupool.sim.jobs import run_jobs

    jobs = [replace(j, submit_time=j.submit_time - trace[0].submit_time) for j in trace[:n]]
    out = {"jobs": n, "gpus": gpus, "model": "shipped (JobSimConfig defaults)", "policies": {}}
    for policy in policies:
        fair = run_jobs(cluster(gpus), jobs, policy, seed=42)
        one = run_jobs(cluster(gpus), one_queue(jobs), policy, seed=42)
        out["policies"][policy] = fairness_cost(fair.jobs, one.jobs)
        print(f"fairness {policy}: {out['policies'][policy]['overall']}", flush=True)
    return out


def peer_rows(paths: list[Path], strict: bool = False) -> list[dict]:
    """Tiresias rows of peer-benchmark results (``benchmarks/tiresias/run.py`` JSON): one dict per run with
    the window (offset, jobs), GPUs, label and figures. A missing or unreadable file is skipped, unless
    ``strict`` (files named on the command line): then raises ValueError naming the file and the reason."""
    out = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            if strict:
                raise ValueError(f"{path}: cannot read peer results ({exc})") from None
            continue
        if not (isinstance(doc, dict) and isinstance(doc.get("results", []), list)
                and isinstance(doc.get("window", {}), dict)
                and all(isinstance(r, dict) for r in doc.get("results", []))
                and ("results" in doc or not strict)):
            if strict:
                raise ValueError(f"{path}: not a results file of benchmarks/tiresias/run.py "
                                 "(need an object with a 'results' list and a 'window' object)")
            continue
        w = doc.get("window", {})
        for r in doc.get("results", []):
            if r.get("simulator") != "tiresias":
                continue
            label = {"dlas-gpu": "tiresias-L", "dlas-gpu-gittins": "tiresias-G", "fifo": "tiresias-fifo"}.get(
                str(r.get("policy")).split(":")[0], r.get("policy"))
            out.append({"offset": w.get("offset", 0), "jobs": w.get("jobs"), "gpus": r.get("gpus"), "label": label,
                        "mean_jct_h": r.get("mean_jct_h"), "p95_jct_h": r.get("p95_jct_h"),
                        "p99_jct_h": r.get("p99_jct_h"), "makespan_h": r.get("makespan_h"),
                        "source": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path.name)})
    return out


def reference(peer: list[dict], offset: int, n: int, gpus: int, rows: list[dict]) -> dict:
    """Tiresias-G's mean/p95 and Tiresias-L's p99/makespan for a window, with where each came from."""
    ref: dict = {}
    for p in peer:
        if (p["offset"], p["jobs"], p["gpus"]) == (offset, n, gpus) and p["label"] in ("tiresias-L", "tiresias-G"):
            ref[p["label"]] = {k: p[k] for k in ("mean_jct_h", "p95_jct_h", "p99_jct_h", "makespan_h")}
            ref[p["label"]]["source"] = p["source"]
    if offset == 0 and n == 5000 and gpus in ISSUE14:
        for label, (mean, p95, p99) in ISSUE14[gpus].items():
            ref.setdefault(label, {"mean_jct_h": mean, "p95_jct_h": p95, "p99_jct_h": p99, "makespan_h": None,
                                   "source": "issue 14 table (Tiresias simulator)"})
    proxy = next((r for r in rows if r["order"] == "las-tiresias" and r["place"] == "count"), None)
    if proxy is not None:
        lref = ref.setdefault("tiresias-L", {"mean_jct_h": None, "p95_jct_h": None, "p99_jct_h": None,
                                             "makespan_h": None, "source": ""})
        for k in ("p99_jct_h", "makespan_h"):
            if lref.get(k) is None:
                lref[k] = proxy[k]
                lref["source"] += f"; {k} from gpupool las-tiresias count (proxy)"
    return ref


def check(row: dict, ref: dict) -> dict:
    g, lref = ref.get("tiresias-G", {}), ref.get("tiresias-L", {})

    def le(a, b):  # both unrounded (the peer's figures come from its logs, whole seconds like ours), up to 1e-9 h
        return None if b is None else bool(a <= b + 1e-9)

    return {"mean_le_G": le(row["mean_jct_h"], g.get("mean_jct_h")),
            "p95_le_G": le(row["p95_jct_h"], g.get("p95_jct_h")),
            "p99_le_L": le(row["p99_jct_h"], lref.get("p99_jct_h")),
            "makespan_le_L": le(row["makespan_h"], lref.get("makespan_h"))}


def markdown(doc: dict) -> str:
    m = doc["machine"]
    lines = ["# Job order beside Tiresias-L / Tiresias-G (issue 14)", "",
             f"Machine: {m.get('cpu')}, {m.get('cores')} cores (shared), Python {m.get('python')}, "
             f"NumPy {m.get('numpy')}; load average {m.get('load_average')}. Command: `{doc['command']}`.", "",
             "Matched model: no restart overhead, no topology slowdown, one queue, seed 42; JCT = end - submit "
             "(h). `count`: 1-GPU pods anywhere (the peer's `--scheme=count`); `node`: gpupool's whole-node "
             "gangs. Check marks: mean and p95 <= Tiresias-G, p99 and makespan <= Tiresias-L (sources below "
             "each table). `remaining-est1`: every job carries a size estimate off by exp(N(0, 1)); a row marked "
             "(clairvoyant) knows every job's exact size at submission (estimates count from the first finished job "
             "on): what size knowledge can win within the LAS levels, not a policy.", ""]
    for w in doc["windows"]:
        lines += [f"## jobs {w['offset']:,}-{w['offset'] + w['jobs']:,} on {w['gpus']} GPUs "
                  f"(offered load {w['load']:.2f}, mean duration {w['mean_duration_h']:.2f} h, "
                  f"p95 duration {w['p95_duration_h']:.2f} h)", "",
                  "| order | place | mean | p95 | p99 | makespan | preemptions (max/job) | checks |",
                  "|---|---|---|---|---|---|---|---|"]
        for label in ("tiresias-L", "tiresias-G"):
            r = w["reference"].get(label)
            if r:
                f = [("-" if r.get(k) is None else f"{r[k]:.2f}") for k in ("mean_jct_h", "p95_jct_h")]
                f += [("-" if r.get(k) is None else f"{r[k]:.1f}") for k in ("p99_jct_h", "makespan_h")]
                lines.append(f"| **{label}** | count | {f[0]} | {f[1]} | {f[2]} | {f[3]} | | |")
        for r in w["rows"]:
            c = r["checks"]
            marks = " ".join(f"{k.split('_')[0]}{'✓' if v else ('✗' if v is False else '?')}" for k, v in c.items())
            name = f"{r['order']} (clairvoyant)" if r["order"] in CLAIRVOYANT else r["order"]
            lines.append(f"| {name} | {r['place']} | {r['mean_jct_h']:.2f} | {r['p95_jct_h']:.2f} | "
                         f"{r['p99_jct_h']:.1f} | {r['makespan_h']:.1f} | {r['preemptions']:,} "
                         f"({r['max_preemptions_per_job']}) | {marks} |")
        srcs = {k: v.get("source") for k, v in w["reference"].items()}
        lines += ["", "Reference sources: " + "; ".join(f"{k}: {v}" for k, v in srcs.items()), ""]
    fc = doc.get("fairness_cost")
    if fc:
        lines += [f"## Cost of fairness: first {fc['jobs']:,} jobs on {fc['gpus']} GPUs, {fc['model']}", "",
                  "One queue per Philly virtual cluster (fair share) against one queue; JCT in hours; cost = "
                  "fair share - one queue.", "",
                  "| policy | queue | jobs | mean fair | mean one queue | mean cost | p95 fair | p95 one queue | "
                  "p95 cost |", "|---|---|---|---|---|---|---|---|---|"]
        for policy, cost in fc["policies"].items():
            for q, r in [("**all**", cost["overall"]), *cost["queues"].items()]:
                lines.append(f"| {policy} | {q} | {r['jobs']:,} | {r['fair_mean_jct_h']:.2f} | "
                             f"{r['one_queue_mean_jct_h']:.2f} | {r['mean_cost_h']:+.2f} | {r['fair_p95_jct_h']:.2f} | "
                             f"{r['one_queue_p95_jct_h']:.2f} | {r['p95_cost_h']:+.2f} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _names(ap: argparse.ArgumentParser, option: str, text: str, known) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in known]
    if bad:
        ap.error(f"argument {option}: unknown {', '.join(map(repr, bad))}; known: {', '.join(known)}")
    if not names:
        ap.error(f"argument {option}: no value in {text!r}")
    return names


def _rel(path: Path) -> str:
    return os.path.relpath(path, REPO) if path.is_relative_to(REPO.parent) else str(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_job_order.py", description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int_at_least(1), default=5000, help="jobs per window (default 5000)")
    ap.add_argument("--offsets", default="0,5000,10000,15000",
                    help="window starts, comma-separated ints >= 0 (default 0,5000,10000,15000)")
    ap.add_argument("--gpus", default="384,320",
                    help="cluster sizes, comma-separated positive multiples of 8 (8-GPU nodes; default 384,320)")
    ap.add_argument("--orders", default=",".join(ORDERS), help=f"orders (default all: {', '.join(ORDERS)})")
    ap.add_argument("--places", default="count,node", help="placements, of count, node (default count,node)")
    ap.add_argument("--node-orders", default="las,gittins",
                    help="orders also run with place=node (default las,gittins)")
    ap.add_argument("--trace", type=Path, default=PHILLY,
                    help=f"Philly job trace (CSV; default {_rel(PHILLY)})")
    ap.add_argument("--out", type=Path, default=RESULTS,
                    help=f"folder for job_order.json and job_order.md (default {_rel(RESULTS)})")
    ap.add_argument("--peer-results", type=Path, nargs="*", default=None,
                    help="Tiresias results of benchmarks/tiresias/run.py (JSON) for the reference rows; a named "
                         "file must exist and be valid (default: every benchmarks/results/tiresias_peer*.json, "
                         "unreadable ones skipped)")
    ap.add_argument("--fairness", action="store_true",
                    help="also measure the cost of fairness (first window, first --gpus, shipped model)")
    ap.add_argument("--rescore", type=Path, default=None, metavar="JSON",
                    help="no runs: recompute the references and checks of an earlier job_order.json")
    args = ap.parse_args(argv)
    offsets = int_list(ap, "--offsets", args.offsets, minimum=0)
    gpu_sizes = int_list(ap, "--gpus", args.gpus, minimum=8, multiple=8)
    orders = _names(ap, "--orders", args.orders, ORDERS)
    places = _names(ap, "--places", args.places, ("count", "node"))
    node_orders = set(_names(ap, "--node-orders", args.node_orders, ORDERS)) if args.node_orders.strip(",") else set()
    sys.path.insert(0, str(REPO / "src"))
    from gpupool.traces import load_jobs

    if args.peer_results is None:
        peer = peer_rows(sorted(RESULTS.glob("tiresias_peer*.json")))
    else:
        try:
            peer = peer_rows(args.peer_results, strict=True)
        except ValueError as exc:
            ap.error(f"argument --peer-results: {exc}")

    def trace() -> list:
        if not args.trace.is_file():
            ap.error(f"argument --trace: {args.trace} is not a file (the Philly trace of ../shared/traces)")
        try:
            return load_jobs(args.trace)
        except (OSError, ValueError) as exc:  # TraceFormatError is a ValueError naming file, line and column
            ap.error(f"argument --trace: {exc}")

    if args.rescore is not None:
        try:
            doc = json.loads(args.rescore.read_text())
            for w in doc["windows"]:
                w["reference"] = reference(peer, w["offset"], w["jobs"], w["gpus"], w["rows"])
                for row in w["rows"]:
                    row["checks"] = check(row, w["reference"])
            markdown(doc)
        except (OSError, ValueError) as exc:
            ap.error(f"argument --rescore: {args.rescore}: {exc}")
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            ap.error(f"argument --rescore: {args.rescore} is not a job_order.json ({type(exc).__name__}: {exc})")
        if args.fairness:
            doc["fairness_cost"] = fairness_section(trace(), args.jobs, gpu_sizes[0])
        return write(doc, args.out)
    jobs_all = trace()
    past = [o for o in offsets if o >= len(jobs_all)]
    if past:
        ap.error(f"argument --offsets: {past[0]} is past the {len(jobs_all):,} jobs of {args.trace}")
    doc = {"benchmark": "job_order", "command": " ".join(["benchmarks/bench_job_order.py", *(argv or sys.argv[1:])]),
           "machine": machine_info(), "orders": {k: {kk: list(v) if isinstance(v, tuple) else v
                                                       for kk, v in ORDERS[k].items()} for k in orders},
           "sim_options": {k: SIM_OPTIONS[k] for k in orders if k in SIM_OPTIONS},
           "clairvoyant": sorted(CLAIRVOYANT & set(orders)),
           "windows": []}
    for offset in offsets:
        jobs = window(jobs_all, args.jobs, offset)
        dur = np.array([j.duration for j in jobs]) / 3600.0
        span = max(j.submit_time for j in jobs) / 3600.0
        gpu_h = float(sum(j.duration * j.num_gpu for j in jobs) / 3600.0)
        for gpus in gpu_sizes:
            rows = []
            for place in places:
                for order in (o for o in orders if place != "node" or o in node_orders):
                    row = run_one(jobs, gpus, order, place)
                    rows.append(row)
                    print(f"jobs {offset}+{args.jobs} {gpus} GPUs {order:16s} {place:5s} mean {row['mean_jct_h']:6.2f}"
                          f" p95 {row['p95_jct_h']:6.2f} p99 {row['p99_jct_h']:6.1f} makespan {row['makespan_h']:7.1f}"
                          f" ({row['wall_s']:.0f} s)", flush=True)
            ref = reference(peer, offset, args.jobs, gpus, rows)
            for row in rows:
                row["checks"] = check(row, ref)
            doc["windows"].append({"offset": offset, "jobs": args.jobs, "gpus": gpus, "gpu_hours": gpu_h,
                                   "load": gpu_h / (span * gpus) if span > 0 else float("nan"),
                                   "mean_duration_h": float(dur.mean()),
                                   "p95_duration_h": float(np.percentile(dur, 95)), "reference": ref, "rows": rows})
    if args.fairness:
        doc["fairness_cost"] = fairness_section(jobs_all, args.jobs, gpu_sizes[0])
    return write(doc, args.out)


def write(doc: dict, out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "job_order.json").write_text(json.dumps(json_safe(doc), indent=1) + "\n")
    (out / "job_order.md").write_text(markdown(doc))
    print(f"wrote {out / 'job_order.json'} and {out / 'job_order.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
