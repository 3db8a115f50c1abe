"""The Typer option types shared by the commands (``simulate``, ``compare`` and their job-trace forms), with the
bounds of their numbers (refused as the option is read: :func:`gpupool.cli.common.in_range`). Imports only
constants and :func:`~gpupool.cli.common.in_range` of :mod:`gpupool.cli.common` within the CLI."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from gpupool.cli.common import EMBEDDED_NODES, EMBEDDED_PODS, LOG_PROGRESS_INTERVAL_S, in_range
from gpupool.sim.inflation import MAX_INFLATION_RATIO

MAX_PARALLEL = 256
"""Most --jobs-parallel processes: each holds a copy of the trace and the cluster; more than this on one machine
is memory exhausted, not speed (a Ray cluster takes --executor ray)."""
MAX_REPAIR_HOURS = 8760.0
"""Longest --repair-hours: a year. Longer is no repair at all, and far out (1e300 h) the simulated clock crawls
(a run of 3 s took 67)."""
MAX_SIZE_SIGMA = 10.0
"""Largest --size-estimates: exp(10 x N(0,1)) is already off by a factor of e**10 (22,000) per sigma; far above,
exp overflows to infinity."""


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
        callback=in_range("--ratio", 0, MAX_INFLATION_RATIO, low_open=True,
                          what="a multiple of the cluster's GPU capacity"),
        help="inflation only: submitted GPU demand as a multiple of the cluster GPU capacity "
             f"(0 < R <= {MAX_INFLATION_RATIO:g}).",
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
    typer.Option("--repair-hours", metavar="H", callback=in_range("--repair-hours", 0, MAX_REPAIR_HOURS),
                 help=f"Hours until a failed node or GPU is back (0 to {MAX_REPAIR_HOURS:g}, a year).",
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
                               callback=in_range("--size-estimates", 0, MAX_SIZE_SIGMA),
                               help="Every job carries an estimate of its size, as a user's run-time limit "
                                    "would, for gittins/remaining: its size x exp(SIGMA x N(0,1)), seeded; 0 is "
                                    "exact (clairvoyant), 1 typically off by up to a factor e, at most "
                                    f"{MAX_SIZE_SIGMA:g} (default: none).",
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
ThroughputsOpt = Annotated[
    Path | None, typer.Option("--throughputs", metavar="FILE", show_default=False,
                              help="Speeds per job type and GPU model (JSON: {\"rows\": {type: {model: speed}}}; "
                              "the \"\" row: one speed per model). Trace jobs carry no type, so they use the \"\" "
                              "row (docs/pool-scheduler.md).", rich_help_panel="Job traces")]
LasWorkOpt = Annotated[
    bool, typer.Option("--las-work", help="Attained service counts work done (GPU-seconds x the speed of the "
                       "job's GPUs), not GPU-seconds.", rich_help_panel=_MODEL)]
MigrateOpt = Annotated[
    bool, typer.Option("--migrate", help="Move running jobs to faster GPU models when that saves at least 10 % "
                       "of their remaining time after a 120 s restart (after 30 min of run).",
                       rich_help_panel=_MODEL)]
ParallelOpt = Annotated[
    int | None, typer.Option("--jobs-parallel", metavar="N", show_default=False,
                             callback=in_range("--jobs-parallel", 1, MAX_PARALLEL, what="processes"),
                             help=f"Runs at a time, one process each, 1 to {MAX_PARALLEL} (default: all cores).")]
ExecutorOpt = Annotated[
    str, typer.Option("--executor", metavar="local|ray",
                      help="local: processes on this machine; ray: a Ray cluster "
                      "(pip install 'gpupool[ray]', RAY_ADDRESS).")]

