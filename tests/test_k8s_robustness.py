"""One malformed object never blocks the others: snapshots with bad quantities, duplicate pods, fields of the
wrong type and unreadable files, run through ``load_snapshot`` + ``plan`` and ``gpupool scheduler --dry-run``."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.clusterspec import ClusterSpecError, load_cluster_yaml
from gpupool.k8s import inventory
from gpupool.k8s.inventory import build_state
from gpupool.k8s.requests import RequestParseError, describe_pod, parse_queue
from gpupool.k8s.snapshot import SnapshotError, load_snapshot, plan

runner = CliRunner()


# ------------------------------------------------------------------ builders
def node(name: Any = "n1", gpus: int = 2, **alloc: Any) -> dict[str, Any]:
    allocatable = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus), **alloc}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {}, "status": {"allocatable": allocatable,
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: Any = "p", gpus: int | None = 1, node_name: str | None = None, annotations: dict | None = None,
        labels: dict | None = None, **limits: Any) -> dict[str, Any]:
    lim = {"cpu": "1", "memory": "1Gi", **limits}
    if gpus is not None:
        lim["nvidia.com/gpu"] = str(gpus)
    meta: dict[str, Any] = {"namespace": "default", "creationTimestamp": "2024-05-01T12:00:00Z"}
    if name is not None:
        meta["name"] = name
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    spec: dict[str, Any] = {"schedulerName": "gpupool", "containers": [{"name": "c", "resources": {"limits": lim}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": "Running" if node_name else "Pending"}}


def write(tmp_path: Path, items: list[dict[str, Any]], name: str = "snap.yaml") -> Path:
    f = tmp_path / name
    f.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items, "metadata": {}}))
    return f


def planned(path: Path) -> tuple[dict[str, Any], Any]:
    result = plan(load_snapshot(path))
    by_pod: dict[str, Any] = {}
    for p in result.placements:
        by_pod.setdefault(p.pod, []).append(p)
    return by_pod, result


def cli_json(path: Path, *extra: str) -> dict[str, Any]:
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(path), "--json", "-", *extra])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def check(tmp_path: Path, items: list[dict[str, Any]], bad: str, *words: str) -> None:
    """``default/<bad>`` is invalid with a reason naming ``words``; ``default/good`` is placed (plan and CLI)."""
    f = write(tmp_path, items)
    by_pod, _ = planned(f)
    (p,) = by_pod[f"default/{bad}"]
    assert p.node is None and p.invalid
    for w in words:
        assert w in p.reason
    assert by_pod["default/good"][0].node is not None
    data = {p["pod"]: p for p in cli_json(f)["placements"]}
    assert data["default/good"]["node"] is not None and data[f"default/{bad}"]["node"] is None


# ------------------------------------------------------------------ 1. non-finite quantities
NON_FINITE = ["NaN", "sNaN", "Infinity", "inf"]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("resource", ["cpu", "memory", "nvidia.com/gpu"])
@pytest.mark.parametrize("kind", ["limits", "requests"])
def test_non_finite_pod_quantity(tmp_path, value, resource, kind):
    bad = pod("bad")
    bad["spec"]["containers"][0]["resources"].setdefault(kind, {})[resource] = value
    check(tmp_path, [node(), bad, pod("good")], "bad", f'resources.{kind}["{resource}"]', "not a Kubernetes quantity")


@pytest.mark.parametrize("value", NON_FINITE + ["1e999999999"])
def test_non_finite_gpu_memory_annotation(tmp_path, value):
    bad = pod("bad", gpus=None, annotations={"gpu-memory": value})
    check(tmp_path, [node(), bad, pod("good")], "bad", "gpu-memory")


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("resource", ["cpu", "memory", "nvidia.com/gpu"])
def test_non_finite_node_allocatable_skips_the_node(tmp_path, value, resource):
    items = [node("bad", **{resource: value}), node("ok"), pod("good")]
    f = write(tmp_path, items)
    by_pod, result = planned(f)
    assert by_pod["default/good"][0].node == "ok"
    (skip,) = [s for s in result.skipped if s.get("node") == "bad"]
    assert "not a Kubernetes quantity" in skip["reason"] and resource in skip["reason"]
    data = cli_json(f)
    assert {"node": "bad", "reason": skip["reason"]} in data["skipped"]
    text = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(f)])
    assert text.exit_code == 0 and "skipped node bad:" in text.output


def test_non_finite_mig_capacity_and_queue_quota_are_not_crashes():
    n = node("m", gpus=0, **{"nvidia.com/mig-1g.10gb": "NaN"})
    n["metadata"]["labels"]["nvidia.com/mig.strategy"] = "mixed"
    assert inventory.mig_capacity(n) == {}
    with pytest.raises(RequestParseError, match="not a number of GPUs"):
        parse_queue({"metadata": {"name": "q"}, "spec": {"quota": "NaN"}})


# ------------------------------------------------------------------ 2. duplicate pod keys
def test_duplicate_pending_pods(tmp_path):
    f = write(tmp_path, [node(), pod("dup"), pod("dup"), pod("good")])
    by_pod, _ = planned(f)
    assert len(by_pod["default/dup"]) == 2
    assert all(p.node is None and p.invalid and "duplicate pod" in p.reason for p in by_pod["default/dup"])
    assert by_pod["default/good"][0].node == "n1"
    assert len(cli_json(f)["placements"]) == 3


def test_pending_pod_named_like_a_bound_pod(tmp_path):
    f = write(tmp_path, [node(gpus=2), pod("dup", node_name="n1"), pod("dup"), pod("good")])
    by_pod, result = planned(f)
    (p,) = by_pod["default/dup"]
    assert p.node is None and p.invalid and "already bound to node n1" in p.reason
    assert by_pod["default/good"][0].node == "n1"
    assert "default/dup" in result.inventory["assignments"]  # the bound one is still counted


def test_duplicate_bound_pods_are_both_counted(tmp_path):
    items = [node(gpus=2), pod("dup", node_name="n1"), pod("dup", node_name="n1"), pod("good")]
    by_pod, result = planned(write(tmp_path, items))
    assert by_pod["default/good"][0].node is None  # both GPUs held by the two bound copies
    assert any("duplicate pod default/dup" in s["reason"] for s in result.skipped if "pod" in s)


def test_nameless_pods(tmp_path):
    f = write(tmp_path, [node(), pod(None), pod(None), pod("good")])
    by_pod, _ = planned(f)
    assert len(by_pod["default/"]) == 2
    assert all(p.invalid and "metadata.name is missing" in p.reason for p in by_pod["default/"])
    assert by_pod["default/good"][0].node == "n1"
    cli_json(f)


def test_duplicate_gang_members(tmp_path):
    gang = {"scheduling.x-k8s.io/pod-group": "g"}
    ann = {"gpupool.io/min-member": "2"}
    items = [node(gpus=4), pod("g-0", labels=gang, annotations=ann), pod("g-0", labels=gang, annotations=ann),
             pod("g-1", labels=gang, annotations=ann), pod("g-2", labels=gang, annotations=ann), pod("good")]
    f = write(tmp_path, items)
    by_pod, _ = planned(f)
    assert all(p.invalid and "duplicate pod" in p.reason for p in by_pod["default/g-0"])
    assert by_pod["default/g-1"][0].node == by_pod["default/g-2"][0].node == "n1"
    assert by_pod["default/good"][0].node == "n1"
    cli_json(f)


# ------------------------------------------------------------------ 3. fields of the wrong type
def _set(path: str, value: Any):
    def mutate(obj: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        cur: Any = obj
        for part in parents:
            cur = cur[int(part)] if isinstance(cur, list) else cur.setdefault(part, {})
        cur[last] = value
    return mutate


POD_MUTATIONS = [
    ("spec", "oops", "spec"),
    ("status", "x", "status"),
    ("metadata.annotations", ["x"], "metadata.annotations"),
    ("metadata.labels", ["x"], "metadata.labels"),
    ("spec.containers", "x", "spec.containers"),
    ("spec.initContainers", "x", "spec.initContainers"),
    ("spec.containers.0.resources", [1], "spec.containers[0].resources"),
    ("spec.containers.0.resources.limits", "x", "spec.containers[0].resources.limits"),
    ("spec.nodeSelector", ["a", "b"], "spec.nodeSelector"),
    ("spec.tolerations", "x", "spec.tolerations"),
    ("spec.affinity", "x", "spec.affinity"),
    ("spec.topologySpreadConstraints", ["x"], "spec.topologySpreadConstraints[0]"),
    ("spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms", "x",
     "nodeSelectorTerms"),
    ("spec.overhead", [1], "spec.overhead"),
]


@pytest.mark.parametrize(("path", "value", "field"), POD_MUTATIONS, ids=[m[0] for m in POD_MUTATIONS])
def test_pod_field_of_wrong_type(tmp_path, path, value, field):
    bad = pod("bad")
    _set(path, value)(bad)
    check(tmp_path, [node(), bad, pod("good")], "bad", "pod default/bad", field)


NODE_MUTATIONS = [
    ("metadata.labels", ["a"], "metadata.labels"),
    ("status", "x", "status"),
    ("spec.taints", "x", "spec.taints"),
    ("spec.taints", ["x"], "spec.taints[0]"),
    ("status.conditions", ["x"], "status.conditions[0]"),
    ("status.allocatable", [1], "status.allocatable"),
    ("spec", "x", "spec"),
]


@pytest.mark.parametrize(("path", "value", "field"), NODE_MUTATIONS, ids=[f"{m[0]}={m[1]}" for m in NODE_MUTATIONS])
def test_node_field_of_wrong_type_skips_the_node(tmp_path, path, value, field):
    bad = node("bad", gpus=8)
    _set(path, value)(bad)
    f = write(tmp_path, [bad, node("ok"), pod("good")])
    by_pod, result = planned(f)
    assert by_pod["default/good"][0].node == "ok"
    (skip,) = [s for s in result.skipped if s.get("node") == "bad"]
    assert skip["reason"].startswith("node bad: ") and field in skip["reason"]
    assert any(s.get("node") == "bad" for s in cli_json(f)["skipped"])


def test_node_name_of_wrong_type(tmp_path):
    f = write(tmp_path, [node(123, gpus=8), node("ok"), pod("good")])
    by_pod, result = planned(f)
    assert by_pod["default/good"][0].node == "ok"
    assert any("metadata.name" in s["reason"] for s in result.skipped if "node" in s)
    assert cli_json(f)["skipped"]


def test_pod_group_spec_of_wrong_type(tmp_path):
    gang = {"scheduling.x-k8s.io/pod-group": "g"}
    group = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "g", "namespace": "default"}, "spec": [1]}
    f = write(tmp_path, [node(), group, pod("g-0", labels=gang), pod("good")])
    by_pod, _ = planned(f)
    (p,) = by_pod["default/g-0"]
    assert p.node is None and "PodGroup default/g" in p.reason and "spec" in p.reason
    assert by_pod["default/good"][0].node == "n1"
    cli_json(f)


def test_unexpected_errors_are_caught_per_object(tmp_path, monkeypatch):
    snap = load_snapshot(write(tmp_path, [node("bad"), node("ok"), pod("bad"), pod("good")]))

    def describe(p):
        if p["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        return describe_pod(p)

    real = inventory.node_spec_from_node

    def node_spec(n):
        if n["metadata"]["name"] == "bad":
            raise KeyError("kaboom")
        return real(n)

    monkeypatch.setattr("gpupool.k8s.objects.nodes.node_spec_from_node", node_spec)
    result = plan(snap, describe=describe)
    by_pod = {p.pod: p for p in result.placements}
    assert by_pod["default/bad"].invalid and "invalid object: RuntimeError: boom" in by_pod["default/bad"].reason
    assert by_pod["default/good"].node == "ok"
    assert {"node": "bad", "reason": "invalid object: KeyError: 'kaboom'"} in result.skipped


def test_bound_pod_of_wrong_shape_is_still_counted():
    bound = pod("b", node_name="n1", gpus=2)
    bound["metadata"]["annotations"] = ["x"]
    state, info = build_state([node(gpus=2)], [bound])
    assert info["assignments"]["default/b"].gpus == (0, 1)


# ------------------------------------------------------------------ 4. files that are not UTF-8
def test_snapshot_not_utf8(tmp_path):
    f = tmp_path / "latin1.yaml"
    f.write_bytes(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [node("café")]},
                                 allow_unicode=True).encode("latin-1"))
    with pytest.raises(SnapshotError, match="not UTF-8"):
        load_snapshot(f)
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(f)])
    assert result.exit_code == 2 and "not UTF-8" in result.output
    assert "Traceback" not in result.output


def test_cluster_yaml_not_utf8(tmp_path):
    f = tmp_path / "cluster.yaml"
    f.write_bytes("nodes:\n  - name: café\n".encode("latin-1"))
    with pytest.raises(ClusterSpecError, match="not UTF-8"):
        load_cluster_yaml(f)


# ------------------------------------------------------------------ 5. --seed
def test_negative_seed_is_a_usage_error(tmp_path):
    f = write(tmp_path, [node(), pod("good")])
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(f), "--seed", "-5"])
    assert result.exit_code == 2 and "seed" in result.output
    assert not isinstance(result.exception, ValueError)
    assert cli_json(f, "--seed", "7")["placements"][0]["node"] == "n1"


# ------------------------------------------------------------------ 6. unreadable bound GPU shares
@pytest.mark.parametrize("annotations", [
    {"gpu-fraction": "oops"},
    {"gpu-fraction": "NaN"},
    {"gpu-memory": "NaN"},
    {"gpu-fraction": "0.5", "gpu-memory": "2000"},  # two spellings: unreadable as a whole
])
def test_unreadable_bound_fraction_holds_a_whole_gpu(tmp_path, caplog, annotations):
    bound = pod("frac-" + str(abs(hash(json.dumps(annotations)))), gpus=None, node_name="n1",
                annotations=annotations)
    pending = pod("good", gpus=None, annotations={"gpu-fraction": "0.5"})
    with caplog.at_level(logging.WARNING, logger="gpupool.k8s.inventory"):
        by_pod, result = planned(write(tmp_path, [node(gpus=1), bound, pending]))
    assert by_pod["default/good"][0].node is None  # the only GPU is held by the unreadable pod
    key = bound["metadata"]["name"]
    assert result.inventory["assignments"][f"default/{key}"].gpus == (0,)
    assert "counted conservatively" in result.inventory["skipped_pods"][f"default/{key}"]
    assert any(r.levelno == logging.WARNING and "counted conservatively" in r.getMessage() for r in caplog.records)


def test_unreadable_bound_pod_asking_several_gpus_holds_them_all():
    bound = pod("b", gpus=None, node_name="n1", annotations={"gpu-fraction": "1", "gpu-fraction-num-devices": "3",
                                                            "gpu-memory": "x"})
    state, info = build_state([node(gpus=4)], [bound])
    assert info["assignments"]["default/b"].gpus == (0, 1, 2)


def test_wrong_type_snapshot_objects_in_one_file(tmp_path):
    """Everything above at once: the good pod is still placed."""
    items: list[dict[str, Any]] = [node("ok", gpus=4)]
    for i, (path, value, _) in enumerate(POD_MUTATIONS):
        bad = pod(f"bad-{i}")
        _set(path, value)(bad)
        items.append(bad)
    for i, (path, value, _) in enumerate(NODE_MUTATIONS):
        bad = node(f"badnode-{i}")
        _set(path, value)(bad)
        items.append(copy.deepcopy(bad))
    items += [pod("good"), pod("dup"), pod("dup"), pod(None)]
    f = write(tmp_path, items)
    by_pod, result = planned(f)
    assert by_pod["default/good"][0].node == "ok"
    assert all(p[0].invalid for k, p in by_pod.items() if k != "default/good")
    assert len([s for s in result.skipped if "node" in s]) == len(NODE_MUTATIONS)
    assert len(cli_json(f)["skipped"]) == len(NODE_MUTATIONS)
