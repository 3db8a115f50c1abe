"""The ``../shared/cases/k8s-turn2`` cases against a real kube-apiserver: each snapshot's nodes (status through
the status subresource, the not-ready taint lifted), Queues, PodGroups and pods (those bound already created
bound) are created, the live scheduler (in-process, deploy/'s ServiceAccount) binds, and what it bound is read
back from the API. It must be exactly what the dry run plans on the same objects (pods, nodes, devices, share,
memory), with no GPU over-allocated. Objects are renamed into the test's namespace and given test-unique
node and queue names, so the control plane can be shared with the other scenarios.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.scheduler import Scheduler, SchedulerConfig
from gpupool.k8s.snapshot import ClusterSnapshot, load_snapshot, plan
from gpupool.k8s.telemetry import GpuTelemetry
from gpupool.k8s.wire import drain

from . import livecluster as lc
from .livecluster import E2E

pytestmark = pytest.mark.real_apiserver

CASES = lc.REPO.parent / "shared" / "cases" / "k8s-turn2"
QUEUE_LABELS = ("kueue.x-k8s.io/queue-name", "kai.scheduler/queue", "runai/queue")
VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"

FILES = [("hami-302", "snapshot.yaml", None), ("volcano-834", "snapshot.yaml", None),
         ("hami-707", "snapshot.yaml", None), ("k8s-92592", "snapshot_a.yaml", None),
         ("k8s-92592", "snapshot_b.yaml", "dcgm_b.txt"), ("kai-257", "snapshot_a.yaml", None),
         ("kai-257", "snapshot_b.yaml", None), ("kai-257", "snapshot_c.yaml", None),
         ("kai-416", "snapshot_a.yaml", None), ("kai-416", "snapshot_b.yaml", None),
         ("gpu-operator-386", "snapshot.yaml", None)]


def _renamed(snap: ClusterSnapshot, ns: str, tag: str) -> tuple[ClusterSnapshot, dict[str, str]]:
    """The snapshot with every pod in ``ns``, node and Queue names prefixed with ``tag``, the e2e label on all."""
    node_names = {n["metadata"]["name"]: f"{tag}-{n['metadata']['name']}" for n in snap.nodes}
    queue_names = {q["metadata"]["name"]: f"{tag}-{q['metadata']['name']}" for q in snap.queues or []}
    pod_names: dict[str, str] = {}

    def meta(obj: dict[str, Any], name: str, namespaced: bool) -> dict[str, Any]:
        out = copy.deepcopy(obj)
        m = out.setdefault("metadata", {})
        for k in ("resourceVersion", "uid", "creationTimestamp", "managedFields"):
            m.pop(k, None)
        m["name"] = name
        if namespaced:
            m["namespace"] = ns
        m["labels"] = {**(m.get("labels") or {}), lc.E2E_LABEL: "1"}
        return out

    nodes = []
    for n in snap.nodes:
        out = meta(n, node_names[n["metadata"]["name"]], False)
        out["metadata"]["labels"]["kubernetes.io/hostname"] = out["metadata"]["name"]
        nodes.append(out)
    if not snap.queues:
        # the file holds no Queue (no Queue CRD: no limits); this control plane has the CRD, so every queue the
        # pods name gets an unlimited Queue, which limits nothing either
        named = {str(v) for p in snap.pods for k, v in {**((p.get("metadata") or {}).get("labels") or {}),
                                                       **((p.get("metadata") or {}).get("annotations") or {})}.items()
                 if k in QUEUE_LABELS or k == VOLCANO_QUEUE}
        snap = ClusterSnapshot(nodes=snap.nodes, pods=snap.pods, pod_groups=snap.pod_groups, queues=[
            {"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": q}, "spec": {"limit": -1}}
            for q in sorted(named)] or None)
        queue_names = {q["metadata"]["name"]: f"{tag}-{q['metadata']['name']}" for q in snap.queues or []}
    queues = [meta(q, queue_names[q["metadata"]["name"]], False) for q in snap.queues or []]
    for q in queues:
        parent = (q.get("spec") or {}).get("parent")
        if parent:
            q["spec"]["parent"] = queue_names.get(parent, parent)
    groups = [meta(g, g["metadata"]["name"], True) for g in snap.pod_groups]
    pods = []
    for p in snap.pods:
        old = f"{p['metadata'].get('namespace') or 'default'}/{p['metadata']['name']}"
        new_name = f"{p['metadata'].get('namespace') or 'default'}-{p['metadata']['name']}"[:63]
        pod_names[old] = f"{ns}/{new_name}"
        out = meta(p, new_name, True)
        out["metadata"]["creationTimestamp"] = p["metadata"].get("creationTimestamp")
        labels = out["metadata"]["labels"]
        for key in QUEUE_LABELS:
            if key in labels:
                labels[key] = queue_names.get(labels[key], labels[key])
        ann = out["metadata"].get("annotations") or {}
        if VOLCANO_QUEUE in ann:
            ann[VOLCANO_QUEUE] = queue_names.get(ann[VOLCANO_QUEUE], ann[VOLCANO_QUEUE])
        spec = out.setdefault("spec", {})
        if spec.get("nodeName"):
            spec["nodeName"] = node_names.get(spec["nodeName"], spec["nodeName"])
            ann = out["metadata"].get("annotations") or {}
            if ann.get(ANN_NODE):
                ann[ANN_NODE] = node_names.get(ann[ANN_NODE], ann[ANN_NODE])
        for c in spec.get("containers") or []:
            c.setdefault("image", "registry.example/app:1")
        spec.setdefault("terminationGracePeriodSeconds", 0)
        out.pop("status", None)
        pods.append(out)
    return ClusterSnapshot(nodes=nodes, pods=pods, pod_groups=groups, queues=queues or None), node_names


def _create(e2e: E2E, snap: ClusterSnapshot) -> None:
    core, custom = client.CoreV1Api(e2e.admin), client.CustomObjectsApi(e2e.admin)
    for n in snap.nodes:
        status = n.get("status") or {}
        drain(core.create_node({k: v for k, v in n.items() if k != "status"}, _preload_content=False))
        drain(core.patch_node_status(n["metadata"]["name"], {"status": status}, _content_type=lc.MERGE,
                                     _preload_content=False))
        drain(core.patch_node(n["metadata"]["name"], {"spec": {"taints": (n.get("spec") or {}).get("taints")}},
                              _content_type=lc.MERGE, _preload_content=False))
    for q in snap.queues or []:
        drain(custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", q, _preload_content=False))
    for g in snap.pod_groups:
        drain(custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", e2e.ns, "podgroups", g,
                                                     _preload_content=False))
    for p in sorted(snap.pods, key=lambda p: not p["spec"].get("nodeName")):  # bound ones first
        body = copy.deepcopy(p)
        body["metadata"].pop("creationTimestamp", None)
        lc.create_pod(e2e.admin, body)


@pytest.mark.parametrize("case,file,dcgm", FILES, ids=[f"{c}/{f}" for c, f, _ in FILES])
def test_case_on_a_real_apiserver(e2e: E2E, case: str, file: str, dcgm: str | None) -> None:
    path = CASES / case / file
    if not path.exists():
        pytest.skip(f"{CASES} not found")
    tag = f"c{abs(hash((case, file, e2e.ns))) % 10**6}"
    snap, node_names = _renamed(load_snapshot(path), e2e.ns, tag)
    telemetry = None
    if dcgm:
        text = (CASES / case / dcgm).read_text()
        for old, new in node_names.items():
            text = text.replace(f'Hostname="{old}"', f'Hostname="{new}"')
        telemetry = GpuTelemetry(max_age=float("inf"))
        telemetry.ingest_text(text)
    _create(e2e, snap)
    # the dry run on what the API now holds (creation times as the server set them)
    listed = ClusterSnapshot(
        nodes=[n for n in lc.list_nodes(e2e.admin) if n["metadata"]["name"] in node_names.values()],
        pods=lc.list_pods(e2e.admin, e2e.ns), pod_groups=snap.pod_groups,
        queues=snap.queues)
    dry = {p.pod: p for p in plan(listed, prepare_state=telemetry.apply_health if telemetry else None,
                                  share_enforcement="trust").placements}  # the cases book GPU shares
    bound_before = {p["metadata"]["name"] for p in lc.bound(lc.list_pods(e2e.admin, e2e.ns))}
    sched = Scheduler(e2e.sa_client,
                      SchedulerConfig(identity=f"e2e-{tag}", backoff_max_s=2.0, share_enforcement="trust"),
                      prepare_state=telemetry.apply_health if telemetry else None)
    e2e.inproc.append(sched)
    sched.start()
    pending = [k.split("/", 1)[1] for k in dry]

    def settled() -> bool:
        pods = {p["metadata"]["name"]: p for p in lc.list_pods(e2e.admin, e2e.ns)}
        return all(pods[n]["spec"].get("nodeName") or (lc.condition(pods[n], "PodScheduled") or {}).get(
            "reason") == "Unschedulable" for n in pending)

    lc.wait_for(settled, 30, "every pending pod bound or reported unschedulable", detail=e2e.diagnostics)
    time.sleep(0.5)  # nothing is bound later
    live = {}
    for p in lc.bound(lc.list_pods(e2e.admin, e2e.ns)):
        name = p["metadata"]["name"]
        if name in bound_before:
            continue
        ann = p["metadata"].get("annotations") or {}
        assert ann.get(ANN_NODE) == p["spec"]["nodeName"], f"{name} bound without gpupool's annotations"
        gpus = tuple(int(g) for g in ann[ANN_GPU_INDEX].split(",")) if ann.get(ANN_GPU_INDEX) else ()
        live[f"{e2e.ns}/{name}"] = (p["spec"]["nodeName"], gpus, int(ann[ANN_GPU_MILLI]),
                                    int(ann.get(ANN_GPU_MEMORY) or 0))
    want = {k: (p.node, tuple(p.gpus), p.gpu_milli, p.gpu_memory_mib) for k, p in dry.items() if p.node}
    reasons = {p["metadata"]["name"]: (lc.condition(p, "PodScheduled") or {}).get("message")
               for p in lc.list_pods(e2e.admin, e2e.ns) if not p["spec"].get("nodeName")}
    assert live == want, f"live scheduler's reasons: {reasons}"
    bad, _ = lc.gpu_violations(e2e.admin)
    assert not bad, "\n".join(bad[:20])
    lc.RESULTS.setdefault("cases", {})[f"{case}/{file}"] = f"{len(live)} bound, as the dry run"
