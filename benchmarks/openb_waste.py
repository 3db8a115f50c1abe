"""Where the GPU capacity goes that a policy leaves unallocated at 100% arrived demand (openb, inflation protocol).

For each (variant, seed, policy) the script replays the same arrival sequence as
``benchmarks/openb_allocation.py`` (:func:`gpupool.sim.inflation.build_inflation_workload`, the engine with the
policy, pods that fit nowhere dropped) up to the pod at which the arrived GPU demand first reaches 100% of
capacity, and splits the free GPU share of the cluster at that moment (in GPUs) into:

* ``whole``: GPUs with nothing on them;
* ``beside_large``: the free share of GPUs holding a single pod that asks at least ``LARGE_MILLI`` milli-GPU
  (openb: the 810-milli pods, 14% of the default variant's GPU demand, whose 190 milli only the rarest pods
  fit);
* ``unfillable``: the free share of other partly used GPUs that is below the smallest share any GPU pod of the
  arrived prefix asks (no pod that arrived could use it);
* ``other``: the rest (free share some arrived pod could have used, on a GPU shared by other pods).

It also reports the offline bound's waste (``100 - bound``, from ``results/openb_optimum.json``, same variant
and seed) and the waste that ``fgd + 1.0`` points (issue 12's target) allows, and the GPU demand of the pods
left out by class (``"<GPUs>x<milli>"``): the policy's failed pods beside the pods the optimum's packing leaves
out (``dropped_gpus_by_class`` in ``results/openb_optimum.json``, from ``optimum.py --node-level``).

Usage: ``python benchmarks/openb_waste.py [--variants default,...] [--seeds 10] [--policies gpupool,fgd]``;
writes ``benchmarks/results/openb_waste.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OPENB_TRACES, machine_info  # noqa: E402
from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.model import MILLI
from gpupool.policies import REGISTRY, make_policy
from gpupool.sim.inflation import build_inflation_workload
from gpupool.traces import load_openb_nodes, load_openb_pods
from optimum import pod_class  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TRACES = OPENB_TRACES
LARGE_MILLI = 800
"""A sharing pod of at least this many milli-GPU is *large*: the share it leaves is below 200 milli."""
PARTS = ("whole", "beside_large", "unfillable", "other")


def waste(variant: str, seed: int, policy: str, traces: Path = TRACES, ratio: float = 1.3) -> dict:
    """The split of the free GPU share (GPUs) at 100% arrived for one run (see the module docstring)."""
    nodes = load_openb_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(traces / f"openb_pod_list_{variant}.csv")
    state = ClusterState(nodes)
    engine = Engine(state, make_policy(policy), seed=seed, workload=pods)
    capacity = state.total_gpu_milli
    demand = held = 0
    smallest = MILLI
    contents: dict[tuple[int, int], list[int]] = {}  # (node, GPU) -> milli of the sharing pods on it
    failed: Counter = Counter()  # GPUs of the GPU pods that fit nowhere, by class
    for pod in build_inflation_workload(pods, capacity, ratio, seed):
        decision = engine.place(pod)
        demand += pod.total_gpu_milli
        if pod.num_gpu:
            smallest = min(smallest, pod.gpu_milli)
        if decision.assignment is None and pod.num_gpu:
            failed[pod_class(pod.num_gpu, pod.gpu_milli)] += pod.total_gpu_milli / MILLI
        if decision.assignment is not None:
            held += pod.total_gpu_milli
            a = decision.assignment
            if a.gpus and a.gpu_milli < MILLI:  # what the pod was given on each GPU (a policy may round up)
                for g in a.gpus:
                    contents.setdefault((a.node, g), []).append(a.gpu_milli)
        if demand >= capacity * (1.0 - 1e-12):
            break
    parts, by_content = classify_free(state, contents, smallest)
    total_gpus = capacity / MILLI
    return {"variant": variant, "seed": seed, "policy": policy, "allocation_at_100": 100.0 * held / capacity,
            "free_gpus": sum(parts.values()) / MILLI, "capacity_gpus": total_gpus, "smallest_pod_milli": smallest,
            **{p: parts[p] / MILLI for p in PARTS},
            "top_contents": [(k, v / MILLI) for k, v in by_content.most_common(6)],
            "failed_gpus_by_class": dict(failed.most_common())}


def classify_free(state: ClusterState, contents: dict[tuple[int, int], list[int]],
                  smallest: int) -> tuple[dict[str, int], Counter]:
    """Split the free share of every GPU of ``state`` (milli-GPU) into :data:`PARTS`; ``contents``: (node, GPU) ->
    milli of the sharing pods on it; ``smallest``: the smallest share a GPU pod asked. Returns (milli per part,
    milli per GPU content, the content written as its pods' milli joined by commas, ``-`` for none)."""
    parts = dict.fromkeys(PARTS, 0)
    by_content: Counter = Counter()
    for n in range(state.n_nodes):
        for g in range(int(state.gpu_count[n])):
            free = int(state.gpu_free[n, g])
            if free <= 0:
                continue
            on = contents.get((n, g), [])
            if free >= MILLI:
                part = "whole"
            elif len(on) == 1 and on[0] >= LARGE_MILLI:
                part = "beside_large"
            elif free < smallest:
                part = "unfillable"
            else:
                part = "other"
            parts[part] += free
            by_content[",".join(map(str, sorted(on))) or "-"] += free
    return parts, by_content


def _one(args: tuple) -> dict:
    return waste(*args)


def read_optimum(path: Path) -> tuple[dict, dict]:
    """From ``optimum.py``'s results file (absent: nothing): (variant, seed) -> upper bound (fraction), and
    (variant, seed) -> {pod class: GPUs its packing left out} for the runs that have a packing (``{}``: it left
    nothing out; ``None`` or no key: no packing, not counted)."""
    if not path.exists():
        return {}, {}
    runs = json.loads(path.read_text())["runs"]
    bounds = {(r["variant"], r["seed"]): r["bound"] for r in runs}
    dropped = {(r["variant"], r["seed"]): r["dropped_gpus_by_class"] for r in runs
               if r.get("dropped_gpus_by_class") is not None}
    return bounds, dropped


def dropped_table(rows: list[dict], dropped: dict) -> list[str]:
    """Markdown: per variant, the GPUs of the pods left out by class, mean over the seeds, for the optimum's
    packing (``dropped``: (variant, seed) -> {class: GPUs}, seeds it has) and each policy; the classes that
    lose at least one GPU in some column."""
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    out = ["| variant | pod class | optimum's packing | " + " | ".join(policies) + " |",
           "|---|---|---:|" + "---:|" * len(policies)]
    for v in dict.fromkeys(r["variant"] for r in rows):
        seeds = sorted({r["seed"] for r in rows if r["variant"] == v})
        opt = [dropped[(v, s)] for s in seeds if (v, s) in dropped]
        cols = {p: [r["failed_gpus_by_class"] for r in rows if r["variant"] == v and r["policy"] == p]
                for p in policies}
        classes: Counter = Counter()
        for d in opt + [d for ds in cols.values() for d in ds]:
            classes.update(d)

        def mean(ds: list[dict], c: str) -> str:
            return f"{np.mean([d.get(c, 0.0) for d in ds]):.1f}" if ds else "-"

        for c, _ in classes.most_common():
            cells = [mean(opt, c)] + [mean(cols[p], c) for p in policies]
            if max(float(x) for x in cells if x != "-") >= 1.0:
                out.append(f"| {v} | {c} | " + " | ".join(cells) + " |")
    return out


def markdown(rows: list[dict], bounds: dict, machine: dict, dropped: dict | None = None) -> str:
    out = ["| variant | policy | seeds | alloc @100% | free GPUs | whole | beside large pods | unfillable | other |"
           " bound's waste (GPUs) | waste fgd+1.0 allows (GPUs) |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v in dict.fromkeys(r["variant"] for r in rows):
        fgd = [r for r in rows if r["variant"] == v and r["policy"] == "fgd"]
        for p in dict.fromkeys(r["policy"] for r in rows if r["variant"] == v):
            mine = [r for r in rows if r["variant"] == v and r["policy"] == p]
            cap = mine[0]["capacity_gpus"]
            bw = [(100.0 - 100.0 * bounds[(v, r["seed"])]) * cap / 100.0 for r in mine if (v, r["seed"]) in bounds]
            allow = (100.0 - (np.mean([r["allocation_at_100"] for r in fgd]) + 1.0)) * cap / 100.0 if fgd else None
            mean = {k: np.mean([r[k] for r in mine]) for k in ("allocation_at_100", "free_gpus", *PARTS)}
            bound_cell = f"{np.mean(bw):.1f}" if bw else "-"
            allow_cell = f"{allow:.1f}" if allow is not None else "-"
            out.append(f"| {v} | {p} | {len(mine)} | {mean['allocation_at_100']:.2f} | {mean['free_gpus']:.1f} | "
                       + " | ".join(f"{mean[k]:.1f}" for k in PARTS) + f" | {bound_cell} | {allow_cell} |")
    out += ["", f"Means over the seeds; GPUs of free share at the pod where the arrived demand reaches 100% "
            f"(`benchmarks/openb_waste.py`). Large pods: sharing pods of >= {LARGE_MILLI} milli-GPU. Bound: "
            "`results/openb_optimum.json`. Machine: "
            f"{machine}", ""]
    if any(r.get("failed_gpus_by_class") is not None for r in rows):
        out += ["GPUs of the pods left out at 100% arrived, by class (`<GPUs>x<milli per GPU>`), mean over the seeds: "
                "the offline optimum's packing (`optimum.py --node-level`) beside each policy's failed pods:", ""]
        out += dropped_table(rows, dropped or {})
        out += [""]
    out += ["Largest free share by what the GPU holds (first seed of each row; milli of its sharing "
            "pods, `-`: nothing):", ""]
    for r in rows:
        if r["seed"] == min(x["seed"] for x in rows if x["variant"] == r["variant"]):
            out.append(f"- {r['variant']} / {r['policy']} (seed {r['seed']}): "
                       + ", ".join(f"[{k}] {v:.1f}" for k, v in r["top_contents"]))
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,gpushare100,multigpu50,gpuspec33")
    ap.add_argument("--policies", default="gpupool,fgd")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds, starting at 42")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel processes")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    policies = [p for p in args.policies.split(",") if p]
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    if not variants or not policies:
        ap.error("--variants and --policies each need at least one name")
    unknown = [p for p in policies if p not in REGISTRY]
    if unknown:
        ap.error(f"unknown policy {unknown[0]!r}; known: {', '.join(REGISTRY)}")
    for f in ["openb_node_list_gpu_node.csv", *(f"openb_pod_list_{v}.csv" for v in variants)]:
        if not (args.traces / f).is_file():
            ap.error(f"no {f} in {args.traces} (--traces: the openb trace folder; --variants: names of its pod lists)")
    runs = [(v, s, p, args.traces) for v in variants for s in range(42, 42 + args.seeds) for p in policies]
    t0 = time.time()
    with ProcessPoolExecutor(max(1, args.jobs)) as ex:
        rows = list(ex.map(_one, runs))
    bounds, dropped = read_optimum(args.out / "openb_optimum.json")
    machine = {**machine_info(), "wall_s": round(time.time() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openb_waste.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=1))
    md = markdown(rows, bounds, machine, dropped)
    (args.out / "openb_waste.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
