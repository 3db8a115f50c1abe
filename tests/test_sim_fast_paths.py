"""The job simulator's and pool scheduler's per-event shortcuts change no outcome.

Covered: the memoized per-placement figures (rate, tier, power) against the direct computation, the
memoized :meth:`PoolScheduler.infeasible_reason` against the uncached one, and the remembered failed
placement (skipped retries while no node changed) against a run that retries every time.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.pool.job import PoolJob
from gpupool.engine.pool.queues import QueueSpec, QueueTree
from gpupool.engine.pool.scheduler import PoolScheduler
from gpupool.model import Assignment, NodeSpec
from gpupool.policies import make_policy
from gpupool.sim.jobs import JobSimConfig, JobSimulator, JobSpec, run_jobs
from gpupool.topology import TopologyConfig, placement_tier, speed_factor


def mixed_nodes() -> list[NodeSpec]:
    """Two switches, NVLink boards and plain nodes, two GPU models, 4- and 8-GPU nodes."""
    out = []
    for i in range(12):
        model = "V100M32" if i % 3 else "A100"
        out.append(NodeSpec(f"n{i}", cpu_milli=64000, memory_mib=512 * 1024, gpu_count=8 if i % 2 else 4,
                            gpu_model=model, nvlink_domain=f"d{i}" if i % 4 else "", rack=f"r{i // 6}",
                            switch=f"leaf{i // 6}" if i < 10 else ""))
    return out


def random_trace(rng: random.Random, n: int) -> list[JobSpec]:
    t = 0.0
    jobs = []
    for k in range(n):
        t += rng.expovariate(1 / 200.0)
        g = rng.choice([1, 1, 1, 2, 4, 8, 8, 16, 32])
        jobs.append(JobSpec(f"j{k}", t, rng.uniform(100, 20000), g, queue=rng.choice(["a", "b"]),
                            priority=rng.choice([0, 0, 0, 100])))
    return jobs


def outcome(res) -> str:
    metrics = {k: v for k, v in res.metrics.items() if k not in ("wall_seconds", "events_per_second")}
    return json.dumps([metrics, res.queues, res.jobs, res.unfinished], sort_keys=True, default=str)


@pytest.mark.parametrize("seed", range(5))
def test_placement_figures_equal_the_direct_computation(seed):
    rng = random.Random(seed)
    nodes = mixed_nodes()
    topo = TopologyConfig(factors={"switch": 0.9, "spine": 0.7})
    sim = JobSimulator(nodes, [JobSpec("x", 0.0, 1.0, 1)], None,
                       JobSimConfig(gpu_speed="catalog", topology=topo, gpu_utilization=0.7))
    for _ in range(200):
        placed = []
        for p in range(rng.choice([1, 1, 2, 3, 5])):
            node = rng.randrange(len(nodes))
            gpus = tuple(range(rng.choice([0, 1, 2, 4])))
            placed.append(Assignment(f"p{p}", node, nodes[node].name, gpus, 1000, 0, 1000, 0, 0))
        for _ in range(2):  # computed, then from the memo
            fig = sim._placement_figures(placed)
            tier = placement_tier([nodes[a.node] for a in placed], [len(a.gpus) for a in placed])
            assert fig.tier == tier
            assert fig.speed == min(sim.node_speed[a.node] for a in placed)
            assert fig.topo_factor == speed_factor(tier, sum(len(a.gpus) for a in placed), topo)
            assert fig.node_names == tuple(a.node_name for a in placed)
            assert fig.busy_w == sum(len(a.gpus) * sim.node_busy_w[a.node] for a in placed)
            assert fig.idle_w == sum(len(a.gpus) * sim.node_idle_w[a.node] for a in placed)


def test_infeasible_reason_memo_equals_the_uncached_answer():
    state = ClusterState(mixed_nodes())
    tree = QueueTree([QueueSpec(name="a", quota=16, limit=40), QueueSpec(name="b", quota=4)])
    sched = PoolScheduler(state, make_policy("gpupool"), tree)
    rng = random.Random(0)
    for k in range(300):
        n = rng.choice([1, 2, 3, 6, 12])
        job = PoolJob(f"j{k}", rng.choice(["a", "b"]), rng.choice([1, 2, 4, 8]), n, 0.0,
                      priority=rng.choice([0, 100, 125]), cpu_per_pod=rng.choice([0, 1000, 90000]),
                      topology=rng.choice(["preferred", "required", "none"]),
                      topology_tier=rng.choice(["nvlink", "node", "switch"]))
        job.q = tree.leaf_index(job.queue)
        assert sched.infeasible_reason(job) == sched._infeasible_reason(job)
    assert len(sched._infeasible) < 300  # shapes repeat


@pytest.mark.parametrize("policy", ["fifo", "round-robin", "gpupool"])
@pytest.mark.parametrize(("seed", "elastic"), [(7, 0.0), (1, 0.2), (7, 0.2)])
def test_remembered_failed_placement_changes_no_outcome(policy, seed, elastic, monkeypatch):
    jobs = random_trace(random.Random(seed), 300)
    cfg = JobSimConfig(topology=TopologyConfig(), sample_interval_s=3600.0, elastic_fraction=elastic)
    fast = run_jobs(mixed_nodes(), jobs, policy, config=cfg)

    original = PoolScheduler._place

    def always_retry(self, *args, **kwargs):
        self._failed_place = None  # forget the last failure: every placement is tried again
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PoolScheduler, "_place", always_retry)
    slow = run_jobs(mixed_nodes(), jobs, policy, config=cfg)
    assert outcome(fast) == outcome(slow)
    assert fast.metrics["finished_jobs"] > 0
    assert not math.isnan(fast.metrics["mean_jct_s"])


@pytest.mark.parametrize("seed", [7, 3, 11])
def test_preemption_that_takes_an_elastic_job_and_its_extra_workers_releases_each_pod_once(seed):
    """Regression: a preemptor chose both an elastic job's extra worker (its own candidate) and the
    whole job; the worker's pod was released twice (AllocationError). Seed 7 raised it."""
    jobs = random_trace(random.Random(seed), 300)
    cfg = JobSimConfig(topology=TopologyConfig(), sample_interval_s=3600.0, elastic_fraction=0.2)
    res = run_jobs(mixed_nodes(), jobs, "gpupool", config=cfg)
    assert res.metrics["finished_jobs"] + res.metrics["unfinished_jobs"] == len(jobs)
