"""``gpupool scheduler``: run the Kubernetes scheduler, or show what it would do (``--dry-run``).

    gpupool scheduler [--config FILE] [--kubeconfig FILE] [--leader-elect] [--policy gpupool] ...
    gpupool scheduler --dry-run --snapshot cluster.yaml [--json OUT]
    gpupool scheduler --dry-run [--kubeconfig FILE]          # plan on the live cluster, bind nothing

``--config`` reads the ConfigMap of ``deploy/`` (``GpupoolSchedulerConfiguration``: ``leaderElection``,
``profiles[0].schedulerName/policy``, ``metrics.bindAddress``, ``logging``, ``telemetry``); flags given
on the command line win over it. Exit codes: 0 success; 2 bad usage, unreadable config or snapshot.

Registered on the ``gpupool`` CLI through ``gpupool.cli.EXTENSION_MODULES``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel, ConfigDict

from gpupool.inputs import load_yaml, out_of_range, unknown_keys
from gpupool.k8s import DEFAULT_SCHEDULER_NAME, SHARE_ENFORCEMENT_MODES
from gpupool.k8s.api.client import ConfigError, host_port, load_api_client, parse_duration
from gpupool.policies import DEFAULT_POLICY, REGISTRY
from gpupool.provenance import run_meta

DEFAULT_LEASE = "gpupool-scheduler"
DEFAULT_LEASE_NAMESPACE = "gpupool-system"


@dataclass
class Settings:
    """What ``gpupool scheduler`` runs with (config file, then flags)."""

    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    policy: str = DEFAULT_POLICY
    leader_elect: bool = True  # as kube-scheduler's --leader-elect: two replicas without it book GPUs twice
    lease_name: str = DEFAULT_LEASE
    lease_namespace: str = field(default_factory=lambda: os.environ.get("POD_NAMESPACE") or DEFAULT_LEASE_NAMESPACE)
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    metrics_address: str = "0.0.0.0:8080"
    log_format: str = "json"
    log_level: str = "info"
    prometheus_url: str = ""
    dcgm_endpoints: list[str] = field(default_factory=list)
    pool: bool = True  # the pool scheduler runs the cluster (queues' fair share, gangs, reclaim, preemption)
    job_order: str = "fifo"  # within a queue, after priority: fifo, tiresias (2D-LAS), gittins or remaining
    reserve_after_s: float | None = 600.0  # a gang waiting this long gets nodes reserved (None: never)
    min_runtime_s: float = 60.0  # a pod runs at least this long before it may be evicted
    consolidate: bool = False  # move running pods to defragment (a move restarts them)
    preemption: bool = True
    reclaim: bool = True
    elastic: bool = True
    default_queue: str = "default"
    # pods at or above this priority are never evicted and run only within the quota of a queue that has one
    # (KAI's 100); in a queue without a quota (the default queue) they take free capacity. None: none is so.
    nonpreemptible_priority: int | None = 100
    share_enforcement: str = "none"  # what enforces a GPU share on the nodes: none, hami or trust (docs/kubernetes.md)

    def pool_config(self) -> Any:
        """The :class:`~gpupool.engine.pool.PoolConfig` these settings give
        (:func:`gpupool.k8s.cycle.pool.driver.live_config`)."""
        from gpupool.engine.pool.ordering import SIZE_ORDERS  # the pool package loads only when it runs
        from gpupool.k8s.cycle.pool import live_config

        knob = {"promote_knob": 1.0} if self.job_order in SIZE_ORDERS else {}  # as the simulator's gittins policy
        return live_config(order=self.job_order, reserve_after_s=self.reserve_after_s, min_run_s=self.min_runtime_s,
                           reclaim_min_run_s=self.min_runtime_s, consolidate=self.consolidate,
                           preempt=self.preemption, reclaim=self.reclaim, elastic=self.elastic,
                           nonpreemptible_priority=self.nonpreemptible_priority, **knob)


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _LeaderElectionKeys(_Keys):
    leaderElect: Any = None
    resourceLock: Any = None  # kube-scheduler's; gpupool always uses a Lease
    resourceName: Any = None
    resourceNamespace: Any = None
    leaseDuration: Any = None
    renewDeadline: Any = None
    retryPeriod: Any = None


class _ProfileKeys(_Keys):
    schedulerName: Any = None
    policy: Any = None


class _PoolKeys(_Keys):
    enabled: Any = None
    jobOrder: Any = None
    reserveAfter: Any = None
    minRuntime: Any = None
    consolidate: Any = None
    preemption: Any = None
    reclaim: Any = None
    elastic: Any = None
    defaultQueue: Any = None
    nonPreemptiblePriority: Any = None


class _MetricsKeys(_Keys):
    bindAddress: Any = None


class _LoggingKeys(_Keys):
    format: Any = None
    level: Any = None


class _TelemetryKeys(_Keys):
    prometheusURL: Any = None
    dcgmEndpoints: Any = None


class ConfigKeys(_Keys):
    """The key schema of a ``GpupoolSchedulerConfiguration`` (:func:`gpupool.inputs.unknown_keys`); the values
    are checked by :func:`load_config`."""

    apiVersion: Any = None
    kind: Any = None
    leaderElection: _LeaderElectionKeys | None = None
    profiles: list[_ProfileKeys] | None = None
    metrics: _MetricsKeys | None = None
    logging: _LoggingKeys | None = None
    telemetry: _TelemetryKeys | None = None
    pool: _PoolKeys | None = None
    shareEnforcement: Any = None


def load_config(path: Path, settings: Settings | None = None) -> Settings:
    """Read a ``GpupoolSchedulerConfiguration`` YAML file into ``settings`` (raises :class:`ConfigError`)."""
    s = settings or Settings()
    try:
        text: str | None = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    source = str(path)
    doc = load_yaml(text or "", source, ConfigError) or {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: expected a mapping at the top")
    if doc.get("kind") == "ConfigMap":  # deploy/configmap.yaml as it is: read its data["config.yaml"]
        inner = (doc.get("data") or {}).get("config.yaml")
        if not isinstance(inner, str):
            raise ConfigError(f"{path}: ConfigMap without a data['config.yaml'] entry")
        source, text = f"{path}: data['config.yaml']", None  # lines within the entry are not the file's
        doc = load_yaml(inner, source, ConfigError) or {}
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: data['config.yaml']: expected a mapping at the top")
    unknown_keys(doc, ConfigKeys, source, text, ConfigError)

    def section(name: str) -> dict[str, Any]:
        value = doc.get(name) or {}
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: {name}: expected a mapping")
        return value

    le = section("leaderElection")
    if "leaderElect" in le:
        s.leader_elect = bool(le["leaderElect"])
    s.lease_name = str(le.get("resourceName") or s.lease_name)
    s.lease_namespace = str(le.get("resourceNamespace") or s.lease_namespace)
    for key, attr in (("leaseDuration", "lease_duration"), ("renewDeadline", "renew_deadline"),
                      ("retryPeriod", "retry_period")):
        if key in le:
            setattr(s, attr, parse_duration(le[key], f"{path}: leaderElection.{key}"))
    profiles = doc.get("profiles") or []
    if not isinstance(profiles, list):
        raise ConfigError(f"{path}: profiles: expected a list")
    if len(profiles) > 1:
        raise ConfigError(f"{path}: profiles: gpupool runs one profile, got {len(profiles)}")
    if profiles:
        prof = profiles[0] or {}
        if not isinstance(prof, dict):
            raise ConfigError(f"{path}: profiles[0]: expected a mapping")
        s.scheduler_name = str(prof.get("schedulerName") or s.scheduler_name)
        s.policy = str(prof.get("policy") or s.policy)
    s.metrics_address = str(section("metrics").get("bindAddress") or s.metrics_address)
    logging_cfg = section("logging")
    s.log_format = str(logging_cfg.get("format") or s.log_format)
    s.log_level = str(logging_cfg.get("level") or s.log_level)
    tel = section("telemetry")
    s.prometheus_url = str(tel.get("prometheusURL") or "")
    s.dcgm_endpoints = [str(x) for x in tel.get("dcgmEndpoints") or []]
    if "shareEnforcement" in doc:
        s.share_enforcement = str(doc["shareEnforcement"])
        if s.share_enforcement not in SHARE_ENFORCEMENT_MODES:
            raise ConfigError(f"{path}: shareEnforcement: {s.share_enforcement!r}: expected "
                              f"{', '.join(SHARE_ENFORCEMENT_MODES)}")
    pool = section("pool")
    for key, attr in (("enabled", "pool"), ("consolidate", "consolidate"), ("preemption", "preemption"),
                      ("reclaim", "reclaim"), ("elastic", "elastic")):
        if key in pool:
            if not isinstance(pool[key], bool):
                raise ConfigError(f"{path}: pool.{key}: expected true or false, got {pool[key]!r}")
            setattr(s, attr, pool[key])
    if "jobOrder" in pool:
        from gpupool.engine.pool.ordering import ORDERS

        s.job_order = str(pool["jobOrder"])
        if s.job_order not in ORDERS:
            raise ConfigError(f"{path}: pool.jobOrder: {s.job_order!r}: expected {' or '.join(ORDERS)}")
    if "reserveAfter" in pool:
        raw = pool["reserveAfter"]
        s.reserve_after_s = None if str(raw).strip().lower() in ("never", "none", "off") else parse_duration(
            raw, f"{path}: pool.reserveAfter")
    if "minRuntime" in pool:
        raw = pool["minRuntime"]
        s.min_runtime_s = 0.0 if raw in (0, "0", "0s") else parse_duration(raw, f"{path}: pool.minRuntime")
    if "defaultQueue" in pool:
        s.default_queue = str(pool["defaultQueue"] or "default")
    if "nonPreemptiblePriority" in pool:
        s.nonpreemptible_priority = nonpreemptible_priority(pool["nonPreemptiblePriority"],
                                                            f"{path}: pool.nonPreemptiblePriority")
    return s


def nonpreemptible_priority(raw: Any, where: str) -> int | None:
    """``pool.nonPreemptiblePriority`` / ``--nonpreemptible-priority``: a whole number (a pod priority, int32), or
    ``none`` / ``off`` / null (every pod is preemptible). Raises :class:`ConfigError` naming ``where``."""
    if raw is None or str(raw).strip().lower() in ("none", "off", "never"):
        return None
    if isinstance(raw, bool):
        raise ConfigError(f"{where}: expected a whole number or none, got {raw!r}")
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"{where}: expected a whole number or none, got {raw!r}") from None
    if not -(2**31) <= value < 2**31:
        raise ConfigError(f"{where}: {value} is outside a pod priority's range (int32)")
    return value


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _in_range(option: str, low: float) -> Callable[[Any], Any]:
    """A Typer callback: a value below ``low``, NaN or infinite is refused as the option is read, in one line
    naming the option, the range and the value (:func:`gpupool.inputs.out_of_range`), exit 2."""

    def check(value: Any) -> Any:
        message = out_of_range(option, value, low)
        if message is not None:
            _fail(message)
        return value

    return check


def dry_run(snapshot_path: Path | None, json_out: str | None, settings: Settings, seed: int,
            kubeconfig: Path | None, context: str | None, dcgm_files: Sequence[Path] = ()) -> None:
    from gpupool.k8s.cycle.plan import format_plan
    from gpupool.k8s.cycle.planner import plan
    from gpupool.k8s.objects.snapshots import SnapshotError, load_snapshot

    telemetry = None
    if dcgm_files:
        from gpupool.k8s.telemetry import GpuTelemetry

        telemetry = GpuTelemetry(max_age=float("inf"))
        for path in dcgm_files:
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                _fail(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}")
            try:
                telemetry.ingest_text(text)
            except ValueError as exc:
                _fail(f"{path}: not a Prometheus text page: {exc}")
    if snapshot_path is not None:
        try:
            snap = load_snapshot(snapshot_path)
        except SnapshotError as exc:
            _fail(str(exc))
    else:
        from gpupool.k8s.scheduler import read_cluster

        try:
            snap = read_cluster(load_api_client(kubeconfig, context))
        except Exception as exc:
            _fail(f"cannot read the cluster: {exc}")
    health: list[tuple[str, int, bool]] = []

    def apply_health(state: Any) -> None:
        assert telemetry is not None
        health.extend(telemetry.apply_health(state))
        if settings.policy == "load-aware":  # it also reads GPU utilisation and memory
            from gpupool.policies.load_aware import set_gpu_load, telemetry_load

            set_gpu_load(state, *telemetry_load(telemetry, state))
        known = set(state.node_names)
        unknown = sorted({node for node, _ in telemetry.fresh() if node not in known})
        if unknown:
            typer.echo(f"warning: DCGM data for node(s) not in the snapshot, ignored: {', '.join(unknown[:10])}"
                       + (" ..." if len(unknown) > 10 else ""), err=True)

    result = plan(snap, settings.scheduler_name, settings.policy, seed,
                  prepare_state=apply_health if telemetry is not None else None,
                  pool=settings.pool_config() if settings.pool else None, share_enforcement=settings.share_enforcement)
    if snapshot_path is not None and result.placements and result.state is None:
        skipped = "; ".join(f"{s.get('node')}: {s['reason']}" for s in result.skipped if "node" in s)
        _fail(f"{snapshot_path}: no usable node in the snapshot"
              + (f" ({skipped})" if skipped else " (it holds no Node: kubectl get nodes,pods,podgroups,queues "
                                                 "-A -o yaml writes them)"))
    if telemetry is not None and json_out != "-":
        sick = [f"{node} GPU {gpu}" for node, gpu, ok in health if not ok]
        typer.echo(f"GPU health from {len(dcgm_files)} DCGM file(s): "
                   + (f"{len(sick)} GPU(s) marked unhealthy ({', '.join(sick[:10])})" if sick else
                      "no GPU marked unhealthy") + " (GPU numbers are gpupool's device indices on the node)",
                   err=True)
    payload = json.dumps({"meta": run_meta(), **result.to_json()}, indent=2)
    if json_out == "-":
        typer.echo(payload)
        return
    typer.echo(format_plan(result) if result.placements else
               f"no pending pod with schedulerName {settings.scheduler_name} (dry run, nothing bound)")
    if json_out:
        try:
            Path(json_out).write_text(payload + "\n", encoding="utf-8")
        except OSError as exc:
            _fail(f"{json_out}: cannot write: {exc.strerror or exc}")


def warm_kernels(log) -> None:
    """Compile (or load from numba's cache) the engine's kernels before the first pod, so that no scheduling
    cycle stalls on a compilation (:func:`gpupool.engine.kernels.warm_up`)."""
    from gpupool.engine import kernels

    try:
        took = kernels.warm_up()
    except RuntimeError as exc:  # serve anyway: a kernel then compiles on its first call
        log.warning("engine kernels not warmed up", extra={"error": str(exc)})
        return
    if took:  # empty: the compiled path is off
        log.info("engine kernels ready", extra={"kernels": len(took), "seconds": round(sum(took.values()), 3)})
    elif kernels.AVAILABLE:  # numba is there but could not be used
        log.warning("engine kernels off: decisions use NumPy only (same decisions, slower)")


def run_scheduler(settings: Settings, seed: int, identity: str, kubeconfig: Path | None,
                  context: str | None, stop: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set): scheduler, Lease elector, metrics server, telemetry."""
    import logging

    from gpupool.k8s.api.leader import LeaderElector
    from gpupool.k8s.metrics import MetricsServer, SchedulerMetrics, logging_setup
    from gpupool.k8s.scheduler import Scheduler, SchedulerConfig

    logging_setup(settings.log_level, fmt=settings.log_format)
    log = logging.getLogger("gpupool.k8s.scheduler")
    api = load_api_client(kubeconfig, context, writers=SchedulerConfig().bind_workers)
    metrics = SchedulerMetrics()
    warm_kernels(log)

    telemetry = poller = None
    sources: list[Any] = []
    if settings.dcgm_endpoints or settings.prometheus_url:
        from gpupool.k8s.telemetry import DcgmExporterSource, GpuTelemetry, PrometheusSource, TelemetryPoller

        if settings.dcgm_endpoints:
            sources.append(DcgmExporterSource(settings.dcgm_endpoints))
        if settings.prometheus_url:
            sources.append(PrometheusSource(settings.prometheus_url))
        telemetry = GpuTelemetry()
        poller = TelemetryPoller(telemetry, sources)

    stop = stop if stop is not None else threading.Event()
    elector = None
    cfg = SchedulerConfig(scheduler_name=settings.scheduler_name, policy=settings.policy, seed=seed,
                          identity=identity, gc_freeze=True, pool=settings.pool, pool_config=settings.pool_config(),
                          default_queue=settings.default_queue, share_enforcement=settings.share_enforcement)
    sched: Scheduler | None = None

    def wake() -> None:
        if sched is not None:
            sched.cache.changed.set()

    if settings.leader_elect:
        elector = LeaderElector(api, name=settings.lease_name, namespace=settings.lease_namespace, identity=identity,
                                lease_duration=settings.lease_duration, renew_deadline=settings.renew_deadline,
                                retry_period=settings.retry_period, on_started_leading=wake,
                                on_stopped_leading=wake)
    prepare_state = telemetry.apply_health if telemetry is not None else None
    if telemetry is not None and settings.policy == "load-aware":  # it also reads GPU utilisation and memory
        from gpupool.policies.load_aware import telemetry_prepare

        prepare_state = telemetry_prepare(telemetry)
    sched = Scheduler(api, cfg, leader=(lambda: elector.is_leader) if elector else None, metrics=metrics,
                      prepare_state=prepare_state)
    server = None
    if settings.metrics_address not in ("", "0"):
        host, port = host_port(settings.metrics_address)
        server = MetricsServer(metrics, host, port, liveness=sched.healthy).start()

    def on_signal(signum, frame) -> None:  # noqa: ARG001
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    if poller is not None:
        poller.start()
    sched.start()
    if elector is not None:
        elector.start()
    log.info("scheduler running", extra={"scheduler": settings.scheduler_name, "policy": settings.policy,
                                         "leader_elect": settings.leader_elect, "identity": identity})
    if not settings.leader_elect:
        log.warning("leader election off: run exactly one replica of this scheduler; two replicas without a Lease "
                    "book the same GPUs twice (a conflict with another gpupool binder is logged as "
                    "second_scheduler_detected)", extra={"scheduler": settings.scheduler_name})
    try:
        stop.wait()
    finally:
        sched.stop()  # no more bindings before the Lease is released
        if elector is not None:
            elector.stop()
        if poller is not None:
            poller.stop()
        if server is not None:
            server.stop()


def register(app: typer.Typer) -> None:
    """Add the ``scheduler`` command to ``app``."""

    @app.command("scheduler")
    def scheduler_cmd(
        dry_run_flag: Annotated[bool, typer.Option(
            "--dry-run", help="Print where each pending pod would go and why; bind nothing.")] = False,
        snapshot: Annotated[Path | None, typer.Option(
            "--snapshot", metavar="FILE", dir_okay=False, show_default=False,
            help="With --dry-run: a cluster snapshot (kubectl get nodes,pods,podgroups,queues -A -o yaml|json; "
                 "add resourceslices,deviceclasses,resourceclaims for DRA) instead of the live cluster.")] = None,
        json_out: Annotated[str | None, typer.Option(
            "--json", metavar="OUT", show_default=False,
            help='With --dry-run: write {"placements": [...]} to OUT ("-" for stdout).')] = None,
        dcgm_file: Annotated[list[Path] | None, typer.Option(
            "--dcgm-file", metavar="FILE", dir_okay=False, show_default=False,
            help="With --dry-run: a dcgm-exporter /metrics page saved to a file (repeatable); GPUs with an "
                 "XID error are avoided, matched by UUID / index as the live scheduler does.")] = None,
        config: Annotated[Path | None, typer.Option(
            "--config", metavar="FILE", dir_okay=False, show_default=False,
            help="GpupoolSchedulerConfiguration YAML (deploy/configmap.yaml); flags override it.")] = None,
        kubeconfig: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="kubeconfig file. Default: in-cluster ServiceAccount, else ~/.kube/config.")] = None,
        context: Annotated[str | None, typer.Option(show_default=False, help="kubeconfig context.")] = None,
        scheduler_name: Annotated[str | None, typer.Option(
            "--scheduler-name", show_default=False,
            help=f"Schedule pods whose spec.schedulerName is this. Default: {DEFAULT_SCHEDULER_NAME}.")] = None,
        policy: Annotated[str | None, typer.Option(
            show_default=False, help=f"Placement policy: {', '.join(REGISTRY)}. Default: {DEFAULT_POLICY}.")] = None,
        seed: Annotated[int, typer.Option(callback=_in_range("--seed", 0),
                                          help="Seed of the tie-break between equal nodes (>= 0).")] = 0,
        leader_elect: Annotated[bool | None, typer.Option(
            "--leader-elect/--no-leader-elect", show_default=False,
            help="Elect one binding replica through a coordination.k8s.io Lease. Default: on, as "
                 "kube-scheduler (or the config's leaderElection.leaderElect); --no-leader-elect: run exactly "
                 "one replica.")] = None,
        lease_name: Annotated[str | None, typer.Option(
            show_default=False, help=f"Lease name. Default: {DEFAULT_LEASE}.")] = None,
        lease_namespace: Annotated[str | None, typer.Option(
            show_default=False, help="Lease namespace. Default: $POD_NAMESPACE, else gpupool-system.")] = None,
        identity: Annotated[str | None, typer.Option(
            show_default=False, help="This replica's identity. Default: $POD_NAME, else the hostname.")] = None,
        metrics_bind_address: Annotated[str | None, typer.Option(
            "--metrics-bind-address", metavar="HOST:PORT", show_default=False,
            help="Serve /metrics, /healthz, /readyz here (0 = off). Default: 0.0.0.0:8080.")] = None,
        log_format: Annotated[str | None, typer.Option(
            show_default=False, help="Log lines as json or kv (logfmt). Default: json.")] = None,
        log_level: Annotated[str | None, typer.Option(
            show_default=False, help="debug, info, warning or error. Default: info.")] = None,
        pool: Annotated[bool | None, typer.Option(
            "--pool/--no-pool", show_default=False,
            help="Run the pool scheduler: queue fair share, gang reservation, reclaim, preemption by eviction, "
                 "elastic gangs. --no-pool: placement within queue limits only. Default: on.")] = None,
        job_order: Annotated[str | None, typer.Option(
            "--job-order", show_default=False,
            help="Order of jobs within a queue after priority: fifo, tiresias (2D-LAS), gittins or remaining "
                 "(by job sizes learned from the jobs that left, and a run-time limit a job declares: Kueue's "
                 "max-exec-time-seconds label or the pod's activeDeadlineSeconds). Default: fifo.")] = None,
        reserve_after: Annotated[float | None, typer.Option(
            "--reserve-after", metavar="SECONDS", callback=_in_range("--reserve-after", 0), show_default=False,
            help="Reserve nodes for a gang that waited this long (0: never). Default: 600.")] = None,
        min_runtime: Annotated[float | None, typer.Option(
            "--min-runtime", metavar="SECONDS", callback=_in_range("--min-runtime", 0), show_default=False,
            help="A pod runs at least this long before it may be evicted. Default: 60.")] = None,
        consolidate: Annotated[bool | None, typer.Option(
            "--consolidate/--no-consolidate", show_default=False,
            help="Move running pods (evict, they restart elsewhere) to defragment for a waiting job. "
                 "Default: off.")] = None,
        nonpreemptible: Annotated[str | None, typer.Option(
            "--nonpreemptible-priority", metavar="PRIORITY", show_default=False,
            help="Pods at or above this priority are never evicted and run only within the quota of a queue "
                 "that has one; in a queue without a quota (the default queue) they take free GPUs. 'none': "
                 "every pod is preemptible. Default: 100 (KAI's build and inference classes).")] = None,
        share_enforcement: Annotated[str | None, typer.Option(
            "--share-enforcement", show_default=False,
            help="What enforces a GPU share (less than a whole GPU, or a memory cap) on the nodes: none (shares are "
                 "refused with the reason), hami (HAMi's device plugin: shares go to nodes it registered, with the "
                 "annotations it reads), trust (placed anywhere: you vouch for another mechanism). Default: "
                 "none.")] = None,
    ) -> None:
        """Schedule the pods whose schedulerName is gpupool's: GPU-aware placement, gangs, queues.

        Lists and watches Nodes, Pods, PodGroups and Queues; binds through pods/binding with the devices
        recorded as gpupool.io/* annotations; posts Scheduled / FailedScheduling events. With --dry-run,
        prints where each pending pod would go and why, and binds nothing.
        """
        try:
            settings = load_config(config) if config is not None else Settings()
        except ConfigError as exc:
            _fail(str(exc))
        if scheduler_name:
            settings.scheduler_name = scheduler_name
        if policy:
            settings.policy = policy
        if leader_elect is not None:
            settings.leader_elect = leader_elect
        if lease_name:
            settings.lease_name = lease_name
        if lease_namespace:
            settings.lease_namespace = lease_namespace
        if metrics_bind_address is not None:
            settings.metrics_address = metrics_bind_address
        if log_format:
            settings.log_format = log_format
        if log_level:
            settings.log_level = log_level
        if pool is not None:
            settings.pool = pool
        if job_order is not None:
            settings.job_order = job_order
        if reserve_after is not None:
            settings.reserve_after_s = reserve_after or None
        if min_runtime is not None:
            settings.min_runtime_s = min_runtime
        if consolidate is not None:
            settings.consolidate = consolidate
        if share_enforcement is not None:
            settings.share_enforcement = share_enforcement
        if settings.share_enforcement not in SHARE_ENFORCEMENT_MODES:
            _fail(f"--share-enforcement {settings.share_enforcement!r}: expected {', '.join(SHARE_ENFORCEMENT_MODES)}")
        if nonpreemptible is not None:
            try:
                settings.nonpreemptible_priority = nonpreemptible_priority(nonpreemptible,
                                                                           "--nonpreemptible-priority")
            except ConfigError as exc:
                _fail(str(exc))
        from gpupool.engine.pool.ordering import ORDERS

        if settings.job_order not in ORDERS:
            _fail(f"job order {settings.job_order!r}: expected {' or '.join(ORDERS)}")
        if settings.policy not in REGISTRY:
            _fail(f"unknown policy {settings.policy!r}; known: {', '.join(REGISTRY)}")
        if settings.log_format not in ("json", "kv", "logfmt"):
            _fail(f"log format {settings.log_format!r}: expected json or kv")
        if str(settings.log_level).lower() not in ("debug", "info", "warning", "warn", "error", "critical"):
            _fail(f"log level {settings.log_level!r}: expected debug, info, warning or error")
        if (snapshot is not None or json_out is not None or dcgm_file) and not dry_run_flag:
            _fail("--snapshot, --json and --dcgm-file go with --dry-run")
        if dry_run_flag:
            dry_run(snapshot, json_out, settings, seed, kubeconfig, context, dcgm_file or [])
            return
        who = identity or os.environ.get("POD_NAME") or socket.gethostname()
        try:
            run_scheduler(settings, seed, who, kubeconfig, context)
        except ConfigError as exc:
            _fail(str(exc))
        sys.stdout.flush()


__all__ = ["register", "load_config", "Settings", "ConfigError", "parse_duration", "load_api_client", "warm_kernels"]
