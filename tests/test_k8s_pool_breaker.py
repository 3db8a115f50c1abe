"""Adversarial inputs for pool mode (:mod:`gpupool.k8s.pool`) on the model-level harness: bad PodGroup
annotations, odd gangs, broken Queue trees, odd priorities, objects deleted or re-created mid-eviction,
relists, PDB refusals, time-slicing, idle churn. Each test is a minimal reproduction; those marked
``xfail(strict=True)`` fail today (a finding), the rest guard behaviour that holds."""

from __future__ import annotations

import copy
from collections import Counter

import pytest

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI
from gpupool.k8s.state import ClusterModel
from k8s_pool_harness import Cluster, node, pod, pod_group, queue


# ------------------------------------------------------------------ helpers
def evicted(c: Cluster, action: str = "") -> list[str]:
    return [k for _, what, k in c.log if what.startswith("evicted") and (not action or what == f"evicted:{action}")]


def booked(c: Cluster) -> Counter:
    """milli-GPU booked per (node, GPU index) by the pods the API holds on nodes (what kubelets would run)."""
    used: Counter = Counter()
    for p in c.pods.values():
        n = p["spec"].get("nodeName")
        if not n or p["status"]["phase"] not in ("Pending", "Running") or "deletionTimestamp" in p["metadata"]:
            continue
        ann = p["metadata"]["annotations"]
        for g in filter(None, ann.get(ANN_GPU_INDEX, "").split(",")):
            used[(n, g)] += int(ann.get(ANN_GPU_MILLI, "1000"))
    return used


def sound(c: Cluster) -> None:
    """No pool error swallowed, books balance, no GPU booked twice, every pending pod planned with a reason."""
    assert c.model.stats.get("pool_errors", 0) == 0, "the pool cycle raised (see log: pool_cycle_failed)"
    c.model.state.check_invariants()
    over = {k: v for k, v in booked(c).items() if v > 1000}
    assert not over, f"GPUs booked twice: {over}"
    plan = c.plans[-1]
    planned = {p.pod for p in plan.placements}
    lost = [k for k in c.pending() if k not in planned and k not in c.model.assumed]
    assert not lost, f"pending pods with no placement nor reason: {lost}"
    assert all(p.reason for p in plan.placements if p.node is None)


def no_pool_plan(nodes, queues, groups, pods) -> dict:
    m = ClusterModel(clock=lambda: 1_700_000_000.0)
    m.replace("nodes", nodes)
    m.replace("queues", queues)
    m.replace("podgroups", groups)
    m.replace("volcanopodgroups", [])
    m.replace("pods", pods)
    return {p.pod: p for p in m.cycle().placements}


def ts_node(name: str = "ts", physical: int = 2, replicas: int = 4) -> dict:
    return node(name, physical * replicas, "NVIDIA-L4-SHARED",
                **{"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing"})


# ================================================================== findings (fail today)
def test_mpijob_gang_with_a_zero_gpu_launcher_starts():
    # Kubeflow MPIJob: 1 launcher (no GPU) + 2 workers of 8 GPUs, minMember 3, two 8-GPU nodes. --no-pool places it.
    nodes, groups = [node("n1"), node("n2")], [pod_group("mpi", 3)]
    pods = [pod("mpi-launcher", 0, queue="a", group="mpi"),
            pod("mpi-w0", 8, queue="a", group="mpi"), pod("mpi-w1", 8, queue="a", group="mpi")]
    assert all(p.node for p in no_pool_plan(nodes, [queue("a")], groups, copy.deepcopy(pods)).values())
    c = Cluster(nodes, [queue("a")], groups=groups)
    c.add(*pods)
    c.run(3)
    sound(c)
    # today: "needs 3 pod(s) of 8 GPU(s) (24 GPUs); the cluster can hold only 2 such pod(s)" forever
    assert len(c.running()) == 3, c.reason("default/mpi-w0")


def test_gang_of_unequal_pods_that_fits_exactly_starts():
    c = Cluster([node("n1", 4)], [queue("a")], groups=[pod_group("g", 2)])
    c.add(pod("g-0", 1, queue="a", group="g"), pod("g-1", 3, queue="a", group="g"))
    c.run(3)
    sound(c)
    # today: "needs 2 pod(s) of 3 GPU(s) (6 GPUs)" on a 4-GPU node where 1 + 3 fit
    assert len(c.running()) == 2, c.reason("default/g-0")


@pytest.mark.xfail(strict=True, reason="known limit: a gang of unequal GPU pods is placed all or nothing by the "
                   "part-1 path and charged to its queue there (limits), but the pool's fair-share books leave it out")
def test_gang_of_unequal_pods_is_charged_what_it_holds():
    c = Cluster([node("n1")], [queue("a", quota=8)], groups=[pod_group("g", 2)])
    c.add(pod("g-0", 1, queue="a", group="g"), pod("g-1", 3, queue="a", group="g"))
    c.run(3)
    sound(c)
    assert len(c.running()) == 2
    pool = c.driver.pool
    held = pool.alloc[pool.tree.index["a"]][0]
    assert held == 4, f"queue a charged {held} GPUs for pods holding 4"  # today: 6


def test_queue_with_limit_below_quota_does_not_break_the_pool():
    c = Cluster([node("n1")], [queue("a", quota=4, limit=2), queue("b", quota=4)])
    c.add(*[pod(f"b{i}", 1, queue="b") for i in range(2)])
    c.run(3)
    assert c.model.stats.get("pool_errors", 0) == 0, "pool cycle failed every cycle (TypeError: tree is None)"
    assert c.driver.tree_error  # the bad Queue is reported, like a cycle is


def test_a_cycle_among_other_queues_leaves_preemption_working_in_a_valid_queue():
    qs = [queue("a", quota=8), queue("x", parent="y"), queue("y", parent="x")]
    c = Cluster([node("n1")], qs, min_run_s=0, reclaim_min_run_s=0)
    c.add(pod("lo", 8, queue="a", priority=1))
    c.run(2)
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.run(5)
    sound(c)
    assert c.running() == ["default/hi"], c.reason("default/hi")  # today: lo keeps running, hi waits


def test_nominated_preemptor_not_bound_onto_gpus_another_scheduler_took():
    c = Cluster([node("n1")], [queue("a", quota=8)], min_run_s=0, reclaim_min_run_s=0)
    c.add(pod("lo", 8, queue="a", priority=1))
    c.run(2)
    c.slow.add("default/lo")  # the victim takes its grace period
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.cycle()
    assert "default/hi" in c.driver.held
    # the victim goes, and kube-scheduler (which does not see gpupool's nomination) binds its own GPU pod there
    c.delete("default/lo")
    other = pod("other", 8, scheduler="default-scheduler", created=6)
    other["spec"]["nodeName"] = "n1"
    other["status"]["phase"] = "Running"
    c.add(other)
    plan = c.cycle()
    bound = [p.pod for p in plan.placements if p.node and not p.nominated]
    # today: "victims gone from node n1: binding": hi is bound onto GPUs 0-7 that other holds (kubelet rejects it)
    assert "default/hi" not in bound, c.reason("default/hi")


def test_valid_kubernetes_priorities_are_accepted():
    # (quota 2: a pod at priority >= 100 is non-preemptible and runs only within its queue's quota, KAI's rule)
    c = Cluster([node("n1")], [queue("a", quota=2)])
    c.add(pod("low", 1, queue="a", priority=-2**31), pod("crit", 1, queue="a", priority=2_000_001_000))
    c.run(2)
    sound(c)
    # today: "pod default/low: priority 2147483648 outside 0..1000000000" (the value is -2147483648)
    assert c.running() == ["default/crit", "default/low"], (c.reason("default/low"), c.reason("default/crit"))


def test_pod_naming_a_parent_queue_is_not_silently_run_outside_the_pool():
    c = Cluster([node("n1")], [queue("root", quota=8), queue("a", quota=8, parent="root")],
                min_run_s=0, reclaim_min_run_s=0)
    c.add(pod("x", 8, queue="root", priority=1))
    c.run(2)
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.run(5)
    sound(c)
    # expected: x waits with a reason naming the non-leaf queue (or is a pool job hi can preempt);
    # today: x runs, bound by the part-1 path, and hi waits forever
    assert "default/x" not in c.running() or c.running() == ["default/hi"], c.reason("default/hi")


def test_pod_in_a_queue_whose_parent_is_missing_is_reported():
    c = Cluster([node("n1")], [queue("a", parent="missing")])
    c.add(pod("x", 1, queue="a"))
    c.run(2)
    sound(c)
    assert c.pending() == ["default/x"] and "missing" in c.reason("default/x"), c.reason("default/x")


@pytest.mark.xfail(strict=True, reason="known limit: the pool's fair-share books count a time-slice as one GPU "
                                       "(the queue status and limits charge the slice)")
def test_time_slices_are_charged_as_slices_in_the_pool():
    c = Cluster([ts_node()], [queue("a", quota=1), queue("b", quota=1)], reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"a{i}", 1, queue="a") for i in range(4)])
    c.run(2)
    c.add(*[pod(f"b{i}", 1, queue="b", created=5) for i in range(4)])
    c.run(2)
    sound(c)
    status = c.model.queue_status()
    pool = c.driver.pool
    for q in ("a", "b"):
        assert pool.alloc[pool.tree.index[q]][0] == pytest.approx(status[q]["usedGPUs"]), (q, c.reason("default/b3"))


def test_time_sliced_node_fills_in_one_cycle():
    c = Cluster([ts_node(), node("n1", 4)], [queue("a")])
    c.add(*[pod(f"a{i}", 1, queue="a") for i in range(12)])
    c.cycle()
    sound(c)
    assert len(c.running()) == 12, c.reason("default/a11")  # 8 slots + 4 GPUs; today 6 in the first cycle


def test_reason_names_the_disruption_budget_after_a_refusal():
    c = Cluster([node("n1")], [queue("a", quota=8)], min_run_s=0, reclaim_min_run_s=0)
    c.add(pod("lo", 8, queue="a", priority=1))
    c.run(2)
    c.pdb_blocked.add("default/lo")
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.run(3)
    sound(c)
    assert [x for x in c.log if x[1] == "refused"]
    # today: "0/1 nodes are available: 1 Insufficient GPU share."
    assert "disruption" in c.reason("default/hi").lower(), c.reason("default/hi")


def test_required_topology_without_topology_labels_explains_itself():
    c = Cluster([node("n1", 4), node("n2", 4)], [queue("a")],
                groups=[pod_group("g", 2, **{"gpupool.io/topology": "required"})])
    c.add(*[pod(f"g-{i}", 4, queue="a", group="g") for i in range(2)])
    c.run(3)
    sound(c)
    why = c.reason("default/g-0")
    # today: "no switch domain can hold 2 pods of 4 GPU(s) (topology required)"
    assert c.running() or "label" in why, why


def test_gang_spanning_two_queues_is_adopted_and_preemptible():
    # placed by the part-1 path (its pods name two queues), then adopted as a pool job once bound
    c = Cluster([node("n1")], [queue("a", quota=8), queue("b", quota=0)], groups=[pod_group("g", 2)],
                min_run_s=0, reclaim_min_run_s=0)
    c.add(pod("g-0", 4, queue="a", group="g", priority=1), pod("g-1", 4, queue="b", group="g", priority=1))
    c.run(2)
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.run(5)
    sound(c)
    assert c.running() == ["default/hi"] and sorted(evicted(c)) == ["default/g-0", "default/g-1"]


# ================================================================== guards (hold today)
@pytest.mark.parametrize("raw", ["0", "-3", "abc", "99999999999999999999", "1.5", ""])
def test_unreadable_or_absurd_max_member_means_no_cap(raw):
    c = Cluster([node("n1")], [queue("a")], groups=[pod_group("g", 2, **{"gpupool.io/max-member": raw})])
    c.add(*[pod(f"g-{i}", 1, queue="a", group="g") for i in range(4)])
    c.run(3)
    sound(c)
    assert len(c.running()) == 4


def test_max_member_with_spaces_caps_the_gang_with_a_reason():
    c = Cluster([node("n1")], [queue("a")], groups=[pod_group("g", 2, **{"gpupool.io/max-member": " 2 "})])
    c.add(*[pod(f"g-{i}", 1, queue="a", group="g") for i in range(4)])
    c.run(3)
    sound(c)
    assert len(c.running()) == 2
    assert "max-member 2" in c.reason(c.pending()[0])


@pytest.mark.parametrize("mode,tier,runs", [("REQUIRED", "bogus", False), ("bogus", "nvlink", True),
                                            ("none", "unknown", True), ("Preferred", "", True)])
def test_odd_topology_annotations_never_crash(mode, tier, runs):
    c = Cluster([node("n1", 4), node("n2", 4)], [queue("a")],
                groups=[pod_group("g", 2, **{"gpupool.io/topology": mode, "gpupool.io/topology-tier": tier})])
    c.add(*[pod(f"g-{i}", 4, queue="a", group="g") for i in range(2)])
    c.run(3)
    sound(c)
    assert bool(c.running()) is runs, c.reason("default/g-0")


def test_odd_kai_and_volcano_topology_specs_fall_back():
    from gpupool.k8s.pool import job_topology

    assert job_topology({"spec": {"networkTopology": {"mode": "hard", "highestTierAllowed": "x"}}}, None) == \
        ("required", "switch")
    assert job_topology({"spec": {"networkTopology": {"mode": "soft", "highestTierAllowed": -4}}}, None) == \
        ("preferred", "nvlink")
    assert job_topology({"spec": {"networkTopology": "junk"}}, None) == ("preferred", "switch")
    assert job_topology({"spec": {"topologyConstraint": {"requiredTopologyLevel": ["rack"]}}}, None)[0] == \
        "required"
    assert job_topology({"spec": {"topologyConstraint": {"preferredTopologyLevel": "topology.kubernetes.io/zone"}}},
                        None) == ("preferred", "switch")
    assert job_topology({"spec": "junk", "metadata": {"annotations": None}}, None) == ("preferred", "switch")


def test_min_member_above_the_pods_waits_with_a_reason():
    c = Cluster([node("n1")], [queue("a")], groups=[pod_group("g", 5)])
    c.add(*[pod(f"g-{i}", 1, queue="a", group="g") for i in range(3)])
    c.run(3)
    sound(c)
    assert not c.running() and "minMember 5" in c.reason("default/g-0")


def test_gang_with_mixed_priorities_places_within_quota():
    c = Cluster([node("n1")], [queue("a", quota=8)], groups=[pod_group("g", 2)])
    c.add(pod("g-0", 1, queue="a", group="g", priority=5), pod("g-1", 1, queue="a", group="g", priority=500))
    c.run(3)
    sound(c)
    assert len(c.running()) == 2


def test_zero_gpu_pod_and_oversized_pod():
    c = Cluster([node("n1")], [queue("a")])
    c.add(pod("z", 0, queue="a"), pod("big", 9, queue="a"), pod("small", 1, queue="a", created=1))
    c.run(3)
    sound(c)
    assert c.running() == ["default/small", "default/z"]
    assert "Insufficient" in c.reason("default/big")


def test_same_pod_and_group_names_in_two_namespaces():
    c = Cluster([node("n1")], [queue("a")], groups=[pod_group("g", 2, ns="ns1"), pod_group("g", 2, ns="ns2")])
    c.add(*[pod(f"g-{i}", 2, queue="a", group="g", ns=ns) for i in range(2) for ns in ("ns1", "ns2")])
    c.add(pod("x", 4, queue="a", ns="ns1", created=1), pod("x", 4, queue="a", ns="ns2", created=1))
    c.run(3)
    sound(c)
    assert len(c.running()) == 4 and c.pending() == ["ns1/x", "ns2/x"]


def test_zero_weights_share_equally():
    c = Cluster([node("n1")], [queue("a", weight=0), queue("b", weight=0)])
    c.add(*[pod(f"a{i}", 1, queue="a") for i in range(4)], *[pod(f"b{i}", 1, queue="b") for i in range(6)])
    c.run(3)
    sound(c)
    fs = c.driver.fair_shares()
    assert fs["a"] == pytest.approx(4) and fs["b"] == pytest.approx(4)


def test_queue_cycle_is_reported_and_nothing_crashes():
    c = Cluster([node("n1")], [queue("a", parent="b"), queue("b", parent="a")])
    c.add(pod("x", 1, queue="a"), pod("y", 1))
    c.run(3)
    sound(c)
    assert "cycle" in c.driver.tree_error


def test_podgroup_deleted_while_its_pods_run():
    g = pod_group("g", 2)
    c = Cluster([node("n1")], [queue("a")], groups=[g])
    c.add(*[pod(f"g-{i}", 2, queue="a", group="g") for i in range(2)])
    c.run(3)
    c.model.apply("podgroups", "DELETED", g)
    c.run(30)
    sound(c)
    assert len(c.running()) == 2 and not evicted(c)
    c.add(pod("g-new", 2, queue="a", group="g", created=60))
    c.run(2)
    sound(c)
    assert "PodGroup default/g not found" in c.reason("default/g-new")


def test_queue_deleted_while_its_pods_run():
    qa = queue("a", quota=4)
    c = Cluster([node("n1")], [qa, queue("b", quota=4)], reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"a{i}", 1, queue="a") for i in range(8)])
    c.run(3)
    c.model.apply("queues", "DELETED", qa)
    c.add(*[pod(f"b{i}", 1, queue="b", created=10) for i in range(4)])
    c.run(10)
    sound(c)
    assert len(c.running("default/a")) == 8 and not evicted(c)


def preempting(slow: bool = True) -> Cluster:
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=16)], min_run_s=0, reclaim_min_run_s=0)
    c.add(*[pod(f"lo{i}", 8, queue="a", priority=1) for i in range(2)])
    c.run(2)
    if slow:
        c.slow |= {"default/lo0", "default/lo1"}
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.cycle()
    assert c.driver.held and c.driver.evicting
    return c


def test_node_deleted_under_a_nominated_preemptor():
    c = preempting()
    held = next(iter(c.driver.held.values())).node
    c.model.apply("nodes", "DELETED", {"metadata": {"name": held}})
    c.run(5)
    sound(c)
    assert all(h.node != held for h in c.driver.held.values())
    c.slow.clear()
    for k in list(c.driver.evicting):
        c.delete(k)
    c.run(5)
    sound(c)
    assert "default/hi" in c.running()


def test_victim_recreated_with_the_same_name_during_eviction():
    c = preempting()
    victim = next(iter(c.driver.evicting))
    c.delete(victim)
    c.add(pod(victim.split("/")[1], 8, queue="a", priority=1, created=7))  # new uid, pending
    c.run(3)
    sound(c)
    assert "default/hi" in c.running() and victim in c.pending()
    assert len(set(evicted(c))) == 1


def test_relist_in_the_middle_of_an_eviction():
    c = preempting()
    c.model.replace("pods", list(c.pods.values()))
    c.run(3)
    sound(c)
    assert "default/hi" in c.driver.held
    c.slow.clear()
    for k in list(c.driver.evicting):
        c.delete(k)
    c.run(3)
    sound(c)
    assert "default/hi" in c.running() and len(evicted(c)) == 1


def test_repeated_pdb_refusals_evict_nothing_and_do_not_spin():
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=16)], min_run_s=0, reclaim_min_run_s=0)
    c.add(*[pod(f"lo{i}", 8, queue="a", priority=1) for i in range(2)])
    c.run(2)
    c.pdb_blocked |= {"default/lo0", "default/lo1"}
    c.add(pod("hi", 8, queue="a", priority=50, created=5))
    c.run(600)
    sound(c)
    refused = [x for x in c.log if x[1] == "refused"]
    assert c.pending() == ["default/hi"] and len(c.running()) == 2
    assert 0 < len(refused) <= 600 / 30 + 1  # one dry run per protection window, not one a cycle
    c.pdb_blocked.discard("default/lo1")
    c.run(120)
    sound(c)
    assert "default/hi" in c.running() and evicted(c) == ["default/lo1"]


def test_nothing_churns_when_nothing_changes():
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=8), queue("b", quota=8)],
                groups=[pod_group("e", 2)], reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"e-{i}", 2, queue="a", group="e") for i in range(8)])
    c.add(*[pod(f"b{i}", 1, queue="b") for i in range(3)], pod("big", 8, queue="b", created=1))
    c.run(5)
    n, stats = len(c.log), dict(c.driver.stats)
    c.run(300)
    sound(c)
    assert c.log[n:] == [] and c.driver.stats == stats


def test_non_preemptible_and_foreign_pods_are_never_evicted():
    c = Cluster([node("n1")], [queue("a", quota=8)], min_run_s=0, reclaim_min_run_s=0)
    c.add(*[pod(f"o{i}", 1, queue="a", scheduler="default-scheduler") for i in range(4)])
    for k in list(c.pods):
        c._update(k, lambda p: (p["spec"].__setitem__("nodeName", "n1"), p["status"].__setitem__("phase", "Running")))
    c.add(*[pod(f"np{i}", 1, queue="a", priority=100) for i in range(4)])
    c.run(2)
    c.add(pod("hi", 8, queue="a", priority=10**6, created=5))
    c.run(100)
    sound(c)
    assert not evicted(c) and c.pending() == ["default/hi"]
    assert "non-preemptible" in c.reason("default/hi")


def test_time_sliced_node_mixed_with_pool_jobs_is_sound():
    c = Cluster([ts_node(), node("n1", 4)], [queue("a", quota=4), queue("b", quota=4)],
                groups=[pod_group("g", 2)], reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"a{i}", 1, queue="a") for i in range(12)])
    c.run(10)
    sound(c)
    assert len(c.running()) == 12
    c.add(*[pod(f"g-{i}", 2, queue="b", group="g", created=20) for i in range(2)])
    c.run(20)
    sound(c)
    for k in c.running("default/g-"):  # k replicas on k distinct physical GPUs
        idx = c.pods[k]["metadata"]["annotations"][ANN_GPU_INDEX].split(",")
        assert len(set(idx)) == len(idx)
