"""Pods in every spelling gpupool reads -> PodRequest, and the exact message for each malformed one."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.k8s.requests import (
    RequestParseError,
    describe_pod,
    is_waiting_for,
    parse_pod,
    parse_pod_group,
    parse_queue,
    pod_group_of,
    pod_resources,
    queue_of,
)
from gpupool.model import GpupoolError


def pod(name: str = "p", *, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
        annotations: dict[str, str] | None = None, labels: dict[str, str] | None = None, ns: str = "ml",
        **spec: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {}, "labels": labels or {},
                         "creationTimestamp": "2025-01-02T03:04:05Z"},
            "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "resources": resources}], **spec},
            "status": {"phase": "Pending"}}


def shape(p: dict[str, Any]) -> tuple[int, int, int]:
    r = parse_pod(p)
    return r.num_gpu, r.gpu_milli, r.gpu_memory_mib


# ------------------------------------------------------------------ spellings that parse
@pytest.mark.parametrize("case, expected", [
    # nvidia.com/gpu: whole GPUs (limits alone count as the request)
    (pod(limits={"nvidia.com/gpu": "2"}), (2, 1000, 0)),
    (pod(limits={"nvidia.com/gpu": 1}), (1, 1000, 0)),
    (pod(requests={"nvidia.com/gpu": "1"}, limits={"nvidia.com/gpu": "1"}), (1, 1000, 0)),
    (pod(limits={"nvidia.com/gpu": "0"}), (0, 0, 0)),
    # KAI
    (pod(annotations={"gpu-fraction": "0.25"}), (1, 250, 0)),
    (pod(annotations={"gpu-fraction": "1"}), (1, 1000, 0)),
    (pod(annotations={"gpu-fraction": "1.0", "gpu-fraction-num-devices": "2"}), (2, 1000, 0)),
    (pod(annotations={"gpu-fraction": "0.0001"}), (1, 1, 0)),
    (pod(annotations={"gpu-memory": "2000"}), (1, 1, 2000)),
    (pod(annotations={"gpu-memory": "20Gi"}), (1, 1, 20480)),
    # HAMi
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "20000"}), (1, 300, 20000)),
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}), (1, 500, 0)),
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096"}), (1, 1, 4096)),
    (pod(limits={"nvidia.com/gpu": "2", "nvidia.com/gpucores": "100"}), (2, 1000, 0)),
    (pod(limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20", "nvidia.com/gpumem-percentage": "40"}),
     (1, 400, 0)),
    # Volcano vGPU
    (pod(limits={"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-cores": "50", "volcano.sh/vgpu-memory": "8000"}),
     (1, 500, 8000)),
    # Alibaba (openb trace)
    (pod(annotations={"alibabacloud.com/gpu-milli": "600"}), (1, 600, 0)),
    (pod(annotations={"alibabacloud.com/gpu-milli": "1000", "alibabacloud.com/gpu-count": "4"}), (4, 1000, 0)),
    # MIG: no GPU share, counted per node
    (pod(limits={"nvidia.com/mig-1g.10gb": "1"}), (0, 0, 0)),
    # CPU only
    (pod(requests={"cpu": "500m", "memory": "1Gi"}), (0, 0, 0)),
], ids=lambda x: None)
def test_spellings(case, expected):
    assert shape(case) == expected


def test_request_fields_and_name():
    p = pod("nb", requests={"cpu": "1500m", "memory": "1.5Gi"}, annotations={"gpu-fraction": "0.5"},
            labels={"team": "a"}, priority=100)
    p["status"]["qosClass"] = "Burstable"
    r = parse_pod(p)
    assert r.name == "ml/nb" and r.cpu_milli == 1500 and r.memory_mib == 1536
    assert r.priority == 100 and r.qos == "Burstable" and r.labels == (("team", "a"),)
    assert r.creation_time == pytest.approx(1735787045.0)


def test_priority_of_a_builtin_class_without_spec_priority():
    """spec.priority wins; without it (no admission) the built-in classes keep their values, others are 0."""
    assert parse_pod(pod(priorityClassName="system-cluster-critical")).priority == 2_000_000_000
    assert parse_pod(pod(priorityClassName="system-node-critical")).priority == 2_000_001_000
    assert parse_pod(pod(priorityClassName="system-cluster-critical", priority=7)).priority == 7
    assert parse_pod(pod(priorityClassName="team-high")).priority == 0


def test_effective_request_follows_kube_scheduler():
    p = pod(requests={"cpu": "1", "memory": "1Gi"}, limits={"nvidia.com/gpu": "1"})
    p["spec"]["containers"].append({"name": "side", "resources": {"requests": {"cpu": "500m"}}})
    p["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"cpu": "4", "memory": "512Mi"}}},  # runs alone first
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": {"cpu": "250m"}}},  # sidecar
    ]
    p["spec"]["overhead"] = {"cpu": "100m"}
    res = pod_resources(p)
    assert float(res["cpu"]) == pytest.approx(4.1)  # max(1 + 0.5 + 0.25, 4) + 0.1
    assert parse_pod(p).memory_mib == 1024


def test_gpu_model_annotation_resolves_catalog_names():
    ann = {"gpupool.io/gpu-model": "NVIDIA-H100-80GB-HBM3, A100-80GB"}
    r = parse_pod(pod(limits={"nvidia.com/gpu": "1"}, annotations=ann))
    assert r.gpu_spec == ("H100", "A100-80GB")


def test_describe_pod_mig_gang_queue():
    info = describe_pod(pod(limits={"nvidia.com/mig-3g.40gb": "1"}, labels={"kueue.x-k8s.io/queue-name": "team-a",
                                                                            "scheduling.x-k8s.io/pod-group": "job"}))
    assert info.mig == (("3g.40gb", 1),) and info.queue == "team-a" and info.pod_group == "ml/job"
    assert info.gpu_milli_total == 3 * 1000 // 7


@pytest.mark.parametrize("meta, group", [
    ({"labels": {"scheduling.x-k8s.io/pod-group": "g"}}, "ml/g"),
    ({"annotations": {"scheduling.k8s.io/group-name": "v"}}, "ml/v"),
    ({"annotations": {"scheduling.volcano.sh/group-name": "v2"}}, "ml/v2"),
    ({"annotations": {"pod-group-name": "k"}}, "ml/k"),
    ({}, None),
])
def test_pod_group_spellings(meta, group):
    p = pod(**{})
    p["metadata"].update(meta)
    assert pod_group_of(p) == group


@pytest.mark.parametrize("meta, queue", [
    ({"labels": {"kueue.x-k8s.io/queue-name": "a"}}, "a"),
    ({"labels": {"kai.scheduler/queue": "b"}}, "b"),
    ({"labels": {"runai/queue": "c"}}, "c"),
    ({"annotations": {"scheduling.volcano.sh/queue-name": "d"}}, "d"),
    ({}, None),
])
def test_queue_spellings(meta, queue):
    p = pod()
    p["metadata"].update(meta)
    assert queue_of(p) == queue


def test_min_member_annotations():
    assert describe_pod(pod(annotations={"gpupool.io/min-member": "3"})).min_member == 3
    assert describe_pod(pod(annotations={"kai.scheduler/batch-min-member": "2"})).min_member == 2


# ------------------------------------------------------------------ malformed: exact messages
@pytest.mark.parametrize("case, message", [
    (pod("a", annotations={"gpu-fraction": "1.5"}),
     'pod ml/a: annotation gpu-fraction="1.5": must be a number in (0, 1]'),
    (pod("a", annotations={"gpu-fraction": "abc"}),
     'pod ml/a: annotation gpu-fraction="abc": must be a number in (0, 1]'),
    (pod("a", annotations={"gpu-fraction": "0"}),
     'pod ml/a: annotation gpu-fraction="0": must be a number in (0, 1]'),
    (pod("a", annotations={"gpu-fraction": "nan"}),
     'pod ml/a: annotation gpu-fraction="nan": must be a number in (0, 1]'),
    (pod("a", annotations={"gpu-fraction": "0.5", "gpu-fraction-num-devices": "two"}),
     'pod ml/a: annotation gpu-fraction-num-devices="two": must be a whole number >= 1'),
    (pod("a", annotations={"gpu-memory": "lots"}),
     'pod ml/a: annotation gpu-memory="lots": "lots" is not a Kubernetes quantity'),
    (pod("a", annotations={"gpu-memory": "0"}),
     'pod ml/a: annotation gpu-memory="0": must be a positive amount of MiB'),
    (pod("a", annotations={"gpu-fraction": "0.5", "gpu-memory": "100"}),
     "pod ml/a: annotations gpu-fraction and gpu-memory are both set: give one"),
    (pod("a", annotations={"gpu-fraction": "0.5"}, limits={"nvidia.com/gpu": "1"}),
     'pod ml/a: annotation gpu-fraction together with resources["nvidia.com/gpu"]: a fractional (KAI) pod must '
     'not also ask for whole GPUs'),
    (pod("a", limits={"nvidia.com/gpu": "1.5"}),
     'pod ml/a: resources["nvidia.com/gpu"]: "1.5" is not a whole number'),
    (pod("a", limits={"nvidia.com/gpu": "many"}),
     'pod ml/a: spec.containers[0].resources.limits["nvidia.com/gpu"]: "many" is not a Kubernetes quantity'),
    (pod("a", requests={"cpu": "-1"}),
     'pod ml/a: spec.containers[0].resources.requests["cpu"]: "-1" is negative'),
    (pod("a", limits={"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}),
     'pod ml/a: spec.containers[0].resources["nvidia.com/gpucores"]=150: must be a percentage in 1..100'),
    (pod("a", limits={"nvidia.com/gpumem": "1000"}),
     'pod ml/a: spec.containers[0].resources["nvidia.com/gpumem"] given without resources["nvidia.com/gpu"]'),
    (pod("a", limits={"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}),
     'pod ml/a: resources["nvidia.com/gpu"] together with nvidia.com/mig-* resources: ask for one or the other'),
    (pod("a", limits={"nvidia.com/mig-huge": "1"}),
     'pod ml/a: resources["nvidia.com/mig-huge"]: "huge" is not a MIG profile like 1g.10gb'),
    (pod("a", limits={"nvidia.com/mig-1g.10gb": "1"}, annotations={"gpu-fraction": "0.5"}),
     "pod ml/a: conflicting GPU requests: nvidia.com/mig-* resources and annotation gpu-fraction/gpu-memory (KAI); "
     "use one spelling"),
    (pod("a", annotations={"alibabacloud.com/gpu-milli": "1200"}),
     'pod ml/a: annotation alibabacloud.com/gpu-milli="1200": must be in 1..1000'),
    (pod("a", annotations={"gpupool.io/min-member": "0"}),
     'pod ml/a: annotation gpupool.io/min-member="0": must be >= 1'),
    (pod("a", annotations={"gpupool.io/gpu-model": " , "}, limits={"nvidia.com/gpu": "1"}),
     'pod ml/a: annotation gpupool.io/gpu-model=" , ": no GPU model named'),
    (pod("a", priority="high"), "pod ml/a: spec.priority='high': not an integer"),
], ids=lambda x: None)
def test_malformed_requests_say_exactly_what_is_wrong(case, message):
    with pytest.raises(RequestParseError) as err:
        parse_pod(case)
    assert str(err.value) == message
    assert isinstance(err.value, GpupoolError) and isinstance(err.value, ValueError)


def test_is_waiting_for():
    assert is_waiting_for(pod(), "gpupool")
    assert not is_waiting_for(pod(), "other")
    assert not is_waiting_for(pod(nodeName="n1"), "gpupool")
    assert not is_waiting_for(pod(schedulingGates=[{"name": "g"}]), "gpupool")
    gone = pod()
    gone["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert not is_waiting_for(gone, "gpupool")
    default = pod()
    del default["spec"]["schedulerName"]
    assert is_waiting_for(default, "default-scheduler")


# ------------------------------------------------------------------ PodGroups and Queues
def test_parse_pod_group():
    obj = {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
           "metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": 4}}
    assert parse_pod_group(obj) == ("ml/g", 4)
    obj["spec"]["minMember"] = "four"
    with pytest.raises(RequestParseError, match=r"PodGroup ml/g: spec.minMember='four': must be a whole number >= 1"):
        parse_pod_group(obj)


def test_parse_queue():
    q = parse_queue({"metadata": {"name": "a"}, "spec": {"quota": 2.5, "limit": 8, "weight": 2, "parent": "root",
                                                         "priority": 3}})
    assert (q.name, q.quota_milli, q.limit_milli, q.weight, q.parent, q.priority) == ("a", 2500, 8000, 2.0, "root", 3)
    assert parse_queue({"metadata": {"name": "b"}, "spec": {"limit": -1}}).limit_milli is None
    assert parse_queue({"metadata": {"name": "c"}, "spec": {"limit": "500m"}}).limit_milli == 500
    with pytest.raises(RequestParseError, match=r"Queue d: spec.limit=-3: must be >= 0 \(or -1 for unlimited\)"):
        parse_queue({"metadata": {"name": "d"}, "spec": {"limit": -3}})
    with pytest.raises(RequestParseError, match=r"Queue e: spec.weight='x': not a number"):
        parse_queue({"metadata": {"name": "e"}, "spec": {"weight": "x"}})


def test_volcano_vgpu_with_nvidia_gpu_is_a_conflict():
    from gpupool.k8s.requests import RequestParseError, describe_pod

    p = {"metadata": {"name": "v", "namespace": "default"},
         "spec": {"containers": [{"name": "c", "resources": {"limits": {"volcano.sh/vgpu-number": "1",
                                                                         "nvidia.com/gpu": "3"}}}]}}
    with pytest.raises(RequestParseError, match="conflicting GPU requests: volcano.sh/vgpu"):
        describe_pod(p)
