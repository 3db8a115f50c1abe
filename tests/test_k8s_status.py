"""Queue and PodGroup status (:mod:`gpupool.k8s.status`): what is computed from the cluster model, and what the
:class:`StatusWriter` sends (only what changed, conditions keeping their lastTransitionTime, 404/403 not retried),
against a recording fake and against the kmock API server over HTTP."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from gpupool.k8s import wire
from gpupool.k8s.api import status as status_mod
from gpupool.k8s.state import ClusterModel
from gpupool.k8s.status import (
    OWNED_FIELDS,
    StatusWriter,
    pod_group_statuses,
    queue_statuses,
    scheduler_plugins_phase,
    volcano_phase,
)
from test_k8s_scheduler import PODGROUPS, QUEUES, Harness, wait_for
from test_k8s_state import bumped, node, pod


def queue(name: str, quota: float | str = 0, limit: float | None = None, parent: str = "", weight: float = 1,
          generation: int = 1, rv: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {"quota": quota, "weight": weight}
    if limit is not None:
        spec["limit"] = limit
    if parent:
        spec["parent"] = parent
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "generation": generation, "resourceVersion": rv}, "spec": spec}


def group(name: str, min_member: int, kind: str = "podgroups", status: dict | None = None,
          rv: str = "1") -> dict[str, Any]:
    api = "scheduling.x-k8s.io/v1alpha1" if kind == "podgroups" else "scheduling.volcano.sh/v1beta1"
    obj: dict[str, Any] = {"apiVersion": api, "kind": "PodGroup",
                           "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
                           "spec": {"minMember": min_member}}
    if status is not None:
        obj["status"] = status
    return obj


def member(name: str, grp: str, node_name: str | None = None, phase: str | None = None, volcano: bool = False,
           **kw: Any) -> dict[str, Any]:
    p = pod(name, node_name=node_name, devices=(int(name[-1]) % 4,) if node_name else None, **kw)
    if volcano:
        p["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = grp
    else:
        p["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] = grp
    if phase:
        p["status"]["phase"] = phase
    return p


def model_with(nodes=(), pods=(), queues=None, groups=(), volcano=()) -> ClusterModel:
    m = ClusterModel()
    m.replace("nodes", list(nodes))
    m.replace("pods", list(pods))
    m.replace("queues", None if queues is None else list(queues))
    m.replace("podgroups", list(groups))
    m.replace("volcanopodgroups", list(volcano))
    m.refresh()
    return m


# ------------------------------------------------------------------ Queue status
def test_queue_status_adds_borrowed_pending_gpus_and_fair_share():
    m = model_with(
        [node("a", gpus=4)],
        [pod("r0", node_name="a", devices=(0,), queue="team-a"), pod("r1", node_name="a", devices=(1,), queue="team-a"),
         pod("r2", node_name="a", devices=(2,), queue="team-b"),
         pod("w0", queue="team-a"), pod("w1", gpu=2, queue="team-a"), pod("w2", gpu=0, fraction=0.25, queue="team-b")],
        [queue("research", quota=2, generation=3), queue("team-a", quota=0.5, limit=4, parent="research"),
         queue("team-b", quota=1, parent="research"), queue("broken", quota="lots")])
    st = queue_statuses(m, None)
    a = st["team-a"]
    assert (a["usedGPUs"], a["allocatedPods"], a["pendingPods"]) == (2, 2, 2)
    assert a["borrowedGPUs"] == 1.5 and a["pendingGPUs"] == 3
    assert "fairShareGPUs" not in a  # not known: left out
    assert st["team-b"]["borrowedGPUs"] == 0 and st["team-b"]["pendingGPUs"] == 0.25
    parent = st["research"]  # holds what its children hold; its quota covers 2 of the 3
    assert (parent["usedGPUs"], parent["borrowedGPUs"], parent["allocatedPods"]) == (3, 1, 3)
    assert parent["pendingPods"] == 0 and parent["observedGeneration"] == 3
    assert a["conditions"] == [{"type": "Valid", "status": "True", "reason": "SpecRead",
                                "message": "quota and limit in force"}]
    bad = st["broken"]
    assert bad["conditions"][0]["status"] == "False" and "borrowedGPUs" not in bad

    shares = queue_statuses(m, {"team-a": 2.00049, "research": 4})
    assert shares["team-a"]["fairShareGPUs"] == 2.0 and shares["research"]["fairShareGPUs"] == 4.0
    assert "fairShareGPUs" not in shares["team-b"]  # no entry: left out
    # every field written is one the CRD defines and the writer owns
    for s in shares.values():
        assert set(s) <= set(OWNED_FIELDS["queues"])


def test_queue_status_empty_without_queues():
    m = model_with([node("a")], [pod("w0", queue="team-a")], None)
    assert queue_statuses(m, {"team-a": 1}) == {}


# ------------------------------------------------------------------ PodGroup status
@pytest.mark.parametrize("counts, phase", [
    ({}, "Pending"),
    ({"pods": 2, "pending": 2}, "Pending"),
    ({"pods": 3, "scheduled": 2, "pending": 1}, "Pending"),
    ({"pods": 3, "scheduled": 3}, "Scheduled"),
    ({"pods": 3, "scheduled": 3, "running": 2}, "Scheduled"),
    ({"pods": 3, "scheduled": 3, "running": 2, "succeeded": 1}, "Running"),
    ({"pods": 3, "scheduled": 3, "running": 3}, "Running"),
    ({"pods": 3, "scheduled": 3, "running": 2, "failed": 1}, "Failed"),
    ({"pods": 3, "scheduled": 3, "succeeded": 3}, "Finished"),
    ({"pods": 4, "scheduled": 4, "succeeded": 3, "failed": 1}, "Finished"),
])
def test_scheduler_plugins_phase(counts, phase):
    assert scheduler_plugins_phase(3, counts) == phase


@pytest.mark.parametrize("counts, current, phase", [
    ({}, "", "Pending"),
    ({"pods": 2, "pending": 2}, "", "Pending"),
    ({"pods": 3, "pending": 3}, "", "Inqueue"),
    ({"pods": 1, "pending": 1}, "Inqueue", "Inqueue"),
    ({"pods": 3, "scheduled": 3}, "Inqueue", "Running"),
    ({"pods": 3, "scheduled": 3, "running": 1, "succeeded": 2}, "", "Running"),
    ({"pods": 3, "scheduled": 3, "succeeded": 2, "failed": 1}, "Running", "Completed"),
])
def test_volcano_phase(counts, current, phase):
    assert volcano_phase(3, counts, current) == phase


def test_pod_group_status_counts_members_of_both_kinds():
    owner = {"ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "u"}]}
    pods = [
        member("g0", "gang", "a", ownerReferences=owner["ownerReferences"]),  # bound, Running
        member("g1", "gang", "a"),
        member("g2", "gang", phase="Pending"),  # waiting
        member("g3", "gang", "a", phase="Succeeded"),  # terminal: its info is not parsed, the label is read
        member("g5", "gang", phase="Failed"),  # failed before being bound
        member("v0", "vc", volcano=True), member("v1", "vc", volcano=True),
        pod("loner", node_name="a", devices=(3,)),
    ]
    m = model_with([node("a", gpus=8)], pods, [], [group("gang", 3), group("empty", 2)],
                   [group("vc", 2, kind="volcanopodgroups")])
    st = pod_group_statuses(m)
    gang = st[("podgroups", "default/gang")]
    assert gang == {"running": 2, "succeeded": 1, "failed": 1, "scheduled": 3, "phase": "Failed",
                    "occupiedBy": "default/train"}
    assert st[("podgroups", "default/empty")] == {"running": 0, "succeeded": 0, "failed": 0, "scheduled": 0,
                                                  "phase": "Pending"}
    assert st[("volcanopodgroups", "default/vc")] == {"running": 0, "succeeded": 0, "failed": 0,
                                                      "phase": "Inqueue"}
    # assumed pods (placed, being bound) count as scheduled
    plan = m.cycle()
    assert {p.pod for p in plan.placements if p.node} >= {"default/v0", "default/v1"}
    st = pod_group_statuses(m)
    assert st[("volcanopodgroups", "default/vc")]["phase"] == "Running"
    # an occupiedBy already set is left alone
    m.apply("podgroups", "MODIFIED", group("gang", 3, status={"occupiedBy": "default/other"}, rv="2"))
    assert "occupiedBy" not in pod_group_statuses(m)[("podgroups", "default/gang")]


def test_pod_group_phase_follows_the_members():
    pods = [member(f"m{i}", "gang", phase="Pending") for i in range(2)]
    m = model_with([node("a", gpus=4)], pods, [], [group("gang", 2)])
    ref = ("podgroups", "default/gang")
    assert pod_group_statuses(m)[ref]["phase"] == "Pending"
    m.cycle()  # both placed (assumed)
    assert pod_group_statuses(m)[ref] == {"running": 0, "succeeded": 0, "failed": 0, "scheduled": 2,
                                          "phase": "Scheduled"}
    for i in range(2):
        rec = m.pods[f"default/m{i}"]
        m.apply("pods", "MODIFIED", bumped(dict(rec.obj), node_name=m.assumed[rec.key].node, phase="Running"))
    assert pod_group_statuses(m)[ref]["phase"] == "Running"
    for i in range(2):
        m.apply("pods", "MODIFIED", bumped(dict(m.pods[f"default/m{i}"].obj), phase="Succeeded"))
    assert pod_group_statuses(m)[ref] == {"running": 0, "succeeded": 2, "failed": 0, "scheduled": 2,
                                          "phase": "Finished"}


def test_unreadable_pod_group_is_unknown():
    bad = group("bad", 1)
    bad["spec"]["minMember"] = "two"
    m = model_with([node("a")], [], [], [bad])
    assert pod_group_statuses(m)[("podgroups", "default/bad")]["phase"] == "Unknown"


# ------------------------------------------------------------------ the writer, against a recording fake
class FakeApi:
    """Stands in for ``wire.call``: records (method, path, body, params); ``fail`` maps an object name to a status."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.fail: dict[str, int] = {}

    def __call__(self, api_client: Any, method: str, path: str, body: Any = None, *, content_type: str = "",
                 timeout: Any = None, path_params: dict[str, str] | None = None) -> bytes:
        assert method == "PATCH" and content_type == wire.MERGE_PATCH
        params = dict(path_params or {})
        code = self.fail.get(params["name"])
        if code:
            raise ApiException(status=code, reason="Nope")
        self.calls.append((path.format(**params), copy.deepcopy(body), params))
        return b"{}"

    def take(self) -> dict[str, dict[str, Any]]:
        out = {path: body["status"] for path, body, _ in self.calls}
        self.calls.clear()
        return out


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture()
def fake(monkeypatch) -> FakeApi:
    api = FakeApi()
    monkeypatch.setattr(status_mod, "call", api)
    return api


def writer(clock: Clock, stamps: list[str] | None = None, **kw: Any) -> StatusWriter:
    times = iter(stamps or [f"2025-01-01T00:00:{i:02d}Z" for i in range(60)])
    return StatusWriter(object(), lambda fn: fn(), 5.0, clock=clock, now=lambda: next(times), **kw)


Q = "/apis/gpupool.io/v1alpha1/queues/{}/status"
PG = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/default/podgroups/{}/status"
VPG = "/apis/scheduling.volcano.sh/v1beta1/namespaces/default/podgroups/{}/status"


def test_writer_sends_only_what_changed(fake):
    clock = Clock()
    m = model_with([node("a", gpus=4)], [pod("r0", node_name="a", devices=(0,), queue="team"),
                                         member("w0", "gang"), member("w1", "gang")],
                   [queue("team", quota=1)], [group("gang", 2)], [group("vc", 1, kind="volcanopodgroups")])
    w = writer(clock)
    assert w.update(m, {"team": 2}) == 3
    sent = fake.take()
    assert sent[Q.format("team")] == {"usedGPUs": 1.0, "allocatedPods": 1, "pendingPods": 0, "pendingGPUs": 0.0,
                                      "borrowedGPUs": 0.0, "fairShareGPUs": 2.0, "observedGeneration": 1,
                                      "conditions": [{"type": "Valid", "status": "True", "reason": "SpecRead",
                                                      "message": "quota and limit in force",
                                                      "lastTransitionTime": "2025-01-01T00:00:00Z"}]}
    assert sent[PG.format("gang")] == {"running": 0, "succeeded": 0, "failed": 0, "scheduled": 0, "phase": "Pending"}
    assert sent[VPG.format("vc")] == {"running": 0, "succeeded": 0, "failed": 0, "phase": "Pending"}
    assert w.update(m, {"team": 2}) == 0  # within interval_s
    clock.t = 5
    assert w.update(m, {"team": 2}) == 0 and not fake.calls  # nothing changed
    # the gang is placed: only the PodGroup's phase and count change
    m.cycle()
    clock.t = 10
    assert w.update(m, {"team": 2}) == 1
    assert fake.take() == {PG.format("gang"): {"scheduled": 2, "phase": "Scheduled"}}
    # fair share unknown again (pool off): the field is cleared, the condition is not re-sent
    clock.t = 15
    assert w.update(m, None) == 1
    assert fake.take() == {Q.format("team"): {"fairShareGPUs": None}}
    # the queue's spec turns unreadable: the condition changes, with a new lastTransitionTime (the watch shows
    # the object with the status written so far)
    edited = queue("team", quota="lots", generation=2, rv="2")
    edited["status"] = w.sent("queues", "team")
    m.apply("queues", "MODIFIED", edited)
    clock.t = 20
    w.update(m, None)
    q = fake.take()[Q.format("team")]
    assert q["conditions"][0]["status"] == "False" and q["conditions"][0]["lastTransitionTime"] == \
        "2025-01-01T00:00:04Z"
    assert q["borrowedGPUs"] is None and q["observedGeneration"] == 2


def test_writer_keeps_last_transition_time_and_compares_with_the_watched_status(fake):
    """A new writer (a new leader) compares with the status the objects carry: nothing is rewritten when it is
    right already, and a condition whose status is unchanged keeps its lastTransitionTime."""
    clock = Clock()
    m = model_with([node("a", gpus=4)], [pod("r0", node_name="a", devices=(0,), queue="team")], [queue("team", 1)],
                   [group("gang", 2)])
    first = writer(clock)
    first.update(m)
    written = fake.take()
    # the watch shows the objects with the status written
    q = queue("team", 1, rv="2")
    q["status"] = written[Q.format("team")]
    m.apply("queues", "MODIFIED", q)
    m.apply("podgroups", "MODIFIED", group("gang", 2, status=written[PG.format("gang")], rv="2"))
    second = writer(clock, stamps=["2025-06-01T00:00:00Z"] * 10)
    assert second.update(m) == 0 and not fake.calls
    # a change: the counts are sent, the Valid condition (same status) keeps its old time
    m.apply("pods", "ADDED", pod("r1", node_name="a", devices=(1,), queue="team"))
    clock.t = 5
    assert second.update(m) == 1
    assert fake.take() == {Q.format("team"): {"usedGPUs": 2.0, "allocatedPods": 2, "borrowedGPUs": 1.0}}
    # someone else overwrote the status (the watch shows it): it is put right
    q2 = copy.deepcopy(q)
    q2["metadata"]["resourceVersion"] = "3"
    q2["status"] = {"usedGPUs": 99, "conditions": []}
    m.apply("queues", "MODIFIED", q2)
    clock.t = 10
    assert second.update(m) == 1
    fixed = fake.take()[Q.format("team")]
    assert fixed["usedGPUs"] == 2.0 and fixed["conditions"][0]["lastTransitionTime"] == "2025-06-01T00:00:00Z"


def test_writer_does_not_retry_404_and_403_until_the_object_changes(fake):
    clock = Clock()
    logs: list[tuple[int, str, dict]] = []
    m = model_with([node("a")], [], [queue("gone", 1), queue("denied", 1), queue("flaky", 1)])
    fake.fail = {"gone": 404, "denied": 403, "flaky": 500}
    w = writer(clock, log=lambda level, event, **f: logs.append((level, event, f)))
    assert w.update(m) == 3
    assert not fake.calls and w.failures == 3
    assert {f["object"]: f["code"] for _, e, f in logs if e == "status_write_failed"} == \
        {"gone": 404, "denied": 403, "flaky": 500}
    assert all(level == 10 for level, _, _ in logs)  # DEBUG
    fake.fail = {}
    clock.t = 5
    assert w.update(m) == 1  # only the 500 is retried
    assert set(fake.take()) == {Q.format("flaky")}
    m.apply("queues", "MODIFIED", queue("denied", 2, rv="2"))  # the object changed: tried again
    clock.t = 10
    assert w.update(m) == 1
    assert set(fake.take()) == {Q.format("denied")}


def test_writer_off_and_kind_switches(fake):
    clock = Clock()
    m = model_with([node("a")], [], [queue("team", 1)], [group("gang", 1)])
    off = StatusWriter(object(), lambda fn: fn(), 0, clock=clock)
    assert off.update(m) == 0
    queues_only = writer(clock, pod_groups=False)
    assert queues_only.update(m) == 1 and set(fake.take()) == {Q.format("team")}

    def closed(fn: Callable[[], None]) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    stopping = StatusWriter(object(), closed, 5.0, clock=clock)
    assert stopping.update(m) == 0 and not fake.calls


def test_writer_one_patch_in_flight_per_object(fake):
    clock = Clock()
    pending: list[Callable[[], None]] = []
    m = model_with([node("a")], [], [queue("team", 1)])
    w = StatusWriter(object(), pending.append, 5.0, clock=clock)
    assert w.update(m) == 1
    clock.t = 5
    assert w.update(m) == 0  # still in flight
    pending.pop()()
    assert w.sent("queues", "team")["usedGPUs"] == 0
    clock.t = 10
    assert w.update(m) == 0  # written, unchanged


def test_writer_coalesces_a_change_within_the_interval_never_skips_it(fake):
    """Issue 29: a round asked for within ``interval_s`` of the last one was dropped, and the change it carried
    waited for whatever woke the caller next (the 30 s resync). It is deferred instead: ``due_in`` tells the
    caller when to come back, and the change is written then."""
    clock = Clock()
    m = model_with([node("a", gpus=4)], [pod("r0", node_name="a", devices=(0,), queue="team")], [queue("team", 1)])
    w = writer(clock)
    assert w.due_in() is None
    assert w.update(m) == 1 and fake.take()[Q.format("team")]["usedGPUs"] == 1.0
    assert w.due_in() is None  # written: nothing waits
    clock.t = 1.0
    m.apply("pods", "ADDED", pod("r1", node_name="a", devices=(1,), queue="team"))
    assert w.update(m) == 0 and not fake.calls  # within interval_s of the last round: deferred ...
    assert w.due_in() == 4.0  # ... to last + interval_s
    clock.t = 5.0
    assert w.due_in() == 0.0
    assert w.update(m) == 1  # ... and written then
    assert fake.take() == {Q.format("team"): {"usedGPUs": 2.0, "allocatedPods": 2, "borrowedGPUs": 1.0}}
    assert w.due_in() is None
    # a PATCH still in flight: the object is compared again one interval later
    pending: list[Callable[[], None]] = []
    slow = StatusWriter(object(), pending.append, 0.5, clock=clock)
    assert slow.update(m) == 1 and slow.due_in() is None
    clock.t = 6.0
    m.apply("pods", "ADDED", pod("r2", node_name="a", devices=(2,), queue="team"))
    assert slow.update(m) == 0 and slow.due_in() == 0.5
    pending.pop()()
    clock.t = 6.5
    assert slow.update(m) == 1
    pending.pop()()
    assert fake.calls[-1][1]["status"]["usedGPUs"] == 3.0
    assert StatusWriter(object(), pending.append, 0, clock=clock).due_in() is None  # off: never due


# ------------------------------------------------------------------ the writer, over HTTP (kmock)
@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


def test_writer_patches_status_subresources_on_the_mock_api_server(h):
    h.declare(QUEUES)
    h.declare(PODGROUPS)
    custom = client.CustomObjectsApi(h.api)
    wire.drain(custom.create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", queue("team", 1),
                                                   _preload_content=False))
    wire.drain(custom.create_namespaced_custom_object("scheduling.x-k8s.io", "v1alpha1", "default", "podgroups",
                                                      group("gang", 2), _preload_content=False))
    queues = h.objects(QUEUES)
    groups = h.objects(PODGROUPS)
    m = model_with([node("a", gpus=4)], [pod("r0", node_name="a", devices=(0,), queue="team"),
                                         pod("r1", node_name="a", devices=(1,), queue="team"),
                                         member("m0", "gang", "a"), member("m1", "gang")], queues, groups)
    clock = Clock()
    w = StatusWriter(h.api, lambda fn: fn(), 5.0, clock=clock)
    assert w.update(m, {"team": 3}) == 2

    def status(resource) -> dict[str, Any]:
        return h.objects(resource)[0].get("status") or {}

    q = wait_for(lambda: status(QUEUES).get("usedGPUs") == 2 and status(QUEUES), what="Queue status")
    assert (q["borrowedGPUs"], q["fairShareGPUs"], q["allocatedPods"]) == (1, 3, 2)
    assert q["conditions"][0]["type"] == "Valid" and q["conditions"][0]["lastTransitionTime"]
    g = wait_for(lambda: status(PODGROUPS).get("phase") and status(PODGROUPS), what="PodGroup status")
    assert g == {"running": 1, "succeeded": 0, "failed": 0, "scheduled": 1, "phase": "Pending"}
    assert h.objects(QUEUES)[0]["spec"] == {"quota": 1, "weight": 1}  # the status subresource only
    assert w.writes == 2 and w.failures == 0
    # a PodGroup that is gone: 404, logged, not retried until it changes
    m.apply("podgroups", "ADDED", group("ghost", 1, rv="7"))
    clock.t = 5
    assert w.update(m, {"team": 3}) == 1
    assert w.failures == 1
    clock.t = 10
    assert w.update(m, {"team": 3}) == 0


def test_status_bodies_are_json():
    """The bodies are plain JSON (numbers, strings, lists): nothing a merge patch cannot carry."""
    m = model_with([node("a")], [member("m0", "gang")], [queue("team", 1)], [group("gang", 1)])
    json.dumps(queue_statuses(m, {"team": 1.5}))
    json.dumps({f"{k}/{n}": v for (k, n), v in pod_group_statuses(m).items()})
