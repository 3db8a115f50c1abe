"""The job simulator: failures and checkpoints, energy, elastic resize, topology slowdown, metrics.

Expected values are worked out by hand in the comments; restart overhead is 0 unless a case says so.
"""

from __future__ import annotations

import math

import pytest

from gpupool.catalog import get_model
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.model import NodeSpec
from gpupool.sim.failures import FailureEvent
from gpupool.sim.jobs import JobSimConfig, JobSpec, default_queues, run_jobs
from gpupool.topology import TopologyConfig
from gpupool.traces import JobRecord

FLAT = TopologyConfig(factors={t: 1.0 for t in ("nvlink", "node", "switch", "spine")})
REQUIRED_KEYS = ("policy", "seed", "mean_jct_s", "p95_jct_s", "mean_queueing_delay_s", "makespan_s",
                 "gpu_utilization", "jain_fairness", "preemptions", "deadlocks", "energy_kwh", "events_per_second")


def nodes(n: int, gpus: int, switches: int = 1, model: str = "V100M32") -> list[NodeSpec]:
    per = max(1, n // switches)
    return [NodeSpec(f"n{i}", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=gpus, gpu_model=model,
                     nvlink_domain=f"n{i}", rack=f"r{i // per}", switch=f"leaf{i // per}") for i in range(n)]


def cfg(**kw) -> JobSimConfig:
    base = dict(restart_overhead_s=0.0, topology=FLAT, sample_interval_s=0)
    base.update(kw)
    return JobSimConfig(**base)


def by_id(res):
    return {j["job_id"]: j for j in res.jobs}


# -------------------------------------------------------------------------------------------- failures
def test_node_failure_restarts_the_job_from_its_last_checkpoint():
    # J (8 GPUs, 10,000 s) runs on n0 from t=0; n0 fails at t=2,500 (back at 6,100). Checkpoints every
    # 1,000 s of progress: it restarts from 2,000 on n1 at once, losing 500 s x 8 GPUs = 4,000 GPU-s;
    # 8,000 s remain: it ends at 10,500.
    events = (FailureEvent(2500.0, "node_fail", 0), FailureEvent(6100.0, "node_repair", 0),
              FailureEvent(100.0, "gpu_fail", 1, 3), FailureEvent(200.0, "gpu_repair", 1, 3))
    res = run_jobs(nodes(2, 8), [JobSpec("J", 0.0, 10_000.0, 8)], "gpupool",
                   config=cfg(checkpoint_interval_s=1000.0, failure_events=events))
    j = by_id(res)["J"]
    assert j["status"] == "finished" and j["failures"] == 1
    assert j["end"] == pytest.approx(10_500.0)
    assert j["nodes"] == ["n1"]
    assert res.metrics["lost_gpu_hours"] == pytest.approx(4000.0 / 3600.0)
    assert res.metrics["job_failures"] == 1 and res.metrics["failure_events"] == 4
    assert res.metrics["events_by_kind"] == {"arrival": 1, "start": 2, "fail": 1, "finish": 1}


def test_restart_overhead_and_no_checkpoints():
    # no checkpoints: the failure at 2,500 throws away everything; with 30 s restart overhead the job
    # runs again from 2,500 + 30 for the full 10,000 s: ends at 12,530
    events = (FailureEvent(2500.0, "node_fail", 0), FailureEvent(3000.0, "node_repair", 0))
    res = run_jobs(nodes(2, 8), [JobSpec("J", 0.0, 10_000.0, 8)], "gpupool",
                   config=cfg(checkpoint_interval_s=math.inf, failure_events=events, restart_overhead_s=30.0))
    assert by_id(res)["J"]["end"] == pytest.approx(12_530.0)
    assert res.metrics["lost_gpu_hours"] == pytest.approx(2500.0 * 8 / 3600.0)


@pytest.mark.parametrize("policy", ["gpupool", "fifo"])
def test_seeded_failures_lose_no_job(policy):
    # 40 jobs of 1-8 GPUs on 4 x 8 GPUs, node MTBF of 20 h and GPU MTBF of 200 h: many failures
    jobs = [JobSpec(f"j{k}", 600.0 * k, 3600.0 + 500 * (k % 7), (1, 2, 4, 8)[k % 4]) for k in range(40)]
    jobs.append(JobSpec("too-big", 10.0, 100.0, 64))  # can never fit 32 GPUs
    res = run_jobs(nodes(4, 8), jobs, policy,
                   config=cfg(node_mtbf_h=20.0, gpu_mtbf_h=200.0, repair_h=1.0, checkpoint_interval_s=600.0))
    m = res.metrics
    assert m["failure_events"] > 0 and m["job_failures"] > 0
    assert m["finished_jobs"] + m["unfinished_jobs"] == len(jobs)
    assert m["finished_jobs"] == 40
    assert [u["job_id"] for u in res.unfinished] == ["too-big"]
    assert "cluster can hold only" in res.unfinished[0]["reason"]
    assert m["deadlocks"] == 0
    # same seed, same run
    again = run_jobs(nodes(4, 8), jobs, policy,
                     config=cfg(node_mtbf_h=20.0, gpu_mtbf_h=200.0, repair_h=1.0, checkpoint_interval_s=600.0))
    assert again.metrics["mean_jct_s"] == m["mean_jct_s"] and again.metrics["lost_gpu_hours"] == m["lost_gpu_hours"]


# ---------------------------------------------------------------------------------------------- energy
def test_energy_counts_busy_and_idle_gpus():
    # one 8 x V100M32 node; one 1-GPU job for 3,600 s at utilization 1.0: that GPU draws peak power, the
    # other 7 idle power, for the whole makespan of 3,600 s
    v100 = get_model("V100M32")
    res = run_jobs(nodes(1, 8), [JobSpec("J", 0.0, 3600.0, 1)], "gpupool", config=cfg(gpu_utilization=1.0))
    expected = (v100.peak_w * 3600 + 7 * v100.idle_w * 3600) / 3.6e6
    assert res.metrics["energy_kwh"] == pytest.approx(expected)
    assert by_id(res)["J"]["energy_kwh"] == pytest.approx(v100.peak_w * 3600 / 3.6e6)
    assert res.metrics["gpu_utilization"] == pytest.approx(1 / 8)


def test_catalog_speed_trades_energy_against_time():
    # the same 1-GPU job of 3,600 s (measured on V100M32) on an L4 node vs a V100 node, gpu_speed=catalog:
    # slower (relative throughput ratio) but at lower power
    job = [JobSpec("J", 0.0, 3600.0, 1)]
    ref = "V100M32"
    fast = run_jobs(nodes(1, 8, model=ref), job, "gpupool", config=cfg(gpu_speed="catalog", reference_gpu=ref))
    slow = run_jobs(nodes(1, 8, model="L4"), job, "gpupool", config=cfg(gpu_speed="catalog", reference_gpu=ref))
    ratio = get_model("L4").relative_throughput / get_model(ref).relative_throughput
    assert slow.metrics["mean_jct_s"] == pytest.approx(3600.0 / ratio)
    assert fast.metrics["mean_jct_s"] == pytest.approx(3600.0)
    l4 = get_model("L4")
    assert by_id(slow)["J"]["energy_kwh"] == pytest.approx(l4.peak_w * 3600.0 / ratio / 3.6e6)


# --------------------------------------------------------------------------------------------- elastic
def test_elastic_job_grows_into_idle_gpus_and_shrinks_when_needed():
    # E: 2 pods of 1 GPU, elastic 1..4 pods, 1,000 s of work at 2 pods. Alone on 4 GPUs at t=0 it grows to
    # 4 pods: twice the speed. At t=100 (200 s of work done) B asks for 2 GPUs: E gives back its 2 extra
    # workers (no eviction) and B starts; E goes on at nominal speed: 800 s left, ends at 900.
    jobs = [JobSpec("E", 0.0, 1000.0, 2, n_pods=2, min_pods=1, max_pods=4), JobSpec("B", 100.0, 1000.0, 2)]
    res = run_jobs(nodes(1, 4), jobs, "gpupool", config=cfg())
    b = by_id(res)
    assert b["B"]["start"] == pytest.approx(100.0) and b["B"]["end"] == pytest.approx(1100.0)
    assert b["E"]["end"] == pytest.approx(900.0)
    assert b["E"]["preemptions"] == 0 and res.metrics["preemptions"] == 0
    assert res.metrics["events_by_kind"]["resize"] == 2


# -------------------------------------------------------------------------------------------- topology
@pytest.mark.parametrize(("switches", "gpus", "pods", "end"), [
    (1, 8, 1, 100.0),  # one pod on one NVLink node: full speed
    # two 8-GPU pods under one leaf switch: speed 1 - (1 - 0.75) x 15/16 = 0.765625 (ring all-reduce
    # scaling of the switch tier's factor, gpupool.topology): 100 / 0.765625
    (1, 16, 2, 100.0 / 0.765625),
    # the two nodes under different leaf switches (spine): 1 - 0.35 x 15/16 = 0.671875
    (2, 16, 2, 100.0 / 0.671875),
])
def test_topology_tier_slows_the_job(switches, gpus, pods, end):
    res = run_jobs(nodes(2, 8, switches=switches), [JobSpec("J", 0.0, 100.0, gpus, n_pods=pods)], "gpupool",
                   config=JobSimConfig(restart_overhead_s=0.0, sample_interval_s=0))
    assert by_id(res)["J"]["end"] == pytest.approx(end)


def test_gang_prefers_the_switch_that_holds_it():
    # 4 nodes, 2 per leaf switch; a 1-GPU job keeps n0 busy. A 16-GPU gang fits in leaf1 (n2 + n3)
    # but not in leaf0: it avoids crossing the spine
    jobs = [JobSpec("small", 0.0, 1000.0, 1), JobSpec("gang", 1.0, 100.0, 16, n_pods=2)]
    res = run_jobs(nodes(4, 8, switches=2), jobs, "gpupool", config=JobSimConfig(restart_overhead_s=0.0))
    g = by_id(res)["gang"]
    assert sorted(g["nodes"]) == ["n2", "n3"] and g["tier"] == "switch"


# --------------------------------------------------------------------------------------------- metrics
def test_result_has_the_documented_metrics_and_queues():
    recs = [JobRecord(f"j{k}", 100.0 * k, 500.0, 1 + (k % 2), "vc" + "ab"[k % 2], k + 2) for k in range(10)]
    res = run_jobs(nodes(2, 8), recs, "gpupool", config=JobSimConfig(sample_interval_s=200.0))
    doc = res.to_dict()
    for key in REQUIRED_KEYS:
        assert key in doc
    assert set(res.queues) == {"vca", "vcb"}
    assert res.metrics["events"] == 30 and res.metrics["events_per_second"] > 0
    assert 0 < res.metrics["gpu_utilization"] <= 1
    assert res.share_alloc.shape == (len(res.share_times), 2)


def test_default_queues_are_proportional_to_demand():
    recs = [JobRecord("a", 0.0, 300.0, 1, "x", 2), JobRecord("b", 0.0, 100.0, 1, "y", 3)]
    tree = default_queues(recs, 8)
    assert tree.names == ("x", "y")
    assert tree.quota_gpu.tolist() == [6.0, 2.0]  # floor(8 x 3/4), floor(8 x 1/4)
    single = default_queues([JobRecord("a", 0.0, 1.0, 1, "", 2)], 16)
    assert single.names == ("default",) and single.quota_gpu.tolist() == [16.0]


def test_unknown_queue_is_reported_not_dropped():
    tree = QueueTree([QueueSpec(name="only")])
    res = run_jobs(nodes(1, 8), [JobSpec("J", 0.0, 10.0, 1, queue="elsewhere")], "gpupool", queues=tree,
                   config=cfg())
    assert res.metrics["unfinished_jobs"] == 1 and "unknown queue" in res.unfinished[0]["reason"]


def test_unknown_policy_is_an_error():
    with pytest.raises(KeyError, match="unknown job policy"):
        run_jobs(nodes(1, 8), [JobSpec("J", 0.0, 10.0, 1)], "sjf")


@pytest.mark.parametrize(("b_gpus", "raw", "in_quota"), [
    # B (quota 4) waits 1,000 s behind A under FIFO, then runs 1,000 s: it wanted min(demand, 4) GPUs for
    # 2,000 s and got none for the first half
    (2, 0.5, 0.5),  # a 2-GPU job fits in B's quota: the wait counts against the guarantee
    (8, 0.5, 0.0),  # an 8-GPU job does not fit in a quota of 4: no guarantee was broken
])
def test_quota_deficit_counts_only_jobs_that_fit_the_quota(b_gpus, raw, in_quota):
    tree = QueueTree([QueueSpec(name="A", quota=4), QueueSpec(name="B", quota=4)])
    jobs = [JobSpec("a", 0.0, 1000.0, 8, queue="A"), JobSpec("b", 0.0, 1000.0, b_gpus, queue="B")]
    res = run_jobs(nodes(1, 8), jobs, "fifo", queues=tree, config=cfg())
    assert res.queues["B"]["quota_deficit_raw"] == pytest.approx(raw)
    assert res.queues["B"]["quota_deficit"] == pytest.approx(in_quota)
    assert res.queues["A"]["quota_deficit"] == 0.0
    # the in-quota shortfall lasted the whole first 1,000 s of the 2,000 s run, or never happened
    assert res.queues["B"]["quota_shortfall_longest_s"] == pytest.approx(2000.0 * in_quota)
    assert res.queues["B"]["quota_shortfall_time_share"] == pytest.approx(in_quota)
    assert res.metrics["longest_quota_shortfall_s"] == pytest.approx(2000.0 * in_quota)


def test_lowest_power_policy_uses_the_frugal_model_and_pays_in_time():
    # one V100 node (300 W peak) and one L4 node (72 W); one 1-GPU job of 3,600 s measured on the V100;
    # gpu_speed=catalog: on the L4 it runs at the L4/V100 throughput ratio
    mixed = nodes(1, 8, model="V100M32") + [NodeSpec("l4", 64000, 512 * 1024, 8, "L4", nvlink_domain="", rack="r1",
                                                     switch="leaf1")]
    job = [JobSpec("J", 0.0, 3600.0, 1)]
    config = cfg(gpu_speed="catalog", reference_gpu="V100M32")
    frugal = run_jobs(mixed, job, "lowest-power", config=config)
    assert by_id(frugal)["J"]["nodes"] == ["l4"]
    ratio = get_model("L4").relative_throughput / get_model("V100M32").relative_throughput
    assert frugal.metrics["mean_jct_s"] == pytest.approx(3600.0 / ratio)


def test_a_very_long_job_keeps_a_bounded_number_of_queue_samples():
    # 1e10 s of hourly samples would be 2.8 million; the period doubles every 20,000 samples
    res = run_jobs(nodes(1, 8), [JobSpec("short", 0.0, 100.0, 1), JobSpec("long", 5.0, 1e10, 1)], "gpupool",
                   config=cfg(sample_interval_s=3600.0))
    assert res.metrics["finished_jobs"] == 2
    assert len(res.share_times) < 20_000 * 10


def test_a_required_gang_waiting_for_failed_hardware_is_no_deadlock():
    """n0, n1 under leaf0 and n2 under leaf1 (8 GPUs each). n1 is down from 0 to 1,000 s. G (2 pods x 8
    GPUs, topology required) arrives at 10: two nodes have room, but not under one switch. It waits for
    the repair, which is not a scheduler deadlock, and runs 1,000..1,100."""
    cluster = [NodeSpec(f"n{i}", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=8, gpu_model="V100M32",
                        nvlink_domain=f"n{i}", rack=f"r{i}", switch="leaf0" if i < 2 else "leaf1") for i in range(3)]
    events = (FailureEvent(0.0, "node_fail", 1), FailureEvent(1000.0, "node_repair", 1))
    res = run_jobs(cluster, [JobSpec("G", 10.0, 100.0, 16, n_pods=2, topology="required")], "gpupool",
                   config=cfg(failure_events=events))
    assert res.metrics["deadlocks"] == 0
    assert by_id(res)["G"]["start"] == pytest.approx(1000.0)
