"""Scenario 8: 1,000 one-GPU pods on 200 fake 8-GPU nodes through a real kube-apiserver.

Reports (does not assert) the speed: time from the first pod create to the last pod bound, binds/s; asserts
that every pod is bound and no GPU is over-allocated. Writes benchmarks/results/e2e_live.json.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import subprocess
import threading
import time
from importlib import metadata

import pytest

from . import livecluster as lc
from .livecluster import E2E, RESULTS

pytestmark = pytest.mark.real_apiserver

NODES = int(os.environ.get("E2E_NODES", "200"))
PODS = int(os.environ.get("E2E_PODS", "1000"))
BIND_TIMEOUT_S = float(os.environ.get("E2E_BIND_TIMEOUT_S", "120"))
OUT = lc.REPO / "benchmarks" / "results" / "e2e_live.json"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "describe", "--always", "--dirty"], cwd=lc.REPO, capture_output=True, text=True,
                              timeout=5, check=False).stdout.strip()
    except OSError:
        return ""


def test_throughput_1000_pods_200_nodes(e2e: E2E) -> None:
    api, ns = e2e.admin, e2e.ns
    t = time.monotonic()
    lc.make_nodes(api, "t-node", NODES, gpus=8)
    nodes_s = time.monotonic() - t
    sched = e2e.scheduler_process("throughput")
    # the scheduler has listed the nodes once a first pod is bound
    lc.create_pod(api, lc.pod_body("warmup", ns))
    lc.wait_bound(api, ns, ["warmup"], 60, e2e.diagnostics)

    names = [f"t-{i:04d}" for i in range(PODS)]
    created_at: dict[str, float] = {}
    first_bound: list[float] = []
    bound_count: list[tuple[float, int]] = []
    done = threading.Event()

    def poll() -> None:  # the API's view of progress: a paged list every 0.25 s
        while not done.wait(0.25):
            try:
                n = len(lc.bound(lc.list_pods(api, ns, f"{lc.E2E_LABEL}=1")))
            except Exception:  # noqa: BLE001 - a failed poll is just skipped
                continue
            bound_count.append((time.monotonic(), n - 1))  # minus the warm-up pod
            if n - 1 > 0 and not first_bound:
                first_bound.append(time.monotonic())

    poller = threading.Thread(target=poll, daemon=True)
    t0 = time.monotonic()
    poller.start()
    from concurrent.futures import ThreadPoolExecutor

    def create(name: str) -> None:
        lc.create_pod(api, lc.pod_body(name, ns))
        created_at[name] = time.monotonic()

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(create, names))
    t_created = time.monotonic()
    try:
        lc.wait_bound(api, ns, names, BIND_TIMEOUT_S, e2e.diagnostics)
    finally:
        done.set()
        poller.join(2)
    t_all = time.monotonic()
    elapsed = t_all - t0
    bad, usage = lc.gpu_violations(api)
    per_node: dict[str, int] = {}
    for p in lc.bound(lc.list_pods(api, ns)):
        per_node[p["spec"]["nodeName"]] = per_node.get(p["spec"]["nodeName"], 0) + 1
    result = {
        "what": "gpupool live scheduler against a real kube-apiserver + etcd on loopback (tests/e2e)",
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": {
            "gpupool": metadata.version("gpupool"), "git_commit": _git_commit(),
            "kube_apiserver": e2e.cp.version().get("gitVersion"),
            "kube_apiserver_minor": f"{e2e.cp.version().get('major')}.{e2e.cp.version().get('minor')}",
            "kubernetes_python_client": metadata.version("kubernetes"), "python": platform.python_version(),
        },
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "scheduler": "gpupool scheduler subprocess, deploy/ ServiceAccount token, no leader election",
        "counts": {"nodes": NODES, "gpus_per_node": 8, "gpus": NODES * 8, "pods": PODS, "gpus_per_pod": 1,
                   "bound": len(names), "nodes_used": len(per_node), "max_pods_per_node": max(per_node.values()),
                   "over_allocated": len(bad), "gpus_in_use": usage["gpus_in_use"]},
        "times_s": {
            "control_plane_start": RESULTS.get("control_plane_start_s"),
            "create_nodes": round(nodes_s, 2),
            "create_pods": round(t_created - t0, 2),
            "first_create_to_first_bound": round(first_bound[0] - t0, 2) if first_bound else None,
            "first_create_to_all_bound": round(elapsed, 2),
        },
        "binds_per_s": round(PODS / elapsed, 1),
        "creates_per_s": round(PODS / max(1e-9, t_created - t0), 1),
        "progress": [[round(ts - t0, 2), n] for ts, n in bound_count[:: max(1, len(bound_count) // 40)]],
        "note": "speed is reported, not asserted; the same machine runs etcd, the apiserver, the scheduler and "
                "the pod creator",
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    RESULTS["throughput"] = f"{PODS} pods / {NODES} nodes: all bound {elapsed:.2f}s after the first create, " \
                            f"{PODS / elapsed:.1f} binds/s ({OUT.relative_to(lc.REPO)})"
    print(f"\n[e2e] throughput: {RESULTS['throughput']}")
    assert sched.alive()
    assert not bad, "GPU over-allocation:\n  " + "\n  ".join(bad[:30])
