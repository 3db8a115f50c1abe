"""Placement decisions per second and peak memory of every registered gpupool policy.

Method
------
For each (cluster, policy) pair the driver starts a fresh subprocess of this same script
(``--one CLUSTER POLICY``), so that no measurement inherits caches, allocator state or resident memory
from another. Each subprocess runs on one core and one thread: ``OMP_NUM_THREADS``,
``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS`` (and their siblings) are set to 1 at the top of this file,
before NumPy is imported, and the child is pinned to a single CPU where the OS allows it.

Inside the subprocess:

1. The cluster and the pod stream are built (not timed, not traced; identical for every policy):

   * ``openb``: the 1,213-node / 6,212-GPU node list and the default pod list of the Alibaba
     ``cluster-trace-gpu-v2023`` trace embedded in the package; the pod stream is the inflation
     protocol's, ``build_inflation_workload(pods, capacity, 1.3, seed)`` (the trace shuffled, then
     resampled until the submitted GPU demand reaches 1.3 x capacity).
   * ``synthetic``: 5,000 nodes x 8 GPUs = 40,000 GPUs; GPU model drawn per node (60 % ``A100-80GB``,
     25 % ``H100``, 15 % ``L40S``), 64-128 cores and 512-2048 GiB memory per node, all from ``--seed``.
     Pods are resampled (with replacement, from ``--seed``) from the openb default pods until the GPU
     demand reaches 1.3 x capacity or ``--max-pods`` pods (default 20,000), whichever comes first; at the
     default cap the stream reaches only a fraction of capacity (the ``demand`` column says how much),
     so this measures decisions on a large, partly filled cluster. The openb pods' ``gpu_spec``
     (G2, T4, P100, V100... models that the synthetic cluster does not have) is dropped, otherwise
     about 15 % of the pods could never be placed and would only exercise the failure path.

   The engine is ``Engine(state, policy, seed, workload=trace_pods)``, as in ``run_inflation``: the
   policy learns the typical workload (FGD, gpupool) from the trace pods, not from the inflated stream.

2. **Timed pass** (no tracing): every pod of the stream is handed to ``engine.place`` once, in order;
   pods never leave and a pod that fits nowhere fails. Only the wall time of the ``engine.place`` calls
   is summed (``time.perf_counter`` around each call), so building the stream, the engine and
   ``policy.prepare`` are not counted. ``decisions`` = placed + failed = pods in the stream;
   ``decisions/s`` = decisions / summed seconds. Per-decision p50 / p99 latencies come from the same
   timings. Afterwards ``ru_maxrss`` of the subprocess (peak resident set of the whole process:
   interpreter, NumPy, the trace, the cluster, the engine) is read.
3. **Traced pass**: the same run on a fresh cluster and engine with ``tracemalloc`` on, started just
   before the ``ClusterState`` is built and stopped after the last pod: its peak is the most Python and
   NumPy heap the cluster state, the policy's model, the engine's score caches and the assignments held
   at once (the trace and the pod stream, shared input, are excluded). tracemalloc slows allocation
   several-fold, which is why its pass is not the timed one. The two passes must agree on the number of
   pods placed (same seed), which the subprocess checks.

Output: a JSON file and a Markdown table (``--out``, default ``benchmarks/results``) with, per
(cluster, policy): pods, decisions, placed, failed, demand (submitted GPU demand / capacity), seconds,
decisions/s, p50 and p99 latency, tracemalloc peak MiB, maxrss MiB; and the machine (CPU model, cores,
Python and NumPy versions, load average, date).

Target: ``gpupool`` and ``fgd`` >= 2,000 decisions/s on one core on the 5,000-node synthetic cluster.
For scale, kube-scheduler's CI performance floor for scheduling pods with extended resources on a
5,000-node cluster is 180 pods/s.

Usage::

    python benchmarks/bench_decisions.py                       # everything (make bench)
    python benchmarks/bench_decisions.py --clusters synthetic --policies gpupool,fgd --max-pods 5000
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
             "NUMEXPR_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from dataclasses import replace  # noqa: E402
from importlib import resources  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import int_at_least, int_list, json_safe, pin_one_cpu  # noqa: E402
from gpupool.cluster import ClusterState  # noqa: E402
from gpupool.engine.core import Engine  # noqa: E402
from gpupool.model import NodeSpec, PodRequest  # noqa: E402
from gpupool.policies import REGISTRY, make_policy  # noqa: E402
from gpupool.sim.inflation import build_inflation_workload  # noqa: E402
from gpupool.traces import load_openb_nodes, load_openb_pods  # noqa: E402

CLUSTERS = ("openb", "synthetic")
RATIO = 1.3
TARGET_DPS = 2000.0
TARGET_POLICIES = ("gpupool", "fgd")
K8S_FLOOR_PODS_PER_S = 180.0
DEFAULT_OUT = Path(__file__).resolve().parent / "results"

SYN_NODES = 5000
SYN_GPUS_PER_NODE = 8
SYN_MODELS = ("A100-80GB", "H100", "L40S")
SYN_MODEL_P = (0.60, 0.25, 0.15)


# --------------------------------------------------------------------------- clusters and pod streams
def _embedded(name: str) -> Path:
    ref = resources.files("gpupool") / "data" / name
    with resources.as_file(ref) as path:  # the package is installed from a directory: a real file
        return Path(path)


def openb_trace() -> tuple[list[NodeSpec], list[PodRequest]]:
    nodes = load_openb_nodes(_embedded("openb_node_list_gpu_node.csv"))
    pods = load_openb_pods(_embedded("openb_pod_list_default.csv"))
    return nodes, pods


def synthetic_nodes(seed: int, n: int = SYN_NODES) -> list[NodeSpec]:
    """``n`` nodes x 8 GPUs of a seeded model mix, 64-128 cores, 512-2048 GiB memory."""
    rng = np.random.default_rng([seed, 1])
    models = rng.choice(len(SYN_MODELS), size=n, p=SYN_MODEL_P)
    cores = rng.integers(32, 65, size=n) * 2  # 64..128, even
    mem_gib = rng.integers(8, 33, size=n) * 64  # 512..2048 GiB in 64 GiB steps
    return [
        NodeSpec(f"syn-node-{i:05d}", int(cores[i]) * 1000, int(mem_gib[i]) * 1024, SYN_GPUS_PER_NODE,
                 SYN_MODELS[int(models[i])])
        for i in range(n)
    ]


def synthetic_stream(trace: list[PodRequest], capacity_milli: int, seed: int, max_pods: int) -> list[PodRequest]:
    """Pods resampled from ``trace`` (``gpu_spec`` dropped) until 1.3 x capacity or ``max_pods``."""
    rng = np.random.default_rng([seed, 2])
    target = RATIO * capacity_milli
    out: list[PodRequest] = []
    total = 0
    while len(out) < max_pods:
        pick = trace[int(rng.integers(len(trace)))]
        if total + pick.total_gpu_milli > target:
            break
        total += pick.total_gpu_milli
        out.append(replace(pick, name=f"{pick.name}-syn-{len(out)}", gpu_spec=()))
    return out


def build(cluster: str, seed: int, max_pods: int) -> tuple[list[NodeSpec], list[PodRequest], list[PodRequest]]:
    """(nodes, trace pods the policy learns from, pod stream to place)."""
    nodes, pods = openb_trace()
    if cluster == "openb":
        capacity = sum(n.gpu_count for n in nodes) * 1000
        return nodes, pods, build_inflation_workload(pods, capacity, RATIO, seed)
    if cluster == "synthetic":
        syn = synthetic_nodes(seed)
        capacity = sum(n.gpu_count for n in syn) * 1000
        learn = [replace(p, gpu_spec=()) for p in pods]
        return syn, learn, synthetic_stream(pods, capacity, seed, max_pods)
    raise ValueError(f"unknown cluster {cluster!r}; known: {', '.join(CLUSTERS)}")


# --------------------------------------------------------------------------- one measurement
def _run(nodes, learn, stream, policy: str, seed: int, timed: bool) -> dict:
    _warm_up()
    state = ClusterState(nodes)
    engine = Engine(state, make_policy(policy), seed=seed, workload=learn)
    n = len(stream)
    lat = np.empty(n) if timed else None
    placed = 0
    clock = time.perf_counter
    for i, pod in enumerate(stream):
        t0 = clock()
        decision = engine.place(pod)
        t1 = clock()
        if lat is not None:
            lat[i] = t1 - t0
        if decision.assignment is not None:
            placed += 1
    out = {"placed": placed, "failed": n - placed,
           "allocated_gpu_fraction": state.allocated_gpu_milli() / state.total_gpu_milli}
    if lat is not None:
        out["seconds"] = float(lat.sum())
        out["p50_ms"] = float(np.percentile(lat, 50) * 1e3) if n else float("nan")
        out["p99_ms"] = float(np.percentile(lat, 99) * 1e3) if n else float("nan")
    return out


def _warm_up() -> float:
    """Compile (or load from numba's cache) the engine's kernels before anything is timed
    (:func:`gpupool.engine.kernels.warm_up`, ``gpupool.engine.compiled.warm_up`` on a ``--baseline`` commit
    before that module was split; an engine without it is left alone); returns the seconds it took. Without it
    a kernel first needed thousands of decisions into a run compiles inside one timed decision."""
    import importlib

    for name in ("gpupool.engine.kernels", "gpupool.engine.compiled"):  # this layout, then an older commit's
        try:
            kernels = importlib.import_module(name)
        except ImportError:
            continue
        warm = getattr(kernels, "warm_up", None)
        return float(sum(warm().values())) if warm is not None else 0.0
    return 0.0


def _maxrss_mib() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


def measure_one(cluster: str, policy: str, seed: int, max_pods: int, trace_memory: bool = True) -> dict:
    nodes, learn, stream = build(cluster, seed, max_pods)
    capacity = sum(n.gpu_count for n in nodes) * 1000
    timed = _run(nodes, learn, stream, policy, seed, timed=True)
    maxrss = _maxrss_mib()
    peak = float("nan")
    if trace_memory:
        tracemalloc.start()
        traced = _run(nodes, learn, stream, policy, seed, timed=False)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        if traced["placed"] != timed["placed"]:
            raise RuntimeError(f"{cluster}/{policy}: timed pass placed {timed['placed']} pods, "
                               f"traced pass {traced['placed']} (non-deterministic run?)")
    n = len(stream)
    return {
        "cluster": cluster,
        "policy": policy,
        "nodes": len(nodes),
        "gpus": capacity // 1000,
        "pods": n,
        "decisions": timed["placed"] + timed["failed"],
        "placed": timed["placed"],
        "failed": timed["failed"],
        "demand": sum(p.total_gpu_milli for p in stream) / capacity,
        "allocated": timed["allocated_gpu_fraction"],
        "seconds": timed["seconds"],
        "decisions_per_s": n / timed["seconds"] if timed["seconds"] > 0 else float("nan"),
        "p50_ms": timed["p50_ms"],
        "p99_ms": timed["p99_ms"],
        "tracemalloc_peak_mib": peak,
        "maxrss_mib": maxrss,
    }


# --------------------------------------------------------------------------- decision cost against cluster size
SCALING_NODES = (1000, 5000, 20000)
SCALING_FILL = 0.9
SCALING_WARMUP = 3000
SCALING_WINDOW = 5000
SCALING_TARGET_RATIO = 1.5
SCALING_TARGET_DPS = 10_000.0
PREFILL_TRIES = 8


def _pod_source(trace: list[PodRequest], seed: int, tag: str):
    """Endless pods resampled (with replacement, seeded) from ``trace``, ``gpu_spec`` dropped, named uniquely."""
    rng = np.random.default_rng([seed, 3])
    i = 0
    while True:
        for j in rng.integers(len(trace), size=4096).tolist():
            yield replace(trace[j], name=f"{tag}-{i}", gpu_spec=())
            i += 1


def _prefill(engine: Engine, source, fill: float, rng: np.random.Generator) -> list[str]:
    """Untimed: pods from ``source`` put on random nodes with room (up to PREFILL_TRIES nodes each, else the pod
    is skipped; GPUs best-fit) until ``fill`` of the GPU capacity is taken: a spread, partly filled cluster.
    Returns the names of the pods placed."""
    from gpupool.engine.core import best_fit_gpus
    from gpupool.engine.filters import fitting_gpus

    state, policy = engine.state, engine.policy
    target = fill * state.total_gpu_milli
    placed = misses = 0
    running: list[str] = []
    while placed < target and misses < 20_000:
        pod = next(source)
        misses += 1
        eff = policy.effective(pod)
        for node in rng.integers(state.n_nodes, size=PREFILL_TRIES).tolist():
            if state.cpu_free[node] < pod.cpu_milli or state.mem_free[node] < pod.memory_mib:
                continue
            if pod.num_gpu and len(fitting_gpus(state, eff, node)) < pod.num_gpu:
                continue
            assignment = state.allocate(pod, node, best_fit_gpus(state, eff, node), eff.gpu_milli if pod.num_gpu
                                        else None)
            policy.on_allocate(state, assignment)
            running.append(pod.name)
            placed += pod.total_gpu_milli
            misses = 0
            break
    return running


def measure_scaling(n_nodes: int, policy: str, seed: int, fill: float, warmup: int, window: int) -> dict:
    """Steady-state cost of one decision on a cluster of ``n_nodes``: prefill to ``fill`` (untimed), one
    ``engine.schedule`` of each request class of the trace (timed apart: the first decision of a class), then
    ``warmup`` + ``window`` arrivals through ``engine.place``, each placed pod followed by the release of a
    random running pod (untimed), so the fill stays put; the ``window`` decisions are timed with
    ``time.process_time`` (CPU time of this process), split into scheduled and unschedulable pods, and hashed
    (node and devices, or the reason) so that two versions of the engine can be checked to decide alike."""
    import hashlib

    warm_s = _warm_up()
    _, trace = openb_trace()
    learn = [replace(p, gpu_spec=()) for p in trace]
    state = ClusterState(synthetic_nodes(seed, n_nodes))
    engine = Engine(state, make_policy(policy), seed=seed, workload=learn)
    rng = np.random.default_rng([seed, 4])
    source = _pod_source(trace, seed, "s")
    running = _prefill(engine, source, fill, rng)
    filled = state.allocated_gpu_milli() / state.total_gpu_milli
    # every request class of the trace decided once (engine.schedule: nothing placed), as on a cluster that has
    # been running: the first decision of a class scores every node (timed apart: us_first_of_class)
    classes = {}
    for p in trace:
        classes.setdefault(engine.policy.effective(replace(p, gpu_spec=())).key(), replace(p, gpu_spec=()))
    t0 = time.process_time()
    for p in classes.values():
        engine.schedule(p)
    first_of_class = (time.process_time() - t0) / len(classes)
    digest = hashlib.sha256()
    sched_t, fail_t = [], []
    clock = time.process_time
    for step in range(warmup + window):
        pod = next(source)
        t0 = clock()
        decision = engine.place(pod)
        t1 = clock()
        if decision.assignment is not None:
            j = int(rng.integers(len(running)))
            running[j], running[-1] = running[-1], running[j]
            engine.release(running.pop())
            running.append(pod.name)
        if step < warmup:
            continue
        a = decision.assignment
        digest.update(repr((a.node, a.gpus) if a is not None else decision.reason).encode())
        (sched_t if a is not None else fail_t).append(t1 - t0)
    total = sum(sched_t) + sum(fail_t)
    return {
        "nodes": n_nodes, "policy": policy, "gpus": int(state.total_gpus), "fill_after_prefill": filled,
        "fill_at_end": state.allocated_gpu_milli() / state.total_gpu_milli, "warmup": warmup,
        "decisions": window, "scheduled": len(sched_t), "unschedulable": len(fail_t), "cpu_seconds": total,
        "us_per_decision": total / window * 1e6, "decisions_per_s": window / total if total else float("nan"),
        "us_scheduled": float(np.mean(sched_t)) * 1e6 if sched_t else float("nan"),
        "us_unschedulable": float(np.mean(fail_t)) * 1e6 if fail_t else float("nan"),
        "p99_us": float(np.percentile(sched_t + fail_t, 99)) * 1e6,
        "classes": len(classes), "us_first_of_class": first_of_class * 1e6,
        "decisions_sha256": digest.hexdigest()[:16],
        "warm_up_s": warm_s,
    }


def _baseline_src(commit: str) -> Path:
    """``src/`` of ``commit`` extracted to a temporary directory (git archive), for a before/after run."""
    import tarfile
    import tempfile

    root = Path(__file__).resolve().parents[1]
    out = Path(tempfile.mkdtemp(prefix="gpupool-baseline-"))
    data = subprocess.run(["git", "-C", str(root), "archive", commit, "src"], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=__import__("io").BytesIO(data)) as tar:
        tar.extractall(out, filter="data")
    return out / "src"


def scaling_main(args: argparse.Namespace) -> int:
    nodes = [int(x) for x in _csv(args.scaling)]
    policies = _csv(args.policies) if args.policies != ",".join(REGISTRY) else ["gpupool", "fgd"]
    versions = [("current", None)]
    if args.baseline:
        versions.insert(0, (f"baseline {args.baseline}", _baseline_src(args.baseline)))
    machine = machine_info()
    rows: list[dict] = []
    for policy in policies:
        for n in nodes:
            for label, src in versions:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--scaling-one", str(n), policy,
                       "--seed", str(args.seed), "--fill", str(args.fill), "--warmup", str(args.warmup),
                       "--window", str(args.window)] + ["--no-pin"] * args.no_pin
                env = dict(os.environ)
                if src is not None:
                    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False, env=env)
                if proc.returncode != 0:
                    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    row = {"nodes": n, "policy": policy, "error": f"exit {proc.returncode}: {tail}"}
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
                row["version"] = label
                rows.append(row)
                print(f"{label:24s} {policy:8s} {n:>6d} nodes " + (row.get("error") or
                      f"{row['us_per_decision']:7.1f} us/decision ({_fmt(row['us_scheduled'])} scheduled, "
                      f"{_fmt(row['us_unschedulable'])} unschedulable, {row['unschedulable']} of them) "
                      f"{row['decisions_per_s']:8.0f}/s  {row['decisions_sha256']}"), file=sys.stderr, flush=True)
                if "error" not in row and not row.get("scheduled"):
                    print(f"warning: no pod of the {row['decisions']:,} timed ones was placed at {n:,} nodes: the row "
                          "measures the unschedulable path only (the prefilled cluster is out of CPU; a longer "
                          "--warmup lets releases free room first)", file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"benchmark": "decision cost against cluster size",
              "settings": {"nodes": nodes, "policies": policies, "seed": args.seed, "fill": args.fill,
                           "warmup": args.warmup, "window": args.window, "baseline": args.baseline,
                           "clock": "time.process_time", "pinned": not args.no_pin},
              "target": {"ratio_largest_to_smallest_max": SCALING_TARGET_RATIO,
                         "gpupool_decisions_per_s_at_5000_nodes": SCALING_TARGET_DPS},
              "machine": machine, "results": rows}
    (args.out / "decisions_scaling.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    md = scaling_markdown(rows, machine, args, versions)
    (args.out / "decisions_scaling.md").write_text(md)
    print(md)
    return 1 if any("error" in r for r in rows) else 0


def _fill_range(rows: list[dict]) -> str:
    """The GPU fill the prefill reached, over the rows (e.g. ``84%-85%``)."""
    fills = [r["fill_after_prefill"] for r in rows if "fill_after_prefill" in r]
    if not fills:
        return "n/a"
    lo, hi = f"{min(fills):.0%}", f"{max(fills):.0%}"
    return lo if lo == hi else f"{lo}-{hi}"


def scaling_verdicts(rows: list[dict]) -> list[str]:
    """One line per policy of the ``current`` rows: the largest cluster's per-decision time over the smallest's
    against :data:`SCALING_TARGET_RATIO` (judged only where the target's sizes, 1,000 and 20,000 nodes, both
    ran), and for ``gpupool`` the decisions/s at 5,000 nodes against :data:`SCALING_TARGET_DPS` (met / MISSED,
    or why not measured: a row that failed or was not asked for)."""
    out = []
    cur = [r for r in rows if r.get("version") == "current" and "policy" in r and "nodes" in r]
    for policy in dict.fromkeys(r["policy"] for r in cur):
        mine = sorted((r for r in cur if r["policy"] == policy), key=lambda r: r["nodes"])
        lo, hi = mine[0], mine[-1]
        if len(mine) < 2:
            line = f"- `{policy}`: one cluster size only ({lo['nodes']:,} nodes), no ratio"
        elif "error" in lo or "error" in hi:
            bad = lo if "error" in lo else hi
            line = f"- `{policy}`: the {bad['nodes']:,}-node row failed, no ratio"
        elif not (lo.get("us_per_decision") or 0) > 0:
            line = f"- `{policy}`: no time measured at {lo['nodes']:,} nodes, no ratio"
        else:
            ratio = hi["us_per_decision"] / lo["us_per_decision"]
            if lo["nodes"] <= SCALING_NODES[0] and hi["nodes"] >= SCALING_NODES[-1]:
                verdict = "met" if ratio <= SCALING_TARGET_RATIO else "MISSED"
            else:
                verdict = (f"the target is for {SCALING_NODES[-1]:,} against {SCALING_NODES[0]:,} nodes, "
                           "not measured here")
            line = (f"- `{policy}`: {hi['nodes']:,} nodes cost {ratio:.2f}x {lo['nodes']:,} nodes per decision: "
                    f"{verdict}")
        if policy == "gpupool":
            at5k = next((r for r in mine if r["nodes"] == 5000), None)
            if at5k is None:
                line += f"; no 5,000-node row, so the {SCALING_TARGET_DPS:,.0f} decisions/s target is not measured"
            elif "error" in at5k or "decisions_per_s" not in at5k:
                line += "; the 5,000-node row failed: decisions/s target not measured"
            else:
                dps = at5k["decisions_per_s"]
                line += (f"; {dps:,.0f} decisions/s at 5,000 nodes: "
                         f"{'met' if dps >= SCALING_TARGET_DPS else 'MISSED'}")
        out.append(line + ".")
    return out


def scaling_markdown(rows: list[dict], machine: dict, args: argparse.Namespace, versions) -> str:
    lines = [
        "# Decision cost against cluster size",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores ({machine['usable_cores']} usable), load average at "
        f"start {machine['load_average_at_start']}; Python {machine['python']}, NumPy {machine['numpy']}; "
        f"{machine['date']}.",
        "The engine's numba kernels are compiled (or loaded from numba's disk cache) before anything is timed "
        "(`kernels.warm_up`, as the live scheduler does at start-up; a baseline without it compiles on first "
        "use). "
        f"Synthetic clusters (8 GPUs a node, seed {args.seed}), prefilled toward {args.fill:.0%} of the GPUs by "
        f"random fit (untimed; reached {_fill_range(rows)} of the GPUs, where CPU runs out first); one "
        "`engine.schedule` of each request class of the trace (timed apart: `ms first of a "
        f"class`, which scores every node); then {args.warmup:,} warm-up and {args.window:,} timed arrivals "
        "through `engine.place`, "
        "each placed pod followed by the release of a random running pod (untimed). CPU time "
        "(`time.process_time`) of the `place` calls, one subprocess per row, pinned to one core. Rows measured "
        "one after the other in one run on a shared machine: compare ratios within this table.",
        "",
        "| version | policy | nodes | decisions | unschedulable | us/decision | us scheduled | us unschedulable "
        "| decisions/s | ratio to smallest | ms first of a class | decisions hash |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['version']} | {r['policy']} | {r['nodes']:,} | error: {r['error']} |" + " |" * 8)
            continue
        base = next((b for b in rows if b.get("version") == r["version"] and b.get("policy") == r["policy"]
                     and "error" not in b), r)
        lines.append(
            f"| {r['version']} | {r['policy']} | {r['nodes']:,} | {r['decisions']:,} | {r['unschedulable']:,} "
            f"| {r['us_per_decision']:.1f} | {_fmt(r['us_scheduled'])} | {_fmt(r['us_unschedulable'])} "
            f"| {_fmt(r['decisions_per_s'], 0)} | {r['us_per_decision'] / base['us_per_decision']:.2f} "
            f"| {r['us_first_of_class'] / 1e3:.2f} | `{r['decisions_sha256']}` |")
    lines += ["", f"Target (issue 12): at most {SCALING_TARGET_RATIO}x the per-decision time of the smallest "
              f"cluster on the largest, and >= {SCALING_TARGET_DPS:,.0f} decisions/s for `gpupool` at 5,000 nodes."]
    lines += [""] + scaling_verdicts(rows)
    if len(versions) > 1:
        lines.append("")
        for r in rows:
            if r.get("version") != "current" or "error" in r:
                continue
            b = next((x for x in rows if x.get("version") != "current" and x.get("policy") == r["policy"]
                      and x.get("nodes") == r["nodes"] and "error" not in x), None)
            if b is not None:
                same = "identical decisions" if b["decisions_sha256"] == r["decisions_sha256"] else "DECISIONS DIFFER"
                speedup = b["us_per_decision"] / r["us_per_decision"]
                lines.append(f"- `{r['policy']}` at {r['nodes']:,} nodes: {speedup:.2f}x faster than {b['version']}; "
                             f"{same}.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- machine and report
def _cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            if line.strip().startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    return {
        "cpu": _cpu_model(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "load_average_at_start": load,
        "os": platform.platform(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or x != x else f"{x:,.{digits}f}"




def markdown(rows: list[dict], machine: dict, total_s: float, args: argparse.Namespace) -> str:
    head = ("| cluster | policy | pods | decisions | placed | demand | seconds | decisions/s | p50 ms | p99 ms "
            "| tracemalloc peak MiB | maxrss MiB |")
    lines = [
        "# Placement decisions per second",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores ({machine['usable_cores']} usable), "
        f"load average at start {machine['load_average_at_start']}; Python {machine['python']}, "
        f"NumPy {machine['numpy']}; {machine['os']}; {machine['date']}.",
        f"Seed {args.seed}, max pods (synthetic) {args.max_pods:,}; one process, one thread, one policy per "
        f"subprocess; total wall time {total_s:,.0f} s.",
        "",
        head,
        "|" + "---|" * 2 + "---:|" * 10,
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['cluster']} | {r['policy']} | error: {r['error']} |" + " |" * 9)
            continue
        lines.append(
            f"| {r['cluster']} ({r['nodes']:,} nodes / {r['gpus']:,} GPUs) | {r['policy']} | {r['pods']:,} "
            f"| {r['decisions']:,} | {r['placed']:,} | {r['demand']:.2f} | {r['seconds']:.2f} "
            f"| {_fmt(r['decisions_per_s'], 0)} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} "
            f"| {_fmt(r['tracemalloc_peak_mib'])} | {_fmt(r['maxrss_mib'])} |"
        )
    lines += [
        "",
        "`demand`: submitted GPU demand / cluster GPU capacity at the end of the stream. `seconds`: wall time "
        "of the `engine.place` calls only. `tracemalloc peak`: heap held by the cluster state, policy and "
        "engine (separate traced pass). `maxrss`: peak resident set of the measuring subprocess.",
        "",
        f"Target: {', '.join(f'`{p}`' for p in TARGET_POLICIES)} >= {TARGET_DPS:,.0f} decisions/s on one core "
        f"on the 5,000-node synthetic cluster (kube-scheduler's CI floor with extended resources at 5,000 "
        f"nodes: {K8S_FLOOR_PODS_PER_S:,.0f} pods/s).",
    ]
    checks = [r for r in rows if r.get("cluster") == "synthetic" and r.get("policy") in TARGET_POLICIES
              and "error" not in r]
    for r in checks:
        ok = r["decisions_per_s"] >= TARGET_DPS
        lines.append(f"- `{r['policy']}`: {_fmt(r['decisions_per_s'], 0)} decisions/s: "
                     f"{'meets' if ok else 'BELOW'} the target.")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI
def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clusters", default=",".join(CLUSTERS), help="comma list of: " + ", ".join(CLUSTERS))
    p.add_argument("--policies", default=",".join(REGISTRY), help="comma list (default: every registered policy)")
    p.add_argument("--seed", type=int, default=42, help="seed of the pod streams, the synthetic cluster and ties")
    p.add_argument("--max-pods", type=int, default=20000, help="cap on the synthetic pod stream (default 20000)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="directory for decisions.json / decisions.md")
    p.add_argument("--no-tracemalloc", action="store_true", help="skip the traced pass (halves the time)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each subprocess to one CPU")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per (cluster, policy) subprocess")
    p.add_argument("--one", nargs=2, metavar=("CLUSTER", "POLICY"), help=argparse.SUPPRESS)
    p.add_argument("--scaling", metavar="NODES", nargs="?", const=",".join(map(str, SCALING_NODES)),
                   help="measure the steady-state decision cost on synthetic clusters of these sizes (comma list, "
                        "default 1000,5000,20000; policies default gpupool,fgd) into decisions_scaling.{json,md}")
    p.add_argument("--baseline", metavar="COMMIT", help="with --scaling: also measure the engine of this git commit, "
                                                        "row by row beside the current one")
    p.add_argument("--fill", type=float, default=SCALING_FILL, help="with --scaling: prefill share of the GPUs")
    p.add_argument("--warmup", type=int_at_least(0), default=SCALING_WARMUP,
                   help="with --scaling: untimed arrivals first")
    p.add_argument("--window", type=int_at_least(1), default=SCALING_WINDOW, help="with --scaling: timed arrivals")
    p.add_argument("--scaling-one", nargs=2, metavar=("NODES", "POLICY"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.max_pods < 1:
        p.error("--max-pods must be >= 1")
    if args.scaling is not None:
        args.scaling = ",".join(map(str, dict.fromkeys(int_list(p, "--scaling", args.scaling, minimum=1))))
    if not (0.0 < args.fill <= 1.0):
        p.error(f"argument --fill: must be a share of the GPUs in (0, 1], got {args.fill}")
    return args




def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.scaling_one:
        if not args.no_pin:
            pin_one_cpu()
        n, policy = args.scaling_one
        print(json.dumps(json_safe(measure_scaling(int(n), policy, args.seed, args.fill, args.warmup, args.window))))
        return 0
    if args.scaling:
        return scaling_main(args)
    if args.one:
        cluster, policy = args.one
        if not args.no_pin:
            pin_one_cpu()
        row = measure_one(cluster, policy, args.seed, args.max_pods, trace_memory=not args.no_tracemalloc)
        print(json.dumps(row))
        return 0

    clusters, policies = _csv(args.clusters), _csv(args.policies)
    bad = [c for c in clusters if c not in CLUSTERS] + [p for p in policies if p not in REGISTRY]
    if bad:
        print(f"unknown cluster/policy: {', '.join(bad)}; clusters: {', '.join(CLUSTERS)}; "
              f"policies: {', '.join(REGISTRY)}", file=sys.stderr)
        return 2
    machine = machine_info()
    rows: list[dict] = []
    start = time.perf_counter()
    for cluster in clusters:
        for policy in policies:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", cluster, policy,
                   "--seed", str(args.seed), "--max-pods", str(args.max_pods)]
            cmd += ["--no-tracemalloc"] * args.no_tracemalloc + ["--no-pin"] * args.no_pin
            t0 = time.perf_counter()
            try:
                proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, check=False)
                if proc.returncode != 0:
                    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                    row = {"cluster": cluster, "policy": policy, "error": f"exit {proc.returncode}: {tail}"}
                else:
                    row = json.loads(proc.stdout.strip().splitlines()[-1])
            except subprocess.TimeoutExpired:
                row = {"cluster": cluster, "policy": policy, "error": f"timeout after {args.timeout:g} s"}
            row["subprocess_seconds"] = time.perf_counter() - t0
            rows.append(row)
            if "error" in row:
                print(f"{cluster:9s} {policy:14s} ERROR {row['error']}", file=sys.stderr, flush=True)
            else:
                print(f"{cluster:9s} {policy:14s} {row['decisions']:>6d} decisions {row['seconds']:8.2f} s "
                      f"{row['decisions_per_s']:9.0f}/s  peak {row['tracemalloc_peak_mib']:.1f} MiB "
                      f"rss {row['maxrss_mib']:.0f} MiB  ({row['subprocess_seconds']:.0f} s)",
                      file=sys.stderr, flush=True)
    total = time.perf_counter() - start

    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "benchmark": "placement decisions per second",
        "settings": {"clusters": clusters, "policies": policies, "seed": args.seed, "max_pods": args.max_pods,
                     "ratio": RATIO, "tracemalloc": not args.no_tracemalloc, "pinned": not args.no_pin},
        "target": {"policies": list(TARGET_POLICIES), "cluster": "synthetic", "decisions_per_s": TARGET_DPS,
                   "kube_scheduler_floor_pods_per_s": K8S_FLOOR_PODS_PER_S},
        "machine": machine,
        "total_seconds": total,
        "results": rows,
    }
    (args.out / "decisions.json").write_text(json.dumps(json_safe(report), indent=2) + "\n")
    md = markdown(rows, machine, total, args)
    (args.out / "decisions.md").write_text(md)
    print(md)
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
