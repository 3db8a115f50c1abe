"""Offline optimum of the GPU allocation at 100% arrived demand (openb, inflation protocol).

Under the inflation protocol (:mod:`gpupool.sim.inflation`) pods never leave, so whatever an online policy
holds when the arrived GPU demand first reaches 100% of capacity is a packing of a subset of the pods
arrived so far (the *prefix*). The largest GPU share any such packing holds is an upper bound on every
policy's ``allocation_at_100`` for that arrival sequence; this script computes it.

Two relaxations, each a configuration LP (Gilmore-Gomory) solved by column generation with HiGHS
through ``highspy``; each is an **upper bound** on the optimum, and the smaller one is reported:

* **GPU by GPU** (:func:`gpu_packing_bound`, the default; on openb's default and gpushare100 as tight as the
  node-level one): every GPU of model ``m`` gets a *GPU pattern*, fractional pods whose shares sum to at
  most 1000 milli (exact: two 600-milli pods never share a GPU; a GPU holding 810 milli takes only pods of
  <= 190), or one GPU of a whole-GPU pod; CPU and memory are left out, and a multi-GPU pod's GPUs need not
  share a node. Pricing: an exact one-GPU knapsack over the milli (:func:`best_gpu_pattern`). About a second
  per seed.
* **Node by node** (:func:`allocation_bound`, ``--node-level``): pods grouped into shape classes
  (CPU, memory, GPU count, per-GPU milli, allowed models), nodes into classes (model, GPUs, CPU, memory);
  a *pattern* is what one node can hold, exactly: CPU, memory, and GPU by GPU (:func:`best_pattern`, a small
  integer programme per node class). The master starts from the nodes of two real packings (``gpupool`` and
  ``fgd`` placing the same pods in order, :func:`node_packing`), converges in a few rounds, and is then solved
  in integers over the patterns generated: a real packing, i.e. a lower bound. On openb the two meet within
  0.003 point on default, gpushare100 and multigpu50 (seeds 42..51, 10-160 s per seed): the optimum itself,
  not only a bound; on gpuspec33 the master MIP stops at its time limit 0.1-0.3 point short (3-6 minutes
  per seed).

The LP relaxes integrality (fractional pattern counts), so the bound alone is not proven tight; with
``--node-level`` the packing brackets the optimum from below (``openb_allocation.py`` reports both gaps).
CPU-only pods add no GPU share and are left out (a relaxation: online policies must place them).

Usage: ``python benchmarks/optimum.py [--variants default,...] [--seeds 10] [--node-level [--no-packing]]``;
writes ``benchmarks/results/openb_optimum.{json,md}``. Needs the ``bench`` extra (``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import OPENB_TRACES, machine_info  # noqa: E402
from gpupool.model import MILLI, NodeSpec, PodRequest
from gpupool.sim.inflation import build_inflation_workload
from gpupool.traces import load_openb_nodes, load_openb_pods

ROOT = Path(__file__).resolve().parents[1]
TRACES = OPENB_TRACES

ShapeKey = tuple[int, int, int, int, tuple[str, ...]]
"""(cpu milli, memory MiB, GPU count, per-GPU milli, allowed models) of a pod shape class."""
NodeKey = tuple[str, int, int, int]
"""(GPU model, GPU count, cpu milli, memory MiB) of a node class."""


def shape_key(p: PodRequest) -> ShapeKey:
    return (p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli if p.num_gpu else 0, tuple(p.gpu_spec))


def node_key(n: NodeSpec) -> NodeKey:
    return (n.gpu_model, n.gpu_count, n.cpu_milli, n.memory_mib)


def arrived_prefix(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], seed: int,
                   ratio: float = 1.3) -> list[PodRequest]:
    """The pods of :func:`run_inflation`'s sequence up to the one at which the arrived GPU demand first
    reaches 100% of capacity (the pod at which ``allocation_at_100`` is read), in arrival order."""
    capacity = sum(n.gpu_count for n in nodes) * MILLI
    workload = build_inflation_workload(pods, capacity, ratio, seed)
    demand = 0
    for i, p in enumerate(workload):
        demand += p.total_gpu_milli
        if demand >= capacity * (1.0 - 1e-12):
            return workload[: i + 1]
    return workload


def pod_class(num_gpu: int, gpu_milli: int) -> str:
    """A pod's GPU ask as ``"<GPUs>x<milli per GPU>"`` ("8x1000", "1x810"), the classes the waste tables use."""
    return f"{num_gpu}x{gpu_milli if num_gpu else 0}"


def dropped_by_class(res: BoundResult) -> dict[str, float]:
    """GPUs of the pods that ``res``'s packing leaves out, per :func:`pod_class` (largest first)."""
    placed: Counter = Counter()
    for _c, pat, k in res.patterns:
        for s, m in pat.items():
            placed[s] += m * k
    out: Counter = Counter()
    for s, (sk, n) in enumerate(zip(res.shapes, res.shape_counts, strict=True)):
        if n > placed[s]:
            out[pod_class(sk[2], sk[3])] += (n - placed[s]) * sk[2] * sk[3] / MILLI
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def fits_empty(shape: ShapeKey, node: NodeKey) -> bool:
    """One pod of ``shape`` fits an empty node of class ``node``."""
    cpu, mem, num, _milli, spec = shape
    model, gpus, ncpu, nmem = node
    if cpu > ncpu or mem > nmem or num > gpus:
        return False
    return not (num and spec and model not in spec)


@dataclass
class BoundResult:
    """The optimum's bracket for one arrival prefix. Shares are fractions of cluster GPU capacity.

    ``bound``: upper bound (configuration LP with the Lagrangian correction; equal to the LP optimum once
    no pattern prices out); ``packed``: the GPU share of a real packing (the master MIP over the patterns
    generated), a lower bound; ``patterns``: (node class index, {shape index: pods}, nodes using it) of
    that packing.
    """

    bound: float
    packed: float
    kind: str
    status: str
    shapes: list[ShapeKey]
    shape_counts: list[int]
    node_classes: list[NodeKey]
    node_counts: list[int]
    patterns: list[tuple[int, dict[int, int], int]] = field(default_factory=list)
    iterations: int = 0
    seconds: float = 0.0


def _ints(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int32)


def best_pattern(shapes: Sequence[ShapeKey], values: np.ndarray, limits: Sequence[int], node: NodeKey,
                 time_limit: float = 10.0) -> tuple[float, float, dict[int, int]]:
    """The pods one node of class ``node`` may hold that maximize the sum of ``values`` (per pod of each shape).

    Exact, as a small integer programme solved with HiGHS: the pods' CPU and memory sum within the node's; a
    pod of ``k`` whole GPUs takes ``k`` GPUs of its own; every other GPU holds sharing pods whose shares sum to
    at most 1000 milli (one count per GPU and distinct share, tied to the pods of each shape by share; GPUs
    ordered by what they hold, which removes their symmetry); at most ``limits[s]`` pods of shape ``s``.
    Shapes with a value <= 0 or not allowed on the node are left out. A sharing shape must ask one GPU (as
    every openb pod does); raises ValueError otherwise.

    Returns (value of the pattern found, an upper bound on the best value: the same unless HiGHS stopped at
    ``time_limit`` seconds, {shape index: pods}).
    """
    import highspy

    _model, gpus, cpu, mem = node
    use = [s for s, sk in enumerate(shapes) if values[s] > 1e-12 and limits[s] > 0 and fits_empty(sk, node)]
    if not use:
        return 0.0, 0.0, {}
    whole = [s for s in use if shapes[s][3] >= MILLI]
    share = [s for s in use if shapes[s][3] < MILLI]
    if any(shapes[s][2] != 1 for s in share):
        raise ValueError("a sharing pod of more than one GPU: the exact node pattern does not model it")
    millis = sorted({shapes[s][3] for s in share})
    n, nm = len(use), len(millis)
    pos = {s: i for i, s in enumerate(use)}

    def u(g: int, j: int) -> int:  # pods of share millis[j] on GPU g
        return n + g * nm + j

    def w(g: int) -> int:  # GPU g given to a whole-GPU pod
        return n + gpus * nm + g

    h = highspy.Highs()
    h.silent()
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 1e-9)
    inf = highspy.kHighsInf
    ub = [float(min(limits[s], gpus // shapes[s][2])) if shapes[s][3] >= MILLI else float(limits[s]) for s in use]
    ub += [float(MILLI // m) for _ in range(gpus) for m in millis] + [1.0] * gpus
    total = len(ub)
    h.addVars(total, np.zeros(total), np.array(ub))
    h.changeColsCost(n, _ints(n), np.array([values[s] for s in use]))
    h.changeColsIntegrality(total, _ints(total), np.full(total, highspy.HighsVarType.kInteger, dtype=np.uint8))
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)

    def row(lo: float, hi: float, idx: list[int], val: list[float]) -> None:
        h.addRow(lo, hi, len(idx), np.array(idx, dtype=np.int32), np.array(val, dtype=np.float64))

    row(-inf, float(cpu), list(range(n)), [float(shapes[s][0]) for s in use])
    row(-inf, float(mem), list(range(n)), [float(shapes[s][1]) for s in use])
    row(0.0, 0.0, [pos[s] for s in whole] + [w(g) for g in range(gpus)],
        [float(shapes[s][2]) for s in whole] + [-1.0] * gpus)
    held = [float(m) for m in millis] + [float(MILLI)]  # what GPU g holds: its sharing pods, or a whole pod
    for g in range(gpus):
        row(-inf, float(MILLI), [u(g, j) for j in range(nm)] + [w(g)], held)
    for j, m in enumerate(millis):
        of = [pos[s] for s in share if shapes[s][3] == m]
        row(-inf, 0.0, of + [u(g, j) for g in range(gpus)], [1.0] * len(of) + [-1.0] * gpus)
    for g in range(gpus - 1):  # GPU g holds at least what GPU g + 1 holds
        row(0.0, inf, [u(g, j) for j in range(nm)] + [w(g)] + [u(g + 1, j) for j in range(nm)] + [w(g + 1)],
            held + [-x for x in held])
    h.run()
    x = np.asarray(h.getSolution().col_value)
    counts = {s: int(round(x[pos[s]])) for s in use if round(x[pos[s]]) > 0} if len(x) else {}
    found = float(sum(values[s] * k for s, k in counts.items()))
    if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        return found, found, counts
    return found, max(found, float(h.getInfo().mip_dual_bound)), counts


def node_packing(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest],
                 policy: str) -> list[tuple[NodeSpec, list[PodRequest]]]:
    """A real packing to start the node-level LP from: ``pods`` placed in order by ``policy`` (any name of
    ``gpupool policies``), as (node, the GPU pods placed on it) for each node that holds one."""
    from gpupool.cluster import ClusterState
    from gpupool.engine.core import Engine
    from gpupool.policies import make_policy

    engine = Engine(ClusterState(nodes), make_policy(policy), seed=0, workload=pods)
    held: dict[int, list[PodRequest]] = {}
    for p in pods:
        d = engine.place(p)
        if d.assignment is not None and p.num_gpu:
            held.setdefault(d.assignment.node, []).append(p)
    return [(nodes[i], ps) for i, ps in sorted(held.items())]


def allocation_bound(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], max_iterations: int = 400,
                     tolerance: float = 1e-5, time_limit: float = 30.0, packing: bool = True,
                     warm: Sequence[tuple[NodeSpec, Sequence[PodRequest]]] = (),
                     at_least: dict[ShapeKey, int] | None = None) -> BoundResult:
    """Bracket the largest GPU share (fraction of capacity) a placement of a subset of ``pods`` holds.

    Configuration LP (Gilmore-Gomory) by column generation: a column is a *pattern*, the pods one node of a
    class may hold, exactly (:func:`best_pattern`: CPU, memory and GPU by GPU); the master chooses how many
    nodes of each class use each pattern (at most the class's node count, at most ``n_s`` pods of each shape).
    ``warm``: a real packing ((node, its pods) per node, :func:`node_packing`) whose nodes start the master as
    columns; from a good one the LP converges in a few rounds. Its LP optimum is an upper bound on the
    optimum; at every round ``LP + sum_c N_c max(0, best reduced cost of class c)`` (with HiGHS's upper bound
    where a pricing MIP stopped at ``time_limit``) is one too (Lagrangian / Farley bound), so stopping early
    still gives a valid ``bound``. The master solved in integers over the patterns generated is a real packing
    (``packed``, a lower bound; 0.0 with ``packing=False``, which skips that MIP). CPU-only pods add no GPU
    share and are left out. ``at_least``: pods of each shape every packing must hold (a constrained optimum,
    as ``clairvoyant.py`` asks it; ``warm`` should then hold a packing that meets it, or the master may
    have none; the bound is then the constrained optimum's). Raises ValueError without GPUs.
    """
    import highspy

    t0 = time.perf_counter()
    capacity = sum(n.gpu_count for n in nodes) * MILLI
    if capacity == 0:
        raise ValueError("the bound needs a cluster with GPUs")
    scount = Counter(shape_key(p) for p in pods if p.num_gpu)
    ncount = Counter(node_key(n) for n in nodes if n.gpu_count)
    shapes = sorted(scount)
    classes = sorted(ncount)
    counts = np.array([scount[k] for k in shapes], dtype=np.float64)
    value = np.array([k[2] * k[3] / MILLI for k in shapes], dtype=np.float64)  # GPUs per pod
    n_cls = len(classes)
    inf = highspy.kHighsInf
    master = highspy.Highs()
    master.silent()
    master.changeObjectiveSense(highspy.ObjSense.kMaximize)
    # rows 0..n_cls-1: nodes of each class; then one per shape
    for c in range(n_cls):
        master.addRow(-inf, float(ncount[classes[c]]), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    for s in range(len(shapes)):
        low = float((at_least or {}).get(shapes[s], 0)) or -inf
        master.addRow(low, float(counts[s]), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    patterns: list[tuple[int, dict[int, int]]] = []
    known: set[tuple[int, tuple]] = set()

    def add(c: int, pat: dict[int, int]) -> None:
        key = (c, tuple(sorted(pat.items())))
        if key in known:
            return
        known.add(key)
        idx = [c] + [n_cls + s for s in pat]
        vals = [1.0] + [float(k) for k in pat.values()]
        master.addCol(float(sum(value[s] * k for s, k in pat.items())), 0.0, inf, len(idx),
                      np.array(idx, dtype=np.int32), np.array(vals))
        patterns.append((c, dict(pat)))

    limits = [int(k) for k in counts]
    ceiling = min(float(counts @ value), capacity / MILLI)  # GPUs arrived, GPUs in the cluster
    for c in range(n_cls):  # start from each class's best pattern at full value
        _, _, pat = best_pattern(shapes, value, limits, classes[c], time_limit)
        if pat:
            add(c, pat)
    s_index = {k: i for i, k in enumerate(shapes)}
    c_index = {k: i for i, k in enumerate(classes)}
    for nd, held in warm:
        pat = Counter(s_index[shape_key(p)] for p in held if p.num_gpu)
        if pat:
            add(c_index[node_key(nd)], dict(pat))
    bound = float("inf")
    lp = 0.0
    it = 0
    status = "iteration limit"
    while it < max_iterations and time.perf_counter() - t0 < time_limit * 20:
        it += 1
        master.run()
        lp = float(master.getInfo().objective_function_value)
        dual = np.asarray(master.getSolution().row_dual)
        pi, mu = dual[:n_cls], dual[n_cls:]
        gain = 0.0
        added = 0
        for c in range(n_cls):
            found, upper, pat = best_pattern(shapes, value - mu, limits, classes[c], time_limit)
            gain += ncount[classes[c]] * max(0.0, upper - pi[c])
            if found - pi[c] > tolerance and pat:
                add(c, pat)
                added += 1
        bound = min(bound, lp + gain)
        if gain <= tolerance:  # no pattern prices out, proven: the LP optimum
            status = "converged"
            bound = min(bound, lp)
            break
        if lp >= ceiling * (1.0 - 1e-9):  # the LP places all it could ever place: it is the bound
            status = "all placed (LP)"
            bound = lp
            break
        if not added:
            status = "pricing stopped at its time limit"
            break
    # a real packing: the master in integers over the patterns generated (each one exact)
    used: list[tuple[int, dict[int, int], int]] = []
    packed = 0.0
    if packing:
        n_col = master.getNumCol()
        master.changeColsIntegrality(n_col, _ints(n_col), np.full(n_col, highspy.HighsVarType.kInteger, dtype=np.uint8))
        master.setOptionValue("time_limit", float(time_limit) * 4)
        master.setOptionValue("mip_rel_gap", 1e-6)
        master.run()
        x = np.asarray(master.getSolution().col_value)
        if len(x) == n_col:
            used = [(c, pat, int(round(x[j]))) for j, (c, pat) in enumerate(patterns) if round(x[j]) > 0]
            packed = sum(k * sum(value[s] * m for s, m in pat.items()) for _, pat, k in used)
    scale = MILLI / capacity
    return BoundResult(bound=min(1.0, bound * scale), packed=packed * scale, kind="configuration-lp",
                       status=status, shapes=shapes, shape_counts=[scount[k] for k in shapes],
                       node_classes=classes, node_counts=[ncount[k] for k in classes], patterns=used,
                       iterations=it, seconds=time.perf_counter() - t0)


def best_gpu_pattern(weights: np.ndarray, values: np.ndarray, limits: np.ndarray,
                     capacity: int = MILLI) -> tuple[float, dict[int, int]]:
    """Bounded integer knapsack of one GPU: item ``i`` weighs ``weights[i]`` milli, is worth ``values[i]``,
    at most ``limits[i]`` copies; total weight <= ``capacity``. Exact dynamic programme over the milli
    (binary splitting of the copies). Returns (best value, {item: copies}); items worth <= 0 are left out."""
    dp = np.zeros(capacity + 1)
    pieces: list[tuple[int, int, np.ndarray]] = []  # (item, copies, where the piece was taken)
    for i in np.flatnonzero(values > 1e-12):
        w, left, k = int(weights[i]), int(min(limits[i], capacity // max(int(weights[i]), 1))), 1
        while left > 0:
            take = min(k, left)
            ww, vv = w * take, values[i] * take
            if ww <= capacity:
                cand = np.full(capacity + 1, -np.inf)
                cand[ww:] = dp[: capacity + 1 - ww] + vv
                took = cand > dp + 1e-12
                dp = np.where(took, cand, dp)
                pieces.append((int(i), take, took))
            left -= take
            k *= 2
    c = int(np.argmax(dp))
    best = float(dp[c])
    out: dict[int, int] = {}
    for i, take, took in reversed(pieces):
        if took[c]:
            out[i] = out.get(i, 0) + take
            c -= int(weights[i]) * take
    return best, out


def gpu_packing_bound(nodes: Sequence[NodeSpec], pods: Sequence[PodRequest], max_iterations: int = 2000,
                      tolerance: float = 1e-7) -> float:
    """Upper bound (fraction of GPU capacity) from packing GPU by GPU, CPU and memory left out.

    Every GPU of model ``m`` gets a *GPU pattern*: fractional pods whose shares sum to at most 1000 milli, or
    one GPU of a whole-GPU pod (a pod of ``k`` GPUs is ``k`` units, which need not share a node: a
    relaxation). The configuration LP (one row per model: its GPU count; one per shape: its pods or units),
    solved by column generation with an exact one-GPU knapsack (:func:`best_gpu_pattern`), bounds the GPU
    share any placement holds, counting how sharing pods combine on single GPUs exactly (two pods of 600 milli
    never share; a GPU holding 810 milli takes only pods of <= 190); :func:`allocation_bound` keeps that and
    adds each node's CPU and memory and whole nodes for multi-GPU pods, at minutes instead of a second.
    Stopped before convergence it returns the trivial bound (arrived demand, at most 100%). Raises
    ValueError without GPUs.
    """
    import highspy

    models = Counter()
    for n in nodes:
        if n.gpu_count:
            models[n.gpu_model] += n.gpu_count
    capacity = sum(models.values())
    if capacity == 0:
        raise ValueError("the bound needs a cluster with GPUs")
    scount = Counter((p.gpu_milli if p.gpu_milli < MILLI else MILLI, tuple(p.gpu_spec)) for p in pods if p.num_gpu
                     for _ in range(p.num_gpu if p.gpu_milli >= MILLI else 1))
    shapes = sorted(scount)
    names = sorted(models)
    counts = np.array([scount[k] for k in shapes], dtype=np.float64)
    weights = np.array([k[0] for k in shapes], dtype=np.int64)
    value = weights / MILLI
    inf = highspy.kHighsInf
    h = highspy.Highs()
    h.silent()
    h.changeObjectiveSense(highspy.ObjSense.kMaximize)
    for m in names:
        h.addRow(-inf, float(models[m]), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    for c in counts:
        h.addRow(-inf, float(c), 0, np.zeros(0, dtype=np.int32), np.zeros(0))
    allowed = [np.array([not k[1] or m in k[1] for k in shapes]) for m in names]
    ceiling = min(float(counts @ value), float(capacity))
    bound = float("inf")
    mu = np.zeros(len(shapes))
    pi = np.zeros(len(names))
    for _ in range(max_iterations):
        added = 0
        for j, _m in enumerate(names):
            best, pat = best_gpu_pattern(weights, np.where(allowed[j], value - mu, 0.0), counts)
            rc = best - pi[j]
            if rc > tolerance and pat:
                idx = [j] + [len(names) + i for i in pat]
                h.addCol(float(sum(value[i] * k for i, k in pat.items())), 0.0, inf, len(idx),
                         np.array(idx, dtype=np.int32), np.array([1.0] + [float(k) for k in pat.values()]))
                added += 1
        if h.getNumCol():
            h.run()
            lp = float(h.getInfo().objective_function_value)
            dual = np.asarray(h.getSolution().row_dual)
            if added == 0:
                bound = min(bound, lp)
                break
            pi, mu = dual[: len(names)], dual[len(names):]
            if lp >= ceiling * (1.0 - 1e-9):
                bound = lp
                break
        elif added == 0:
            bound = 0.0
            break
    else:
        bound = min(bound, ceiling)
    return min(1.0, bound / capacity)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="default,gpushare100,multigpu50,gpuspec33")
    ap.add_argument("--seeds", type=int, default=10, help="number of seeds, starting at --first-seed")
    ap.add_argument("--first-seed", type=int, default=42, help="first seed (as openb_allocation.py's)")
    ap.add_argument("--ratio", type=float, default=1.3, help="inflation ratio (as run_inflation)")
    ap.add_argument("--max-iterations", type=int, default=400, help="column-generation rounds")
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds per MIP")
    ap.add_argument("--node-level", action="store_true",
                    help="also the node-by-node configuration LP (CPU, memory, GPU by GPU) and a real packing "
                         "from it (the optimum's lower bound); 10 s to 6 minutes per seed")
    ap.add_argument("--no-packing", action="store_true",
                    help="with --node-level: skip the integer master (no packing, no lower bound)")
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    if not variants:
        ap.error("--variants needs at least one name")
    if args.max_iterations < 1 or not args.time_limit > 0 or not args.ratio > 0:
        ap.error("--max-iterations must be at least 1, --time-limit and --ratio above 0")
    if args.no_packing and not args.node_level:
        ap.error("--no-packing goes with --node-level (only the node-level LP solves its master in integers)")
    for f in ["openb_node_list_gpu_node.csv", *(f"openb_pod_list_{v}.csv" for v in variants)]:
        if not (args.traces / f).is_file():
            ap.error(f"no {f} in {args.traces} (--traces: the openb trace folder; --variants: names of its pod lists)")
    nodes = load_openb_nodes(args.traces / "openb_node_list_gpu_node.csv")
    rows = []
    start = time.time()
    for v in variants:
        pods = load_openb_pods(args.traces / f"openb_pod_list_{v}.csv")
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            prefix = arrived_prefix(nodes, pods, seed, args.ratio)
            t0 = time.perf_counter()
            gpu_bound = gpu_packing_bound(nodes, prefix)
            row = {"variant": v, "seed": seed, "pods": len(prefix), "kind": "gpu-configuration-lp",
                   "gpu_bound": gpu_bound, "bound": gpu_bound, "packed": 0.0,
                   "seconds": round(time.perf_counter() - t0, 2)}
            if args.node_level:
                warm = [pair for policy in ("gpupool", "fgd") for pair in node_packing(nodes, prefix, policy)]
                res = allocation_bound(nodes, prefix, max_iterations=args.max_iterations,
                                       time_limit=args.time_limit, packing=not args.no_packing, warm=warm)
                row.update(node_bound=res.bound, bound=min(gpu_bound, res.bound), packed=res.packed,
                           node_status=res.status, node_iterations=res.iterations,
                           dropped_gpus_by_class=dropped_by_class(res) if res.packed else None,
                           seconds=round(time.perf_counter() - t0, 2))
            rows.append(row)
            print(f"{v:12s} seed {seed}: optimum <= {100 * row['bound']:.2f}% (GPU by GPU {100 * gpu_bound:.2f}%"
                  + (f", node by node {100 * row['node_bound']:.2f}%, packed {100 * row['packed']:.2f}%"
                     if args.node_level else "") + f"), {row['seconds']:.1f}s", flush=True)
    machine = {**machine_info(), "wall_s": round(time.time() - start, 1)}  # CPU model, cores, versions, load
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openb_optimum.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=1))
    lines = ["| variant | seeds | optimum upper bound (mean) | min | max | best packing found (mean) "
             "| largest bracket (bound - packing) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for v in dict.fromkeys(r["variant"] for r in rows):
        b = np.array([r["bound"] for r in rows if r["variant"] == v])
        k = np.array([r["packed"] for r in rows if r["variant"] == v])
        packs = f"{100 * k.mean():.2f} | {100 * (b - k).max():.3f}" if k.all() else "- | -"
        lines.append(f"| {v} | {len(b)} | {100 * b.mean():.2f} | {100 * b.min():.2f} | {100 * b.max():.2f} | {packs} |")
    lines.append("\nUpper bound on the GPU allocation (% of capacity) any placement of the pods arrived at 100% "
                 "demand holds: GPU-by-GPU configuration LP (benchmarks/optimum.py, HiGHS)"
                 + (", and the node-by-node one (CPU, memory, GPU by GPU), whose integer master gives a real "
                    "packing of the same pods: the optimum lies between the two" if args.node_level else "")
                 + f"; machine: {machine}")
    (args.out / "openb_optimum.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
