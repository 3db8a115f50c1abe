"""Pool mode with pods that ask no GPU and pods that no node can take (issue 29: the "CPU-only gang" and "head of
line" cases of ``../shared/cases/reports-2026-12/EXPECTED.md``; issue 33, item 2).

* A gang whose pods ask no GPU runs, on an empty GPU node and while every GPU is taken; pods without GPUs run on
  a cluster whose nodes advertise no ``nvidia.com/gpu`` (none, or GPUs offered through DRA only).
* A pod that no node can take for a reason that does not change with load (host CPU or memory, a node selector, a
  GPU model or type, a taint, more GPUs than a node has) steps out of its queue's order with a FailedScheduling
  style reason that promises no reclaim, as kube-scheduler's unschedulable queue does; the queue's later pods
  go on; it comes back when a node is added or changes. A pod merely too big for the free GPUs waits in order.

Each on the pool scheduler itself, the model-and-driver harness (``k8s_pool_harness``), the dry run (``plan`` of a
snapshot, what ``gpupool scheduler --dry-run --snapshot`` runs) and the live scheduler against the mock API server.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.filters import DEFAULT_FILTERS, EffectiveRequest
from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import PoolConfig, PoolScheduler
from gpupool.k8s import wire
from gpupool.k8s.pool import live_config
from gpupool.k8s.snapshot import plan, snapshot_from_objects
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy
from k8s_pool_harness import Cluster, node, pod, pod_group

RECLAIM_PROMISE = "taken back"  # the words of the reason that promises GPUs from other queues
STEPS_OUT = "Set aside from the order of queue"


def cpu_pod(name: str, group: str | None = None, created: float = 0.0) -> dict[str, Any]:
    """A pod of gpupool's that asks no GPU (1 CPU)."""
    p = pod(name, gpus=0, group=group, created=created)
    p["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    return p


def no_gpu_node(name: str) -> dict[str, Any]:
    """A node that advertises no nvidia.com/gpu (no GPU, or its GPUs offered through DRA only)."""
    n = node(name)
    del n["status"]["allocatable"]["nvidia.com/gpu"]
    n["metadata"]["labels"] = {}
    return n


# ------------------------------------------------------------------ pods without GPUs
def test_cpu_only_gang_alone_on_an_empty_gpu_node_runs():
    c = Cluster([node("n1", gpus=8)])
    c.add_group(pod_group("g", 2))
    c.add(cpu_pod("a", group="g"), cpu_pod("b", group="g"))
    c.run(2)
    assert c.running() == ["default/a", "default/b"]


def test_cpu_only_gang_runs_while_every_gpu_is_taken():
    """Before: "gang default/g cannot be placed together now (2 pod(s) x 0 GPU(s) at once)" for ever (the
    allocate action stopped as soon as no GPU was free)."""
    c = Cluster([node("n1", gpus=1)])
    c.add(pod("x", gpus=1))
    c.run(2)
    c.add_group(pod_group("g", 2))
    c.add(cpu_pod("a", group="g"), cpu_pod("b", group="g"))
    c.run(2)
    assert c.running() == ["default/a", "default/b", "default/x"], c.reason("default/a")


def test_pods_without_gpus_run_on_a_cluster_without_gpus():
    """Before: "waiting in queue default (holds 0 GPUs, fair share 0)", nothing bound."""
    c = Cluster([no_gpu_node("n1"), no_gpu_node("n2")])
    c.add_group(pod_group("g", 2))
    c.add(cpu_pod("a"), cpu_pod("b"), cpu_pod("g1", group="g"), cpu_pod("g2", group="g"))
    c.run(2)
    assert c.running() == ["default/a", "default/b", "default/g1", "default/g2"], c.reason("default/a")


def test_a_cpu_pod_too_big_for_free_cpu_does_not_stop_gpu_pods():
    """A 0-GPU job that fails for want of free host CPU says nothing about GPU jobs (it used to be remembered
    as a failed shape that every GPU job is at least as big as)."""
    n = node("n1", gpus=8)
    n["status"]["allocatable"]["cpu"] = "8"
    c = Cluster([n])
    c.add(pod("x", gpus=0))  # 1 CPU, bound first
    c.run(1)
    heavy = cpu_pod("heavy", created=1)
    heavy["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "8"  # fits the node, not its free CPU now
    c.add(heavy, pod("s", gpus=1, created=2))
    c.run(1)
    assert "default/s" in c.running() and c.pending() == ["default/heavy"]


def test_dry_run_places_pods_without_gpus_on_a_cluster_without_gpus():
    snap = snapshot_from_objects([no_gpu_node("n1"), pod_group("g", 2), cpu_pod("a"), cpu_pod("g1", group="g"),
                                  cpu_pod("g2", group="g")])
    placed = {p.pod: p.node for p in plan(snap, pool=live_config()).placements}
    assert placed == {"default/a": "n1", "default/g1": "n1", "default/g2": "n1"}


# ------------------------------------------------------------------ a pod no node can take
def _memory(p: dict[str, Any]) -> None:
    p["spec"]["containers"][0]["resources"]["requests"]["memory"] = "4000Gi"


def _cpu(p: dict[str, Any]) -> None:
    p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "500"


def _selector(p: dict[str, Any]) -> None:
    p["spec"]["nodeSelector"] = {"pool": "big"}


def _model(p: dict[str, Any]) -> None:
    p["metadata"]["annotations"]["gpupool.io/gpu-model"] = "A100-80GB"


def _gputype(p: dict[str, Any]) -> None:
    p["metadata"]["annotations"]["nvidia.com/use-gputype"] = "L40S"


def _taint(p: dict[str, Any]) -> None:
    pass  # the node is tainted instead (see _tainted): the pod tolerates nothing


def _gpus(p: dict[str, Any]) -> None:
    p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "9"


# cause -> (how the big pod asks it, a word of its reason, a node that fits it)
CAUSES = {
    "memory": (_memory, "Insufficient memory", lambda: _roomy(node("n2"))),
    "cpu": (_cpu, "Insufficient cpu", lambda: _roomy(node("n2"))),
    "selector": (_selector, "node affinity/selector", lambda: node("n2", pool="big")),
    "gpu-model": (_model, "GPU model", lambda: node("n2", product="NVIDIA-A100-SXM4-80GB")),
    "use-gputype": (_gputype, "GPU type", lambda: node("n2", product="NVIDIA-L40S")),
    "taint": (_taint, "untolerated taint", lambda: node("n2")),
    "gpu-count": (_gpus, "Insufficient GPUs (fewer than 9", lambda: node("n2", gpus=16)),
}


def _roomy(n: dict[str, Any]) -> dict[str, Any]:
    n["status"]["allocatable"].update({"cpu": "1024", "memory": "8000Gi"})
    return n


def _tainted(cause: str) -> dict[str, Any]:
    n = node("n1", gpus=8)
    if cause == "taint":
        n["spec"]["taints"] = [{"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]
        n["metadata"]["labels"]["role"] = "small"
    return n


def _small(i: int, cause: str) -> dict[str, Any]:
    p = pod(f"s{i}", gpus=1, created=1 + i)
    if cause == "taint":
        p["spec"]["tolerations"] = [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    return p


def _big(cause: str) -> dict[str, Any]:
    p = pod("big", gpus=1, created=0)
    CAUSES[cause][0](p)
    return p


@pytest.mark.parametrize("cause", sorted(CAUSES))
def test_a_pod_no_node_can_take_steps_out_of_its_queue(cause):
    """First in its queue, a pod no node can take: the 5 small pods behind it run, its reason names the cause and
    promises no reclaim; a node that fits it is added and it runs. Before: 0 of 5 ran (the big pod's failure was
    remembered as its GPU shape failing, which every later 1-GPU pod matched), and its reason promised GPUs
    "taken back" from other queues."""
    c = Cluster([_tainted(cause)])
    c.add(_big(cause), *[_small(i, cause) for i in range(5)])
    c.run(2)
    assert c.running() == [f"default/s{i}" for i in range(5)], c.reason("default/s0")
    why = c.reason("default/big")
    assert CAUSES[cause][1] in why and STEPS_OUT in why and RECLAIM_PROMISE not in why, why
    c.model.apply("nodes", "ADDED", CAUSES[cause][2]())
    c.run(2)
    assert "default/big" in c.running(), c.reason("default/big")


@pytest.mark.parametrize("cause", ["selector", "taint"])
def test_a_set_aside_pod_comes_back_when_a_node_changes(cause):
    """No node added: the node's labels or taints change (the state keeps its capacity) and the pod fits."""
    c = Cluster([_tainted(cause)])
    c.add(_big(cause), _small(0, cause))
    c.run(2)
    assert c.running() == ["default/s0"] and STEPS_OUT in c.reason("default/big")
    n = copy.deepcopy(_tainted(cause))
    n["metadata"]["resourceVersion"] = "999999"
    n["metadata"]["labels"]["pool"] = "big"
    n["spec"].pop("taints", None)
    c.model.apply("nodes", "MODIFIED", n)
    c.run(2)
    assert c.running() == ["default/big", "default/s0"], c.reason("default/big")


def test_a_pod_that_stops_fitting_when_a_node_changes_steps_out():
    """The other way round: the only node that matched its selector loses the label; the pod steps out and the
    queue's next pod runs."""
    n1 = node("n1", gpus=1, pool="big")
    c = Cluster([n1])
    c.add(pod("x", gpus=1))  # takes the GPU: the selector pod waits in order, for room
    c.run(1)
    picky = pod("picky", gpus=1, created=1)
    _selector(picky)
    c.add(picky)
    c.run(1)
    assert STEPS_OUT not in c.reason("default/picky")
    relabelled = copy.deepcopy(n1)
    relabelled["metadata"]["resourceVersion"] = "999998"
    del relabelled["metadata"]["labels"]["pool"]
    c.model.apply("nodes", "MODIFIED", relabelled)
    c.run(1)
    assert STEPS_OUT in c.reason("default/picky") and "node affinity/selector" in c.reason("default/picky")


def test_a_pod_merely_too_big_for_the_free_gpus_waits_in_order():
    """8 GPUs asked, 4 free: not set aside; it keeps its place (and its reclaim wording) as before."""
    c = Cluster([node("n1", gpus=8)])
    c.add(*[pod(f"r{i}", gpus=1, created=i) for i in range(4)])
    c.run(1)
    c.add(pod("wide", gpus=8, created=10))
    c.run(1)
    assert c.pending() == ["default/wide"]
    assert STEPS_OUT not in c.reason("default/wide")
    assert not c.driver.pool.unschedulable


def test_dry_run_steps_over_a_pod_no_node_can_take():
    """The head-of-line case on the dry run: a pod asking more host memory than any node has, created first,
    then 5 small pods of the same queue."""
    big = _big("memory")
    snap = snapshot_from_objects([node("n1", gpus=8), big, *[_small(i, "memory") for i in range(5)]])
    out = {p.pod: p for p in plan(snap, pool=live_config()).placements}
    assert all(out[f"default/s{i}"].node == "n1" for i in range(5)), out["default/s0"].reason
    assert out["default/big"].node is None
    why = out["default/big"].reason
    assert "Insufficient memory" in why and STEPS_OUT in why and RECLAIM_PROMISE not in why, why


# ------------------------------------------------------------------ the pool scheduler itself
def _sched(**cfg: Any) -> PoolScheduler:
    state = ClusterState([NodeSpec("n0", 64_000, 512_000, 8, "H100")])
    return PoolScheduler(state, make_policy("gpupool"), QueueTree([QueueSpec(name="q")]), PoolConfig(**cfg))


def test_pool_scheduler_sets_aside_a_job_no_node_can_take():
    sched = _sched()
    big = PoolJob("big", "q", 1, 1, 0.0, mem_per_pod=1_000_000)  # more memory than the node has
    small = PoolJob("small", "q", 1, 1, 1.0)
    sched.submit(big, 0.0)
    sched.submit(small, 0.0)
    assert sched.unschedulable == {big.seq: big} and "Insufficient memory" in big.reason
    assert sched.n_pending == 1 and sched.pending_jobs() == [small, big]
    assert sched.cycle(0.0).started == [small]
    assert sched.infeasible_reason(big) == big.reason
    sched.detach(big, 1.0, requeue=False)  # a job set aside leaves as any waiting job does
    assert not sched.unschedulable and big.status == "removed"


def test_pool_scheduler_runs_jobs_without_gpus_when_no_gpu_is_free():
    sched = _sched()
    gpu = PoolJob("gpu", "q", 8, 1, 0.0)
    sched.submit(gpu, 0.0)
    assert sched.cycle(0.0).started == [gpu] and sched.free_gpus == 0
    cpu = PoolJob("cpu", "q", 0, 2, 1.0, cpu_per_pod=1000)
    sched.submit(cpu, 1.0)
    assert sched.cycle(1.0).started == [cpu]


def test_capacity_fit_leaves_load_out():
    from gpupool.engine.filters import capacity_fit  # (new with this test)

    state = ClusterState([NodeSpec("n0", 8_000, 64_000, 2, "H100"), NodeSpec("n1", 16_000, 32_000, 0, "")])
    state.allocate(PodRequest("busy", cpu_milli=8_000, num_gpu=2, gpu_milli=1000), 0, (0, 1), 1000)
    eff = EffectiveRequest(PodRequest("p", cpu_milli=4_000, num_gpu=1, gpu_milli=1000), 1000)
    pods, why = capacity_fit(state, eff, DEFAULT_FILTERS)
    assert why == "" and pods.tolist() == [2, 0]  # node 0 is full now, not for ever
    eff = EffectiveRequest(PodRequest("p", memory_mib=100_000), 0)
    pods, why = capacity_fit(state, eff, DEFAULT_FILTERS)
    assert pods.tolist() == [0, 0] and why == "0/2 nodes are available: 2 Insufficient memory."


# ------------------------------------------------------------------ live, against the mock API server
def test_live_a_pod_no_node_can_take_does_not_freeze_its_queue():
    from test_k8s_pool_mock import Kubelet, create, events, running, start, unbound
    from test_k8s_scheduler import PODGROUPS, QUEUES, Harness, gpu_node, wait_for

    h = Harness()
    h.declare(PODGROUPS)
    h.declare(QUEUES)
    kubelet = Kubelet(h)
    kubelet.start()
    try:
        h.create_node(gpu_node("n0", gpus=8))  # 256Gi of memory
        start(h)
        big = pod("big", gpus=1)
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            big["metadata"].pop(key, None)
        _memory(big)
        create(h, big)
        time.sleep(0.3)  # the big pod is first in its queue
        smalls = []
        for i in range(5):
            p = pod(f"s{i}", gpus=1)
            for key in ("uid", "resourceVersion", "creationTimestamp"):
                p["metadata"].pop(key, None)
            smalls.append(p)
        create(h, *smalls)
        wait_for(lambda: running(h, "s") == [f"s{i}" for i in range(5)], timeout=20, what="the 5 small pods bound")
        assert unbound(h) == ["big"]
        wait_for(lambda: any("Insufficient memory" in (e.get("message") or "")
                             for e in events(h, "big", "FailedScheduling")), timeout=10, what="the big pod's reason")
        msgs = [e.get("message") or "" for e in events(h, "big", "FailedScheduling")]
        assert not any(RECLAIM_PROMISE in m for m in msgs), msgs
        roomy = gpu_node("n1", gpus=8)
        roomy["status"]["allocatable"]["memory"] = "8000Gi"
        h.create_node(roomy)
        wait_for(lambda: running(h, "big") == ["big"], timeout=20, what="the big pod bound on the new node")
        assert (h.pod("big") or {})["spec"]["nodeName"] == "n1"
    finally:
        kubelet.stop()
        h.close()
    assert not kubelet.violations, kubelet.violations


def test_pool_scheduler_grows_an_elastic_job_without_gpus_when_no_gpu_is_free():
    sched = _sched()
    gpu = PoolJob("gpu", "q", 8, 1, 0.0)
    sched.submit(gpu, 0.0)
    sched.cycle(0.0)
    cpu = PoolJob("cpu", "q", 0, 1, 1.0, cpu_per_pod=1000, max_pods=3)
    sched.submit(cpu, 1.0)
    res = sched.cycle(1.0)
    assert res.started == [cpu] and len(cpu.placed) == 3 and sched.free_gpus == 0


def test_live_a_set_aside_pod_binds_once_its_node_is_relabelled():
    from test_k8s_pool_mock import Kubelet, create, running, start
    from test_k8s_scheduler import PODGROUPS, QUEUES, Harness, gpu_node, wait_for

    h = Harness()
    h.declare(PODGROUPS)
    h.declare(QUEUES)
    kubelet = Kubelet(h)
    kubelet.start()
    try:
        h.create_node(gpu_node("n0", gpus=2))
        start(h)
        picky = pod("picky", gpus=1)
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            picky["metadata"].pop(key, None)
        _selector(picky)
        other = pod("other", gpus=1)
        for key in ("uid", "resourceVersion", "creationTimestamp"):
            other["metadata"].pop(key, None)
        create(h, picky, other)
        wait_for(lambda: running(h, "other") == ["other"], timeout=20, what="the other pod bound")
        wire.drain(h.v1.patch_node("n0", {"metadata": {"labels": {"pool": "big"}}},
                                   _content_type="application/merge-patch+json", _preload_content=False))
        wait_for(lambda: running(h, "picky") == ["picky"], timeout=20, what="the relabelled node taking the pod")
    finally:
        kubelet.stop()
        h.close()
    assert not kubelet.violations, kubelet.violations


def test_a_reservation_is_made_on_nodes_the_gang_may_use():
    """The reservation for a starving job honours its node selector. Before: the nodes tied (full), the first one
    was reserved, which the job may not use; small pods kept the other one full, and it waited for ever."""
    c = Cluster([node("n0"), node("n1", pool="big")], reserve_after_s=30)
    n = 0
    for _ in range(16):  # both nodes full of 1-GPU pods
        c.add(pod(f"s{n:03d}", created=n * 0.01))
        n += 1
    c.run(1)
    wide = pod("wide", gpus=8, created=1)
    _selector(wide)
    c.add(wide)
    started = None
    for t in range(200):  # each second the oldest small pod ends and a new one arrives
        c.finish(c.running("default/s")[0])
        c.add(pod(f"s{n:03d}", created=2 + t))
        n += 1
        c.run(1)
        if c.running("default/wide"):
            started = t
            break
    assert started is not None, c.reason("default/wide")
    assert c.pods["default/wide"]["spec"]["nodeName"] == "n1"
