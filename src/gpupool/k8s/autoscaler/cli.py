"""``gpupool autoscaler``: run the GpuAutoscaler controller (deploy/autoscaler/).

    gpupool autoscaler --prometheus-url http://prometheus.monitoring.svc:9090 [--leader-elect] [--namespace NS]

Flags as ``gpupool scheduler``'s (kubeconfig / in-cluster, Lease leader election, ``/metrics`` ``/healthz``
``/readyz``, JSON or logfmt logs). Exit codes: 0 stopped by SIGTERM / SIGINT; 2 bad usage or no usable
configuration. Registered on the ``gpupool`` CLI through ``gpupool.cli.EXTENSION_MODULES``.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import Annotated

import typer

from gpupool.k8s.autoscaler import COMPONENT

DEFAULT_LEASE = COMPONENT
DEFAULT_METRICS_ADDRESS = "0.0.0.0:8081"


def run_autoscaler(prometheus_url: str, *, kubeconfig: Path | None = None, context: str | None = None,
                   identity: str = "", namespace: str | None = None, sync_period: float = 15.0,
                   leader_elect: bool = False, lease_name: str = DEFAULT_LEASE, lease_namespace: str = "",
                   lease_duration: float = 15.0, renew_deadline: float = 10.0, retry_period: float = 2.0,
                   metrics_address: str = DEFAULT_METRICS_ADDRESS, prometheus_timeout: float = 5.0,
                   prometheus_retries: int = 2, stop: threading.Event | None = None) -> None:
    """Run until SIGTERM/SIGINT (or ``stop`` is set): controller, Lease elector, metrics server.

    Raises :class:`gpupool.k8s.api.client.ConfigError` for an unusable kubeconfig or bind address.
    """
    import logging

    from gpupool.k8s.api.client import host_port, load_api_client
    from gpupool.k8s.api.leader import LeaderElector
    from gpupool.k8s.autoscaler.controller import AutoscalerController, AutoscalerMetrics, ControllerConfig
    from gpupool.k8s.autoscaler.prometheus import PrometheusClient
    from gpupool.k8s.metrics import MetricsServer

    log = logging.getLogger("gpupool.k8s.autoscaler")
    api = load_api_client(kubeconfig, context, writers=4)
    prom = PrometheusClient(prometheus_url, timeout=prometheus_timeout, retries=prometheus_retries)
    metrics = AutoscalerMetrics()
    stop = stop if stop is not None else threading.Event()
    elector = None
    ctl: AutoscalerController | None = None

    def wake() -> None:
        if ctl is not None:
            ctl.resync()

    if leader_elect:
        elector = LeaderElector(api, name=lease_name, namespace=lease_namespace or "gpupool-system",
                                identity=identity, lease_duration=lease_duration, renew_deadline=renew_deadline,
                                retry_period=retry_period, on_started_leading=wake, on_stopped_leading=wake)
    cfg = ControllerConfig(identity=identity, namespace=namespace or None, sync_period_s=sync_period)
    ctl = AutoscalerController(api, prom, cfg, leader=(lambda: elector.is_leader) if elector else None,
                               metrics=metrics)
    server = None
    if metrics_address not in ("", "0"):
        host, port = host_port(metrics_address)
        server = MetricsServer(metrics, host, port, liveness=ctl.healthy).start()  # type: ignore[arg-type]

    def on_signal(signum, frame) -> None:  # noqa: ARG001
        log.info("stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
    ctl.start()
    if elector is not None:
        elector.start()
    log.info("autoscaler running", extra={"prometheus": prometheus_url, "leader_elect": leader_elect,
                                          "identity": identity, "namespace": namespace or "(all)"})
    try:
        stop.wait()
    finally:
        ctl.stop()  # no more scale writes before the Lease is released
        if elector is not None:
            elector.stop()
        if server is not None:
            server.stop()
        prom.close()


def register(app: typer.Typer) -> None:
    """Add the ``autoscaler`` command to ``app``."""

    @app.command("autoscaler")
    def autoscaler_cmd(
        prometheus_url: Annotated[str, typer.Option(
            "--prometheus-url", envvar="PROMETHEUS_URL", metavar="URL",
            help="Prometheus HTTP API base URL (e.g. http://prometheus.monitoring.svc:9090).")],
        kubeconfig: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="kubeconfig file. Default: in-cluster ServiceAccount, else ~/.kube/config.")] = None,
        context: Annotated[str | None, typer.Option(show_default=False, help="kubeconfig context.")] = None,
        namespace: Annotated[str | None, typer.Option(
            envvar="GPUPOOL_WATCH_NAMESPACE", show_default=False,
            help="Watch GpuAutoscalers in this namespace only (deploy/autoscaler/namespaced). Default: all.")] = None,
        sync_period: Annotated[float, typer.Option(
            "--sync-period", metavar="SECONDS", min=1.0, max=86400.0,
            help="Reconcile every GpuAutoscaler at least this often (the HPA's default).")] = 15.0,
        prometheus_timeout: Annotated[float, typer.Option(
            "--prometheus-timeout", metavar="SECONDS", min=0.5, max=300.0,
            help="Timeout of one query.")] = 5.0,
        prometheus_retries: Annotated[int, typer.Option(
            "--prometheus-retries", metavar="N", min=0, max=20,
            help="Retries of a query on a connection error or 429/502/503/504.")] = 2,
        leader_elect: Annotated[bool, typer.Option(
            "--leader-elect/--no-leader-elect",
            help="Elect one active replica through a coordination.k8s.io Lease.")] = False,
        lease_name: Annotated[str, typer.Option(help="Lease name.")] = DEFAULT_LEASE,
        lease_namespace: Annotated[str | None, typer.Option(
            show_default=False, help="Lease namespace. Default: $POD_NAMESPACE, else gpupool-system.")] = None,
        identity: Annotated[str | None, typer.Option(
            show_default=False, help="This replica's identity. Default: $POD_NAME, else the hostname.")] = None,
        metrics_bind_address: Annotated[str, typer.Option(
            "--metrics-bind-address", metavar="HOST:PORT",
            help="Serve /metrics, /healthz, /readyz here (0 = off).")] = DEFAULT_METRICS_ADDRESS,
        log_format: Annotated[str, typer.Option(help="Log lines as json or kv (logfmt).")] = "json",
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Scale Deployments / StatefulSets from Prometheus metrics (GpuAutoscaler).

        Watches gpuautoscalers.gpupool.io; every --sync-period per object: reads the target's scale
        subresource, queries Prometheus, runs gpupool's recommender (HPA rules, Knative panic, KEDA scale to
        zero), writes scale.spec.replicas, posts Events and writes status (and the chosen GPU slice).
        """
        from gpupool.k8s.api.client import ConfigError
        from gpupool.k8s.metrics import logging_setup

        if log_format not in ("json", "kv", "logfmt"):
            _fail(f"log format {log_format!r}: expected json or kv")
        if log_level.lower() not in ("debug", "info", "warning", "warn", "error", "critical"):
            _fail(f"log level {log_level!r}: expected debug, info, warning or error")
        if not prometheus_url.startswith(("http://", "https://")):
            _fail(f"--prometheus-url {prometheus_url!r}: expected http://HOST:PORT or https://...")
        logging_setup(log_level, fmt=log_format)
        who = identity or os.environ.get("POD_NAME") or socket.gethostname()
        try:
            run_autoscaler(prometheus_url, kubeconfig=kubeconfig, context=context, identity=who,
                           namespace=namespace, sync_period=sync_period, leader_elect=leader_elect,
                           lease_name=lease_name,
                           lease_namespace=lease_namespace or os.environ.get("POD_NAMESPACE") or "gpupool-system",
                           metrics_address=metrics_bind_address, prometheus_timeout=prometheus_timeout,
                           prometheus_retries=prometheus_retries)
        except ConfigError as exc:
            _fail(str(exc))


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


__all__ = ["register", "run_autoscaler", "DEFAULT_LEASE", "DEFAULT_METRICS_ADDRESS"]
