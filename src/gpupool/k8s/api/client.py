"""Connecting to the API server: the client (:func:`load_api_client`), and the parsing of the settings that go
with it (durations, ``HOST:PORT``, :class:`ConfigError`); shared by every command that talks to Kubernetes.
Imports only :mod:`gpupool.k8s.api.wire` (and the kubernetes client, on use)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A configuration file gpupool cannot use (the message names the field)."""


def parse_duration(value: Any, where: str) -> float:
    """Seconds from a Go duration (``15s``, ``1m30s``, ``500ms``) or a plain number of seconds."""
    if isinstance(value, bool):
        raise ConfigError(f"{where}: {value!r} is not a duration")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        text = str(value).strip()
        parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ConfigError(f"{where}: {value!r} is not a duration like 15s, 1m30s or 500ms")
        scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
        seconds = sum(float(n) * scale[u] for n, u in parts)
    if seconds <= 0:
        raise ConfigError(f"{where}: {value!r} must be positive")
    return seconds


def load_api_client(kubeconfig: Path | None = None, context: str | None = None, writers: int = 8):
    """An ``ApiClient``: the given kubeconfig, else the in-cluster ServiceAccount, else ``~/.kube/config``.

    ``writers``: threads that send requests at once (the binders); the client keeps that many connections
    and more (:func:`gpupool.k8s.api.wire.configure`: connection pool, quiet urllib3 retries).
    Raises :class:`ConfigError` when none of them gives a usable configuration.
    """
    from kubernetes import client, config

    from gpupool.k8s.api.wire import configure

    if kubeconfig is None and context is None:
        cfg = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(configure(cfg, writers))
        except config.ConfigException:
            pass
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=str(kubeconfig) if kubeconfig else None, context=context,
                                client_configuration=cfg)
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "~/.kube/config (or $KUBECONFIG)"
        raise ConfigError(f"no usable Kubernetes configuration: not in a cluster, and {where}: {exc}") from None
    return client.ApiClient(configure(cfg, writers))


def host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    try:
        return host or "0.0.0.0", int(port)
    except ValueError:
        raise ConfigError(f"metrics bind address {address!r}: expected HOST:PORT") from None


__all__ = ["ConfigError", "parse_duration", "load_api_client", "host_port"]
