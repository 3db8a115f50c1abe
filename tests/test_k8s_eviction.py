"""Pool mode's evictions on the mock API server: the wire (the same checks as the real kube-apiserver passes in
``tests/e2e/test_eviction_wire.py``) and the scheduler's preemption executor, nominations and metrics."""

from __future__ import annotations

import json
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from e2e.test_eviction_wire import check_eviction_wire
from gpupool.k8s.metrics import SchedulerMetrics
from gpupool.k8s.snapshot import Placement, Plan, Preemption
from test_k8s_scheduler import Harness, gpu_node, gpu_pod, wait_for


@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


def test_mock_answers_evictions_as_the_real_apiserver(h):
    seen = check_eviction_wire(h.api, "wire")
    assert seen["two_pdbs"][0] == 500
    # every request the checks made was served by the mock's eviction subresource
    assert {(ns, dry) for ns, _, dry, _ in h.server.evictions} == {("wire", True), ("wire", False)}


# ------------------------------------------------------------------ the scheduler's preemption executor
class Script:
    """Stands in for ``ClusterModel.cycle``: returns the queued Plans one per cycle, then empty ones; records what
    the scheduler reports back (``preemption_refused``, ``eviction_failed``)."""

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        self.refused: list[tuple[int, dict[str, str]]] = []
        self.failed: list[tuple[str, str]] = []

    def cycle(self, prepare_state: Any = None, full_inventory: bool = False) -> Plan:
        return self.plans.pop(0) if self.plans else Plan([], None, "script")


def running(name: str, node: str = "n1", labels: dict[str, str] | None = None, grace: int = 30) -> dict[str, Any]:
    pod = gpu_pod(name, gpus=1, node=node, labels=labels)
    pod["spec"]["terminationGracePeriodSeconds"] = grace
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return pod


def scripted(h: Harness, leader: Any = None) -> tuple[Any, Script, SchedulerMetrics]:
    from gpupool.k8s.scheduler import Scheduler, SchedulerConfig

    cfg = SchedulerConfig(identity="gpupool-0", batch_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.3,
                          optional_retry_s=0.5, resync_s=0.5, watch_timeout_s=30)
    metrics = SchedulerMetrics()
    s = Scheduler(h.api, cfg, leader=leader, metrics=metrics)
    script = Script()
    s.model.cycle = script.cycle  # type: ignore[method-assign]
    s.model.preemption_refused = lambda pid, blocked: script.refused.append((pid, dict(blocked)))  # type: ignore
    s.model.eviction_failed = lambda key, why: script.failed.append((key, why))  # type: ignore[method-assign]
    h.schedulers.append(s)
    s.start()
    wait_for(lambda: s.synced, what="synced")
    return s, script, metrics


def push(s: Any, script: Script, plan: Plan) -> None:
    script.plans.append(plan)
    s.cache.changed.set()


def sample(metrics: SchedulerMetrics, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for smp in family.samples:
            if smp.name == name and smp.labels == labels:
                return smp.value
    raise KeyError(name)


def uid(h: Harness, name: str) -> str:
    return h.pod(name)["metadata"]["uid"]


def cond(pod: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    return next((c for c in ((pod or {}).get("status") or {}).get("conditions") or [] if c.get("type") == ctype), {})


def test_preemption_evicts_nominates_then_binds(h):
    h.create_node(gpu_node("n1", gpus=2))
    for name in ("v1", "v2"):
        h.create_pod(running(name, labels={"app": "train"}))
    h.create_pod(gpu_pod("pre", gpus=2))
    h.create_pdb("budget", {"app": "train"}, allowed=2, healthy=(2, 2))
    s, script, metrics = scripted(h)
    held = Placement("default/pre", "n1", gpus=(0, 1), gpu_milli=1000, nominated=True,
                     reason="waiting for 2 victim(s) to terminate on node n1")
    pre = Preemption(7, "reclaim", "default/pre", "reclaimed by queue team-a (below its fair share)",
                     [("default/v1", uid(h, "v1")), ("default/v2", uid(h, "v2"))], nominated=[held])
    push(s, script, Plan([held], None, "script", preemptions=[pre]))

    # victims: DisruptionTarget from gpupool first, then evicted (Terminating: bound, grace 30), budget used
    wait_for(lambda: all((h.pod(n) or {}).get("metadata", {}).get("deletionTimestamp") for n in ("v1", "v2")),
             what="victims Terminating")
    for name in ("v1", "v2"):
        patches = [i for i, u in enumerate(h.server.updates) if u[2] == name and u[3] == "status"
                   and cond(u[4], "DisruptionTarget").get("reason") == "PreemptionByScheduler"]
        assert len(patches) == 1 and cond(h.server.updates[patches[0]][4], "DisruptionTarget")["message"] == \
            pre.reason
        assert [e[2:] for e in h.server.evictions if e[1] == name] == [(True, 201), (False, 201)]  # dry run first
        assert cond(h.pod(name), "DisruptionTarget")["status"] == "True"
        assert cond(h.pod(name), "Ready")["status"] == "True"  # the strategic merge kept the other conditions
    st = h.pdb("budget")["status"]
    assert st["disruptionsAllowed"] == 0 and set(st["disruptedPods"]) == {"v1", "v2"}
    assert s.preemption_outcomes == [(7, "evicted")] and not script.refused and not script.failed

    # the preemptor: nominated, not bound
    wait_for(lambda: h.pod("pre")["status"].get("nominatedNodeName") == "n1", what="nominatedNodeName")
    assert not h.server.binds
    wait_for(lambda: [e for e in h.events_for("pre") if e["reason"] == "Nominated"], what="Nominated event")
    (ev,) = [e for e in h.events_for("pre") if e["reason"] == "Nominated"]
    assert ev["type"] == "Normal" and ev["message"] == held.reason
    for name in ("v1", "v2"):
        wait_for(lambda n=name: [e for e in h.events_for(n) if e["reason"] == "Preempted"], what="Preempted")
        (ev,) = [e for e in h.events_for(name) if e["reason"] == "Preempted"]
        assert ev["type"] == "Normal" and ev["message"] == pre.reason
    assert sample(metrics, "gpupool_preemptions_total", action="reclaim") == 1
    assert sample(metrics, "gpupool_evictions_total", result="evicted") == 2

    # the same nomination again: written once per (pod, node)
    push(s, script, Plan([held], None, "script"))
    wait_for(lambda: not script.plans, what="cycle")
    s.recorder.flush()
    nominations = [u for u in h.server.updates if u[2] == "pre" and "nominatedNodeName" in u[4].get("status", {})]
    assert len(nominations) == 1

    # the kubelets finish; the next plan places the pod for real: bound, latency observed, nomination cleared
    for name in ("v1", "v2"):
        h.call(lambda n=name: h.server.finish_termination("default", n))
    wait_for(lambda: h.pod("v1") is None and h.pod("v2") is None, what="victims gone")
    push(s, script, Plan([Placement("default/pre", "n1", gpus=(0, 1), gpu_milli=1000, waited_s=4.0)], None,
                         "script"))
    wait_for(lambda: ("default", "pre", "n1") in h.server.binds, what="bound")
    wait_for(lambda: "nominatedNodeName" not in h.pod("pre")["status"], what="nomination cleared")
    assert sample(metrics, "gpupool_preemption_latency_seconds_count") == 1
    assert 4.0 <= sample(metrics, "gpupool_preemption_latency_seconds_sum") < 10


def test_blocked_dry_run_evicts_nothing_and_tells_the_model(h):
    h.create_node(gpu_node("n1", gpus=2))
    h.create_pod(running("v1", labels={"app": "a"}))
    h.create_pod(running("v2", labels={"app": "b"}))
    h.create_pod(gpu_pod("pre", gpus=2))
    h.create_pdb("guard", {"app": "b"}, allowed=0, healthy=(2, 2))
    s, script, metrics = scripted(h)
    held = Placement("default/pre", "n1", gpus=(0, 1), gpu_milli=1000, nominated=True,
                     reason="waiting for 2 victim(s) to terminate on node n1")
    pre = Preemption(3, "preempt", "default/pre", "preempted by default/pre",
                     [("default/v1", uid(h, "v1")), ("default/v2", uid(h, "v2"))], nominated=[held])
    push(s, script, Plan([held], None, "script", preemptions=[pre]))
    wait_for(lambda: script.refused, what="preemption_refused")
    ((pid, blocked),) = script.refused
    assert pid == 3 and list(blocked) == ["default/v2"]
    assert blocked["default/v2"].startswith("429 Cannot evict pod as it would violate the pod's disruption budget.")
    assert "The disruption budget guard needs 2 healthy pods and has 2 currently" in blocked["default/v2"]
    assert all(dry for _, _, dry, _ in h.server.evictions)  # dry runs only: nothing evicted
    for name in ("v1", "v2"):
        assert not h.pod(name)["metadata"].get("deletionTimestamp") and not cond(h.pod(name), "DisruptionTarget")
    assert h.pdb("guard")["status"]["disruptionsAllowed"] == 0
    wait_for(lambda: [e for e in h.events_for("pre") if e["reason"] == "PreemptionBlocked"], what="event")
    (ev,) = [e for e in h.events_for("pre") if e["reason"] == "PreemptionBlocked"]
    assert ev["type"] == "Warning" and "default/v2" in ev["message"] and "disruption budget" in ev["message"]
    assert "default/v1" not in ev["message"]
    assert sample(metrics, "gpupool_evictions_total", result="refused") == 1
    assert sample(metrics, "gpupool_evictions_total", result="evicted") == 0
    assert sample(metrics, "gpupool_preemptions_total", action="preempt") == 0

    # the model drops the nomination: nominatedNodeName is cleared
    wait_for(lambda: h.pod("pre")["status"].get("nominatedNodeName") == "n1", what="nominated")
    push(s, script, Plan([], None, "script", denominated=["default/pre"]))
    wait_for(lambda: "nominatedNodeName" not in h.pod("pre")["status"], what="denominated")


def test_eviction_refused_after_its_dry_run_and_victims_already_gone(h):
    h.create_node(gpu_node("n1", gpus=4))
    for name in ("v1", "v2"):
        h.create_pod(running(name))
    s, script, metrics = scripted(h)

    async def refuse_v2(server, ns, name, dry):  # a budget that changed between dry run and eviction
        if name == "v2" and not dry:
            import kmock
            raise kmock.KubernetesError(status=429, reason="TooManyRequests", message="Cannot evict pod as it "
                                        "would violate the pod's disruption budget.")

    h.server.on_evict = refuse_v2
    pre = Preemption(11, "reclaim", "", "reclaimed by queue team-b",
                     [("default/v1", uid(h, "v1")), ("default/v2", uid(h, "v2")), ("default/ghost", "uid-ghost")])
    assert s._preempt(pre) == "evicted"
    assert h.pod("v1")["metadata"].get("deletionTimestamp") and not h.pod("v2")["metadata"].get("deletionTimestamp")
    wait_for(lambda: script.failed, what="eviction_failed")
    assert script.failed == [("default/v2", "429 Cannot evict pod as it would violate the pod's disruption budget.")]
    assert not script.refused
    assert sample(metrics, "gpupool_evictions_total", result="evicted") == 1
    assert sample(metrics, "gpupool_evictions_total", result="failed") == 1
    assert sample(metrics, "gpupool_evictions_total", result="gone") == 1
    assert sample(metrics, "gpupool_preemptions_total", action="reclaim") == 1


def test_a_victim_whose_eviction_is_refused_is_no_disruption_target_any_more(h):
    """Issue 29 (minor): the victim gets DisruptionTarget=True (PreemptionByScheduler) before its eviction, as
    kube-scheduler does; when the eviction is then refused (a PodDisruptionBudget's 429 after the dry run passed,
    or the API failing) the pod runs on and must not keep saying it is being disrupted: the condition goes to
    False, as the disruption controller would do for a stale one, with the refusal as its message."""
    h.create_node(gpu_node("n1", gpus=4))
    for name in ("v1", "v2"):
        h.create_pod(running(name))
    s, script, _ = scripted(h)

    async def refuse_v2(server, ns, name, dry):
        if name == "v2" and not dry:
            import kmock
            raise kmock.KubernetesError(status=429, reason="TooManyRequests", message="Cannot evict pod as it "
                                        "would violate the pod's disruption budget.")

    h.server.on_evict = refuse_v2
    pre = Preemption(12, "reclaim", "", "reclaimed by queue team-b",
                     [("default/v1", uid(h, "v1")), ("default/v2", uid(h, "v2"))])
    assert s._preempt(pre) == "evicted"
    marked = [u for u in h.server.updates if u[2] == "v2" and u[3] == "status"
              and cond(u[4], "DisruptionTarget").get("status") == "True"]
    assert marked  # set before the eviction was tried, as kube-scheduler does
    c = wait_for(lambda: cond(h.pod("v2"), "DisruptionTarget").get("status") == "False"
                 and cond(h.pod("v2"), "DisruptionTarget"), what="DisruptionTarget cleared on v2")
    assert "refused" in c["message"] and "429" in c["message"]
    assert cond(h.pod("v2"), "Ready")["status"] == "True"  # the other conditions kept
    assert cond(h.pod("v1"), "DisruptionTarget")["status"] == "True"  # evicted: it stays
    assert not h.pod("v2")["metadata"].get("deletionTimestamp")


def test_a_replica_that_does_not_lead_evicts_nothing(h):
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(running("v1"))
    s, script, _ = scripted(h, leader=lambda: False)
    pre = Preemption(1, "reclaim", "", "x", [("default/v1", uid(h, "v1"))])
    assert s._preempt(pre) == "not_leader"
    assert not h.server.evictions and not h.pod("v1")["metadata"].get("deletionTimestamp")
    wait_for(lambda: script.refused, what="reported")  # applied by the standby's model loop too
    assert script.refused == [(1, {"default/v1": "not the leader"})]


def test_uid_precondition_protects_a_replaced_pod(h):
    """A victim deleted and re-created under the same name (another UID) is never evicted: 409 blocks it."""
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(running("v1"))
    s, script, _ = scripted(h)
    pre = Preemption(5, "reclaim", "", "x", [("default/v1", "uid-of-the-old-v1")])
    assert s._preempt(pre) == "refused"
    ((pid, blocked),) = wait_for(lambda: script.refused, what="preemption_refused")
    assert pid == 5 and blocked["default/v1"].startswith("409 ") and "UID in the precondition" in blocked["default/v1"]
    assert not h.pod("v1")["metadata"].get("deletionTimestamp")
    assert "DisruptionTarget" not in json.dumps(h.pod("v1"))
    assert [(n, dry) for _, n, dry, _ in h.server.evictions] == [("v1", True)]
