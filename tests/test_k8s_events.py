"""EventRecorder (gpupool.k8s.events) against the kmock API server of test_k8s_scheduler, over real HTTP.

Aggregation as client-go's EventCorrelator: the same event again is a PATCH of count/lastTimestamp on the
Event already written; a bounded queue that drops (and counts) instead of blocking; failures logged once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import kmock
import pytest

from gpupool.k8s import wire
from gpupool.k8s.events import EventRecorder
from test_k8s_scheduler import EVENTS, Harness, gpu_node, gpu_pod, wait_for


@pytest.fixture()
def h():
    harness = Harness()
    yield harness
    harness.close()


class Clock:
    def __init__(self, t: float = 1_767_225_600.0) -> None:  # 2026-01-01T00:00:00Z
        self.t = t

    def __call__(self) -> float:
        return self.t


def pod(name: str, uid: str | None = None) -> dict:
    return {"metadata": {"name": name, "namespace": "default", "uid": uid or f"uid-{name}"}}


def events(h: Harness) -> list[dict]:
    return sorted(h.objects(EVENTS), key=lambda e: e["metadata"]["name"])


def test_the_same_event_again_patches_count_and_last_timestamp(h):
    clock = Clock()
    rec = EventRecorder(h.api, "gpupool", "replica-1", clock=clock)
    try:
        rec.event(pod("p"), "Warning", "FailedScheduling", "0/1 nodes are available: 1 Insufficient GPU share.")
        assert rec.flush(5)
        clock.t += 61
        rec.event(pod("p"), "Warning", "FailedScheduling", "0/1 nodes are available: 1 Insufficient GPU share.")
        clock.t += 60
        rec.event(pod("p"), "Warning", "FailedScheduling", "0/1 nodes are available: 1 Insufficient GPU share.")
        assert rec.flush(5)
        (ev,) = events(h)
        assert ev["count"] == 3
        assert ev["firstTimestamp"] == "2026-01-01T00:00:00Z" and ev["lastTimestamp"] == "2026-01-01T00:02:01Z"
        assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "default",
                                        "uid": "uid-p"}
        assert ev["source"] == {"component": "gpupool"} and ev["reportingInstance"] == "replica-1"
        assert (rec.created, rec.patched, rec.failed, rec.dropped) == (1, 2, 0, 0)
    finally:
        rec.stop()


def test_different_message_reason_or_object_is_a_new_event(h):
    rec = EventRecorder(h.api, "gpupool")
    try:
        rec.event(pod("p"), "Warning", "FailedScheduling", "a")
        rec.event(pod("p"), "Warning", "FailedScheduling", "b")  # another message
        rec.event(pod("p"), "Normal", "Scheduled", "a")  # another reason and type
        rec.event(pod("p", uid="uid-p-2"), "Warning", "FailedScheduling", "a")  # a new pod of the same name
        rec.event(pod("q"), "Warning", "FailedScheduling", "a")
        assert rec.flush(5)
        assert len(events(h)) == 5 and all(e["count"] == 1 for e in events(h))
        rec.event(pod("p"), "Warning", "FailedScheduling", "b")
        assert rec.flush(5)
        assert sorted(e["count"] for e in events(h)) == [1, 1, 1, 1, 2]
    finally:
        rec.stop()


def test_an_expired_event_is_created_again_with_its_count(h):
    rec = EventRecorder(h.api, "gpupool")
    try:
        rec.event(pod("p"), "Warning", "FailedScheduling", "m")
        rec.event(pod("p"), "Warning", "FailedScheduling", "m")
        assert rec.flush(5)
        (ev,) = events(h)
        wire.drain(h.v1.delete_namespaced_event(ev["metadata"]["name"], "default", _preload_content=False))  # TTL
        rec.event(pod("p"), "Warning", "FailedScheduling", "m")
        assert rec.flush(5)
        (again,) = events(h)
        assert again["metadata"]["name"] != ev["metadata"]["name"] and again["count"] == 3
        assert again["firstTimestamp"] == ev["firstTimestamp"]
    finally:
        rec.stop()


def test_the_cache_is_a_bounded_lru(h):
    rec = EventRecorder(h.api, "gpupool", cache_size=1)
    try:
        for name in ("a", "b", "a"):  # "a" was evicted by "b": written anew
            rec.event(pod(name), "Warning", "FailedScheduling", "m")
            assert rec.flush(5)
        assert len(events(h)) == 3 and rec.patched == 0
        rec.event(pod("a"), "Warning", "FailedScheduling", "m")  # the most recent one is remembered
        assert rec.flush(5)
        assert rec.patched == 1
    finally:
        rec.stop()


def test_a_full_queue_drops_and_counts_instead_of_blocking(h):
    release = asyncio.Event()
    seen = {"creates": 0}

    async def hang(request):
        seen["creates"] += 1
        await release.wait()
        raise kmock.ReactionMismatchError()  # then the emulator stores the Event

    h.call(lambda: h.server[kmock.action.CREATE, EVENTS] << hang)
    drops: list[int] = []
    rec = EventRecorder(h.api, "gpupool", queue_size=2, workers=1, on_drop=lambda: drops.append(1))
    try:
        assert rec.event(pod("p0"), "Normal", "Scheduled", "m")
        wait_for(lambda: seen["creates"] == 1, what="the worker is writing (and stuck)")
        t0 = time.perf_counter()
        accepted = [rec.event(pod(f"p{i}"), "Normal", "Scheduled", "m") for i in range(1, 5)]
        assert time.perf_counter() - t0 < 0.5  # never blocks the caller (a binder)
        assert accepted == [True, True, False, False]
        assert rec.dropped == 2 and len(drops) == 2
        h.loop.call_soon_threadsafe(release.set)
        assert rec.flush(5)
        assert len(events(h)) == 3
    finally:
        h.loop.call_soon_threadsafe(release.set)
        rec.stop()


def test_write_failures_are_logged_once_per_outage(h, caplog):
    failing = {"on": True, "calls": 0}

    def refuse(request):
        if not failing["on"]:
            raise kmock.ReactionMismatchError()
        failing["calls"] += 1
        raise kmock.KubernetesError(status=503, reason="ServiceUnavailable", message="try later")

    h.call(lambda: h.server[kmock.action.CREATE, EVENTS] << refuse)
    rec = EventRecorder(h.api, "gpupool")
    try:
        with caplog.at_level(logging.DEBUG, logger="gpupool.k8s.events"):
            for i in range(5):
                rec.event(pod(f"p{i}"), "Normal", "Scheduled", "m")
            assert rec.flush(5)
            assert rec.failed == 5 and failing["calls"] >= 5
            failing["on"] = False
            rec.event(pod("ok"), "Normal", "Scheduled", "m")
            assert rec.flush(5)
        loud = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert loud == ["event_write_failing", "event_write_recovered"]
        assert [r for r in caplog.records if r.getMessage() == "event_write_recovered"][0].attempts == 5
        assert rec.created == 1  # (kmock stores a created object even when a reaction answers 503)
    finally:
        rec.stop()


def test_stop_writes_what_is_queued_then_drops(h):
    rec = EventRecorder(h.api, "gpupool")
    for i in range(20):
        rec.event(pod(f"p{i}"), "Normal", "Scheduled", "m")
    rec.stop(5)
    assert len(events(h)) == 20
    assert not rec.event(pod("late"), "Normal", "Scheduled", "m") and rec.dropped == 1


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        EventRecorder(None, "gpupool", workers=0)  # type: ignore[arg-type]


def test_scheduler_aggregates_a_repeated_failed_scheduling_event(h):
    """Re-elected (its reported-once memory cleared), the scheduler reports the same failure again: the one
    Event's count goes up, no second Event (within one process, as kube-scheduler's recorder)."""
    h.create_node(gpu_node("n1", gpus=1))
    h.create_pod(gpu_pod("big", gpus=4))
    leader = {"on": True}
    s = h.scheduler(leader=lambda: leader["on"])
    wait_for(lambda: h.events_for("big"), what="reported")
    for count in (2, 3):
        leader["on"] = False
        wait_for(lambda: not s._leading, what="stepped down")
        leader["on"] = True
        wait_for(lambda count=count: h.events_for("big")[0]["count"] == count, what=f"count {count}")
    assert len(h.events_for("big")) == 1 and s.recorder.patched == 2
