"""The ``gpupool`` command line: list the placement policies, simulate one, compare several.

    gpupool policies [--json]
    gpupool simulate [--policy gpupool] [common options]
    gpupool compare  [--policies a,b,c] [common options]

Common options: ``--nodes FILE --pods FILE`` (openb CSVs; default: the embedded Alibaba openb trace),
``--protocol inflation|replay``, ``--seed N`` (repeatable, or ``--seeds 42,43``), ``--ratio 1.3``,
``--out DIR`` (PNG plots), ``--json FILE`` (``-`` for stdout), ``--quiet``.

Job traces (the pool scheduler, :mod:`gpupool.sim.jobs`): ``--jobs FILE [--format philly|itp]
--cluster FILE.yaml [--queues FILE.yaml]`` replays a Philly or ITP job trace on the cluster file's nodes
with the job-level policies ``fifo``, ``round-robin`` and ``gpupool`` (default), plus the failure,
checkpoint, elastic and GPU-speed options listed in ``--help``.

Exit codes: 0 success; 2 bad usage, unknown policy, unreadable or malformed trace (the message names
the file, the line and the column), or an unavailable protocol.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    SpinnerColumn,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from gpupool import __version__, report
from gpupool.model import GpupoolError, NodeSpec, PodRequest
from gpupool.policies import BASELINES, DEFAULT_POLICY, REGISTRY
from gpupool.traces import TraceFormatError, load_jobs, load_openb_nodes, load_openb_pods

EMBEDDED_NODES = "openb_node_list_gpu_node.csv"
EMBEDDED_PODS = "openb_pod_list_default.csv"

app = typer.Typer(
    name="gpupool",
    help=(
        "GPU pool orchestrator for shared Kubernetes clusters: compare GPU placement policies on "
        "public cluster traces (by default the embedded Alibaba openb trace, Weng et al., ATC'23)."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain click help: wrapped to the terminal (at most 100 columns), nothing cut with "…", no <bool>
    # placeholders for flags. The commands added by EXTENSION_MODULES inherit these settings.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)

EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), once the finished runs are written."""

LOG_PROGRESS_INTERVAL_S = 15.0
"""Seconds between two progress lines on stderr when it is not a terminal."""


class Protocol(StrEnum):
    inflation = "inflation"
    replay = "replay"


# --------------------------------------------------------------------------------------------------
# Options shared by simulate and compare

NodesOpt = Annotated[
    Path | None,
    typer.Option(
        "--nodes", metavar="FILE", dir_okay=False, show_default=False,
        help="openb node list CSV (columns sn, cpu_milli, memory_mib, gpu, model). Default: the embedded "
             f"{EMBEDDED_NODES} (1,213 GPU nodes, 6,212 GPUs).",
    ),
]
PodsOpt = Annotated[
    Path | None,
    typer.Option(
        "--pods", metavar="FILE", dir_okay=False, show_default=False,
        help="openb pod list CSV (columns name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec, qos, ...]). "
             f"Default: the embedded {EMBEDDED_PODS} (8,152 pods).",
    ),
]
ProtocolOpt = Annotated[
    Protocol,
    typer.Option(
        "--protocol", case_sensitive=False, metavar="inflation|replay",
        help="inflation: the FGD paper's workload inflation (pods shuffled and resampled up to --ratio x "
             "GPU capacity, placed one by one, never leave). replay: the trace replayed in time with "
             "arrivals and departures.",
    ),
]
SeedOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--seed", "--seeds", metavar="N[,N...]", show_default=False,
        help="Random seed(s); repeat the option or give a comma list (--seeds 42,43,44). Several seeds "
             "show mean ± std. Default: 42.",
    ),
]
RatioOpt = Annotated[
    float,
    typer.Option(
        "--ratio", metavar="R",
        help="inflation only: submitted GPU demand as a multiple of the cluster GPU capacity.",
    ),
]
OutOpt = Annotated[
    Path | None,
    typer.Option(
        "--out", metavar="DIR", show_default=False,
        help="Write PNG plots here (created if needed): allocation_vs_arrived.png (inflation) or "
             "allocation_over_time.png (replay), and unallocated_gpus.png.",
    ),
]
JsonOpt = Annotated[
    str | None,
    typer.Option(
        "--json", metavar="FILE", show_default=False,
        help="Write every result (one per policy and seed) and the per-policy summary as JSON; '-' "
             "prints it to stdout instead of the table.",
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option("--quiet", "-q", help="No progress: neither the bar (terminal) nor the progress lines "
                 f"written to stderr every {LOG_PROGRESS_INTERVAL_S:g} s when it is not a terminal."),
]
WideOpt = Annotated[
    bool,
    typer.Option("--wide", help="Print the table at its full width (no abbreviated numbers or headers, "
                 "no dropped columns), wider than the terminal if need be."),
]


class JobFormat(StrEnum):
    philly = "philly"
    itp = "itp"


JobsOpt = Annotated[
    Path | None,
    typer.Option(
        "--jobs", metavar="FILE", dir_okay=False, show_default=False,
        help="Job trace CSV (Philly columns: timestamp, duration, num_gpus, gpu_time, cluster; "
             "ITP: job_id, submission_time, duration, num_gpu): run the pool scheduler's job-level policies "
             "(fifo, round-robin, gpupool, gittins, lowest-power: `gpupool policies --jobs`) instead of pod "
             "placement. Needs --cluster.",
        rich_help_panel="Job traces",
    ),
]
FormatOpt = Annotated[
    JobFormat | None,
    typer.Option("--format", case_sensitive=False, show_default=False, metavar="philly|itp",
                 help="Format of --jobs (default: detected from its header).", rich_help_panel="Job traces"),
]
ClusterOpt = Annotated[
    Path | None,
    typer.Option("--cluster", metavar="FILE.yaml", dir_okay=False, show_default=False,
                 help="Cluster file (node pools: count, GPU model, GPUs per node, NVLink, racks, switches); "
                      "see examples/clusters/.", rich_help_panel="Job traces"),
]
QueuesOpt = Annotated[
    Path | None,
    typer.Option("--queues", metavar="FILE.yaml", dir_okay=False, show_default=False,
                 help="Queue file (name, parent, quota, limit, weight, priority). Default: one queue per "
                      "Philly virtual cluster with a quota in proportion to its GPU-time demand (one queue "
                      "for ITP).", rich_help_panel="Job traces"),
]
CheckpointOpt = Annotated[
    float,
    typer.Option("--checkpoint-interval", metavar="S", help="Seconds of progress between job checkpoints "
                 "(0: none; an evicted job always checkpoints first).",
                 rich_help_panel="Job traces"),
]
NodeMtbfOpt = Annotated[
    float | None,
    typer.Option("--node-mtbf-hours", metavar="H", show_default=False,
                 help="Inject node failures (seeded) with this mean time between failures.",
                 rich_help_panel="Job traces"),
]
GpuMtbfOpt = Annotated[
    float | None,
    typer.Option("--gpu-mtbf-hours", metavar="H", show_default=False,
                 help="Inject single-GPU failures (seeded) with this mean time between failures.",
                 rich_help_panel="Job traces"),
]
RepairOpt = Annotated[
    float,
    typer.Option("--repair-hours", metavar="H", help="Hours until a failed node or GPU is back.",
                 rich_help_panel="Job traces"),
]
ElasticOpt = Annotated[
    float,
    typer.Option("--elastic-fraction", metavar="F", help="Share of multi-GPU jobs made elastic "
                 "(half to double their pods).", rich_help_panel="Job traces"),
]
GpuSpeedOpt = Annotated[
    str,
    typer.Option("--gpu-speed", metavar="none|catalog", help="none: trace durations on every GPU model; "
                 "catalog: scaled by the catalog's relative throughput (energy vs JCT studies).",
                 rich_help_panel="Job traces"),
]
MaxJobsOpt = Annotated[
    int | None,
    typer.Option("--max-jobs", metavar="N", show_default=False, help="Only the first N jobs of the trace.",
                 rich_help_panel="Job traces"),
]
_MODEL = "Job model (match another simulator)"
RestartOpt = Annotated[
    float, typer.Option("--restart-overhead", metavar="S", help="Seconds a job stalls at every restart "
                        "(container start, checkpoint load).", rich_help_panel=_MODEL)]
TopoSlowOpt = Annotated[
    bool, typer.Option("--topology-slowdown/--no-topology-slowdown", help="Slow jobs whose GPUs span NVLink "
                       "domains, nodes or switches (off: speed 1.0 on every tier).", rich_help_panel=_MODEL)]
GpusPerPodOpt = Annotated[
    int | None, typer.Option("--gpus-per-pod", metavar="N", show_default=False, help="At most N GPUs per pod "
                             "(default: a node's; 1: a job's GPUs anywhere, as Tiresias' --scheme=count).",
                             rich_help_panel=_MODEL)]
JobOrderOpt = Annotated[
    str | None, typer.Option("--job-order", metavar="NAME", show_default=False, help="Job order within a "
                             "queue: fifo, tiresias (2D-LAS), gittins (Tiresias-G: Gittins index within the "
                             "LAS levels), remaining (shortest expected remaining). Default: the policy's.",
                             rich_help_panel=_MODEL)]
ThresholdsOpt = Annotated[
    str | None, typer.Option("--las-thresholds", metavar="GPU_S,...", show_default=False, help="LAS level "
                             "boundaries in GPU-seconds, e.g. 3250,7200 (default: 3600,36000).",
                             rich_help_panel=_MODEL)]
MinRunOpt = Annotated[
    float | None, typer.Option("--min-run", metavar="S", show_default=False, help="Seconds a job runs before "
                               "it may be preempted (default: the policy's, 600).", rich_help_panel=_MODEL)]
MaxPreemptOpt = Annotated[
    int | None, typer.Option("--max-preemptions", metavar="N", show_default=False, help="A job evicted N "
                             "times is not preempted again (default: no bound).", rich_help_panel=_MODEL)]
ProtectOpt = Annotated[
    float | None, typer.Option("--protect-after-hours", metavar="H", show_default=False, help="A job that has "
                               "run H hours is not preempted again (default: no bound).", rich_help_panel=_MODEL)]
PriorOpt = Annotated[
    Path | None, typer.Option("--size-prior", metavar="FILE", dir_okay=False, show_default=False,
                              help="Job sizes known before the run for gittins/remaining (GPU-seconds, one a "
                                   "line, or CSV with size_gpu_s, gpu_time (a Philly trace), or "
                                   "duration,num_gpu).", rich_help_panel=_MODEL)]
KnobOpt = Annotated[
    str | None, typer.Option("--promote-knob", metavar="K|none", show_default=False,
                             help="Tiresias' starvation knob for LAS orders: a waiting job goes back to level 0 "
                                  "after waiting K times the time it has run; none: never (default: the "
                                  "policy's, 8; 1 for gittins).", rich_help_panel=_MODEL)]
EstimateOpt = Annotated[
    float | None, typer.Option("--size-estimates", metavar="SIGMA", show_default=False,
                               help="Every job carries an estimate of its size, as a user's run-time limit "
                                    "would, for gittins/remaining: its size x exp(SIGMA x N(0,1)), seeded; 0 is "
                                    "exact (clairvoyant), 1 typically off by up to a factor e (default: none).",
                               rich_help_panel=_MODEL)]
OneQueueOpt = Annotated[
    bool, typer.Option("--one-queue", help="Put every job in one queue (no fair share between tenants).",
                       rich_help_panel=_MODEL)]
FairCostOpt = Annotated[
    bool, typer.Option("--fairness-cost", help="Also run every policy with one queue and report what fair "
                       "share costs per queue and overall (mean and p95 JCT).", rich_help_panel=_MODEL)]
ObjectiveOpt = Annotated[
    str | None, typer.Option("--objective", metavar="jct|energy|balanced", show_default=False,
                             help="With --gpu-speed catalog on mixed GPU models: place each job on the model "
                             "that minimizes time, energy or both (default: speed-blind); a comma list runs "
                             "each and says what each traded against jct.", rich_help_panel="Job traces")]
ParallelOpt = Annotated[
    int | None, typer.Option("--jobs-parallel", metavar="N", show_default=False,
                             help="Runs at a time, one process each (default: all cores).")]
ExecutorOpt = Annotated[
    str, typer.Option("--executor", metavar="local|ray",
                      help="local: processes on this machine; ray: a Ray cluster "
                      "(pip install 'gpupool[ray]', RAY_ADDRESS).")]


# --------------------------------------------------------------------------------------------------
# Helpers


def _fail(message: str, code: int = 2) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _trace_error(exc: TraceFormatError) -> str:
    where = f"{exc.path}:{exc.line}:"
    if exc.column is not None:
        where += f" column {exc.column!r}:"
    return f"{where} {exc.message}"


def _split(values: Sequence[str] | None) -> list[str]:
    out: list[str] = []
    for value in values or ():
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def _parse_seeds(values: Sequence[str] | None) -> list[int]:
    seeds: list[int] = []
    for text in _split(values):
        try:
            seed = int(text)
        except ValueError:
            _fail(f"--seed: expected an integer, got {text!r}")
        if seed < 0:
            _fail(f"--seed: expected a non-negative integer, got {seed}")
        if seed not in seeds:
            seeds.append(seed)
    if values and not seeds:  # the option was given, with nothing in it (--seeds ,)
        _fail(f"--seed: no seed in {', '.join(map(repr, values))}")
    return seeds or [42]


def _check_policies(names: Sequence[str]) -> list[str]:
    unique: list[str] = []
    for name in names:
        if name not in REGISTRY:
            _fail(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}")
        if name not in unique:
            unique.append(name)
    if not unique:
        _fail("no policy given")
    return unique


INFERENCE_POLICIES = frozenset({"load-aware"})
"""Placement policies meant for inference replicas (live telemetry), not for training pods."""


def _policy_kind(name: str) -> str:
    if name == DEFAULT_POLICY:
        return "default"
    if name in INFERENCE_POLICIES:
        return "inference"
    return "baseline" if name in BASELINES else "GPU-aware"


def _policy_rows() -> list[dict[str, str]]:
    rows = []
    for name, cls in REGISTRY.items():
        desc = cls.description or ""
        for prefix in ("gpupool default:", "baseline:", "GPU-aware:"):
            if desc.startswith(prefix):
                desc = desc[len(prefix):].strip()
        rows.append({"name": name, "kind": _policy_kind(name), "description": desc})
    return rows


@contextmanager
def _trace_path(given: Path | None, embedded: str) -> Iterator[Path]:
    if given is not None:
        yield given
        return
    with resources.as_file(resources.files("gpupool") / "data" / embedded) as path:
        yield path


def _load(nodes: Path | None, pods: Path | None) -> tuple[list[NodeSpec], list[PodRequest]]:
    try:
        with _trace_path(nodes, EMBEDDED_NODES) as path:
            node_list = load_openb_nodes(path)
        with _trace_path(pods, EMBEDDED_PODS) as path:
            pod_list = load_openb_pods(path)
    except TraceFormatError as exc:
        _fail(_trace_error(exc))
    except OSError as exc:
        _fail(f"cannot read {exc.filename or ''}: {exc.strerror or exc}")
    if not node_list:
        _fail(f"{nodes or EMBEDDED_NODES}: the node list has no nodes")
    if not pod_list:
        _fail(f"{pods or EMBEDDED_PODS}: the pod list has no pods")
    return node_list, pod_list


def _replay_runner() -> Callable[..., Any]:
    try:
        from gpupool.sim.replay import run_replay
    except ImportError as exc:
        _fail(f"replay protocol not available (cannot import gpupool.sim.replay.run_replay: {exc})")
    return run_replay


def _accepts_progress(func: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False
    return "progress" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _probe_dir(directory: Path) -> str | None:
    """Why files cannot be created in ``directory`` (created if needed), or None when they can."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".gpupool-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _check_outputs(out: Path | None, json_file: str | None, plots: Sequence[str]) -> None:
    """Fail (exit 2, one line) before any work when an output path cannot be written.

    ``--out DIR`` is created if needed and must take new files; none of its ``plots`` may be a directory.
    ``--json FILE``: its parent directory is created if needed and must take new files; an existing FILE
    must be a writable regular file. Nothing is left behind but the directories created.
    """
    if json_file and json_file != "-":
        path = Path(json_file)
        if path.is_dir():
            _fail(f"--json {path}: is a directory; give a file name")
        why = _probe_dir(path.parent)
        if why is not None:
            _fail(f"--json {path}: cannot write in {path.parent}: {why}")
        if path.exists():
            try:
                with path.open("a", encoding="utf-8"):
                    pass
            except OSError as exc:
                _fail(f"--json {path}: cannot write: {exc.strerror or exc}")
    if out is not None:
        if out.exists() and not out.is_dir():
            _fail(f"--out {out}: exists and is not a directory")
        why = _probe_dir(out)
        if why is not None:
            _fail(f"--out {out}: cannot write plots there: {why}")
        for name in plots:
            if (out / name).is_dir():
                _fail(f"--out {out}: {name} is a directory; cannot write the plot")


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m{secs:02d}s"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


class _RunProgress:
    """Progress of ``total`` runs: a rich bar with ETA when stderr is a terminal, else one line on stderr
    at most every ``interval`` seconds (what, runs done/total, elapsed, ETA); nothing when ``quiet``."""

    def __init__(self, total: int, *, quiet: bool, interval: float | None = None,
                 clock: Callable[[], float] | None = None, tty: bool | None = None) -> None:
        self.total = total
        self.clock = clock or time.monotonic
        self.interval = LOG_PROGRESS_INTERVAL_S if interval is None else interval
        clock = self.clock
        self.start = self.last_line = clock()
        self.description = "simulating"
        self.done = 0.0
        tty = sys.stderr.isatty() if tty is None else tty
        self.bar = not quiet and tty
        self.lines = not quiet and not tty
        self.progress = Progress(
            SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
            TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
            console=Console(stderr=True), transient=True, disable=not self.bar,
        )
        self.task = self.progress.add_task(self.description, total=total)

    def __enter__(self) -> _RunProgress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(None, None, None)

    def stop(self) -> None:
        self.progress.stop()

    def begin(self, k: int, description: str) -> None:
        """Run ``k`` (0-based) starts."""
        self.description = f"{description} [{k + 1}/{self.total}]"
        self.update(k, description=self.description)

    def update(self, done: float, description: str | None = None) -> None:
        """``done`` runs (fractional) are finished."""
        self.done = done
        if self.bar:
            if description is None:
                self.progress.update(self.task, completed=done)
            else:
                self.progress.update(self.task, completed=done, description=description)
        if self.lines:
            now = self.clock()
            if now - self.last_line >= self.interval:
                self.last_line = now
                sys.stderr.write(self.line(now) + "\n")
                sys.stderr.flush()

    def line(self, now: float) -> str:
        elapsed = now - self.start
        fraction = self.done / self.total if self.total else 1.0
        eta = _duration(elapsed * (1 - fraction) / fraction) if fraction > 0 else "unknown"
        return (f"progress: {self.description}: {self.done:.1f}/{self.total} runs ({fraction:.0%}), "
                f"elapsed {_duration(elapsed)}, ETA {eta}")


def _run_all(items: Sequence[tuple[str, int]], run_one: Callable[[str, int, Callable[[int, int], None]], Any],
             *, quiet: bool, errors: tuple[type[BaseException], ...], workers: int | None = 1,
             executor: str = "local") -> tuple[list[Any], bool]:
    """``run_one(policy, seed, tick)`` for every item, with progress. Returns the finished results and
    whether Ctrl-C stopped the loop (the results then hold only the runs that finished). ``workers`` >1
    (None: all cores) or ``executor="ray"``: in parallel (:mod:`gpupool.sweep`), same results."""
    from gpupool import sweep

    if workers is not None and workers < 1:
        _fail(f"--jobs-parallel must be >= 1, got {workers}")
    if executor not in sweep.EXECUTORS:
        _fail(f"--executor must be one of {', '.join(sweep.EXECUTORS)}, got {executor!r}")
    if executor == "ray" or (len(items) > 1 and (workers or sweep.default_workers()) > 1):
        with _RunProgress(len(items), quiet=quiet) as progress:
            n_done = [0]
            progress.begin(0, f"{len(items)} runs, {executor}")

            def on_done(k: int, result: Any) -> None:
                n_done[0] += 1
                progress.update(n_done[0], description=f"{items[k][0]} (seed {items[k][1]}) done "
                                f"[{n_done[0]}/{len(items)}]")

            try:
                return sweep.run_sweep(items, run_one, workers=workers, executor=executor, on_done=on_done), False
            except sweep.SweepInterrupted as exc:
                progress.stop()
                return exc.results, True
            except sweep.SweepError as exc:
                progress.stop()
                _fail(str(exc))
            except errors as exc:
                progress.stop()
                _fail(f"{exc}", code=1)
    results: list[Any] = []
    with _RunProgress(len(items), quiet=quiet) as progress:
        try:
            for k, (name, s) in enumerate(items):
                progress.begin(k, f"{name} (seed {s})")

                def tick(done: int, total: int, k: int = k) -> None:
                    progress.update(k + (done / total if total else 1.0))

                try:
                    results.append(run_one(name, s, tick))
                except errors as exc:
                    progress.stop()
                    _fail(f"{name} (seed {s}): {exc}", code=1)
                progress.update(k + 1)
        except KeyboardInterrupt:
            progress.stop()
            return results, True
    return results, False


def _interrupted(done: int, total: int, wrote: bool) -> NoReturn:
    if done:
        what = "the table and the outputs above hold" if wrote else "the table above holds"
        typer.echo(f"interrupted (Ctrl-C) after {done} of {total} runs: {what} only the finished runs",
                   err=True)
    else:
        typer.echo(f"interrupted (Ctrl-C) before the first of {total} runs finished: nothing written", err=True)
    raise typer.Exit(EXIT_INTERRUPTED)


def _table_kwargs(func: Callable[..., Any], wide: bool) -> dict[str, Any]:
    try:
        accepts = "wide" in inspect.signature(func).parameters
    except (TypeError, ValueError):
        accepts = False
    return {"wide": wide} if accepts else {}


def _print_table(console: Console, table: Any, wide: bool) -> None:
    if not wide:
        console.print(table)
        return
    narrow = console.width  # as wide as the table wants, even past the terminal (measured without the
    # terminal's cap: console.measure alone clamps to console.width and never widens)
    console.width = max(narrow, console.measure(table, options=console.options.update_width(100_000)).maximum)
    try:
        console.print(table)
    finally:
        console.width = narrow


def _execute(
    *, policies: Sequence[str], nodes: Path | None, pods: Path | None, protocol: Protocol,
    seed: Sequence[str] | None, ratio: float, out: Path | None, json_file: str | None, quiet: bool,
    wide: bool = False, workers: int | None = 1, executor: str = "local",
) -> None:
    policy_names = _check_policies(policies)
    seeds = _parse_seeds(seed)
    if not (math.isfinite(ratio) and ratio > 0):
        _fail(f"--ratio must be a finite number > 0, got {ratio}")
    proto = protocol.value
    plot_names = (["allocation_vs_arrived.png"] if proto == "inflation" else ["allocation_over_time.png"])
    _check_outputs(out, json_file, [*plot_names, "unallocated_gpus.png"])
    if proto == "replay":
        runner = _replay_runner()
    else:
        from gpupool.sim.inflation import run_inflation as runner
    node_list, pod_list = _load(nodes, pods)

    console = _console(200)
    pass_progress = proto == "inflation" or _accepts_progress(runner)
    gpus = sum(n.gpu_count for n in node_list)
    convert = report.run_from_inflation if proto == "inflation" else report.run_from_replay

    def run_one(name: str, s: int, tick: Callable[[int, int], None]) -> report.Run:
        kwargs: dict[str, Any] = {"seed": s}
        if proto == "inflation":
            kwargs["ratio"] = ratio
        if pass_progress:
            kwargs["progress"] = tick
        return convert(runner(node_list, pod_list, name, **kwargs), capacity_gpus=gpus)

    items = [(name, s) for name in policy_names for s in seeds]
    runs, interrupted = _run_all(items, run_one, quiet=quiet, errors=(GpupoolError, ValueError), workers=workers,
                                 executor=executor)
    if interrupted and not runs:
        _interrupted(0, len(items), False)
    if interrupted:  # the title names the seeds of the finished runs only
        seeds = list(dict.fromkeys(s for _, s in items[:len(runs)]))
    summary = report.summarize(runs)
    nodes_label = str(nodes) if nodes is not None else "embedded"
    pods_label = str(pods) if pods is not None else "embedded"
    doc = report.json_document(proto, nodes_label, pods_label, ratio if proto == "inflation" else None,
                               runs, summary)
    if interrupted:
        doc["interrupted"] = True
        doc["runs_planned"] = len(items)

    to_stdout = json_file == "-"
    if to_stdout:
        sys.stdout.write(report.dumps(doc))
    else:
        title = (
            f"{proto} protocol: {len(node_list):,} nodes / {gpus:,} GPUs ({nodes_label}), "
            f"{len(pod_list):,} pods ({pods_label})"
            + (f", ratio {ratio:g}" if proto == "inflation" else "")
            + f", seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            + (" (mean ± std)" if len(seeds) > 1 else "")
        )
        _print_table(console, report.results_table(summary, proto, title,
                                                   **_table_kwargs(report.results_table, wide)), wide)
        if len(summary) > 1:
            best = report.best_line(summary, proto)
            if best:
                console.print(best, highlight=False)
            lines = report.why_lines(summary, proto)
            if lines:
                console.print("why the worst lose:", style="bold", highlight=False)
                for line in lines:
                    console.print(f"  {line}", highlight=False, soft_wrap=True)
        elif summary and summary[0]["failed_reasons"]:
            reasons = ", ".join(f"'{r['reason']}' x{r['count']}" for r in summary[0]["failed_reasons"][:3])
            console.print(f"most common unschedulable reasons: {reasons}", highlight=False, soft_wrap=True)

    written: list[Path] = []
    if json_file and not to_stdout:
        path = Path(json_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report.dumps(doc), encoding="utf-8")
        except OSError as exc:
            _fail(f"cannot write {path}: {exc.strerror or exc}", code=1)
        written.append(path)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            trace = pods if pods is not None else "openb (embedded)"
            if proto == "inflation":
                written.append(report.plot_allocation_vs_arrived(runs, out / "allocation_vs_arrived.png",
                                                                 trace=trace, ratio=ratio))
            else:
                written.append(report.plot_allocation_over_time(runs, out / "allocation_over_time.png",
                                                                trace=trace))
            written.append(report.plot_unallocated(summary, out / "unallocated_gpus.png", trace=trace,
                                                   ratio=ratio if proto == "inflation" else None, protocol=proto))
        except OSError as exc:
            _fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)
    if interrupted:
        _interrupted(len(runs), len(items), bool(written))


def _execute_jobs(
    *, policies: Sequence[str], jobs: Path, fmt: JobFormat | None, cluster: Path | None, queues: Path | None,
    seed: Sequence[str] | None, out: Path | None, json_file: str | None, quiet: bool, checkpoint: float,
    node_mtbf: float | None, gpu_mtbf: float | None, repair: float, elastic: float, gpu_speed: str,
    max_jobs: int | None, wide: bool = False, model: dict[str, Any] | None = None, workers: int | None = 1,
    executor: str = "local",
) -> None:
    """``simulate``/``compare`` on a job trace: the pool scheduler's job-level policies. ``model``: the
    job-model switches (:func:`_job_model`)."""
    from dataclasses import replace

    from gpupool.clusterspec import load_cluster_yaml
    from gpupool.engine.pool.queues import load_queues_yaml
    from gpupool.engine.pool.scheduler import JOB_POLICIES, job_policy
    from gpupool.sim.fairness import fairness_cost, fairness_table, one_queue
    from gpupool.sim.jobs import JobSimConfig, run_jobs

    names: list[str] = []
    for name in policies:
        if name not in JOB_POLICIES:
            _fail(f"unknown job policy {name!r}; known: {', '.join(JOB_POLICIES)}")
        if name not in names:
            names.append(name)
    if not names:
        _fail("no policy given")
    if cluster is None:
        _fail("--jobs needs --cluster FILE.yaml (see examples/clusters/)")
    seeds = _parse_seeds(seed)
    for flag, value in (("--checkpoint-interval", checkpoint), ("--repair-hours", repair)):
        if not value >= 0:
            _fail(f"{flag} must be >= 0, got {value}")
    for flag, value in (("--node-mtbf-hours", node_mtbf), ("--gpu-mtbf-hours", gpu_mtbf)):
        if value is not None and not value > 0:
            _fail(f"{flag} must be > 0, got {value}")
    if not 0.0 <= elastic <= 1.0:
        _fail(f"--elastic-fraction must be within 0..1, got {elastic}")
    if gpu_speed not in ("none", "catalog"):
        _fail(f"--gpu-speed must be 'none' or 'catalog', got {gpu_speed!r}")
    if max_jobs is not None and max_jobs < 1:
        _fail(f"--max-jobs must be >= 1, got {max_jobs}")
    if queues is not None and model and model.get("one_queue"):  # one_queue renames every job's queue
        _fail(f"--one-queue puts every job in one queue; drop --queues {queues}")
    _check_outputs(out, json_file, ["jct_distribution.png", "queue_share.png"])
    try:
        node_list = load_cluster_yaml(cluster)
        tree = load_queues_yaml(queues) if queues is not None else None
        records = load_jobs(jobs, fmt.value if fmt is not None else None)
    except TraceFormatError as exc:
        _fail(_trace_error(exc))
    except OSError as exc:
        _fail(f"cannot read {exc.filename or ''}: {exc.strerror or exc}")
    except ValueError as exc:  # cluster or queue file errors name the file and the field
        _fail(str(exc))
    if not records:
        _fail(f"{jobs}: the job trace has no jobs")
    if not any(n.gpu_count for n in node_list):
        _fail(f"{cluster}: the cluster has no GPUs; the job simulator needs at least one GPU node")
    if max_jobs is not None:
        records = records[:max_jobs]
    if tree is not None:
        leaves = {tree.names[i] for i in tree.leaves}
        missing = sorted({r.queue or "default" for r in records} - leaves)
        if missing:
            _fail(f"{queues}: no leaf queue for trace queue(s) {', '.join(missing[:5])}"
                  + (" ..." if len(missing) > 5 else ""))
    config = JobSimConfig(checkpoint_interval_s=checkpoint if checkpoint > 0 else math.inf,
                          node_mtbf_h=node_mtbf, gpu_mtbf_h=gpu_mtbf, repair_h=repair, elastic_fraction=elastic,
                          gpu_speed=gpu_speed)
    config, overrides, fair_cost = _job_model(config, model or {}, tree is not None, names)
    if model and model.get("one_queue"):
        records = one_queue(records)
    console = _console(200)
    pools = {name: replace(job_policy(name)[1], **overrides) if overrides else None for name in names}
    one_records = one_queue(records) if fair_cost else None  # the counterfactual of --fairness-cost
    objectives = _objectives((model or {}).get("objective"))
    if len(objectives) == 1:
        config = replace(config, objective=objectives[0])
    elif objectives:  # one row per objective for the policies that place by GPU model (gpupool placement)
        names = [f"{n}@{o}" if JOB_POLICIES[n][0] == "gpupool" else n for n in names for o in objectives]
        names = list(dict.fromkeys(names))

    def run_one(label: str, s: int, tick: Callable[[int, int], None]) -> report.JobRun:
        name, _, objective = label.partition("@")
        cfg = replace(config, pool=pools[name], **({"objective": objective} if objective else {}))
        res = run_jobs(node_list, records, name, seed=s, queues=tree, config=cfg, progress=tick)
        res.policy = label
        if "policy" in res.metrics:
            res.metrics["policy"] = label
        if one_records is not None:
            one = run_jobs(node_list, one_records, name, seed=s, config=cfg)
            res.metrics["fairness_cost"] = fairness_cost(res.jobs, one.jobs)
        if isinstance(res.metrics.get("config"), dict):  # the job-model switches, so two runs can be told apart
            res.metrics["config"].update(_job_model_record(pools[name] or job_policy(name)[1], cfg, model or {}))
        return report.run_from_jobs(res)

    items = [(name, s) for name in names for s in seeds]
    runs, interrupted = _run_all(items, run_one, quiet=quiet, errors=(GpupoolError, ValueError, KeyError),
                                 workers=workers, executor=executor)
    one_runs = {(r.policy, r.record["seed"]): r.record["fairness_cost"] for r in runs} if fair_cost else {}
    if interrupted and not runs:
        _interrupted(0, len(items), False)
    if interrupted:  # the title names the seeds of the finished runs only
        seeds = list(dict.fromkeys(s for _, s in items[:len(runs)]))
    summary = report.summarize_jobs(runs)
    doc = report.jobs_json_document(str(jobs), str(cluster), str(queues) if queues else None, runs, summary)
    if interrupted:
        doc["interrupted"] = True
        doc["runs_planned"] = len(items)
    to_stdout = json_file == "-"
    if to_stdout:
        sys.stdout.write(report.dumps(doc))
    else:
        gpus = sum(n.gpu_count for n in node_list)
        q_label = queues or ("one queue" if (model or {}).get("one_queue") else "one per trace queue")
        title = (f"job trace {jobs} ({len(records):,} jobs) on {cluster} ({len(node_list):,} nodes, {gpus:,} GPUs)"
                 f", queues: {q_label}, seed{'s' if len(seeds) > 1 else ''} "
                 f"{', '.join(map(str, seeds))}" + (" (mean ± std)" if len(seeds) > 1 else "")
                 + _model_label(model or {}))
        _print_table(console, report.jobs_table(summary, title, **_table_kwargs(report.jobs_table, wide)), wide)
        for (name, s), cost in one_runs.items():
            console.print(fairness_table(f"{name}, seed {s}", cost))
        for line in _objective_trades(summary):
            console.print(line, highlight=False, soft_wrap=True)
        unfinished = sum(len(r.record["unfinished"]) for r in runs)
        if unfinished:
            first = next(u for r in runs for u in r.record["unfinished"])
            console.print(f"{unfinished} job(s) did not finish, e.g. {first['job_id']}: {first['reason']}",
                          highlight=False, soft_wrap=True)
    written: list[Path] = []
    if json_file and not to_stdout:
        path = Path(json_file)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(report.dumps(doc), encoding="utf-8")
        except OSError as exc:
            _fail(f"cannot write {path}: {exc.strerror or exc}", code=1)
        written.append(path)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            written.append(report.plot_jct_cdf(runs, out / "jct_distribution.png", trace=jobs))
            written.append(report.plot_queue_share(runs, out / "queue_share.png", trace=jobs))
        except OSError as exc:
            _fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)
    if interrupted:
        _interrupted(len(runs), len(items), bool(written))


def _objectives(value: str | None) -> list[str]:
    """The --objective list (empty: not given); exits with a clear error for an unknown objective."""
    from gpupool.engine.pool.hetero import OBJECTIVES

    if value is None:
        return []
    out = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [v for v in out if v not in OBJECTIVES]
    if bad or not out:
        _fail(f"--objective must be {', '.join(OBJECTIVES)} or a comma list of them, got {value!r}")
    return out


def _objective_trades(summary: Sequence[Any]) -> list[str]:
    """'P@balanced: mean JCT +4.0%, energy -12.0% vs P@jct' for each non-jct objective row with a jct row."""
    rows = {s["policy"]: s for s in summary} if summary and isinstance(summary[0], dict) else {}
    out = []
    for label, row in rows.items():
        base, _, objective = label.partition("@")
        ref = rows.get(f"{base}@jct")
        if not objective or objective == "jct" or ref is None:
            continue
        parts = []
        for key, what in (("mean_jct_s", "mean JCT"), ("energy_kwh", "energy")):
            a, b = row.get(key), ref.get(key)
            if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
                parts.append(f"{what} {100.0 * (a - b) / b:+.1f}%")
        if parts:
            out.append(f"{label}: {', '.join(parts)} vs {base}@jct")
    return out


_MAX_RESTART_S = 365 * 86400.0
"""Largest --restart-overhead, seconds: a year (far beyond any restart, small enough for float time)."""


def _job_model(config: Any, model: dict[str, Any], has_queue_file: bool,
               names: Sequence[str] = ()) -> tuple[Any, dict[str, Any], bool]:
    """Apply the job-model switches of the job policies ``names``: (simulator config, scheduler-config
    overrides, fairness cost on?). Exits 2 with a one-line error for a bad or contradictory switch."""
    from dataclasses import replace

    from gpupool.engine.pool.gittins import parse_sizes
    from gpupool.engine.pool.ordering import ORDERS, SIZE_ORDERS
    from gpupool.engine.pool.scheduler import JOB_POLICIES
    from gpupool.topology import TIERS, TopologyConfig

    over: dict[str, Any] = {}
    sim: dict[str, Any] = {}
    for flag, key in (("--restart-overhead", "restart_overhead"), ("--min-run", "min_run"),
                      ("--protect-after-hours", "protect_after_hours"), ("--size-estimates", "size_estimates")):
        if model.get(key) is not None and not math.isfinite(model[key]):
            _fail(f"{flag} must be a finite number, got {model[key]}")
    if model.get("restart_overhead") is not None:
        if not model["restart_overhead"] >= 0:
            _fail(f"--restart-overhead must be >= 0, got {model['restart_overhead']}")
        if model["restart_overhead"] > _MAX_RESTART_S:  # a stall of 1e300 s hangs the clock (t + dt == t)
            _fail(f"--restart-overhead must be at most {_MAX_RESTART_S:.0f} s (a year), "
                  f"got {model['restart_overhead']}")
        sim["restart_overhead_s"] = float(model["restart_overhead"])
    if model.get("topology_slowdown") is False:
        sim["topology"] = TopologyConfig(factors={t: 1.0 for t in TIERS})
    if model.get("gpus_per_pod") is not None:
        if model["gpus_per_pod"] < 1:
            _fail(f"--gpus-per-pod must be >= 1, got {model['gpus_per_pod']}")
        sim["max_gpus_per_pod"] = model["gpus_per_pod"]
    if model.get("job_order") is not None:
        if model["job_order"] not in (*ORDERS, "las"):
            _fail(f"--job-order must be one of {', '.join(ORDERS)}, got {model['job_order']!r}")
        over["order"] = model["job_order"]
    if model.get("las_thresholds") is not None:
        try:
            t = tuple(float(x) for x in model["las_thresholds"].split(",") if x.strip())
        except ValueError:
            _fail(f"--las-thresholds must be numbers separated by commas, got {model['las_thresholds']!r}")
        if (not t or not all(math.isfinite(x) and x > 0 for x in t)
                or any(b <= a for a, b in zip(t, t[1:], strict=False))):
            _fail(f"--las-thresholds must be finite, positive and increasing, got {model['las_thresholds']!r}")
        over["thresholds"] = t
    if model.get("promote_knob") is not None:
        text = str(model["promote_knob"]).strip().lower()
        try:
            knob = None if text in ("none", "off") else float(text)
        except ValueError:
            _fail(f"--promote-knob must be a number > 0 or none, got {model['promote_knob']!r}")
        if knob is not None and not (math.isfinite(knob) and knob > 0):
            _fail(f"--promote-knob must be a finite number > 0 or none, got {model['promote_knob']!r}")
        over["promote_knob"] = knob
    if model.get("size_estimates") is not None:
        if not model["size_estimates"] >= 0:
            _fail(f"--size-estimates must be >= 0, got {model['size_estimates']}")
        sim["size_estimate_error"] = float(model["size_estimates"])
    if model.get("min_run") is not None:
        if not model["min_run"] >= 0:
            _fail(f"--min-run must be >= 0, got {model['min_run']}")
        over["min_run_s"] = float(model["min_run"])
    if model.get("max_preemptions") is not None:
        if model["max_preemptions"] < 0:
            _fail(f"--max-preemptions must be >= 0, got {model['max_preemptions']}")
        over["max_preemptions"] = model["max_preemptions"]
    if model.get("protect_after_hours") is not None:
        if not model["protect_after_hours"] > 0:
            _fail(f"--protect-after-hours must be > 0, got {model['protect_after_hours']}")
        over["protect_after_s"] = 3600.0 * model["protect_after_hours"]
    base = {n: JOB_POLICIES[n][1] for n in names if n in JOB_POLICIES}
    order = model.get("job_order")
    if order is not None:
        own = [n for n, c in base.items() if c.order in SIZE_ORDERS and c.order != order]
        if own:
            _fail(f"--job-order {order} would replace the {own[0]} policy's own order ({base[own[0]].order}); use "
                  f"-p gpupool --job-order {order} (--promote-knob {_knob_text(base[own[0]].promote_knob)} for the "
                  f"{own[0]} policy's starvation knob)")
    orders = {order if order is not None else c.order for c in base.values()}
    for flag, key in (("--size-prior", "size_prior"), ("--size-estimates", "size_estimates")):
        if model.get(key) is not None and base and not orders & set(SIZE_ORDERS):
            _fail(f"{flag} {model[key]} applies only to a policy or --job-order that ranks jobs by size "
                  f"({', '.join(SIZE_ORDERS)}); none is selected")
    warning = ""
    if base and not any(c.preempt or c.reclaim for c in base.values()):
        unused = [f for f, k in (("--las-thresholds", "las_thresholds"), ("--min-run", "min_run"),
                                 ("--max-preemptions", "max_preemptions"),
                                 ("--protect-after-hours", "protect_after_hours")) if model.get(k) is not None]
        if model.get("las_thresholds") is not None and orders - {"fifo"}:
            unused.remove("--las-thresholds")  # a LAS order uses them even without preemption
        if unused:  # said once every switch is checked, so an error stays the only line
            warning = (f"warning: {', '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect: no "
                       f"selected policy ({', '.join(base)}) preempts")
    if model.get("size_prior") is not None:
        path = Path(model["size_prior"])
        try:
            over["size_prior"] = tuple(parse_sizes(path.read_text(encoding="utf-8"), str(path)))
        except OSError as exc:
            _fail(f"cannot read {path}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            _fail(f"--size-prior {path}: not UTF-8 text (byte {exc.start}: {exc.reason})")
        except ValueError as exc:
            _fail(str(exc))
    fair_cost = bool(model.get("fairness_cost"))
    if fair_cost and (model.get("one_queue") or has_queue_file):
        _fail("--fairness-cost compares the trace's queues with one queue; drop --one-queue / --queues")
    if warning:
        typer.echo(warning, err=True)
    return replace(config, **sim) if sim else config, over, fair_cost


def _knob_text(knob: float | None) -> str:
    return "none" if knob is None else f"{knob:g}"


def _job_model_record(pool: Any, cfg: Any, model: dict[str, Any]) -> dict[str, Any]:
    """The job-model settings a run used (its policy's, after the switches), for the JSON ``config``."""
    return {"job_order": pool.order, "las_thresholds": list(pool.thresholds), "min_run_s": pool.min_run_s,
            "max_preemptions": pool.max_preemptions, "protect_after_s": pool.protect_after_s,
            "topology_slowdown": model.get("topology_slowdown") is not False,
            "one_queue": bool(model.get("one_queue")), "gpus_per_pod": cfg.max_gpus_per_pod,
            "size_prior": str(model["size_prior"]) if model.get("size_prior") is not None else None,
            "size_prior_n": len(pool.size_prior), "size_estimate_error": cfg.size_estimate_error,
            "promote_knob": pool.promote_knob}


_MODEL_ARGS = {"restart_overhead": ("--restart-overhead", 30.0), "topology_slowdown": ("--no-topology-slowdown", True),
               "gpus_per_pod": ("--gpus-per-pod", None), "job_order": ("--job-order", None),
               "las_thresholds": ("--las-thresholds", None), "min_run": ("--min-run", None),
               "max_preemptions": ("--max-preemptions", None), "protect_after_hours": ("--protect-after-hours", None),
               "size_prior": ("--size-prior", None), "size_estimates": ("--size-estimates", None),
               "promote_knob": ("--promote-knob", None),
               "one_queue": ("--one-queue", False),
               "fairness_cost": ("--fairness-cost", False), "objective": ("--objective", None)}
"""Job-model switches of simulate/compare: parameter -> (flag, default)."""


def _model_label(model: dict[str, Any]) -> str:
    """``", model: --job-order remaining --promote-knob 1"``: the job-model switches given (other than the
    queues, already in the title), so that a saved table says what it measured; "" when none."""
    parts = []
    for key, (flag, default) in _MODEL_ARGS.items():
        value = model.get(key, default)
        if key == "one_queue" or value == default or value is None:
            continue
        parts.append(flag if isinstance(value, bool) else f"{flag} {value}")
    return f", model: {' '.join(parts)}" if parts else ""


def _model_args(given: dict[str, Any]) -> dict[str, Any]:
    return {k: given[k] for k in _MODEL_ARGS}


def _model_flags(given: dict[str, Any]) -> dict[str, bool]:
    """Flags of the job-model switches that differ from their default (for :func:`_job_only_flags`)."""
    return {flag: given[k] != default for k, (flag, default) in _MODEL_ARGS.items()}


def _job_only_flags(jobs: Path | None, **given: Any) -> None:
    if jobs is None:
        used = [flag for flag, value in given.items() if value]
        if used:
            _fail(f"{', '.join(used)} {'applies' if len(used) == 1 else 'apply'} only with --jobs")


def _pod_only_flags(nodes: Path | None, pods: Path | None, protocol: Protocol, ratio: float) -> None:
    used = [f for f, v in (("--nodes", nodes), ("--pods", pods)) if v is not None]
    if protocol != Protocol.inflation:
        used.append("--protocol")
    if ratio != 1.3:
        used.append("--ratio")
    if used:
        _fail(f"{', '.join(used)} {'does' if len(used) == 1 else 'do'} not apply to job traces (--jobs)")


# --------------------------------------------------------------------------------------------------
# Commands


def _version(value: bool) -> None:
    if value:
        typer.echo(f"gpupool {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """GPU pool orchestrator: compare GPU placement policies on public cluster traces."""


def _console(piped_width: int) -> Console:
    """The tables' console: ``COLUMNS`` columns where it is a whole number >= 40, else the terminal's width, or
    ``piped_width`` when stdout is no terminal (so that a table piped to a file keeps its columns). Width and
    height are always given, so Rich reads neither ``COLUMNS`` nor ``LINES`` itself (it raises on a value
    such as "²")."""

    def whole(name: str, least: int) -> int | None:
        value = os.environ.get(name, "")
        return int(value) if value.isascii() and value.isdigit() and int(value) >= least else None

    width = whole("COLUMNS", 40)
    if width is None:
        try:
            width = os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else piped_width
        except (OSError, ValueError, AttributeError):  # no real file descriptor (e.g. a test's captured stdout)
            width = piped_width
    return Console(width=max(width, 40), height=whole("LINES", 1) or 25)


def _job_policy_rows() -> list[dict[str, Any]]:
    from gpupool.engine.pool.scheduler import DEFAULT_JOB_POLICIES, JOB_POLICIES

    return [{"name": name, "placement": placement, "compared_by_default": name in DEFAULT_JOB_POLICIES,
             "description": desc} for name, (placement, _, desc) in JOB_POLICIES.items()]


@app.command("policies", short_help="List the placement and job policies: name, kind, description.")
def policies_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON instead of a table.")] = False,
    jobs: Annotated[bool, typer.Option(
        "--jobs", help="Only the job policies (simulate/compare --jobs); with --json, their list.")] = False,
) -> None:
    """List the placement policies (name, kind: baseline, GPU-aware, inference, default; description) and the
    job policies that `simulate --jobs` / `compare --jobs` run (name, the placement policy they place pods
    with, description). `--json` prints the placement policies as a JSON list, `--json --jobs` the job
    policies."""
    if as_json:
        sys.stdout.write(report.dumps(_job_policy_rows() if jobs else _policy_rows()))
        return
    console = _console(160)
    if not jobs:
        console.print(report.policies_table(_policy_rows()))
    console.print(report.job_policies_table(_job_policy_rows()))


@app.command("simulate", short_help="Run one policy on a pod trace, or on a job trace (--jobs).")
def simulate_cmd(
    policy: Annotated[
        str, typer.Option("--policy", "-p", metavar="NAME", help="Policy to run (see `gpupool policies`).")
    ] = DEFAULT_POLICY,
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    protocol: ProtocolOpt = Protocol.inflation,
    seed: SeedOpt = None,
    ratio: RatioOpt = 1.3,
    out: OutOpt = None,
    json_file: JsonOpt = None,
    quiet: QuietOpt = False,
    wide: WideOpt = False,
    jobs: JobsOpt = None,
    fmt: FormatOpt = None,
    cluster: ClusterOpt = None,
    queues: QueuesOpt = None,
    checkpoint: CheckpointOpt = 1800.0,
    node_mtbf: NodeMtbfOpt = None,
    gpu_mtbf: GpuMtbfOpt = None,
    repair: RepairOpt = 4.0,
    elastic: ElasticOpt = 0.0,
    gpu_speed: GpuSpeedOpt = "none",
    max_jobs: MaxJobsOpt = None,
    restart_overhead: RestartOpt = 30.0,
    topology_slowdown: TopoSlowOpt = True,
    gpus_per_pod: GpusPerPodOpt = None,
    job_order: JobOrderOpt = None,
    las_thresholds: ThresholdsOpt = None,
    min_run: MinRunOpt = None,
    max_preemptions: MaxPreemptOpt = None,
    protect_after_hours: ProtectOpt = None,
    size_prior: PriorOpt = None,
    size_estimates: EstimateOpt = None,
    promote_knob: KnobOpt = None,
    one_queue: OneQueueOpt = False,
    fairness_cost: FairCostOpt = False,
    objective: ObjectiveOpt = None,
) -> None:
    """Run one placement policy on a trace and print its GPU allocation, fragmentation and failures.

    Same options and outputs as `compare`, for a single policy. With --jobs, run one job-level policy
    (fifo, round-robin, gpupool, gittins, lowest-power: `gpupool policies --jobs`) on a job trace and print
    JCT, queueing delay, utilization, fairness, preemptions and energy.
    """
    if jobs is not None:
        _pod_only_flags(nodes, pods, protocol, ratio)
        _execute_jobs(policies=[policy], jobs=jobs, fmt=fmt, cluster=cluster, queues=queues, seed=seed, out=out,
                      json_file=json_file, quiet=quiet, checkpoint=checkpoint, node_mtbf=node_mtbf,
                      gpu_mtbf=gpu_mtbf, repair=repair, elastic=elastic, gpu_speed=gpu_speed, max_jobs=max_jobs,
                      wide=wide, model=_model_args(locals()))
        return
    _job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                             "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                             "--max-jobs": max_jobs, "--elastic-fraction": elastic, **_model_flags(locals())})
    _execute(policies=[policy], nodes=nodes, pods=pods, protocol=protocol, seed=seed, ratio=ratio,
             out=out, json_file=json_file, quiet=quiet, wide=wide)


@app.command("compare", short_help="Compare several policies on the same trace and seeds.")
def compare_cmd(
    policies: Annotated[
        list[str] | None,
        typer.Option(
            "--policies", "-p", metavar="A,B,...", show_default=False,
            help="Policies to compare, comma-separated or repeated. Default: every registered policy.",
        ),
    ] = None,
    nodes: NodesOpt = None,
    pods: PodsOpt = None,
    protocol: ProtocolOpt = Protocol.inflation,
    seed: SeedOpt = None,
    ratio: RatioOpt = 1.3,
    out: OutOpt = None,
    json_file: JsonOpt = None,
    quiet: QuietOpt = False,
    wide: WideOpt = False,
    jobs: JobsOpt = None,
    fmt: FormatOpt = None,
    cluster: ClusterOpt = None,
    queues: QueuesOpt = None,
    checkpoint: CheckpointOpt = 1800.0,
    node_mtbf: NodeMtbfOpt = None,
    gpu_mtbf: GpuMtbfOpt = None,
    repair: RepairOpt = 4.0,
    elastic: ElasticOpt = 0.0,
    gpu_speed: GpuSpeedOpt = "none",
    max_jobs: MaxJobsOpt = None,
    restart_overhead: RestartOpt = 30.0,
    topology_slowdown: TopoSlowOpt = True,
    gpus_per_pod: GpusPerPodOpt = None,
    job_order: JobOrderOpt = None,
    las_thresholds: ThresholdsOpt = None,
    min_run: MinRunOpt = None,
    max_preemptions: MaxPreemptOpt = None,
    protect_after_hours: ProtectOpt = None,
    size_prior: PriorOpt = None,
    size_estimates: EstimateOpt = None,
    promote_knob: KnobOpt = None,
    one_queue: OneQueueOpt = False,
    fairness_cost: FairCostOpt = False,
    objective: ObjectiveOpt = None,
    jobs_parallel: ParallelOpt = None,
    executor: ExecutorOpt = "local",
) -> None:
    """Run several placement policies on the same trace and seeds and show them side by side.

    Under the table, a line for each of the worst policies says why it loses: its most common
    unschedulable reason, GPUs held but unused, fragmentation and load imbalance. With --jobs, compare
    the job-level policies (default: fifo, round-robin, gpupool) on a job trace.
    """
    if jobs is not None:
        from gpupool.engine.pool.scheduler import DEFAULT_JOB_POLICIES

        _pod_only_flags(nodes, pods, protocol, ratio)
        _execute_jobs(policies=_split(policies) or list(DEFAULT_JOB_POLICIES), jobs=jobs, fmt=fmt, cluster=cluster,
                      queues=queues, seed=seed, out=out, json_file=json_file, quiet=quiet, checkpoint=checkpoint,
                      node_mtbf=node_mtbf, gpu_mtbf=gpu_mtbf, repair=repair, elastic=elastic, gpu_speed=gpu_speed,
                      max_jobs=max_jobs, wide=wide, model=_model_args(locals()), workers=jobs_parallel,
                      executor=executor)
        return
    _job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                             "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                             "--max-jobs": max_jobs, "--elastic-fraction": elastic, **_model_flags(locals())})
    names = _split(policies) or list(REGISTRY)
    _execute(policies=names, nodes=nodes, pods=pods, protocol=protocol, seed=seed, ratio=ratio,
             out=out, json_file=json_file, quiet=quiet, wide=wide, workers=jobs_parallel, executor=executor)


EXTENSION_MODULES = ("gpupool.k8s.scheduler_cli", "gpupool.k8s.extender_cli", "gpupool.sim.jobs_cli",
                     "gpupool.agent.cli", "gpupool.k8s.autoscaler.cli")
"""Modules that add commands to the CLI; each defines ``register(app: typer.Typer) -> None``."""


def _register_extensions() -> None:
    for name in EXTENSION_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
                continue  # that driver is not part of this build
            raise
        module.register(app)


_register_extensions()
app.add_typer(importlib.import_module("gpupool.autoscale_cli").app, name="autoscale")


def main() -> None:
    """Console-script entry point (``gpupool``)."""
    app(prog_name="gpupool")


if __name__ == "__main__":  # pragma: no cover
    main()
