"""The node agent against a real kube-apiserver (marker ``real_apiserver``): deploy/agent's RBAC and
ValidatingAdmissionPolicy, the agent in-process on the FakeBackend (the recorded H200 of
``../shared/reference/nvml-h200/nvml.json`` when present, else a one-GPU stand-in).

The agent runs with a token of deploy/agent's ServiceAccount bound to a Pod object scheduled (``spec.nodeName``)
on the test's Node: the apiserver then puts ``authentication.kubernetes.io/node-name`` in the token's user
extra (ServiceAccountTokenPodNodeInfo, Kubernetes >= 1.32), exactly as for the kubelet's projected token of a
DaemonSet pod, so the admission policy's own-node rule is exercised without a kubelet.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpupool.agent.publisher import NodePublisher
from gpupool.agent.report import (
    ANN_GPU_INVENTORY,
    ANN_OWNED_LABELS,
    COND_GPU_HEALTHY,
    COND_STACK_READY,
    LABEL_STACK_READY,
    read_inventory,
)
from gpupool.k8s import wire
from gpupool.k8s.wire import drain

from . import livecluster as lc

pytestmark = pytest.mark.real_apiserver

AGENT_SA = "gpupool-agent"
POLICY = "gpupool-agent-own-node"
H200 = lc.REPO.parent / "shared" / "reference" / "nvml-h200" / "nvml.json"
GFD_PRODUCT = "NVIDIA-H200-set-by-GFD"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def _backend() -> Any:
    from gpupool.agent.fake import FakeBackend

    if H200.exists():
        return FakeBackend.from_nvml_recording(H200)
    return FakeBackend.from_dict({"driver": "580.159.04", "cuda_driver": "13.0",
                                  "gpus": [{"name": "NVIDIA H200", "memory_mib": 143771}]})


def _node_body(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": {
        lc.E2E_LABEL: "1", "kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": GFD_PRODUCT}}, "spec": {}}


def _make_node(admin: client.ApiClient, name: str) -> None:
    core = client.CoreV1Api(admin)
    drain(core.create_node(_node_body(name), _preload_content=False))
    res = {"cpu": "16", "memory": "64Gi", "pods": "110", "nvidia.com/gpu": "1"}
    now = "2026-01-01T00:00:00Z"
    drain(core.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake node (gpupool e2e)",
         "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "nodeInfo": {"containerRuntimeVersion": "containerd://2.0.0"}}}, _content_type=MERGE,
        _preload_content=False))


def _node(admin: client.ApiClient, name: str) -> dict[str, Any]:
    return json.loads(client.CoreV1Api(admin).read_node(name, _preload_content=False).data)


def _agent_pod(admin: client.ApiClient, node: str) -> dict[str, Any]:
    """A Pod from deploy/agent's DaemonSet template, on ``node``: what the DaemonSet controller would create
    (PodSecurity "restricted", RuntimeClass and Priority admission judge it as they would the real one)."""
    ds = next(o for o in lc.deploy_objects() if o["kind"] == "DaemonSet" and o["metadata"]["name"] == AGENT_SA)
    template = json.loads(json.dumps(ds["spec"]["template"]))
    template["spec"]["containers"][0]["image"] = "gpupool:0.1.0"
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"gpupool-agent-{node}", "namespace": lc.SA_NAMESPACE,
                         "labels": template["metadata"]["labels"]},
            "spec": {**template["spec"], "nodeName": node}}
    return json.loads(client.CoreV1Api(admin).create_namespaced_pod(lc.SA_NAMESPACE, body,
                                                                    _preload_content=False).data)


def _token(admin: client.ApiClient, pod: dict[str, Any] | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    resp = client.CoreV1Api(admin).create_namespaced_service_account_token(
        AGENT_SA, lc.SA_NAMESPACE, {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        _preload_content=False)
    return json.loads(resp.data)["status"]["token"]


def _client(cp: lc.ControlPlane, token: str, path: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(lc.token_kubeconfig(cp, token, path)))


def _whoami(cp: lc.ControlPlane, token: str) -> dict[str, Any]:
    code, body = cp.http("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}, token=token)
    assert code == 201, body
    return json.loads(body)["status"]["userInfo"]


def _conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (node.get("status") or {}).get("conditions") or []}


def _gpu(node: dict[str, Any], uuid_: str) -> dict[str, Any] | None:
    inv = read_inventory(node["metadata"].get("annotations"))
    return next((g for g in (inv or {}).get("gpus", []) if g.get("uuid") == uuid_), None)


@pytest.fixture
def agent_node(e2e: lc.E2E, deployed: list[str]):
    """A GPU Node (GFD's product label on it), the agent's Pod object on it, RuntimeClass nvidia."""
    name = f"e2e-agent-{uuid.uuid4().hex[:6]}"
    _make_node(e2e.admin, name)
    node_api = client.NodeV1Api(e2e.admin)
    try:  # as the GPU Operator creates it; the agent's pod names it (RuntimeClass admission needs it)
        node_api.create_runtime_class({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                                       "metadata": {"name": "nvidia"}, "handler": "nvidia"})
    except ApiException as exc:
        if exc.status != 409:
            raise
    pod = _agent_pod(e2e.admin, name)
    try:
        yield name, pod
    finally:
        try:
            drain(client.CoreV1Api(e2e.admin).delete_namespaced_pod(
                pod["metadata"]["name"], lc.SA_NAMESPACE, grace_period_seconds=0, _preload_content=False))
        except ApiException:
            pass


def _type_checked(api: client.AdmissionregistrationV1Api, name: str) -> dict[str, Any]:
    """The policy once kube-controller-manager's policy status controller has type-checked its generation."""
    def read() -> dict[str, Any] | None:
        vap = json.loads(api.read_validating_admission_policy(name, _preload_content=False).data)
        status = vap.get("status") or {}
        done = status.get("observedGeneration") == vap["metadata"]["generation"] and "typeChecking" in status
        return vap if done else None

    return lc.wait_for(read, 60, f"kube-controller-manager to type-check ValidatingAdmissionPolicy {name}",
                       interval=0.2)


def test_admission_policy_is_accepted_without_cel_errors(e2e: lc.E2E, deployed: list[str]) -> None:
    assert f"ValidatingAdmissionPolicy/{POLICY}" in deployed
    assert f"ValidatingAdmissionPolicyBinding/{POLICY}" in deployed
    api = client.AdmissionregistrationV1Api(e2e.admin)
    vap = json.loads(api.read_validating_admission_policy(POLICY, _preload_content=False).data)
    # The apiserver compiles every expression on create (a CEL syntax or undeclared-reference error is a 422,
    # shown below with a broken copy). Type checking against the Node's schema is done by
    # kube-controller-manager's policy status controller (status.typeChecking): with KCP_WITH=controller-manager
    # the policy must check without a warning, and a copy that names status.capacity directly (a map of
    # Quantity, which the checker leaves out of NodeStatus) must get one, so the check is known to be live.
    if e2e.cp.runs("kube-controller-manager"):
        vap = _type_checked(api, POLICY)
        assert vap["status"]["typeChecking"].get("expressionWarnings", []) == [], vap["status"]
        naive = json.loads(json.dumps(vap))
        naive["metadata"] = {"name": f"{POLICY}-naive"}
        naive.pop("status", None)
        naive["spec"]["validations"] = [{"expression": "object.status.capacity == oldObject.status.capacity"}]
        drain(api.create_validating_admission_policy(naive, _preload_content=False))
        try:
            warnings = _type_checked(api, naive["metadata"]["name"])["status"]["typeChecking"]["expressionWarnings"]
        finally:
            drain(api.delete_validating_admission_policy(naive["metadata"]["name"], _preload_content=False))
        assert [w["fieldRef"] for w in warnings] == ["spec.validations[0].expression"], warnings
        assert "undefined field 'capacity'" in warnings[0]["warning"], warnings
        print(f"\n[e2e] policy type-checked by kube-controller-manager: no warnings (the naive copy: "
              f"{warnings[0]['warning'].splitlines()[0]})")
    else:
        assert ((vap.get("status") or {}).get("typeChecking") or {}).get("expressionWarnings") in (None, [])
        print("\n[e2e] no kube-controller-manager (KCP_WITH): policy type checking not exercised")
    broken = json.loads(json.dumps(vap))
    broken["metadata"] = {"name": f"{POLICY}-broken"}
    broken.pop("status", None)
    broken["spec"]["validations"][0]["expression"] = "variables.nodeName == object.metadata.name &&"
    with pytest.raises(ApiException) as info:
        api.create_validating_admission_policy(broken)
    assert info.value.status == 422 and "compil" in info.value.body.lower(), info.value.body
    broken["spec"]["validations"][0]["expression"] = "variables.noSuchVariable == ''"
    with pytest.raises(ApiException) as info:
        api.create_validating_admission_policy(broken)
    assert info.value.status == 422, info.value.body
    binding = json.loads(api.read_validating_admission_policy_binding(POLICY, _preload_content=False).data)
    assert binding["spec"]["validationActions"] == ["Deny"]


def test_agent_publishes_marks_an_xid_and_recovers(e2e: lc.E2E, agent_node, tmp_path: Path) -> None:
    from gpupool.agent.cli import build_agent

    name, pod = agent_node
    token = _token(e2e.admin, pod)
    who = _whoami(e2e.cp, token)
    assert who["username"] == f"system:serviceaccount:{lc.SA_NAMESPACE}:{AGENT_SA}"
    extra = who.get("extra") or {}
    assert extra.get("authentication.kubernetes.io/node-name") == [name], extra
    print(f"\n[e2e] agent token user extra: {sorted(extra)}")

    sa = _client(e2e.cp, token, tmp_path / "agent.kubeconfig")
    backend = _backend()
    uuid0 = backend.device(0).uuid
    publisher = NodePublisher(sa, name, backoff_s=0.1)
    agent = build_agent(backend, publisher, 5.0, "mixed", host_root=str(tmp_path))
    agent.event_poll_s = 0.2
    thread = threading.Thread(target=agent.run, name="agent", daemon=True)
    thread.start()
    try:
        node = lc.wait_for(lambda: (n := _node(e2e.admin, name))["metadata"].get("annotations", {}).get(
            ANN_GPU_INVENTORY) and COND_STACK_READY in _conditions(n) and n, 20, "the agent's first report",
            detail=lambda: f"publisher: {publisher.last_error!r}, failures {publisher.failures}")
        labels = node["metadata"]["labels"]
        owned = node["metadata"]["annotations"][ANN_OWNED_LABELS].split(",")
        assert labels["nvidia.com/gpu.count"] == "1" and "nvidia.com/gpu.count" in owned
        assert labels["nvidia.com/gpu.product"] == GFD_PRODUCT  # GFD's label: untouched, not claimed
        assert "nvidia.com/gpu.product" not in owned
        assert labels[LABEL_STACK_READY] == "true", _conditions(node)[COND_STACK_READY]
        assert labels["kubernetes.io/hostname"] == name
        gpu = _gpu(node, uuid0)
        assert gpu is not None and gpu["healthy"] is True
        conds = _conditions(node)
        assert conds[COND_GPU_HEALTHY]["status"] == "True"
        assert conds[COND_STACK_READY]["status"] == "True", conds[COND_STACK_READY]
        assert conds["Ready"]["reason"] == "KubeletReady"  # the kubelet's condition is not touched
        first_transition = conds[COND_GPU_HEALTHY]["lastTransitionTime"]
        writes = publisher.writes

        # XID 79: the GPU is marked in the annotation within seconds, not at the next 5 s round.
        t0 = time.monotonic()
        backend.xid(0, 79, "GPU has fallen off the bus")
        node = lc.wait_for(lambda: (n := _node(e2e.admin, name)) and (g := _gpu(n, uuid0)) and not g["healthy"]
                           and _conditions(n)[COND_GPU_HEALTHY]["status"] == "False" and n, 10,
                           "GPU marked unhealthy after XID 79", interval=0.05)
        marked_s = time.monotonic() - t0
        lc.RESULTS["agent_xid79_marked_s"] = round(marked_s, 2)
        print(f"[e2e] XID 79 -> unhealthy on the Node in {marked_s:.2f}s")
        assert marked_s < 3.0
        cond = _conditions(node)[COND_GPU_HEALTHY]
        assert cond["reason"] and cond["message"] and cond["lastTransitionTime"] >= first_transition
        assert writes < publisher.writes

        # reset: healthy again
        t0 = time.monotonic()
        backend.reset(0)
        lc.wait_for(lambda: (n := _node(e2e.admin, name)) and (g := _gpu(n, uuid0)) and g["healthy"]
                    and _conditions(n)[COND_GPU_HEALTHY]["status"] == "True", 10, "GPU healthy after reset",
                    interval=0.05)
        lc.RESULTS["agent_reset_healthy_s"] = round(time.monotonic() - t0, 2)
        node = _node(e2e.admin, name)
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == GFD_PRODUCT
        assert publisher.failures == 0, publisher.last_error
    finally:
        agent.stop()
        thread.join(5)
    assert not thread.is_alive() and backend.closed


def test_policy_keeps_the_agent_to_its_own_node_and_fields(e2e: lc.E2E, agent_node, tmp_path: Path) -> None:
    name, pod = agent_node
    other = f"e2e-agent-other-{uuid.uuid4().hex[:6]}"
    _make_node(e2e.admin, other)
    bound = _client(e2e.cp, _token(e2e.admin, pod), tmp_path / "bound.kubeconfig")
    unbound = _client(e2e.cp, _token(e2e.admin, None), tmp_path / "unbound.kubeconfig")

    def patch(api: client.ApiClient, node: str, body: dict[str, Any], status: bool = False,
              content_type: str = MERGE) -> tuple[int, str]:
        path = "/api/v1/nodes/{name}" + ("/status" if status else "")
        try:
            wire.call(api, "PATCH", path, body, content_type=content_type, path_params={"name": node})
            return 200, ""
        except ApiException as exc:
            return exc.status, json.loads(exc.body or "{}").get("message", "")

    # The policy takes effect once the apiserver's policy informer has it (a second or two after the create that
    # the session's `deployed` fixture made): wait for the first refusal, as a cluster would be after install.
    t0 = time.monotonic()
    lc.wait_for(lambda: patch(unbound, other, {"metadata": {"labels": {"gpupool.io/probe": "1"}}})[0] == 403, 30,
                "the admission policy in effect", interval=0.2)
    print(f"\n[e2e] policy in effect after {time.monotonic() - t0:.1f}s of waiting")
    # allowed: its own node's gpupool.io/ and nvidia.com/ labels, gpupool.io/ annotations, its conditions
    assert patch(bound, name, {"metadata": {"labels": {"nvidia.com/gpu.count": "1"},
                                            "annotations": {"gpupool.io/agent-labels": "nvidia.com/gpu.count"}}}) \
        == (200, "")
    now = "2026-01-01T00:00:00Z"
    gpu_cond = {"type": COND_GPU_HEALTHY, "status": "True", "reason": "AllGpusHealthy", "message": "ok",
                "lastHeartbeatTime": now, "lastTransitionTime": now}
    assert patch(bound, name, {"status": {"conditions": [gpu_cond]}}, status=True, content_type=STRATEGIC) \
        == (200, "")
    # refused: another node; a label or annotation of someone else's; the spec; the kubelet's condition; every
    # other field of metadata and status (item 6 of issue 33). Each value differs from what the Node holds, also
    # with kube-controller-manager running (its TTL controller sets node.alpha.kubernetes.io/ttl to "0" on every
    # Node: writing "0" again changes nothing and is rightly allowed, which made an earlier version of this test
    # see 200).
    drain(client.CoreV1Api(e2e.admin).patch_node(name, {"metadata": {"annotations": {"example.com/note": "keep"}}},
                                                 _preload_content=False))
    owner = {"apiVersion": "v1", "kind": "Namespace", "name": lc.SA_NAMESPACE, "uid": str(uuid.uuid4())}
    refusals = {}
    for what, node, body, status, expect in [
            ("other node", other, {"metadata": {"labels": {"nvidia.com/gpu.count": "1"}}}, False,
             "only the Node its pod runs on"),
            ("foreign label", name, {"metadata": {"labels": {"kubernetes.io/hostname": "x"}}}, False, "labels"),
            ("remove a foreign label", name, {"metadata": {"labels": {lc.E2E_LABEL: None}}}, False, "labels"),
            ("foreign annotation", name, {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "3600"}}},
             False, "annotations"),
            ("remove a foreign annotation", name, {"metadata": {"annotations": {"example.com/note": None}}},
             False, "annotations"),
            ("ownerReferences", name, {"metadata": {"ownerReferences": [owner]}}, False, "metadata.ownerReferences"),
            ("finalizers", name, {"metadata": {"finalizers": ["example.com/hold"]}}, False, "metadata.finalizers"),
            ("spec", name, {"spec": {"unschedulable": True}}, False, "spec"),
            ("taints", name, {"spec": {"taints": [{"key": "x", "effect": "NoSchedule"}]}}, False, "spec"),
            ("providerID", name, {"spec": {"providerID": "aws:///x/i-0"}}, False, "spec"),
            ("Ready condition", name, {"status": {"conditions": [
                {"type": "Ready", "status": "False", "reason": "X", "message": "x", "lastHeartbeatTime": now,
                 "lastTransitionTime": now}]}}, True, "another condition"),
            ("allocatable", name, {"status": {"allocatable": {"nvidia.com/gpu": "8"}}}, True, "status.allocatable"),
            ("capacity", name, {"status": {"capacity": {"nvidia.com/gpu": "8"}}}, True, "status.capacity"),
            ("addresses", name, {"status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.66"}]}}, True,
             "status.addresses"),
            ("nodeInfo", name, {"status": {"nodeInfo": {"kubeletVersion": "v9.9.9"}}}, True, "status.nodeInfo"),
            ("daemonEndpoints", name, {"status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": 10999}}}}, True,
             "status.daemonEndpoints")]:
        code, msg = patch(bound, node, body, status, STRATEGIC if status else MERGE)
        refusals[what] = code
        assert code == 403 and expect in msg, (what, code, msg)
    print(f"\n[e2e] agent policy refusals: {refusals}")
    # a token not bound to a pod on a node: reads, but writes nothing
    assert _node(unbound, name)["metadata"]["name"] == name
    code, msg = patch(unbound, name, {"metadata": {"labels": {"nvidia.com/gpu.count": "2"}}})
    assert code in (403, 422) and "only the Node its pod runs on" in msg, (code, msg)
    # RBAC: no create, no delete, no list of nodes; runtimeclasses list
    core = client.CoreV1Api(bound)
    for verb, fn in (("delete", lambda: core.delete_node(other)), ("list", lambda: core.list_node())):
        with pytest.raises(ApiException) as info:
            fn()
        assert info.value.status == 403, verb
    client.NodeV1Api(bound).list_runtime_class()
    after = _node(e2e.admin, name)
    assert after["metadata"]["labels"]["kubernetes.io/hostname"] == name
    assert not after["spec"].get("unschedulable")
    assert _conditions(after)["Ready"]["status"] == "True"
    assert after["metadata"]["annotations"]["example.com/note"] == "keep"
    assert not after["metadata"].get("ownerReferences") and not after["metadata"].get("finalizers")
    assert not after["status"].get("addresses") and after["status"]["capacity"]["nvidia.com/gpu"] == "1"
