"""gpupool.agent.publisher (labels it owns, the inventory annotation, conditions, retries) and gpupool.agent.run
(the loop on the FakeBackend with a fake clock). The API server is a small in-memory Node store that applies
JSON merge patches with the resourceVersion precondition and strategic merge of status.conditions by type, as
kube-apiserver does (tests/e2e/test_agent_e2e.py checks the same against the real server)."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from gpupool.agent import publisher as pub
from gpupool.agent.backend import GpuEvent
from gpupool.agent.publisher import NodePublisher, plan_patches, rfc3339, valid_label
from gpupool.agent.report import (
    ANN_GPU_INVENTORY,
    ANN_OWNED_LABELS,
    COND_GPU_HEALTHY,
    COND_STACK_READY,
    Condition,
    GpuHealth,
    NodeReport,
    read_inventory,
)
from gpupool.agent.run import Agent, FakeClock, call_with, report_json

H200 = Path(__file__).resolve().parents[2] / "shared" / "reference" / "nvml-h200" / "nvml.json"
T0 = 1_800_000_000.0


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge(out.get(k), v)
    return out


class FakeApi:
    """One Node behind GET / PATCH (merge on the object, strategic merge of conditions on /status)."""

    def __init__(self, node: dict[str, Any]) -> None:
        self.node = node
        self.node.setdefault("metadata", {})["resourceVersion"] = "1"
        self.requests: list[tuple[str, str, Any]] = []
        self.fail: list[Exception] = []  # raised by the next requests, in order
        self.on_get = None  # called after a GET, before answering (simulate a concurrent writer)

    def _bump(self) -> None:
        md = self.node["metadata"]
        md["resourceVersion"] = str(int(md["resourceVersion"]) + 1)

    def call(self, api: Any, method: str, path: str, body: Any = None, *, content_type: str = "", timeout: Any = None,
             path_params: Any = None) -> bytes:
        path = path.format(**(path_params or {}))
        self.requests.append((method, path, copy.deepcopy(body)))
        if self.fail:
            raise self.fail.pop(0)
        if path.endswith("/runtimeclasses"):
            return json.dumps({"items": [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}]}).encode()
        if method == "GET":
            answer = json.dumps(self.node).encode()
            if self.on_get is not None:
                hook, self.on_get = self.on_get, None
                hook(self)
            return answer
        assert method == "PATCH"
        if path.endswith("/status"):
            assert content_type == "application/strategic-merge-patch+json"
            conds = {c["type"]: c for c in self.node.setdefault("status", {}).get("conditions") or []}
            for c in body["status"]["conditions"]:
                conds[c["type"]] = {**conds.get(c["type"], {}), **c}
            self.node["status"]["conditions"] = list(conds.values())
        else:
            assert content_type == "application/merge-patch+json"
            rv = body["metadata"].get("resourceVersion")
            if rv is not None and rv != self.node["metadata"]["resourceVersion"]:
                raise ApiException(status=409, reason="Conflict")
            body = copy.deepcopy(body)
            body["metadata"].pop("resourceVersion", None)
            self.node = merge(self.node, body)
        self._bump()
        return json.dumps(self.node).encode()

    def writes(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] == "PATCH"]


def node(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "gpu-1", "labels": {"kubernetes.io/hostname": "gpu-1", **(labels or {})},
                         "annotations": dict(annotations or {})},
            "status": {"allocatable": {"nvidia.com/gpu": "1", "cpu": "8"}, "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi(node())
    monkeypatch.setattr(pub.wire, "call", fake.call)
    return fake


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def publisher(clock: Clock | None = None, **kw: Any) -> NodePublisher:
    return NodePublisher(object(), "gpu-1", sleep=lambda s: None, clock=clock or Clock(), **kw)


HEALTHY = Condition(COND_GPU_HEALTHY, "True", "AllGpusHealthy", "1 GPU healthy")
STACK = Condition(COND_STACK_READY, "True", "StackReady", "driver 580.159.04")


def report(labels: dict[str, str] | None = None, healthy: bool = True, **inv: Any) -> NodeReport:
    gpus = [{"index": 0, "uuid": "GPU-1", "healthy": healthy, "reason": "" if healthy else "XidError"}]
    cond = HEALTHY if healthy else Condition(COND_GPU_HEALTHY, "False", "XidError", "GPU 0 (GPU-1): XID 79")
    return NodeReport(labels={"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.count": "1",
                              **(labels or {})} if labels is None or labels else {},
                      inventory={"version": 1, "gpus": gpus, **inv}, conditions=[cond, STACK])


# ---------------------------------------------------------------------- labels and annotations
def test_first_publish_sets_labels_owned_list_inventory_and_conditions(api):
    p = publisher()
    assert p.publish(report()) is True
    md = api.node["metadata"]
    assert md["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200" and md["labels"]["nvidia.com/gpu.count"] == "1"
    assert md["labels"]["kubernetes.io/hostname"] == "gpu-1"  # others' labels untouched
    assert md["annotations"][ANN_OWNED_LABELS] == "nvidia.com/gpu.count,nvidia.com/gpu.product"
    assert read_inventory(md["annotations"])["gpus"][0]["uuid"] == "GPU-1"
    conds = {c["type"]: c for c in api.node["status"]["conditions"]}
    assert set(conds) == {"Ready", COND_GPU_HEALTHY, COND_STACK_READY}
    assert conds["Ready"]["reason"] == "KubeletReady"  # merged by type: the kubelet's condition stays
    assert conds[COND_GPU_HEALTHY]["status"] == "True"
    assert conds[COND_GPU_HEALTHY]["lastTransitionTime"] == rfc3339(T0) == "2027-01-15T08:00:00Z"
    assert [r[1] for r in api.writes()] == ["/api/v1/nodes/gpu-1", "/api/v1/nodes/gpu-1/status"]
    assert api.writes()[0][2]["metadata"]["resourceVersion"] == "1"  # optimistic concurrency


def test_unchanged_report_writes_nothing(api):
    p = publisher()
    assert p.publish(report())
    n = len(api.writes())
    assert p.publish(report()) is False
    assert len(api.writes()) == n
    assert [r[0] for r in api.requests[-1:]] == ["GET"]  # one GET per publish, nothing else


def test_a_label_owned_by_gfd_is_never_touched_nor_claimed(api):
    api.node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-H200-141GB"  # GFD's spelling
    p = publisher()
    assert p.publish(report())
    md = api.node["metadata"]
    assert md["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200-141GB"
    assert md["annotations"][ANN_OWNED_LABELS] == "nvidia.com/gpu.count"
    assert "nvidia.com/gpu.product" not in api.writes()[0][2]["metadata"]["labels"]
    assert p.last_plan is not None and p.last_plan.skipped == {"nvidia.com/gpu.product": "NVIDIA-H200-141GB"}
    # the next rounds leave it as well, and GFD removing it later does not make the agent write it back blindly:
    assert p.publish(report()) is False
    del api.node["metadata"]["labels"]["nvidia.com/gpu.product"]
    assert p.publish(report())  # now nobody owns it: the agent sets it and claims it
    assert api.node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert "nvidia.com/gpu.product" in api.node["metadata"]["annotations"][ANN_OWNED_LABELS]


def test_owned_labels_are_updated_and_removed(api):
    p = publisher()
    p.publish(report({"nvidia.com/mig-1g.18gb.count": "7", "nvidia.com/mig.strategy": "mixed"}))
    assert api.node["metadata"]["labels"]["nvidia.com/mig-1g.18gb.count"] == "7"
    assert p.publish(report({"nvidia.com/mig-3g.71gb.count": "2", "nvidia.com/mig.strategy": "mixed"}))
    labels = api.node["metadata"]["labels"]
    assert "nvidia.com/mig-1g.18gb.count" not in labels and labels["nvidia.com/mig-3g.71gb.count"] == "2"
    owned = api.node["metadata"]["annotations"][ANN_OWNED_LABELS].split(",")
    assert "nvidia.com/mig-1g.18gb.count" not in owned and "nvidia.com/mig-3g.71gb.count" in owned
    # a report with no labels at all removes every owned label and the list itself
    assert p.publish(NodeReport(labels={}, inventory={"version": 1, "gpus": []}, conditions=[]))
    assert not [k for k in api.node["metadata"]["labels"] if k.startswith("nvidia.com/")]
    assert ANN_OWNED_LABELS not in api.node["metadata"]["annotations"]
    assert api.node["metadata"]["labels"]["kubernetes.io/hostname"] == "gpu-1"


def test_an_owned_label_someone_changed_is_set_back(api):
    p = publisher()
    p.publish(report())
    api.node["metadata"]["labels"]["nvidia.com/gpu.count"] = "9"
    assert p.publish(report())
    assert api.node["metadata"]["labels"]["nvidia.com/gpu.count"] == "1"


def test_invalid_label_values_are_dropped_not_sent():
    assert valid_label("nvidia.com/gpu.product", "NVIDIA-H200") and valid_label("gpupool.io/x", "")
    assert not valid_label("nvidia.com/gpu.product", "NVIDIA H200")  # a space
    assert not valid_label("nvidia.com/x", "a" * 64) and not valid_label("bad key/x/y", "1")
    plan = plan_patches(node(), report({"nvidia.com/gpu.product": "NVIDIA H200"}), T0)
    assert plan.invalid == {"nvidia.com/gpu.product": "NVIDIA H200"}
    assert "nvidia.com/gpu.product" not in plan.metadata["metadata"]["labels"]


def test_inventory_change_alone_is_one_metadata_patch(api):
    p = publisher()
    p.publish(report())
    n = len(api.writes())
    assert p.publish(report(healthy=True, driver="580.159.05"))
    (w,) = api.writes()[n:]
    assert w[1] == "/api/v1/nodes/gpu-1" and set(w[2]["metadata"]) == {"resourceVersion", "annotations"}
    assert list(w[2]["metadata"]["annotations"]) == [ANN_GPU_INVENTORY]


# ---------------------------------------------------------------------- conditions
def test_condition_transition_time_kept_while_status_unchanged_heartbeat_refreshed(api):
    clock = Clock()
    p = publisher(clock, heartbeat_s=60)
    p.publish(report())
    clock.t += 30
    assert p.publish(report()) is False  # nothing changed, heartbeat young
    clock.t += 40
    assert p.publish(report())  # heartbeat older than 60 s: rewritten
    c = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert c["lastTransitionTime"] == rfc3339(T0) and c["lastHeartbeatTime"] == rfc3339(T0 + 70)
    clock.t += 5
    assert p.publish(report(healthy=False))  # the transition
    c = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert (c["status"], c["reason"]) == ("False", "XidError")
    assert c["lastTransitionTime"] == rfc3339(T0 + 75)
    # a message change with the same status keeps the transition time
    clock.t += 5
    r = report(healthy=False)
    r.conditions[0] = Condition(COND_GPU_HEALTHY, "False", "XidError", "GPU 0 (GPU-1): XID 79 twice")
    assert p.publish(r)
    c = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert c["lastTransitionTime"] == rfc3339(T0 + 75) and c["message"].endswith("twice")
    status_writes = [w for w in api.writes() if w[1].endswith("/status")]
    assert all(len(w[2]["status"]["conditions"]) <= 2 for w in status_writes)
    assert all(wc["type"] != "Ready" for w in status_writes for wc in w[2]["status"]["conditions"])


# ---------------------------------------------------------------------- errors and retries
def test_conflict_rereads_and_respects_a_label_gfd_set_in_between(api):
    p = publisher()

    def gfd_writes(fake: FakeApi) -> None:
        fake.node["metadata"]["labels"]["nvidia.com/gpu.product"] = "GFD-SAYS"
        fake._bump()

    api.on_get = gfd_writes
    assert p.publish(report())
    assert api.node["metadata"]["labels"]["nvidia.com/gpu.product"] == "GFD-SAYS"
    assert "nvidia.com/gpu.product" not in api.node["metadata"]["annotations"][ANN_OWNED_LABELS]
    assert [r[0] for r in api.requests].count("GET") == 2 and p.failures == 0


@pytest.mark.parametrize("error", [ApiException(status=503, reason="ServiceUnavailable"),
                                   ApiException(status=500, reason="InternalError"),
                                   ApiException(status=429, reason="TooManyRequests"),
                                   urllib3.exceptions.ProtocolError("Connection reset by peer"),
                                   ConnectionRefusedError(111, "Connection refused")])
def test_transient_errors_are_retried_with_backoff(api, error):
    sleeps: list[float] = []
    p = NodePublisher(object(), "gpu-1", sleep=sleeps.append, clock=Clock(), backoff_s=0.2)
    api.fail = [error, copy.copy(error)]
    assert p.publish(report()) is True
    assert len(sleeps) == 2 and 0.1 <= sleeps[0] <= 0.3 and 0.2 <= sleeps[1] <= 0.6  # doubled, jittered
    assert p.failures == 0 and p.last_error == ""


def test_gives_up_after_retries_and_never_raises(api):
    p = publisher(retries=3)
    api.fail = [ApiException(status=503, reason="ServiceUnavailable")] * 10
    assert p.publish(report()) is False
    assert p.failures == 1 and p.last_error.startswith("503")
    assert len(api.requests) == 3
    api.fail = []
    assert p.publish(report()) is True  # next round works


@pytest.mark.parametrize("status", [403, 404, 422])
def test_permanent_errors_are_not_retried(api, status):
    p = publisher()
    api.fail = [ApiException(status=status, reason="x")]
    assert p.publish(report()) is False
    assert len(api.requests) == 1 and p.failures == 1


def test_unexpected_error_does_not_escape(api):
    p = publisher(retries=2)
    api.fail = [ValueError("garbage"), ValueError("garbage")]
    assert p.publish(report()) is False


def test_refresh_allocatable_and_runtime_classes(api):
    p = publisher()
    n = p.refresh()
    assert n is not None and p.allocatable() == {"nvidia.com/gpu": "1", "cpu": "8"}
    assert [rc["handler"] for rc in p.runtime_classes()] == ["nvidia"]
    api.fail = [ApiException(status=404, reason="NotFound")]
    assert p.refresh() is None


def test_empty_node_name_is_refused():
    with pytest.raises(ValueError, match="NODE_NAME"):
        NodePublisher(object(), "")


# ---------------------------------------------------------------------- the agent loop
@dataclass
class Disc:
    devices: list[Any]


class StubTracker:
    """Health from events: an XID marks a GPU unhealthy, a reset heals it (the real tracker: health.py)."""

    def __init__(self) -> None:
        self.state: dict[str, GpuHealth] = {}

    def observe(self, samples, events):
        for s in samples:
            self.state.setdefault(s.uuid, GpuHealth(s.uuid))
            if s.lost:
                self.state[s.uuid] = GpuHealth(s.uuid, False, "FellOffTheBus", "lost")
        for e in events:
            if e.kind == "xid":
                self.state[e.uuid] = GpuHealth(e.uuid, False, "XidError", f"XID {e.code}", xid=e.code)
            elif e.kind == "reset":
                self.state[e.uuid] = GpuHealth(e.uuid)
        return dict(self.state)


def stub_parts() -> dict[str, Any]:
    def labels(d, strategy):
        return {"nvidia.com/gpu.count": str(len(d.devices)), "nvidia.com/mig.strategy": strategy,
                **{f"nvidia.com/mig-{m.profile}.count": "1" for g in d.devices for m in g.mig_instances}}

    def inventory(d, health, now):
        return {"version": 1, "time": rfc3339(now), "gpus": [
            {"index": g.index, "uuid": g.uuid, "healthy": health.get(g.uuid, GpuHealth(g.uuid)).healthy,
             "reason": health.get(g.uuid, GpuHealth(g.uuid)).reason} for g in d.devices]}

    def cond(health):
        bad = [h for h in health.values() if not h.healthy]
        if bad:
            return Condition(COND_GPU_HEALTHY, "False", bad[0].reason, bad[0].message)
        return Condition(COND_GPU_HEALTHY, "True", "AllGpusHealthy", f"{len(health)} healthy")

    return {"discover": lambda b: Disc(b.devices()), "labels": labels, "inventory": inventory,
            "health_condition": cond}


class Stack:
    def __init__(self, ok: bool) -> None:
        self.ok = ok

    def condition(self):
        return STACK if self.ok else Condition(COND_STACK_READY, "False", "DevicePluginNotRegistered", "no gpus")

    def label(self):
        return {"gpupool.io/gpu-stack-ready": "true" if self.ok else "false"}


def fake_backend(clock: FakeClock, gpus: int = 2):
    from gpupool.agent.fake import FakeBackend

    return FakeBackend.from_dict({"gpus": [{"name": "NVIDIA H100 80GB HBM3", "count": gpus}]}, clock=clock.now)


def make_agent(api, clock, backend=None, validator=None, exporter=None, interval_s=10.0) -> Agent:
    backend = backend or fake_backend(clock)
    p = NodePublisher(object(), "gpu-1", sleep=clock.sleep, clock=clock.now)
    return Agent(backend, p, StubTracker(), validator, exporter, interval_s, clock, **stub_parts())


def inv(api) -> dict[str, Any]:
    return read_inventory(api.node["metadata"]["annotations"])


def test_agent_xid_is_published_within_the_event_poll_not_the_interval(api):
    clock = FakeClock(T0)
    backend = fake_backend(clock)
    seen: list[dict[str, Any]] = []
    validator_calls: list[dict[str, Any]] = []

    def validator(backend, *, node=None, allocatable=None, runtime_classes=None):
        validator_calls.append({"allocatable": allocatable, "rc": runtime_classes, "node": node is not None})
        return Stack(bool(allocatable))

    class Exporter:
        def update(self, samples, health=None, *, discovery=None):
            seen.append({"samples": len(samples), "health": dict(health or {})})

    agent = make_agent(api, clock, backend, validator, Exporter(), interval_s=30.0)
    agent.discover()
    agent.round()
    assert api.node["metadata"]["labels"]["nvidia.com/gpu.count"] == "2"
    assert api.node["metadata"]["labels"]["gpupool.io/gpu-stack-ready"] == "true"
    assert validator_calls[0] == {"allocatable": {"nvidia.com/gpu": "1", "cpu": "8"},
                                  "rc": [{"metadata": {"name": "nvidia"}, "handler": "nvidia"}], "node": True}
    assert seen[0]["samples"] == 2
    uuid0 = backend.device(0).uuid
    t_inject = clock.now()
    backend.xid(0, 79, "GPU has fallen off the bus")
    # the loop's poll picks it up at once and runs a round
    assert agent.poll_events(1.0) is True
    agent.round()
    assert clock.now() - t_inject < 2.0
    gpus = {g["uuid"]: g for g in inv(api)["gpus"]}
    assert gpus[uuid0]["healthy"] is False and gpus[uuid0]["reason"] == "XidError"
    assert gpus[backend.device(1).uuid]["healthy"] is True
    cond = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert cond["status"] == "False" and cond["reason"] == "XidError"
    assert seen[-1]["health"][uuid0].xid == 79
    # reset: healthy again, and rediscovery ran
    before = agent.discoveries
    backend.reset(0)
    assert agent.poll_events(1.0)
    agent.round()
    assert agent.discoveries == before + 1
    assert all(g["healthy"] for g in inv(api)["gpus"])
    cond = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert cond["status"] == "True"


def test_agent_run_loop_with_fake_clock_rounds_every_interval_and_stops(api):
    clock = FakeClock(T0)
    backend = fake_backend(clock)
    agent = make_agent(api, clock, backend, interval_s=10.0)
    agent.event_poll_s = 1.0
    agent.run(max_rounds=4)
    assert agent.rounds == 4 and backend.closed
    assert 29.0 <= clock.now() - T0 <= 31.0  # rounds at 0, 10, 20, 30 s
    assert all(s <= 1.0 for s in clock.sleeps)  # never slept longer than one event poll
    assert agent.published == 1  # only the first round changed something
    assert agent.alive()


def test_agent_run_publishes_an_xid_between_intervals(api):
    clock = FakeClock(T0)
    backend = fake_backend(clock)
    agent = make_agent(api, clock, backend, interval_s=60.0)
    polls = {"n": 0}
    real_events = backend.events

    def events(timeout_s):
        polls["n"] += 1
        if polls["n"] == 3:
            backend.xid(1, 48)  # double-bit ECC XID while waiting for the next interval
        return real_events(timeout_s)

    backend.events = events
    agent.run(max_rounds=2)
    assert clock.now() - T0 < 5.0  # second round came from the event, not the 60 s interval
    gpus = {g["uuid"]: g for g in inv(api)["gpus"]}
    assert gpus[backend.device(1).uuid]["healthy"] is False


def test_agent_mig_change_triggers_rediscovery_and_labels(api):
    clock = FakeClock(T0)
    from gpupool.agent.fake import FakeBackend

    if not H200.exists():
        pytest.skip(f"{H200} not present")
    backend = FakeBackend.from_nvml_recording(H200, clock=clock.now)
    agent = make_agent(api, clock, backend)
    agent.round()
    assert agent.discoveries == 1
    backend.set_mig(0, True, [{"profile": "3g.71gb", "start": 0}])
    agent.round()
    assert agent.discoveries == 2
    assert api.node["metadata"]["labels"]["nvidia.com/mig-3g.71gb.count"] == "1"


def test_agent_driver_failure_publishes_unknown_and_keeps_running(api):
    clock = FakeClock(T0)
    backend = fake_backend(clock)
    agent = make_agent(api, clock, backend)
    agent.round()
    backend.fail_driver("NVML: Driver Not Loaded")
    agent.round()
    cond = {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]
    assert (cond["status"], cond["reason"]) == ("Unknown", "DriverUnavailable")
    assert "Driver Not Loaded" in cond["message"]
    backend.heal_driver()
    agent.round()
    assert {c["type"]: c for c in api.node["status"]["conditions"]}[COND_GPU_HEALTHY]["status"] == "True"


def test_agent_survives_a_failing_validator_exporter_and_api(api):
    clock = FakeClock(T0)

    def validator(**kw):
        raise RuntimeError("boom")

    class Exporter:
        def update(self, samples):
            raise RuntimeError("bang")

    agent = make_agent(api, clock, validator=validator, exporter=Exporter())
    api.fail = [ApiException(status=503, reason="x")] * 50
    agent.run(max_rounds=3)
    assert agent.rounds == 3 and agent.errors >= 4 and agent.published == 0
    api.fail = []
    agent.round()
    assert agent.published == 1


def test_agent_stop_ends_the_loop():
    clock = FakeClock(T0)
    agent = Agent(fake_backend(clock), None, StubTracker(), interval_s=5.0, clock=clock, **stub_parts())
    real = agent.poll_events

    def poll(timeout):
        if clock.now() - T0 > 12:
            agent.stop()
        return real(timeout)

    agent.poll_events = poll
    agent.run()
    assert agent.stopped and 12 < clock.now() - T0 < 15


def test_dry_run_agent_writes_nothing_and_reports_json():
    clock = FakeClock(T0)
    agent = Agent(fake_backend(clock), None, StubTracker(), validator=lambda **kw: Stack(True), clock=clock,
                  **stub_parts())
    doc = report_json(agent.round())
    assert doc["labels"]["gpupool.io/gpu-stack-ready"] == "true"
    assert [c["type"] for c in doc["conditions"]] == [COND_GPU_HEALTHY, COND_STACK_READY]
    assert json.loads(json.dumps(doc)) == doc


def test_call_with_passes_what_a_function_takes():
    def f(a, *, b=None):
        return (a, b)

    assert call_with(f, a=1, b=2, c=3) == (1, 2)
    assert call_with(lambda **kw: sorted(kw), x=1, y=2) == ["x", "y"]
    assert call_with(f, 0, a=9, b=1) == (0, 1)


def test_urgent_events_are_kept_for_the_next_round():
    clock = FakeClock(T0)
    backend = fake_backend(clock)
    agent = Agent(backend, None, StubTracker(), clock=clock, **stub_parts())
    agent.round()
    backend.inject(GpuEvent(uuid=backend.device(0).uuid, kind="xid", code=31))
    assert agent.poll_events(0.5)
    agent.round()
    assert agent.health[backend.device(0).uuid].xid == 31
