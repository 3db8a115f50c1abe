"""The kube-scheduler extender's HTTP server: its routes, who may call the verbs, and what a caller may send.

Routes: ``POST {prefix}/filter|prioritize|bind`` (:class:`gpupool.k8s.extender.Extender`), ``GET /healthz``,
``/readyz`` (node cache synced) and ``/metrics``.

**Who may call the verbs.** ``/healthz``, ``/readyz`` and ``/metrics`` stay open (kubelet probes send no
credentials; the NetworkPolicy next to the extender's manifests limits who reaches the port at all). The three
verbs need one of:

* a TLS client certificate signed by ``client_ca_file``: what kube-scheduler can present
  (``KubeSchedulerConfiguration.extenders[].tlsConfig.certFile`` / ``keyFile``, or ``certData`` / ``keyData``,
  with ``enableHTTPS: true``). The server asks for a certificate without requiring one
  (``ssl.CERT_OPTIONAL``), so probes still complete the handshake; a certificate that does not verify fails
  the handshake, and a verb called without one answers 401. ``client_names`` narrows it to certificates whose
  subject CN or a DNS subjectAltName is listed (a CA that signs other clients too).
* ``Authorization: Bearer <token>`` matching the token file (a mounted Secret; re-read when the file changes,
  so a rotated Secret takes effect without a restart). kube-scheduler's ``ExtenderTLSConfig`` has no token
  field (only insecure, serverName, cert/key/CA files and data), so the token is for other callers: a proxy in
  front of the extender, or a scheduler of one's own that sets the header.

**What a caller may send** (:class:`ServerLimits`): a body over ``max_body_bytes`` answers 413 before it is
read (its Content-Length) or as soon as a chunked stream passes the limit (aiohttp's ``client_max_size``);
a body not complete within ``read_timeout_s`` answers 408; a body that is not JSON, or JSON nested deeper
than ``max_json_depth``, answers 400 (it used to be a 500); parsing and the verbs run in worker threads, never
on the event loop, so one large request does not hold up the others. Idle connections, and connections that
never finish their request headers, are closed after ``idle_timeout_s`` (aiohttp's ``keepalive_timeout``,
which aiohttp >= 3.10 also arms when a connection opens).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpupool.k8s.extender import Extender
from gpupool.k8s.metrics import SchedulerMetrics

log = logging.getLogger("gpupool.k8s.extender")


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one request may cost the server.

    ``max_body_bytes``: the largest request body. With ``nodeCacheCapable: true`` kube-scheduler sends the pod
    and node names (a pod is at most ~1.5 MiB, etcd's request limit; 5,000 names ~100 KiB), so 4 MiB holds
    every real request; without it each request carries whole Node objects: raise it (~10-20 KiB a node).
    ``max_json_depth``: the deepest nesting of objects and arrays (a Pod nests ~12 deep).
    ``read_timeout_s``: seconds to receive a whole body once its headers arrived. ``idle_timeout_s``: seconds
    a connection may stay idle, or take to send its request headers, before it is closed.
    """

    max_body_bytes: int = 4 << 20
    max_json_depth: int = 64
    read_timeout_s: float = 10.0
    idle_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_json_depth", "read_timeout_s", "idle_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"ServerLimits.{name} must be > 0, got {getattr(self, name)!r}")


class RequestRefused(Exception):
    """A request answered with ``status`` and a JSON ``{"error": message}`` body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_depth(value: Any, limit: int) -> int:
    """The nesting depth of ``value`` (objects and arrays; a scalar is 0), counted without recursion and
    stopping at ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return deepest


def parse_json(body: bytes, max_depth: int) -> Any:
    """``body`` as JSON; :class:`RequestRefused` (400) when it is not JSON or nests deeper than ``max_depth``."""
    try:
        value = json.loads(body)
    except RecursionError:
        raise RequestRefused(400, f"request body: JSON nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RequestRefused(400, f"request body is not JSON: {str(exc)[:120]}") from None
    if json_depth(value, max_depth) > max_depth:
        raise RequestRefused(400, f"request body: JSON nested deeper than {max_depth} levels")
    return value


class TokenFile:
    """A bearer token kept in a file (a mounted Secret), re-read when the file's size or mtime changes.

    Raises OSError / ValueError naming the file when it cannot be read or is empty at start; a later failed
    re-read keeps the last token and logs once.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._stamp: tuple[int, int] | None = None
        self._token = b""
        self._reload(initial=True)

    def _reload(self, initial: bool = False) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp == self._stamp:
                return
            token = self.path.read_bytes().strip()
            if not token:
                raise ValueError(f"{self.path}: the token file is empty")
        except (OSError, ValueError) as exc:
            if initial:
                raise
            if self._stamp is not None:
                log.warning("extender token file unreadable; keeping the last token",
                            extra={"file": str(self.path), "error": str(exc)})
                self._stamp = None  # log once, retry on the next request
            return
        self._token, self._stamp = token, stamp

    def matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries this token (``Bearer <token>``; compared in constant time)."""
        if not authorization:
            return False
        scheme, _, given = authorization.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return False
        self._reload()
        return hmac.compare_digest(given.strip().encode(), self._token)


class ClientAuth:
    """Who may call the verbs: a verified client certificate (``client_certs``, optionally one of
    ``client_names``) or the bearer token of ``token``. Neither configured: everyone (the CLI allows that only
    on a loopback address or with ``--allow-unauthenticated``)."""

    def __init__(self, token: TokenFile | None = None, client_certs: bool = False,
                 client_names: Iterable[str] = ()) -> None:
        self.token = token
        self.client_certs = client_certs
        self.client_names = frozenset(client_names)

    @property
    def required(self) -> bool:
        return self.token is not None or self.client_certs

    def refusal(self, request: web.BaseRequest) -> str | None:
        """None when ``request`` may call a verb, else why not (the 401's message)."""
        if not self.required:
            return None
        if self.client_certs:
            cert = request.transport.get_extra_info("peercert") if request.transport is not None else None
            if cert:
                names = _cert_names(cert)
                if not self.client_names or names & self.client_names:
                    return None
                return (f"client certificate {sorted(names)} is not one of the allowed clients "
                        f"({', '.join(sorted(self.client_names))})")
        if self.token is not None and self.token.matches(request.headers.get("Authorization")):
            return None
        wanted = " or ".join(w for w, on in (("a client certificate", self.client_certs),
                                             ("a bearer token", self.token is not None)) if on)
        return f"authentication required: {wanted}"


def _cert_names(cert: Mapping[str, Any]) -> set[str]:
    """Subject CN and DNS subjectAltNames of a certificate as ``ssl.SSLSocket.getpeercert()`` returns it."""
    names = {value for rdn in cert.get("subject") or () for key, value in rdn if key == "commonName"}
    names |= {value for kind, value in cert.get("subjectAltName") or () if kind == "DNS"}
    return names


def server_tls(cert_file: Path | str, key_file: Path | str, client_ca_file: Path | str | None = None) -> ssl.SSLContext:
    """A server TLS context (TLS >= 1.2) with ``cert_file`` / ``key_file``; with ``client_ca_file``, client
    certificates are asked for and verified against it (``CERT_OPTIONAL``: see the module doc).
    Raises OSError / ssl.SSLError naming what could not be loaded."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(str(cert_file), str(key_file))
    if client_ca_file is not None:
        ctx.load_verify_locations(cafile=str(client_ca_file))
        ctx.verify_mode = ssl.CERT_OPTIONAL
    return ctx


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(extender: Extender, url_prefix: str = "", metrics: SchedulerMetrics | None = None, *,
             auth: ClientAuth | None = None, limits: ServerLimits | None = None) -> web.Application:
    """The aiohttp application: ``POST {prefix}/filter|prioritize|bind`` behind ``auth`` and ``limits``,
    ``GET /healthz|/readyz|/metrics`` open. Run it with ``keepalive_timeout=limits.idle_timeout_s``."""
    prefix = "/" + url_prefix.strip("/") if url_prefix.strip("/") else ""
    auth = auth or ClientAuth()
    limits = limits or ServerLimits()

    async def read_args(request: web.Request) -> Any:
        size = request.content_length
        if size is not None and size > limits.max_body_bytes:
            raise RequestRefused(413, f"request body of {size} bytes is over the limit of {limits.max_body_bytes}")
        try:
            async with asyncio.timeout(limits.read_timeout_s):
                body = await request.read()
        except TimeoutError:
            raise RequestRefused(408, f"request body not received within {limits.read_timeout_s:g}s") from None
        except web.HTTPRequestEntityTooLarge:
            raise RequestRefused(413, f"request body is over the limit of {limits.max_body_bytes} bytes") from None
        except ConnectionError:  # the client went away mid-body: nobody to answer, nothing to log as an error
            raise RequestRefused(400, "connection lost while the request body was read") from None
        return await asyncio.get_running_loop().run_in_executor(None, parse_json, body, limits.max_json_depth)

    def verb(call: Callable[[Mapping[str, Any]], Any], what: str) -> Handler:
        async def handle(request: web.Request) -> web.StreamResponse:
            try:
                why = auth.refusal(request)
                if why is not None:
                    raise RequestRefused(401, why)
                args = await read_args(request)
                if not isinstance(args, Mapping):
                    raise RequestRefused(400, f"request body is not {what} (a JSON object)")
                result = await asyncio.get_running_loop().run_in_executor(None, call, args)
            except RequestRefused as exc:
                log.info("extender request refused", extra={"path": request.path, "status": exc.status,
                                                            "error": exc.message, "peer": request.remote})
                resp = web.json_response({"error": exc.message}, status=exc.status)
                if exc.status == 401 and auth.token is not None:
                    resp.headers["WWW-Authenticate"] = 'Bearer realm="gpupool-extender"'
                if exc.status in (408, 413):
                    resp.force_close()  # the rest of the body is not waited for
                return resp
            except ValueError as exc:  # Nodes / NodeNames malformed (the verb names the field)
                return web.json_response({"error": str(exc)}, status=400)
            return web.json_response(result)

        return handle

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        if extender.cache.ready:
            return web.Response(text="ok\n")
        return web.Response(text="node cache not synced\n", status=503)

    async def metrics_(request: web.Request) -> web.Response:
        if metrics is None:
            return web.Response(status=404, text="metrics disabled\n")
        return web.Response(body=generate_latest(metrics.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=limits.max_body_bytes)
    app.router.add_post(f"{prefix}/filter", verb(extender.filter, "ExtenderArgs"))
    app.router.add_post(f"{prefix}/prioritize", verb(extender.prioritize, "ExtenderArgs"))
    app.router.add_post(f"{prefix}/bind", verb(extender.bind, "ExtenderBindingArgs"))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_)
    return app


__all__ = ["ClientAuth", "RequestRefused", "ServerLimits", "TokenFile", "json_depth", "make_app", "parse_json",
           "server_tls"]
