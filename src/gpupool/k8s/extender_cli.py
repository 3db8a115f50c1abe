"""``gpupool extender``: serve the kube-scheduler extender API (see :mod:`gpupool.k8s.extender`).

Registered on the ``gpupool`` CLI through ``gpupool.cli.EXTENSION_MODULES``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpupool.k8s import SHARE_ENFORCEMENT_MODES
from gpupool.k8s.api.client import ConfigError, load_api_client
from gpupool.k8s.scheduler_cli import warm_kernels
from gpupool.policies import DEFAULT_POLICY, REGISTRY


def run_extender(*, host: str, port: int, url_prefix: str, policy: str, kubeconfig: Path | None,
                 context: str | None, resync: float, log_format: str, log_level: str,
                 dcgm_endpoints: list[str], prometheus_url: str, telemetry_interval: float,
                 telemetry_max_age: float, load_weight: float, share_enforcement: str = "none") -> None:
    import logging

    from aiohttp import web
    from kubernetes import client

    from gpupool.k8s.extender import Extender, NodeCache, make_app
    from gpupool.k8s.metrics import SchedulerMetrics, logging_setup
    from gpupool.k8s.telemetry import DcgmExporterSource, GpuTelemetry, PrometheusSource, TelemetryPoller

    logging_setup(log_level, fmt=log_format)
    log = logging.getLogger("gpupool.k8s.extender")
    api = load_api_client(kubeconfig, context)
    core = client.CoreV1Api(api)
    metrics = SchedulerMetrics()
    warm_kernels(log)

    telemetry = poller = None
    sources: list = []
    if dcgm_endpoints:
        sources.append(DcgmExporterSource(dcgm_endpoints))
    if prometheus_url:
        sources.append(PrometheusSource(prometheus_url))
    if sources:
        telemetry = GpuTelemetry(max_age=telemetry_max_age)
        poller = TelemetryPoller(telemetry, sources, interval=telemetry_interval)
        poller.poll_once()
        poller.start()

    cache = NodeCache(core, policy=policy, resync=resync, telemetry=telemetry, metrics=metrics,
                      share_enforcement=share_enforcement)
    try:
        cache.refresh()
    except Exception as exc:  # serve anyway: /readyz says 503 until a refresh succeeds
        log.warning("initial cache sync failed", extra={"error": repr(exc)})
    cache.start()
    extender = Extender(cache, core, metrics=metrics, telemetry=telemetry, load_weight=load_weight)
    app = make_app(extender, url_prefix=url_prefix, metrics=metrics)
    log.info("extender serving", extra={"host": host, "port": port, "prefix": url_prefix or "/", "policy": policy})
    try:
        web.run_app(app, host=host, port=port, print=None, access_log=None, handle_signals=True)
    finally:
        cache.stop()
        if poller is not None:
            poller.stop()


def register(app: typer.Typer) -> None:
    """Add the ``extender`` command to ``app``."""

    @app.command("extender")
    def extender_cmd(
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 8888,
        url_prefix: Annotated[str, typer.Option(
            "--url-prefix", help="Path before the verbs: kube-scheduler's urlPrefix path (e.g. /gpupool).")] = "",
        policy: Annotated[str, typer.Option(
            help=f"Placement policy that filters and scores: {', '.join(REGISTRY)}.")] = DEFAULT_POLICY,
        kubeconfig: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="kubeconfig file. Default: in-cluster ServiceAccount, else ~/.kube/config.")] = None,
        context: Annotated[str | None, typer.Option(show_default=False, help="kubeconfig context.")] = None,
        resync: Annotated[float, typer.Option(min=0.1, help="Seconds between node/pod cache refreshes.")] = 10.0,
        log_format: Annotated[str, typer.Option(help="Log lines as json or kv (logfmt).")] = "json",
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
        dcgm_endpoint: Annotated[list[str] | None, typer.Option(
            "--dcgm-endpoint", metavar="[NODE=]URL", show_default=False,
            help="dcgm-exporter /metrics URL (repeatable): GPUs with XID errors are treated as unhealthy.")] = None,
        prometheus_url: Annotated[str, typer.Option(
            help="Prometheus server holding the DCGM counters (alternative to --dcgm-endpoint).")] = "",
        telemetry_interval: Annotated[float, typer.Option(min=1.0, help="Seconds between telemetry polls.")] = 15.0,
        telemetry_max_age: Annotated[float, typer.Option(
            min=1.0, help="Seconds after which telemetry is ignored.")] = 60.0,
        load_weight: Annotated[float, typer.Option(
            min=0.0, max=1.0, help="Weight of GPU idleness (telemetry) in the node score, 0..1.")] = 0.0,
        share_enforcement: Annotated[str, typer.Option(
            "--share-enforcement",
            help="What enforces a GPU share (less than a whole GPU, or a memory cap) on the nodes: none (shares are "
                 "filtered out with the reason), hami (HAMi's device plugin: nodes it registered, with the "
                 "annotations it reads), trust (anywhere: you vouch for another mechanism).")] = "none",
    ) -> None:
        """Serve the kube-scheduler extender API (filter, prioritize, bind) for GPU pods.

        Configure kube-scheduler with an extender whose urlPrefix points here, with filterVerb filter,
        prioritizeVerb prioritize, bindVerb bind and nodeCacheCapable true (examples/k8s/extender/).
        Also serves /healthz, /readyz (node cache synced) and /metrics.
        """
        if policy not in REGISTRY:
            raise typer.BadParameter(f"unknown policy {policy!r}; known: {', '.join(REGISTRY)}",
                                     param_hint="--policy")
        if share_enforcement not in SHARE_ENFORCEMENT_MODES:
            raise typer.BadParameter(f"{share_enforcement!r}: expected {', '.join(SHARE_ENFORCEMENT_MODES)}",
                                     param_hint="--share-enforcement")
        if log_format not in ("json", "kv", "logfmt"):
            raise typer.BadParameter("expected json or kv", param_hint="--log-format")
        try:
            run_extender(host=host, port=port, url_prefix=url_prefix, policy=policy, kubeconfig=kubeconfig,
                         context=context, resync=resync, log_format=log_format, log_level=log_level,
                         dcgm_endpoints=list(dcgm_endpoint or []), prometheus_url=prometheus_url,
                         telemetry_interval=telemetry_interval, telemetry_max_age=telemetry_max_age,
                         load_weight=load_weight, share_enforcement=share_enforcement)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None


__all__ = ["load_api_client", "register", "run_extender"]
