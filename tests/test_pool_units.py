"""Small pieces of the pool scheduler: job split, Tiresias levels, victim selection, topology scope."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.pool.config import make_order
from gpupool.engine.pool.job import PoolJob, split_gpus
from gpupool.engine.pool.ordering import FifoOrder, TiresiasOrder
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import PoolConfig, PoolScheduler
from gpupool.engine.pool.victims import select_victims
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy


@pytest.mark.parametrize(("gpus", "per_node", "expected"), [
    (1, 8, (1, 1)), (8, 8, (1, 8)), (12, 8, (2, 6)), (16, 8, (2, 8)), (24, 8, (3, 8)),
    (128, 8, (16, 8)), (6, 4, (2, 3)), (13, 8, (13, 1)),  # 13 has no equal split of <= 8: one GPU per pod
])
def test_split_gpus(gpus, per_node, expected):
    assert split_gpus(gpus, per_node) == expected


def test_job_spec_validation():
    with pytest.raises(ValueError, match="min_pods"):
        PoolJob("j", "q", 1, 2, 0.0, min_pods=3)
    with pytest.raises(ValueError, match="topology"):
        PoolJob("j", "q", 1, 2, 0.0, topology="hard")
    j = PoolJob("j", "q", 4, 2, 0.0, min_pods=1, max_pods=4)
    assert j.elastic and j.num_gpu == 8 and j.preemptible
    assert not PoolJob("k", "q", 1, 1, 0.0, priority=100).preemptible


@pytest.mark.parametrize(("attained", "level", "boundary"), [
    (0.0, 0, 3600.0), (3599.0, 0, 3600.0), (3600.0, 1, 36000.0), (35999.0, 1, 36000.0), (36000.0, 2, math.inf),
])
def test_tiresias_levels(attained, level, boundary):
    order = TiresiasOrder((3600.0, 36000.0))
    assert order.level(attained) == level
    assert order.next_boundary(attained) == boundary
    assert FifoOrder().level(attained) == 0


def test_tiresias_promotion_rule():
    order = TiresiasOrder((3600.0,), promote_knob=8.0, promote_min_s=600.0)
    assert not order.promoted(waited_s=7999.0, run_s=1000.0)
    assert order.promoted(waited_s=8000.0, run_s=1000.0)
    assert not order.promoted(waited_s=500.0, run_s=10.0)  # at least promote_min_s
    assert not order.promoted(waited_s=1e9, run_s=0.0)  # never ran: already at level 0
    with pytest.raises(ValueError):
        TiresiasOrder((10.0, 5.0))
    with pytest.raises(ValueError):
        make_order("sjf")


VICTIM_CASES = [
    # name, free GPUs per node, g, n, holdings per candidate, admit refuses, expected
    # node0 needs both small victims (worst rank 1); node1 needs v2 (rank 2): node0 wins
    ("fewest, best ranked", [0, 0], 4, 1, [[(0, 2)], [(0, 2)], [(1, 4)]], set(), [0, 1]),
    ("already fits", [4, 0], 4, 1, [[(1, 4)]], set(), []),
    ("impossible", [0, 0], 8, 1, [[(0, 4)], [(1, 4)]], set(), None),
    # v0 refused (its queue would drop below its fair share): node0 cannot reach 4 GPUs without it, so
    # neither v0 nor v1 is taken; node1 via v2
    ("refused victim skipped", [0, 0], 4, 1, [[(0, 2)], [(0, 2)], [(1, 4)]], {0}, [2]),
    # a candidate may overdraw a positive budget once: its queue is above its share before the eviction
    ("budget positive before", [0, 0], 1, 2, [[(0, 1)], [(0, 1)], [(1, 1)]], {0, 1}, [0, 2]),
    # evicting a gang frees its pods on both nodes at once: one victim makes room for two pods of 8
    ("gang victim frees two nodes", [4, 4], 8, 2, [[(0, 4), (1, 4)]], set(), [0]),
    # one-GPU pods: take victims in order until enough GPUs are free
    ("single GPUs", [1, 0], 1, 3, [[(1, 1)], [(0, 1)], [(1, 1)]], set(), [0, 1]),
]


@pytest.mark.parametrize(("name", "free", "g", "n", "holdings", "refuse", "expected"), VICTIM_CASES,
                         ids=[c[0] for c in VICTIM_CASES])
def test_select_victims(name, free, g, n, holdings, refuse, expected):
    costs = [[(0, 1.0)] if i in refuse else [] for i in range(len(holdings))]
    budget = [0.5] if name == "budget positive before" else [0.0]
    got = select_victims(np.array(free), g, n, holdings, costs, budget)
    assert got == expected



@pytest.mark.parametrize("seed", range(20))
def test_select_victims_answers_by_the_counts(seed):
    """Random cases: [] exactly when the free GPUs already hold n pods of g, None exactly when evicting every
    candidate would not (the upper bound), else victims after whose eviction the pods fit; the list and
    array forms of ``free_gpus`` give the same answer."""
    rng = np.random.default_rng(seed)
    for _ in range(200):
        n_nodes = int(rng.integers(1, 12))
        free = rng.integers(0, 9, n_nodes)
        g = int(rng.choice([1, 1, 2, 4, 8]))
        n = int(rng.integers(1, 6))
        holdings = [[(int(nd), int(rng.integers(1, 5))) for nd in rng.choice(n_nodes, int(rng.integers(1, 3)))]
                    for _ in range(int(rng.integers(0, 8)))]
        got = select_victims(free, g, n, holdings)
        assert got == select_victims(free.tolist(), g, n, holdings)
        fits = sum(int(x) // g for x in free)
        every = free.copy()
        for hold in holdings:
            for node, gpus in hold:
                every[node] += gpus
        if fits >= n:
            assert got == []
        elif sum(int(x) // g for x in every) < n:
            assert got is None
        else:
            assert got  # g == 1 or whole nodes: the greedy finds victims whenever all of them would do
            after = free.copy()
            for i in got:
                for node, gpus in holdings[i]:
                    after[node] += gpus
            assert sum(int(x) // g for x in after) >= n

def topo_cluster() -> ClusterState:
    # n0, n1 under leaf0; n2, n3 under leaf1; 8 GPUs each
    return ClusterState([NodeSpec(f"n{i}", 64000, 512 * 1024, 8, "V100M32", nvlink_domain=f"n{i}", rack=f"r{i // 2}",
                                  switch=f"leaf{i // 2}") for i in range(4)])


def busy(state: ClusterState, node: int, gpus: int) -> None:
    state.allocate(PodRequest(f"busy-{node}", num_gpu=gpus, gpu_milli=1000), node, range(gpus))


@pytest.mark.parametrize(("topology_aware", "mode", "expected"), [
    # free GPUs: n0 4, n1 2, n2 4, n3 4. A gang of two 4-GPU pods: no node takes both; leaf0 holds one
    # pod (n0), leaf1 two (n2, n3): the gang goes to leaf1
    (True, "preferred", {"n2", "n3"}),
    (True, "required", {"n2", "n3"}),
])
def test_gang_kept_under_one_leaf_switch(topology_aware, mode, expected):
    state = topo_cluster()
    for node, gpus in ((0, 4), (1, 6), (2, 4), (3, 4)):
        busy(state, node, gpus)
    tree = QueueTree([QueueSpec(name="q")])
    sched = PoolScheduler(state, make_policy("gpupool"), tree, PoolConfig(topology_aware=topology_aware))
    job = PoolJob("g", "q", 4, 2, 0.0, topology=mode)
    sched.submit(job, 0.0)
    res = sched.cycle(0.0)
    assert res.started == [job]
    assert {a.node_name for a in job.placed} == expected


def test_required_topology_that_no_switch_can_hold_waits():
    state = topo_cluster()
    for node, gpus in ((0, 4), (1, 6), (2, 4), (3, 8)):
        busy(state, node, gpus)
    sched = PoolScheduler(state, make_policy("gpupool"), QueueTree([QueueSpec(name="q")]), PoolConfig())
    hard = PoolJob("hard", "q", 4, 2, 0.0, topology="required")
    soft = PoolJob("soft", "q", 4, 2, 0.0, topology="preferred")
    sched.submit(hard, 0.0)
    sched.submit(soft, 0.0)
    res = sched.cycle(0.0)
    # free: n0 4 (leaf0), n2 4 (leaf1): only a spine-crossing placement exists; the soft gang takes it
    assert res.started == [soft] and hard.status == "pending"
    assert {a.node_name for a in soft.placed} == {"n0", "n2"}
    state.check_invariants()


def test_unhealthy_gpus_are_never_chosen_and_kill_their_pods():
    state = topo_cluster()
    sched = PoolScheduler(state, make_policy("gpupool"), QueueTree([QueueSpec(name="q")]), PoolConfig())
    job = PoolJob("j", "q", 8, 1, 0.0)
    sched.submit(job, 0.0)
    sched.cycle(0.0)
    node = job.placed[0].node
    killed = sched.set_gpu_health(node, 3, False, 10.0)
    assert killed == [job] and job.status == "pending"
    res = sched.cycle(10.0)
    assert res.started == [job] and job.placed[0].node != node
    for other in range(4):  # the failed node has only 7 healthy GPUs: no 8-GPU pod fits there again
        if other != job.placed[0].node:
            sched.set_gpu_health(other, 0, False, 20.0)
    again = PoolJob("k", "q", 8, 1, 20.0)
    sched.submit(again, 20.0)
    assert sched.cycle(20.0).started == []
    assert sched.free_gpus == int(((state.gpu_free >= 1000) & state.gpu_healthy).sum())


def test_pending_shape_index_follows_the_queue():
    """Pending keeps, per job shape, the keys of its jobs in key order (insert, remove, re-sort), and
    next_live finds the first later job of a live shape, as a scan over the queue would."""
    import random

    from gpupool.engine.pool.pending import Pending

    rng = random.Random(7)
    plist = Pending()
    shapes = [(1, 1, None), (2, 1, None), (8, 2, None), (8, 2, "switch"), (4, 4, None)]
    shape_of: dict[int, tuple] = {}
    live: list[PoolJob] = []
    for step in range(400):
        if live and rng.random() < 0.4:
            job = live.pop(rng.randrange(len(live)))
            plist.remove(job, shape_of[job.seq])
        else:
            job = PoolJob(f"j{step}", "q", 1, 1, float(rng.randrange(50)))
            job.seq = step
            job.key = (0, rng.randrange(3), job.submit_time, job.seq)
            shape_of[step] = rng.choice(shapes)
            plist.insert(job, shape_of[step])
            live.append(job)
        if step % 97 == 0:  # keys change (a size model learned more): re-sort
            for job in live:
                job.key = (0, rng.randrange(3), job.submit_time, job.seq)
            plist.resort(lambda j: shape_of[j.seq])
        assert plist.keys == sorted(j.key for j in live) == [j.key for j in plist.jobs]
        expected: dict[tuple, list] = {}
        for job in plist.jobs:
            expected.setdefault(shape_of[job.seq], []).append(job.key)
        assert plist.by_shape == expected
        if plist.jobs:
            dead = set(rng.sample(shapes, rng.randrange(len(shapes) + 1)))
            i = rng.randrange(len(plist.jobs))
            scan = next((k for k in range(i + 1, len(plist.jobs)) if shape_of[plist.jobs[k].seq] not in dead),
                        len(plist.jobs))
            assert plist.next_live(i, dead.__contains__) == scan


def test_pending_front_removals_counted_off_read_the_same():
    """Pending counts jobs that leave the front of its lists off and cuts the lists later: between reads of
    ``jobs`` / ``keys`` / ``by_shape`` (which cut them), ``next_live``, ``len`` and further inserts and removals
    (front, middle, new last, re-sort) answer as a plain sorted list does. Long runs of front removals pass the
    cut thresholds (32 entries, a quarter of the list) of the whole list and of each shape's list."""
    import bisect
    import random

    from gpupool.engine.pool.pending import Pending

    for seed in range(6):
        rng = random.Random(seed)
        plist = Pending()
        shapes = [(1, 1, None), (2, 1, None), (8, 2, None)]
        shape_of: dict[int, tuple] = {}
        ref: list[PoolJob] = []  # in key order, later inserts after equal keys (bisect_right)
        for step in range(3000):
            r = rng.random() * (0.6 if step % 1000 < 600 else 1.5)  # a queue that grows, then drains
            if ref and r < 0.45:  # the first job starts (the usual case)
                job = ref.pop(0)
                plist.remove(job, shape_of[job.seq])
            elif ref and r < 0.5:  # one from the middle leaves
                job = ref.pop(rng.randrange(len(ref)))
                plist.remove(job, shape_of[job.seq])
            else:
                job = PoolJob(f"j{step}", "q", 1, 1, float(step))
                job.seq = step
                # mostly a new last key (arrivals in time order), now and then one that sorts earlier
                job.key = (0, 0 if rng.random() < 0.9 else -1, float(rng.randrange(step + 1)), step)
                shape_of[step] = rng.choice(shapes)
                plist.insert(job, shape_of[step])
                ref.insert(bisect.bisect_right([j.key for j in ref], job.key), job)
            if step % 701 == 700:  # keys change: re-sort (cuts the lists first)
                for job in ref:
                    job.key = (0, rng.randrange(2), job.submit_time, job.seq)
                ref.sort(key=lambda j: j.key)
                plist.resort(lambda j, of=shape_of: of[j.seq])
            assert len(plist) == plist.n_jobs == len(ref)
            if ref:
                dead = set(rng.sample(shapes, rng.randrange(len(shapes))))
                i = rng.randrange(len(ref))
                scan = next((k for k in range(i + 1, len(ref)) if shape_of[ref[k].seq] not in dead), len(ref))
                assert plist.next_live(i, dead.__contains__) == scan
            if step % 401 == 0 or step == 2999:  # a read cuts the lists: they are the plain ones
                assert plist.jobs == ref
                assert plist.keys == [j.key for j in ref]
                expected: dict[tuple, list] = {}
                for job in ref:
                    expected.setdefault(shape_of[job.seq], []).append(job.key)
                assert plist.by_shape == expected
