"""Pool mode against a real kube-apiserver: the shared-pool scenarios of the live scheduler (issue 9).

Two queues and a borrower evicted by reclaim; a PodDisruptionBudget that blocks one victim; a high-priority gang
preempting; an elastic gang shrinking; a gang that gets a reservation under a stream of small pods. The
scheduler runs in-process with the ServiceAccount of deploy/ (its RBAC); a fake kubelet (a thread of this test)
moves bound pods to Running, ends the containers of pods being deleted (a real kubelet confirms a graceful
deletion the same way: a delete with grace period 0 once the containers stopped), and lets pods finish when
the test says so. Every test ends with the GPU over-allocation check on the API's own view.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s.pool import live_config
from gpupool.k8s.wire import drain

from . import livecluster as lc
from .livecluster import E2E, RESULTS

pytestmark = pytest.mark.real_apiserver

KUEUE = "kueue.x-k8s.io/queue-name"
GROUP = "scheduling.x-k8s.io/pod-group"


class FakeKubelet(threading.Thread):
    """Plays the kubelets of the fake nodes for one namespace: Pending+bound -> Running; a pod being deleted
    (``deletionTimestamp``) is removed once its containers "stopped" (grace 0 delete), except pods in
    ``stuck``; :meth:`finish` ends a pod's containers (phase Succeeded)."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        super().__init__(daemon=True, name="fake-kubelet")
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.stuck: set[str] = set()
        self.deleted: list[tuple[float, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                for p in lc.list_pods(self.core.api_client, self.ns):
                    name = p["metadata"]["name"]
                    if p["metadata"].get("deletionTimestamp"):
                        if name not in self.stuck:
                            self._remove(name)
                    elif p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") == "Pending":
                        self._phase(name, "Running")
            except Exception:  # noqa: BLE001 - a busy apiserver: look again
                pass
            self._halt.wait(0.1)

    def _remove(self, name: str) -> None:
        try:
            drain(self.core.delete_namespaced_pod(name, self.ns, grace_period_seconds=0, _preload_content=False))
            self.deleted.append((time.monotonic(), name))
        except ApiException as exc:
            if exc.status != 404:
                raise

    def _phase(self, name: str, phase: str) -> None:
        # Running with Ready=True, as a kubelet reports a started pod (a PodDisruptionBudget counts only
        # Ready pods as healthy; an unready pod it lets go)
        ready = "True" if phase == "Running" else "False"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        body = {"status": {"phase": phase, "conditions": [
            {"type": "Ready", "status": ready, "lastTransitionTime": now},
            {"type": "ContainersReady", "status": ready, "lastTransitionTime": now}]}}
        try:
            drain(self.core.patch_namespaced_pod_status(name, self.ns, body, _preload_content=False))
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def finish(self, name: str) -> None:
        self._phase(name, "Succeeded")

    def stop(self) -> None:
        self._halt.set()


@pytest.fixture
def kubelet(e2e: E2E) -> Any:
    k = FakeKubelet(e2e.admin, e2e.ns)
    k.start()
    yield k
    k.stop()


@pytest.fixture(scope="module")
def priority_classes(admin: client.ApiClient) -> dict[str, int]:
    api = client.SchedulingV1Api(admin)
    classes = {"e2e-low": 10, "e2e-high": 50, "e2e-inference": 125}
    for name, value in classes.items():
        try:
            api.create_priority_class({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                       "metadata": {"name": name, "labels": {lc.E2E_LABEL: "1"}}, "value": value})
        except ApiException as exc:
            if exc.status != 409:
                raise
    return classes


def pool_scheduler(e2e: E2E, **pool: Any) -> Any:
    cfg = live_config(**{"min_run_s": 0.0, "reclaim_min_run_s": 0.0, "reserve_after_s": 3.0, **pool})
    return e2e.scheduler_inprocess("e2e-pool", pool_config=cfg, resync_s=0.5, queue_status_s=0.5)


def pods(e2e: E2E, prefix: str = "") -> list[dict[str, Any]]:
    return [p for p in lc.list_pods(e2e.admin, e2e.ns) if p["metadata"]["name"].startswith(prefix)]


def running(e2e: E2E, prefix: str = "") -> list[str]:
    return lc.names(p for p in pods(e2e, prefix) if p["spec"].get("nodeName")
                    and not p["metadata"].get("deletionTimestamp"))


def body(e2e: E2E, name: str, gpus: int, queue: str | None = None, group: str | None = None,
         priority_class: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    lab = dict(labels or {})
    if queue:
        lab[KUEUE] = queue
    if group:
        lab[GROUP] = group
    b = lc.pod_body(name, e2e.ns, gpus=gpus, labels=lab)
    if priority_class:
        b["spec"]["priorityClassName"] = priority_class
    return b


def queue_status(e2e: E2E, name: str) -> dict[str, Any]:
    obj = client.CustomObjectsApi(e2e.admin).get_cluster_custom_object("gpupool.io", "v1alpha1", "queues", name)
    return obj.get("status") or {}


def queues(e2e: E2E, **specs: dict[str, Any]) -> list[str]:
    names = []
    for short, spec in specs.items():
        name = f"{e2e.ns}-{short}"[:63]
        lc.create_queue(e2e.admin, name, spec)
        names.append(name)
    return names


def no_overallocation(e2e: E2E) -> None:
    bad, _ = lc.gpu_violations(e2e.admin)
    assert not bad, "GPU over-allocation:\n  " + "\n  ".join(bad) + "\n" + e2e.diagnostics()


def victim_events(e2e: E2E) -> list[dict[str, Any]]:
    return lc.events_for(e2e.admin, e2e.ns, "Preempted")


# ------------------------------------------------------------------ scenarios
def test_reclaim_evicts_the_borrower(e2e: E2E, kubelet: FakeKubelet) -> None:
    """Queue b borrows queue a's idle quota; a's pods arrive; b's borrowed pods are evicted, a's bind."""
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 2, gpus=8)
    qa, qb = queues(e2e, a={"quota": 8}, b={"quota": 8})
    pool_scheduler(e2e)
    lc.create_pods(e2e.admin, [body(e2e, f"b-{i:02d}", 1, qb) for i in range(16)])
    lc.wait_for(lambda: len(running(e2e, "b-")) == 16, 60, "b borrows all 16 GPUs")
    lc.wait_for(lambda: queue_status(e2e, qb).get("borrowedGPUs") == 8, 20, "Queue b: 8 GPUs borrowed")
    t0 = time.monotonic()
    lc.create_pods(e2e.admin, [body(e2e, f"a-{i:02d}", 1, qa) for i in range(8)])
    lc.wait_for(lambda: len(running(e2e, "a-")) == 8, 60, "a gets its quota back", )
    RESULTS["pool_reclaim_s"] = round(time.monotonic() - t0, 2)
    assert len(running(e2e, "b-")) == 8
    events = victim_events(e2e)
    assert len({e["involvedObject"]["name"] for e in events}) == 8, events
    assert all("reclaimed by" in e["message"] for e in events)
    no_overallocation(e2e)
    lc.wait_for(lambda: queue_status(e2e, qa).get("usedGPUs") == 8 and queue_status(e2e, qb).get("usedGPUs") == 8,
                20, "Queue status shows 8 and 8")
    lc.wait_for(lambda: queue_status(e2e, qa).get("fairShareGPUs") == 8, 20, "Queue a: fair share 8")
    assert queue_status(e2e, qb).get("borrowedGPUs") == 0


def test_pdb_blocks_one_victim_and_another_is_chosen(e2e: E2E, kubelet: FakeKubelet) -> None:
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 1, gpus=8)
    qa, qb = queues(e2e, a={"quota": 4}, b={"quota": 4})
    sched = pool_scheduler(e2e)
    for i in range(4):
        lc.create_pod(e2e.admin, body(e2e, f"b-{i}", 2, qb, labels={"app": f"b-{i}"}))
        time.sleep(1.1)  # distinct creation times: the newest is the first victim
    lc.wait_for(lambda: len(running(e2e, "b-")) == 4, 60, "b holds the node")
    policy = client.PolicyV1Api(e2e.admin)
    pdb = policy.create_namespaced_pod_disruption_budget(e2e.ns, {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "protect-b3"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "b-3"}}}})
    # the disruption controller (not running here) would publish this status: no disruption allowed
    policy.patch_namespaced_pod_disruption_budget_status("protect-b3", e2e.ns, {"status": {
        "observedGeneration": pdb.metadata.generation, "disruptionsAllowed": 0, "currentHealthy": 1,
        "desiredHealthy": 1, "expectedPods": 1}})
    lc.create_pod(e2e.admin, body(e2e, "a-0", 2, qa))
    lc.wait_for(lambda: running(e2e, "a-") == ["a-0"], 60, "a-0 bound after another victim was chosen")
    assert "b-3" in running(e2e, "b-"), "the PDB-protected pod was evicted"
    assert len(running(e2e, "b-")) == 3
    blocked = lc.events_for(e2e.admin, e2e.ns, "PreemptionBlocked")
    assert blocked and "b-3" in blocked[0]["message"], (blocked, e2e.diagnostics())
    assert sched.pool_driver.stats["refused"] >= 1
    no_overallocation(e2e)


def test_high_priority_gang_preempts(e2e: E2E, kubelet: FakeKubelet, priority_classes: dict[str, int]) -> None:
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 3, gpus=8)
    (qa,) = queues(e2e, a={"quota": 16})
    pool_scheduler(e2e)
    lc.create_pod(e2e.admin, body(e2e, "inf-0", 2, qa, priority_class="e2e-inference"))
    lc.create_pods(e2e.admin, [body(e2e, f"lo-{i}", 2, qa, priority_class="e2e-low") for i in range(8)])
    lc.wait_for(lambda: len(running(e2e, "lo-")) == 8, 60, "low-priority pods fill the cluster")
    lc.create_pod_group(e2e.admin, e2e.ns, "hp", 2)
    t0 = time.monotonic()
    lc.create_pods(e2e.admin, [body(e2e, f"hp-{i}", 8, qa, group="hp", priority_class="e2e-high") for i in range(2)])
    lc.wait_for(lambda: running(e2e, "hp-") == ["hp-0", "hp-1"], 60, "the gang preempts and binds")
    RESULTS["pool_gang_preemption_s"] = round(time.monotonic() - t0, 2)
    assert running(e2e, "inf-") == ["inf-0"]  # non-preemptible: never a victim
    events = victim_events(e2e)
    assert events and all("preempted by" in e["message"] for e in events)
    assert all(e["involvedObject"]["name"].startswith("lo-") for e in events)
    assert len(running(e2e, "lo-")) == 8 - len({e["involvedObject"]["name"] for e in events})
    # the gang was held on the victims' nodes (status.nominatedNodeName, a Nominated Event) while they went
    lc.wait_for(lambda: {e["involvedObject"]["name"] for e in lc.events_for(e2e.admin, e2e.ns, "Nominated")}
                >= {"hp-0", "hp-1"}, 10, "Nominated Events on both gang pods")
    no_overallocation(e2e)


def test_elastic_gang_shrinks_for_another_queue(e2e: E2E, kubelet: FakeKubelet) -> None:
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 1, gpus=8)
    qa, qb = queues(e2e, a={"quota": 4}, b={"quota": 4})
    pool_scheduler(e2e)
    lc.create_pod_group(e2e.admin, e2e.ns, "el", 1)
    lc.create_pods(e2e.admin, [body(e2e, f"el-{i}", 2, qa, group="el") for i in range(4)])
    lc.wait_for(lambda: len(running(e2e, "el-")) == 4, 60, "the elastic gang grows to the whole node")
    lc.create_pod(e2e.admin, body(e2e, "b-0", 2, qb))
    lc.wait_for(lambda: running(e2e, "b-") == ["b-0"], 60, "b gets 2 GPUs")
    assert len(running(e2e, "el-")) == 3  # one extra worker given back, the job keeps running
    events = victim_events(e2e)
    assert len(events) == 1 and events[0]["involvedObject"]["name"].startswith("el-"), events
    no_overallocation(e2e)


def test_gang_reservation_under_a_stream_of_small_pods(e2e: E2E, kubelet: FakeKubelet) -> None:
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 4, gpus=8)
    (qa,) = queues(e2e, a={"quota": 32})
    pool_scheduler(e2e, reserve_after_s=3.0)
    n = 0
    lc.create_pods(e2e.admin, [body(e2e, f"s-{i:04d}", 1, qa) for i in range(32)])
    n = 32
    lc.wait_for(lambda: len(running(e2e, "s-")) == 32, 60, "small pods fill the cluster")
    lc.create_pod_group(e2e.admin, e2e.ns, "big", 4)
    t0 = time.monotonic()
    lc.create_pods(e2e.admin, [body(e2e, f"big-{i}", 8, qa, group="big") for i in range(4)])
    done_at = None
    while time.monotonic() - t0 < 120:
        live = [p for p in pods(e2e, "s-") if (p.get("status") or {}).get("phase") == "Running"]
        if live:  # one small pod ends and a new one arrives, about 4 per second
            kubelet.finish(sorted(p["metadata"]["name"] for p in live)[0])
        lc.create_pod(e2e.admin, body(e2e, f"s-{n:04d}", 1, qa))
        n += 1
        if len(running(e2e, "big-")) == 4:
            done_at = time.monotonic() - t0
            break
        time.sleep(0.25)
    assert done_at is not None, "the 32-GPU gang starved under the stream\n" + e2e.diagnostics()
    RESULTS["pool_reservation_gang_start_s"] = round(done_at, 1)
    assert done_at >= 3.0  # it waited for its reservation, then the reserved nodes drained
    no_overallocation(e2e)

    def group_status() -> dict[str, Any]:
        return client.CustomObjectsApi(e2e.admin).get_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", e2e.ns, "podgroups", "big").get("status") or {}

    lc.wait_for(lambda: group_status().get("phase") == "Running" and group_status().get("running") == 4, 20,
                "PodGroup big: phase Running, 4 running")
    print(json.dumps(group_status()))


def test_remaining_order_starts_the_job_with_the_shorter_declared_limit(e2e: E2E, kubelet: FakeKubelet) -> None:
    """--job-order remaining: of two waiting jobs, the one whose declared run-time limit (Kueue's
    max-exec-time-seconds label, or the pod's activeDeadlineSeconds) leaves less to run starts first, although it
    came later; the scheduler learns a job size from each job that left."""
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 1, gpus=2)
    (qa,) = queues(e2e, a={"quota": 2})
    sched = pool_scheduler(e2e, order="remaining", promote_knob=1.0)
    lc.create_pods(e2e.admin, [body(e2e, f"busy-{i}", 1, qa) for i in range(2)])
    lc.wait_for(lambda: len(running(e2e, "busy-")) == 2, 60, "two pods hold both GPUs")
    long_ = body(e2e, "long", 1, qa)
    long_["spec"]["activeDeadlineSeconds"] = 36000
    lc.create_pod(e2e.admin, long_)
    time.sleep(1.1)  # a later creation time: FIFO would start "long" first
    lc.create_pod(e2e.admin, body(e2e, "short", 1, qa, labels={"kueue.x-k8s.io/max-exec-time-seconds": "600"}))
    time.sleep(1.0)
    assert running(e2e, "long") == [] and running(e2e, "short") == []
    kubelet.finish("busy-0")
    lc.wait_for(lambda: running(e2e, "short") == ["short"], 60, "the job with the shorter limit starts first")
    assert running(e2e, "long") == []
    lc.wait_for(lambda: sched.pool_driver.pool.sizes.n_seen >= 1, 20, "a size learned from busy-0, which left")
    kubelet.finish("busy-1")
    lc.wait_for(lambda: running(e2e, "long") == ["long"], 60, "the other job starts when a GPU frees again")
    no_overallocation(e2e)


def test_an_evicted_gang_whose_pods_return_keeps_its_books(e2e: E2E, kubelet: FakeKubelet,
                                                           priority_classes: dict[str, int]) -> None:
    """A gang gpupool preempted gets its submission and attained service back when its pods are re-created under
    the same PodGroup (the real apiserver's uid), as a requeued job in the job simulator; Tiresias does not put
    it first again as if it had never run."""
    lc.make_nodes(e2e.admin, f"{e2e.ns}-n", 1, gpus=2)
    (qa,) = queues(e2e, a={"quota": 2})
    sched = pool_scheduler(e2e, order="tiresias")
    lc.create_pod_group(e2e.admin, e2e.ns, "g", 2)
    gang = [body(e2e, f"g-{i}", 1, qa, group="g", priority_class="e2e-low") for i in range(2)]
    lc.create_pods(e2e.admin, gang)
    lc.wait_for(lambda: running(e2e, "g-") == ["g-0", "g-1"], 60, "the gang runs")
    name = f"{e2e.ns}/g"
    submit = sched.pool_driver.jobs[name].submit_time
    time.sleep(2.0)
    lc.create_pod(e2e.admin, body(e2e, "hi", 2, qa, priority_class="e2e-high"))
    lc.wait_for(lambda: running(e2e, "hi") == ["hi"], 60, "hi preempts the gang and binds")
    lc.wait_for(lambda: name in sched.pool_driver.evicted_books, 20, "the gang's books wait for its pods")
    served = sched.pool_driver.evicted_books[name][1].evicted_attained
    assert served >= 2 * 2.0 * 0.8, served  # two GPUs for about two seconds
    lc.create_pods(e2e.admin, [body(e2e, f"g-{i}", 1, qa, group="g", priority_class="e2e-low") for i in range(2)])
    lc.wait_for(lambda: (j := sched.pool_driver.jobs.get(name)) is not None and j.status == "pending", 20,
                "the re-created gang waits")
    job = sched.pool_driver.jobs[name]
    assert job.submit_time == submit and job.attained == served, (job.submit_time, submit, job.attained, served)
    kubelet.finish("hi")
    lc.wait_for(lambda: running(e2e, "g-") == ["g-0", "g-1"], 60, "the gang runs again when hi is done")
    no_overallocation(e2e)
