"""Placement runs and the ``policies``, ``simulate`` and ``compare`` commands (added to the root app).
Imports the other modules of :mod:`gpupool.cli` except the package itself and ``autoscale``."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool import report
from gpupool.cli.common import (
    accepts_progress,
    check_outputs,
    check_policies,
    exit_interrupted,
    fail,
    load_traces,
    parse_seeds,
    policy_rows,
    print_table,
    replay_runner,
    run_all,
    split,
    table_console,
    table_kwargs,
)
from gpupool.cli.jobs import execute_jobs, job_only_flags, model_args, model_flags, pod_only_flags
from gpupool.cli.options import (
    CheckpointOpt,
    ClusterOpt,
    ElasticOpt,
    EstimateOpt,
    ExecutorOpt,
    FairCostOpt,
    FormatOpt,
    GpuMtbfOpt,
    GpuSpeedOpt,
    GpusPerPodOpt,
    JobOrderOpt,
    JobsOpt,
    JsonOpt,
    KnobOpt,
    LasWorkOpt,
    MaxJobsOpt,
    MaxPreemptOpt,
    MigrateOpt,
    MinRunOpt,
    NodeMtbfOpt,
    NodesOpt,
    ObjectiveOpt,
    OneQueueOpt,
    OutOpt,
    ParallelOpt,
    PodsOpt,
    PriorOpt,
    ProtectOpt,
    Protocol,
    ProtocolOpt,
    QueuesOpt,
    QuietOpt,
    RatioOpt,
    RepairOpt,
    RestartOpt,
    SeedOpt,
    ThresholdsOpt,
    ThroughputsOpt,
    TopoSlowOpt,
    WideOpt,
)
from gpupool.cli.root import app
from gpupool.model import GpupoolError
from gpupool.policies import DEFAULT_POLICY, REGISTRY


def _execute(
    *, policies: Sequence[str], nodes: Path | None, pods: Path | None, protocol: Protocol,
    seed: Sequence[str] | None, ratio: float, out: Path | None, json_file: str | None, quiet: bool,
    wide: bool = False, workers: int | None = 1, executor: str = "local",
) -> None:
    policy_names = check_policies(policies)
    seeds = parse_seeds(seed)
    if not (math.isfinite(ratio) and ratio > 0):
        fail(f"--ratio must be a finite number > 0, got {ratio}")
    proto = protocol.value
    plot_names = (["allocation_vs_arrived.png"] if proto == "inflation" else ["allocation_over_time.png"])
    check_outputs(out, json_file, [*plot_names, "unallocated_gpus.png"])
    if proto == "replay":
        runner = replay_runner()
    else:
        from gpupool.sim.inflation import run_inflation as runner
    node_list, pod_list = load_traces(nodes, pods)

    console = table_console(200)
    pass_progress = proto == "inflation" or accepts_progress(runner)
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
    runs, interrupted = run_all(items, run_one, quiet=quiet, errors=(GpupoolError, ValueError), workers=workers,
                                executor=executor)
    if interrupted and not runs:
        exit_interrupted(0, len(items), False)
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
        print_table(console, report.results_table(summary, proto, title,
                                                  **table_kwargs(report.results_table, wide)), wide)
        console.print("dec/s: pods per second of Engine.place in this run (kernels compiled beforehand), other runs "
                      "on the machine included; benchmarks/bench_decisions.py measures it alone on one core "
                      "(docs/benchmarks.md)", style="dim", highlight=False, soft_wrap=wide)
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
            fail(f"cannot write {path}: {exc.strerror or exc}", code=1)
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
            fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)
    if interrupted:
        exit_interrupted(len(runs), len(items), bool(written))



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
        sys.stdout.write(report.dumps(_job_policy_rows() if jobs else policy_rows()))
        return
    console = table_console(160)
    if not jobs:
        console.print(report.policies_table(policy_rows()))
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
    throughputs: ThroughputsOpt = None,
    las_work: LasWorkOpt = False,
    migrate: MigrateOpt = False,
) -> None:
    """Run one placement policy on a trace and print its GPU allocation, fragmentation and failures.

    Same options and outputs as `compare`, for a single policy. With --jobs, run one job-level policy
    (fifo, round-robin, gpupool, gittins, lowest-power: `gpupool policies --jobs`) on a job trace and print
    JCT, queueing delay, utilization, fairness, preemptions and energy.
    """
    if jobs is not None:
        pod_only_flags(nodes, pods, protocol, ratio)
        execute_jobs(policies=[policy], jobs=jobs, fmt=fmt, cluster=cluster, queues=queues, seed=seed, out=out,
                     json_file=json_file, quiet=quiet, checkpoint=checkpoint, node_mtbf=node_mtbf,
                     gpu_mtbf=gpu_mtbf, repair=repair, elastic=elastic, gpu_speed=gpu_speed, max_jobs=max_jobs,
                     wide=wide, model=model_args(locals()))
        return
    job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                            "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                            "--max-jobs": max_jobs, "--elastic-fraction": elastic, **model_flags(locals())})
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
    throughputs: ThroughputsOpt = None,
    las_work: LasWorkOpt = False,
    migrate: MigrateOpt = False,
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

        pod_only_flags(nodes, pods, protocol, ratio)
        execute_jobs(policies=split(policies) or list(DEFAULT_JOB_POLICIES), jobs=jobs, fmt=fmt, cluster=cluster,
                     queues=queues, seed=seed, out=out, json_file=json_file, quiet=quiet, checkpoint=checkpoint,
                     node_mtbf=node_mtbf, gpu_mtbf=gpu_mtbf, repair=repair, elastic=elastic, gpu_speed=gpu_speed,
                     max_jobs=max_jobs, wide=wide, model=model_args(locals()), workers=jobs_parallel,
                     executor=executor)
        return
    job_only_flags(jobs, **{"--format": fmt, "--cluster": cluster, "--queues": queues,
                            "--node-mtbf-hours": node_mtbf, "--gpu-mtbf-hours": gpu_mtbf,
                            "--max-jobs": max_jobs, "--elastic-fraction": elastic, **model_flags(locals())})
    names = split(policies) or list(REGISTRY)
    _execute(policies=names, nodes=nodes, pods=pods, protocol=protocol, seed=seed, ratio=ratio,
             out=out, json_file=json_file, quiet=quiet, wide=wide, workers=jobs_parallel, executor=executor)

