"""The job simulator's outcomes are pinned: speed work on the pool scheduler and the simulator changes none.

Each case runs :func:`gpupool.sim.jobs.run_jobs` and hashes (SHA-256) two things:

* ``schedule``: per job, in trace order, its start and end times, status and reason, preemptions,
  failures, topology tier and the node of each pod of its last placement (floats as ``repr``, exact);
* ``outcome``: everything the result reports (metrics, per-queue figures, unfinished jobs, the sampled
  allocation and fair share, per-job energy and lost GPU-hours) except the wall time, the events per
  second and the scheduler's internal counters (``scheduler_stats``: attempts, which speed work skips).

The expected hashes (``tests/data/jobsim_hashes.json``) were recorded before the change-driven cycle
(issue 12, item 4) on main at 3936f61. Cases: windows of the Philly trace (15 queues with quotas:
fifo, round-robin, gpupool, lowest-power; gpupool with failures, elastic jobs, a topology config and
catalog speeds), of ITP cluster04 (one queue), and a synthetic trace on a mixed two-switch cluster (two
queues, non-preemptible jobs, required topology, elastic jobs, failures). The whole-Philly cases
(``philly-full/*``, about a minute to several minutes each) run only with ``GPUPOOL_FULL_HASHES=1``.

Re-record (only when an outcome change is intended, and say why in the commit)::

    .venv/bin/python tests/test_jobsim_hashes.py --record [case ...]
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import sys
from functools import cache
from pathlib import Path

import pytest

from gpupool.clusterspec import load_cluster_yaml
from gpupool.sim.failures import FailureEvent, FailureModel
from gpupool.sim.jobs import JobSimConfig, JobSpec, run_jobs
from gpupool.topology import TopologyConfig
from gpupool.traces import load_jobs
from test_sim_fast_paths import mixed_nodes  # the same mixed two-switch cluster

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / ".." / "shared" / "traces"
PHILLY = TRACES / "philly_pollux" / "philly.csv"
ITP = TRACES / "msr_itp_elasticflow" / "cluster04.csv"
FIXTURE = Path(__file__).resolve().parent / "data" / "jobsim_hashes.json"


def _f(x: float) -> str:
    return repr(float(x)) if not math.isnan(x) else "nan"


def schedule_hash(res) -> str:
    rows = [[j["job_id"], _f(j["start"]), _f(j["end"]), j["status"], j["reason"], j["preemptions"], j["failures"],
             j["tier"], list(j["nodes"])] for j in res.jobs]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def outcome_hash(res) -> str:
    metrics = {k: v for k, v in res.metrics.items()
               if k not in ("wall_seconds", "events_per_second", "scheduler_stats")}
    doc = [metrics, res.queues, res.unfinished, res.jobs, res.share_times.tolist(), res.share_alloc.tolist(),
           res.share_fair.tolist(), list(res.queue_names)]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=repr).encode()).hexdigest()


@cache
def _philly() -> tuple:
    return tuple(load_jobs(PHILLY)), tuple(load_cluster_yaml(REPO / "examples" / "clusters" / "philly.yaml"))


@cache
def _itp() -> tuple:
    return tuple(load_jobs(ITP)), tuple(load_cluster_yaml(REPO / "examples" / "clusters" / "itp-cluster04.yaml"))


def synthetic_trace(seed: int, n: int) -> list[JobSpec]:
    rng = random.Random(seed)
    t = 0.0
    jobs = []
    for k in range(n):
        t += rng.expovariate(1 / 200.0)
        g = rng.choice([1, 1, 1, 2, 4, 8, 8, 16, 32])
        jobs.append(JobSpec(f"j{k}", t, rng.uniform(100, 20000), g, queue=rng.choice(["a", "b"]),
                            priority=rng.choice([0, 0, 0, 100]),
                            topology=rng.choice(["preferred", "preferred", "required"])))
    return jobs


def _synthetic_failures() -> tuple[FailureEvent, ...]:
    return tuple(FailureModel(node_mtbf_h=60.0, gpu_mtbf_h=200.0, repair_h=2.0, seed=5).events(mixed_nodes(), 90000.0))


def run_case(name: str):
    """Run the named case (see CASES) and return its JobSimResult."""
    trace, policy, variant = name.split("/")
    cfg = JobSimConfig()
    if trace.startswith("philly") or trace.startswith("itp"):
        jobs, nodes = _philly() if trace.startswith("philly") else _itp()
        if trace != "philly-full":
            jobs = jobs[: int(trace.split("-")[1])]
        if variant == "failures":
            cfg = JobSimConfig(node_mtbf_h=24 * 20, gpu_mtbf_h=24 * 200, repair_h=6.0)
        elif variant == "elastic":
            cfg = JobSimConfig(elastic_fraction=0.3)
        elif variant == "topology":
            cfg = JobSimConfig(topology=TopologyConfig(), gpu_speed="catalog", gpu_utilization=0.7)
        return run_jobs(list(nodes), list(jobs), policy, config=cfg)
    # synthetic
    nodes = mixed_nodes()
    jobs = synthetic_trace(int(trace.split("-")[1]), 400)
    cfg = JobSimConfig(topology=TopologyConfig(), sample_interval_s=3600.0)
    if variant == "failures":
        cfg = JobSimConfig(topology=TopologyConfig(), failure_events=_synthetic_failures())
    elif variant == "elastic":
        cfg = JobSimConfig(topology=TopologyConfig(), elastic_fraction=0.3, restart_overhead_s=0.0)
    return run_jobs(nodes, jobs, policy, config=cfg)


CASES = [
    "philly-3000/fifo/default", "philly-3000/round-robin/default", "philly-3000/gpupool/default",
    "philly-3000/lowest-power/default", "philly-3000/gpupool/failures", "philly-3000/gpupool/elastic",
    "philly-3000/gpupool/topology", "philly-12000/gpupool/default", "philly-12000/fifo/default",
    "itp-3000/fifo/default", "itp-3000/gpupool/default", "itp-3000/gpupool/elastic",
    "synthetic-1/fifo/default", "synthetic-1/gpupool/default", "synthetic-2/gpupool/failures",
    "synthetic-3/gpupool/elastic", "synthetic-4/round-robin/default",
    # the Gittins job order (issue 14) through the same cycle: recorded at 5bf5429, before the cycle's
    # second round of speed work
    "philly-3000/gittins/default", "synthetic-1/gittins/default",
]
FULL_CASES = ["philly-full/fifo/default", "philly-full/gpupool/default"]


def _needs_traces(name: str) -> bool:
    return not name.startswith("synthetic")


def _expected() -> dict:
    return json.loads(FIXTURE.read_text())["cases"]


@pytest.mark.parametrize("name", CASES + FULL_CASES)
def test_outcome_hash_unchanged(name):
    if _needs_traces(name) and not (PHILLY.exists() and ITP.exists()):
        pytest.skip("../shared/traces not present")
    if name in FULL_CASES and os.environ.get("GPUPOOL_FULL_HASHES") != "1":
        pytest.skip("whole-Philly case: set GPUPOOL_FULL_HASHES=1 (minutes)")
    want = _expected()[name]
    res = run_case(name)
    assert res.metrics["finished_jobs"] > 0
    assert schedule_hash(res) == want["schedule"], f"{name}: the per-job schedule changed"
    assert outcome_hash(res) == want["outcome"], f"{name}: a reported outcome changed (schedule did not)"


def _record(names: list[str]) -> None:
    doc = json.loads(FIXTURE.read_text()) if FIXTURE.exists() else {"cases": {}}
    doc["note"] = ("SHA-256 of run_jobs outcomes, recorded before the change-driven cycle (issue 12 item 4); "
                   "see tests/test_jobsim_hashes.py")
    for name in names:
        res = run_case(name)
        doc["cases"][name] = {"schedule": schedule_hash(res), "outcome": outcome_hash(res),
                              "events": res.metrics["events"], "finished": res.metrics["finished_jobs"],
                              "preemptions": res.metrics["preemptions"]}
        print(name, doc["cases"][name], flush=True)
        FIXTURE.parent.mkdir(parents=True, exist_ok=True)
        FIXTURE.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--record":
        sys.exit("usage: test_jobsim_hashes.py --record [case ...]")
    _record(args[1:] or CASES + FULL_CASES)
