"""``gpupool autoscale simulate --suite``: the scenario suite (issue 30) on the command line."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpupool.provenance import run_meta

#: Where the code trace is looked for when ``--code-trace`` is not given (relative to the working
#: directory and its parents): the project's shared data.
CODE_TRACE = Path("shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv")


def find_code_trace() -> Path | None:
    """The code trace beside or above the working directory, or None."""
    here = Path.cwd().resolve()
    for d in (here, *here.parents):
        if (d / CODE_TRACE).is_file():
            return d / CODE_TRACE
    return None


def run_suite_cmd(policies: list[str], seeds: str, code_trace: Path | None, json_file: str | None,
                  quiet: bool) -> None:
    """Run the suite and print its Markdown table (or JSON with ``--json -``); exit 2 on bad usage."""
    from gpupool.sim.inference import InferenceConfigError
    from gpupool.sim.inference_suite import POLICIES, SHAPES, run_suite, suite_markdown, suite_table
    from gpupool.traces.errors import TraceFormatError

    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        typer.echo(f"error: --seeds {seeds!r}: comma-separated integers expected", err=True)
        raise typer.Exit(2) from None
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not seed_list:
        what = f"--policies: unknown {', '.join(unknown)} (the suite has {', '.join(POLICIES)})" if unknown \
            else "--seeds: at least one seed"
        typer.echo(f"error: {what}", err=True)
        raise typer.Exit(2)
    if code_trace is not None and not code_trace.is_file():
        typer.echo(f"error: --code-trace {code_trace}: no such file", err=True)
        raise typer.Exit(2)
    trace = code_trace or find_code_trace()
    if trace is None:
        typer.echo("note: no code trace found (--code-trace): the prompt-heavy scenarios are skipped", err=True)

    def say(msg: str) -> None:
        if not quiet:
            typer.echo(f"suite: {msg}", err=True)

    try:
        cells = run_suite(SHAPES, seed_list, policies or None, code_trace=trace, progress=say)
    except (InferenceConfigError, TraceFormatError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if json_file:
        doc = {"meta": run_meta(), "summary": suite_table(cells), "cells": [c.__dict__ for c in cells]}
        text = json.dumps(doc, indent=2, default=str)
        if json_file == "-":
            typer.echo(text)
            return
        Path(json_file).write_text(text + "\n", encoding="utf-8")
    typer.echo("\n".join(suite_markdown(cells)))
