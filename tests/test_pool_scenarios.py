"""Scenario tests of the pool scheduler, driven through the job simulator (Volcano/KAI style: a case
declares nodes, queues and jobs; the expected starts, ends and evictions are worked out by hand in the
comments). Simulator settings that would blur the arithmetic are off: no restart overhead, no topology
slowdown (every tier runs at full speed), checkpoint on eviction (a preempted job loses nothing).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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


# ------------------------------------------------------------------------------- reclaim in a queue tree
# The fair-share rule at every level (KAI's queue hierarchy, Kueue's cohorts): a leaf below its share reclaims
# from a leaf above its own, the two compared where their paths meet (the sibling subtrees under their lowest
# common ancestor); the reclaimer ends within its share there, the victim's subtree is not pushed below its own.
def _starts(res) -> dict[str, float]:
    return {j["job_id"]: j["start"] for j in res.jobs}


@pytest.mark.parametrize("limit", [None, 4.0])
@pytest.mark.parametrize(("submit", "start"), [(1000.0, 1000.0), (300.0, 600.0)])
def test_sibling_under_quota_reclaims_from_a_borrowing_sibling(submit, start, limit):
    """Kueue #5289: a and b (quota 2 each) under ab (quota 4, optionally limit 4), one 4-GPU node. a runs two 2-GPU
    jobs from t=0, borrowing b's quota; b asks for 2 GPUs: its own quota, so one of a's jobs is reclaimed and b
    starts at once, or, when a's jobs are younger than the reclaim minimum runtime (600 s), as soon as they pass
    it. Before, b waited for a's jobs to end (t=10,000): its parent ab, at its share, counted b's job as growth
    (and, with the limit, ab's CPU scaled down with its GPUs cut a's and b's fair shares to 1.33 GPUs each)."""
    queues = QueueTree([QueueSpec(name="ab", quota=4, limit=limit), QueueSpec(name="a", parent="ab", quota=2),
                        QueueSpec(name="b", parent="ab", quota=2)])
    jobs = [JobSpec(f"a{k}", 0.0, 10_000.0, 2, queue="a") for k in range(2)]
    jobs.append(JobSpec("b0", submit, 1000.0, 2, queue="b"))
    res, by_id = run(nodes(1, 4), jobs, queues=queues)
    assert by_id["b0"]["start"] == pytest.approx(start)
    assert res.metrics["preemptions_by_action"].get("reclaimed") == 1
    assert res.metrics["deadlocks"] == 0 and res.metrics["finished_jobs"] == 3


def test_reclaim_three_levels_deep_meets_at_each_common_ancestor():
    """org (8) > d1 (4) > {a (2), b (2)} and org > d2 (4) > c (4); 2 nodes x 4 GPUs. a borrows the whole cluster
    (four 2-GPU jobs). At t=1,000 b asks for 2 GPUs and c for 2 x 2: b meets a under d1 (a holds 8, its share
    with b's demand is 2), c meets a under org (d2 below its share 4, d1 above it). Three of a's jobs are
    reclaimed; b and c start at once; a keeps one job (its share)."""
    queues = QueueTree([QueueSpec(name="org", quota=8),
                        QueueSpec(name="d1", parent="org", quota=4), QueueSpec(name="d2", parent="org", quota=4),
                        QueueSpec(name="a", parent="d1", quota=2), QueueSpec(name="b", parent="d1", quota=2),
                        QueueSpec(name="c", parent="d2", quota=4)])
    jobs = [JobSpec(f"a{k}", 0.0, 10_000.0, 2, queue="a") for k in range(4)]
    jobs += [JobSpec("b0", 1000.0, 1000.0, 2, queue="b")] + [JobSpec(f"c{k}", 1000.0, 1000.0, 2, queue="c")
                                                              for k in range(2)]
    res, by_id = run(nodes(2, 4), jobs, queues=queues, order="fifo")
    assert [_starts(res)[k] for k in ("b0", "c0", "c1")] == [1000.0] * 3
    assert res.metrics["preemptions_by_action"] == {"reclaimed": 3}
    assert sum(by_id[f"a{k}"]["preemptions"] for k in range(4)) == 3


def test_reclaim_under_a_parent_over_its_quota_and_from_it():
    """ab (quota 2) > {a (1), b (1)} and c (quota 2); one 4-GPU node. a runs four one-GPU jobs: ab borrows c's
    idle quota. At t=1,000 b asks for 2: ab is over its quota but, c idle, its share is 4, split 2 + 2 under it:
    b reclaims 2 of a's jobs. At t=2,000 c asks for 2: ab's share falls to 2 (1 + 1): c reclaims 2 from ab's
    subtree, one each from a and b, neither pushed below its share of 1 (never two from one of them)."""
    queues = QueueTree([QueueSpec(name="ab", quota=2), QueueSpec(name="a", parent="ab", quota=1),
                        QueueSpec(name="b", parent="ab", quota=1), QueueSpec(name="c", quota=2)])
    jobs = [JobSpec(f"a{k}", 0.0, 10_000.0, 1, queue="a") for k in range(4)]
    jobs += [JobSpec(f"b{k}", 1000.0, 5000.0, 1, queue="b") for k in range(2)]
    jobs += [JobSpec(f"c{k}", 2000.0, 1000.0, 1, queue="c") for k in range(2)]
    res, by_id = run(nodes(1, 4), jobs, queues=queues, order="fifo")
    starts = _starts(res)
    assert [starts[k] for k in ("b0", "b1", "c0", "c1")] == [1000.0, 1000.0, 2000.0, 2000.0]
    assert res.metrics["preemptions_by_action"] == {"reclaimed": 4}
    assert sum(by_id[f"a{k}"]["preemptions"] for k in range(4)) == 3
    assert sum(by_id[f"b{k}"]["preemptions"] for k in range(2)) == 1


def test_no_reclaim_from_a_queue_within_its_share_in_a_tree():
    """d1 (quota 2) > a (2) and d2 (quota 2) > {b (1), c (1)}; one 4-GPU node. a holds 2 (its share), b holds 2
    (borrowing c's quota). At t=1,000 c asks for two one-GPU jobs: c's share is 1, so it takes one back from its
    sibling b, and never from a (within its share: where c's and a's paths meet, d1 holds its share); c's second
    job waits for the first (t=2,000)."""
    queues = QueueTree([QueueSpec(name="d1", quota=2), QueueSpec(name="a", parent="d1", quota=2),
                        QueueSpec(name="d2", quota=2), QueueSpec(name="b", parent="d2", quota=1),
                        QueueSpec(name="c", parent="d2", quota=1)])
    jobs = [JobSpec(f"{q}{k}", 0.0, 10_000.0, 1, queue=q) for q in "ab" for k in range(2)]
    jobs += [JobSpec(f"c{k}", 1000.0, 1000.0, 1, queue="c") for k in range(2)]
    res, by_id = run(nodes(1, 4), jobs, queues=queues, order="fifo")
    assert [_starts(res)[k] for k in ("c0", "c1")] == [1000.0, 2000.0]
    assert res.metrics["preemptions"] == 1
    assert [by_id[k]["preemptions"] for k in ("a0", "a1")] == [0, 0]
    assert sum(by_id[f"b{k}"]["preemptions"] for k in range(2)) == 1


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
    ("higher priority reclaims in-quota work", 10, 0, 1000.0, 2, "reclaimed", True),
    # same priority: lo is within its quota and its fair share, so nothing may be taken from it; but the
    # 4 free GPUs are split 2 + 2, so consolidation moves lo's two long jobs of one node to the other
    # node (lo keeps its 4 GPUs): hi gets its quota at once, 1,000..2,000
    ("equal priority: lo's jobs move", 0, 0, 1000.0, 2, "consolidated", True),
    # with consolidation off, hi waits until lo0 and lo1 end at t=5,000 and free n0
    ("equal priority, no consolidation, waits", 0, 0, 5000.0, 0, "", False),
    # lo's long jobs are non-preemptible (priority 100, in quota): never evicted nor moved; hi waits
    # until t=5,000
    ("non-preemptible is never evicted", 10, 100, 5000.0, 0, "", True),
]


@pytest.mark.parametrize(("name", "hi_prio", "long_prio", "hi_start", "preempted", "action", "consolidate"),
                         PRIORITY_CASES, ids=[c[0] for c in PRIORITY_CASES])
def test_lower_priority_in_quota_queue_cannot_starve_higher(name, hi_prio, long_prio, hi_start, preempted,
                                                            action, consolidate):
    res, by_id = run(nodes(2, 4), priority_jobs(long_prio), queues=prio_queues(hi_prio), consolidate=consolidate)
    assert [by_id[f"lo{k}"]["nodes"][0] for k in (2, 3, 6, 7)] == ["n0", "n0", "n1", "n1"]
    assert by_id["hi"]["start"] == pytest.approx(hi_start)
    assert by_id["hi"]["end"] == pytest.approx(hi_start + 1000.0)
    assert res.metrics["preemptions"] == preempted
    assert res.metrics["preemptions_by_action"] == ({action: preempted} if preempted else {})
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


# ------------------------------------------------------------------------------------ consolidation
@pytest.mark.parametrize(("arrive", "start"), [
    # 2 nodes x 8 GPUs, one FIFO queue (no Tiresias levels: d may not preempt b or c). a, b (4 GPUs
    # each) pack n0, c (4 GPUs) goes to n1; a ends at 100:
    # 4 free GPUs on each node. d asks for one 8-GPU pod: free GPUs enough, no node can hold it.
    # At 1,000 b and c have run past the 600 s minimum runtime: one of them moves next to the other
    # (restarting from its eviction checkpoint, no overhead here) and d starts at once.
    (1000.0, 1000.0),
    # at 300 they have not: d waits for the minimum runtime to pass (a wake-up at 600), then they move
    (300.0, 600.0),
])
def test_consolidation_moves_a_job_to_free_a_whole_node(arrive, start):
    jobs = [JobSpec("a", 0.0, 100.0, 4), JobSpec("b", 0.0, 10_000.0, 4), JobSpec("c", 0.0, 10_000.0, 4),
            JobSpec("d", arrive, 1000.0, 8)]
    res, by_id = run(nodes(2, 8), jobs, order="fifo")
    assert by_id["d"]["start"] == pytest.approx(start)
    assert by_id["d"]["nodes"] == ["n0"]
    # b moved from n0 to n1, next to c, lost nothing and was evicted once, by consolidation
    assert res.metrics["preemptions_by_action"] == {"consolidated": 1}
    assert [by_id[k]["preemptions"] for k in "abc"] == [0, 1, 0]
    assert by_id["b"]["nodes"] == ["n1"] and by_id["c"]["nodes"] == ["n1"]
    assert by_id["b"]["end"] == pytest.approx(10_000.0) and by_id["c"]["end"] == pytest.approx(10_000.0)
    _, off = run(nodes(2, 8), jobs, order="fifo", consolidate=False)
    assert off["b"]["nodes"] == ["n0"] and off["c"]["nodes"] == ["n1"]
    assert off["d"]["start"] == pytest.approx(10_000.0)  # without it, d waits for b or c to end


def test_consolidation_is_all_or_nothing():
    """3 nodes x 4 GPUs: p (3 GPUs) on n0, q (3) on n1, r (2) on n2: 1 + 1 + 2 GPUs free. d (4 GPUs)
    could have n2 if r moved, but r's 2 GPUs fit on no other node: the trial move is undone, nothing moves,
    d waits for r (5,000). One FIFO queue, so that d may not preempt by Tiresias level."""
    jobs = [JobSpec("p", 0.0, 10_000.0, 3), JobSpec("q", 0.0, 10_000.0, 3), JobSpec("r", 0.0, 5000.0, 2),
            JobSpec("d", 1000.0, 100.0, 4)]
    res, by_id = run(nodes(3, 4), jobs, order="fifo")
    assert [by_id[k]["nodes"] for k in "pqr"] == [["n0"], ["n1"], ["n2"]]
    assert res.metrics["preemptions"] == 0
    stats = res.metrics["scheduler_stats"]
    assert stats["consolidation_attempts"] >= 1 and stats["moved_jobs"] == 0
    assert by_id["r"]["end"] == pytest.approx(5000.0)
    assert by_id["d"]["start"] == pytest.approx(5000.0) and by_id["d"]["nodes"] == ["n2"]


def test_reservation_of_a_borrowing_gang_does_not_hold_back_another_queues_quota():
    """2 nodes x 4 GPUs; quotas A 2, B 6. At t=0 B runs b0-b5 (one GPU each; b0 ends at 100, the rest at
    1,000): B at its quota. At t=1 A's gang G (2 pods x 4 GPUs) arrives: it needs the whole cluster, far
    above A's quota of 2, and gets a reservation of both nodes at t=51. At t=200 B asks for b6 (one
    GPU): B holds 5 of its 6 GPUs of quota, so b6 is in-quota work and starts at once on a reserved node
    (the guarantee comes before A's borrowing); G starts when b6 ends, at 1,200. Were G in quota, the
    reservation would hold (see the starvation test above)."""
    queues = QueueTree([QueueSpec(name="A", quota=2), QueueSpec(name="B", quota=6)])
    jobs = [JobSpec(f"b{k}", 0.0, 100.0 if k == 0 else 1000.0, 1, queue="B") for k in range(6)]
    jobs += [JobSpec("G", 1.0, 500.0, 8, n_pods=2, queue="A"), JobSpec("b6", 200.0, 1000.0, 1, queue="B")]
    res, by_id = run(nodes(2, 4), jobs, queues=queues, reserve_after_s=50.0)
    assert res.metrics["scheduler_stats"]["reservations"] == 1
    assert by_id["b6"]["start"] == pytest.approx(200.0)
    assert by_id["G"]["start"] == pytest.approx(1200.0) and by_id["G"]["end"] == pytest.approx(1700.0)
    assert res.metrics["preemptions"] == 0 and res.metrics["deadlocks"] == 0


def test_reclaim_moves_in_share_jobs_when_evictions_alone_cannot_free_a_node():
    """2 nodes x 8 GPUs; quotas A 8, B 0, C 8. At t=0 c1 and b1 (4 GPUs each) fill n0, c2 (4 GPUs) goes
    to n1: C holds its quota, B borrows 4, 4 GPUs are free on n1. At t=1,000 A asks for one 8-GPU pod,
    within its quota. Evicting B's b1 (the only job above its fair share) leaves 4 + 4 free GPUs on two
    nodes; so the reclaim also moves C's c1 to n1 (C keeps its 8 GPUs) and a starts on n0 at once.
    b1 resumes when a ends at 2,000 (1,000 s done, 9,000 s to go: ends at 11,000)."""
    queues = QueueTree([QueueSpec(name="A", quota=8), QueueSpec(name="B", quota=0), QueueSpec(name="C", quota=8)])
    jobs = [JobSpec("c1", 0.0, 10_000.0, 4, queue="C"), JobSpec("b1", 0.0, 10_000.0, 4, queue="B"),
            JobSpec("c2", 0.0, 10_000.0, 4, queue="C"), JobSpec("a", 1000.0, 1000.0, 8, queue="A")]
    res, by_id = run(nodes(2, 8), jobs, queues=queues)
    assert by_id["a"]["start"] == pytest.approx(1000.0) and by_id["a"]["nodes"] == ["n0"]
    assert res.metrics["preemptions_by_action"] == {"reclaimed": 1, "consolidated": 1}
    assert [by_id[k]["preemptions"] for k in ("c1", "b1", "c2")] == [1, 1, 0]
    assert by_id["c1"]["nodes"] == ["n1"] and by_id["c1"]["end"] == pytest.approx(10_000.0)
    assert by_id["b1"]["end"] == pytest.approx(11_000.0)
    _, off = run(nodes(2, 8), jobs, queues=queues, consolidate=False)
    assert off["a"]["start"] == pytest.approx(10_000.0)  # evictions alone cannot: a waits for n0 to empty


def test_quota_metrics_count_gpus_held_for_the_queues_own_reserved_gang():
    """2 nodes x 4 GPUs, one queue (quota 8). s0-s3 (one GPU) end at 100 on n0, s4-s7 at 200 on n1. The
    gang G (2 x 4 GPUs) arrives at 10 and has both nodes reserved at 60. n0 drains at 100 and its 4 GPUs
    stay idle for G; t0 (one GPU, at 120) may not take them. So from 100 to 200 the queue holds 4 GPUs
    and 4 more are set aside for its own gang: a raw shortfall of 4 GPUs x 100 s, but no in-quota
    shortfall. G runs 200..300, then t0 300..400."""
    jobs = [JobSpec(f"s{k}", 0.0, 100.0 if k < 4 else 200.0, 1) for k in range(8)]
    jobs += [JobSpec("G", 10.0, 100.0, 8, n_pods=2), JobSpec("t0", 120.0, 100.0, 1)]
    res, by_id = run(nodes(2, 4), jobs, reserve_after_s=50.0)
    assert by_id["G"]["start"] == pytest.approx(200.0) and by_id["t0"]["start"] == pytest.approx(300.0)
    q = res.queues["default"]
    # want = min(demand, quota): 8 GPUs from 0 to 300, then t0's 1 GPU to 400 -> 2,500 GPU-s
    assert q["quota_deficit_raw"] == pytest.approx(4 * 100.0 / 2500.0)
    assert q["quota_deficit"] == 0.0
    assert q["quota_shortfall_longest_s"] == 0.0 and q["quota_shortfall_time_share"] == 0.0


def test_reclaim_looks_past_waiting_jobs_too_big_for_the_share():
    """2 nodes x 8 GPUs; quotas A 8, B 8. B borrows the whole cluster (16 one-GPU jobs) at t=0. At t=1,000
    A submits five 16-GPU gangs (above A's fair share of 8: they may not reclaim) and then one one-GPU
    job. The small job, behind them in A's order, still takes one GPU back from B at once."""
    jobs = [JobSpec(f"b{k:02d}", 0.0, 10_000.0, 1, queue="B") for k in range(16)]
    jobs += [JobSpec(f"big{k}", 1000.0, 100.0, 16, n_pods=2, queue="A") for k in range(5)]
    jobs.append(JobSpec("small", 1000.0, 100.0, 1, queue="A"))
    res, by_id = run(nodes(2, 8), jobs, queues=two_queues())
    assert by_id["small"]["start"] == pytest.approx(1000.0)
    assert res.metrics["preemptions_by_action"].get("reclaimed", 0) >= 1


@pytest.mark.parametrize("seed", range(0, 30, 3))
def test_books_balance_when_a_job_starts_and_is_evicted_in_one_cycle(seed):
    """With no minimum runtime a job may start and be evicted (or moved) in the same cycle. Random small
    workloads on 2 x 4 GPUs: every job finishes, and each queue's GPU-time as the quota meter saw it
    equals the GPU-time its jobs ran (a job counted as evicted but never started broke this)."""
    rng = np.random.default_rng(seed)
    queues = QueueTree([QueueSpec(name="A", quota=4), QueueSpec(name="B", quota=2), QueueSpec(name="C", quota=2)])
    jobs = [JobSpec(f"j{k}", float(rng.integers(0, 2000)), float(rng.integers(50, 3000)),
                    int(rng.choice([1, 2, 4, 8])), queue=str(rng.choice(["A", "B", "C"]))) for k in range(40)]
    res, _ = run(nodes(2, 4), jobs, queues=queues, min_run_s=0.0, reclaim_min_run_s=0.0)
    assert res.metrics["finished_jobs"] == 40
    makespan = res.metrics["makespan_s"]
    for q in res.queues.values():
        assert q["mean_gpus"] * makespan / 3600.0 == pytest.approx(q["gpu_hours"], rel=1e-9, abs=1e-9)
        assert 0.0 <= q["quota_deficit"] <= q["quota_deficit_raw"] <= 1.0


def test_reclaim_evicts_elsewhere_to_make_room_for_a_moved_job():
    """3 nodes x 8 GPUs; quotas A 8, B 0, C 16. n0 holds c1 + b1, n1 holds c2 + b2 (4 GPUs each), n2
    holds c3 (8 GPUs): C at its quota, B borrows 8, nothing free. At t=1,000 A asks for one 8-GPU pod
    (in quota). Evicting B's job on a node leaves C's job there; it can move only into the room that
    evicting B's other job makes. So both of B's jobs are reclaimed (B's fair share is 0), one of C's
    jobs moves next to the other, and a starts at once. B's jobs resume when a ends (2,000)."""
    queues = QueueTree([QueueSpec(name="A", quota=8), QueueSpec(name="B", quota=0), QueueSpec(name="C", quota=16)])
    jobs = [JobSpec("c1", 0.0, 10_000.0, 4, queue="C"), JobSpec("b1", 0.0, 10_000.0, 4, queue="B"),
            JobSpec("c2", 1.0, 10_000.0, 4, queue="C"), JobSpec("b2", 1.0, 10_000.0, 4, queue="B"),
            JobSpec("c3", 2.0, 10_000.0, 8, queue="C"), JobSpec("a", 1000.0, 1000.0, 8, queue="A")]
    _, off = run(nodes(3, 8), jobs, queues=queues, consolidate=False)
    assert [off[k]["nodes"] for k in ("c1", "b1", "c2", "b2", "c3")] == [["n0"], ["n0"], ["n1"], ["n1"], ["n2"]]
    assert off["a"]["start"] == pytest.approx(10_000.0)
    res, by_id = run(nodes(3, 8), jobs, queues=queues)
    assert by_id["a"]["start"] == pytest.approx(1000.0)
    assert res.metrics["preemptions_by_action"] == {"reclaimed": 2, "consolidated": 1}
    moved = [k for k in ("c1", "c2") if by_id[k]["preemptions"]]
    assert len(moved) == 1 and by_id["c1"]["nodes"] == by_id["c2"]["nodes"]
    assert by_id["a"]["nodes"] != by_id["c1"]["nodes"] and by_id["a"]["nodes"] != ["n2"]
    assert by_id["b1"]["end"] == pytest.approx(11_000.0) and by_id["b2"]["end"] == pytest.approx(11_001.0)
    assert by_id["c1"]["end"] == pytest.approx(10_000.0) and by_id["c2"]["end"] == pytest.approx(10_001.0)


def test_elastic_gang_with_required_topology_starts_at_its_minimum():
    """An elastic job of 4 pods x 6 GPUs (at least 2) with required topology on 2 x 8 GPUs: its one
    switch holds 2 such pods, not 4. It starts at once with 2 pods (half speed: ends at 200), instead of
    waiting forever for a scope that could hold all 4 (reported as a deadlock before)."""
    job = JobSpec("E", 0.0, 100.0, 24, n_pods=4, min_pods=2, max_pods=4, topology="required")
    res, by_id = run(nodes(2, 8), [job])
    assert res.metrics["deadlocks"] == 0 and res.metrics["finished_jobs"] == 1
    assert by_id["E"]["start"] == pytest.approx(0.0) and by_id["E"]["end"] == pytest.approx(200.0)
    assert sorted(by_id["E"]["nodes"]) == ["n0", "n1"]


def test_non_preemptible_elastic_job_that_shrinks_and_grows_keeps_its_quota_books():
    """2 nodes x 8 GPUs; quotas A 8, B 8. E (queue A, non-preemptible, 4 pods x 2 GPUs, at least 2) runs
    on n0 from 0. At 10, B's b (3 pods x 4 GPUs) needs 4 GPUs on n0: E gives back its 2 extra workers
    (half speed) until b ends at 110, then grows back: 10 + 100 x 0.5 + 940 = 1,000 s of work, ends at
    1,050. At 3,000 F (queue A, non-preemptible, 8 GPUs) must find A's non-preemptible books empty: it
    starts at once (the shrink and the growth were not counted, which left F waiting for ever)."""
    queues = QueueTree([QueueSpec(name="A", quota=8), QueueSpec(name="B", quota=8)])
    jobs = [JobSpec("E", 0.0, 1000.0, 8, queue="A", n_pods=4, min_pods=2, max_pods=4, priority=100),
            JobSpec("b", 10.0, 100.0, 12, queue="B", n_pods=3),
            JobSpec("F", 3000.0, 100.0, 8, queue="A", n_pods=1, priority=100)]
    res, by_id = run(nodes(2, 8), jobs, queues=queues)
    assert by_id["b"]["start"] == pytest.approx(10.0)
    assert by_id["E"]["end"] == pytest.approx(1050.0)
    assert by_id["F"]["start"] == pytest.approx(3000.0)
    assert res.metrics["deadlocks"] == 0 and res.metrics["finished_jobs"] == 3


@pytest.mark.parametrize("seed", [*range(12), 120, 155, 158])  # 120, 155, 158: the worker alone (pods left)
def test_reclaim_with_moves_never_releases_an_elastic_worker_twice(seed):
    """Reclaim with moves (``_make_room``) may choose an elastic job's extra worker and, on the same node, the
    whole job: the job goes (its workers with it) and each pod is released once; a worker chosen alone is
    given up by a shrink. Before, the worker was released twice (AllocationError "pod ... is not placed") in
    about one random run in ten, and a worker chosen alone evicted its whole job from the books while its
    other pods stayed on their GPUs for good."""
    import random

    rng = random.Random(seed)
    nodes = [NodeSpec(f"n{i}", cpu_milli=64_000, memory_mib=512 * 1024, gpu_count=rng.choice([4, 8, 8]),
                      gpu_model="A100", rack=f"r{i // 3}", switch=f"leaf{i // 4}") for i in range(rng.randint(4, 8))]
    tree = QueueTree([QueueSpec(name="a", quota=0.0), QueueSpec(name="b", quota=8.0),
                      QueueSpec(name="c", quota=16.0, weight=2.0)], "test")
    jobs, t = [], 0.0
    for k in range(rng.randint(80, 140)):
        t += rng.expovariate(1 / 100.0)
        g = rng.choice([1, 1, 2, 2, 4, 8, 16])
        n_pods = mn = mx = 0
        if g >= 2 and rng.random() < 0.4:  # elastic: between half and twice its pods
            n_pods = g
            mn, mx = max(1, g // 2), 2 * g
        jobs.append(JobSpec(f"j{k}", t, rng.uniform(50, 8000), g, queue=rng.choice("abc"), n_pods=n_pods or None,
                            min_pods=mn, max_pods=mx))
    from gpupool.sim.jobs import JobSimulator

    pool = replace(JOB_POLICIES["gpupool"][1], consolidate=True, min_run_s=0.0, reclaim_min_run_s=0.0, max_attempts=4)
    sim = JobSimulator(nodes, jobs, tree, JobSimConfig(policy="gpupool", seed=seed, pool=pool))
    evictions: list = []
    cycle = sim.sched.cycle

    def recorded(now):
        out = cycle(now)
        evictions.extend(out.evictions)
        return out

    sim.sched.cycle = recorded
    res = sim.run()
    assert res.metrics["finished_jobs"] + res.metrics["unfinished_jobs"] == len(jobs)
    # a worker given up is a shrink, not an eviction of the whole job with its other pods left on their GPUs
    assert not sim.state.assignments and sim.sched.n_running == 0
    # every eviction, shrink and move names the job it made room for (what the Kubernetes driver groups by)
    assert evictions and all(pre is not None for *_, pre in evictions)


def _sim(nodes, jobs, quota, **kw):
    from gpupool.sim.jobs import JobSimulator

    tree = QueueTree([QueueSpec(name="q", quota=quota)])
    return JobSimulator(nodes, jobs, tree, JobSimConfig(policy="gpupool", restart_overhead_s=0.0, sample_interval_s=0,
                                                        **kw))


def test_a_required_node_pod_runs_on_a_node_without_nvlink_when_only_that_one_holds_it():
    """On a cluster that mixes NVLink and plain nodes a multi-GPU pod prefers NVLink nodes; for a job that
    requires one node, that preference must not rule out the plain node that holds it whole (it waited for
    good, reported as a deadlock)."""
    nodes = [NodeSpec("plain", cpu_milli=72_000, memory_mib=600_000, gpu_count=8, gpu_model="V100M32", switch="s"),
             NodeSpec("nv", cpu_milli=16_000, memory_mib=80_000, gpu_count=1, gpu_model="V100M32", nvlink_domain="d",
                      switch="s")]
    res = _sim(nodes, [JobSpec("j", 0.0, 100.0, 8, queue="q", topology="required", topology_tier="node")], 9).run()
    assert res.metrics["finished_jobs"] == 1 and res.metrics["deadlocks"] == 0
    assert res.jobs[0]["nodes"] == ["plain"]


def test_a_job_evicted_in_a_cycle_neither_restarts_nor_preempts_in_it_without_restart_evicted():
    """restart_evicted=False (the Kubernetes driver's setting: evicted pods take time to go): a job preempted in
    a cycle may not preempt another job and start again in that same cycle."""
    nodes = [NodeSpec("n0", cpu_milli=32_000, memory_mib=256_000, gpu_count=2, gpu_model="V100M32"),
             NodeSpec("n1", cpu_milli=32_000, memory_mib=256_000, gpu_count=1, gpu_model="V100M32")]
    jobs = [JobSpec("low", 0.0, 1000.0, 1, queue="q"), JobSpec("mid1", 1.0, 1000.0, 1, queue="q", priority=5),
            JobSpec("mid2", 1.0, 1000.0, 1, queue="q", priority=5), JobSpec("high", 10.0, 1000.0, 2, queue="q",
                                                                            priority=10)]
    pool = replace(JOB_POLICIES["gpupool"][1], order="fifo", min_run_s=0.0, reclaim_min_run_s=0.0,
                   restart_evicted=False)
    sim = _sim(nodes, jobs, 3, pool=pool)
    cycle, again = sim.sched.cycle, []

    def checked(now):
        out = cycle(now)
        evicted = {v.name for v, _, action, _ in out.evictions if action != "shrunk"}
        again.extend(j.name for j in out.started if j.name in evicted)
        return out

    sim.sched.cycle = checked
    res = sim.run()
    assert res.metrics["preemptions"] >= 1 and not again


def test_a_gang_no_single_gpu_model_can_hold_does_not_wait_for_one():
    """Heterogeneity-aware placement waits (an hour) for one GPU model to hold a gang, but not when no model
    could ever hold it alone: on an idle cluster nothing would end that wait (the gang was dropped as a
    deadlock)."""
    nodes = [NodeSpec("v100", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="V100M32", switch="s"),
             NodeSpec("h100", cpu_milli=64_000, memory_mib=512_000, gpu_count=4, gpu_model="H100", switch="s")]
    pool = replace(JOB_POLICIES["gpupool"][1], reserve_after_s=0.0)
    res = _sim(nodes, [JobSpec("g", 0.0, 100.0, 8, queue="q", n_pods=2)], 8, pool=pool, gpu_speed="catalog",
               objective="jct").run()
    assert res.metrics["finished_jobs"] == 1 and res.jobs[0]["start"] == 0.0


@pytest.mark.parametrize("tier", ["node", "nvlink", "switch"])
def test_an_elastic_job_grows_within_its_required_tier(tier):
    """An elastic job whose topology is required grows new workers only within its tier: its node for 'node'
    (and for 'nvlink' on a node outside any NVLink domain), its leaf switch for 'switch' (it grew across nodes
    whatever the tier)."""
    from gpupool.topology import placement_tier, tier_at_most

    nodes = [NodeSpec(f"n{i}", cpu_milli=32_000, memory_mib=256_000, gpu_count=2, gpu_model="V100M32",
                      switch="s0" if i < 2 else "s1") for i in range(3)]
    job = JobSpec("e", 0.0, 1000.0, 2, queue="q", n_pods=1, min_pods=1, max_pods=3, topology="required",
                  topology_tier=tier)
    sim = _sim(nodes, [job], 6)
    cycle, seen = sim.sched.cycle, []

    def watched(now):
        out = cycle(now)
        for j in sim.sched.running_jobs():
            seen.append((placement_tier([nodes[a.node] for a in j.placed], [len(a.gpus) for a in j.placed]),
                         len({a.node for a in j.placed}), len(j.placed)))
        return out

    sim.sched.cycle = watched
    sim.run()
    assert seen
    if tier == "switch":
        assert all(tier_at_most(t, "switch") for t, _, _ in seen)
        assert max(n for _, _, n in seen) == 2  # it grew, onto the other node of its switch
    else:  # these nodes have no NVLink domain: the job's one node
        assert all(k == 1 for _, k, _ in seen)


# ---------------------------------------------------------------------------------------------- non-preemptible
def test_nonpreemptible_job_in_a_queue_without_quota_takes_free_gpus():
    """The priority trap: a job at priority 1000 (a common PriorityClass) in a queue without a quota ran never
    (non-preemptible work ran only within a quota of 0). It takes free GPUs now; a queue with a quota keeps
    the within-quota rule (B's second job waits for the first although 8 GPUs are free); a leaf without a quota
    under a parent with one is held to the parent's (C1's second job waits too)."""
    queues = QueueTree([QueueSpec(name="A"), QueueSpec(name="B", quota=4), QueueSpec(name="C", quota=4),
                        QueueSpec(name="C1", parent="C")])
    jobs = [JobSpec("a", 0.0, 100.0, 8, queue="A", n_pods=1, priority=1000),
            JobSpec("b1", 0.0, 100.0, 4, queue="B", n_pods=1, priority=1000),
            JobSpec("b2", 0.0, 100.0, 4, queue="B", n_pods=1, priority=1000),
            JobSpec("c1", 0.0, 100.0, 4, queue="C1", n_pods=1, priority=1000),
            JobSpec("c2", 0.0, 100.0, 4, queue="C1", n_pods=1, priority=1000)]
    res, by_id = run(nodes(4, 8), jobs, queues=queues)
    assert res.metrics["finished_jobs"] == 5 and res.metrics["deadlocks"] == 0
    assert by_id["a"]["start"] == pytest.approx(0.0)
    assert sorted((by_id["b1"]["start"], by_id["b2"]["start"])) == pytest.approx([0.0, 100.0])
    assert sorted((by_id["c1"]["start"], by_id["c2"]["start"])) == pytest.approx([0.0, 100.0])


def test_nonpreemptible_threshold_is_configurable():
    """``nonpreemptible_priority``: above the jobs' priority (or None) they are preemptible and not held to
    quota: both of B's jobs start at once; at 1000 they are held to B's quota of 4."""
    queues = QueueTree([QueueSpec(name="B", quota=4)])
    jobs = [JobSpec(f"b{i}", 0.0, 100.0, 4, queue="B", n_pods=1, priority=1000) for i in range(2)]
    for threshold, starts in ((2000, [0.0, 0.0]), (None, [0.0, 0.0]), (1000, [0.0, 100.0])):
        _, by_id = run(nodes(1, 8), jobs, queues=queues, nonpreemptible_priority=threshold)
        assert sorted(j["start"] for j in by_id.values()) == pytest.approx(starts), threshold
