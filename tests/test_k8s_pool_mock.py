"""Pool mode of the live scheduler against the mock API server: the shared-pool scenarios of the simulator's tests
(``tests/test_pool_scenarios.py``: gang deadlock, large-gang starvation, reclaim to fair share, priority starvation,
preemption loops) and a PodDisruptionBudget refusal, end to end over real HTTP.

The real :class:`~gpupool.k8s.scheduler.Scheduler` runs in pool mode (:mod:`gpupool.k8s.pool`) with short timeouts
against the kmock ``Harness`` of ``tests/test_k8s_scheduler.py``. A fake kubelet (:class:`Kubelet`, a thread that acts
inside the mock's event loop) plays the nodes: a bound Pending pod becomes Running with ``Ready=True``; a pod being
deleted gracefully (``deletionTimestamp``, as an eviction leaves a bound pod) is removed as a kubelet confirms it
(:meth:`ApiServer.finish_termination`, a grace-0 delete) unless the test holds it (``stuck``); :meth:`Kubelet.finish`
ends a pod's containers (phase ``Succeeded``). At every tick the kubelet also checks the GPU books from the API's own
view (no GPU over-allocated among bound pods that did not finish, Terminating ones included), so a preemptor bound
before its victims are gone is caught, not only the state at the end.
"""

from __future__ import annotations

import collections
import datetime
import threading
import time
from typing import Any

import numpy as np
import pytest
from kubernetes import client

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE, wire
from gpupool.k8s.pool import live_config
from gpupool.k8s.scheduler import Scheduler, SchedulerConfig
from test_k8s_scheduler import NODES, PODGROUPS, PODS, QUEUES, Harness, gpu_node, wait_for

KUEUE = "kueue.x-k8s.io/queue-name"
GROUP = "scheduling.x-k8s.io/pod-group"
RESERVE_AFTER_S = 1.5


# ------------------------------------------------------------------ the fake kubelet
class Kubelet(threading.Thread):
    """The kubelets of the mock's nodes (see the module docstring). ``stuck``: pod names whose termination waits;
    ``bound_at``: name -> (monotonic time first seen bound, node); ``violations``: GPU book errors seen."""

    def __init__(self, h: Harness, period: float = 0.03) -> None:
        super().__init__(daemon=True, name="mock-kubelet")
        self.h = h
        self.period = period
        self.stuck: set[str] = set()
        self.removed: list[str] = []  # pods whose termination the kubelet confirmed
        self.bound_at: dict[str, tuple[float, str]] = {}
        self.violations: list[str] = []
        self.ticks = 0
        self._marks: collections.deque[tuple[float, Any]] = collections.deque()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                self.h.call(self._tick)
            except Exception:  # noqa: BLE001 - the loop is closing
                if self._halt.is_set():
                    return
                raise
            self._halt.wait(self.period)

    def stop(self) -> None:
        self._halt.set()
        self.join(5)

    async def _tick(self) -> None:
        server = self.h.server
        now = time.monotonic()
        async with server._lock:
            pods = [(key, obj) for key, obj in list(server._objects.items()) if key[0] == PODS and not obj.deleted]
            for (_, ns, name), obj in pods:
                meta, spec, st = obj.raw.get("metadata") or {}, obj.raw.get("spec") or {}, obj.raw.get("status") or {}
                if spec.get("nodeName") and name not in self.bound_at:
                    self.bound_at[name] = (now, spec["nodeName"])
                if meta.get("deletionTimestamp"):
                    if name not in self.stuck:
                        await server._delete_pod(ns, name, {"gracePeriodSeconds": 0})
                        self.removed.append(name)
                elif spec.get("nodeName") and st.get("phase") == "Pending":
                    await self._set_phase(obj, "Running")
            self._check_books()
        self._trim(now)
        self.ticks += 1

    def _trim(self, now: float) -> None:
        """Keep kmock's request history to about the last 0.3 s (see ``ApiServer.trim_requests``)."""
        server = self.h.server
        if server._requests:
            self._marks.append((now, server._requests[-1]))
        upto = None
        while self._marks and self._marks[0][0] < now - 0.3:
            upto = self._marks.popleft()[1]
        if upto is not None:
            server.trim_requests(upto)

    async def _set_phase(self, obj: Any, phase: str) -> None:
        """The kubelet's status update: the phase, and Ready / ContainersReady (True only while Running), the
        other conditions kept."""
        ready = "True" if phase == "Running" else "False"
        stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conds = [c for c in (obj.raw.get("status") or {}).get("conditions") or []
                 if c.get("type") not in ("Ready", "ContainersReady")]
        conds += [{"type": t, "status": ready, "lastTransitionTime": stamp} for t in ("Ready", "ContainersReady")]
        obj.patch({"status": {"phase": phase, "conditions": conds}})
        await self.h.server._buses[PODS].put({"type": "MODIFIED", "object": obj.raw})

    def finish(self, *names: str) -> None:
        """The pods' containers exit: phase Succeeded (a Job's pod stays, finished, holding no device)."""
        async def do() -> None:
            server = self.h.server
            async with server._lock:
                for name in names:
                    await self._set_phase(server._pod("default", name), "Succeeded")
        self.h.call(do)

    def release(self) -> None:
        """Let the held terminations go (the kubelet confirms them at its next tick)."""
        self.stuck.clear()

    def _check_books(self) -> None:
        """Called in the server's loop with its lock held: one consistent view of every pod."""
        server = self.h.server
        gpus = {key[2]: int(((o.raw.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", 0))
                for key, o in server._objects.items() if key[0] == NODES and not o.deleted}
        use: dict[tuple[str, int], list[tuple[str, int]]] = collections.defaultdict(list)
        for key, obj in server._objects.items():
            if key[0] != PODS or obj.deleted:
                continue
            pod = obj.raw
            node = (pod.get("spec") or {}).get("nodeName")
            if not node or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            ann = (pod.get("metadata") or {}).get("annotations") or {}
            if ann.get(ANN_NODE) != node:
                self.violations.append(f"{key[2]}: bound to {node}, {ANN_NODE}={ann.get(ANN_NODE)!r}")
                continue
            for g in (ann.get(ANN_GPU_INDEX) or "").split(","):
                if g:
                    use[node, int(g)].append((key[2], int(ann.get(ANN_GPU_MILLI) or 0)))
        for (node, g), holders in use.items():
            if g >= gpus.get(node, 0) or sum(m for _, m in holders) > 1000:
                self.violations.append(f"{node} GPU {g}: {holders} (node has {gpus.get(node, 0)} GPUs)")


# ------------------------------------------------------------------ fixtures and builders
@pytest.fixture()
def h():
    harness = Harness()
    harness.declare(PODGROUPS)
    harness.declare(QUEUES)
    yield harness
    harness.close()


@pytest.fixture()
def kubelet(h):
    k = Kubelet(h)
    k.start()
    yield k
    k.stop()
    assert not k.violations, "GPU over-allocation seen by the kubelet:\n  " + "\n  ".join(k.violations[:20])


def start(h: Harness, **pool: Any) -> Scheduler:
    """The real scheduler, pool mode, no minimum runtimes, a reservation after ``RESERVE_AFTER_S``."""
    cfg = SchedulerConfig(identity="gpupool-0", batch_s=0.01, backoff_initial_s=0.05, backoff_max_s=0.3,
                          optional_retry_s=0.5, resync_s=0.2, watch_timeout_s=30, queue_status_s=0.2,
                          pool_config=live_config(**{"min_run_s": 0.0, "reclaim_min_run_s": 0.0,
                                                     "reserve_after_s": RESERVE_AFTER_S, **pool}))
    s = Scheduler(h.api, cfg)
    h.schedulers.append(s)
    s.start()
    wait_for(lambda: s.synced, what="synced")
    return s


def stamp(offset_s: float = 0.0) -> str:
    at = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def pod(name: str, gpus: int = 1, queue: str | None = None, group: str | None = None, priority: int = 0,
        created: float = 0.0, labels: dict[str, str] | None = None, grace: int = 30) -> dict[str, Any]:
    """A whole-GPU pod for gpupool; ``created``: its creationTimestamp, seconds from now (job order, waits)."""
    lab = dict(labels or {})
    if queue:
        lab[KUEUE] = queue
    if group:
        lab[GROUP] = group
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": lab, "annotations": {},
                         "creationTimestamp": stamp(created)},
            "spec": {"schedulerName": "gpupool", "priority": priority, "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": "busybox", "resources": {
                         "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": str(gpus)}}}]},
            "status": {"phase": "Pending"}}


def create(h: Harness, *pods: dict[str, Any]) -> None:
    for p in pods:
        h.create_pod(p)


def make_queue(h: Harness, name: str, quota: float, priority: int = 0, parent: str | None = None,
               limit: float | None = None) -> None:
    spec: dict[str, Any] = {"quota": quota, "weight": 1, "priority": priority}
    if parent is not None:
        spec["parent"] = parent
    if limit is not None:
        spec["limit"] = limit
    wire.drain(client.CustomObjectsApi(h.api).create_cluster_custom_object("gpupool.io", "v1alpha1", "queues", {
        "apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": name}, "spec": spec},
        _preload_content=False))


def make_group(h: Harness, name: str, min_member: int) -> None:
    wire.drain(client.CustomObjectsApi(h.api).create_namespaced_custom_object(
        "scheduling.x-k8s.io", "v1alpha1", "default", "podgroups", {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"minMember": min_member}},
        _preload_content=False))


def nodes(h: Harness, n: int, gpus: int) -> None:
    for i in range(n):
        h.create_node(gpu_node(f"n{i}", gpus=gpus))


def all_pods(h: Harness, prefix: str = "") -> list[dict[str, Any]]:
    return [p for p in h.objects(PODS) if p["metadata"]["name"].startswith(prefix)]


def running(h: Harness, prefix: str = "") -> list[str]:
    """Pods bound, not being deleted, not finished."""
    return sorted(p["metadata"]["name"] for p in all_pods(h, prefix) if p["spec"].get("nodeName")
                  and not p["metadata"].get("deletionTimestamp")
                  and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed"))


def unbound(h: Harness, prefix: str = "") -> list[str]:
    return sorted(p["metadata"]["name"] for p in all_pods(h, prefix) if not p["spec"].get("nodeName"))


def node_of(h: Harness, name: str) -> str | None:
    return ((h.pod(name) or {}).get("spec") or {}).get("nodeName")


def evicted(h: Harness, prefix: str = "") -> list[str]:
    """Pods the API really evicted (not dry runs)."""
    return [name for _, name, dry, status in h.server.evictions if not dry and status == 201
            and name.startswith(prefix)]


def events(h: Harness, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in h.events_for(name) if e.get("reason") == reason]


def queue_status(h: Harness, name: str) -> dict[str, Any]:
    q = next((o for o in h.objects(QUEUES) if o["metadata"]["name"] == name), None)
    return (q or {}).get("status") or {}


def bind_attempts(h: Harness, prefix: str) -> list[str]:
    return [name for _, name, _, _, _ in h.server.bind_attempts if name.startswith(prefix)]


def hold(seconds: float, check: Any, what: str) -> None:
    """``check()`` stays true for ``seconds`` (scheduling cycles go on meanwhile)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert check(), what
        time.sleep(0.05)


def assert_books(kubelet: Kubelet) -> None:
    """No GPU over-allocated among the bound pods that did not finish, now (one more check in the server's loop) nor
    at any kubelet tick before."""
    async def check() -> None:
        async with kubelet.h.server._lock:
            kubelet._check_books()
    kubelet.h.call(check)
    assert kubelet.ticks > 0
    assert not kubelet.violations, "GPU over-allocation:\n  " + "\n  ".join(kubelet.violations[:20])


# ------------------------------------------------------------------ scenarios
def test_the_books_check_catches_a_double_booked_gpu(h, kubelet):
    """The checker itself: two pods bound to the same GPU (no scheduler running) are reported."""
    h.create_node(gpu_node("n0", gpus=2))
    for name in ("x", "y"):
        p = pod(name, 1)
        p["spec"]["nodeName"] = "n0"
        p["metadata"]["annotations"] = {ANN_NODE: "n0", ANN_GPU_INDEX: "1", ANN_GPU_MILLI: "1000"}
        h.create_pod(p)
    wait_for(lambda: kubelet.violations, what="the double booking reported")
    assert "n0 GPU 1" in kubelet.violations[0]
    kubelet.finish("y")  # a finished pod holds no device
    kubelet.violations.clear()
    time.sleep(0.1)
    assert_books(kubelet)


def test_gang_deadlock_never_happens(h, kubelet):
    """scheduler-plugins #114: two gangs of 2 x 8 GPUs on two 8-GPU nodes, their pods arriving interleaved. Placed
    pod by pod, each gang could hold one node and wait forever for the other. One gang runs whole (one pod per
    node), the other waits whole (not one binding is even attempted) and runs when the first finishes."""
    nodes(h, 2, 8)
    make_queue(h, "a", 16)
    make_group(h, "g1", 2)
    make_group(h, "g2", 2)
    s = start(h)
    create(h, pod("g1-0", 8, "a", "g1", created=-2), pod("g2-0", 8, "a", "g2", created=-1),
           pod("g1-1", 8, "a", "g1", created=-2), pod("g2-1", 8, "a", "g2", created=-1))
    wait_for(lambda: len(running(h, "g1-")) == 2, what="the older gang runs whole")
    assert {node_of(h, "g1-0"), node_of(h, "g1-1")} == {"n0", "n1"}
    gang_event = wait_for(lambda: [e for n in ("g2-0", "g2-1") for e in events(h, n, "FailedScheduling")
                                   if "gang" in e["message"]], what="the other gang's reason")
    assert "g2" in gang_event[0]["message"]
    cycles = s.cycles
    hold(0.6, lambda: not bind_attempts(h, "g2-") and unbound(h, "g2-") == ["g2-0", "g2-1"],
         "a pod of the waiting gang was bound (a partial gang)")
    assert s.cycles > cycles
    kubelet.finish("g1-0", "g1-1")
    wait_for(lambda: len(running(h, "g2-")) == 2, what="the second gang runs once the first finished")
    assert {node_of(h, "g2-0"), node_of(h, "g2-1")} == {"n0", "n1"}
    assert sorted(bind_attempts(h, "g")) == ["g1-0", "g1-1", "g2-0", "g2-1"]  # each bound once, nothing refused
    assert not evicted(h)
    assert_books(kubelet)


def test_large_gang_gets_a_reservation_under_a_stream_of_small_pods(h, kubelet):
    """5 nodes x 8 GPUs full of 1-GPU pods; a gang of 4 x 8 GPUs arrives while, every 0.1 s, the two oldest small pods
    end and new ones arrive (four always wait). Without a reservation every GPU that frees up goes to a small pod
    and the gang starves; after ``reserve_after_s`` it gets 4 nodes reserved (and keeps them), small pods bind only
    on the fifth, the reserved nodes drain and the gang starts in bounded time, while small pods keep running on
    the node it does not use."""
    nodes(h, 5, 8)
    make_queue(h, "a", 40)
    make_group(h, "big", 4)
    s = start(h)
    create(h, *[pod(f"s-{i:04d}", 1, "a", created=-60 + i * 0.01) for i in range(40)])
    wait_for(lambda: len(running(h, "s-")) == 40, what="small pods fill the cluster")
    t0 = time.monotonic()
    create(h, *[pod(f"big-{i}", 8, "a", "big") for i in range(4)])
    n = 40
    reserved_at, reserved = None, set()
    seen: set[frozenset[str]] = set()  # every reservation observed
    started = None
    while time.monotonic() - t0 < 12:
        pool = s.pool_driver.pool if s.pool_driver is not None else None
        r = pool.reservation if pool is not None else None
        if r is not None:
            seen.add(frozenset(s.model.state.node_names[i] for i in np.flatnonzero(r.mask)))
            if reserved_at is None:
                reserved_at, reserved = time.monotonic(), set(next(iter(seen)))
        if len(running(h, "big-")) == 4:
            started = time.monotonic() - t0
            break
        live = running(h, "s-")
        kubelet.finish(*live[:2])  # the oldest end
        more = max(0, 4 - len(unbound(h, "s-")))  # a few small pods always wait for the GPUs that free up
        create(h, *[pod(f"s-{n + k:04d}", 1, "a") for k in range(more)])
        n += more
        time.sleep(0.1)
    assert started is not None, f"the 32-GPU gang starved (reservation: {reserved_at is not None})"
    assert started >= RESERVE_AFTER_S - 0.2, "it cannot have started before its reservation"
    assert reserved_at is not None and len(reserved) == 4
    assert seen == {frozenset(reserved)}, f"the reservation moved: {seen}"
    assert s.pool_driver.pool.stats["reservations"] >= 1
    gang_nodes = {node_of(h, f"big-{i}") for i in range(4)}
    assert len(gang_nodes) == 4
    (free,) = {f"n{i}" for i in range(5)} - gang_nodes
    # small pods kept running while the gang waited: on the node it does not use
    assert running(h, "s-") and all(node_of(h, p) == free for p in running(h, "s-"))
    # small pods bound once the reservation held (a cycle after it was made) went to unreserved nodes only
    late = [(p, node) for p, (t, node) in kubelet.bound_at.items()
            if p.startswith("s-") and t > reserved_at + 0.3 and t < t0 + started - 0.05]
    assert all(node not in reserved for _, node in late), late
    assert not evicted(h)
    assert_books(kubelet)



@pytest.mark.parametrize("limit", [None, 4])
def test_reclaim_from_a_sibling_under_the_same_parent_queue(h, kubelet, limit):
    """Kueue #5289 on the live scheduler: a and b (quota 2 each) under ab (quota 4, optionally limit 4) on one 4-GPU
    node. a runs two 2-GPU pods, borrowing b's quota; b's 2-GPU pod reclaims one of them (evicted through the API)
    and runs."""
    nodes(h, 1, 4)
    make_queue(h, "ab", 4, limit=limit)
    make_queue(h, "a", 2, parent="ab")
    make_queue(h, "b", 2, parent="ab")
    start(h)
    create(h, *[pod(f"a-{i}", 2, "a", created=-30 + i * 0.01) for i in range(2)])
    wait_for(lambda: len(running(h, "a-")) == 2, what="a borrows all 4 GPUs")
    create(h, pod("b-0", 2, "b"))
    wait_for(lambda: running(h, "b-") == ["b-0"], what="b reclaims its quota")
    victims = evicted(h)
    assert len(victims) == 1 and victims[0].startswith("a-")
    (ev,) = wait_for(lambda: events(h, victims[0], "Preempted"), what="Preempted event")
    assert "reclaimed by" in ev["message"]
    hold(1.0, lambda: len(evicted(h)) == 1 and running(h, "b-") == ["b-0"], "a took its GPUs back")
    assert_books(kubelet)


def test_reclaim_goes_up_to_fair_share_and_stops(h, kubelet):
    """Two queues of quota 8 on 16 GPUs. b borrows the whole cluster; a's 8 pods arrive: exactly 8 of b's pods are
    evicted (reclaim, b's fair share is 8), a runs 8. b's controller re-creates the evicted pods: they wait, and
    nothing more is evicted. The Queues' status shows fair shares and borrowing."""
    nodes(h, 2, 8)
    make_queue(h, "a", 8)
    make_queue(h, "b", 8)
    start(h)
    create(h, *[pod(f"b-{i:02d}", 1, "b", created=-30 + i * 0.01) for i in range(16)])
    wait_for(lambda: len(running(h, "b-")) == 16, what="b borrows all 16 GPUs")
    wait_for(lambda: queue_status(h, "b").get("borrowedGPUs") == 8, what="Queue b: 8 GPUs borrowed")
    create(h, *[pod(f"a-{i}", 1, "a") for i in range(8)])
    wait_for(lambda: len(running(h, "a-")) == 8, what="a gets its fair share")
    assert len(running(h, "b-")) == 8
    victims = evicted(h)
    assert len(victims) == 8 and all(v.startswith("b-") for v in victims)
    for v in victims:
        (ev,) = wait_for(lambda v=v: events(h, v, "Preempted"), what="Preempted event")
        assert "reclaimed by" in ev["message"]
    # b's controller makes new pods for the evicted ones: they wait at b's fair share, a keeps its 8
    create(h, *[pod(f"b-r{i}", 1, "b") for i in range(8)])
    wait_for(lambda: queue_status(h, "a").get("fairShareGPUs") == 8 and queue_status(h, "b").get("fairShareGPUs") == 8
             and queue_status(h, "b").get("borrowedGPUs") == 0 and queue_status(h, "b").get("pendingPods") == 8,
             what="Queue status: fair share 8 and 8, b borrows nothing, 8 pending")
    hold(1.0, lambda: len(evicted(h)) == 8 and len(running(h, "a-")) == 8, "reclaim went past the fair share")
    assert unbound(h, "b-r") == [f"b-r{i}" for i in range(8)]
    st = queue_status(h, "a")
    assert st["usedGPUs"] == 8 and st["borrowedGPUs"] == 0
    assert_books(kubelet)


@pytest.mark.parametrize(("hi_priority", "evictions"), [(10, 2), (0, 0)], ids=["hi outranks lo", "equal priority"])
def test_lower_priority_in_quota_queue_cannot_starve_higher(h, kubelet, hi_priority, evictions):
    """KAI #2064, as the simulator's case: 2 nodes x 4 GPUs; queue lo (quota 4) holds 2 GPUs on each node (within its
    quota); queue hi (quota 4) asks for one 4-GPU pod, within its quota. If hi outranks lo, it evicts lo's two pods
    on one node (preemptible in-quota work of a strictly lower-priority queue): hi is nominated there while they
    terminate, binds once they are gone, and lo's re-created pods run on the other node's 2 free GPUs. At equal
    priority (and no consolidation, the live default) nothing may be taken from lo: hi waits."""
    nodes(h, 2, 4)
    make_queue(h, "hi", 4, priority=hi_priority)
    make_queue(h, "lo", 4)
    start(h)
    create(h, *[pod(f"lo{k}", 1, "lo", created=-20 + k * 0.01) for k in range(8)])
    wait_for(lambda: len(running(h, "lo")) == 8, what="lo fills both nodes")
    by_node = collections.defaultdict(list)
    for name in running(h, "lo"):
        by_node[node_of(h, name)].append(name)
    assert sorted(len(v) for v in by_node.values()) == [4, 4]
    kubelet.finish(*[name for v in by_node.values() for name in sorted(v)[2:]])  # the short ones end
    wait_for(lambda: len(running(h, "lo")) == 4, what="lo at its quota, 2 GPUs on each node")
    kubelet.stuck |= set(running(h, "lo"))  # victims terminate slowly: the preemptor waits nominated
    create(h, pod("hi", 4, "hi"))
    if not evictions:
        ev = wait_for(lambda: events(h, "hi", "FailedScheduling"), what="hi's reason")
        hold(1.0, lambda: not evicted(h) and unbound(h, "hi") == ["hi"], "hi took lo's in-quota GPUs")
        assert "Insufficient" in ev[0]["message"] or "waiting in queue hi" in ev[0]["message"], ev[0]["message"]
        assert_books(kubelet)
        return
    wait_for(lambda: len(evicted(h)) == 2, what="two of lo's pods evicted")
    victims = evicted(h)
    assert len({node_of(h, v) for v in victims}) == 1, "the victims free one node"
    target = node_of(h, victims[0])
    wait_for(lambda: (h.pod("hi")["status"]).get("nominatedNodeName") == target, what="hi nominated")
    hold(0.4, lambda: node_of(h, "hi") is None, "hi bound while its victims still run")
    for v in victims:
        (ev,) = wait_for(lambda v=v: events(h, v, "Preempted"), what="Preempted event")
        assert "reclaimed by default/hi of queue hi" in ev["message"]
    kubelet.release()
    wait_for(lambda: node_of(h, "hi") == target, what="hi bound once the victims are gone")
    # lo's controller re-creates the evicted pods: they run on the other node, and nothing more is evicted
    create(h, *[pod(f"{v}-r", 1, "lo") for v in victims])
    wait_for(lambda: len(running(h, "lo")) == 4, what="lo back at its quota")
    assert {node_of(h, f"{v}-r") for v in victims} == {"n0", "n1"} - {target}
    hold(0.6, lambda: len(evicted(h)) == 2, "more evictions after hi started")
    assert_books(kubelet)



def test_high_priority_gang_preempts_lower_priority_pods_nominated_while_victims_terminate(h, kubelet):
    """One queue, 2 nodes x 8 GPUs full of priority-10 pods (2 GPUs each); a priority-50 gang of 2 x 8 GPUs arrives.
    It preempts all eight (all or nothing); while the victims terminate (held by the kubelet) its pods carry
    ``status.nominatedNodeName`` and are not bound; once the victims are gone they bind where nominated."""
    nodes(h, 2, 8)
    make_queue(h, "a", 16)
    make_group(h, "hp", 2)
    start(h)
    create(h, *[pod(f"lo{i}", 2, "a", priority=10, created=-20 + i * 0.01) for i in range(8)])
    wait_for(lambda: len(running(h, "lo")) == 8, what="low-priority pods fill the cluster")
    kubelet.stuck |= set(running(h, "lo"))
    create(h, pod("hp-0", 8, "a", "hp", priority=50), pod("hp-1", 8, "a", "hp", priority=50))
    wait_for(lambda: len(evicted(h, "lo")) == 8, what="eight victims evicted")
    nominated = wait_for(lambda: all((h.pod(p)["status"]).get("nominatedNodeName") for p in ("hp-0", "hp-1"))
                         and {h.pod(p)["status"]["nominatedNodeName"] for p in ("hp-0", "hp-1")},
                         what="nominatedNodeName on the gang's pods")
    assert nominated == {"n0", "n1"}
    where = {p: h.pod(p)["status"]["nominatedNodeName"] for p in ("hp-0", "hp-1")}
    assert all(h.pod(f"lo{i}")["metadata"].get("deletionTimestamp") for i in range(8))  # Terminating
    hold(0.4, lambda: not bind_attempts(h, "hp-"), "the gang was bound while its victims still run")
    for p in ("hp-0", "hp-1"):
        wait_for(lambda p=p: events(h, p, "Nominated"), what="Nominated event")
    for i in range(8):
        (ev,) = wait_for(lambda i=i: events(h, f"lo{i}", "Preempted"), what="Preempted event")
        assert "preempted by" in ev["message"]
    kubelet.release()
    wait_for(lambda: running(h, "hp-") == ["hp-0", "hp-1"], what="the gang binds once the victims are gone")
    assert {p: node_of(h, p) for p in ("hp-0", "hp-1")} == where
    wait_for(lambda: not any(h.pod(p)["status"].get("nominatedNodeName") for p in ("hp-0", "hp-1")),
             what="nominations cleared")
    assert not all_pods(h, "lo")
    assert_books(kubelet)



def test_no_preemption_loop_between_two_queues(h, kubelet):
    """Kueue #3779: one node of 8 GPUs, two queues of quota 4 (equal shares). a holds all 8; b's 8 pods arrive: b
    takes back exactly the 4 it is owed. a's controller re-creates its 4 evicted pods, so both queues keep waiting
    pods above their share; over many cycles nothing more is evicted, in either direction."""
    nodes(h, 1, 8)
    make_queue(h, "a", 4)
    make_queue(h, "b", 4)
    s = start(h)
    create(h, *[pod(f"a-{i}", 1, "a", created=-30 + i * 0.01) for i in range(8)])
    wait_for(lambda: len(running(h, "a-")) == 8, what="a holds the node")
    create(h, *[pod(f"b-{i}", 1, "b") for i in range(8)])
    wait_for(lambda: len(running(h, "b-")) == 4, what="b gets its share")
    assert len(evicted(h, "a-")) == 4
    create(h, *[pod(f"a-r{i}", 1, "a") for i in range(4)])
    cycles = s.cycles
    hold(2.0, lambda: len(evicted(h)) == 4 and len(running(h, "a-")) == 4 and len(running(h, "b-")) == 4,
         "a preemption loop")
    assert s.cycles - cycles >= 5, "too few cycles ran to show there is no loop"
    assert len(unbound(h, "a-r")) == 4 and len(unbound(h, "b-")) == 4
    assert queue_status(h, "a").get("fairShareGPUs") == 4 and queue_status(h, "b").get("fairShareGPUs") == 4
    assert_books(kubelet)



def test_pdb_blocking_the_first_victim_makes_the_scheduler_choose_another(h, kubelet):
    """One node of 8 GPUs, two queues of quota 4; b borrows the node with four 2-GPU pods (b-3 the newest: the first
    victim). A PodDisruptionBudget allows no disruption of b-3. a-0 arrives: the dry run for b-3 is refused (429),
    nothing is evicted, a-0 gets a PreemptionBlocked Warning; the next cycle chooses another victim, a-0 binds,
    b-3 still runs."""
    nodes(h, 1, 8)
    make_queue(h, "a", 4)
    make_queue(h, "b", 4)
    s = start(h)
    create(h, *[pod(f"b-{i}", 2, "b", created=-40 + 10 * i, labels={"app": f"b-{i}"}) for i in range(4)])
    wait_for(lambda: len(running(h, "b-")) == 4, what="b holds the node")
    wait_for(lambda: all(any(c.get("type") == "Ready" and c.get("status") == "True"
                             for c in h.pod(f"b-{i}")["status"].get("conditions") or []) for i in range(4)),
             what="b's pods Ready")
    h.create_pdb("protect-b3", {"app": "b-3"}, allowed=0, healthy=(1, 1), minAvailable=1)
    create(h, pod("a-0", 2, "a"))
    wait_for(lambda: running(h, "a-") == ["a-0"], what="a-0 bound after another victim was chosen")
    assert h.server.evictions[0] == ("default", "b-3", True, 429), h.server.evictions
    assert "b-3" in running(h, "b-") and len(running(h, "b-")) == 3
    (victim,) = evicted(h)
    assert victim != "b-3"
    blocked = wait_for(lambda: events(h, "a-0", "PreemptionBlocked"), what="PreemptionBlocked event")
    assert blocked[0]["type"] == "Warning" and "default/b-3" in blocked[0]["message"]
    assert "disruption budget" in blocked[0]["message"]
    assert s.pool_driver.stats["refused"] >= 1
    assert h.pdb("protect-b3")["status"]["disruptionsAllowed"] == 0
    hold(0.5, lambda: evicted(h) == [victim], "more evictions")
    assert_books(kubelet)


def test_a_reason_whose_figures_change_is_not_reposted_every_cycle(h):
    """Pool reasons carry live figures (GPUs a queue holds, seconds waited): a new figure alone re-posts the
    FailedScheduling Event and condition at most every ``rereport_s``; another reason is posted at once."""
    s = Scheduler(h.api, SchedulerConfig(identity="t", rereport_s=60.0))
    posted: list[str] = []
    s._post_event = lambda pod, reason, message, etype, action: posted.append(message)  # type: ignore[method-assign]
    s._report_pool_closed = True  # no condition patches in this test
    pod = {"metadata": {"name": "p", "namespace": "default", "uid": "u1"}}
    try:
        s._report_unschedulable(pod, "waiting in queue a (holds 3 GPUs, fair share 4)")
        s._report_unschedulable(pod, "waiting in queue a (holds 3 GPUs, fair share 4)")
        s._report_unschedulable(pod, "waiting in queue a (holds 5 GPUs, fair share 4.5)")
        assert len(posted) == 1
        s._report_unschedulable(pod, "queue a would exceed its limit: 4 of 4 GPU in use, 1 more asked")
        assert len(posted) == 2
        s.config.rereport_s = 0.0
        s._report_unschedulable(pod, "queue a would exceed its limit: 3 of 4 GPU in use, 2 more asked")
        assert len(posted) == 3
    finally:
        s.stop()


def test_a_restarted_scheduler_waits_for_the_victims_in_flight_and_evicts_no_more(h, kubelet):
    """Issue 29: a leader killed during a reclaim. Two queues of quota 8 on 16 GPUs; b borrows all 16; a's 8 pods
    arrive and 8 of b's pods are evicted, but they terminate slowly (held by the kubelet). The scheduler stops and a
    fresh one starts over the cluster as it is: it must recognise the 8 victims in flight from the objects alone
    (deletionTimestamp, DisruptionTarget, a's nominatedNodeName), not count them as b's usage nor choose them or
    anyone else again: no second eviction for the same need. Once they are gone, a's pods bind."""
    nodes(h, 2, 8)
    make_queue(h, "a", 8)
    make_queue(h, "b", 8)
    first = start(h)
    create(h, *[pod(f"b-{i:02d}", 1, "b", created=-30 + i * 0.01) for i in range(16)])
    wait_for(lambda: len(running(h, "b-")) == 16, what="b borrows all 16 GPUs")
    kubelet.stuck |= set(running(h, "b-"))
    create(h, *[pod(f"a-{i}", 1, "a") for i in range(8)])
    wait_for(lambda: len(evicted(h, "b-")) == 8, what="8 of b's pods evicted")
    wait_for(lambda: all(h.pod(f"a-{i}")["status"].get("nominatedNodeName") for i in range(8)),
             what="a's pods nominated")
    first.stop()
    victims = set(evicted(h))
    assert all(h.pod(v)["metadata"].get("deletionTimestamp") for v in victims)
    asked = len(h.server.evictions)  # dry runs included
    second = start(h)
    hold(2.0, lambda: len(h.server.evictions) == asked, "the restarted scheduler evicted again for the same need")
    assert second.cycles >= 5 and not bind_attempts(h, "a-")
    assert all((h.pod(v) or {}).get("metadata", {}).get("deletionTimestamp") for v in victims)  # still terminating
    assert len(running(h, "b-")) == 8
    kubelet.release()
    wait_for(lambda: len(running(h, "a-")) == 8, what="a's pods bind once the victims are gone")
    hold(0.5, lambda: set(evicted(h)) == victims, "more evictions")
    assert sorted(running(h, "b-")) == sorted(f"b-{i:02d}" for i in range(16) if f"b-{i:02d}" not in victims)
    assert_books(kubelet)
