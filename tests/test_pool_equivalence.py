"""The job simulator and the live scheduler take the same decisions on the same job trace.

A short window of the real Philly trace (45 or 60 jobs of three virtual clusters, gangs of up to 2 x 8 GPUs,
two priority classes, three queues with quotas, three or four 8-GPU nodes) is replayed through both drivers
of :class:`~gpupool.engine.pool.PoolScheduler`:

* the **simulator**: :class:`gpupool.sim.jobs.JobSimulator` itself (its event loop submits, finishes and
  cycles); the test only wraps ``sched.cycle`` to record each cycle's :class:`CycleResult`;
* the **live scheduler**: :class:`gpupool.k8s.pool.PoolDriver` on a :class:`~gpupool.k8s.state.ClusterModel`
  fed by the mock API of ``k8s_pool_harness`` (Queue CRs, PodGroups, pods with ``spec.priority`` and the
  Kueue queue label; evicted pods are deleted by the harness). At each job's submit time its pods are created
  (a PodGroup with ``minMember`` for a gang); ``cycle()`` runs at every instant the simulator cycled (and at
  any instant the live run itself has an arrival or a finish, so that a divergence shows instead of hiding);
  a job's pods finish (``Succeeded``) when the trace says: its trace duration of work after it started, less
  the work it did before an eviction; an evicted job's pods come back as new pending pods of the same job
  (as a Job controller makes them: same PodGroup, new names).

Both use the same :class:`PoolConfig` (``live_config`` with the overrides below), the same nodes (the
``NodeSpec`` the model parsed from the Node objects, in its order), the same queue tree (the one the live
driver builds from the Queue CRs, ``default`` queue included), the model's placement policy and seed, and
the same pod shapes (1 CPU per GPU, no memory).

All four scenarios must agree. ``backdated`` and ``restarted`` pinned two differences of the live driver
until they were fixed: a job that waits again after an eviction waits from its pods' re-creation (it was
the oldest pod's creation), and no driver restarts a job in the cycle that evicted it
(``PoolConfig.restart_evicted`` off in ``live_config``, which both drivers run here).

Compared, cycle by cycle: jobs started (in order) with one ``(node, GPUs)`` per pod, evictions
(victim, action, preemptor, pods) and resizes. Normalised, on purpose:

* identities: a pod is ``<job>-r<attempt>-<i>``; every job has a PodGroup (as KAI's pod grouper and Volcano
  make one per workload), which keeps its identity across re-created pods; it maps to the trace job
  ``<job>``. Job ``seq`` numbers differ (the live driver submits a job again when it waits again) and are
  not compared.
* job order: the live driver orders a job by its oldest pod's ``creationTimestamp`` (first seen), the
  simulator by its trace submit time: first pods get the trace submit time as ``creationTimestamp``,
  re-created ones the instant they are re-created. Jobs are named ``j00``, ``j01``... in trace order, so that
  the live driver's name order (it reconciles jobs in sorted name order) equals the simulator's submit order
  for jobs submitted in the same second.
* evictions are compared as a sorted list per instant: the live driver groups them by preemptor (one
  Kubernetes preemption each), the simulator lists them in the order it chose them; action names are the
  live ones (``reclaimed`` -> ``reclaim``...).
* a preemptor placed on a node whose victims are still terminating is *nominated* and bound in a later cycle;
  the harness deletes victims at once and the test re-creates the evicted jobs' pods, then runs one more
  ``cycle()`` at the same instant (a live loop cycles again as soon as those events arrive): it binds the
  nominated pods. A nominated placement counts as the start. That second cycle must not evict anything.
* typical pods of the placement policy (FGD's fragmentation): the live model learns them from the pods it holds
  when it builds its state, only from 50 pods on (here: the default, one whole GPU); the simulator from the
  whole trace. The simulator's policy is prepared with the live default (scenario ``packed`` places
  differently without it); the test checks the live engine's typical pods.
* the simulator's physics are set to the trace's: no restart overhead, no topology slowdown, GPU speed
  ``none``, checkpoint on eviction (a job needs exactly its trace duration of running time).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpupool.engine.pool import QueueSpec as PoolQueueSpec
from gpupool.engine.pool import QueueTree
from gpupool.engine.pool.job import split_gpus
from gpupool.engine.pool.scheduler import JOB_POLICIES
from gpupool.k8s.pool import live_config
from gpupool.k8s.state import ClusterModel
from gpupool.policies.fgd import DEFAULT_TYPICAL
from gpupool.sim.jobs import JobSimConfig, JobSimulator, JobSpec
from gpupool.topology import TIERS, TopologyConfig
from gpupool.traces import load_philly_jobs
from k8s_pool_harness import Cluster, node, pod, pod_group, queue

TRACE = Path(__file__).resolve().parents[1] / "../shared/traces/philly_pollux/philly.csv"

START_S = 6_714_635.0  # the window: jobs of three virtual clusters (at most 16 GPUs) submitted from here on
VCS = {"6c71a0": "vc-a", "11cb48": "vc-b", "6214e9": "vc-c"}
T0 = 1_700_000_000.0  # the harness's clock and creationTimestamp origin
ACTIONS = {"reclaimed": "reclaim", "preempted": "preempt", "consolidated": "consolidate", "shrunk": "shrink"}
GPN = 8  # GPUs per node


@dataclass(frozen=True)
class Scenario:
    """``n_jobs`` trace jobs from :data:`START_S` on; ``nodes`` 8-GPU nodes; GPU quotas of vc-a, vc-b, vc-c;
    every ``every``-th job (k % every == every - 1) is of the ``train`` class (priority 50), the rest 0."""

    n_jobs: int
    nodes: int
    quotas: tuple[int, int, int]
    every: int
    reserve_after_s: float

    def overrides(self) -> dict:
        return dict(min_run_s=0.0, reclaim_min_run_s=0.0, reserve_after_s=self.reserve_after_s)

    def queues(self) -> list[dict]:
        return [queue(name, quota=q, weight=1) for name, q in zip(("vc-a", "vc-b", "vc-c"), self.quotas, strict=True)]


# 60 jobs (~2 h of the trace, 25 gangs of 2 to 16 GPUs, a few jobs of 15 to 40 hours) on 32 GPUs: 2 reclaims,
# 3 preemptions, 6 gangs of 2 pods, reservations
RICH = Scenario(n_jobs=60, nodes=4, quotas=(8, 12, 12), every=2, reserve_after_s=600.0)
# 45 jobs on 24 GPUs: the placements differ unless both use the same typical pods (see run_simulator)
PACKED = Scenario(n_jobs=45, nodes=3, quotas=(4, 10, 10), every=3, reserve_after_s=600.0)
# 60 jobs on 24 GPUs: preempted gangs wait again and compete for reservations, victims restart at once
BACKDATED = Scenario(n_jobs=60, nodes=3, quotas=(6, 9, 9), every=4, reserve_after_s=900.0)
RESTARTED = Scenario(n_jobs=60, nodes=3, quotas=(8, 8, 8), every=2, reserve_after_s=600.0)

def load_trace(sc: Scenario) -> list[JobSpec]:
    if not TRACE.exists():
        pytest.skip(f"{TRACE} not available")
    jobs = [r for r in load_philly_jobs(TRACE) if r.queue in VCS and r.num_gpu <= 2 * GPN
            and r.submit_time >= START_S][:sc.n_jobs]
    assert len(jobs) == sc.n_jobs
    return [JobSpec(f"j{k:02d}", r.submit_time - START_S, r.duration, r.num_gpu, VCS[r.queue],
                    priority=50 if k % sc.every == sc.every - 1 else 0, line=r.line) for k, r in enumerate(jobs)]


# ------------------------------------------------------------------------------------------------ decisions
@dataclass
class Decisions:
    """Per instant (seconds from the window start): starts in order, evictions, resizes."""

    starts: dict[float, list[tuple]] = field(default_factory=dict)
    evictions: dict[float, list[tuple]] = field(default_factory=dict)
    resizes: dict[float, list[tuple]] = field(default_factory=dict)
    cycles: list[float] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = []
        for t in sorted(set(self.starts) | set(self.evictions) | set(self.resizes)):
            for e in sorted(self.evictions.get(t, [])):
                out.append(f"t={t:>8g} evict  {e[0]} ({e[1]} by {e[2] or '-'}, {e[3]} pod(s))")
            for s in self.starts.get(t, []):
                out.append(f"t={t:>8g} start  {s[0]} on {', '.join(f'{n}:{g}' for n, g in s[1])}")
            for r in self.resizes.get(t, []):
                out.append(f"t={t:>8g} resize {r[0]} {r[1]} -> {r[2]} pods")
        return out


def run_simulator(sc: Scenario, trace: list[JobSpec], specs: list, tree: QueueTree, policy: str,
                  seed: int) -> tuple[Decisions, JobSimulator]:
    job_policy = next(name for name, (placement, _, _) in JOB_POLICIES.items() if placement == policy)
    cfg = JobSimConfig(policy=job_policy, seed=seed, pool=live_config(**sc.overrides()), restart_overhead_s=0.0,
                       topology=TopologyConfig(factors={t: 1.0 for t in TIERS}), gpu_speed="none",
                       checkpoint_on_preempt=True, sample_interval_s=0, cpu_per_gpu=1000, mem_per_gpu=0)
    sim = JobSimulator(specs, trace, tree, cfg)
    # typical pods of the placement policy (FGD's fragmentation measure): the live model's engine learns them
    # from the pods it holds when it builds its state, and only from 50 pods on: here it builds it at the
    # first cycle, with one pod, and keeps the default (one whole GPU). The simulator learns them from the whole
    # trace. Same typical pods for both (the test checks the live engine's afterwards).
    sim.sched.engine.policy.prepare(sim.state, None)
    out = Decisions()
    cycle = sim.sched.cycle

    def recording(now: float):
        res = cycle(now)
        out.cycles.append(now)
        if res.started:
            out.starts.setdefault(now, []).extend(
                (j.name, tuple(sorted((a.node_name, len(a.gpus)) for a in j.placed))) for j in res.started)
        for victim, pods, action, preemptor in res.evictions:
            out.evictions.setdefault(now, []).append(
                (victim.name, ACTIONS.get(action, action), preemptor.name if preemptor else "", len(pods)))
        for job, old, new in res.resized:
            if job not in res.started:
                out.resizes.setdefault(now, []).append((job.name, old, new))
        return res

    sim.sched.cycle = recording  # type: ignore[method-assign]
    result = sim.run()
    assert result.metrics["finished_jobs"] == len(trace), result.unfinished
    return out, sim


# ------------------------------------------------------------------------------------------------ live
def job_of(key: str) -> str:
    """``default/j07-r1-0`` or ``default/j07`` (a PodGroup) -> ``j07``."""
    return key.split("/", 1)[1].split("-r", 1)[0]


class LiveReplay:
    """The trace on the live driver: pods created, finished and re-created as the trace and evictions say."""

    def __init__(self, sc: Scenario, trace: list[JobSpec]) -> None:
        self.trace = {j.job_id: j for j in trace}
        self.c = Cluster([node(f"n{i}", GPN) for i in range(sc.nodes)], sc.queues(), **sc.overrides())
        self.attempt: dict[str, int] = {}
        self.keys: dict[str, list[str]] = {}  # job -> pod keys of its current attempt
        self.started_at: dict[str, float] = {}  # running jobs: when the current run began
        self.done: dict[str, float] = {j.job_id: 0.0 for j in trace}  # work done before the current run
        self.finished: set[str] = set()
        self.placed: set[str] = set()  # pod keys whose placement was recorded
        self.out = Decisions()

    def finish_at(self, job: str) -> float:
        return self.started_at[job] + max(0.0, self.trace[job].duration - self.done[job])

    def create(self, job: str, t: float) -> None:
        spec = self.trace[job]
        n, g = split_gpus(spec.num_gpu, GPN)
        a = self.attempt[job] = self.attempt.get(job, -1) + 1
        group = job  # every job has its PodGroup (KAI's pod grouper and Volcano make one per workload)
        if a == 0:
            self.c.add_group(pod_group(group, n))
        pods = []
        for i in range(n):
            # a re-created pod is created when its controller makes it: at the eviction
            p = pod(f"{job}-r{a}-{i}", g, queue=spec.queue, group=group, priority=spec.priority,
                    created=spec.submit_time if a == 0 else t)
            p["spec"]["containers"][0]["resources"]["requests"]["cpu"] = str(g)  # JobSimConfig.cpu_per_gpu=1000
            pods.append(p)
        self.keys[job] = [f"default/{p['metadata']['name']}" for p in pods]
        self.c.add(*pods)

    def cycle(self, t: float) -> list[str]:
        """One cycle at ``t``; returns the jobs evicted."""
        plan = self.c.cycle()
        evicted: list[str] = []
        for pre in plan.preemptions:
            per_job: dict[str, int] = {}
            for key, _uid in pre.victims:
                per_job[job_of(key)] = per_job.get(job_of(key), 0) + 1
            for job, pods in per_job.items():
                self.out.evictions.setdefault(t, []).append((job, pre.action, job_of(pre.preemptor) if pre.preemptor
                                                             else "", pods))
                if job in self.started_at:
                    self.done[job] += t - self.started_at.pop(job)
                evicted.append(job)
        starts: dict[str, list[tuple[str, int]]] = {}
        for p in plan.placements:
            if p.node is None or p.pod in self.placed:
                continue
            self.placed.add(p.pod)
            starts.setdefault(job_of(p.pod), []).append((p.node, len(p.gpus)))
        for job, pods in starts.items():
            if job in self.started_at:  # a running job got more pods: elastic growth
                self.out.resizes.setdefault(t, []).append((job, "+", len(pods)))
                continue
            self.started_at[job] = t
            self.out.starts.setdefault(t, []).append((job, tuple(sorted(pods))))
        return evicted

    def run(self, sim_cycles: list[float]) -> Decisions:
        c = self.c
        arrivals = sorted(self.trace.values(), key=lambda j: (j.submit_time, j.job_id))
        ai = 0
        todo = sorted(set(sim_cycles))
        ti = 0
        while True:
            nxt = [todo[ti]] if ti < len(todo) else []
            if ai < len(arrivals):
                nxt.append(arrivals[ai].submit_time)
            nxt += [self.finish_at(j) for j in self.started_at]
            if not nxt:
                break
            t = min(nxt)
            while ti < len(todo) and todo[ti] <= t:
                ti += 1
            c.now = T0 + t
            # as the simulator at one instant: finishes, then arrivals, then one cycle
            for job in sorted(j for j in self.started_at if self.finish_at(j) <= t):
                for key in self.keys[job]:
                    c.finish(key)
                self.done[job] = self.trace[job].duration
                del self.started_at[job]
                self.finished.add(job)
            while ai < len(arrivals) and arrivals[ai].submit_time <= t:
                self.create(arrivals[ai].job_id, t)
                ai += 1
            self.out.cycles.append(t)
            evicted = self.cycle(t)
            if evicted:
                # the evicted jobs' controllers make new pods at once, and the live loop cycles again at once
                # (the victims' deletions and the new pods are events): the nominated preemptors bind, and an
                # evicted job the simulator restarted in the same cycle (the live driver drops such a restart)
                # starts again
                for job in evicted:
                    self.create(job, t)
                assert not self.cycle(t), f"a second cycle at {t:g} evicted again"
        return self.out


# ------------------------------------------------------------------------------------------------ the test
@pytest.mark.parametrize("sc", [
    pytest.param(RICH, id="rich"),
    pytest.param(PACKED, id="packed"),
    pytest.param(BACKDATED, id="backdated"),
    pytest.param(RESTARTED, id="restarted"),
])
def test_simulator_and_live_driver_take_the_same_decisions(sc: Scenario):
    trace = load_trace(sc)
    live = LiveReplay(sc, trace)
    model = live.c.model
    assert model.policy_name == ClusterModel().policy_name
    specs = [r.spec for r in model.nodes.values() if r.spec is not None]
    # the queue tree the live driver builds from the Queue CRs (the 'default' queue of pods that name none too)
    tree = QueueTree([PoolQueueSpec(name=q["metadata"]["name"], quota=float(q["spec"]["quota"]),
                                    weight=float(q["spec"]["weight"])) for q in sc.queues()]
                     + [PoolQueueSpec(name="default")], "Queues")
    sim, simulator = run_simulator(sc, trace, specs, tree, model.policy_name, model.seed)
    got = live.run(sim.cycles)
    # the same inputs
    assert live.c.driver.tree is not None
    assert list(live.c.driver.tree.names) == list(tree.names)
    assert live.c.driver.tree.quota_gpu.tolist() == tree.quota_gpu.tolist()
    assert live.c.driver.config == live_config(**sc.overrides())
    assert model.stats["rebuilds"] == 1
    assert repr(model.engine.policy.inner.model.typical) == repr(DEFAULT_TYPICAL)
    # the scenario exercises what it should
    acts = {e[1] for evs in sim.evictions.values() for e in evs}
    assert {"reclaim", "preempt"} <= acts, acts
    assert any(len(s[1]) > 1 for ss in sim.starts.values() for s in ss), "no multi-pod gang started"
    assert simulator.sched.stats["reservations"] > 0
    want, have = sim.lines(), got.lines()
    if want != have:
        diff = "\n".join(difflib.unified_diff(want, have, "simulator", "live driver", lineterm="", n=2))
        pytest.fail(f"the live driver decided differently from the simulator:\n{diff}")
    assert live.finished == set(live.trace)
    assert sorted(set(got.cycles)) == sorted(set(sim.cycles)), "the live run cycled at other instants"
