"""``gpupool autoscale``: the inference simulator's command line (issue 10).

    gpupool autoscale simulate [--scenario FILE] [--policies a,b] [--seed N] [--hours H]
                               [--out DIR] [--json FILE] [--wide] [--quiet]

Runs the scenario's scaling policies side by side on one day of LLM requests (default: the reference
scenario ``examples/autoscale/reference.yaml``, the Azure LLM conversation trace time-warped onto a
diurnal envelope with two bursts) and prints a table, one line per policy saying why it misses the SLO
or what meeting it cost, and gpupool's verdict. Exit codes: 0 success; 1 a policy failed at run time;
2 bad usage, a bad scenario/throughput file or a malformed trace (file, line, column); 130 Ctrl-C.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from gpupool.cli.common import RunProgress, check_outputs, print_table, split
from gpupool.provenance import run_meta

app = typer.Typer(
    name="autoscale",
    help="Demand-driven scaling of GPU inference services: simulate scaling policies on an LLM trace.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

REFERENCE = Path("examples/autoscale/reference.yaml")


def _fail(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def _reference() -> Path:
    here = Path(__file__).resolve().parents[3] / REFERENCE
    return REFERENCE if REFERENCE.exists() else here


@app.command("simulate", short_help="Simulate scaling policies on an LLM request trace.")
def simulate_cmd(
    scenario: Annotated[Path | None, typer.Option(
        "--scenario", metavar="FILE", dir_okay=False, show_default=False,
        help="Scenario YAML (kind InferenceScenario). Default: examples/autoscale/reference.yaml.")] = None,
    policies: Annotated[list[str] | None, typer.Option(
        "--policies", "-p", metavar="A,B,...", show_default=False,
        help="Policies of the scenario to run, comma-separated or repeated. Default: all of them.")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", metavar="N", show_default=False, help="Seed of the arrivals. Default: the scenario's.")] = None,
    hours: Annotated[float | None, typer.Option(
        "--hours", metavar="H", show_default=False,
        help="Simulate only the first H hours of the scenario's day (quick looks).")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", metavar="FILE", dir_okay=False, show_default=False,
        help="Azure LLM trace CSV (TIMESTAMP,ContextTokens,GeneratedTokens; .csv or .csv.gz). Default: "
             "the scenario's (the shipped conversation trace).")] = None,
    throughput: Annotated[Path | None, typer.Option(
        "--throughput", metavar="FILE", dir_okay=False, show_default=False,
        help="Throughput table YAML. Default: the shipped gpupool/data/inference_throughput.yaml.")] = None,
    out: Annotated[Path | None, typer.Option(
        "--out", metavar="DIR", show_default=False,
        help="Write autoscale.png here (latency and GPUs over the day per policy).")] = None,
    json_file: Annotated[str | None, typer.Option(
        "--json", metavar="FILE", show_default=False,
        help="Write the results as JSON; '-' prints them to stdout instead of the table.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="Print every column, wider than the terminal if "
                                                     "need be.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress: neither the bar (terminal) nor "
                                                             "the progress lines on stderr.")] = False,
    suite: Annotated[bool, typer.Option("--suite", help="Run the scenario suite instead (issue 30): step, ramp, "
                                                       "flash crowd, oscillation, idle, scale from zero, day, on "
                                                       "the chat and code token mixes; every policy, 3 seeds.")
                  ] = False,
    seeds: Annotated[str, typer.Option("--seeds", metavar="A,B,...", help="Seeds of the suite.")] = "7,8,9",
    code_trace: Annotated[Path | None, typer.Option(
        "--code-trace", metavar="FILE", dir_okay=False, show_default=False,
        help="Azure LLM code trace CSV for the suite's prompt-heavy scenarios. Default: "
             "shared/traces/azure_llm_2023/AzureLLMInferenceTrace_code.csv beside or above the working "
             "directory; without it those scenarios are skipped.")] = None,
) -> None:
    """Run scaling policies side by side on a day of LLM requests and compare latency and GPU-hours.

    Policies (in the reference scenario): static for the peak, HPA on CPU, HPA on GPU utilisation,
    KEDA on queue depth, Knative on concurrency, gpupool's recommender on whole GPUs, and gpupool's
    recommender with right-sizing (MIG / time-slice / whole GPU chosen by load). A request meets the SLO
    when its end-to-end latency is within the bound; a policy meets it when enough requests do.
    """
    from gpupool.sim.inference import InferenceConfigError
    from gpupool.sim.inference_policies import load_scenario
    from gpupool.sim.inference_report import plot_run, results_table, run_scenario, to_json, verdict
    from gpupool.traces.errors import TraceFormatError

    names = list(dict.fromkeys(split(policies)))  # once each
    if suite:
        from gpupool.cli.autoscale_suite import run_suite_cmd

        given = [o for o, v in (("--scenario", scenario), ("--seed", seed), ("--hours", hours), ("--trace", trace),
                                ("--throughput", throughput), ("--out", out)) if v is not None]
        if given:
            raise _fail(f"--suite runs its own scenarios: {', '.join(given)} cannot be used with it (--seeds, "
                        "--policies, --code-trace, --json can)")
        check_outputs(None, json_file, [])

        run_suite_cmd(names, seeds, code_trace, json_file, quiet)
        return
    if policies is not None and not names:
        raise _fail(f"--policies {','.join(policies)!r}: no policy name given")
    path = scenario if scenario is not None else _reference()
    # refused now rather than after an hour of simulation (the results would be lost with the traceback)
    check_outputs(out, json_file, ["autoscale.png"])
    for option, given in (("--trace", trace), ("--throughput", throughput)):
        if given is not None and not given.is_file():
            raise _fail(f"{option} {given}: no such file")
    try:
        sc = load_scenario(path)
    except InferenceConfigError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        raise _fail(f"--scenario {path}: {exc.strerror or exc}") from None
    console = Console()
    to_stdout = json_file == "-"
    total = len(names or sc.policies)
    # a bar on a terminal, else a progress line on stderr every 15 s (as gpupool compare)
    progress = RunProgress(total, quiet=quiet)

    def tick(k: int, name: str, f: float) -> None:
        progress.description = f"{name} [{k + 1}/{total}]"  # the bar's and the stderr lines' label
        progress.update(k + f, description=progress.description)

    try:
        with progress:
            run = run_scenario(sc, policies=names or None, seed=seed, hours=hours, trace=trace,
                               throughput=throughput, progress=tick)
    except TraceFormatError as exc:
        raise _fail(str(exc)) from None
    except InferenceConfigError as exc:
        raise _fail(str(exc)) from None
    except OSError as exc:
        if exc.filename:  # an input named by the scenario (its trace, its throughput table) cannot be read
            raise _fail(f"{path.name}: {exc.filename}: {exc.strerror or exc}") from None
        raise _fail(str(exc), code=1) from None
    except ValueError as exc:
        raise _fail(str(exc), code=1) from None
    doc = {"meta": run_meta(), **to_json(run)}
    if to_stdout:
        typer.echo(json.dumps(doc, indent=2))
    else:
        print_table(console, results_table(run, wide=wide), wide)
        for name in (r.policy for r in run.results):
            console.print(run.explanations[name], highlight=False, soft_wrap=wide)
        for line in verdict(run):
            console.print(line, highlight=False, soft_wrap=wide)
    try:
        if json_file and not to_stdout:
            Path(json_file).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        if out is not None and run.results:
            plot_run(run, out / "autoscale.png")
    except OSError as exc:  # the table is printed above: the results are not lost
        raise _fail(f"writing {exc.filename or 'the results'}: {exc.strerror or exc}", code=1) from None
    if run.interrupted:
        typer.echo(f"interrupted (Ctrl-C) after {len(run.results)} of {total} policies", err=True)
        raise typer.Exit(130)
