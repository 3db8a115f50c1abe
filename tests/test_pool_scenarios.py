"""Scenario tests of the pool scheduler, driven through the job simulator (Volcano/KAI style: a case
declares nodes, queues and jobs; the expected starts, ends and evictions are worked out by hand in the
comments). Simulator settings that would blur the arithmetic are off: no restart overhead, no topology
slowdown (every tier runs at full speed), checkpoint on eviction (a preempted job loses nothing).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import JOB_POLICIES, PoolConfig
from gpupool.model import NodeSpec
from gpupool.sim.jobs import JobSimConfig, JobSpec, run_jobs
from gpupool.topology import TopologyConfig

FLAT = TopologyConfig(factors={t: 1.0 for t in ("nvlink", "node", "switch", "spine")})


def nodes(n: int, gpus: int) -> list[NodeSpec]:
    """``n`` identical V100 nodes of ``gpus`` GPUs under one leaf switch."""
    return [NodeSpec(f"n{i}", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=gpus, gpu_model="V100M32",
                     nvlink_domain=f"n{i}", rack="r0", switch="leaf0") for i in range(n)]


def config(policy: str = "gpupool", **pool) -> JobSimConfig:
    base = JOB_POLICIES[policy][1]
    return JobSimConfig(policy=policy, pool=replace(base, **pool) if pool else None, restart_overhead_s=0.0,
                        topology=FLAT, checkpoint_on_preempt=True, sample_interval_s=0)


def run(cluster, jobs, policy="gpupool", queues=None, **pool):
    res = run_jobs(cluster, jobs, policy, seed=1, queues=queues, config=config(policy, **pool))
    return res, {j["job_id"]: j for j in res.jobs}


# ---------------------------------------------------------------------------------------------- gangs
# Two gangs on two 8-GPU nodes. (scheduler-plugins #114: placed pod by pod, each gang could hold one
# node and wait forever for the other.)
GANG_CASES = [
    # two 8-GPU gangs of two 4-GPU pods: both fit at once (one node each): both run 0..100
    ("8-GPU gangs", 8, 2, {"A": (0.0, 100.0), "B": (0.0, 100.0)}),
    # two 16-GPU gangs of two 8-GPU pods: each needs both nodes: A runs 0..100, then B 100..200
    ("16-GPU gangs", 16, 2, {"A": (0.0, 100.0), "B": (100.0, 200.0)}),
]


@pytest.mark.parametrize("policy", ["gpupool", "fifo", "round-robin"])
@pytest.mark.parametrize(("name", "gpus", "pods", "expected"), GANG_CASES, ids=[c[0] for c in GANG_CASES])
def test_gangs_never_deadlock(policy, name, gpus, pods, expected):
    jobs = [JobSpec("A", 0.0, 100.0, gpus, n_pods=pods), JobSpec("B", 0.0, 100.0, gpus, n_pods=pods)]
    res, by_id = run(nodes(2, 8), jobs, policy)
    assert res.metrics["deadlocks"] == 0
    assert res.metrics["finished_jobs"] == 2 and not res.unfinished
    for job_id, (start, end) in expected.items():
        assert by_id[job_id]["start"] == pytest.approx(start)
        assert by_id[job_id]["end"] == pytest.approx(end)
    if gpus == 8 and policy == "gpupool":
        # topology: each gang keeps both pods on one node
        assert len(set(by_id["A"]["nodes"])) == 1 and len(set(by_id["B"]["nodes"])) == 1


# ---------------------------------------------------------------------------------------- starvation
def starvation_jobs() -> list[JobSpec]:
    """3 nodes x 4 GPUs. At t=0, 12 one-GPU jobs fill the cluster; packing puts s0-s3 on n0 (end 100),
    s4-s7 on n1 (end 170), s8-s11 on n2 (end 130). At t=10 a gang G of 2 x 4 GPUs (100 s) arrives; from
    t=15 a one-GPU job (100 s) arrives every 10 s until t=995."""
    ends = [100.0] * 4 + [170.0] * 4 + [130.0] * 4
    jobs = [JobSpec(f"s{k}", 0.0, ends[k], 1) for k in range(12)]
    jobs.append(JobSpec("G", 10.0, 100.0, 8, n_pods=2))
    jobs += [JobSpec(f"t{k:03d}", 15.0 + 10 * k, 100.0, 1) for k in range(99)]
    return jobs


def test_starving_gang_gets_reservation_and_small_jobs_backfill_elsewhere():
    res, by_id = run(nodes(3, 4), starvation_jobs(), reserve_after_s=50.0)
    assert [by_id[f"s{k}"]["nodes"][0] for k in range(12)] == ["n0"] * 4 + ["n1"] * 4 + ["n2"] * 4
    # t=60: G has waited 50 s and gets a reservation: n0 and n1 (no node has a free GPU; ties go by node
    # order). t=100: n0 empties and, reserved, stays idle (9 small jobs wait). t=130: n2 empties; the
    # reserved gang goes first and may use any free node: n0 + n2. It ends at 230.
    assert by_id["G"]["start"] == pytest.approx(130.0)
    assert by_id["G"]["end"] == pytest.approx(230.0)
    assert sorted(set(by_id["G"]["nodes"])) == ["n0", "n2"]
    # no small job started on a reserved node while G waited
    assert [j["job_id"] for j in res.jobs if j["job_id"].startswith("t") and 60 <= j["start"] < 130] == []
    # t=170: n1 empties and the 4 oldest waiting small jobs (submitted at 15, 25, 35, 45) start there
    for k in range(4):
        assert by_id[f"t{k:03d}"]["start"] == pytest.approx(170.0)
        assert by_id[f"t{k:03d}"]["nodes"] == ["n1"]
    assert res.metrics["deadlocks"] == 0 and res.metrics["finished_jobs"] == 112


def test_without_reservation_the_gang_starves_until_the_stream_ends():
    _, by_id = run(nodes(3, 4), starvation_jobs(), reserve_after_s=None)
    # one-GPU jobs keep taking every GPU that frees up; two whole nodes are free only once arrivals stop
    assert by_id["G"]["start"] > 995.0


# ---------------------------------------------------------------------------------- reclaim to share
def two_queues(weight_a: float = 1.0, weight_b: float = 1.0) -> QueueTree:
    return QueueTree([QueueSpec(name="A", quota=4, weight=weight_a), QueueSpec(name="B", quota=4, weight=weight_b)])


RECLAIM_CASES = [
    # 16 GPUs, quotas 4 + 4; the 8 GPUs above quota are split by weight among queues with demand.
    # A borrows the whole cluster (16 one-GPU jobs of 10,000 s at t=0); B submits 8 one-GPU jobs of 1,000 s
    # at t=1,000 (A's jobs have run past the 600 s minimum runtime).
    # * weights 1:1 -> fair share A 4 + 4 = 8, B 4 + 4 = 8: B takes back 8 at once (not only its quota of
    #   4). At t=2,000 B's jobs end and A's 8 evicted jobs resume: 1,000 s done, 9,000 s more -> 11,000.
    ("equal weights", 1.0, 1.0, 8, [1000.0] * 8, [10_000.0] * 8 + [11_000.0] * 8),
    # * weights 3:1 -> A 4 + 6 = 10, B 4 + 2 = 6: B takes back 6 at t=1,000. At t=2,000 those 6 end: B's
    #   last 2 start (B, below its share, goes first) and 4 of A's 6 evicted jobs resume (end 11,000); the
    #   other 2 resume at t=3,000 when B is done (end 12,000).
    ("weights 3:1", 3.0, 1.0, 6, [1000.0] * 6 + [2000.0] * 2,
     [10_000.0] * 10 + [11_000.0] * 4 + [12_000.0] * 2),
]


@pytest.mark.parametrize(("name", "wa", "wb", "reclaimed", "b_starts", "a_ends"), RECLAIM_CASES,
                         ids=[c[0] for c in RECLAIM_CASES])
def test_reclaim_goes_up_to_fair_share_and_stops(name, wa, wb, reclaimed, b_starts, a_ends):
    jobs = [JobSpec(f"a{k:02d}", 0.0, 10_000.0, 1, queue="A") for k in range(16)]
    jobs += [JobSpec(f"b{k}", 1000.0, 1000.0, 1, queue="B") for k in range(8)]
    res, by_id = run(nodes(2, 8), jobs, queues=two_queues(wa, wb))
    assert sorted(by_id[f"b{k}"]["start"] for k in range(8)) == b_starts
    # exactly `reclaimed` evictions; A, then at its fair share, takes nothing back (no preemption loop)
    assert res.metrics["preemptions"] == reclaimed
    assert res.metrics["preemptions_by_action"] == {"reclaimed": reclaimed}
    assert sum(by_id[f"a{k:02d}"]["preemptions"] for k in range(16)) == reclaimed
    assert sorted(by_id[f"a{k:02d}"]["end"] for k in range(16)) == a_ends
    assert res.metrics["deadlocks"] == 0


def test_reclaim_to_quota_only_would_stop_at_four():
    """The KAI #1934 trap, for contrast: with no capacity above quota to share (the idle GPUs were all
    borrowed), a quota-only rule would give B 4. Fair share gives it 8 (previous test); here B's
    weight is tiny, so its fair share is its quota plus almost nothing: it takes 4."""
    jobs = [JobSpec(f"a{k:02d}", 0.0, 10_000.0, 1, queue="A") for k in range(16)]
    jobs += [JobSpec(f"b{k}", 1000.0, 1000.0, 1, queue="B") for k in range(8)]
    res, by_id = run(nodes(2, 8), jobs, queues=two_queues(1.0, 1e-6))
    assert sorted(by_id[f"b{k}"]["start"] for k in range(8)) == [1000.0] * 4 + [2000.0] * 4
    assert res.metrics["preemptions"] == 4


# ------------------------------------------------------------------------------ priority starvation
def priority_jobs(long_priority: int = 0) -> list[JobSpec]:
    """2 nodes x 4 GPUs. Queue lo fills n0 at t=0 (lo0-lo3) and n1 at t=1 (lo4-lo7) with one-GPU jobs;
    the short ones (lo2, lo3, lo6, lo7, 100 s) end by t=101, leaving lo at 4 GPUs = its quota, 2 on each
    node, in its long jobs (5,000 s; priority ``long_priority``). At t=1,000 queue hi asks for one pod
    of 4 GPUs, within its quota of 4."""
    jobs = []
    for k in range(8):
        long_ = k % 4 < 2
        jobs.append(JobSpec(f"lo{k}", 0.0 if k < 4 else 1.0, 5000.0 if long_ else 100.0, 1, queue="lo",
                            priority=long_priority if long_ else 0))
    jobs.append(JobSpec("hi", 1000.0, 1000.0, 4, queue="hi"))
    return jobs


def prio_queues(hi_priority: int) -> QueueTree:
    return QueueTree([QueueSpec(name="hi", quota=4, priority=hi_priority), QueueSpec(name="lo", quota=4)])


PRIORITY_CASES = [
    # hi outranks lo: it evicts lo's two long jobs on one node (in-quota preemptible work of a
    # lower-priority queue, KAI #2064); they restart at once on the other node's 2 free GPUs and lose
    # nothing. hi runs 1,000..2,000.
    ("higher priority reclaims in-quota work", 10, 0, 1000.0, 2),
    # same priority: lo is within its quota and its fair share, so nothing may be taken; hi waits until
    # lo0 and lo1 end at t=5,000 and free n0
    ("equal priority waits", 0, 0, 5000.0, 0),
    # lo's long jobs are non-preemptible (priority 100, in quota): never evicted; hi waits until t=5,000
    ("non-preemptible is never evicted", 10, 100, 5000.0, 0),
]


@pytest.mark.parametrize(("name", "hi_prio", "long_prio", "hi_start", "preempted"), PRIORITY_CASES,
                         ids=[c[0] for c in PRIORITY_CASES])
def test_lower_priority_in_quota_queue_cannot_starve_higher(name, hi_prio, long_prio, hi_start, preempted):
    res, by_id = run(nodes(2, 4), priority_jobs(long_prio), queues=prio_queues(hi_prio))
    assert [by_id[f"lo{k}"]["nodes"][0] for k in (2, 3, 6, 7)] == ["n0", "n0", "n1", "n1"]
    assert by_id["hi"]["start"] == pytest.approx(hi_start)
    assert by_id["hi"]["end"] == pytest.approx(hi_start + 1000.0)
    assert res.metrics["preemptions"] == preempted
    evicted = [f"lo{k}" for k in range(8) if by_id[f"lo{k}"]["preemptions"]]
    assert len(evicted) == preempted
    for job_id in evicted:  # restarted at once on the other node, no work lost
        assert by_id[job_id]["end"] == pytest.approx(by_id[job_id]["submit"] + 5000.0)
        assert set(by_id[job_id]["nodes"]) != set(by_id["hi"]["nodes"])
    assert res.metrics["finished_jobs"] == 9 and res.metrics["deadlocks"] == 0


@pytest.mark.parametrize(("policy", "hi_start"), [
    # fifo packs like gpupool: n0 holds lo0, lo1 (end 5,000): hi starts there at 5,000
    ("fifo", 5000.0),
    # round-robin alternates nodes: lo0, lo4 on n0 and lo1, lo5 on n1; a node is free only at 5,001
    ("round-robin", 5001.0),
])
def test_fifo_and_round_robin_never_preempt(policy, hi_start):
    res, by_id = run(nodes(2, 4), priority_jobs(), policy=policy, queues=prio_queues(10))
    assert res.metrics["preemptions"] == 0
    assert by_id["hi"]["start"] == pytest.approx(hi_start)


def test_pool_config_presets_are_as_documented():
    assert JOB_POLICIES["fifo"][1].backfill is False and JOB_POLICIES["fifo"][1].preempt is False
    assert JOB_POLICIES["round-robin"][0] == "round-robin"
    gp = JOB_POLICIES["gpupool"][1]
    assert gp == PoolConfig() and gp.order == "tiresias" and gp.reclaim and gp.backfill
