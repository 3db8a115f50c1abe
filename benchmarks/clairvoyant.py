"""What knowing the optimum in advance is worth to a scheduler that must place every pod that fits (openb).

``optimum.py --node-level`` packs the pods arrived at 100% demand offline: it may leave any pod out, and on
openb it leaves out 810-milli pods that would have fitted, which keeps whole GPUs free for the whole-GPU and
8-GPU pods that come later. An online scheduler (gpupool, FGD, every policy here, kube-scheduler) places a pod
whenever one fits somewhere. This script measures what that rule costs even with perfect foresight:

* the *plan*: the optimum's packing (the integer master of :func:`optimum.allocation_bound`, warm-started
  from gpupool's and FGD's placements), its node patterns given to concrete nodes of each class;
* the *replay*, in arrival order, with the plan known in advance: a pod of a shape the plan still has a slot
  for takes that slot (on a node where the rest of that node's plan still packs, GPU by GPU, if one does,
  else on the first such node it fits); any other pod that fits somewhere must be placed, and goes where it
  breaks the least planned GPU demand (the value of the planned pods that no longer pack on that node, the
  smallest first); a pod that fits nowhere is dropped;
* *re-planning* (``--replans``, default 3): the optimum solved again holding at least the pods of each shape
  the last replay placed (``allocation_bound(at_least=...)``), and replayed, while the replay improves; the
  best replay is kept.

Feasibility is the optimum's model: CPU, memory, allowed GPU models, whole GPUs for whole-GPU pods, shares
summing to at most 1000 milli on each GPU. CPU-only pods are placed too (the optimum leaves them out: they
hold no GPU), where they break the least.

The replay is one heuristic with foresight, not a bound: it shows how much of the optimum's lead survives
the must-place rule, not that no online policy could keep more.

Usage: ``python benchmarks/clairvoyant.py [--variants multigpu50,...] [--seeds 10] [--first-seed 42] [--merge]``;
writes ``benchmarks/results/openb_clairvoyant.{json,md}`` (``--merge``: keeping the file's runs of other variants
and seeds; ``--report-only``: the table again from the file). 40-200 s per seed on default and multigpu50.
Needs the ``bench`` extra (HiGHS).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OPENB_TRACES, machine_info  # noqa: E402
from gpupool.model import MILLI, NodeSpec, PodRequest
from gpupool.traces import load_openb_nodes, load_openb_pods
from optimum import (  # noqa: E402
    BoundResult,
    ShapeKey,
    allocation_bound,
    arrived_prefix,
    node_key,
    node_packing,
    pod_class,
    shape_key,
)

ROOT = Path(__file__).resolve().parents[1]
TRACES = OPENB_TRACES


@dataclass
class _Node:
    """One node's free resources: milli-CPU, MiB, and free milli-GPU per GPU."""

    model: str
    cpu: int
    mem: int
    gpus: list[int]


def _value(shape: ShapeKey) -> int:
    """GPU demand of one pod of ``shape``, milli-GPU."""
    return shape[2] * shape[3]


def _allowed(node: _Node, shape: ShapeKey) -> bool:
    return not (shape[2] and shape[4] and node.model not in shape[4])


def fits(node: _Node, shape: ShapeKey) -> bool:
    """One pod of ``shape`` fits ``node`` as it is now."""
    cpu, mem, num, milli, _spec = shape
    if cpu > node.cpu or mem > node.mem or not _allowed(node, shape):
        return False
    if not num:
        return True
    if milli >= MILLI:
        return sum(1 for f in node.gpus if f >= MILLI) >= num
    return any(f >= milli for f in node.gpus)


def packs(node: _Node, shapes: Sequence[ShapeKey]) -> bool:
    """All of ``shapes`` (one pod each) fit together on ``node`` as it is now: CPU and memory sums, whole GPUs
    for whole-GPU pods, and the sharing pods bin-packed exactly into the GPUs left (depth-first, largest pod
    first, equal bins tried once, dead states remembered). Every sharing shape asks one GPU (openb)."""
    if sum(s[0] for s in shapes) > node.cpu or sum(s[1] for s in shapes) > node.mem:
        return False
    if not all(_allowed(node, s) for s in shapes):
        return False
    whole = sum(s[2] for s in shapes if s[2] and s[3] >= MILLI)
    share = sorted((s[3] for s in shapes if s[2] and s[3] < MILLI), reverse=True)
    full = sum(1 for f in node.gpus if f >= MILLI)
    if whole > full:
        return False
    bins = sorted([f for f in node.gpus if f < MILLI] + [MILLI] * (full - whole), reverse=True)
    if sum(share) > sum(bins):
        return False

    smallest = share[-1] if share else 0
    left = [sum(share[i:]) for i in range(len(share) + 1)]
    dead: set[tuple] = set()  # (next pod, bins sorted) that cannot be completed

    def place(i: int) -> bool:
        if i == len(share):
            return True
        key = (i, tuple(sorted(bins)))
        if key in dead or left[i] > sum(f for f in bins if f >= smallest):  # share below every pod is lost
            return False
        tried = set()
        for b, free in enumerate(bins):
            if free >= share[i] and free not in tried:
                tried.add(free)
                bins[b] -= share[i]
                if place(i + 1):
                    return True
                bins[b] += share[i]
        dead.add(key)
        return False

    return place(0)


def _take(node: _Node, shape: ShapeKey, rest: Sequence[ShapeKey]) -> None:
    """Put one pod of ``shape`` on ``node`` (it fits), on the GPUs that leave ``rest`` packable if any do
    (best fit first), else best fit."""
    cpu, mem, num, milli, _ = shape
    node.cpu -= cpu
    node.mem -= mem
    if not num:
        return
    if milli >= MILLI:  # free whole GPUs are interchangeable
        for g in [g for g, f in enumerate(node.gpus) if f >= MILLI][:num]:
            node.gpus[g] = 0
        return
    order = sorted((f, g) for g, f in enumerate(node.gpus) if f >= milli)
    for _f, g in order:
        node.gpus[g] -= milli
        if packs(node, rest):
            return
        node.gpus[g] += milli
    node.gpus[order[0][1]] -= milli


def _break(node: _Node, plan: Counter, shape: ShapeKey) -> tuple[int, list[ShapeKey]]:
    """The planned pods to drop from ``node``'s ``plan`` so that they still pack beside one more pod of
    ``shape``: (their GPU demand in milli, the shapes), the smallest pods dropped first."""
    left = sorted(plan.elements(), key=lambda s: (_value(s), s[0], s[1]))
    dropped: list[ShapeKey] = []
    while left and not packs(node, [shape, *left]):
        dropped.append(left.pop(0))
    if not packs(node, [shape, *left]):
        return 1 << 60, dropped
    return sum(_value(s) for s in dropped), dropped


def plan_nodes(nodes: Sequence[NodeSpec], res: BoundResult) -> list[Counter]:
    """The planned pods per node ({shape: pods}, one Counter per node of ``nodes``): ``res``'s patterns given
    to the nodes of their class in node order."""
    free: dict[int, list[int]] = {}
    index = {k: c for c, k in enumerate(res.node_classes)}
    for i in range(len(nodes) - 1, -1, -1):  # popped from the end: node order
        if nodes[i].gpu_count:
            free.setdefault(index[node_key(nodes[i])], []).append(i)
    plan = [Counter() for _ in nodes]
    for c, pat, k in res.patterns:
        for _ in range(k):
            plan[free[c].pop()] = Counter({res.shapes[s]: m for s, m in pat.items()})
    return plan


def _leftover(node: _Node, shape: ShapeKey) -> tuple[int, int]:
    """How tightly one pod of ``shape`` fits ``node`` (it fits): free share left on the tightest GPU it fits
    (free whole GPUs left, for a whole-GPU pod), then free milli-CPU left; smaller is tighter."""
    cpu, _mem, num, milli, _ = shape
    if not num:
        return 0, node.cpu - cpu
    if milli >= MILLI:
        return sum(1 for f in node.gpus if f >= MILLI) - num, node.cpu - cpu
    return min(f - milli for f in node.gpus if f >= milli), node.cpu - cpu


FORCED = ("first", "best-fit")
"""Where a forced pod goes among the nodes that break as little of the plan: the first in node order, or
the one it fits most tightly (:func:`_leftover`)."""


def replay(nodes: Sequence[NodeSpec], prefix: Sequence[PodRequest], plan: list[Counter],
           forced: str = "first") -> dict:
    """Place ``prefix`` in order with ``plan`` known in advance under the must-place rule (module docstring);
    ``forced``: one of :data:`FORCED`.
    Returns the GPU share held (fraction of capacity), the GPU demand (GPUs) of the pods placed beyond the
    plan (``forced``), of planned pods broken off their node, and of the pods dropped, by :func:`pod_class`."""
    state = [_Node(n.gpu_model, n.cpu_milli, n.memory_mib, [MILLI] * n.gpu_count) for n in nodes]
    plan = [Counter(p) for p in plan]
    slots: dict[ShapeKey, list[int]] = {}
    for i, p in enumerate(plan):
        for s in p:
            slots.setdefault(s, []).append(i)
    held = forced_milli = broken = 0
    dropped: Counter = Counter()
    placed: list[list[PodRequest]] = [[] for _ in nodes]
    for pod in prefix:
        s = shape_key(pod)
        chosen = -1
        for i in slots.get(s, ()):
            if plan[i][s] > 0 and fits(state[i], s):
                rest = list((plan[i] - Counter({s: 1})).elements())
                if chosen < 0:
                    chosen = i
                if packs(_after(state[i], s, rest), rest):
                    chosen = i
                    break
        if chosen >= 0:
            plan[chosen][s] -= 1
            _take(state[chosen], s, list(plan[chosen].elements()))
            held += _value(s)
            placed[chosen].append(pod)
            continue
        best, best_loss, best_drop = -1, 1 << 62, []
        candidates = [i for i, node in enumerate(state) if fits(node, s)]
        if forced == "best-fit":
            candidates.sort(key=lambda i: _leftover(state[i], s))
        for i in candidates:
            loss, drop = _break(state[i], plan[i], s)
            if loss < best_loss:
                best, best_loss, best_drop = i, loss, drop
                if loss == 0:
                    break
        if best < 0:
            if s[2]:
                dropped[pod_class(s[2], s[3])] += _value(s) / MILLI
            continue
        plan[best] -= Counter(best_drop)
        broken += sum(_value(x) for x in best_drop)
        _take(state[best], s, list(plan[best].elements()))
        held += _value(s)
        forced_milli += _value(s)
        placed[best].append(pod)
    capacity = sum(n.gpu_count for n in nodes) * MILLI
    return {"held": held / capacity, "forced_gpus": forced_milli / MILLI, "broken_gpus": broken / MILLI,
            "dropped_gpus_by_class": {k: round(v, 2) for k, v in sorted(dropped.items(), key=lambda kv: -kv[1])},
            "placed": placed}


def _after(node: _Node, shape: ShapeKey, rest: Sequence[ShapeKey]) -> _Node:
    """A copy of ``node`` with one pod of ``shape`` put on it as :func:`_take` would."""
    copy = _Node(node.model, node.cpu, node.mem, list(node.gpus))
    _take(copy, shape, rest)
    return copy


def run_one(variant: str, seed: int, traces: Path = TRACES, ratio: float = 1.3,
            time_limit: float = 30.0, replans: int = 3, forced: str = "first") -> dict:
    """Plan (the optimum's packing) and replay for one (variant, seed); then up to ``replans`` times plan
    again with at least as many pods of each shape as the last replay had to place (the optimum under the
    must-place rule's own choices), while the replay improves. Keeps the best replay."""
    nodes = load_openb_nodes(traces / "openb_node_list_gpu_node.csv")
    pods = load_openb_pods(traces / f"openb_pod_list_{variant}.csv")
    prefix = arrived_prefix(nodes, pods, seed, ratio)
    t0 = time.perf_counter()
    warm = [pair for policy in ("gpupool", "fgd") for pair in node_packing(nodes, prefix, policy)]
    res = allocation_bound(nodes, prefix, time_limit=time_limit, warm=warm)
    optimum = res.packed
    rounds = []
    best: dict = {}
    for k in range(1 + replans):
        out = replay(nodes, prefix, plan_nodes(nodes, res), forced)
        placed = out.pop("placed")
        rounds.append({"plan": res.packed, **out})
        if not best or out["held"] > best["held"]:
            best = out
        if k == replans or (len(rounds) > 1 and out["held"] <= rounds[-2]["held"] + 1e-9):
            break
        # the next plan holds at least the pods of each shape this replay had to place
        at_least = Counter(shape_key(p) for ps in placed for p in ps if p.num_gpu)
        mine = [(nodes[i], ps) for i, ps in enumerate(placed) if any(p.num_gpu for p in ps)]
        res = allocation_bound(nodes, prefix, time_limit=time_limit, warm=warm + mine, at_least=dict(at_least))
    return {"variant": variant, "seed": seed, "forced_order": forced, "optimum_packed": optimum, **best,
            "rounds": rounds, "seconds": round(time.perf_counter() - t0, 1)}


def policy_results(path: Path) -> dict[tuple[str, str, int], float]:
    """(variant, policy, seed) -> GPU allocation at 100% arrived (fraction), from ``openb_allocation.py``'s
    results file (absent: nothing)."""
    if not path.exists():
        return {}
    return {(r["variant"], r["policy"], r["seed"]): r["gpu_allocation_ratio_at_100"]
            for r in json.loads(path.read_text())["runs"]}


def report(rows: list[dict], policies: dict[tuple[str, str, int], float], target: float = 1.0) -> list[str]:
    """Markdown: per variant, the optimum, the clairvoyant must-place replay, ``fgd`` + ``target`` points and
    ``gpupool`` (means over the seeds; the policies' where ``policies`` has every seed), then per seed."""
    out = ["| variant | seeds | optimum | clairvoyant must-place | fgd | fgd + 1.0 | gpupool "
           "| seeds where the replay reaches fgd + 1.0 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    per_seed = ["| variant | seed | optimum | replay (first plan) | replay (best) | plans | forced GPUs "
                "| fgd | gpupool |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for v in dict.fromkeys(r["variant"] for r in rows):
        mine = [r for r in rows if r["variant"] == v]
        held = np.array([r["held"] for r in mine])
        opt = np.array([r["optimum_packed"] for r in mine])
        pol = {p: [policies.get((v, p, r["seed"])) for r in mine] for p in ("fgd", "gpupool")}
        have = {p: None not in xs for p, xs in pol.items()}
        fgd = np.array(pol["fgd"], dtype=float) if have["fgd"] else None
        cell = {p: f"{100 * np.mean(xs):.2f}" if have[p] else "-" for p, xs in pol.items()}
        reach = f"{int((held >= fgd + target / 100 - 1e-12).sum())} of {len(mine)}" if fgd is not None else "-"
        goal = f"{100 * fgd.mean() + target:.2f}" if fgd is not None else "-"
        out.append(f"| {v} | {len(mine)} | {100 * opt.mean():.2f} | {100 * held.mean():.2f} | {cell['fgd']} "
                   f"| {goal} | {cell['gpupool']} | {reach} |")
        for r, f, g in zip(mine, pol["fgd"], pol["gpupool"], strict=True):
            first = r["rounds"][0]
            per_seed.append(f"| {v} | {r['seed']} | {100 * r['optimum_packed']:.2f} | {100 * first['held']:.2f} "
                            f"| {100 * r['held']:.2f} | {len(r['rounds'])} | {first['forced_gpus']:.1f} "
                            f"| {'-' if f is None else f'{100 * f:.2f}'} | {'-' if g is None else f'{100 * g:.2f}'} |")
    return out + [""] + per_seed


ORDER = ("default", "gpushare100", "multigpu50", "gpuspec33")
"""The variants' order in the tables (others after them, by name)."""


def run_all(variants: list[str], args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    """:func:`run_one` for every (variant, seed) of ``args``, ``args.jobs`` at a time, printed as they end;
    (rows, [this run's machine])."""
    start = time.time()
    work = [(v, s) for v in variants for s in range(args.first_seed, args.first_seed + args.seeds)]
    rows = []
    with ProcessPoolExecutor(args.jobs) as ex:
        futures = [ex.submit(run_one, v, s, args.traces, replans=args.replans, forced=args.forced) for v, s in work]
        for fut in as_completed(futures):
            r = fut.result()
            rows.append(r)
            print(f"{r['variant']:12s} seed {r['seed']}: optimum {100 * r['optimum_packed']:.2f}%, "
                  f"clairvoyant must-place {100 * r['held']:.2f}% (forced {r['forced_gpus']:.1f} GPUs, "
                  f"broken {r['broken_gpus']:.1f}; {len(r['rounds'])} plans), {r['seconds']:.0f}s", flush=True)
    return rows, [{**machine_info(), "variants": variants, "wall_s": round(time.time() - start, 1)}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,gpushare100,multigpu50")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds, starting at --first-seed")
    ap.add_argument("--first-seed", type=int, default=42)
    ap.add_argument("--replans", type=int, default=3,
                    help="plans after the first, each holding at least what the last replay placed")
    ap.add_argument("--forced", choices=FORCED, default="first",
                    help="where a pod beyond the plan goes among the nodes that break as little of it")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="processes")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--allocation", type=Path, default=ROOT / "benchmarks" / "results" / "openb_allocation.json",
                    help="openb_allocation.py's results, for fgd and gpupool on the same seeds")
    ap.add_argument("--merge", action="store_true",
                    help="keep the runs of the other (variant, seed) pairs already in --out's results file")
    ap.add_argument("--report-only", action="store_true", help="rewrite the table from --out's results file")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if args.seeds < 1 or args.jobs < 1 or args.replans < 0 or not variants:
        ap.error("--seeds and --jobs must be at least 1, --replans at least 0, --variants needs a name")
    for f in ["openb_node_list_gpu_node.csv", *(f"openb_pod_list_{v}.csv" for v in variants)]:
        if not args.report_only and not (args.traces / f).is_file():
            ap.error(f"no {f} in {args.traces}")
    path = args.out / "openb_clairvoyant.json"

    def saved_runs() -> tuple[list[dict], list[dict]]:
        try:
            saved = json.loads(path.read_text())
            return list(saved["runs"]), list(saved["machine"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            ap.error(f"{path}: not a results file of this script ({type(exc).__name__}: {exc})")

    try:
        policies = policy_results(args.allocation)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        ap.error(f"--allocation {args.allocation}: not openb_allocation.py's results ({type(exc).__name__}: {exc})")
    if args.report_only:
        if not path.is_file():
            ap.error(f"--report-only: no {path}")
        rows, machines = saved_runs()
    else:
        if args.merge and path.is_file():
            saved_runs()  # refused before hours of runs, not after
        rows, machines = run_all(variants, args)
        if args.merge and path.is_file():  # the other (variant, seed) runs of the file stay, with their machines
            old_rows, old_machines = saved_runs()
            mine = {(r["variant"], r["seed"]) for r in rows}
            rows = [r for r in old_rows if (r["variant"], r["seed"]) not in mine] + rows
            machines = old_machines + machines
        rows.sort(key=lambda r: (ORDER.index(r["variant"]) if r["variant"] in ORDER else len(ORDER),
                                 r["variant"], r["seed"]))
        args.out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machines, "runs": rows}, indent=1))
    lines = report(rows, policies)
    lines.append(f"\nGPU allocation at 100% arrived (% of capacity), openb, inflation protocol. `optimum`: the best "
                 "packing of the arrived pods (`optimum.py --node-level`), which may leave out pods that fit. "
                 "`clairvoyant must-place`: that packing known in advance, every pod placed if it fits when it "
                 "arrives, then planned again with at least what the replay had to place, keeping the best replay "
                 "(`benchmarks/clairvoyant.py`). `forced GPUs`: GPU demand the first replay placed beyond its plan. "
                 f"fgd and gpupool from `{args.allocation.name}` (same seeds). Runs (machine, variants, wall "
                 f"seconds): {machines}")
    (args.out / "openb_clairvoyant.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
