"""Good-request latency of the extender while other clients abuse it (issue 33 item 3).

The extender's HTTP application (``gpupool.k8s.extender_http.make_app``, token authentication, default
limits, ``keepalive_timeout`` as the CLI sets it) runs in a subprocess on 127.0.0.1 with a node cache of 200
H100 nodes. This process sends one good ``filter`` request (a fractional-GPU pod, 200 node names) every 5 ms
and records its latency, first alone, then while abusers run:

* ``unauth-56MB``: 4 clients POST 56 MB bodies without a token (401 before the body is read);
* ``oversize-56MB``: 4 clients with the token POST 56 MB bodies (413 by Content-Length, before it is read);
* ``chunked-10MB``: 4 clients with the token stream 10 MB without Content-Length (413 once past 4 MiB);
* ``deep-json``: 4 clients with the token POST 60 KB of nested brackets (400);
* ``idle-500``: 500 connections opened and left idle (closed by the server after the idle timeout).

Usage: ``python benchmarks/extender_abuse.py [--seconds 5] [--json OUT]``; prints p50 / p99 / max per case.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

TOKEN = "bench-token"
SERVER = """
import sys
from aiohttp import web
from gpupool.k8s.extender import Extender, NodeCache
from gpupool.k8s.extender_http import ClientAuth, ServerLimits, TokenFile, make_app
labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
alloc = {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi", "pods": "110"}
nodes = [{"metadata": {"name": f"gpu-{i}", "labels": labels},
          "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}} for i in range(200)]
cache = NodeCache()
cache.load(nodes, [])
limits = ServerLimits()
app = make_app(Extender(cache), auth=ClientAuth(TokenFile(sys.argv[2])), limits=limits)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None,
            keepalive_timeout=limits.idle_timeout_s)
"""
POD = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "q", "namespace": "default", "uid": "u", "annotations": {"gpu-fraction": "0.25"}},
       "spec": {"containers": [{"name": "c", "image": "x"}]}}
GOOD = json.dumps({"Pod": POD, "Nodes": None, "NodeNames": [f"gpu-{i}" for i in range(200)]}).encode()
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _raw_post(port: int, headers: str, body_iter) -> None:
    """One abusive request over a raw socket; whatever the server answers, the connection is dropped."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(headers.encode())
        async for chunk in body_iter:
            writer.write(chunk)
            await writer.drain()
        await asyncio.wait_for(reader.read(200), 10)
        writer.close()
    except (OSError, TimeoutError):
        pass


def _abuser(kind: str, port: int):
    mb56 = 56 << 20

    async def big(n: int, chunk: int = 1 << 20):
        left = n
        while left > 0:
            yield b"x" * min(chunk, left)
            left -= chunk

    async def deep():
        yield b"[" * 30_000 + b"]" * 30_000

    async def once() -> None:
        if kind == "unauth-56MB":
            await _raw_post(port, f"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Length: {mb56}\r\n\r\n", big(mb56))
        elif kind == "oversize-56MB":
            await _raw_post(port, f"POST /filter HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  f"Content-Length: {mb56}\r\n\r\n", big(mb56))
        elif kind == "chunked-10MB":
            async def chunked():
                async for part in big(10 << 20, 64 << 10):
                    yield f"{len(part):x}\r\n".encode() + part + b"\r\n"
                yield b"0\r\n\r\n"
            await _raw_post(port, f"POST /filter HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  "Transfer-Encoding: chunked\r\n\r\n", chunked())
        elif kind == "deep-json":
            await _raw_post(port, f"POST /filter HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                                  f"Content-Length: 60000\r\n\r\n", deep())

    return once


async def abuse(kind: str, port: int) -> None:
    """Run 4 abusers of ``kind`` (or hold 500 idle connections) until killed: the ``--abuse`` subprocess, so
    that the abusers' own work does not slow the measuring client."""
    if kind == "idle-500":
        conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(500)]
        print("ready", flush=True)
        await asyncio.Event().wait()
        del conns
    once = _abuser(kind, port)

    async def loop() -> None:
        while True:
            await once()

    print("ready", flush=True)
    await asyncio.gather(*(loop() for _ in range(4)))


async def _measure(port: int, seconds: float, kind: str | None) -> list[float]:
    abuser = None
    if kind is not None:
        abuser = subprocess.Popen([sys.executable, __file__, "--abuse", kind, "--port", str(port)],
                                  stdout=subprocess.PIPE, text=True)
        assert abuser.stdout is not None
        await asyncio.to_thread(abuser.stdout.readline)  # "ready"
    latencies: list[float] = []
    async with aiohttp.ClientSession(headers=AUTH) as session:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.perf_counter()
            async with session.post(f"http://127.0.0.1:{port}/filter", data=GOOD) as r:
                body = await r.json()
                assert r.status == 200 and body["Error"] == "", body
            latencies.append((time.perf_counter() - t0) * 1000)
            await asyncio.sleep(0.005)
    if abuser is not None:
        abuser.kill()
        abuser.wait(10)
    return latencies


async def main(seconds: float, out: Path | None) -> None:
    port = _free_port()
    token_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"extender-bench-token-{os.getpid()}"
    token_file.write_text(TOKEN)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), str(token_file)], env=env)
    try:
        async with aiohttp.ClientSession() as s:
            deadline = time.monotonic() + 120
            while True:
                try:
                    async with s.get(f"http://127.0.0.1:{port}/readyz") as r:
                        if r.status == 200:
                            break
                except aiohttp.ClientError:
                    pass
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise SystemExit("the extender did not start")
                await asyncio.sleep(0.1)
        results = {}
        for kind in (None, "unauth-56MB", "oversize-56MB", "chunked-10MB", "deep-json", "idle-500"):
            lat = sorted(await _measure(port, seconds, kind))
            p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            results[kind or "alone"] = {"requests": len(lat), "p50_ms": round(statistics.median(lat), 2),
                                        "p99_ms": round(p99, 2), "max_ms": round(lat[-1], 2)}
            print(f"{kind or 'alone':>14}: {results[kind or 'alone']}", flush=True)
        if out is not None:
            out.write_text(json.dumps(results, indent=2) + "\n")
    finally:
        proc.terminate()
        proc.wait(10)
        token_file.unlink(missing_ok=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds of good requests per case")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--abuse", default=None, help=argparse.SUPPRESS)  # the abusers' subprocess
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.abuse:
        asyncio.run(abuse(args.abuse, args.port))
    else:
        asyncio.run(main(args.seconds, args.json))
