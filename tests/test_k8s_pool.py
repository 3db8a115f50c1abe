"""Pool mode on the live path (:mod:`gpupool.k8s.pool`): the shared-pool scenarios of the simulator's tests
(gang deadlock, large-gang starvation, reclaim to fair share, priority starvation, preemption loops) hold on
the live model, with evictions, nominations, PodDisruptionBudget refusals and elastic gangs."""

from __future__ import annotations

import pytest

from gpupool.k8s.pool import job_topology, live_config, max_member
from k8s_pool_harness import Cluster, node, pod, pod_group, queue


def evicted(c: Cluster, action: str = "") -> list[str]:
    return [k for _, what, k in c.log if what.startswith("evicted") and (not action or what == f"evicted:{action}")]


def test_reclaim_to_fair_share_evicts_the_borrower():
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=8), queue("b", quota=8)], reclaim_min_run_s=0)
    c.add(*[pod(f"b{i}", queue="b") for i in range(16)])
    c.run(2)
    assert len(c.running("default/b")) == 16  # b borrows a's idle quota
    c.add(*[pod(f"a{i}", queue="a", created=10) for i in range(8)])
    c.run(3)
    assert len(c.running("default/a")) == 8
    assert len(c.running("default/b")) == 8
    assert len(evicted(c, "reclaim")) == 8
    assert c.driver.fair_shares()["a"] == 8.0


def test_dry_run_of_kueue_5289_reclaims_from_the_borrowing_sibling():
    """The case's snapshot (``../shared/cases/reports-2026-12/kueue-5289``): team-a borrows team-b's quota under
    team-ab (limit 4); the dry run evicts one of team-a's pods (reclaim) and nominates team-b's pod. Before, it
    planned nothing: "queue team-ab would exceed its limit"."""
    from pathlib import Path

    from gpupool.k8s.snapshot import load_snapshot, plan

    case = Path(__file__).parents[1] / "../shared/cases/reports-2026-12/kueue-5289/snapshot.yaml"
    if not case.exists():
        pytest.skip(f"{case} not found")
    out = plan(load_snapshot(case), pool=live_config()).to_json()
    assert out["summary"]["evictions"] == 1 and out["summary"]["nominated"] == 1
    (pre,) = out["preemptions"]
    assert pre["action"] == "reclaim" and pre["preemptor"] == "team-b/train-b-0"
    assert len(pre["victims"]) == 1 and pre["victims"][0].startswith("team-a/train-a-")
    (placed,) = out["placements"]
    assert placed["pod"] == "team-b/train-b-0" and placed["node"] == "gpu-0" and len(placed["gpus"]) == 2


@pytest.mark.parametrize("limit", [None, 4])
def test_reclaim_from_a_sibling_under_the_same_parent_queue(limit):
    """Kueue #5289 live: team-a and team-b (quota 2 each) under team-ab (quota 4, optionally limit 4) on one 4-GPU
    node; team-a runs two 2-GPU pods, borrowing team-b's quota; team-b's 2-GPU pod reclaims one of them and runs.
    With the limit, the reclaim must evict under team-ab (evicting elsewhere would leave team-ab above it)."""
    c = Cluster([node("n1", gpus=4)], [queue("team-ab", quota=4, limit=limit),
                                       queue("team-a", quota=2, parent="team-ab"),
                                       queue("team-b", quota=2, parent="team-ab")], reclaim_min_run_s=0)
    c.add(*[pod(f"a{i}", 2, queue="team-a") for i in range(2)])
    c.run(2)
    assert len(c.running("default/a")) == 2
    c.add(pod("b0", 2, queue="team-b", created=10))
    c.run(3)
    assert c.running("default/b") == ["default/b0"]
    assert len(evicted(c, "reclaim")) == 1 and len(c.running("default/a")) == 1
    assert c.driver.fair_shares()["team-b"] == 2.0


def test_borrower_not_evicted_before_its_minimum_runtime():
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=30)
    c.add(*[pod(f"b{i}", queue="b") for i in range(8)])
    c.run(2)
    c.add(pod("a0", queue="a", created=5))
    c.run(5)
    assert not evicted(c) and c.pending("default/a") == ["default/a0"]
    c.run(40)
    assert c.running("default/a") == ["default/a0"] and len(evicted(c)) == 1


def test_gang_deadlock_never_happens():
    # scheduler-plugins #114: two gangs of 2 x 8 GPUs on two 8-GPU nodes: one runs whole, the other waits whole
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=16)],
                groups=[pod_group("g1", 2), pod_group("g2", 2)])
    c.add(pod("g1-0", 8, queue="a", group="g1"), pod("g2-0", 8, queue="a", group="g2", created=1),
          pod("g1-1", 8, queue="a", group="g1"), pod("g2-1", 8, queue="a", group="g2", created=1))
    c.run(3)
    assert c.running() == ["default/g1-0", "default/g1-1"]
    assert c.pending() == ["default/g2-0", "default/g2-1"]
    assert "gang" in c.reason("default/g2-0")
    c.finish("default/g1-0")
    c.finish("default/g1-1")
    c.run(2)
    assert c.running() == ["default/g2-0", "default/g2-1"]


def test_large_gang_gets_a_reservation_under_a_stream_of_small_pods():
    c = Cluster([node(f"n{i}") for i in range(4)], [queue("a")], groups=[pod_group("big", 4)],
                reserve_after_s=60)
    n = 0
    for _i in range(32):  # the cluster is full of 1-GPU pods
        c.add(pod(f"s{n}", queue="a", created=n * 0.01))
        n += 1
    c.run(1)
    c.add(*[pod(f"big-{i}", 8, queue="a", group="big", created=2) for i in range(4)])
    started = None
    for t in range(400):  # each second a small pod ends and a new one arrives
        running = c.running("default/s")
        if running:
            c.finish(running[0])
        c.add(pod(f"s{n}", queue="a", created=3 + t))
        n += 1
        c.run(1)
        if c.running("default/big"):
            started = t
            break
    assert started is not None, "the large gang starved"
    assert len(c.running("default/big")) == 4
    assert started >= 60  # it waited for the reservation, then the reserved nodes drained


def test_high_priority_gang_preempts_lower_priority_pods():
    c = Cluster([node("n1"), node("n2")], [queue("a", quota=16)], groups=[pod_group("hp", 2)], min_run_s=0)
    c.add(*[pod(f"lo{i}", 2, queue="a", priority=10) for i in range(8)])
    c.run(2)
    assert len(c.running("default/lo")) == 8
    c.add(pod("hp-0", 8, queue="a", group="hp", priority=50, created=5),
          pod("hp-1", 8, queue="a", group="hp", priority=50, created=5))
    c.run(3)
    assert c.running("default/hp") == ["default/hp-0", "default/hp-1"]
    assert len(evicted(c, "preempt")) == 8


def test_nonpreemptible_pods_are_never_victims():
    c = Cluster([node("n1")], [queue("a", quota=8)], min_run_s=0)
    c.add(*[pod(f"inf{i}", 2, queue="a", priority=125) for i in range(4)])
    c.run(2)
    c.add(pod("hp", 8, queue="a", priority=1000, created=5))
    c.run(3)
    assert not evicted(c)
    assert len(c.running("default/inf")) == 4


def test_no_preemption_loop_between_two_queues():
    # Kueue #3779: two queues at equal share keep taking GPUs back from each other
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"a{i}", queue="a") for i in range(8)])
    c.run(2)
    c.add(*[pod(f"b{i}", queue="b", created=3) for i in range(8)])
    c.run(30)
    assert len(c.running("default/a")) == 4 and len(c.running("default/b")) == 4
    assert len(evicted(c)) == 4  # exactly what b is owed, once


def test_pdb_refusal_makes_the_scheduler_choose_other_victims():
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=0)
    c.add(*[pod(f"b{i}", 2, queue="b", created=i) for i in range(4)])
    c.run(2)
    first_pick = None
    c.pdb_blocked = {f"default/b{i}" for i in range(4)}
    c.add(pod("a0", 2, queue="a", created=10))
    c.cycle()
    refusals = [k for _, what, k in c.log if what == "refused"]
    assert refusals, "the dry run should have been refused"
    first_pick = refusals[0]
    # nothing was evicted, the victims are counted again and a0 waits
    assert not evicted(c) and len(c.running("default/b")) == 4
    assert c.model.state.assignments.keys() >= {f"default/b{i}" for i in range(4)}
    c.pdb_blocked = {first_pick}
    c.now += 1
    c.run(3)
    assert c.running("default/a") == ["default/a0"]
    assert evicted(c) and first_pick not in evicted(c)


def test_victim_that_does_not_terminate_lapses_and_is_counted_again():
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=0)
    c.add(*[pod(f"b{i}", 2, queue="b", grace=5) for i in range(4)])
    c.run(2)
    c.slow = {f"default/b{i}" for i in range(4)}
    c.add(pod("a0", 2, queue="a", created=10))
    c.run(2)
    assert evicted(c)
    victim = evicted(c)[0]
    assert c.pending("default/a") == ["default/a0"]
    assert "nominated" in c.reason("default/a0")
    # the victim shows Terminating (a new version): not counted again while its devices are promised to a0
    assert victim not in c.model.state.assignments and "default/a0" in c.model.state.assignments
    c.model.state.check_invariants()
    assert any(p.nominated for plan in c.plans for p in plan.placements)
    c.run(40)  # grace 5 s + slack 30 s
    assert c.driver.stats["lapsed"] >= 1
    assert victim in c.model.state.assignments  # counted again where it runs
    assert c.model.state.check_invariants() is None


def test_elastic_gang_grows_into_idle_gpus_and_shrinks_first():
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], groups=[pod_group("el", 1)],
                reclaim_min_run_s=0, min_run_s=0)
    c.add(*[pod(f"el-{i}", 2, queue="a", group="el") for i in range(4)])
    c.run(2)
    assert len(c.running("default/el")) == 4  # grew to all 8 GPUs
    c.add(pod("b0", 2, queue="b", created=10))
    c.run(3)
    assert c.running("default/b") == ["default/b0"]
    shrunk = evicted(c, "shrink") + evicted(c, "reclaim")
    assert len(shrunk) == 1 and shrunk[0].startswith("default/el-")
    assert len(c.running("default/el")) == 3


def test_max_member_caps_an_elastic_gang():
    c = Cluster([node("n1")], [queue("a")], groups=[pod_group("el", 1, **{"gpupool.io/max-member": "2"})])
    c.add(*[pod(f"el-{i}", 1, queue="a", group="el") for i in range(4)])
    c.run(3)
    assert len(c.running("default/el")) == 2
    assert "max-member" in c.reason("default/el-3")


def test_queue_limit_holds_and_is_reported():
    c = Cluster([node("n1")], [queue("a", quota=2, limit=3)])
    c.add(*[pod(f"a{i}", 1, queue="a", created=i) for i in range(5)])
    c.run(2)
    assert len(c.running()) == 3
    assert "limit" in c.reason("default/a4")


def test_pods_of_other_schedulers_only_take_capacity():
    c = Cluster([node("n1")], [queue("a", quota=8)], min_run_s=0)
    other = pod("other", 4, scheduler="default-scheduler")
    other["spec"]["nodeName"] = "n1"
    other["status"]["phase"] = "Running"
    c.add(other)
    c.add(pod("hp", 8, queue="a", priority=50))
    c.run(3)
    assert not evicted(c)
    assert "Insufficient" in c.reason("default/hp") or "GPU" in c.reason("default/hp")


def test_restart_adopts_running_pods_into_the_books():
    c = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=0)
    c.add(*[pod(f"b{i}", 2, queue="b") for i in range(4)])
    c.run(2)
    # a new scheduler (a restart or a new leader) sees the same objects
    d = Cluster([node("n1")], [queue("a", quota=4), queue("b", quota=4)], reclaim_min_run_s=0)
    d.now = c.now
    d.add(*c.pods.values())
    d.add(pod("a0", 2, queue="a", created=10))
    d.run(3)
    assert d.running("default/a") == ["default/a0"]
    assert len(evicted(d, "reclaim")) == 1


def test_topology_and_max_member_spellings():
    assert job_topology({"metadata": {"annotations": {"gpupool.io/topology": "required",
                                                      "gpupool.io/topology-tier": "nvlink"}}}, None) == \
        ("required", "nvlink")
    assert job_topology({"metadata": {}, "spec": {"topologyConstraint": {
        "requiredTopologyLevel": "kubernetes.io/hostname"}}}, None) == ("required", "node")
    assert job_topology({"metadata": {}, "spec": {"networkTopology": {"mode": "soft", "highestTierAllowed": 1}}},
                        None) == ("preferred", "nvlink")
    assert job_topology(None, {"metadata": {"annotations": {
        "kueue.x-k8s.io/podset-required-topology": "topology.gpupool.io/rack"}}}) == ("required", "switch")
    assert job_topology(None, None) == ("preferred", "switch")
    assert max_member({"metadata": {"annotations": {"gpupool.io/max-member": "x"}}}, None) is None
    assert live_config().consolidate is False


def test_pool_section_of_the_scheduler_config(tmp_path):
    import pytest

    from gpupool.k8s.scheduler_cli import ConfigError, load_config

    f = tmp_path / "c.yaml"
    f.write_text("pool:\n  jobOrder: tiresias\n  reserveAfter: 5m\n  minRuntime: 0\n  consolidate: true\n"
                 "  defaultQueue: research\n")
    s = load_config(f)
    cfg = s.pool_config()
    assert (cfg.order, cfg.reserve_after_s, cfg.min_run_s, cfg.consolidate) == ("tiresias", 300.0, 0.0, True)
    assert s.default_queue == "research" and s.pool is True
    f.write_text("pool:\n  reserveAfter: never\n  enabled: false\n")
    s = load_config(f)
    assert s.pool is False and s.pool_config().reserve_after_s is None
    for bad, what in (("pool:\n  jobOrder: lifo\n", "jobOrder"), ("pool:\n  enabled: 'yes'\n", "enabled"),
                      ("pool:\n  bogus: 1\n", "bogus")):
        f.write_text(bad)
        with pytest.raises(ConfigError, match=what):
            load_config(f)


def test_dry_run_in_pool_mode_lists_the_evictions_it_would_make():
    from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE
    from gpupool.k8s.snapshot import format_plan, plan, snapshot_from_objects

    bound = []
    for i in range(4):
        p = pod(f"b{i}", 2, queue="b")
        p["spec"]["nodeName"] = "n1"
        p["status"]["phase"] = "Running"
        p["metadata"]["annotations"] = {ANN_NODE: "n1", ANN_GPU_INDEX: f"{2 * i},{2 * i + 1}", ANN_GPU_MILLI: "1000"}
        bound.append(p)
    objs = [node("n1"), queue("a", quota=4), queue("b", quota=4), *bound, pod("a0", 2, queue="a", created=10**9)]
    snap = snapshot_from_objects(objs)
    result = plan(snap, pool=live_config())
    out = result.to_json()
    assert out["summary"]["evictions"] == 1
    pre = out["preemptions"][0]
    assert pre["action"] == "reclaim" and pre["preemptor"] == "default/a0" and pre["victims"][0].startswith("default/b")
    assert pre["nominated"] == {"default/a0": "n1"}
    assert "would evict default/b" in format_plan(result)
    assert plan(snap).preemptions == []  # without the pool: queue limits only


def test_queue_labels_without_the_queue_crd_share_one_pool():
    c = Cluster([node("n1")], None, min_run_s=0)
    c.add(pod("lo", 8, queue="team-x", priority=1), )
    c.run(2)
    c.add(pod("hi", 8, queue="team-y", priority=50, created=5))
    c.run(3)
    assert c.running() == ["default/hi"] and evicted(c, "preempt") == ["default/lo"]


def test_elastic_job_example_is_read_as_documented():
    from pathlib import Path

    import yaml

    docs = list(yaml.safe_load_all((Path(__file__).parents[1] / "examples/k8s/elastic-job.yaml").read_text()))
    group = next(d for d in docs if d["kind"] == "PodGroup")
    job = next(d for d in docs if d["kind"] == "Job")
    assert max_member(group, None) == 4 and job_topology(group, None) == ("preferred", "switch")
    assert group["spec"]["minMember"] == 2 and job["spec"]["parallelism"] == 4


def test_deploy_configmap_pool_section_is_the_default():
    from pathlib import Path

    from gpupool.k8s.scheduler_cli import Settings, load_config

    s = load_config(Path(__file__).parents[1] / "deploy/configmap.yaml")
    assert s.pool_config() == Settings().pool_config() == live_config()
    assert s.default_queue == "default"


def test_a_failing_pool_cycle_falls_back_to_placement_and_recovers(monkeypatch):
    c = Cluster([node("n1")], [queue("a", quota=8)])
    c.add(pod("a0", 1, queue="a"))
    boom = {"n": 1}
    original = c.driver._carry_out

    def flaky(*args, **kwargs):
        if boom["n"]:
            boom["n"] -= 1
            raise RuntimeError("injected")
        return original(*args, **kwargs)

    monkeypatch.setattr(c.driver, "_carry_out", flaky)
    c.run(1)
    assert c.model.stats["pool_errors"] == 1
    assert c.running() == ["default/a0"]  # placed anyway, within queue limits
    c.add(pod("a1", 1, queue="a", created=5))
    c.run(2)
    assert c.running() == ["default/a0", "default/a1"] and c.driver.stats["resets"] >= 2
    assert c.driver.jobs["default/a0"].status == "running"  # adopted into the rebuilt books
    c.model.state.check_invariants()


def _inventory(uuids, unhealthy=()):
    import json

    from gpupool.agent.report import ANN_GPU_INVENTORY

    gpus = [{"index": i, "uuid": u, "healthy": u not in unhealthy, "reason": "XidError" if u in unhealthy else ""}
            for i, u in enumerate(uuids)]
    return {ANN_GPU_INVENTORY: json.dumps({"version": 1, "gpus": gpus})}


def _agent_marks_pod_gpu(c: Cluster, n: dict, uuids, pod_key: str) -> int:
    """Node ``n``'s agent reports the GPU that pod ``pod_key`` runs on unhealthy (XID 79): a new node version with
    that inventory, applied to the model. Returns the GPU index."""
    import copy

    gpu = int(c.pods[pod_key]["metadata"]["annotations"]["gpupool.io/gpu-index"])
    n2 = copy.deepcopy(n)
    n2["metadata"]["resourceVersion"] = "n1-v2"
    n2["metadata"]["annotations"] = _inventory(uuids, unhealthy={uuids[gpu]})
    c.model.apply("nodes", "MODIFIED", n2)
    return gpu


def test_gpu_marked_unhealthy_by_the_agent_is_never_chosen_and_its_pods_are_rescheduled():
    import copy

    uuids = [f"GPU-{i}" for i in range(2)]
    n = node("n1", 2)
    n["metadata"]["annotations"] = _inventory(uuids)
    c = Cluster([n], [queue("a", quota=2)])
    c.driver.heal_after_s = 5
    c.add(pod("p0", 1, queue="a"))
    c.run(1)
    gpu = _agent_marks_pod_gpu(c, n, uuids, "default/p0")  # the agent marks the pod's GPU unhealthy (XID 79)
    c.add(pod("p1", 1, queue="a", created=3))
    c.run(2)
    assert int(c.pods["default/p1"]["metadata"]["annotations"]["gpupool.io/gpu-index"]) == 1 - gpu
    assert not evicted(c)  # not before heal_after_s
    c.run(6)
    assert evicted(c, "heal") == ["default/p0"]  # rescheduled: its controller makes a new pod
    c.add(pod("p2", 1, queue="a", created=20))
    c.run(2)
    assert c.pending() == ["default/p2"]  # the only healthy GPU is p1's; the failed one is never handed out
    # the agent clears the mark after a reset: the GPU is used again
    n3 = copy.deepcopy(n)
    n3["metadata"]["resourceVersion"] = "n1-v3"
    c.model.apply("nodes", "MODIFIED", n3)
    c.run(2)
    assert c.pending() == [] and c.model.state.gpu_healthy.all()


def test_dry_run_of_a_reclaim_is_the_same_whatever_the_hash_seed(tmp_path):
    """The same snapshot gives the same evictions in every process (no set or hash order in the decisions)."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE

    objs = [node("n1"), node("n2"), queue("x", quota=8), queue("y", quota=8)]
    for i in range(8):
        p = pod(f"x{i}", 2, queue="x")
        n = "n1" if i < 4 else "n2"
        p["spec"]["nodeName"] = n
        p["status"]["phase"] = "Running"
        g = 2 * (i % 4)
        p["metadata"]["annotations"] = {ANN_NODE: n, ANN_GPU_INDEX: f"{g},{g + 1}", ANN_GPU_MILLI: "1000"}
        objs.append(p)
    objs += [pod(f"y{i}", 2, queue="y", created=10**9) for i in range(4)]
    f = tmp_path / "snap.yaml"
    f.write_text(yaml.safe_dump_all(objs))
    code = ("import json, sys; from gpupool.k8s.snapshot import load_snapshot, plan; "
            "from gpupool.k8s.pool import live_config; "
            f"print(json.dumps(plan(load_snapshot({str(f)!r}), pool=live_config()).to_json(), sort_keys=True))")
    outs = []
    for seed in ("1", "2", "3"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.append(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                   check=True).stdout)
    assert outs[0] == outs[1] == outs[2]
    assert json.loads(outs[0])["summary"]["evictions"] == 4


def test_size_ranked_job_orders_in_the_live_scheduler_config(tmp_path):
    from gpupool.k8s.scheduler_cli import load_config

    f = tmp_path / "c.yaml"
    for order in ("gittins", "remaining"):
        f.write_text(f"pool:\n  jobOrder: {order}\n")
        cfg = load_config(f).pool_config()
        assert (cfg.order, cfg.promote_knob) == (order, 1.0)  # the simulator's gittins policy's knob
    f.write_text("pool:\n  jobOrder: tiresias\n")
    assert load_config(f).pool_config().promote_knob == 8.0


def test_run_time_limit_from_kueue_label_or_active_deadline():
    from gpupool.k8s.pool import run_time_limit

    p = pod("p", 1)
    assert run_time_limit(None, p) is None
    p["spec"]["activeDeadlineSeconds"] = 7200
    assert run_time_limit(None, p) == 7200.0
    p["metadata"]["labels"]["kueue.x-k8s.io/max-exec-time-seconds"] = "3600"
    assert run_time_limit(None, p) == 3600.0  # Kueue's label first
    group = pod_group("g", 2)
    group["metadata"]["labels"] = {"kueue.x-k8s.io/max-exec-time-seconds": "600"}
    assert run_time_limit(group, p) == 600.0  # the PodGroup's first
    for bad in ("1.5", "-3", "0", "soon", "1" + "0" * 13):
        p["metadata"]["labels"]["kueue.x-k8s.io/max-exec-time-seconds"] = bad
        assert run_time_limit(None, p) == 7200.0  # unreadable: the next source
    p["spec"]["activeDeadlineSeconds"] = True
    assert run_time_limit(None, p) is None


def test_live_remaining_order_starts_the_job_with_the_shorter_declared_limit_first():
    # one GPU, busy; two 1-GPU jobs wait: 'long' (limit 10 h) came first, 'short' (limit 10 min) later.
    # fifo starts 'long' when the GPU frees; remaining (expected remaining service first) starts 'short'
    started = {}
    for order in ("fifo", "remaining"):
        c = Cluster([node("n1", gpus=1)], order=order)
        c.add(pod("busy", 1, created=0.0))
        c.run(2)
        long_, short = pod("long", 1, created=10.0), pod("short", 1, created=20.0)
        long_["spec"]["activeDeadlineSeconds"] = 36000
        short["spec"]["activeDeadlineSeconds"] = 600
        c.add(long_, short)
        c.run(2)
        assert c.running() == ["default/busy"]
        c.finish("default/busy")
        c.run(2)
        started[order] = c.running()
    assert started == {"fifo": ["default/long"], "remaining": ["default/short"]}


def test_live_size_orders_learn_from_the_jobs_that_left_not_from_evictions():
    c = Cluster([node("n1", gpus=2)], order="gittins", promote_knob=1.0, thresholds=(60.0,), min_run_s=0.0,
                reclaim_min_run_s=0.0)
    c.add(pod("a", 1, created=0.0), pod("b", 1, created=1.0))
    c.run(100)
    sizes = c.driver.pool.sizes
    assert c.running() == ["default/a", "default/b"] and sizes is not None and sizes.n_seen == 0
    c.finish("default/a")  # a left after about 100 s on 1 GPU
    c.run(3)
    assert sizes.n_seen == 1 and 95.0 <= next(iter(sizes.seen.values()))[0] <= 105.0
    # b (level 1 after 60 GPU-s) is evicted for a newcomer at level 0 while the GPU a freed is taken: an
    # eviction is no departure, nothing is learned
    c.add(pod("c", 1, created=200.0), pod("d", 1, created=201.0))
    c.run(3)
    assert any(what.startswith("evicted") and key == "default/b" for _, what, key in c.log)
    assert sizes.n_seen == 1
    c.delete("default/c")  # its owner deleted it: it left too
    c.run(3)
    assert sizes.n_seen == 2


# ------------------------------------------------------------------ size-ranked orders, live (review findings)
def test_before_any_size_is_known_estimates_do_not_reorder_jobs():
    # a fresh scheduler, nothing learned: a declared limit must not put a job behind one that declares none
    # (the learned score of every job is 0 then); both arrive together on one idle GPU: FIFO decides
    for order in ("fifo", "remaining", "gittins"):
        c = Cluster([node("n1", gpus=1)], order=order, promote_knob=1.0)
        short, nolimit = pod("short", 1, created=10.0), pod("nolimit", 1, created=20.0)
        short["spec"]["activeDeadlineSeconds"] = 60
        c.add(short, nolimit)
        c.run(2)
        assert c.running() == ["default/short"], (order, c.running())


def test_learned_sizes_survive_a_driver_reset():
    c = Cluster([node("n1", gpus=2)], order="gittins", promote_knob=1.0, thresholds=(60.0,))
    c.add(pod("a", 1, created=0.0))
    c.run(100)
    c.finish("default/a")
    c.run(3)
    assert c.driver.pool.sizes.n_seen == 1
    c.model.apply("nodes", "ADDED", node("n2", gpus=2))  # the autoscaler adds a node: state rebuilt
    c.run(3)
    assert c.driver.stats["resets"] >= 2
    assert c.driver.pool.sizes.n_seen == 1, "learned sizes lost on reset"


def test_a_lapsed_nomination_is_no_departure():
    c = Cluster([node("n1", gpus=1)], [queue("a", quota=1)], order="gittins", promote_knob=1.0, min_run_s=0.0,
                reclaim_min_run_s=0.0)
    c.add(pod("lo", 1, queue="a", created=0.0))
    c.run(5)
    c.slow.add("default/lo")  # its kubelet never lets it go
    c.add(pod("hi", 1, queue="a", priority=50, created=5.0))
    c.run(90)
    assert c.driver.stats["lapsed"] >= 1
    assert c.driver.pool.sizes.n_seen == 0, c.driver.pool.sizes.seen


def test_waiting_job_estimate_follows_a_label_change():
    c = Cluster([node("n1", gpus=1)], order="remaining", promote_knob=1.0)
    c.add(pod("busy", 1, created=0.0))
    c.run(2)
    p = pod("w", 1, created=10.0)
    p["metadata"]["labels"]["kueue.x-k8s.io/max-exec-time-seconds"] = "36000"
    c.add(p)
    c.run(2)
    assert c.driver.jobs["default/w"].size_estimate == 36000.0
    c._update("default/w", lambda o: o["metadata"]["labels"].__setitem__("kueue.x-k8s.io/max-exec-time-seconds", "60"))
    c.run(2)
    assert c.driver.jobs["default/w"].size_estimate == 60.0


def test_a_reset_does_not_count_a_running_job_twice():
    c = Cluster([node("n1", gpus=2)], order="gittins", promote_knob=1.0, thresholds=(1e9,))
    c.add(pod("a", 1, created=0.0))
    c.run(100)
    c.pods["default/a"]["status"]["startTime"] = "2023-11-14T22:13:20Z"  # 1_700_000_000: when it started
    c.model.apply("nodes", "ADDED", node("n2", gpus=2))  # state rebuilt: a new PoolScheduler
    c.run(3)
    c.finish("default/a")
    c.run(2)
    assert next(iter(c.driver.pool.sizes.seen.values()))[0] <= 110.0


def test_a_gang_keeps_its_size_estimate_when_a_pod_finishes():
    c = Cluster([node("n1")], [queue("a", quota=8)], groups=[pod_group("el", 1)], order="remaining",
                promote_knob=1.0, reclaim_min_run_s=0, min_run_s=0)
    ps = [pod(f"el-{i}", 2, queue="a", group="el") for i in range(4)]
    for p in ps:
        p["spec"]["activeDeadlineSeconds"] = 1000
    c.add(*ps)
    c.run(1)
    assert c.driver.jobs["default/el"].size_estimate == 8000.0  # 1,000 s x 4 pods x 2 GPUs
    c.run(500)
    c.finish("default/el-3")
    c.run(1)
    j = c.driver.jobs["default/el"]
    assert j.size_estimate == 8000.0, j.size_estimate  # a finished pod does not shrink what the job has ahead


def _while_running(c, name: str, seconds: int, fn) -> list:
    """``fn(job)`` after every second of ``seconds`` in which job ``name`` runs in the scheduler."""
    out = []
    for _ in range(seconds):
        c.run(1)
        j = c.driver.jobs.get(name)
        if j is not None and j.status == "running":
            out.append(fn(j))
    return out


# ------------------------------------------------------------------ job books across reruns (second review)
def test_fifo_a_finished_pod_recreated_under_its_name_does_not_jump_the_queue():
    # default config (fifo): pod a ran and finished; later c waits, then a new pod is created under a's name
    c = Cluster([node("n1", gpus=1)])
    c.add(pod("a", 1, created=0.0))
    c.run(2)
    c.add(pod("b", 1, created=5.0))
    c.run(10)
    assert c.running() == ["default/a"]
    c.finish("default/a")
    c.run(2)
    assert c.running() == ["default/b"]
    c.delete("default/a")
    c.run(2)
    c.add(pod("c", 1, created=40.0))
    c.run(2)
    c.add(pod("a", 1, created=50.0))  # a new pod, same name (kubectl apply of the same manifest)
    c.run(2)
    c.finish("default/b")
    c.run(2)
    assert c.running() == ["default/c"], (c.running(), c.driver.info.get("default/a"))


def test_tiresias_a_finished_gang_resubmitted_under_its_podgroup_starts_afresh():
    c = Cluster([node("n1", gpus=2)], groups=[pod_group("g", 2)], order="tiresias", promote_knob=0,
                thresholds=(100.0,))
    c.add(pod("g-0", 1, group="g", created=0.0), pod("g-1", 1, group="g", created=0.0))
    c.run(300)
    c.finish("default/g-0")
    c.finish("default/g-1")
    c.run(2)
    c.delete("default/g-0")
    c.delete("default/g-1")
    c.run(2)
    c.add(pod("g-0", 1, group="g", created=320.0), pod("g-1", 1, group="g", created=320.0))
    c.run(2)
    job = c.driver.jobs["default/g"] if "default/g" in c.driver.jobs else c.driver.jobs.get("g")
    assert job is not None, list(c.driver.jobs)
    assert job.attained < 10.0, job.attained


def test_stale_run_since_after_a_reset_is_not_reused_by_a_later_run():
    c = Cluster([node("n1", gpus=2)], [queue("a", quota=2)], groups=[pod_group("g", 2)], order="tiresias",
                promote_knob=0, min_run_s=0.0, reclaim_min_run_s=0.0)
    c.add(pod("g-0", 1, queue="a", group="g", created=0.0), pod("g-1", 1, queue="a", group="g", created=0.0))
    c.run(100)
    assert c.running() == ["default/g-0", "default/g-1"]
    t0 = c.driver.jobs["default/g"].run_since
    # its pods are deleted (a drain) and a node is added before the next cycle: the reset finds g gone
    c.delete("default/g-0")
    c.delete("default/g-1")
    c.model.apply("nodes", "ADDED", node("n2", gpus=1))
    c.run(1000)
    c.add(pod("g-0b", 1, queue="a", group="g", created=1101.0), pod("g-1b", 1, queue="a", group="g", created=1101.0))
    c.run(2)
    c.slow.update({"default/g-0b", "default/g-1b"})
    c.add(pod("hi", 2, queue="a", priority=50, created=1103.0))
    seen = _while_running(c, "default/g", 90, lambda j: j.run_since)
    assert c.driver.stats["lapsed"] >= 1
    assert seen and min(seen) > t0 + 500, [s - t0 for s in seen]


def test_a_lapsed_eviction_does_not_count_the_run_twice():
    c = Cluster([node("n1", gpus=1)], [queue("a", quota=1)], order="tiresias", promote_knob=0, min_run_s=0.0,
                reclaim_min_run_s=0.0, thresholds=(1e9,))
    c.add(pod("lo", 1, queue="a", created=0.0))
    c.run(2)
    start = c.driver.jobs["default/lo"].run_since
    c.run(60)
    c.slow.add("default/lo")  # its kubelet never lets it go
    c.add(pod("hi", 1, queue="a", priority=50, created=62.0))
    # service beyond its one uninterrupted run
    over = _while_running(c, "default/lo", 90, lambda j: j.attained_at(c.now) - (c.now - start))
    assert c.driver.stats["lapsed"] >= 1
    assert over and max(over) <= 5.0, over[-3:]


def test_a_new_podgroup_under_an_evicted_gangs_name_starts_afresh():
    # gang g is evicted by gpupool; its owner is then deleted and a NEW job is submitted under the same name
    # (a new PodGroup object, a new uid): it must not inherit g's service and submission
    g1 = pod_group("g", 2)
    g1["metadata"]["uid"] = "pg-uid-1"
    c = Cluster([node("n1", gpus=2)], [queue("a", quota=2)], groups=[g1], order="tiresias", promote_knob=0,
                min_run_s=0.0, reclaim_min_run_s=0.0, thresholds=(100.0,))
    c.add(pod("g-0", 1, queue="a", group="g", created=0.0), pod("g-1", 1, queue="a", group="g", created=0.0))
    c.run(300)
    c.add(pod("hi", 2, queue="a", priority=50, created=300.0))
    c.run(3)
    assert c.running() == ["default/hi"]
    c.model.apply("podgroups", "DELETED", g1)  # kubectl delete pytorchjob g; kubectl apply a new one named g
    g2 = pod_group("g", 2)
    g2["metadata"]["uid"] = "pg-uid-2"
    c.add_group(g2)
    c.add(pod("g-0", 1, queue="a", group="g", created=400.0), pod("g-1", 1, queue="a", group="g", created=400.0))
    c.now += 97
    c.run(2)
    job = c.driver.jobs["default/g"]
    assert job.attained == 0.0 and job.submit_time >= c.now - 10 - 0 - 100, (job.attained, job.submit_time)


def test_a_victim_whose_eviction_lapsed_is_protected_from_an_immediate_second_pick():
    # lo's kubelet never lets it go: the nomination lapses, lo is counted again and, as its eviction failed,
    # protected for protect_s (the driver forgot its pods' job at the eviction: the protection must still find it)
    c = Cluster([node("n1", gpus=1)], [queue("a", quota=1)], min_run_s=0.0, reclaim_min_run_s=0.0)
    c.add(pod("lo", 1, queue="a", created=0.0))
    c.run(5)
    c.slow.add("default/lo")
    c.add(pod("hi", 1, queue="a", priority=50, created=5.0))
    for _ in range(120):
        c.run(1)
        if c.driver.stats["lapsed"]:
            break
    assert c.driver.stats["lapsed"] == 1
    info = c.driver.info.get("default/lo")
    assert info is not None and info.protected_until > c.now - 1.0


def test_a_gang_whose_launcher_outlives_its_workers_is_a_departure():
    # MPIJob: a 0-GPU launcher and two GPU workers; the workers complete while the launcher still runs (it
    # gathers results): the job's GPU service is done, so its size is learned then
    c = Cluster([node("n1", gpus=2)], [queue("a", quota=2)], groups=[pod_group("mpi", 3)], order="gittins",
                promote_knob=1.0, min_run_s=0.0, reclaim_min_run_s=0.0)
    c.add(pod("mpi-launcher", 0, queue="a", group="mpi"), pod("mpi-w0", 1, queue="a", group="mpi"),
          pod("mpi-w1", 1, queue="a", group="mpi"))
    c.run(100)
    assert len(c.running()) == 3, c.running()
    sizes = c.driver.pool.sizes
    c.finish("default/mpi-w0")
    c.finish("default/mpi-w1")
    c.run(3)
    assert "default/mpi-launcher" in c.running()
    assert sizes.n_seen == 1 and 190.0 <= next(iter(sizes.seen.values()))[0] <= 210.0, sizes.seen
    c.finish("default/mpi-launcher")
    c.run(3)
    assert sizes.n_seen == 1  # counted once


def test_a_cpu_only_pool_job_that_finishes_is_no_job_size():
    # a 0-GPU pod of this scheduler is a pool job; its service is no GPU job size (it taught gittins a size of 0)
    c = Cluster([node("n1", gpus=2)], order="gittins", promote_knob=1.0, min_run_s=0.0, reclaim_min_run_s=0.0)
    c.add(pod("cpu", 0), pod("g", 1))
    c.run(50)
    assert c.running() == ["default/cpu", "default/g"]
    c.finish("default/cpu")
    c.run(3)
    assert c.driver.pool.sizes.n_seen == 0, c.driver.pool.sizes.seen
    c.finish("default/g")
    c.run(3)
    assert c.driver.pool.sizes.n_seen == 1
