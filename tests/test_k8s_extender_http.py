"""The extender's HTTP front (issue 33 item 3): authentication (bearer token, TLS client certificates), body
size, nesting and read limits, idle connections, and the command line's refusal to serve unauthenticated on a
reachable address.

The server is the real aiohttp application on 127.0.0.1 (``aiohttp.test_utils.TestServer``, with the TLS
context and ``keepalive_timeout`` the CLI gives ``web.run_app``); abusive clients are raw sockets. The
certificates come from the ``openssl`` command line (skipped without it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gpupool.k8s.api.client import ConfigError
from gpupool.k8s.extender import Extender, NodeCache
from gpupool.k8s.extender_cli import is_loopback, server_security
from gpupool.k8s.extender_http import (
    ClientAuth,
    ServerLimits,
    TokenFile,
    json_depth,
    make_app,
    parse_json,
    server_tls,
)

H100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "q", "namespace": "default", "uid": "u", "annotations": {"gpu-fraction": "0.25"}},
       "spec": {"containers": [{"name": "c", "image": "x"}]}}
ARGS = {"Pod": POD, "Nodes": None, "NodeNames": ["gpu-a"]}


def _extender() -> Extender:
    cache = NodeCache(share_enforcement="trust")  # the pod asks a share; these tests are about the HTTP front
    cache.load([{"metadata": {"name": "gpu-a", "labels": H100},
                 "status": {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"},
                            "conditions": [{"type": "Ready", "status": "True"}]}}], [])
    return Extender(cache)


class Served:
    """The application on a free loopback port, optionally over TLS; ``url`` for clients."""

    def __init__(self, *, auth: ClientAuth | None = None, limits: ServerLimits | None = None,
                 tls: ssl.SSLContext | None = None) -> None:
        self.limits = limits or ServerLimits()
        self.tls = tls
        self.server = TestServer(make_app(_extender(), auth=auth, limits=self.limits), host="127.0.0.1")

    async def __aenter__(self) -> Served:
        await self.server.start_server(ssl=self.tls, keepalive_timeout=self.limits.idle_timeout_s)
        self.port = self.server.port
        self.url = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.close()


async def _post(url: str, body: bytes | dict, headers: dict | None = None,
                ssl_ctx: ssl.SSLContext | bool | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers or {}, ssl=ssl_ctx) as r:
        return r.status, await r.json(content_type=None)


# ------------------------------------------------------------------ limits
def test_json_depth_and_parse_refusals() -> None:
    assert json_depth({"a": [1, {"b": []}]}, 64) == 4 and json_depth(3, 64) == 0
    assert json_depth(json.loads("[" * 200 + "]" * 200), 64) == 65  # stops counting past the limit
    with pytest.raises(Exception) as info:
        parse_json(b"[" * 100 + b"]" * 100, 64)
    assert (info.value.status, info.value.message) == (400, "request body: JSON nested deeper than 64 levels")
    with pytest.raises(Exception) as info:  # deeper than Python's parser goes: RecursionError, was a 500
        parse_json(b"[" * 100_000 + b"]" * 100_000, 64)
    assert info.value.status == 400 and "nested deeper" in info.value.message
    with pytest.raises(Exception) as info:
        parse_json(b"\xff{", 64)
    assert info.value.status == 400 and info.value.message.startswith("request body is not JSON")
    with pytest.raises(ValueError, match="ServerLimits.max_body_bytes must be > 0"):
        ServerLimits(max_body_bytes=0)


@pytest.mark.asyncio
async def test_large_deep_and_slow_bodies_are_refused_and_good_requests_still_answer() -> None:
    limits = ServerLimits(max_body_bytes=64 << 10, read_timeout_s=0.5, idle_timeout_s=30)
    async with Served(limits=limits) as srv:
        url = f"{srv.url}/filter"
        status, body = await _post(url, ARGS)
        assert status == 200 and body["NodeNames"] == ["gpu-a"]
        # over the limit by Content-Length: 413 before the body is read
        status, body = await _post(url, b"x" * (1 << 20))
        assert status == 413 and body["error"] == "request body of 1048576 bytes is over the limit of 65536"

        # chunked, no Content-Length: 413 once the stream passes the limit (aiohttp's client_max_size)
        async def chunks():
            for _ in range(64):
                yield b" " * 8192

        async with aiohttp.ClientSession() as s, s.post(url, data=chunks()) as r:
            assert r.status == 413 and "over the limit of 65536 bytes" in (await r.json())["error"]
        # nested deeper than Python's JSON parser goes: 400, not 500
        status, body = await _post(url, b"[" * 30_000 + b"]" * 30_000)
        assert status == 400 and "nested deeper than 64" in body["error"]
        status, body = await _post(f"{srv.url}/bind", b"{not json")
        assert status == 400 and body["error"].startswith("request body is not JSON")
        # a body that never completes: 408 after read_timeout_s, the connection closed
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"Pod\": ")
        await writer.drain()
        t0 = time.monotonic()
        answer = await asyncio.wait_for(reader.read(), 30)  # to EOF: the server closes
        assert answer.startswith(b"HTTP/1.1 408") and b"not received within 0.5s" in answer, answer[:200]
        assert time.monotonic() - t0 < 25
        writer.close()
        # and the server still answers a good request
        status, body = await _post(url, ARGS)
        assert status == 200 and body["NodeNames"] == ["gpu-a"]


@pytest.mark.asyncio
async def test_idle_and_header_dribbling_connections_are_closed() -> None:
    """Issue 33: idle connections never timed out. A connection that sends nothing, and one that never finishes
    its headers, are closed after idle_timeout_s (aiohttp's keepalive_timeout, armed at connection start)."""
    async with Served(limits=ServerLimits(idle_timeout_s=1.0)) as srv:
        idle = await asyncio.open_connection("127.0.0.1", srv.port)
        partial = await asyncio.open_connection("127.0.0.1", srv.port)
        partial[1].write(b"POST /filter HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        await partial[1].drain()
        t0 = time.monotonic()
        for reader, writer in (idle, partial):
            assert await asyncio.wait_for(reader.read(), 30) == b""  # EOF: closed by the server
            writer.close()
        assert time.monotonic() - t0 < 25


# ------------------------------------------------------------------ bearer token
@pytest.mark.asyncio
async def test_bearer_token_from_a_file_guards_the_verbs_and_follows_rotation(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    async with Served(auth=ClientAuth(TokenFile(token_file))) as srv:
        for verb in ("filter", "prioritize", "bind"):
            status, body = await _post(f"{srv.url}/{verb}", ARGS)
            assert (status, body) == (401, {"error": "authentication required: a bearer token"}), verb
        status, _ = await _post(f"{srv.url}/filter", ARGS, {"Authorization": "Bearer wrong"})
        assert status == 401
        status, _ = await _post(f"{srv.url}/filter", ARGS, {"Authorization": "Basic s3cret"})
        assert status == 401
        status, body = await _post(f"{srv.url}/filter", ARGS, {"Authorization": "Bearer s3cret"})
        assert status == 200 and body["NodeNames"] == ["gpu-a"]
        # 401 before the body is read: a large body from an unauthenticated caller costs nothing
        status, _ = await _post(f"{srv.url}/filter", b"x" * (8 << 20))
        assert status == 401
        async with aiohttp.ClientSession() as s:
            for path in ("/healthz", "/readyz", "/metrics"):  # probes and scrapes need no token
                async with s.get(f"{srv.url}{path}") as r:
                    assert r.status in (200, 404), path  # /metrics: 404 without a registry here
        # the Secret is rotated: the file changes, the next request sees the new token
        token_file.write_text("n3w-token-longer\n")
        status, _ = await _post(f"{srv.url}/filter", ARGS, {"Authorization": "Bearer s3cret"})
        assert status == 401
        status, _ = await _post(f"{srv.url}/filter", ARGS, {"Authorization": "Bearer n3w-token-longer"})
        assert status == 200


def test_an_empty_or_missing_token_file_is_refused_at_start(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        TokenFile(tmp_path / "empty")
    with pytest.raises(OSError):
        TokenFile(tmp_path / "missing")


# ------------------------------------------------------------------ TLS client certificates
def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not on PATH (makes the test certificates)")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "server-ca")
    _ca(d, "client-ca")
    _ca(d, "other-ca")
    _leaf(d, "extender", "server-ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    _leaf(d, "kube-scheduler", "client-ca", "extendedKeyUsage=clientAuth\n")
    _leaf(d, "somebody", "client-ca", "extendedKeyUsage=clientAuth\n")
    _leaf(d, "intruder", "other-ca", "extendedKeyUsage=clientAuth\n")
    return d


def _client(pki: Path, who: str | None) -> ssl.SSLContext:
    """What kube-scheduler's extenders[].tlsConfig makes: caFile to check the server, certFile/keyFile."""
    ctx = ssl.create_default_context(cafile=str(pki / "server-ca.crt"))
    if who:
        ctx.load_cert_chain(str(pki / f"{who}.crt"), str(pki / f"{who}.key"))
    return ctx


@pytest.mark.asyncio
async def test_tls_client_certificates_as_kube_scheduler_sends_them(pki: Path) -> None:
    tls = server_tls(pki / "extender.crt", pki / "extender.key", pki / "client-ca.crt")
    auth = ClientAuth(client_certs=True, client_names=["kube-scheduler"])
    async with Served(auth=auth, tls=tls) as srv:
        status, body = await _post(f"{srv.url}/filter", ARGS, ssl_ctx=_client(pki, "kube-scheduler"))
        assert status == 200 and body["NodeNames"] == ["gpu-a"]
        # no certificate: the handshake completes (kubelet probes), the verbs answer 401
        status, body = await _post(f"{srv.url}/filter", ARGS, ssl_ctx=_client(pki, None))
        assert (status, body) == (401, {"error": "authentication required: a client certificate"})
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/healthz", ssl=_client(pki, None)) as r:
            assert r.status == 200
        # signed by the client CA but not a listed name
        status, body = await _post(f"{srv.url}/bind", {"PodName": "q", "Node": "gpu-a"},
                                   ssl_ctx=_client(pki, "somebody"))
        assert status == 401 and "['somebody'] is not one of the allowed clients (kube-scheduler)" in body["error"]
        # a certificate of another CA: the handshake fails
        with pytest.raises(aiohttp.ClientError):
            await _post(f"{srv.url}/filter", ARGS, ssl_ctx=_client(pki, "intruder"))
        # plain HTTP to the TLS port: no answer to a verb
        with pytest.raises(aiohttp.ClientError):
            await _post(f"http://127.0.0.1:{srv.port}/filter", ARGS)


# ------------------------------------------------------------------ the command line
def test_cli_refuses_to_serve_unauthenticated_on_a_reachable_address(pki: Path, tmp_path: Path) -> None:
    common = {"token_file": None, "tls_cert_file": None, "tls_private_key_file": None, "client_ca_file": None,
              "client_names": [], "allow_unauthenticated": False}
    with pytest.raises(ConfigError, match="--host 0.0.0.0 is reachable from other pods and no authentication"):
        server_security(host="0.0.0.0", **common)
    auth, tls = server_security(host="127.0.0.1", **common)  # a sidecar of kube-scheduler
    assert not auth.required and tls is None
    auth, _ = server_security(host="0.0.0.0", **common | {"allow_unauthenticated": True})
    assert not auth.required
    token = tmp_path / "token"
    token.write_text("t")
    auth, _ = server_security(host="0.0.0.0", **common | {"token_file": token})
    assert auth.token is not None
    tls_files = {"tls_cert_file": pki / "extender.crt", "tls_private_key_file": pki / "extender.key"}
    auth, tls = server_security(host="0.0.0.0", **common | tls_files | {"client_ca_file": pki / "client-ca.crt",
                                                                        "client_names": ["kube-scheduler"]})
    assert auth.client_certs and tls is not None and tls.verify_mode == ssl.CERT_OPTIONAL
    with pytest.raises(ConfigError, match="--client-ca-file needs TLS"):
        server_security(host="0.0.0.0", **common | {"client_ca_file": pki / "client-ca.crt"})
    with pytest.raises(ConfigError, match="go together"):
        server_security(host="0.0.0.0", **common | {"tls_cert_file": pki / "extender.crt"})
    with pytest.raises(ConfigError, match="--client-name narrows --client-ca-file"):
        server_security(host="0.0.0.0", **common | {"client_names": ["x"]})
    with pytest.raises(ConfigError, match="extender credentials"):
        server_security(host="0.0.0.0", **common | {"token_file": tmp_path / "missing"})
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("10.0.0.1") and not is_loopback("gpupool")
