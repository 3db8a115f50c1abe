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
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn

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
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Protocol(StrEnum):
    inflation = "inflation"
    replay = "replay"


# --------------------------------------------------------------------------------------------------
# Options shared by simulate and compare

NodesOpt = Annotated[
    Path | None,
    typer.Option(
        "--nodes", metavar="FILE", dir_okay=False, show_default=False,
        help="openb node list CSV (sn,cpu_milli,memory_mib,gpu,model). Default: the embedded "
             f"{EMBEDDED_NODES} (1,213 GPU nodes, 6,212 GPUs).",
    ),
]
PodsOpt = Annotated[
    Path | None,
    typer.Option(
        "--pods", metavar="FILE", dir_okay=False, show_default=False,
        help="openb pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,...]). "
             f"Default: the embedded {EMBEDDED_PODS} (8,152 pods).",
    ),
]
ProtocolOpt = Annotated[
    Protocol,
    typer.Option(
        "--protocol", case_sensitive=False,
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
        "--out", metavar="DIR", file_okay=False, show_default=False,
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
    typer.Option("--quiet", "-q", help="No progress bar (it is also off when stdout is not a terminal)."),
]


class JobFormat(StrEnum):
    philly = "philly"
    itp = "itp"


JobsOpt = Annotated[
    Path | None,
    typer.Option(
        "--jobs", metavar="FILE", dir_okay=False, show_default=False,
        help="Job trace CSV (Philly: timestamp,duration,num_gpus,gpu_time,cluster; ITP: "
             "job_id,submission_time,duration,num_gpu): run the pool scheduler's job-level policies "
             "(fifo, round-robin, gpupool; also lowest-power) instead of pod placement. Needs --cluster.",
        rich_help_panel="Job traces",
    ),
]
FormatOpt = Annotated[
    JobFormat | None,
    typer.Option("--format", case_sensitive=False, show_default=False,
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


def _policy_kind(name: str) -> str:
    if name == DEFAULT_POLICY:
        return "default"
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


def _execute(
    *, policies: Sequence[str], nodes: Path | None, pods: Path | None, protocol: Protocol,
    seed: Sequence[str] | None, ratio: float, out: Path | None, json_file: str | None, quiet: bool,
) -> None:
    policy_names = _check_policies(policies)
    seeds = _parse_seeds(seed)
    if not (math.isfinite(ratio) and ratio > 0):
        _fail(f"--ratio must be a finite number > 0, got {ratio}")
    proto = protocol.value
    if proto == "replay":
        runner = _replay_runner()
    else:
        from gpupool.sim.inflation import run_inflation as runner
    node_list, pod_list = _load(nodes, pods)

    console = Console(width=None if sys.stdout.isatty() else 200)
    show_progress = not quiet and sys.stdout.isatty()
    runs: list[report.Run] = []
    total_runs = len(policy_names) * len(seeds)
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
        TimeElapsedColumn(), console=console, transient=True, disable=not show_progress,
    )
    pass_progress = proto == "inflation" or _accepts_progress(runner)
    gpus = sum(n.gpu_count for n in node_list)
    with progress:
        task = progress.add_task("simulating", total=total_runs)
        for i, name in enumerate(policy_names):
            for j, s in enumerate(seeds):
                k = i * len(seeds) + j
                progress.update(task, completed=k, description=f"{name} (seed {s}) [{k + 1}/{total_runs}]")

                def tick(done: int, total: int, k: int = k) -> None:
                    progress.update(task, completed=k + (done / total if total else 1.0))

                kwargs: dict[str, Any] = {"seed": s}
                if proto == "inflation":
                    kwargs["ratio"] = ratio
                if pass_progress:
                    kwargs["progress"] = tick
                try:
                    res = runner(node_list, pod_list, name, **kwargs)
                except (GpupoolError, ValueError) as exc:
                    progress.stop()
                    _fail(f"{name} (seed {s}): {exc}", code=1)
                convert = report.run_from_inflation if proto == "inflation" else report.run_from_replay
                runs.append(convert(res, capacity_gpus=gpus))
        progress.update(task, completed=total_runs)

    summary = report.summarize(runs)
    nodes_label = str(nodes) if nodes is not None else "embedded"
    pods_label = str(pods) if pods is not None else "embedded"
    doc = report.json_document(proto, nodes_label, pods_label, ratio if proto == "inflation" else None,
                               runs, summary)

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
        console.print(report.results_table(summary, proto, title))
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
            if proto == "inflation":
                written.append(report.plot_allocation_vs_arrived(runs, out / "allocation_vs_arrived.png"))
            else:
                written.append(report.plot_allocation_over_time(runs, out / "allocation_over_time.png"))
            written.append(report.plot_unallocated(summary, out / "unallocated_gpus.png"))
        except OSError as exc:
            _fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)


def _execute_jobs(
    *, policies: Sequence[str], jobs: Path, fmt: JobFormat | None, cluster: Path | None, queues: Path | None,
    seed: Sequence[str] | None, out: Path | None, json_file: str | None, quiet: bool, checkpoint: float,
    node_mtbf: float | None, gpu_mtbf: float | None, repair: float, elastic: float, gpu_speed: str,
    max_jobs: int | None,
) -> None:
    """``simulate``/``compare`` on a job trace: the pool scheduler's job-level policies."""
    from gpupool.clusterspec import load_cluster_yaml
    from gpupool.engine.pool.queues import load_queues_yaml
    from gpupool.engine.pool.scheduler import JOB_POLICIES
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
    console = Console(width=None if sys.stdout.isatty() else 200)
    show_progress = not quiet and sys.stdout.isatty()
    progress = Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
        TimeElapsedColumn(), console=console, transient=True, disable=not show_progress,
    )
    runs: list[report.JobRun] = []
    total_runs = len(names) * len(seeds)
    with progress:
        task = progress.add_task("simulating", total=total_runs)
        for i, name in enumerate(names):
            for j, s in enumerate(seeds):
                k = i * len(seeds) + j
                progress.update(task, completed=k, description=f"{name} (seed {s}) [{k + 1}/{total_runs}]")

                def tick(done: int, total: int, k: int = k) -> None:
                    progress.update(task, completed=k + (done / total if total else 1.0))

                try:
                    res = run_jobs(node_list, records, name, seed=s, queues=tree, config=config, progress=tick)
                except (GpupoolError, ValueError, KeyError) as exc:
                    progress.stop()
                    _fail(f"{name} (seed {s}): {exc}", code=1)
                runs.append(report.run_from_jobs(res))
        progress.update(task, completed=total_runs)
    summary = report.summarize_jobs(runs)
    doc = report.jobs_json_document(str(jobs), str(cluster), str(queues) if queues else None, runs, summary)
    to_stdout = json_file == "-"
    if to_stdout:
        sys.stdout.write(report.dumps(doc))
    else:
        gpus = sum(n.gpu_count for n in node_list)
        title = (f"job trace {jobs} ({len(records):,} jobs) on {cluster} ({len(node_list):,} nodes, {gpus:,} GPUs)"
                 f", queues: {queues or 'one per trace queue'}, seed{'s' if len(seeds) > 1 else ''} "
                 f"{', '.join(map(str, seeds))}" + (" (mean ± std)" if len(seeds) > 1 else ""))
        console.print(report.jobs_table(summary, title))
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
            written.append(report.plot_jct_cdf(runs, out / "jct_distribution.png"))
            written.append(report.plot_queue_share(runs, out / "queue_share.png"))
        except OSError as exc:
            _fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)


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


@app.command("policies")
def policies_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON instead of a table.")] = False,
) -> None:
    """List the placement policies: name, kind (baseline, GPU-aware, default) and description."""
    rows = _policy_rows()
    if as_json:
        sys.stdout.write(report.dumps(rows))
        return
    Console(width=None if sys.stdout.isatty() else 160).print(report.policies_table(rows))


@app.command("simulate")
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
) -> None:
    """Run one placement policy on a trace and print its GPU allocation, fragmentation and failures.

    Same options and outputs as `compare`, for a single policy. With --jobs, run one job-level policy
    (fifo, round-robin, gpupool) on a job trace and print JCT, queueing delay, utilization, fairness,
    preemptions and energy.
    """
    if jobs is not None:
        _pod_only_flags(nodes, pods, protocol, ratio)
        _execute_jobs(policies=[policy], jobs=jobs, fmt=fmt, cluster=cluster, queues=queues, seed=seed, out=out,
                      json_file=json_file, quiet=quiet, checkpoint=checkpoint, node_mtbf=node_mtbf,
                      gpu_mtbf=gpu_mtbf, repair=repair, elastic=elastic, gpu_speed=gpu_speed, max_jobs=max_jobs)
        return
    _job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                             "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                             "--max-jobs": max_jobs, "--elastic-fraction": elastic})
    _execute(policies=[policy], nodes=nodes, pods=pods, protocol=protocol, seed=seed, ratio=ratio,
             out=out, json_file=json_file, quiet=quiet)


@app.command("compare")
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
                      max_jobs=max_jobs)
        return
    _job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                             "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                             "--max-jobs": max_jobs, "--elastic-fraction": elastic})
    names = _split(policies) or list(REGISTRY)
    _execute(policies=names, nodes=nodes, pods=pods, protocol=protocol, seed=seed, ratio=ratio,
             out=out, json_file=json_file, quiet=quiet)


EXTENSION_MODULES = ("gpupool.k8s.scheduler_cli", "gpupool.k8s.extender_cli", "gpupool.sim.jobs_cli",
                     "gpupool.agent.cli")
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


def main() -> None:
    """Console-script entry point (``gpupool``)."""
    app(prog_name="gpupool")


if __name__ == "__main__":  # pragma: no cover
    main()
