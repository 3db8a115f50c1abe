"""The kube-scheduler extender's bind against a real kube-apiserver (marker ``real_apiserver``), with the token of
deploy/'s ServiceAccount, which has no ``pods patch`` since the extender's Binding carries the device annotations
(issue 33 items 3 and 4): the API server copies them onto the pod in the binding's one update; pods of another
scheduler, and pods already bound, are refused; two binds of one pod at once bind it once.
"""

from __future__ import annotations

import json
import threading

import pytest
from kubernetes import client

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.extender import Extender, NodeCache

from . import livecluster as lc
from .livecluster import E2E

pytestmark = pytest.mark.real_apiserver

PROFILE = "gpupool-extender-e2e"  # the kube-scheduler profile that would call this extender


def _pod(e2e: E2E, name: str, scheduler: str = PROFILE) -> dict:
    body = lc.pod_body(name, e2e.ns)
    body["spec"]["schedulerName"] = scheduler
    lc.create_pod(e2e.admin, body)
    return json.loads(client.CoreV1Api(e2e.admin).read_namespaced_pod(name, e2e.ns, _preload_content=False).data)


def test_extender_binds_through_the_binding_alone(e2e: E2E) -> None:
    lc.make_node(e2e.admin, "ext-a", gpus=2)
    core = client.CoreV1Api(e2e.sa_client)  # deploy/'s ServiceAccount: pods get/list/watch, pods/binding create
    cache = NodeCache(core)
    cache.refresh()
    ext = Extender(cache, core, scheduler_names=[PROFILE])
    mine = _pod(e2e, "ext-1")
    theirs = _pod(e2e, "ext-other", scheduler=lc.SCHEDULER_NAME)

    def bind(pod: dict, node: str = "ext-a") -> str:
        return ext.bind({"PodName": pod["metadata"]["name"], "PodNamespace": e2e.ns,
                         "PodUID": pod["metadata"]["uid"], "Node": node})["Error"]

    assert bind(mine) == ""
    stored = json.loads(core.read_namespaced_pod("ext-1", e2e.ns, _preload_content=False).data)
    ann = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "ext-a" == ann[ANN_NODE]  # copied by the API server from the Binding
    assert (ann[ANN_GPU_INDEX], ann[ANN_GPU_MILLI]) == ("0", "1000")
    assert "already bound to ext-a" in bind(mine)
    assert f"spec.schedulerName '{lc.SCHEDULER_NAME}' is not served" in bind(theirs)
    assert "nodeName" not in json.loads(core.read_namespaced_pod("ext-other", e2e.ns,
                                                                 _preload_content=False).data)["spec"]

    # two binds of one pod at once (kube-scheduler retrying, or a replayed request): bound once, annotated
    racer = _pod(e2e, "ext-2")
    answers: list[str] = []
    go = threading.Barrier(2)

    def race() -> None:
        go.wait()
        answers.append(bind(racer))

    threads = [threading.Thread(target=race) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(a == "" for a in answers) == [False, True], answers
    stored = json.loads(core.read_namespaced_pod("ext-2", e2e.ns, _preload_content=False).data)
    assert stored["spec"]["nodeName"] == "ext-a" == stored["metadata"]["annotations"][ANN_NODE]
    assert stored["metadata"]["annotations"][ANN_GPU_INDEX] == "1"  # the other GPU; ext-1 holds GPU 0
    violations, _ = lc.gpu_violations(e2e.admin)
    assert violations == []
