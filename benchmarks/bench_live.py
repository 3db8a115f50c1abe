"""The live scheduler's cost: cycle latency on the incremental model, and binds/s end to end.

Method
------
**cycle** (``--part cycle``): what one scheduling cycle of the live scheduler costs at a given cluster size.
For each size (default 1,000 nodes / 6,000 bound pods and 5,000 nodes / 30,000 bound pods):

1. A cluster of GPU nodes is built as the API returns it (Node dicts with GFD labels: 60 % H100 80 GB,
   25 % A100 80 GB, 15 % L40S; 8 GPUs, 64 cores, 512 GiB each) and bound pods spread over it at random
   (seeded): whole GPUs (1 or 2), KAI fractions (0.25, 0.5) and HAMi memory-sized shares, each with
   gpupool's device annotations, as a running cluster has them. Not timed.
2. The objects go through the live scheduler's own path: :class:`~gpupool.k8s.scheduler.ClusterCache`
   (as the reflectors fill it after their lists) drained into a :class:`~gpupool.k8s.cache.model.ClusterModel`,
   and one warm-up cycle (the first cycle builds the state: reported as ``build_s``).
3. **Timed rounds** (default 200): each round, ``pending`` new pods arrive (``ADDED`` events; 1 or 100),
   plus churn as on a busy cluster: as many bound pods finish as were placed in the previous round, at least 2
   (``MODIFIED`` to ``Succeeded``; the cluster stays as full as it started), and the pods
   placed in the previous round show up bound (``MODIFIED`` with ``spec.nodeName`` and the annotations, as
   the watch reports a binding). The cycle time is the wall time of ``cache.drain(model)`` +
   ``model.cycle()``: applying the changes since the last cycle and planning every pending pod, which is
   what ``Scheduler.run_cycle`` does before it hands the placements to the binders. p50 / p99 / max over
   the rounds.
4. For the ratio in the same run, the former cost: one from-scratch cycle (``plan`` on a snapshot of every
   object: every node and pod parsed and the state rebuilt, as the scheduler did every cycle before the
   incremental model), median of 3.

**real** (``--part real``): binds/s end to end against a real kube-apiserver and etcd on loopback, started
with ``../shared/tools/kube-control-plane/start.sh`` (skipped with a message when its binaries are not built:
see that folder's README). ``--real-nodes`` nodes (default 200) x 8 GPUs are created (status through the
status subresource, the not-ready taint lifted), then ``--real-pods`` one-GPU pods (default 1,000) in two
halves: a *backlog* (created before the scheduler starts: seconds from ``Scheduler.start()``, lists
included, to the last binding) and a *stream* (created by 4 threads while the scheduler runs: seconds from
the first create to the last binding, so binds/s cannot exceed the creation rate). The scheduler runs
in-process with the default config (8 binders). Reported: both rates, the cycle times, and GPUs
over-allocated (read back from the API: pods per node beyond its GPUs, and gpupool device annotations used
twice) and pods bound without gpupool's annotations, which must both be 0.

Output: ``benchmarks/results/live.json`` and ``live.md`` (``--out``), with the machine (CPU model, cores,
Python and NumPy versions, load average, date).

Usage::

    python benchmarks/bench_live.py                      # cycle part, both sizes
    python benchmarks/bench_live.py --part real          # real kube-apiserver (binaries built once per machine)
    python benchmarks/bench_live.py --part all --sizes 1000:6000
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import json_safe, machine_info  # noqa: E402
from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_NODE  # noqa: E402
from gpupool.k8s.api.watch import ClusterCache  # noqa: E402
from gpupool.k8s.cycle.planner import plan  # noqa: E402
from gpupool.k8s.objects.snapshots import ClusterSnapshot  # noqa: E402
from gpupool.k8s.state import ClusterModel  # noqa: E402

PRODUCTS = (("NVIDIA-H100-80GB-HBM3", 0.60, "81559"), ("NVIDIA-A100-SXM4-80GB", 0.25, "81920"),
            ("NVIDIA-L40S", 0.15, "46068"))


class Factory:
    """Node and Pod dicts as the API returns them, with increasing resourceVersions."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.rv = 1000
        self.n = 0

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def node(self, i: int) -> dict:
        r = self.rng.random()
        acc = 0.0
        product, memory = PRODUCTS[-1][0], PRODUCTS[-1][2]
        for name, share, mib in PRODUCTS:
            acc += share
            if r <= acc:
                product, memory = name, mib
                break
        return {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": f"gpu-{i:05d}", "uid": f"node-{i}", "resourceVersion": self.next_rv(),
                             "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": memory,
                                        "nvidia.com/gpu.count": "8", "kubernetes.io/hostname": f"gpu-{i:05d}"}},
                "spec": {},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}}

    def pod(self, kind: str | None = None) -> dict:
        self.n += 1
        kind = kind or self.rng.choice(("whole", "whole", "two", "quarter", "half", "memory"))
        ann: dict = {}
        limits: dict = {}
        if kind == "whole":
            limits = {"nvidia.com/gpu": "1"}
        elif kind == "two":
            limits = {"nvidia.com/gpu": "2"}
        elif kind in ("quarter", "half"):
            ann["gpu-fraction"] = "0.25" if kind == "quarter" else "0.5"
        else:
            limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000"}
        team = f"team-{self.n % 8}"
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"p{self.n}", "namespace": team, "uid": f"uid-{self.n}",
                             "resourceVersion": self.next_rv(), "annotations": ann, "labels": {"app": "bench"},
                             "creationTimestamp": "2026-11-30T00:00:00Z"},
                "spec": {"schedulerName": "gpupool",
                         "containers": [{"name": "c", "resources": {"limits": limits,
                                                                    "requests": {"cpu": "1", "memory": "4Gi"}}}]},
                "status": {"phase": "Pending"}}

    def bound(self, pod: dict, node: str, gpus: tuple[int, ...], milli: int, memory: int) -> dict:
        out = copy.deepcopy(pod)
        out["metadata"]["resourceVersion"] = self.next_rv()
        out["metadata"]["annotations"].update({ANN_NODE: node, ANN_GPU_INDEX: ",".join(map(str, gpus)),
                                               ANN_GPU_MILLI: str(milli), ANN_GPU_MEMORY: str(memory)})
        out["spec"]["nodeName"] = node
        out["status"]["phase"] = "Running"
        return out

    def finished(self, pod: dict) -> dict:
        out = copy.deepcopy(pod)
        out["metadata"]["resourceVersion"] = self.next_rv()
        out["status"]["phase"] = "Succeeded"
        return out


SHARES = "trust"  # the stream places fractional and memory-sized pods: measured as placed (--share-enforcement trust)


def build_cluster(n_nodes: int, n_pods: int, seed: int) -> tuple[Factory, list[dict], list[dict]]:
    """Nodes and bound pods: the pods are placed by gpupool's own engine (a dry-run cycle) so that every
    device annotation is one the cluster can hold."""
    f = Factory(seed)
    nodes = [f.node(i) for i in range(n_nodes)]
    model = ClusterModel(policy="best-fit", seed=seed, share_enforcement=SHARES)
    model.replace("nodes", nodes)
    model.replace("pods", [])
    pods: list[dict] = []
    batch = 2000
    while len(pods) < n_pods:
        new = [f.pod() for _ in range(min(batch, n_pods - len(pods)))]
        for p in new:
            model.apply("pods", "ADDED", p)
        result = model.cycle()
        by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in new}
        for pl in result.placements:
            if pl.node is None:
                continue
            b = f.bound(by_key[pl.pod], pl.node, pl.gpus, pl.gpu_milli, pl.gpu_memory_mib)
            model.apply("pods", "MODIFIED", b)
            pods.append(b)
        if not result.placed:
            raise SystemExit(f"cluster full after {len(pods)} pods; use more nodes")
    return f, nodes, pods


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def part_cycle(n_nodes: int, n_pods: int, pending: int, rounds: int, seed: int, freeze: bool = True,
               pool: bool = True) -> dict:
    t = time.perf_counter()
    f, nodes, pods = build_cluster(n_nodes, n_pods, seed)
    setup_s = time.perf_counter() - t
    cache = ClusterCache()
    model = ClusterModel(seed=seed, share_enforcement=SHARES)
    if pool:  # the pool scheduler runs the cycle, as `gpupool scheduler` does by default
        from gpupool.k8s.cycle.pool import PoolDriver

        PoolDriver(model)
    cache.replace("nodes", nodes)
    cache.replace("pods", pods)
    cache.replace("podgroups", [])
    cache.replace("queues", None)
    t = time.perf_counter()
    cache.drain(model)
    load_s = time.perf_counter() - t
    warm = f.pod("whole")
    cache.apply("pods", "ADDED", warm)
    t = time.perf_counter()
    cache.drain(model)
    model.cycle()
    build_s = time.perf_counter() - t
    if freeze:  # as `gpupool scheduler` does after its first sync: the listed objects leave the GC's scans
        gc.collect()
        gc.freeze()
    rng = random.Random(seed)
    running = list(pods)
    last: list = []
    objects: dict[str, dict] = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in pods}
    objects[f"{warm['metadata']['namespace']}/{warm['metadata']['name']}"] = warm
    times: list[float] = []
    placed = 0
    parsed0 = model.stats["parsed_pods"]
    for _ in range(rounds):
        for pl in last:  # the watch shows last round's placements bound
            b = f.bound(objects[pl.pod], pl.node, pl.gpus, pl.gpu_milli, pl.gpu_memory_mib)
            objects[pl.pod] = b
            running.append(b)
            cache.apply("pods", "MODIFIED", b)
        for _ in range(max(2, len(last))):  # churn: as many running pods finish as started (steady fill)
            done = running.pop(rng.randrange(len(running)))
            cache.apply("pods", "MODIFIED", f.finished(done))
        for _ in range(pending):
            p = f.pod()
            objects[f"{p['metadata']['namespace']}/{p['metadata']['name']}"] = p
            cache.apply("pods", "ADDED", p)
        t = time.perf_counter()
        cache.drain(model)
        result = model.cycle()
        times.append(time.perf_counter() - t)
        last = [p for p in result.placements if p.node is not None]
        placed += len(last)
    model.refresh()
    model.state.check_invariants()
    if freeze:
        gc.unfreeze()
    # the former cost: a from-scratch cycle on every object (one pending pod)
    snap = ClusterSnapshot(nodes=nodes, pods=list(objects.values()) + [f.pod("whole")], pod_groups=[],
                           queues=None)
    scratch = []
    for _ in range(3):
        t = time.perf_counter()
        plan(snap, share_enforcement=SHARES)
        scratch.append(time.perf_counter() - t)
    ms = [x * 1000 for x in times]
    return {"mode": "pool" if pool else "part1", "nodes": n_nodes, "bound_pods": n_pods,
            "pending_per_cycle": pending, "rounds": rounds,
            "placed": placed, "setup_s": round(setup_s, 2), "load_s": round(load_s, 3), "build_s": round(build_s, 3),
            "cycle_ms_p50": round(pct(ms, 50), 3), "cycle_ms_p99": round(pct(ms, 99), 3),
            "cycle_ms_max": round(max(ms), 3), "per_pod_ms_p50": round(pct(ms, 50) / pending, 4),
            "pods_parsed_per_cycle": (model.stats["parsed_pods"] - parsed0) / rounds,
            "rebuilds": model.stats["rebuilds"], "gc_freeze": freeze,
            "from_scratch_cycle_s": round(statistics.median(scratch), 3),
            "speedup_p50": round(statistics.median(scratch) * 1000 / max(pct(ms, 50), 1e-9), 1)}


# ------------------------------------------------------------------ real kube-apiserver
def part_real(n_nodes: int, n_pods: int, timeout_s: float) -> dict:
    import logging

    from kubernetes import client

    from gpupool.k8s.api.client import load_api_client
    from gpupool.k8s.scheduler import Scheduler, SchedulerConfig

    tool = ROOT.parent / "shared" / "tools" / "kube-control-plane"
    if not (tool / "start.sh").exists():
        return {"skipped": f"{tool} not found"}
    started = subprocess.run(["bash", str(tool / "start.sh")], capture_output=True, text=True)
    if started.returncode != 0:
        return {"skipped": f"start.sh exit {started.returncode}: {started.stderr.strip()[-300:]}"}
    kubeconfig = started.stdout.strip().splitlines()[-1]
    logging.getLogger("gpupool").setLevel(logging.WARNING)
    import urllib3

    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)  # loopback, self-signed: said once here
    out: dict = {"nodes": n_nodes, "pods": n_pods}
    sched = None
    try:
        api = load_api_client(Path(kubeconfig), None, writers=SchedulerConfig().bind_workers)  # as the CLI does
        version = client.VersionApi(api).get_code()
        out["kube_apiserver"] = version.git_version
        if version.git_version.startswith("v0.0.0"):  # built from a source tree without version stamps
            out["kube_apiserver"] = f"{version.major}.{version.minor} (built from source, unstamped)"
        core = client.CoreV1Api(api)
        for i in range(n_nodes):
            name = f"gpu-{i:04d}"
            core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}}})
            core.patch_node_status(name, {"status": {
                "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "fake", "lastHeartbeatTime": None, "lastTransitionTime": None}]}})
            # the TaintNodesByCondition admission plugin taints every new node not-ready; no controller
            # lifts it here, as the node lifecycle controller would once the node reports Ready
            core.patch_node(name, {"spec": {"taints": None}}, _content_type="application/merge-patch+json",
                            _preload_content=False).read()
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "", "namespace": "default"},
                "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "64Mi"}}}]}}

        def create(names: list[str]) -> None:
            pod = copy.deepcopy(body)
            for name in names:
                pod["metadata"]["name"] = name
                core.create_namespaced_pod("default", pod, _preload_content=False).read()

        def create_all(prefix: str, n: int, threads: int = 4) -> float:
            t = time.monotonic()
            names = [f"{prefix}-{j:05d}" for j in range(n)]
            with ThreadPoolExecutor(threads) as pool:
                list(pool.map(create, [names[k::threads] for k in range(threads)]))
            return time.monotonic() - t

        def wait_bound(n: int) -> float:
            deadline = time.monotonic() + timeout_s
            while len(sched.bindings) < n and time.monotonic() < deadline:
                time.sleep(0.01)
            return time.monotonic()

        # 1. backlog: n/2 pods wait before the scheduler starts; time from its start to the last binding
        half = n_pods // 2
        out["backlog_created_s"] = round(create_all("backlog", half), 2)
        sched = Scheduler(api, SchedulerConfig(identity="bench", share_enforcement=SHARES))
        t0 = time.monotonic()
        sched.start()
        t_end = wait_bound(half)
        out.update({"backlog_pods": half, "backlog_bound": len(sched.bindings),
                    "backlog_s": round(t_end - t0, 2),
                    "backlog_binds_per_s": round(len(sched.bindings) / (t_end - t0), 1)})
        # 2. stream: the other n/2 created (4 threads) while the scheduler runs; first create to last binding
        before = len(sched.bindings)
        t0 = time.monotonic()
        created = create_all("stream", n_pods - half)
        t_end = wait_bound(n_pods)
        bound = len(sched.bindings)
        out.update({"created_s": round(created, 2), "bound": bound, "stream_pods": n_pods - half,
                    "end_to_end_s": round(t_end - t0, 2),
                    "binds_per_s_end_to_end": round((bound - before) / (t_end - t0), 1)})
        times = sorted(sched.cycle_seconds)
        out["cycle_ms_p50"] = round(pct([x * 1000 for x in times], 50), 2)
        out["cycle_ms_p99"] = round(pct([x * 1000 for x in times], 99), 2)
        # over-allocation, read back from the API
        pods = json.loads(core.list_namespaced_pod("default", _preload_content=False).data)["items"]
        per_node: dict[str, int] = {}
        devices: dict[tuple[str, str], int] = {}
        for p in pods:
            node = p["spec"].get("nodeName")
            if not node:
                continue
            per_node[node] = per_node.get(node, 0) + 1
            ann = p["metadata"].get("annotations") or {}
            for g in (ann.get(ANN_GPU_INDEX) or "").split(","):
                if g:
                    devices[(node, g)] = devices.get((node, g), 0) + 1
        out["bound_in_api"] = sum(per_node.values())
        out["gpus_over_allocated"] = sum(max(0, c - 8) for c in per_node.values()) + sum(
            c - 1 for c in devices.values() if c > 1)
        out["pods_without_annotations"] = sum(1 for p in pods if p["spec"].get("nodeName") and ANN_NODE not in (
            p["metadata"].get("annotations") or {}))
    finally:
        if sched is not None:
            sched.stop()
        subprocess.run(["bash", str(tool / "stop.sh"), kubeconfig, "--rm"], capture_output=True)
    return out


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Live scheduler benchmark ({m['date']})", "",
             f"Machine: {m['cpu']}, {m['cores']} cores, Python {m['python']}, NumPy {m['numpy']}, "
             f"load average {m['load_average'][0]:.2f} at start. Written by `benchmarks/bench_live.py`.", ""]
    if report.get("cycle"):
        lines += ["## Cycle time on the incremental model (drain changes + plan the pending pods)", "",
                  "| mode | nodes | bound pods | pending/cycle | cycle p50 ms | p99 ms | max ms | pods parsed/cycle "
                  "| first build s | from-scratch cycle s | p50 speed-up |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in report["cycle"]:
            lines.append(f"| {r.get('mode', 'part1')} | {r['nodes']:,} | {r['bound_pods']:,} | "
                         f"{r['pending_per_cycle']} | {r['cycle_ms_p50']} | "
                         f"{r['cycle_ms_p99']} | {r['cycle_ms_max']} | {r['pods_parsed_per_cycle']:.1f} | "
                         f"{r['build_s']} | {r['from_scratch_cycle_s']} | {r['speedup_p50']}x |")
        lines.append("")
    real = report.get("real")
    if real:
        lines += ["## End to end against a real kube-apiserver", ""]
        if "skipped" in real:
            lines.append(f"Skipped: {real['skipped']}")
        else:
            lines += ["| apiserver | nodes | pods | backlog: pods, s from start, binds/s | stream: pods, created in s, "
                      "first create to last bind s, binds/s | cycle p50 / p99 ms | GPUs over-allocated "
                      "| bound without annotations |",
                      "|---|---:|---:|---|---|---|---:|---:|",
                      f"| {real.get('kube_apiserver')} | {real['nodes']} | {real['pods']} | "
                      f"{real['backlog_pods']}, {real['backlog_s']}, **{real['backlog_binds_per_s']}** | "
                      f"{real['stream_pods']}, {real['created_s']}, {real['end_to_end_s']}, "
                      f"**{real['binds_per_s_end_to_end']}** | {real['cycle_ms_p50']} / {real['cycle_ms_p99']} | "
                      f"{real['gpus_over_allocated']} | {real['pods_without_annotations']} |"]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("cycle", "real", "all"), default="cycle")
    ap.add_argument("--sizes", default="1000:6000,5000:30000", help="NODES:BOUND_PODS, comma-separated")
    ap.add_argument("--pending", default="1,100", help="pending pods per cycle, comma-separated")
    ap.add_argument("--rounds", type=int, default=200, help="timed cycles per (size, pending)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--modes", default="pool,part1",
                    help="cycle modes, comma-separated: pool (the pool scheduler, the default) and part1 (--no-pool)")
    ap.add_argument("--real-nodes", type=int, default=200)
    ap.add_argument("--real-pods", type=int, default=1000)
    ap.add_argument("--real-timeout", type=float, default=300.0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "live.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    report["machine"] = machine_info()
    if args.part in ("cycle", "all"):
        report["cycle"] = []
        for size in args.sizes.split(","):
            n_nodes, n_pods = (int(x) for x in size.split(":"))
            for pending in (int(x) for x in args.pending.split(",")):
                for mode in args.modes.split(","):
                    rounds = args.rounds if pending == 1 else max(20, args.rounds // 4)
                    r = part_cycle(n_nodes, n_pods, pending, rounds, args.seed, pool=mode == "pool")
                    print(json.dumps(r), flush=True)
                    report["cycle"].append(r)
    if args.part in ("real", "all"):
        report["real"] = part_real(args.real_nodes, args.real_pods, args.real_timeout)
        print(json.dumps(report["real"]), flush=True)
    path.write_text(json.dumps(json_safe(report), indent=2) + "\n")
    (out / "live.md").write_text(markdown(report) + "\n")
    print(f"wrote {path} and {out / 'live.md'}")


if __name__ == "__main__":
    main()
