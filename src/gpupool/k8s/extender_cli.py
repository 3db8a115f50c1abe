"""``gpupool extender``: serve the kube-scheduler extender API (see :mod:`gpupool.k8s.extender`).

Registered on the ``gpupool`` CLI through ``gpupool.cli.EXTENSION_MODULES``.
"""

from __future__ import annotations

import ipaddress
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpupool.k8s import SHARE_ENFORCEMENT_MODES
from gpupool.k8s.api.client import ConfigError, load_api_client
from gpupool.k8s.scheduler_cli import warm_kernels
from gpupool.policies import DEFAULT_POLICY, REGISTRY

if TYPE_CHECKING:
    from gpupool.k8s.extender_http import ClientAuth, ServerLimits


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) listens on loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def server_security(*, host: str, token_file: Path | None, tls_cert_file: Path | None,
                    tls_private_key_file: Path | None, client_ca_file: Path | None, client_names: list[str],
                    allow_unauthenticated: bool) -> tuple[ClientAuth, ssl.SSLContext | None]:
    """Who may call the verbs and the server's TLS context, from the command line; ConfigError naming the
    option when they do not fit together or a file cannot be read."""
    from gpupool.k8s.extender_http import ClientAuth, TokenFile, server_tls

    if (tls_cert_file is None) != (tls_private_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-private-key-file go together")
    if client_ca_file is not None and tls_cert_file is None:
        raise ConfigError("--client-ca-file needs TLS: give --tls-cert-file and --tls-private-key-file")
    if client_names and client_ca_file is None:
        raise ConfigError("--client-name narrows --client-ca-file: give that too")
    try:
        token = TokenFile(token_file) if token_file is not None else None
        ctx = server_tls(tls_cert_file, tls_private_key_file, client_ca_file) if tls_cert_file is not None else None
    except (OSError, ValueError, ssl.SSLError) as exc:
        raise ConfigError(f"extender credentials: {exc}") from None
    auth = ClientAuth(token, client_certs=client_ca_file is not None, client_names=client_names)
    if not auth.required and not is_loopback(host) and not allow_unauthenticated:
        raise ConfigError(f"--host {host} is reachable from other pods and no authentication is set: give "
                          "--client-ca-file (TLS client certificates, what kube-scheduler's extenders[].tlsConfig "
                          "sends) or --token-file, listen on 127.0.0.1 (a sidecar of kube-scheduler), or pass "
                          "--allow-unauthenticated")
    return auth, ctx


def run_extender(*, host: str, port: int, url_prefix: str, policy: str, kubeconfig: Path | None,
                 context: str | None, resync: float, log_format: str, log_level: str,
                 dcgm_endpoints: list[str], prometheus_url: str, telemetry_interval: float,
                 telemetry_max_age: float, load_weight: float, auth: ClientAuth | None = None,
                 tls: ssl.SSLContext | None = None, limits: ServerLimits | None = None,
                 scheduler_names: list[str] | None = None, namespaces: list[str] | None = None,
                 share_enforcement: str = "none") -> None:
    import logging

    from aiohttp import web
    from kubernetes import client

    from gpupool.k8s.extender import DEFAULT_SCHEDULER_NAME, Extender, NodeCache
    from gpupool.k8s.extender_http import ServerLimits, make_app
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
    extender = Extender(cache, core, metrics=metrics, telemetry=telemetry, load_weight=load_weight,
                        scheduler_names=scheduler_names or [DEFAULT_SCHEDULER_NAME], namespaces=namespaces or None)
    limits = limits or ServerLimits()
    app = make_app(extender, url_prefix=url_prefix, metrics=metrics, auth=auth, limits=limits)
    log.info("extender serving", extra={
        "host": host, "port": port, "prefix": url_prefix or "/", "policy": policy, "tls": tls is not None,
        "client_certificates": bool(auth and auth.client_certs), "token": bool(auth and auth.token),
        "scheduler_names": sorted(extender.scheduler_names),
        "namespaces": sorted(extender.namespaces) if extender.namespaces is not None else "all"})
    if auth is None or not auth.required:
        log.warning("extender verbs unauthenticated", extra={"host": host})
    try:
        web.run_app(app, host=host, port=port, ssl_context=tls, print=None, access_log=None, handle_signals=True,
                    keepalive_timeout=limits.idle_timeout_s)
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
        scheduler_name: Annotated[list[str] | None, typer.Option(
            "--scheduler-name", show_default=False,
            help="spec.schedulerName of the pods this extender may bind: kube-scheduler's profile that calls it "
                 "(repeatable). Default: default-scheduler.")] = None,
        namespace: Annotated[list[str] | None, typer.Option(
            "--namespace", show_default=False,
            help="Bind only pods of these namespaces (repeatable). Default: every namespace.")] = None,
        tls_cert_file: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False, help="Serve HTTPS with this certificate (PEM).")] = None,
        tls_private_key_file: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False, help="The private key of --tls-cert-file (PEM).")] = None,
        client_ca_file: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="Verbs need a client certificate signed by this CA (kube-scheduler's extenders[].tlsConfig "
                 "certFile/keyFile).")] = None,
        client_name: Annotated[list[str] | None, typer.Option(
            "--client-name", show_default=False,
            help="Accept only client certificates with this subject CN or DNS name (repeatable).")] = None,
        token_file: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="Verbs accept 'Authorization: Bearer <token>' with the token in this file (a mounted Secret; "
                 "re-read when it changes).")] = None,
        allow_unauthenticated: Annotated[bool, typer.Option(
            help="Serve the verbs without authentication on a non-loopback address.")] = False,
        max_body_bytes: Annotated[int, typer.Option(
            min=1024, help="Largest request body (413 above). Raise it without nodeCacheCapable.")] = 4 << 20,
        read_timeout: Annotated[float, typer.Option(
            min=0.1, help="Seconds to receive a request body (408 after).")] = 10.0,
        idle_timeout: Annotated[float, typer.Option(
            min=1.0, help="Seconds before an idle connection, or one slow to send its headers, is closed.")] = 30.0,
    ) -> None:
        """Serve the kube-scheduler extender API (filter, prioritize, bind) for GPU pods.

        Configure kube-scheduler with an extender whose urlPrefix points here, with filterVerb filter,
        prioritizeVerb prioritize, bindVerb bind and nodeCacheCapable true (examples/k8s/extender/).
        On an address other pods reach, the verbs need authentication: TLS client certificates
        (--client-ca-file, what kube-scheduler's tlsConfig sends) or a bearer token (--token-file).
        Also serves /healthz, /readyz (node cache synced) and /metrics without authentication.
        """
        if policy not in REGISTRY:
            raise typer.BadParameter(f"unknown policy {policy!r}; known: {', '.join(REGISTRY)}",
                                     param_hint="--policy")
        if share_enforcement not in SHARE_ENFORCEMENT_MODES:
            raise typer.BadParameter(f"{share_enforcement!r}: expected {', '.join(SHARE_ENFORCEMENT_MODES)}",
                                     param_hint="--share-enforcement")
        if log_format not in ("json", "kv", "logfmt"):
            raise typer.BadParameter("expected json or kv", param_hint="--log-format")
        from gpupool.k8s.extender_http import ServerLimits

        try:
            auth, tls = server_security(host=host, token_file=token_file, tls_cert_file=tls_cert_file,
                                        tls_private_key_file=tls_private_key_file, client_ca_file=client_ca_file,
                                        client_names=list(client_name or []),
                                        allow_unauthenticated=allow_unauthenticated)
            run_extender(host=host, port=port, url_prefix=url_prefix, policy=policy, kubeconfig=kubeconfig,
                         context=context, resync=resync, log_format=log_format, log_level=log_level,
                         dcgm_endpoints=list(dcgm_endpoint or []), prometheus_url=prometheus_url,
                         telemetry_interval=telemetry_interval, telemetry_max_age=telemetry_max_age,
                         load_weight=load_weight, auth=auth, tls=tls,
                         limits=ServerLimits(max_body_bytes=max_body_bytes, read_timeout_s=read_timeout,
                                             idle_timeout_s=idle_timeout),
                         scheduler_names=list(scheduler_name or []), namespaces=list(namespace or []),
                         share_enforcement=share_enforcement)
        except ConfigError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None


__all__ = ["is_loopback", "load_api_client", "register", "run_extender", "server_security"]
