"""`kubectl get queues` / `kubectl get podgroups` on a real kube-apiserver: deploy/'s CRDs print the status
:class:`gpupool.k8s.status.StatusWriter` writes (with the ServiceAccount's RBAC) in their columns.

The columns are the CRDs' additionalPrinterColumns, evaluated by the apiserver (the Table API, which is what
kubectl prints); kubectl's own output is checked too where a kubectl binary is on the PATH.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s.state import ClusterModel
from gpupool.k8s.status import StatusWriter

from . import livecluster as lc
from .livecluster import E2E

pytestmark = pytest.mark.real_apiserver

TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io"


def table(api: client.ApiClient, path: str, wide: bool = False) -> dict[str, dict[str, Any]]:
    """GET ``path`` as a meta.k8s.io Table: row name -> {column name: cell} (``wide``: priority > 0 columns too)."""
    query = [("includeObject", "None")]
    method, url, headers, body, post = api.param_serialize(method="GET", resource_path=path, query_params=query,
                                                            header_params={"Accept": TABLE},
                                                            auth_settings=["BearerToken"])
    resp = api.call_api(method, url, header_params=headers, body=body, post_params=post, _request_timeout=10)
    data = json.loads(resp.read())
    assert data["kind"] == "Table", data
    cols = data["columnDefinitions"]
    out = {}
    for row in data["rows"]:
        cells = {c["name"]: v for c, v in zip(cols, row["cells"], strict=True) if wide or not c.get("priority")}
        out[cells["Name"]] = cells
    return out


def kubectl(e2e: E2E, *args: str) -> list[dict[str, str]] | None:
    """``kubectl get ARGS`` with the admin kubeconfig, parsed by its header; None without kubectl."""
    exe = shutil.which("kubectl")
    if exe is None:
        return None
    out = subprocess.run([exe, "--kubeconfig", str(e2e.cp.kubeconfig), "get", *args], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split(), strict=False)) for line in lines[1:]]


def model_from_api(e2e: E2E) -> ClusterModel:
    """A ClusterModel fed with what the API holds now (what the live scheduler's reflectors list)."""
    api, custom = e2e.admin, client.CustomObjectsApi(e2e.admin)
    m = ClusterModel(lc.SCHEDULER_NAME)
    m.replace("nodes", [n for n in lc.list_nodes(api) if n["metadata"].get("labels", {}).get(lc.E2E_LABEL)])
    m.replace("pods", lc.list_pods(api, e2e.ns))
    m.replace("queues", [q for q in custom.list_cluster_custom_object("gpupool.io", "v1alpha1", "queues")["items"]
                         if q["metadata"].get("labels", {}).get(lc.E2E_LABEL)])
    m.replace("podgroups", custom.list_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", e2e.ns,
                                                                "podgroups")["items"])
    m.replace("volcanopodgroups", None)
    m.refresh()
    return m


def run_pod(e2e: E2E, name: str, node: str | None, gpus: int = 1, phase: str = "Running",
            labels: dict[str, str] | None = None) -> None:
    """A pod bound to ``node`` (spec.nodeName at creation, as after a binding) in ``phase`` (written through
    pods/status, as a kubelet would); ``node`` None: a pod waiting for gpupool."""
    body = lc.pod_body(name, e2e.ns, gpus=gpus, labels=labels)
    if node:
        body["spec"]["nodeName"] = node
    lc.create_pod(e2e.admin, body)
    if node:
        lc.drain(client.CoreV1Api(e2e.admin).patch_namespaced_pod_status(
            name, e2e.ns, {"status": {"phase": phase}}, _preload_content=False))


def test_queue_and_podgroup_columns_show_the_status_written(e2e: E2E, deployed: list[str]) -> None:
    api, ns = e2e.admin, e2e.ns
    lc.make_node(api, "e2e-status-a", gpus=8)
    lc.create_queue(api, "e2e-st-root", {"quota": 4})
    lc.create_queue(api, "e2e-st-a", {"quota": 1, "limit": 6, "weight": 2, "parent": "e2e-st-root"})
    lc.create_pod_group(api, ns, "e2e-gang", 2)
    lc.create_pod_group(api, ns, "e2e-wait", 3)
    custom = client.CustomObjectsApi(api)
    custom.patch_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", ns, "podgroups", "e2e-gang",
                                          {"metadata": {"annotations": {"gpupool.io/max-member": "4"}}})
    team = {"kueue.x-k8s.io/queue-name": "e2e-st-a"}
    for i in range(3):
        run_pod(e2e, f"a{i}", "e2e-status-a", labels=team)
    run_pod(e2e, "wait-a", None, gpus=2, labels=team)
    for i in range(2):
        run_pod(e2e, f"g{i}", "e2e-status-a", gpus=0, labels={"scheduling.x-k8s.io/pod-group": "e2e-gang"})
    run_pod(e2e, "w0", None, gpus=0, labels={"scheduling.x-k8s.io/pod-group": "e2e-wait"})

    m = model_from_api(e2e)
    writer = StatusWriter(e2e.sa_client, lambda fn: fn(), 1.0)  # the scheduler's ServiceAccount: its RBAC
    assert writer.update(m, {"e2e-st-a": 2.5, "e2e-st-root": 4}) == 4
    assert writer.failures == 0 and writer.writes == 4

    queues = lc.wait_for(lambda: (t := table(api, "/apis/gpupool.io/v1alpha1/queues", wide=True))
                         .get("e2e-st-a", {}).get("Allocated") is not None and t, 10, "queue columns")
    a, root = queues["e2e-st-a"], queues["e2e-st-root"]
    assert (a["Parent"], a["Quota"], a["Limit"], a["Weight"]) == ("e2e-st-root", 1, 6, 2)
    assert (a["Allocated"], a["FairShare"], a["Borrowed"], a["Pending"]) == (3, 2.5, 2, 1)
    assert (a["PendingGPUs"], a["Pods"], a["Priority"]) == (2, 3, 0)
    assert (root["Allocated"], root["FairShare"], root["Borrowed"], root["Pending"]) == (3, 4, 0, 0)
    assert a["Age"]
    groups = table(api, f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups", wide=True)
    gang, wait = groups["e2e-gang"], groups["e2e-wait"]
    assert (gang["Phase"], gang["MinMember"], gang["Scheduled"], gang["Running"]) == ("Running", 2, 2, 2)
    assert (gang["Succeeded"], gang["Failed"], gang["MaxMember"]) == (0, 0, "4")
    assert (wait["Phase"], wait["MinMember"], wait["Scheduled"], wait["Running"]) == ("Pending", 3, 0, 0)

    # kubectl prints the same (default columns)
    rows = kubectl(e2e, "queues", "-l", f"{lc.E2E_LABEL}=1")
    if rows is not None:
        row = next(r for r in rows if r["NAME"] == "e2e-st-a")
        assert list(row)[:10] == ["NAME", "PARENT", "QUOTA", "LIMIT", "WEIGHT", "ALLOCATED", "FAIRSHARE", "BORROWED",
                                  "PENDING", "AGE"]
        assert (row["ALLOCATED"], row["FAIRSHARE"], row["BORROWED"], row["PENDING"]) == ("3", "2.5", "2", "1")
        rows = kubectl(e2e, "podgroups", "-n", ns)
        row = next(r for r in rows if r["NAME"] == "e2e-gang")
        assert list(row) == ["NAME", "PHASE", "MINMEMBER", "SCHEDULED", "RUNNING", "SUCCEEDED", "FAILED", "AGE"]
        assert (row["PHASE"], row["MINMEMBER"], row["SCHEDULED"], row["RUNNING"]) == ("Running", "2", "2", "2")

    # a member finishes, the pool is off: the next round sends only that; FairShare is cleared
    lc.drain(client.CoreV1Api(api).patch_namespaced_pod_status("g0", ns, {"status": {"phase": "Succeeded"}},
                                                               _preload_content=False))
    m = model_from_api(e2e)
    assert writer.update(m, None, force=True) == 3  # e2e-gang, and fairShareGPUs cleared on both queues
    groups = table(api, f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups")
    assert (groups["e2e-gang"]["Phase"], groups["e2e-gang"]["Running"], groups["e2e-gang"]["Succeeded"]) == \
        ("Running", 1, 1)
    queues = table(api, "/apis/gpupool.io/v1alpha1/queues")
    assert queues["e2e-st-a"]["FairShare"] is None and queues["e2e-st-a"]["Allocated"] == 3
    q = custom.get_cluster_custom_object("gpupool.io", "v1alpha1", "queues", "e2e-st-a")
    assert "fairShareGPUs" not in q["status"] and q["status"]["conditions"][0]["type"] == "Valid"
    # a new writer (a new leader) on the same objects writes nothing: the statuses are right already
    again = StatusWriter(e2e.sa_client, lambda fn: fn(), 1.0)
    assert again.update(model_from_api(e2e), None) == 0


def test_service_account_may_write_status_and_evict(e2e: E2E, deployed: list[str]) -> None:
    """deploy/rbac.yaml grants what pool mode needs: PodGroup status (both APIs), evictions, PDB reads."""
    authz = client.AuthorizationV1Api(e2e.sa_client)

    def can(verb: str, resource: str, group: str = "", sub: str = "") -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group, "subresource": sub, "namespace": e2e.ns}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        resp = authz.create_self_subject_access_review(body, _preload_content=False)
        return bool(json.loads(resp.data)["status"].get("allowed"))

    needed = [("patch", "podgroups", "scheduling.x-k8s.io", "status"),
              ("patch", "podgroups", "scheduling.volcano.sh", "status"),
              ("patch", "queues", "gpupool.io", "status"), ("create", "pods", "", "eviction"),
              ("list", "poddisruptionbudgets", "policy"), ("watch", "poddisruptionbudgets", "policy")]
    assert not [n for n in needed if not can(*n)], "deploy/rbac.yaml lacks a grant"
    extra = [("delete", "pods"), ("update", "podgroups", "scheduling.x-k8s.io"),
             ("patch", "podgroups", "scheduling.volcano.sh"), ("delete", "poddisruptionbudgets", "policy"),
             ("update", "podgroups", "scheduling.x-k8s.io", "status")]
    assert not [n for n in extra if can(*n)], "deploy/rbac.yaml grants more than pool mode needs"
