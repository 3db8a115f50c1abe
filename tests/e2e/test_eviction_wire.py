"""The Eviction API and PodDisruptionBudgets on a real kube-apiserver, checked by the same function that checks the
mock (``tests/test_k8s_eviction.py`` runs :func:`check_eviction_wire` against kmock): the mock answers as the
real server does.

Two worlds, one set of checks. With only the API server (and on the mock) no disruption controller runs: a PDB's
status is written by hand, as that controller would (``observedGeneration``, ``disruptionsAllowed``,
``currentHealthy`` / ``desiredHealthy``). With ``KCP_WITH=controller-manager`` the real disruption controller
computes it from the pods' Ready conditions, and writing it by hand would race with it: the checks then arrange
the pods so that the controller's numbers are the ones wanted, and wait for them. The pods are bound to a node
name with no Node object, so no kubelet (nor kubelet-sim, which serves the nodes it lists) touches them: a
Terminating pod stays until a grace-0 delete.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.wire import MERGE_PATCH, STRATEGIC_PATCH, call

pytestmark = pytest.mark.real_apiserver

PDB_MESSAGE = "Cannot evict pod as it would violate the pod's disruption budget."
NODE = "e2e-evict-node"  # bindings do not check that the node exists


# ------------------------------------------------------------------ helpers on any API server (real or mock)
def _pod_body(name: str, ns: str, labels: dict[str, str], grace: int | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "gpupool",
                            "containers": [{"name": "main", "image": "busybox",
                                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": spec}


def _get(api: client.ApiClient, path: str, **params: str) -> dict[str, Any] | None:
    try:
        return json.loads(call(api, "GET", path, path_params=params))
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pod(api: client.ApiClient, ns: str, name: str) -> dict[str, Any] | None:
    return _get(api, "/api/v1/namespaces/{ns}/pods/{name}", ns=ns, name=name)


def pdb(api: client.ApiClient, ns: str, name: str) -> dict[str, Any]:
    got = _get(api, "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}", ns=ns, name=name)
    assert got is not None
    return got


def make_pod(api: client.ApiClient, ns: str, name: str, labels: dict[str, str], grace: int | None = 30,
             running: bool = True, ready: bool = True) -> dict[str, Any]:
    """Create a pod; ``running``: bind it to a node and set it Running (and Ready), as scheduler and kubelet
    would. Returns the pod as the API server has it then."""
    call(api, "POST", "/api/v1/namespaces/{ns}/pods", _pod_body(name, ns, labels, grace), path_params={"ns": ns})
    if running:
        call(api, "POST", "/api/v1/namespaces/{ns}/pods/{name}/binding",
             {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns},
              "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}, path_params={"ns": ns, "name": name})
        conds = [{"type": "Ready", "status": "True" if ready else "False"}]
        call(api, "PATCH", "/api/v1/namespaces/{ns}/pods/{name}/status",
             {"status": {"phase": "Running", "conditions": conds}}, content_type=STRATEGIC_PATCH,
             path_params={"ns": ns, "name": name})
    got = pod(api, ns, name)
    assert got is not None
    return got


def make_pdb(api: client.ApiClient, ns: str, name: str, labels: dict[str, str]) -> dict[str, Any]:
    body = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": name, "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}}
    return json.loads(call(api, "POST", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body,
                           path_params={"ns": ns}))


def set_pdb_status(api: client.ApiClient, ns: str, name: str, allowed: int, current: int = 2, desired: int = 2,
                   observed: int | None = None) -> None:
    """What the disruption controller writes (``observed``: the generation it saw; default the current one)."""
    if observed is None:
        observed = int(pdb(api, ns, name)["metadata"].get("generation") or 1)
    status = {"observedGeneration": observed, "disruptionsAllowed": allowed, "currentHealthy": current,
              "desiredHealthy": desired, "expectedPods": current}
    call(api, "PATCH", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}/status", {"status": status},
         content_type=MERGE_PATCH, path_params={"ns": ns, "name": name})


def set_ready(api: client.ApiClient, ns: str, name: str, ready: bool) -> None:
    """The pod's Ready condition, as its kubelet reports it (the disruption controller counts Ready pods)."""
    call(api, "PATCH", "/api/v1/namespaces/{ns}/pods/{name}/status",
         {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}},
         content_type=STRATEGIC_PATCH, path_params={"ns": ns, "name": name})


def budget(api: client.ApiClient, ns: str, name: str, controller: bool, allowed: int, current: int,
           desired: int, timeout: float = 30.0) -> dict[str, Any]:
    """The PDB's status at (allowed, current healthy, desired healthy), observed at its current generation.

    Without a disruption controller it is written as that controller would; with one (``controller``) the pods
    must already make these numbers, and this waits (polls, ``timeout`` s) until the controller published them.
    Returns the status. AssertionError naming the last status seen on timeout."""
    if not controller:
        set_pdb_status(api, ns, name, allowed, current=current, desired=desired)
        return pdb(api, ns, name)["status"]
    want = {"disruptionsAllowed": allowed, "currentHealthy": current, "desiredHealthy": desired}
    deadline = time.monotonic() + timeout
    while True:
        got = pdb(api, ns, name)
        st = got.get("status") or {}
        if st.get("observedGeneration") == got["metadata"].get("generation") and all(
                st.get(k) == v for k, v in want.items()):
            return st
        assert time.monotonic() < deadline, f"PDB {ns}/{name}: the disruption controller never wrote {want}: {st}"
        time.sleep(0.1)


def evict(api: client.ApiClient, ns: str, name: str, uid: str | None = None, dry_run: bool = False,
          body_name: str | None = None) -> tuple[int, dict[str, Any]]:
    """POST a policy/v1 Eviction; returns (HTTP status, body)."""
    options: dict[str, Any] = {}
    if dry_run:
        options["dryRun"] = ["All"]
    if uid:
        options["preconditions"] = {"uid": uid}
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": body_name or name, "namespace": ns}, "deleteOptions": options}
    try:
        data = call(api, "POST", "/api/v1/namespaces/{ns}/pods/{name}/eviction", body,
                    path_params={"ns": ns, "name": name})
        return 201, json.loads(data or b"{}")
    except ApiException as exc:
        return int(exc.status), json.loads(exc.body or "{}")


def delete(api: client.ApiClient, ns: str, name: str, grace: int | None = None) -> int:
    body = {} if grace is None else {"gracePeriodSeconds": grace}
    try:
        call(api, "DELETE", "/api/v1/namespaces/{ns}/pods/{name}", body, path_params={"ns": ns, "name": name})
        return 200
    except ApiException as exc:
        return int(exc.status)


def _cond(p: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    return next((c for c in ((p or {}).get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def _causes(body: dict[str, Any]) -> list[str]:
    return [c.get("message", "") for c in (body.get("details") or {}).get("causes") or []]


# ------------------------------------------------------------------ the checks, shared with the mock
def check_eviction_wire(api: client.ApiClient, ns: str, controller: bool = False) -> dict[str, Any]:
    """Every eviction / PDB / delete behaviour gpupool depends on; asserts each, returns what was seen.

    ``controller``: a disruption controller runs (kube-controller-manager) and computes the PDBs' status."""
    seen: dict[str, Any] = {}
    app = {"app": "train"}
    v1 = make_pod(api, ns, "v1", app)
    make_pdb(api, ns, "budget", app)
    # by hand: two healthy of two wanted; with the controller, minAvailable 1 over the one Ready pod v1
    healthy = 1 if controller else 2

    # 1. A PDB the disruption controller has not processed yet (observedGeneration < generation): 429. With a
    #    controller running it may have processed it already: 429 all the same (its one pod is needed).
    status, body = evict(api, ns, "v1", uid=v1["metadata"]["uid"], dry_run=True)
    seen["unprocessed"] = (status, body.get("message"), _causes(body))
    assert status == 429 and body.get("message") == PDB_MESSAGE and body.get("reason") == "TooManyRequests", body
    assert any("is still being processed" in c for c in _causes(body)) or (
        controller and _causes(body) == ["The disruption budget budget needs 1 healthy pods and has 1 currently"]), body

    # 2. Processed, no disruption allowed: 429 naming the budget's health.
    budget(api, ns, "budget", controller, allowed=0, current=healthy, desired=healthy)
    status, body = evict(api, ns, "v1", uid=v1["metadata"]["uid"], dry_run=True)
    seen["zero_allowed"] = (status, body.get("message"), _causes(body))
    assert status == 429 and body.get("message") == PDB_MESSAGE, body
    assert _causes(body) == [
        f"The disruption budget budget needs {healthy} healthy pods and has {healthy} currently"], body

    # 3. One allowed: the dry run passes (201 Status) and changes nothing. (With the controller: a second Ready
    #    pod makes 2 healthy of 1 wanted.)
    if controller:
        make_pod(api, ns, "v1b", app)
        budget(api, ns, "budget", controller, allowed=1, current=2, desired=1)
    else:
        set_pdb_status(api, ns, "budget", allowed=1)
    before = pdb(api, ns, "budget")["status"]
    status, body = evict(api, ns, "v1", uid=v1["metadata"]["uid"], dry_run=True)
    seen["dry_run"] = (status, body.get("kind"), body.get("status"))
    assert status == 201 and body.get("kind") == "Status" and body.get("status") == "Success", body
    after = pdb(api, ns, "budget")["status"]
    assert after["disruptionsAllowed"] == 1 and not after.get("disruptedPods"), after
    assert before["disruptionsAllowed"] == after["disruptionsAllowed"]
    p = pod(api, ns, "v1")
    assert p is not None and not p["metadata"].get("deletionTimestamp") and not _cond(p, "DisruptionTarget")

    # 4. A UID precondition that does not match: 409, in a dry run too; nothing changes.
    status, body = evict(api, ns, "v1", uid="00000000-0000-0000-0000-000000000000", dry_run=True)
    seen["uid_mismatch_dry"] = (status, body.get("message"))
    assert status == 409 and "UID in the precondition" in body.get("message", ""), body
    assert pdb(api, ns, "budget")["status"]["disruptionsAllowed"] == 1

    # 5. The real eviction: budget decremented and the pod recorded; DisruptionTarget set by the API server
    #    (EvictionByEvictionAPI, replacing a scheduler's own reason); a bound pod with grace 30 stays Terminating.
    #    The mark is fresh: the disruption controller resets a DisruptionTarget=True older than 2 minutes on a pod
    #    that is not being deleted (a scheduler's or eviction's mark that never led to a deletion) to False.
    marked_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mark = {"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler",
            "message": "reclaimed by queue a", "lastTransitionTime": marked_at}
    call(api, "PATCH", "/api/v1/namespaces/{ns}/pods/{name}/status", {"status": {"conditions": [mark]}},
         content_type=STRATEGIC_PATCH, path_params={"ns": ns, "name": "v1"})
    marked = pod(api, ns, "v1")
    assert _cond(marked, "DisruptionTarget").get("reason") == "PreemptionByScheduler"
    assert _cond(marked, "Ready").get("status") == "True"  # strategic merge kept the other conditions
    status, body = evict(api, ns, "v1", uid=v1["metadata"]["uid"])
    assert status == 201 and body.get("status") == "Success", body
    p = pod(api, ns, "v1")
    assert p is not None, "a bound pod with a grace period stays (Terminating) until its kubelet removes it"
    assert p["metadata"].get("deletionTimestamp") and p["metadata"].get("deletionGracePeriodSeconds") == 30, p
    dt = _cond(p, "DisruptionTarget")
    seen["disruption_target"] = (dt.get("reason"), dt.get("message"), dt.get("lastTransitionTime"))
    assert dt.get("status") == "True" and dt.get("reason") == "EvictionByEvictionAPI", dt
    assert dt.get("message") == "Eviction API: evicting", dt
    assert dt.get("lastTransitionTime") == marked_at, dt  # status unchanged: transition time kept
    st = pdb(api, ns, "budget")["status"]
    seen["pdb_after"] = {k: st.get(k) for k in ("disruptionsAllowed", "disruptedPods")}
    # the eviction recorded v1 in disruptedPods; a disruption controller drops the entry once it has seen the
    # pod's deletionTimestamp (and recomputes: 1 healthy of 1 wanted, still 0 allowed)
    assert st["disruptionsAllowed"] == 0, st
    assert "v1" in (st.get("disruptedPods") or {}) or controller, st
    assert any(c.get("type") == "DisruptionAllowed" and c.get("status") == "False"
               and c.get("reason") == "InsufficientPods" for c in st.get("conditions") or []), st

    # 6. A Terminating pod skips the budget (0 allowed now): 201, still Terminating; grace 0 removes it.
    status, body = evict(api, ns, "v1")
    assert status == 201, body
    assert pod(api, ns, "v1") is not None
    assert delete(api, ns, "v1", grace=0) == 200 and pod(api, ns, "v1") is None

    # 7. A Running pod that is not Ready, the budget healthy (current >= desired > 0): evicted without using it.
    make_pod(api, ns, "unready", app, ready=False)
    budget(api, ns, "budget", controller, allowed=0, current=healthy, desired=healthy)
    status, body = evict(api, ns, "unready")
    assert status == 201, body
    assert pdb(api, ns, "budget")["status"]["disruptionsAllowed"] == 0
    delete(api, ns, "unready", grace=0)
    #    ... the budget unhealthy (current < desired): the unready pod is protected like the others.
    make_pod(api, ns, "unready2", app, ready=False)
    if controller:  # v1b, the one healthy pod, goes unready: 0 healthy of 1 wanted
        set_ready(api, ns, "v1b", ready=False)
        budget(api, ns, "budget", controller, allowed=0, current=0, desired=1)
    else:
        set_pdb_status(api, ns, "budget", allowed=0, current=1, desired=2)
    status, body = evict(api, ns, "unready2", dry_run=True)
    assert status == 429, body

    # 8. A Pending (unbound) pod skips the budget and goes at once (grace 0 for an unbound pod).
    make_pod(api, ns, "pending", app, running=False)
    status, body = evict(api, ns, "pending", dry_run=True)
    assert status == 201 and pod(api, ns, "pending") is not None, body
    status, body = evict(api, ns, "pending")
    assert status == 201 and pod(api, ns, "pending") is None, body

    # 9. Two budgets over one pod: 500 (the eviction subresource supports one).
    make_pod(api, ns, "shared", {"app": "train", "tier": "gold"})
    make_pdb(api, ns, "gold", {"tier": "gold"})
    status, body = evict(api, ns, "shared", dry_run=True)
    seen["two_pdbs"] = (status, body.get("message"))
    assert status == 500 and "more than one PodDisruptionBudget" in body.get("message", ""), body

    # 10. A spec change bumps generation: until the controller catches up, 429 again. With the controller
    #     running, the healthy pods (shared, v2) are at most the 2 now wanted: 429 whether it caught up or not,
    #     and then it publishes the new generation's numbers.
    if not controller:
        set_pdb_status(api, ns, "budget", allowed=3)
    gen = pdb(api, ns, "budget")["metadata"]["generation"]
    call(api, "PATCH", "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}", {"spec": {"minAvailable": 2}},
         content_type=MERGE_PATCH, path_params={"ns": ns, "name": "budget"})
    got = pdb(api, ns, "budget")
    assert got["metadata"]["generation"] == gen + 1, got
    assert controller or got["status"]["disruptionsAllowed"] == 3, got
    make_pod(api, ns, "v2", app)
    status, body = evict(api, ns, "v2", dry_run=True)
    assert status == 429 and (any("still being processed" in c for c in _causes(body)) or (
        controller and _causes(body)[0].startswith("The disruption budget budget needs 2 healthy pods"))), body
    if controller:
        budget(api, ns, "budget", controller, allowed=0, current=2, desired=2)

    # 11. No such pod: 404; a body naming another pod: 400.
    assert evict(api, ns, "nobody")[0] == 404
    status, body = evict(api, ns, "v2", body_name="v3")
    seen["name_mismatch"] = (status, body.get("message"))
    assert status == 400 and "does not match" in body.get("message", ""), body

    # 12. DELETE: an unbound pod goes at once; a bound one with grace > 0 stays Terminating until a grace-0 delete.
    make_pod(api, ns, "loose", {"x": "y"}, running=False)
    assert delete(api, ns, "loose") == 200 and pod(api, ns, "loose") is None
    make_pod(api, ns, "bound", {"x": "y"}, grace=45)
    assert delete(api, ns, "bound") == 200
    p = pod(api, ns, "bound")
    assert p is not None and p["metadata"].get("deletionGracePeriodSeconds") == 45, p
    assert delete(api, ns, "bound", grace=0) == 200 and pod(api, ns, "bound") is None
    make_pod(api, ns, "quick", {"x": "y"}, grace=0)
    assert delete(api, ns, "quick") == 200 and pod(api, ns, "quick") is None
    return seen


# ------------------------------------------------------------------ on the real server
def test_eviction_and_pdbs_on_the_real_apiserver(e2e) -> None:
    """With or without ``KCP_WITH=controller-manager`` (then the disruption controller computes the PDB status)."""
    controller = e2e.cp.runs("kube-controller-manager")
    seen = check_eviction_wire(e2e.admin, e2e.ns, controller=controller)
    seen["disruption_controller"] = controller
    print("\n[e2e] eviction wire:", json.dumps(seen, indent=1, default=str))
