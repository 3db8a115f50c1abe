"""The reference scenario of the inference simulator (issue 10), every policy, recorded.

    .venv/bin/python benchmarks/autoscale_reference.py   # ~20 s wall, ~10 s CPU on 2 shared cores (results/.md)

Writes benchmarks/results/autoscale_reference.{json,md} and autoscale_reference.png: the full day of
examples/autoscale/reference.yaml (Azure LLM conversation trace time-warped onto a diurnal envelope with two
bursts, Llama-3.1-8B on H200, SLO e2e <= 15 s for >= 99 % of requests).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _common import machine_info  # noqa: E402
from gpupool.sim.inference_policies import load_scenario  # noqa: E402
from gpupool.sim.inference_report import plot_run, run_scenario, to_json, verdict  # noqa: E402


def machine() -> str:
    """The machine in one line, from :func:`_common.machine_info`."""
    m = machine_info()
    return f"{m['cores']}-core {m['cpu']}, Python {m['python']}, NumPy {m['numpy']}, {m['platform']}"


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)  # --help, no options
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    sc = load_scenario(ROOT / "examples" / "autoscale" / "reference.yaml")
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    run = run_scenario(sc)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    doc = to_json(run)
    doc["machine"] = machine()
    doc["wall_s"] = round(wall, 1)
    doc["cpu_s"] = round(cpu, 1)
    for p in doc["policies"]:
        p.pop("series_5min", None)
    (out / "autoscale_reference.json").write_text(json.dumps(doc, indent=2) + "\n")
    plot_run(run, out / "autoscale_reference.png")
    lines = [
        "# Inference autoscaling: the reference scenario",
        "",
        f"`{run.title}`",
        "",
        f"Machine: {doc['machine']}. All {len(run.results)} policies: {wall:.0f} s wall, {cpu:.0f} s CPU "
        "(the machine is shared with other work; compare CPU seconds).",
        "Command: `.venv/bin/python benchmarks/autoscale_reference.py` (same as "
        "`gpupool autoscale simulate --wide`).",
        "",
        "| policy | meets SLO | in SLO | e2e p50 s | e2e p99 s | TTFT p99 s | GPU-h | vs static | replicas "
        "| lent GPU-h | reclaims (max s) | sim wall s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in doc["policies"]:
        rec = f"{p['reclaims']} ({p['reclaim_max_s']:.0f})" if p["reclaims"] else "0"
        vs = f"{p['vs_static']:.0%}" if p.get("vs_static") else ""
        lines.append(f"| {p['policy']} | {'yes' if p['meets_slo'] else '**no**'} | {p['slo_attainment']:.2%} | "
                     f"{p['e2e_p50_s']:.2f} | {p['e2e_p99_s']:.1f} | {p['ttft_p99_s']:.2f} | {p['gpu_hours']:.1f} | "
                     f"{vs} | {p['replicas_min']}-{p['replicas_max']} | {p['lent_gpu_hours']:.1f} | {rec} | "
                     f"{p['wall_s']:.1f} |")
    lines += ["", "Why (the command's per-policy lines):", ""]
    lines += [f"* {run.explanations[r.policy]}" for r in run.results]
    lines += ["", "Verdict:", ""] + [f"* {v}" for v in verdict(run)]
    lines += ["", "Policies as configured:", ""]
    lines += [f"* `{n}`: {p.describe()}" + (f" ({sc.notes[n]})" if sc.notes.get(n) else "")
              for n, p in run.policies.items()]
    (out / "autoscale_reference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
