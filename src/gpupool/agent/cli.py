"""``gpupool agent``: the node agent (one per GPU node, deploy/agent/'s DaemonSet runs it).

    gpupool agent [--node-name NAME] [--backend nvml|fake --fake-file FILE] [--interval 10s]
                  [--metrics-bind-address 0.0.0.0:9400] [--mig-strategy mixed] [--kubeconfig FILE]
    gpupool agent --once            # publish one report on the Node and exit
    gpupool agent --dry-run         # print the report as JSON; no API server needed, nothing written

Exit codes: 0 success (or stopped by SIGTERM / SIGINT); 1 ``--once`` could not publish; 2 bad usage (a flag
value such as an ``--interval`` under 1 s, a missing node name, an unreadable or invalid fake file: the
message names the file and the field, no usable kubeconfig); 3 the GPU driver cannot be read
(``--backend nvml``: NVML not loadable, no driver, no GPU; the message says what to check).

Registered on the ``gpupool`` CLI through ``gpupool.cli.EXTENSION_MODULES``.
"""

from __future__ import annotations

import functools
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from gpupool.inputs import did_you_mean

__all__ = ["register", "build_backend", "build_agent", "DRIVER_HINT"]

log = logging.getLogger("gpupool.agent")

MIG_STRATEGIES = ("none", "single", "mixed")
BACKENDS = ("nvml", "fake")
MIN_INTERVAL_S = 1.0
"""Shortest ``--interval``: every round GETs the Node, so a shorter one only loads the API server (XID, ECC
and reset events start a round at once whatever the interval)."""
MAX_INTERVAL_S = 86400.0
"""Longest ``--interval`` (a day): condition heartbeats and liveness need rounds."""
DRIVER_HINT = ("check that the NVIDIA driver is loaded (`nvidia-smi` works on the node), that libnvidia-ml.so.1 "
               "is visible to this process (in a pod: runtimeClassName nvidia, or the nvidia runtime with "
               "NVIDIA_VISIBLE_DEVICES=all and NVIDIA_DRIVER_CAPABILITIES including utility), and that the "
               "nvidia-ml-py package is installed")


class UsageError(ValueError):
    """Bad usage: exit code 2."""


class DriverError(RuntimeError):
    """The driver cannot be read: exit code 3."""


def build_backend(kind: str, fake_file: Path | None) -> Any:
    """The :class:`~gpupool.agent.backend.GpuBackend` for ``--backend``; raises :class:`UsageError` (bad flag,
    unreadable fake file) or :class:`DriverError` (NVML cannot be loaded or answers no driver)."""
    from gpupool.agent.backend import BackendError

    if kind == "fake":
        if fake_file is None:
            raise UsageError("--backend fake needs --fake-file FILE (a YAML/JSON description, or an NVML "
                             "recording such as ../shared/reference/nvml-h200/nvml.json)")
        from gpupool.agent.fake import FakeBackend

        if not fake_file.is_file():
            raise UsageError(f"{fake_file}: {'not a regular file' if fake_file.exists() else 'no such file'}")
        try:
            return FakeBackend.from_file(fake_file)  # a description, or an NVML recording (nvml.json)
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError,
                RecursionError, BackendError) as exc:  # FakeBackend raises ValueError; the rest: a safety net
            message = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
            prefix = f"{fake_file}: not a fake GPU description"  # unless the message names the file already
            raise UsageError(message if message.startswith(str(fake_file)) else f"{prefix}: {message}") from None
    if kind == "nvml":
        try:
            from gpupool.agent.nvml import NvmlBackend

            backend = NvmlBackend()
            backend.driver()
            return backend
        except (ImportError, BackendError, OSError) as exc:
            raise DriverError(f"NVML is not available: {exc}; {DRIVER_HINT}") from None
    raise UsageError(f"backend {kind!r}: expected nvml or fake")


def _exporter() -> Any:
    """A :class:`~gpupool.agent.exporter.GpuExporter` (None when the exporter is not part of this build)."""
    try:
        from gpupool.agent.exporter import AgentExporter
    except ImportError:
        return None
    return AgentExporter()


def _validator(host_root: str) -> Any:
    try:
        from gpupool.agent.validate import validate_stack
    except ImportError:
        return None
    return functools.partial(validate_stack, host_root=host_root)


def _tracker() -> Any:
    from gpupool.agent.health import HealthTracker

    return HealthTracker()


def build_agent(backend: Any, publisher: Any, interval_s: float, mig_strategy: str, exporter: Any = None,
                host_root: str = "/", pod_resources_socket: str = "") -> Any:
    """The :class:`~gpupool.agent.run.Agent` with the real discovery, health, validation and metrics parts, and
    the kubelet's PodResources read on ``pod_resources_socket`` ("" = not read)."""
    from gpupool.agent.run import Agent

    reader = None
    if pod_resources_socket:
        from gpupool.agent.podresources import PodResourcesReader

        reader = PodResourcesReader(pod_resources_socket)
    return Agent(backend, publisher, _tracker(), _validator(host_root), exporter, interval_s,
                 mig_strategy=mig_strategy, pod_resources=reader)


def _one_round(agent: Any, gpus: Any) -> Any:
    """One round of ``agent`` (discovery on the first), the backend closed after it; exit 3 without a driver."""
    from gpupool.agent.backend import BackendError

    try:
        return agent.round()
    except BackendError as exc:
        _fail(f"discovery failed: {exc}; {DRIVER_HINT}", 3)
    finally:
        gpus.close()


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _one_of(option: str, choices: tuple[str, ...]) -> Callable[[str], str]:
    """A Typer callback that refuses a value not in ``choices`` at once, before any check that depends on the
    option (``--backend fak`` is a typo, not a fake backend without ``--fake-file``)."""

    def check(value: str) -> str:
        if value not in choices:
            _fail(f"{option}: {value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices, known=False)}")
        return value

    return check


def register(app: typer.Typer) -> None:
    """Add the ``agent`` command to ``app``."""

    @app.command("agent")
    def agent_cmd(
        node_name: Annotated[str | None, typer.Option(
            "--node-name", envvar="NODE_NAME", show_default=False,
            help="The Node this agent publishes on. Default: $NODE_NAME (the DaemonSet sets it from "
                 "spec.nodeName). Not needed with --dry-run.")] = None,
        backend: Annotated[str, typer.Option(
            callback=_one_of("--backend", BACKENDS),
            help="nvml (the GPUs of this machine) or fake (a description file, --fake-file).")] = "nvml",
        fake_file: Annotated[Path | None, typer.Option(
            "--fake-file", metavar="FILE", dir_okay=False, show_default=False,
            help="With --backend fake: a YAML/JSON GPU description or an NVML recording (nvml.json).")] = None,
        interval: Annotated[str, typer.Option(
            metavar="DURATION", help="Time between rounds (10s, 1m; at least 1s). Driver events (XID, ECC, reset) "
                                     "are published at once, between rounds.")] = "10s",
        metrics_bind_address: Annotated[str, typer.Option(
            "--metrics-bind-address", metavar="HOST:PORT",
            help="Serve Prometheus /metrics here (DCGM exporter names); 0 = off.")] = "0.0.0.0:9400",
        mig_strategy: Annotated[str, typer.Option(
            "--mig-strategy", callback=_one_of("--mig-strategy", MIG_STRATEGIES),
            help="MIG label strategy as GPU Feature Discovery has it: none, single or mixed.")] = "mixed",
        kubeconfig: Annotated[Path | None, typer.Option(
            dir_okay=False, show_default=False,
            help="kubeconfig file. Default: in-cluster ServiceAccount, else ~/.kube/config.")] = None,
        once: Annotated[bool, typer.Option(
            "--once", help="Publish one report on the Node and exit (1 when it could not be written).")] = False,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", help="Discover, check health and the stack, print the report as JSON; contact no "
                              "API server, write nothing.")] = False,
        host_root: Annotated[str, typer.Option(
            "--host-root", metavar="DIR",
            help="Where the host's filesystem (its container runtime configuration) is mounted: the "
                 "DaemonSet mounts /etc/containerd, /etc/crio, /etc/docker under /host.")] = "/",
        pod_resources_socket: Annotated[str, typer.Option(
            "--pod-resources-socket", metavar="PATH",
            help="The kubelet's PodResources gRPC socket: which GPUs the kubelet gave each pod, published as "
                 "the gpupool.io/pod-devices annotation. \"\" turns it off.")
        ] = "/var/lib/kubelet/pod-resources/kubelet.sock",
        log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    ) -> None:
        """Node agent: GPU discovery, health and stack validation from NVML, published on this node's Node
        object (GPU Feature Discovery labels, the gpupool.io/gpu-inventory annotation, conditions GpuHealthy
        and GpuStackReady) and as Prometheus metrics.

        Exit codes: 0 done; 1 --once could not publish; 2 bad usage; 3 the GPU driver cannot be read.
        """
        from gpupool.k8s.api.client import ConfigError, parse_duration

        level = getattr(logging, log_level.upper(), None)
        if not isinstance(level, int):
            _fail(f"log level {log_level!r}: expected debug, info, warning or error")
        logging.basicConfig(level=level, stream=sys.stderr,
                            format="%(asctime)s %(levelname)s %(name)s %(message)s")
        try:
            interval_s = parse_duration(interval, "--interval")
        except ConfigError as exc:
            _fail(str(exc))
        if not MIN_INTERVAL_S <= interval_s <= MAX_INTERVAL_S:
            _fail(f"--interval {interval}: must be between {MIN_INTERVAL_S:g}s and {MAX_INTERVAL_S / 3600:g}h "
                  "(each round reads the Node from the API server; driver events are published at once "
                  "anyway)")
        if mig_strategy not in MIG_STRATEGIES:
            _fail(f"MIG strategy {mig_strategy!r}: expected none, single or mixed")
        if once and dry_run:
            _fail("--once and --dry-run: choose one")
        if not dry_run and not node_name:
            _fail("no node name: pass --node-name or set $NODE_NAME (the DaemonSet sets it from spec.nodeName)")
        if fake_file is not None and backend != "fake":
            _fail("--fake-file goes with --backend fake")
        try:
            gpus = build_backend(backend, fake_file)
        except UsageError as exc:
            _fail(str(exc))
        except DriverError as exc:
            _fail(str(exc), 3)

        from gpupool.agent.backend import BackendError
        from gpupool.agent.run import report_json

        if dry_run:
            agent = build_agent(gpus, None, interval_s, mig_strategy, host_root=host_root,
                                pod_resources_socket=pod_resources_socket)
            report = _one_round(agent, gpus)
            typer.echo(json.dumps(report_json(report), indent=2, sort_keys=False))
            return

        from gpupool.agent.publisher import NodePublisher
        from gpupool.k8s.api.client import load_api_client

        try:
            api = load_api_client(kubeconfig, None, writers=2)
        except ConfigError as exc:
            _fail(str(exc))
        stopping = threading.Event()  # a publish backing off between retries ends at once on SIGTERM
        publisher = NodePublisher(api, str(node_name), sleep=stopping.wait)
        address = None
        if not once and metrics_bind_address not in ("", "0"):
            from gpupool.k8s.api.client import host_port

            try:
                address = host_port(metrics_bind_address)
            except ConfigError as exc:
                _fail(str(exc))
        exporter = _exporter() if address else None
        agent = build_agent(gpus, publisher, interval_s, mig_strategy, exporter, host_root=host_root,
                            pod_resources_socket=pod_resources_socket)
        if once:
            report = _one_round(agent, gpus)
            ok = publisher.failures == 0
            typer.echo(json.dumps({"node": node_name, "written": agent.published > 0, "ok": ok,
                                   "error": publisher.last_error or None,
                                   "conditions": report_json(report)["conditions"]}))
            if not ok:
                raise typer.Exit(1)
            return
        server = None
        if exporter is not None and address is not None:
            try:
                server = exporter.serve(address[0], address[1], liveness=agent.alive)
            except OSError as exc:
                _fail(f"metrics bind address {metrics_bind_address}: {exc}")
            log.info("metrics on http://%s:%d/metrics", address[0], getattr(server, "port", address[1]))
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: (stopping.set(), agent.stop()))
        log.info("agent for node %s: backend %s, every %gs", node_name, backend, interval_s)
        try:
            agent.run()
        except BackendError as exc:
            _fail(f"discovery failed: {exc}; {DRIVER_HINT}", 3)
        finally:
            if server is not None:
                server.stop()
        log.info("agent stopped after %d rounds (%d published)", agent.rounds, agent.published)

