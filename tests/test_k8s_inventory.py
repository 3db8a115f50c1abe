"""Node inventory from allocatable resources and GFD labels; bound pods counted; node eligibility per pod."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.k8s.inventory import (
    UNKNOWN_GPU_MODEL,
    Eligibility,
    NodeParseError,
    annotated_devices,
    build_state,
    constraints_of,
    matches_node_selector_term,
    mig_capacity,
    node_ready,
    node_spec_from_node,
    tolerates,
)


def node(name: str = "n", gpus: int | str | None = 8, product: str | None = "NVIDIA-H100-80GB-HBM3",
         labels: dict[str, str] | None = None, cpu: str = "64", memory: str = "512Gi",
         extra: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    lab = dict(labels or {})
    if product:
        lab["nvidia.com/gpu.product"] = product
    alloc = {"cpu": cpu, "memory": memory, "pods": "110", **(extra or {})}
    if gpus is not None:
        alloc["nvidia.com/gpu"] = str(gpus)
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": lab}, "spec": spec,
            "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, node_name: str | None = None, gpus: int | None = None, annotations: dict[str, str] | None = None,
        phase: str = "Running", cpu: str = "1", **spec: Any) -> dict[str, Any]:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus is not None else {}
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": "default", "annotations": annotations or {},
                      "creationTimestamp": "2025-01-01T00:00:00Z"},
         "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"},
                                                              "limits": limits}}], **spec},
         "status": {"phase": phase}}
    if node_name:
        p["spec"]["nodeName"] = node_name
    return p


# ------------------------------------------------------------------ nodes
def test_h100_node_from_gfd_labels():
    spec = node_spec_from_node(node("h1", labels={"nvidia.com/gpu.clique": "c1.0", "topology.gpupool.io/rack": "r7"},
                                    cpu="95500m", memory="1056329464Ki"))
    assert (spec.name, spec.gpu_count, spec.gpu_model) == ("h1", 8, "H100")
    assert spec.cpu_milli == 95500 and spec.memory_mib == 1056329464 // 1024
    assert spec.nvlink_domain == "c1.0" and spec.rack == "r7"
    assert ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3") in spec.labels


def test_time_slicing_counts_physical_gpus():
    spec = node_spec_from_node(node(gpus=16, product="Tesla-T4-SHARED",
                                    labels={"nvidia.com/gpu.replicas": "4",
                                            "nvidia.com/gpu.sharing-strategy": "time-slicing"}))
    assert (spec.gpu_count, spec.gpu_model) == (4, "T4")


def test_mig_single_is_gpus_of_an_opaque_model():
    spec = node_spec_from_node(node(gpus=28, product="NVIDIA-A100-SXM4-40GB-MIG-1g.5gb",
                                    labels={"nvidia.com/mig.strategy": "single"}))
    assert (spec.gpu_count, spec.gpu_model) == (28, "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")


def test_mig_mixed_counts_devices_per_profile():
    n = node(gpus=4, product="NVIDIA-A100-SXM4-80GB", labels={"nvidia.com/mig.strategy": "mixed"},
             extra={"nvidia.com/mig-1g.10gb": "14", "nvidia.com/mig-3g.40gb": "4", "nvidia.com/mig-bogus": "1"})
    assert node_spec_from_node(n).gpu_count == 4  # the GPUs left whole
    assert mig_capacity(n) == {"1g.10gb": 14, "3g.40gb": 4}


@pytest.mark.parametrize("n, count, model", [
    (node(product="Some-Future-GPU"), 8, "Some-Future-GPU"),
    (node(product=None), 8, UNKNOWN_GPU_MODEL),
    (node(product=None, labels={"alibabacloud.com/gpu-card-model": "V100M16"}), 8, "V100M16"),
    (node(gpus=None), 0, ""),
    (node(gpus=0), 0, ""),
])
def test_gpu_count_and_model(n, count, model):
    spec = node_spec_from_node(n)
    assert (spec.gpu_count, spec.gpu_model) == (count, model)


def test_unreadable_node_is_an_error_and_is_skipped():
    bad = node("bad", cpu="lots")
    with pytest.raises(NodeParseError, match=r'node bad: status.allocatable\["cpu"\]: "lots" is not a Kubernetes'):
        node_spec_from_node(bad)
    state, info = build_state([bad, node("ok")], [])
    assert state.node_names == ("ok",) and "bad" in info["skipped_nodes"]
    with pytest.raises(ValueError, match="no usable node"):
        build_state([bad], [])


# ------------------------------------------------------------------ bound pods
def test_bound_pods_are_counted_whoever_bound_them():
    nodes = [node("n1", gpus=2)]
    pods = [
        pod("kube", "n1", gpus=1),  # kube-scheduler: no annotations -> lowest free device
        pod("mine", "n1", annotations={"gpu-fraction": "0.5", "gpupool.io/node": "n1",
                                       "gpupool.io/gpu-index": "0", "gpupool.io/gpu-milli": "500"}),
        pod("done", "n1", gpus=2, phase="Succeeded"),  # finished: holds nothing
        pod("pending", None, gpus=1),  # not bound: not counted
        pod("ghost", "gone", gpus=1),  # bound to a node that is not there
    ]
    state, info = build_state(nodes, pods)
    a = info["assignments"]
    assert a["default/mine"].gpus == (0,) and a["default/mine"].gpu_milli == 500
    assert a["default/kube"].gpus == (1,)  # annotated pods claim their devices first
    assert set(a) == {"default/mine", "default/kube"} == set(state.assignments)
    assert list(state.gpu_free[0]) == [500, 0]
    assert state.cpu_free[0] == 64000 - 2000
    assert "gone" in info["skipped_pods"]["default/ghost"]
    state.check_invariants()


def test_annotations_for_another_node_are_ignored():
    stale = {"gpu-fraction": "0.5", "gpupool.io/node": "n2", "gpupool.io/gpu-index": "1", "gpupool.io/gpu-milli": "500"}
    p = pod("moved", "n1", annotations=stale)
    assert annotated_devices(p) is None
    state, info = build_state([node("n1", gpus=2), node("n2", gpus=2)], [p])
    assert info["assignments"]["default/moved"].gpus == (0,)  # lowest free on the node it really runs on


def test_whole_gpu_given_to_a_fractional_pod_is_counted_whole():
    # k8s-default policy hands a whole GPU to a fractional pod: the annotation says 1000.
    p = pod("frac", "n1", annotations={"gpu-fraction": "0.25", "gpupool.io/node": "n1",
                                       "gpupool.io/gpu-index": "1", "gpupool.io/gpu-milli": "1000"})
    state, info = build_state([node("n1", gpus=2)], [p])
    assert list(state.gpu_free[0]) == [1000, 0]


def test_unreadable_bound_pod_still_holds_its_whole_gpus():
    p = pod("weird", "n1", gpus=1, annotations={"gpu-fraction": "oops"})
    state, info = build_state([node("n1", gpus=2)], [p])
    assert info["assignments"]["default/weird"].gpus == (0,)


def test_overcommitted_node_is_counted_in_part():
    pods = [pod(f"p{i}", "n1", gpus=1) for i in range(3)]  # 3 whole GPUs bound to a 2-GPU node
    state, info = build_state([node("n1", gpus=2)], pods)
    assert list(state.gpu_free[0]) == [0, 0]
    assert "counted in part" in info["skipped_pods"]["default/p2"]
    state.check_invariants()


def test_mig_use_is_counted_per_profile():
    n = node("m", gpus=0, product="NVIDIA-A100-SXM4-80GB", labels={"nvidia.com/mig.strategy": "mixed"},
             extra={"nvidia.com/mig-1g.10gb": "7"})
    p = pod("mig", "m")
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/mig-1g.10gb": "2"}
    state, info = build_state([n], [p])
    assert info["mig_capacity"] == {"m": {"1g.10gb": 7}} and info["mig_used"] == {"m": {"1g.10gb": 2}}


# ------------------------------------------------------------------ eligibility
@pytest.mark.parametrize("tols, taint, ok", [
    ([], {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ([{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}],
     {"key": "k", "value": "v", "effect": "NoSchedule"}, True),
    ([{"key": "k", "value": "other"}], {"key": "k", "value": "v", "effect": "NoSchedule"}, False),
    ([{"key": "k", "operator": "Exists"}], {"key": "k", "value": "v", "effect": "NoExecute"}, True),
    ([{"operator": "Exists"}], {"key": "any", "effect": "NoSchedule"}, True),
    ([{"key": "k", "operator": "Exists", "effect": "NoExecute"}], {"key": "k", "effect": "NoSchedule"}, False),
])
def test_tolerations(tols, taint, ok):
    assert tolerates(tols, taint) is ok


@pytest.mark.parametrize("expr, ok", [
    ({"key": "zone", "operator": "In", "values": ["a", "b"]}, True),
    ({"key": "zone", "operator": "NotIn", "values": ["a"]}, False),
    ({"key": "missing", "operator": "NotIn", "values": ["a"]}, True),
    ({"key": "zone", "operator": "Exists"}, True),
    ({"key": "zone", "operator": "DoesNotExist"}, False),
    ({"key": "gpus", "operator": "Gt", "values": ["4"]}, True),
    ({"key": "gpus", "operator": "Lt", "values": ["4"]}, False),
    ({"key": "zone", "operator": "Gt", "values": ["4"]}, False),
])
def test_node_selector_operators(expr, ok):
    n = node("n1", labels={"zone": "a", "gpus": "8"})
    assert matches_node_selector_term({"matchExpressions": [expr]}, n) is ok


def test_match_fields_and_empty_term():
    n = node("n1")
    assert matches_node_selector_term({"matchFields": [{"key": "metadata.name", "operator": "In",
                                                        "values": ["n1"]}]}, n)
    assert not matches_node_selector_term({}, n)


def test_eligibility_masks_and_reasons():
    nodes = {
        "ok": node("ok", labels={"pool": "a"}),
        "cordoned": node("cordoned", labels={"pool": "a"}, unschedulable=True),
        "tainted": node("tainted", labels={"pool": "a"}, taints=[{"key": "gpu", "effect": "NoSchedule"}]),
        "other": node("other", labels={"pool": "b"}),
        "down": node("down", labels={"pool": "a"}),
    }
    nodes["down"]["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert not node_ready(nodes["down"])
    state = ClusterState([node_spec_from_node(n) for n in nodes.values()])
    elig = Eligibility(state, nodes)
    c = constraints_of(pod("p", nodeSelector={"pool": "a"}))
    sched, taint, aff = elig.masks(c)
    assert list(sched) == [True, False, True, True, False]
    assert list(taint) == [True, True, False, True, True]
    assert list(aff) == [True, True, True, False, True]
    tol = constraints_of(pod("p", tolerations=[{"key": "gpu", "operator": "Exists"},
                                               {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}]))
    sched, taint, _ = elig.masks(tol)
    assert list(sched) == [True, True, True, True, False] and taint.all()
    assert np.array_equal(elig.masks(c)[0], elig.masks(constraints_of(pod("q", nodeSelector={"pool": "a"})))[0])


def test_time_sliced_replicas_bound_by_others_count_a_share():
    n = node("ts", gpus=8, product="Tesla-T4-SHARED", labels={"nvidia.com/gpu.replicas": "4",
                                                               "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    pods = [pod(f"r{i}", "ts", gpus=1) for i in range(5)] + [pod("two", "ts", gpus=2)]
    state, info = build_state([n], pods)
    assert not info["skipped_pods"]
    assert list(state.gpu_free[0][:2]) == [0, 250]  # 5 x 250 + 500 = 1750 of 2000 milli
    state.check_invariants()


def test_repeated_device_indices_in_an_annotation_are_not_trusted():
    """Issue 33 item 7: a foreign pod annotated with GPU "5,5,5,5" made gpupool book GPU 5 four times. Repeated
    indices are unreadable: the pod is counted on distinct devices, and no GPU is booked twice."""
    hostile = {"gpupool.io/node": "n1", "gpupool.io/gpu-index": "5,5,5,5", "gpupool.io/gpu-milli": "1000"}
    p = pod("hostile", "n1", gpus=4, annotations=hostile)
    assert annotated_devices(p) is None
    other = pod("other", "n1", gpus=1, annotations={"gpupool.io/node": "n1", "gpupool.io/gpu-index": "5",
                                                    "gpupool.io/gpu-milli": "1000"})
    state, info = build_state([node("n1", gpus=8)], [p, other])
    a = info["assignments"]
    assert len(set(a["default/hostile"].gpus)) == 4 and a["default/other"].gpus == (5,)
    assert not set(a["default/hostile"].gpus) & {5}
    assert (state.gpu_free[0] >= 0).all() and int((state.gpu_free[0] == 0).sum()) == 5
    state.check_invariants()


@pytest.mark.parametrize(("annotations", "field", "why"), [
    ({"gpupool.io/node": "n1", "gpupool.io/gpu-index": "5,5"}, "gpupool.io/gpu-index", "more than once"),
    ({"gpupool.io/node": "n1", "gpupool.io/gpu-index": "zero"}, "gpupool.io/gpu-index", "not a comma list"),
    ({"gpupool.io/node": "n1", "gpupool.io/gpu-index": "-1"}, "gpupool.io/gpu-index", "negative"),
    ({"gpupool.io/node": "n1", "gpupool.io/gpu-index": "0", "gpupool.io/gpu-milli": "half"},
     "gpupool.io/gpu-milli", "not an integer"),
    ({"gpupool.io/node": "n1", "gpupool.io/gpu-index": "0", "gpupool.io/gpu-milli": "5000"},
     "gpupool.io/gpu-milli", "outside 0..1000"),
    ({"gpupool.io/node": "n2", "gpupool.io/gpu-index": "0"}, "gpupool.io/node", "does not name the node"),
    ({"gpupool.io/gpu-index": "0"}, "gpupool.io/node", "does not name the node"),
])
def test_an_unusable_device_annotation_is_logged_once_naming_pod_and_field(annotations, field, why, caplog):
    """Issue 33 item 7: 8 of 9 kinds of malformed annotations on bound pods were accepted without a log line.
    Each is now one warning (not one per cycle) naming the pod and the annotation; the pod is still counted."""
    import uuid

    name = f"odd-{uuid.uuid4().hex[:6]}"  # warn_once remembers (pod, problem) for the process
    p = pod(name, "n1", gpus=1, annotations=annotations)
    with caplog.at_level(logging.WARNING, logger="gpupool.k8s"):
        assert annotated_devices(p) is None
        assert annotated_devices(p) is None
        state, info = build_state([node("n1", gpus=8)], [p])
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"pod default/{name}: annotation {field}=" in lines[0] and why in lines[0], lines[0]
    assert len(info["assignments"][f"default/{name}"].gpus) == 1  # still counted, on a free device
    state.check_invariants()


@pytest.mark.parametrize(("labels", "label", "then", "gpus"), [
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "four",
      "nvidia.com/gpu.count": "2"}, "nvidia.com/gpu.replicas", "using allocatable / gpu.count", 2),
    ({"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "0",
      "nvidia.com/gpu.count": "2"}, "nvidia.com/gpu.replicas", "in 1..1000", 2),
    ({"nvidia.com/gpu.count": "-8"}, "nvidia.com/gpu.count", "using allocatable", 8),
    ({"nvidia.com/gpu.sharing-strategy": "timeslicing"}, "nvidia.com/gpu.sharing-strategy", "taken as not shared", 8),
])
def test_an_unreadable_gpu_label_is_logged_once_naming_node_and_label(labels, label, then, gpus, caplog):
    """Issue 33 item 7: 6 of 9 kinds of malformed node labels were accepted without a log line. A GPU label gpupool
    reads that is present but unreadable is one warning per node and label, saying what is used instead."""
    import uuid

    name = f"odd-{uuid.uuid4().hex[:6]}"
    n = node(name, gpus=8, labels=labels)
    with caplog.at_level(logging.WARNING, logger="gpupool.k8s"):
        spec = node_spec_from_node(n)
        node_spec_from_node(n)
    lines = [r.getMessage() for r in caplog.records if name in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"node {name}: label {label}=" in lines[0] and then in lines[0], lines[0]
    assert spec.gpu_count == gpus


def test_readable_gpu_labels_log_nothing(caplog):
    good = {"nvidia.com/gpu.sharing-strategy": "time-slicing", "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81559"}
    with caplog.at_level(logging.WARNING, logger="gpupool.k8s"):
        assert node_spec_from_node(node("fine", gpus=8, labels=good)).gpu_count == 2
        node_spec_from_node(node("plain", gpus=8, labels={"nvidia.com/gpu.sharing-strategy": "none"}))
    assert [r.getMessage() for r in caplog.records if "fine" in r.getMessage() or "plain" in r.getMessage()] == []
