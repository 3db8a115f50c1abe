"""gpupool's live scheduler against a real etcd + kube-apiserver (scenarios 1-7 of tests/e2e/README.md).

Each test asserts the correct behaviour; known scheduler bugs make some fail until they are fixed (the
README lists them). Fake GPU nodes are Node objects with status written through the status subresource;
pods never run.
"""

from __future__ import annotations

import json
import signal
import time

import pytest
from kubernetes import client

from gpupool.k8s.wire import drain

from . import livecluster as lc
from .livecluster import E2E, RESULTS

pytestmark = pytest.mark.real_apiserver

WHOLE, FRACTION = "1000", "500"


def _ann(pod: dict) -> dict:
    return pod["metadata"].get("annotations") or {}


def _assert_no_overallocation(ctx: E2E) -> dict:
    bad, summary = lc.gpu_violations(ctx.admin)
    assert not bad, "GPU over-allocation / inconsistent device annotations:\n  " + "\n  ".join(bad) + \
        "\n" + ctx.diagnostics()
    return summary


# ------------------------------------------------------------------ 1
def test_deploy_crds_and_rbac(e2e: E2E, deployed: list[str]) -> None:
    """deploy/ (as kustomize renders it) is accepted by a real apiserver; CRDs Established; RBAC as documented."""
    admin = e2e.admin
    assert "CustomResourceDefinition/queues.gpupool.io" in deployed
    assert "CustomResourceDefinition/podgroups.scheduling.x-k8s.io" in deployed
    for crd in ("queues.gpupool.io", "podgroups.scheduling.x-k8s.io"):
        assert lc.crd_established(admin, crd)
    # The CRD's schema and CEL rules are live: limit below quota is refused with 422.
    with pytest.raises(client.exceptions.ApiException) as bad:
        lc.create_queue(admin, "e2e-bad-queue", {"quota": 4, "limit": 2})
    assert bad.value.status == 422, bad.value.body
    q = lc.create_queue(admin, "e2e-defaults", {"limit": 3})
    assert q["spec"] == {"limit": 3, "quota": 0, "weight": 1, "priority": 0}, q["spec"]  # structural defaults
    # What the ServiceAccount may do, asked of the real RBAC authorizer.
    authz = client.AuthorizationV1Api(e2e.sa_client)

    def can(verb: str, resource: str, group: str = "", sub: str = "", ns: str | None = "default",
            name: str | None = None) -> bool:
        attrs = {"verb": verb, "resource": resource, "group": group, "subresource": sub, "namespace": ns, "name": name}
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {k: v for k, v in attrs.items() if v is not None}}}
        resp = authz.create_self_subject_access_review(body, _preload_content=False)
        return bool(json.loads(resp.data)["status"].get("allowed"))

    needed = [("list", "pods"), ("watch", "pods"), ("create", "pods", "", "binding"),
              ("patch", "pods", "", "status"), ("create", "events"), ("watch", "nodes", "", "", None),
              ("watch", "queues", "gpupool.io", "", None), ("watch", "podgroups", "scheduling.x-k8s.io"),
              ("update", "leases", "coordination.k8s.io", "", lc.SA_NAMESPACE, lc.LEASE_NAME)]
    missing = [n for n in needed if not can(*n)]
    assert not missing, f"deploy/rbac.yaml does not grant: {missing}"
    # no pods patch/update (issue 33 item 4: it let this account replace a kube-system pod's image)
    extra = [n for n in [("delete", "pods"), ("create", "pods"), ("patch", "pods"), ("update", "pods"),
                         ("patch", "pods", "", "", "kube-system"), ("update", "nodes", "", "", None),
                         ("update", "leases", "coordination.k8s.io", "", lc.SA_NAMESPACE, "someone-else")]
             if can(*n)]
    assert not extra, f"deploy/rbac.yaml grants more than it says: {extra}"


# ------------------------------------------------------------------ 2
def test_binds_every_request_kind(e2e: E2E) -> None:
    """Whole-GPU, KAI fraction, HAMi memory, MIG (mixed) and gang pods are bound with correct device annotations."""
    api, ns = e2e.admin, e2e.ns
    lc.make_node(api, "h100-a")
    lc.make_node(api, "h100-b")
    mig_res = {"nvidia.com/mig-1g.10gb": "7"}
    lc.make_node(api, "a100-mig", gpus=1, labels={**lc.A100, "nvidia.com/mig.strategy": "mixed"}, extra=mig_res)
    lc.create_pod_group(api, ns, "gang-a", 4)
    pods = [
        lc.pod_body("whole-2", ns, gpus=2),
        lc.pod_body("frac-a", ns, gpus=None, annotations={"gpu-fraction": "0.5"}),
        lc.pod_body("frac-b", ns, gpus=None, annotations={"gpu-fraction": "0.5"}),
        lc.pod_body("hami-20g", ns, gpus=1, limits={"nvidia.com/gpumem": "20000"}),
        *[lc.pod_body(f"mig-{i}", ns, gpus=None, limits={"nvidia.com/mig-1g.10gb": "1"}) for i in range(8)],
        *[lc.pod_body(f"gang-a-{i}", ns, gpus=2, labels={lc.PODGROUP_LABEL: "gang-a"}) for i in range(3)],
    ]
    lc.create_pods(api, pods)
    e2e.scheduler_inprocess()
    singles = ["whole-2", "frac-a", "frac-b", "hami-20g"]
    lc.wait_bound(api, ns, singles, 30, e2e.diagnostics)
    lc.wait_for(lambda: len(lc.bound(lc.list_pods(api, ns, "gpupool-e2e=1"))) >= 4 + 7, 30, "7 MIG pods bound",
                detail=e2e.diagnostics)
    # a gang of 4 with 3 members present: none of them may be bound (all or nothing), even after some cycles
    time.sleep(1.5)
    got = {p["metadata"]["name"]: p for p in lc.list_pods(api, ns)}
    assert not lc.bound(got[f"gang-a-{i}"] for i in range(3)), "a partial gang was bound"
    assert len(lc.bound(got[f"mig-{i}"] for i in range(8))) == 7, "8 MIG pods on 7 MIG devices"
    lc.create_pod(api, lc.pod_body("gang-a-3", ns, gpus=2, labels={lc.PODGROUP_LABEL: "gang-a"}))
    lc.wait_bound(api, ns, [f"gang-a-{i}" for i in range(4)], 30, e2e.diagnostics)

    got = {p["metadata"]["name"]: p for p in lc.list_pods(api, ns)}
    w = _ann(got["whole-2"])
    assert got["whole-2"]["spec"]["nodeName"] in ("h100-a", "h100-b")
    assert w["gpupool.io/node"] == got["whole-2"]["spec"]["nodeName"]
    assert len(w["gpupool.io/gpu-index"].split(",")) == 2 and w["gpupool.io/gpu-milli"] == WHOLE, w
    for name in ("frac-a", "frac-b"):
        a = _ann(got[name])
        assert a["gpupool.io/gpu-milli"] == FRACTION and len(a["gpupool.io/gpu-index"].split(",")) == 1, a
    h = _ann(got["hami-20g"])
    assert h["gpupool.io/gpu-memory"] == "20000" and len(h["gpupool.io/gpu-index"].split(",")) == 1, h
    for p in lc.bound(got[f"mig-{i}"] for i in range(8)):
        assert p["spec"]["nodeName"] == "a100-mig" and _ann(p).get("gpupool.io/mig") == "1g.10gb=1", _ann(p)
    for i in range(4):
        assert len(_ann(got[f"gang-a-{i}"])["gpupool.io/gpu-index"].split(",")) == 2
    pending_mig = lc.unbound(got[f"mig-{i}"] for i in range(8))[0]["metadata"]["name"]

    def unschedulable():
        pod = json.loads(client.CoreV1Api(api).read_namespaced_pod(pending_mig, ns, _preload_content=False).data)
        cond = lc.condition(pod, "PodScheduled")
        return cond if cond and cond["status"] == "False" else None

    cond = lc.wait_for(unschedulable, 15, f"PodScheduled=False on {pending_mig}", detail=e2e.diagnostics)
    assert cond["reason"] == "Unschedulable", cond
    for p in lc.bound(got.values()):
        cond = lc.condition(p, "PodScheduled")
        assert cond and cond["status"] == "True", f"{p['metadata']['name']}: {cond}"
    _assert_no_overallocation(e2e)


# ------------------------------------------------------------------ 3
def test_queue_limit(e2e: E2E) -> None:
    """Queue limit 4, 8 one-GPU pods in it: exactly 4 bound; 4 Pending with FailedScheduling and PodScheduled=False."""
    api, ns = e2e.admin, e2e.ns
    lc.make_node(api, "q-node-a")
    lc.make_node(api, "q-node-b")
    lc.create_queue(api, "e2e-team-a", {"quota": 2, "limit": 4})
    sel = f"{lc.QUEUE_LABEL}=e2e-team-a"
    lc.create_pods(api, [lc.pod_body(f"q-{i}", ns, labels={lc.QUEUE_LABEL: "e2e-team-a"}) for i in range(8)])
    e2e.scheduler_inprocess()

    def settled():
        pods = lc.list_pods(api, ns, sel)
        pend = lc.unbound(pods)
        ok = [p for p in pend if (lc.condition(p, "PodScheduled") or {}).get("status") == "False"]
        return len(lc.bound(pods)) >= 4 and len(ok) == len(pend) and pods

    lc.wait_for(settled, 30, "4 bound and the rest marked PodScheduled=False", detail=e2e.diagnostics)
    time.sleep(1.0)  # a few more cycles: nothing else may be bound
    pods = lc.list_pods(api, ns, sel)
    assert len(lc.bound(pods)) == 4, f"queue limit 4, bound: {lc.names(lc.bound(pods))}\n{e2e.diagnostics()}"
    pending = lc.unbound(pods)
    assert len(pending) == 4
    for p in pending:
        cond = lc.condition(p, "PodScheduled")
        assert cond["reason"] == "Unschedulable" and cond.get("message"), cond
    failed = lc.wait_for(lambda: {e["involvedObject"]["name"] for e in lc.events_for(api, ns, "FailedScheduling")}
                         >= set(lc.names(pending)) and lc.events_for(api, ns, "FailedScheduling"), 15,
                         "a FailedScheduling Event for each pending pod")
    assert all(e["type"] == "Warning" for e in failed)
    print(f"\n[e2e] queue limit message: {lc.condition(pending[0], 'PodScheduled')['message']!r}")
    # the Queue's status subresource, as `kubectl get queues` shows it (written by the ServiceAccount)
    custom = client.CustomObjectsApi(api)

    def status():
        st = custom.get_cluster_custom_object("gpupool.io", "v1alpha1", "queues", "e2e-team-a").get("status") or {}
        return st if st.get("usedGPUs") == 4 and st.get("pendingPods") == 4 else None

    st = lc.wait_for(status, 15, "Queue status usedGPUs 4, pendingPods 4", detail=e2e.diagnostics)
    assert st["allocatedPods"] == 4 and st["conditions"][0]["type"] == "Valid", st
    _assert_no_overallocation(e2e)


# ------------------------------------------------------------------ 4
def test_scheduler_restart_no_double_booking(e2e: E2E) -> None:
    """Scheduler SIGKILLed mid-burst, more pods created, a new one started: 16 pods on 16 GPUs all bound, once."""
    api, ns = e2e.admin, e2e.ns
    lc.make_node(api, "r-node-a")
    lc.make_node(api, "r-node-b")
    first = e2e.scheduler_process("restart-1")
    lc.create_pods(api, [lc.pod_body(f"a-{i}", ns) for i in range(6)])
    lc.wait_bound(api, ns, [f"a-{i}" for i in range(6)], 30, e2e.diagnostics)
    # a burst, and a kill while it is being bound (annotated, bound, or neither)
    lc.create_pods(api, [lc.pod_body(f"b-{i}", ns) for i in range(6)])
    lc.wait_for(lambda: any(_ann(p).get("gpupool.io/node") or p["spec"].get("nodeName")
                            for p in lc.list_pods(api, ns) if p["metadata"]["name"].startswith("b-")),
                30, "the burst to start being placed", interval=0.01)
    first.kill()
    state = {p["metadata"]["name"]: (p["spec"].get("nodeName"), _ann(p).get("gpupool.io/gpu-index"))
             for p in lc.list_pods(api, ns) if p["metadata"]["name"].startswith("b-")}
    print(f"\n[e2e] at the kill, burst pods (node, gpu-index): {state}")
    lc.create_pods(api, [lc.pod_body(f"c-{i}", ns) for i in range(4)])
    e2e.scheduler_process("restart-2")
    every = [f"a-{i}" for i in range(6)] + [f"b-{i}" for i in range(6)] + [f"c-{i}" for i in range(4)]
    lc.wait_bound(api, ns, every, 40, e2e.diagnostics)
    _assert_no_overallocation(e2e)


# ------------------------------------------------------------------ 5
LEASE = {"duration": 6, "renew": 4, "retry": 1}


def test_leader_failover(e2e: E2E) -> None:
    """Two replicas with Lease election; the leader is SIGKILLed; the standby binds the next pod. Prints the time."""
    api, ns = e2e.admin, e2e.ns
    lc.make_node(api, "l-node-a")
    cfg = e2e.log_dir / "leader-config.yaml"
    lc.write_leader_config(cfg, LEASE)
    reps = {i: e2e.scheduler_process(i, ["--config", str(cfg), "--leader-elect"]) for i in ("replica-a", "replica-b")}
    coord = client.CoordinationV1Api(api)

    def holder() -> str:
        lease = json.loads(coord.read_namespaced_lease(lc.LEASE_NAME, lc.SA_NAMESPACE, _preload_content=False).data)
        return lease["spec"].get("holderIdentity") or ""

    leader = lc.wait_for(lambda: holder() in reps and holder(), 30, "a replica to take the Lease",
                         detail=e2e.diagnostics)
    lc.create_pods(api, [lc.pod_body(f"pre-{i}", ns) for i in range(2)])
    lc.wait_bound(api, ns, ["pre-0", "pre-1"], 30, e2e.diagnostics)
    standby = next(i for i in reps if i != leader)
    t_kill = time.monotonic()
    reps[leader].kill()
    lc.create_pod(api, lc.pod_body("post-0", ns))
    lc.wait_bound(api, ns, ["post-0"], LEASE["duration"] * 4 + 20, e2e.diagnostics)
    failover = time.monotonic() - t_kill
    assert holder() == standby
    lease = json.loads(coord.read_namespaced_lease(lc.LEASE_NAME, lc.SA_NAMESPACE, _preload_content=False).data)
    RESULTS["leader_failover_s"] = round(failover, 2)
    RESULTS["leader_failover_lease"] = f"leaseDuration {LEASE['duration']}s, renewDeadline {LEASE['renew']}s, " \
                                       f"retryPeriod {LEASE['retry']}s"
    print(f"\n[e2e] leader failover: {failover:.2f}s from SIGKILL of {leader} to a new pod bound by {standby} "
          f"(leaseDuration {LEASE['duration']}s; leaseTransitions={lease['spec'].get('leaseTransitions')})")
    assert failover < LEASE["duration"] * 3 + 10, f"failover took {failover:.1f}s"
    _assert_no_overallocation(e2e)


# ------------------------------------------------------------------ 6
def test_apiserver_restart_keeps_queue_limit(e2e: E2E) -> None:
    """kube-apiserver SIGKILLed and started again under a running scheduler, pods arriving as soon as it answers:
    the scheduler reconnects and binds them, and the Queue's limit (3) holds throughout."""
    api, ns, cp = e2e.admin, e2e.ns, e2e.cp
    lc.make_node(api, "x-node-a")
    lc.make_node(api, "x-node-b")
    lc.create_queue(api, "e2e-limited", {"limit": 3})
    sel = f"{lc.QUEUE_LABEL}=e2e-limited"
    q = {lc.QUEUE_LABEL: "e2e-limited"}
    sched = e2e.scheduler_process("apiserver-restart")
    lc.create_pods(api, [lc.pod_body(f"q-{i}", ns, labels=q) for i in range(2)] +
                   [lc.pod_body(f"free-{i}", ns) for i in range(2)])
    lc.wait_bound(api, ns, ["q-0", "q-1", "free-0", "free-1"], 30, e2e.diagnostics)
    monitor = lc.Monitor(api, ns, sel, interval=0.1)
    monitor.start()
    try:
        t_kill = cp.kill_apiserver()
        time.sleep(2.0)  # the scheduler's watches and requests fail meanwhile
        t_start = cp.start_apiserver()
        # pods arrive the moment the apiserver accepts writes, during its warm-up
        arrivals = [lc.pod_body(f"q-{i}", ns, labels=q) for i in range(2, 8)] + \
                   [lc.pod_body(f"free-{i}", ns) for i in range(2, 4)]
        for body in arrivals:
            lc.create_pod(api, body, retry_s=60)
        t_created = time.monotonic()
        cp.wait_ready()
        t_ready = time.monotonic()
        lc.wait_bound(api, ns, ["free-2", "free-3"], 60, e2e.diagnostics)
        t_rebound = time.monotonic()
        lc.wait_for(lambda: len(lc.bound(lc.list_pods(api, ns, sel))) >= 3, 30, "3 queued pods bound",
                    detail=e2e.diagnostics)
        time.sleep(3.0)  # long enough for a lapse of the limit to show
    finally:
        monitor.stop()
    bound_q = lc.names(lc.bound(lc.list_pods(api, ns, sel)))
    timeline = [(t, n) for t, n in monitor.samples if n > 3][:5]
    RESULTS["apiserver_restart"] = {"down_s": round(t_start - t_kill, 2),
                                    "first_write_after_start_s": round(t_created - t_start, 2),
                                    "readyz_after_start_s": round(t_ready - t_start, 2),
                                    "scheduler_rebound_after_start_s": round(t_rebound - t_start, 2),
                                    "monitor_errors": dict(monitor.error_kinds)}
    print(f"\n[e2e] apiserver restart: {RESULTS['apiserver_restart']}; queued bound max {monitor.max_bound}")
    assert monitor.max_bound <= 3 and len(bound_q) == 3, (
        f"queue limit 3 broken: max {monitor.max_bound} bound (first samples over: {timeline}); now {bound_q}\n"
        + "\n".join(json.dumps(r) for r in sched.log_events("resource_absent", "api_error", "watch_error",
                                                              "watch_expired", "listed")[-30:]))
    _assert_no_overallocation(e2e)


# ------------------------------------------------------------------ 7
def test_watch_expired_relists(e2e: E2E) -> None:
    """Force 410 Gone on the scheduler's watches, then check it relists and schedules on the truth.

    The scheduler is frozen (SIGSTOP) and the apiserver restarted, so its connections die with nothing in
    flight; then bound pods are deleted (freeing GPUs) and new ones created, etcd is compacted and the
    apiserver restarted once more (its watch cache starts over after the changes). Thawed, the scheduler
    resumes its watches from resourceVersions the server no longer has: 410 Expired. The cluster was full
    before, so the new pods fit only if the relist showed the deletions.
    """
    api, ns, cp = e2e.admin, e2e.ns, e2e.cp
    lc.make_node(api, "w-node-a", gpus=4)
    lc.make_node(api, "w-node-b", gpus=4)
    sched = e2e.scheduler_process("watch-expiry")
    lc.create_pods(api, [lc.pod_body(f"old-{i}", ns) for i in range(8)])
    lc.wait_bound(api, ns, [f"old-{i}" for i in range(8)], 30, e2e.diagnostics)
    time.sleep(0.5)  # the scheduler has seen its own bindings
    rv_before = json.loads(client.CoreV1Api(api).list_pod_for_all_namespaces(
        limit=1, _preload_content=False).data)["metadata"]["resourceVersion"]
    sched.signal(signal.SIGSTOP)
    core = client.CoreV1Api(api)
    try:
        cp.kill_apiserver()
        cp.start_apiserver()
        cp.wait_ready()
        for i in range(4):
            drain(core.delete_namespaced_pod(f"old-{i}", ns, grace_period_seconds=0, _preload_content=False))
        lc.create_pods(api, [lc.pod_body(f"new-{i}", ns) for i in range(4)])
        rev = cp.compact_etcd()
        cp.kill_apiserver()
        cp.start_apiserver()
        cp.wait_ready()
        status, body = cp.http("GET", f"/api/v1/pods?watch=1&resourceVersion={rv_before}&timeoutSeconds=1")
        first = json.loads(body.splitlines()[0]) if body.strip() else {}
        RESULTS["watch_410_wire"] = {"http_status": status, "first_event": first}
        assert first.get("type") == "ERROR" and first["object"].get("code") == 410, \
            f"a watch from resourceVersion {rv_before} (etcd compacted at {rev}) did not expire: {status} {body[:300]}"
    finally:
        sched.signal(signal.SIGCONT)
    t0 = time.monotonic()
    lc.wait_bound(api, ns, [f"new-{i}" for i in range(4)], 45, e2e.diagnostics)
    thawed_s = time.monotonic() - t0
    def about_410(r: dict) -> bool:
        return "expire" in str(r.get("event") or r.get("msg") or "").lower() or 410 in (r.get("status"), r.get("code"))

    reaction = [r for r in sched.log_lines() if about_410(r) or r.get("event") in ("listed", "relisted")]
    seen_410 = [r for r in reaction if about_410(r)]
    RESULTS["watch_410_scheduler"] = {"bound_after_thaw_s": round(thawed_s, 2), "log_records_410": len(seen_410),
                                      "kinds": sorted({str(r.get("kind")) for r in seen_410})}
    print(f"\n[e2e] after 410: pods created during the freeze bound {thawed_s:.2f}s after thawing; "
          f"410 wire: {RESULTS['watch_410_wire']}")
    print("[e2e] scheduler's log about it:\n  " + "\n  ".join(json.dumps(r)[:240] for r in reaction[-12:]))
    # and it keeps scheduling afterwards
    drain(core.delete_namespaced_pod("old-4", ns, grace_period_seconds=0, _preload_content=False))
    lc.create_pod(api, lc.pod_body("after-0", ns))
    lc.wait_bound(api, ns, ["after-0"], 30, e2e.diagnostics)
    _assert_no_overallocation(e2e)


def test_concurrent_bind_conflict_is_409(e2e: E2E) -> None:
    """The wire facts the scheduler's conflict handling relies on (and the CI mock copies): binding answers 201
    with a Status body, a second binding 409, a binding with a wrong UID is refused, and the Binding's
    annotations are copied onto the pod."""
    api, ns, cp = e2e.admin, e2e.ns, e2e.cp
    lc.make_node(api, "b-node-a")
    body = lc.pod_body("p", ns, gpus=None)
    body["spec"]["schedulerName"] = "nobody"  # no scheduler of ours touches it
    lc.create_pod(api, body)
    pod = json.loads(client.CoreV1Api(api).read_namespaced_pod("p", ns, _preload_content=False).data)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p", "uid": "not-the-uid"},
               "target": {"apiVersion": "v1", "kind": "Node", "name": "b-node-a"}}
    s_uid, b_uid = cp.http("POST", f"/api/v1/namespaces/{ns}/pods/p/binding", binding)
    binding["metadata"]["uid"] = pod["metadata"]["uid"]
    binding["metadata"]["annotations"] = {"gpupool.io/node": "b-node-a"}
    s1, b1 = cp.http("POST", f"/api/v1/namespaces/{ns}/pods/p/binding", binding)
    s2, b2 = cp.http("POST", f"/api/v1/namespaces/{ns}/pods/p/binding", binding)
    s404, b404 = cp.http("POST", f"/api/v1/namespaces/{ns}/pods/ghost/binding",
                         {**binding, "metadata": {"name": "ghost"}})
    RESULTS["binding_wire"] = {
        "stale_uid": (s_uid, json.loads(b_uid).get("reason")), "first": (s1, json.loads(b1).get("kind")),
        "second": (s2, json.loads(b2).get("reason")), "missing_pod": (s404, json.loads(b404).get("reason"))}
    assert s1 == 201 and json.loads(b1)["kind"] == "Status", (s1, b1)
    assert s2 == 409, (s2, b2)
    assert s_uid != 201, "a binding whose UID precondition fails must be refused"
    after = json.loads(client.CoreV1Api(api).read_namespaced_pod("p", ns, _preload_content=False).data)
    assert after["spec"]["nodeName"] == "b-node-a"
    assert _ann(after).get("gpupool.io/node") == "b-node-a", "binding annotations are copied onto the pod"
    print(f"\n[e2e] binding wire: {RESULTS['binding_wire']}")

