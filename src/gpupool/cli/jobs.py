"""Job-trace runs (``simulate --jobs``, ``compare --jobs``): objectives, the job-model text and flags.
Imports :mod:`gpupool.cli.options` and :mod:`gpupool.cli.common` within the CLI."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import typer

from gpupool import report
from gpupool.cli.common import (
    check_outputs,
    exit_interrupted,
    fail,
    parse_seeds,
    print_table,
    run_all,
    table_console,
    table_kwargs,
    trace_error,
)
from gpupool.cli.options import JobFormat, Protocol
from gpupool.model import GpupoolError
from gpupool.traces import TraceFormatError, load_jobs


def execute_jobs(
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
            fail(f"unknown job policy {name!r}; known: {', '.join(JOB_POLICIES)}")
        if name not in names:
            names.append(name)
    if not names:
        fail("no policy given")
    if cluster is None:
        fail("--jobs needs --cluster FILE.yaml (see examples/clusters/)")
    seeds = parse_seeds(seed)
    for flag, value in (("--checkpoint-interval", checkpoint), ("--repair-hours", repair)):
        if not value >= 0:
            fail(f"{flag} must be >= 0, got {value}")
    for flag, value in (("--node-mtbf-hours", node_mtbf), ("--gpu-mtbf-hours", gpu_mtbf)):
        if value is not None and not value > 0:
            fail(f"{flag} must be > 0, got {value}")
    if not 0.0 <= elastic <= 1.0:
        fail(f"--elastic-fraction must be within 0..1, got {elastic}")
    if gpu_speed not in ("none", "catalog"):
        fail(f"--gpu-speed must be 'none' or 'catalog', got {gpu_speed!r}")
    if max_jobs is not None and max_jobs < 1:
        fail(f"--max-jobs must be >= 1, got {max_jobs}")
    if queues is not None and model and model.get("one_queue"):  # one_queue renames every job's queue
        fail(f"--one-queue puts every job in one queue; drop --queues {queues}")
    check_outputs(out, json_file, ["jct_distribution.png", "queue_share.png"])
    try:
        node_list = load_cluster_yaml(cluster)
        tree = load_queues_yaml(queues) if queues is not None else None
        records = load_jobs(jobs, fmt.value if fmt is not None else None)
    except TraceFormatError as exc:
        fail(trace_error(exc))
    except OSError as exc:
        fail(f"cannot read {exc.filename or ''}: {exc.strerror or exc}")
    except ValueError as exc:  # cluster or queue file errors name the file and the field
        fail(str(exc))
    if not records:
        fail(f"{jobs}: the job trace has no jobs")
    if not any(n.gpu_count for n in node_list):
        fail(f"{cluster}: the cluster has no GPUs; the job simulator needs at least one GPU node")
    if max_jobs is not None:
        records = records[:max_jobs]
    if tree is not None:
        leaves = {tree.names[i] for i in tree.leaves}
        missing = sorted({r.queue or "default" for r in records} - leaves)
        if missing:
            fail(f"{queues}: no leaf queue for trace queue(s) {', '.join(missing[:5])}"
                 + (" ..." if len(missing) > 5 else ""))
    config = JobSimConfig(checkpoint_interval_s=checkpoint if checkpoint > 0 else math.inf,
                          node_mtbf_h=node_mtbf, gpu_mtbf_h=gpu_mtbf, repair_h=repair, elastic_fraction=elastic,
                          gpu_speed=gpu_speed)
    config, overrides, fair_cost = _job_model(config, model or {}, tree is not None, names)
    if model and model.get("one_queue"):
        records = one_queue(records)
    console = table_console(200)
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
    runs, interrupted = run_all(items, run_one, quiet=quiet, errors=(GpupoolError, ValueError, KeyError),
                                workers=workers, executor=executor)
    one_runs = {(r.policy, r.record["seed"]): r.record["fairness_cost"] for r in runs} if fair_cost else {}
    if interrupted and not runs:
        exit_interrupted(0, len(items), False)
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
        print_table(console, report.jobs_table(summary, title, **table_kwargs(report.jobs_table, wide)), wide)
        console.print("events/s: simulator events per second of this run's wall time, other runs on the machine "
                      "included; benchmarks/bench_jobs.py measures events per CPU second (docs/pool-scheduler.md)",
                      style="dim", highlight=False, soft_wrap=wide)
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
            fail(f"cannot write {path}: {exc.strerror or exc}", code=1)
        written.append(path)
    if out is not None:
        try:
            out.mkdir(parents=True, exist_ok=True)
            written.append(report.plot_jct_cdf(runs, out / "jct_distribution.png", trace=jobs))
            written.append(report.plot_queue_share(runs, out / "queue_share.png", trace=jobs))
        except OSError as exc:
            fail(f"cannot write plots to {out}: {exc.strerror or exc}", code=1)
    for path in written:
        typer.echo(f"wrote {path}", err=to_stdout)
    if interrupted:
        exit_interrupted(len(runs), len(items), bool(written))


def _objectives(value: str | None) -> list[str]:
    """The --objective list (empty: not given); exits with a clear error for an unknown objective."""
    from gpupool.engine.pool.hetero import OBJECTIVES

    if value is None:
        return []
    out = list(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    bad = [v for v in out if v not in OBJECTIVES]
    if bad or not out:
        fail(f"--objective must be {', '.join(OBJECTIVES)} or a comma list of them, got {value!r}")
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
            fail(f"{flag} must be a finite number, got {model[key]}")
    if model.get("restart_overhead") is not None:
        if not model["restart_overhead"] >= 0:
            fail(f"--restart-overhead must be >= 0, got {model['restart_overhead']}")
        if model["restart_overhead"] > _MAX_RESTART_S:  # a stall of 1e300 s hangs the clock (t + dt == t)
            fail(f"--restart-overhead must be at most {_MAX_RESTART_S:.0f} s (a year), "
                 f"got {model['restart_overhead']}")
        sim["restart_overhead_s"] = float(model["restart_overhead"])
    if model.get("topology_slowdown") is False:
        sim["topology"] = TopologyConfig(factors={t: 1.0 for t in TIERS})
    if model.get("gpus_per_pod") is not None:
        if model["gpus_per_pod"] < 1:
            fail(f"--gpus-per-pod must be >= 1, got {model['gpus_per_pod']}")
        sim["max_gpus_per_pod"] = model["gpus_per_pod"]
    if model.get("job_order") is not None:
        if model["job_order"] not in (*ORDERS, "las"):
            fail(f"--job-order must be one of {', '.join(ORDERS)}, got {model['job_order']!r}")
        over["order"] = model["job_order"]
    if model.get("las_thresholds") is not None:
        try:
            t = tuple(float(x) for x in model["las_thresholds"].split(",") if x.strip())
        except ValueError:
            fail(f"--las-thresholds must be numbers separated by commas, got {model['las_thresholds']!r}")
        if (not t or not all(math.isfinite(x) and x > 0 for x in t)
                or any(b <= a for a, b in zip(t, t[1:], strict=False))):
            fail(f"--las-thresholds must be finite, positive and increasing, got {model['las_thresholds']!r}")
        over["thresholds"] = t
    if model.get("promote_knob") is not None:
        text = str(model["promote_knob"]).strip().lower()
        try:
            knob = None if text in ("none", "off") else float(text)
        except ValueError:
            fail(f"--promote-knob must be a number > 0 or none, got {model['promote_knob']!r}")
        if knob is not None and not (math.isfinite(knob) and knob > 0):
            fail(f"--promote-knob must be a finite number > 0 or none, got {model['promote_knob']!r}")
        over["promote_knob"] = knob
    if model.get("size_estimates") is not None:
        if not model["size_estimates"] >= 0:
            fail(f"--size-estimates must be >= 0, got {model['size_estimates']}")
        sim["size_estimate_error"] = float(model["size_estimates"])
    if model.get("throughputs") is not None:
        from gpupool.sim.throughput import load_throughput_table

        try:
            sim["throughputs"] = load_throughput_table(model["throughputs"])
        except (OSError, ValueError) as exc:
            fail(f"--throughputs: {exc}")
    if model.get("las_work"):
        sim["las_work"] = True
    if model.get("migrate"):
        from gpupool.sim.migration import MigrationConfig

        sim["migration"] = MigrationConfig()
    if model.get("min_run") is not None:
        if not model["min_run"] >= 0:
            fail(f"--min-run must be >= 0, got {model['min_run']}")
        over["min_run_s"] = float(model["min_run"])
    if model.get("max_preemptions") is not None:
        if model["max_preemptions"] < 0:
            fail(f"--max-preemptions must be >= 0, got {model['max_preemptions']}")
        over["max_preemptions"] = model["max_preemptions"]
    if model.get("protect_after_hours") is not None:
        if not model["protect_after_hours"] > 0:
            fail(f"--protect-after-hours must be > 0, got {model['protect_after_hours']}")
        over["protect_after_s"] = 3600.0 * model["protect_after_hours"]
    base = {n: JOB_POLICIES[n][1] for n in names if n in JOB_POLICIES}
    order = model.get("job_order")
    if order is not None:
        own = [n for n, c in base.items() if c.order in SIZE_ORDERS and c.order != order]
        if own:
            fail(f"--job-order {order} would replace the {own[0]} policy's own order ({base[own[0]].order}); use "
                 f"-p gpupool --job-order {order} (--promote-knob {_knob_text(base[own[0]].promote_knob)} for the "
                 f"{own[0]} policy's starvation knob)")
    orders = {order if order is not None else c.order for c in base.values()}
    for flag, key in (("--size-prior", "size_prior"), ("--size-estimates", "size_estimates")):
        if model.get(key) is not None and base and not orders & set(SIZE_ORDERS):
            fail(f"{flag} {model[key]} applies only to a policy or --job-order that ranks jobs by size "
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
            fail(f"cannot read {path}: {exc.strerror or exc}")
        except UnicodeDecodeError as exc:
            fail(f"--size-prior {path}: not UTF-8 text (byte {exc.start}: {exc.reason})")
        except ValueError as exc:
            fail(str(exc))
    fair_cost = bool(model.get("fairness_cost"))
    if fair_cost and (model.get("one_queue") or has_queue_file):
        fail("--fairness-cost compares the trace's queues with one queue; drop --one-queue / --queues")
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
               "fairness_cost": ("--fairness-cost", False), "objective": ("--objective", None),
               "throughputs": ("--throughputs", None), "las_work": ("--las-work", False),
               "migrate": ("--migrate", False)}
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


def model_args(given: dict[str, Any]) -> dict[str, Any]:
    return {k: given[k] for k in _MODEL_ARGS}


def model_flags(given: dict[str, Any]) -> dict[str, bool]:
    """Flags of the job-model switches that differ from their default (for :func:`job_only_flags`)."""
    return {flag: given[k] != default for k, (flag, default) in _MODEL_ARGS.items()}


def job_only_flags(jobs: Path | None, **given: Any) -> None:
    if jobs is None:
        used = [flag for flag, value in given.items() if value]
        if used:
            fail(f"{', '.join(used)} {'applies' if len(used) == 1 else 'apply'} only with --jobs")


def pod_only_flags(nodes: Path | None, pods: Path | None, protocol: Protocol, ratio: float) -> None:
    used = [f for f, v in (("--nodes", nodes), ("--pods", pods)) if v is not None]
    if protocol != Protocol.inflation:
        used.append("--protocol")
    if ratio != 1.3:
        used.append("--ratio")
    if used:
        fail(f"{', '.join(used)} {'does' if len(used) == 1 else 'do'} not apply to job traces (--jobs)")
