"""The autoscaling scenario suite (issue 30), every policy, three seeds, recorded.

    .venv/bin/python benchmarks/autoscale_suite.py [--label baseline]   # ~35 s wall on 2 shared cores

Writes benchmarks/results/autoscale_suite.json and autoscale_suite.md: the shapes of
:data:`gpupool.sim.inference_suite.SHAPES` (1-2 h each; chat mix = the shipped conversation trace, prompt-heavy
mix = shared/traces/azure_llm_2023 code trace), policies gpupool, static for the peak, HPA on GPU util 75 %,
KEDA on queue 5, Knative 44.8, seeds 7 / 8 / 9, SLO 99 % within 15 s end to end, a pool of 8 H200.
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
from gpupool.sim.inference_suite import SHAPES, run_suite, suite_markdown, suite_table  # noqa: E402

CODE = ROOT.parent / "shared" / "traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"


def machine() -> str:
    """The machine in one line, from :func:`_common.machine_info`."""
    m = machine_info()
    return f"{m['cores']}-core {m['cpu']}, Python {m['python']}, NumPy {m['numpy']}, {m['platform']}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="current", help="name of this run in the JSON (e.g. baseline)")
    ap.add_argument("--code-trace", type=Path, default=CODE, help="the Azure LLM code trace CSV")
    args = ap.parse_args(argv)
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    t0, cpu0 = time.perf_counter(), time.process_time()
    cells = run_suite(SHAPES, (7, 8, 9), code_trace=args.code_trace if args.code_trace.is_file() else None)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    path = out / "autoscale_suite.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    doc[args.label] = {"machine": machine(), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                       "shapes": {s.name: s.what for s in SHAPES}, "summary": suite_table(cells),
                       "cells": [c.__dict__ for c in cells]}
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    lines = [f"# Autoscaling scenario suite ({args.label})", "",
             f"Machine: {machine()}. {len(cells)} runs: {wall:.0f} s wall, {cpu:.0f} s CPU.", "",
             "Scenarios: " + "; ".join(f"`{s.name}` {s.what}" for s in SHAPES) + ".", ""]
    lines += suite_markdown(cells)
    name = "autoscale_suite" + ("" if args.label == "current" else f"_{args.label}")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
