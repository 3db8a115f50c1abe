"""The ``../shared/cases/k8s-turn2`` cases on the LIVE path: the objects of each snapshot are created on the mock
API server (nodes, Queues, PodGroups, bound pods, pending pods), the live scheduler lists, watches and binds, and
what it bound is read back from the API. It must be what the dry run plans (same model, same engine: checked
per pod, node and devices) and what EXPECTED.md calls correct (checked per case below; the dry-run side of the
same values is in ``test_k8s_booking.py``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_NODE, wire
from gpupool.k8s.scheduler import Scheduler, SchedulerConfig
from gpupool.k8s.snapshot import load_snapshot, plan
from gpupool.k8s.telemetry import GpuTelemetry
from test_k8s_scheduler import PODGROUPS, PODS, QUEUES, Harness, wait_for

CASES = Path(__file__).parents[1] / "../shared/cases/k8s-turn2"


@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in obj.items()}
    meta = dict(out.get("metadata") or {})
    meta.pop("resourceVersion", None)
    out["metadata"] = meta
    return out


def run_live(h: Harness, snapshot_file: Path, dcgm: Path | None = None,
             share_enforcement: str = "trust") -> tuple[dict, dict]:
    """Create the snapshot's objects, run the live scheduler until every pending pod is bound or reported,
    and return ({pod: (node, gpus, milli, memory)} bound by gpupool, {pod: dry-run placement}). The cases book
    GPU shares: by default both run with ``share_enforcement="trust"`` (something on the nodes enforces them)."""
    if not snapshot_file.exists():
        pytest.skip(f"{CASES} not found")
    snap = load_snapshot(snapshot_file)
    telemetry = None
    if dcgm is not None:
        telemetry = GpuTelemetry(max_age=float("inf"))
        telemetry.ingest_text(dcgm.read_text())
    dry = {p.pod: p for p in plan(snap, prepare_state=telemetry.apply_health if telemetry else None,
                                  share_enforcement=share_enforcement).placements}
    custom = client.CustomObjectsApi(h.api)
    for node in snap.nodes:
        h.create_node(_clean(node))
    if snap.queues:
        h.declare(QUEUES)
        for q in snap.queues:
            wire.drain(custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", _clean(q),
                                                           _preload_content=False))
    if snap.pod_groups:
        h.declare(PODGROUPS)
        for g in snap.pod_groups:
            ns = (g.get("metadata") or {}).get("namespace") or "default"
            wire.drain(custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups",
                                                              _clean(g), _preload_content=False))
    bound_before = set()
    for pod in sorted(snap.pods, key=lambda p: not (p.get("spec") or {}).get("nodeName")):
        if (pod.get("spec") or {}).get("nodeName"):
            bound_before.add(f"{pod['metadata'].get('namespace') or 'default'}/{pod['metadata']['name']}")
        h.create_pod(_clean(pod))
    cfg = SchedulerConfig(identity="live-cases", batch_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.3,
                          optional_retry_s=0.5, resync_s=0.5, watch_timeout_s=30, share_enforcement=share_enforcement)
    s = Scheduler(h.api, cfg, prepare_state=telemetry.apply_health if telemetry else None)
    h.schedulers.append(s)
    s.start()
    pending = [k for k in dry]

    def settled() -> bool:
        for key in pending:
            ns, name = key.split("/", 1)
            pod = h.pod(name, ns)
            if pod is None or pod["spec"].get("nodeName"):
                continue
            if not any(e.get("reason") == "FailedScheduling" for e in h.events_for(name)):
                return False
        return True

    wait_for(settled, timeout=15, what="every pending pod bound or reported")
    time.sleep(0.3)  # nothing more is bound later
    live = {}
    for pod in h.objects(PODS):
        key = f"{pod['metadata'].get('namespace') or 'default'}/{pod['metadata']['name']}"
        node = pod["spec"].get("nodeName")
        if not node or key in bound_before:
            continue
        ann = pod["metadata"].get("annotations") or {}
        assert ann.get(ANN_NODE) == node, f"{key} bound without gpupool's annotations"
        gpus = tuple(int(g) for g in ann[ANN_GPU_INDEX].split(",")) if ann.get(ANN_GPU_INDEX) else ()
        live[key] = (node, gpus, int(ann[ANN_GPU_MILLI]), int(ann.get(ANN_GPU_MEMORY) or 0))
    return live, dry


def same_as_dry_run(live: dict, dry: dict) -> None:
    placed = {k: (p.node, tuple(p.gpus), p.gpu_milli, p.gpu_memory_mib) for k, p in dry.items() if p.node}
    assert live == placed


def by_card(live: dict) -> dict[tuple[str, int], tuple[int, int]]:
    """(node, GPU) -> (milli, MiB) booked on it by the pods gpupool bound."""
    out: dict[tuple[str, int], tuple[int, int]] = {}
    for node, gpus, milli, mem in live.values():
        for g in gpus:
            m, b = out.get((node, g), (0, 0))
            out[node, g] = (m + milli, b + mem)
    return out


def test_hami302_live(h):
    live, dry = run_live(h, CASES / "hami-302" / "snapshot.yaml")
    same_as_dry_run(live, dry)
    teams: dict[str, int] = {}
    for key in live:
        teams[key.split("/")[0]] = teams.get(key.split("/")[0], 0) + 1
    assert teams.get("team-a") == 1 and teams.get("team-c") == 1  # 0.86 GPU each: one per 1-GPU limit
    two = [v for k, v in live.items() if k.startswith("team-b/")]
    assert len(two) == 1 and len(set(two[0][1])) == 2  # the 2-card share pod: 2 distinct cards
    assert all(mem <= 81559 for _, mem in by_card(live).values())


def test_volcano834_live(h):
    live, dry = run_live(h, CASES / "volcano-834" / "snapshot.yaml")
    same_as_dry_run(live, dry)
    assert len(live) == 2  # the gang's minimum (1) admitted, pods up to the 2-GPU limit


def test_hami707_live(h):
    live, dry = run_live(h, CASES / "hami-707" / "snapshot.yaml")
    same_as_dry_run(live, dry)
    assert live and {node for node, *_ in live.values()} == {"a100-node"}


@pytest.mark.parametrize("part", ["a", "b"])
def test_k8s92592_live(h, part):
    dcgm = CASES / "k8s-92592" / "dcgm_b.txt" if part == "b" else None
    live, dry = run_live(h, CASES / "k8s-92592" / f"snapshot_{part}.yaml", dcgm)
    same_as_dry_run(live, dry)
    if part == "b":
        assert len(live) == 1  # runs on the healthy GPU the device plugin still advertises
    else:
        assert all(len(gpus) <= 1 for _, gpus, *_ in live.values())  # no placement beyond allocatable


@pytest.mark.parametrize("part,placed", [("a", 2), ("b", 0), ("c", 2)])
def test_kai257_live(h, part, placed):
    live, dry = run_live(h, CASES / "kai-257" / f"snapshot_{part}.yaml")
    same_as_dry_run(live, dry)
    assert len(live) == placed
    if part == "b":
        assert all("GPU memory unknown" in p.reason for p in dry.values())
        ns, name = next(iter(dry)).split("/", 1)
        assert any("GPU memory unknown" in e["message"] for e in h.events_for(name))


@pytest.mark.parametrize("part,cap", [("a", 46068), ("b", 40536)])
def test_kai416_live(h, part, cap):
    live, dry = run_live(h, CASES / "kai-416" / f"snapshot_{part}.yaml")
    same_as_dry_run(live, dry)
    assert live and all(mem <= cap for _, mem in by_card(live).values())


def test_gpu_operator386_live(h):
    live, dry = run_live(h, CASES / "gpu-operator-386" / "snapshot.yaml")
    same_as_dry_run(live, dry)
    assert len(live) == 4
    two = [v for v in live.values() if len(v[1]) == 2]
    assert len(two) == 1 and len(set(two[0][1])) == 2 and two[0][2] == 250  # 2 slices on 2 physical GPUs
    assert all(milli == 250 for _, _, milli, _ in live.values())  # a slice, not a whole GPU
    assert all(m <= 1000 for m, _ in by_card(live).values())
