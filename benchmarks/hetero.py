"""Heterogeneity-aware job placement on a mixed cluster (issue 12 item 2): every job-level baseline and gpupool
speed-blind and with each objective, on the Philly trace over examples/clusters/mixed-models.yaml with catalog
speeds (``--gpu-speed catalog``): mean JCT, p95, makespan and energy.

    python benchmarks/hetero.py --max-jobs 3000            # a window: every policy and objective (minutes)
    python benchmarks/hetero.py --add results.json ...     # merge `gpupool compare --json` documents (whole trace)
    python benchmarks/hetero.py --render                   # rewrite hetero.md from hetero.json

Runs go in parallel on the local cores (:mod:`gpupool.sweep`). Results: benchmarks/results/hetero.{json,md},
keyed by window ("3000", "all"), with the machine. The whole trace takes ~3 CPU-minutes per gpupool run; the
same rows come from ``gpupool compare --jobs ../shared/traces/philly_pollux/philly.csv --cluster
examples/clusters/mixed-models.yaml --gpu-speed catalog --policies gpupool,lowest-power,fifo,round-robin,gittins
--objective jct,balanced,energy --json FILE`` then ``--add FILE``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from _common import json_safe, machine_info  # noqa: E402

TRACE = REPO.parent / "shared" / "traces" / "philly_pollux" / "philly.csv"
CLUSTER = REPO / "examples" / "clusters" / "mixed-models.yaml"
OUT = REPO / "benchmarks" / "results"
RUNS = ("fifo", "round-robin", "gittins", "lowest-power", "gpupool", "gpupool@jct", "gpupool@balanced",
        "gpupool@energy")
KEYS = ("mean_jct_s", "p95_jct_s", "makespan_s", "energy_kwh", "gpu_utilization", "preemptions", "unfinished_jobs",
        "wall_seconds")


def run_window(max_jobs: int | None, runs: list[str], workers: int | None, seed: int) -> list[dict]:
    from dataclasses import replace

    from gpupool import report
    from gpupool.clusterspec import load_cluster_yaml
    from gpupool.sim.jobs import JobSimConfig, run_jobs
    from gpupool.sweep import run_sweep
    from gpupool.traces.jobs import load_jobs

    nodes = load_cluster_yaml(CLUSTER)
    jobs = load_jobs(TRACE, "philly")
    jobs = jobs[:max_jobs] if max_jobs else jobs
    base = JobSimConfig(gpu_speed="catalog")

    def one(label: str, s: int, tick) -> dict:
        policy, _, objective = label.partition("@")
        res = run_jobs(nodes, jobs, policy, seed=s, config=replace(base, objective=objective or None))
        res.policy = label
        res.metrics["policy"] = label
        return report.run_from_jobs(res).record

    return run_sweep([(r, seed) for r in runs], one, workers=workers)


def row(rec: dict) -> dict:
    out = {"policy": rec["policy"], "seed": rec["seed"], "n_jobs": rec["n_jobs"]}
    out.update({k: rec.get(k) for k in KEYS})
    out["objective"] = (rec.get("config") or {}).get("objective")
    return out


def render(doc: dict) -> str:
    lines = ["# Heterogeneity-aware job placement on mixed-models (catalog speeds)", "",
             "Philly trace (`../shared/traces/philly_pollux/philly.csv`) on `examples/clusters/mixed-models.yaml`"
             " (176 GPUs: 32 H100, 32 A100-80GB, 16 L40S, 32 L4, 16 T4, 48 V100M32 = the speed reference), "
             "`--gpu-speed catalog`, seed 42. `gpupool` = speed-blind placement (today's default); "
             "`gpupool@X` = `--objective X` (`src/gpupool/engine/pool/hetero.py`). Energy: GPU board power, busy "
             "GPUs at peak, the rest idle, over the makespan (`gpupool.energy`).", ""]
    for window, block in doc["windows"].items():
        rows = block["rows"]
        best_e = min(r["energy_kwh"] for r in rows)
        base = [r for r in rows if not r["policy"].startswith("gpupool")]
        best_base = min(base, key=lambda r: r["mean_jct_s"]) if base else None
        lines += [f"## {'whole trace' if window == 'all' else f'first {window} jobs'} "
                  f"({rows[0]['n_jobs']:,} jobs)", "",
                  "| policy | mean JCT (h) | p95 JCT (h) | makespan (d) | energy (MWh) | vs best energy | "
                  "unfinished | wall (s) |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['policy']} | {r['mean_jct_s'] / 3600:.2f} | {r['p95_jct_s'] / 3600:.1f} | "
                         f"{r['makespan_s'] / 86400:.1f} | {r['energy_kwh'] / 1000:.2f} | "
                         f"{100 * (r['energy_kwh'] / best_e - 1):+.1f}% | {r['unfinished_jobs']} | "
                         f"{r['wall_seconds']:.0f} |")
        lines.append("")
        by = {r["policy"]: r for r in rows}
        ref = by.get("gpupool@jct")
        for name in ("gpupool@balanced", "gpupool@energy", "gpupool"):
            if ref and name in by:
                r = by[name]
                lines.append(f"* {name}: mean JCT {100 * (r['mean_jct_s'] / ref['mean_jct_s'] - 1):+.1f}%, energy "
                             f"{100 * (r['energy_kwh'] / ref['energy_kwh'] - 1):+.1f}% vs gpupool@jct")
        if best_base:
            for name in ("gpupool@balanced", "gpupool@jct"):
                if name in by:
                    r = by[name]
                    lines.append(f"* {name} vs the best baseline on mean JCT ({best_base['policy']}): "
                                 f"{100 * (r['mean_jct_s'] / best_base['mean_jct_s'] - 1):+.1f}% JCT; energy "
                                 f"{100 * (r['energy_kwh'] / best_e - 1):+.1f}% over the best energy of the table")
        lines += ["", f"Machine: {block['machine']['cpu']}, {block['machine']['cores']} cores (shared with other "
                  f"jobs, load average {block['machine']['load_average']}), Python {block['machine']['python']}, "
                  f"NumPy {block['machine']['numpy']}, {block['machine']['date']}. Wall times are under that load.",
                  ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-jobs", type=int, default=None, help="first N jobs (default: the whole trace)")
    ap.add_argument("--runs", default=",".join(RUNS), help="policy or policy@objective, comma-separated")
    ap.add_argument("--jobs-parallel", type=int, default=None)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--add", nargs="*", default=[], help="`gpupool compare --json` documents to merge")
    ap.add_argument("--render", action="store_true", help="only rewrite the .md from the .json")
    args = ap.parse_args()
    path = OUT / "hetero.json"
    doc = json.loads(path.read_text()) if path.exists() else {"windows": {}}
    if not args.render:
        records = []
        for f in args.add:
            for rec in json.loads(Path(f).read_text())["results"]:
                objective = (rec.get("config") or {}).get("objective")
                if objective and "@" not in rec["policy"]:  # one --objective: the CLI keeps the plain name
                    rec["policy"] = f"{rec['policy']}@{objective}"
                records.append(rec)
        if not args.add:
            if not TRACE.exists():
                sys.exit(f"{TRACE} not found")
            records = run_window(args.max_jobs, args.runs.split(","), args.jobs_parallel, args.seed)
        for rec in records:
            n = rec["n_jobs"]
            window = "all" if n >= 80000 else str(n)
            block = doc["windows"].setdefault(window, {"rows": []})
            block["rows"] = [r for r in block["rows"] if r["policy"] != rec["policy"]] + [row(rec)]
            block["rows"].sort(key=lambda r: RUNS.index(r["policy"]) if r["policy"] in RUNS else len(RUNS))
            block["machine"] = machine_info()
        path.write_text(json.dumps(json_safe(doc), indent=1) + "\n")
    (OUT / "hetero.md").write_text(render(doc))
    print((OUT / "hetero.md").read_text())


if __name__ == "__main__":
    main()
