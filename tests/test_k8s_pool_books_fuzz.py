"""A seeded, randomized property test of the live pool driver's job books (:mod:`gpupool.k8s.pool`): attained
service, the evicted books and their identity check, under evictions (preemption, reclaim, shrink), lapses (a
stuck kubelet), refusals (a PodDisruptionBudget), driver rebuilds, finished and deleted pods, and the return of
evicted jobs under the same or a new identity.

The ground truth is kept outside the driver: GPU-seconds each job *identity* actually ran (its pods bound and in
phase Running, sampled once per 1-second cycle; a victim whose kubelet is stuck runs on). An identity is the job's
name (the driver's key) and what makes it the same job: its PodGroup's uid, its controller's uid, else the bare
pod's own incarnation. After every cycle:

1. no double counting: each job the driver knows has attained at most the GPU-seconds its identity ran (+ TOL);
2. a new job under an old name (a new PodGroup uid, a new controller, a bare pod re-applied) starts with no more
   than TOL GPU-seconds beyond what it ran;
3. ``evicted_books`` holds no entry past its expiry, none promising more than EVICTED_BOOKS_S, none unmarked;
4. the cluster model is sound (``sound``: books balance, no GPU booked twice, every pending pod has a reason);
5. a gang none of whose pods ended or is going never runs below its minMember.

Deterministic: a seed fixes every choice (the driver is deterministic too). A failure prints the seed and the
trace of steps, the start of a minimized test.
"""

from __future__ import annotations

import datetime as _dt
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from gpupool.k8s import pool as pool_mod
from k8s_pool_harness import Cluster, node, pod, pod_group, queue
from test_k8s_pool_breaker import booked

T0 = 1_700_000_000.0
TOL = 5.0  # GPU-seconds of lag allowed (about one cycle of the largest job)
SEEDS = range(30)
CYCLES = 1200  # 1-second cycles per seed (0.2 to 2.5 ms each)
GRACE = 2  # victims' grace period: a stuck one lapses after GRACE + slack_s (30 s)
NOMINATED_RUNS = False  # True: a nominated placement (held while its node's victims terminate) counts as run here
# (the driver booked it so before its run began at the bind; test_k8s_pool_books_fuzz_found.py::
# test_a_nominated_job_is_not_charged_while_its_victim_does_not_go)


def _stamp(t: float) -> str:
    return _dt.datetime.fromtimestamp(t, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeletCluster(Cluster):
    """The harness, with a kubelet that writes ``status.startTime`` when it starts a bound pod."""

    def bind(self, p):  # noqa: ANN001
        super().bind(p)
        self._update(p.pod, lambda o: o["status"].__setitem__("startTime", _stamp(self.now)))


def _sound(c: Cluster) -> None:
    """test_k8s_pool_breaker.sound, except that the pods whose nomination lapsed in this cycle (the plan's
    ``denominated``: they were not pending when the cycle grouped its units) may wait one cycle for a reason."""
    assert c.model.stats.get("pool_errors", 0) == 0, "the pool cycle raised (see log: pool_cycle_failed)"
    c.model.state.check_invariants()
    over = {k: v for k, v in booked(c).items() if v > 1000}
    assert not over, f"GPUs booked twice: {over}"
    plan = c.plans[-1]
    planned = {p.pod for p in plan.placements} | set(plan.denominated)
    lost = [k for k in c.pending() if k not in planned and k not in c.model.assumed]
    assert not lost, f"pending pods with no placement nor reason: {lost}"
    assert all(p.reason for p in plan.placements if p.node is None)


@dataclass
class Slot:
    """One job of the scenario (a gang, a StatefulSet-like owned pod, or a bare pod) across its incarnations."""

    kind: str  # "gang" | "owned" | "bare"
    k: int
    queue: str
    prio: int
    gpus: int
    n: int
    minm: int
    uid: str = ""  # the PodGroup's or the owner's uid (gang / owned)
    gen: int = 0
    group: dict | None = None
    keys: list[str] = field(default_factory=list)  # pod keys of the current incarnation
    renamed: int = 0

    @property
    def name(self) -> str:
        return {"gang": f"default/g{self.k}", "owned": f"default/s{self.k}-0", "bare": f"default/b{self.k}"}[self.kind]


class World:
    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = rng = random.Random(seed)
        nodes = [node(f"n{i}", gpus=rng.randint(2, 4)) for i in range(rng.randint(1, 2))]
        self.total = sum(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes)
        self.max_node = max(int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes)
        nq = rng.randint(1, 2)
        self.queues = ["a", "b"][:nq]
        quotas = [self.total] if nq == 1 else [rng.randint(1, self.total - 1)] * 1
        if nq == 2:
            quotas.append(self.total - quotas[0])
        self.c = KubeletCluster(nodes, [queue(q, quota=quotas[i]) for i, q in enumerate(self.queues)],
                                order="tiresias", promote_knob=0, min_run_s=0.0, reclaim_min_run_s=0.0,
                                thresholds=(rng.choice([50.0, 100.0, 400.0]),))
        self.slots: list[Slot] = []
        self.pod_ident: dict[str, tuple[str, str]] = {}  # pod uid -> (job name, identity)
        self.ident_now: dict[str, tuple[str, str]] = {}  # job name -> its current identity
        self.truth: Counter = Counter()  # identity -> GPU-seconds its pods ran
        self.seen: dict[str, set] = {}  # job name -> identities seen in driver.jobs
        shapes = [n["metadata"]["name"] + ":" + n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes]
        self.trace: list[str] = [f"seed {seed}: nodes {shapes} queues {list(zip(self.queues, quotas, strict=True))}"]
        self.cycles = 0
        self.nodes_added = 0
        self.jumped = False

    # ---- the scenario's objects
    def _make(self, s: Slot, names: list[str]) -> None:
        c = self.c
        t = c.now - T0
        for nm in names:
            p = pod(nm, s.gpus, queue=s.queue, group=f"g{s.k}" if s.kind == "gang" else None, priority=s.prio,
                    created=t, grace=GRACE)
            if s.kind == "owned":
                p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"s{s.k}",
                                                     "uid": s.uid, "controller": True}]
            ident = {"gang": "podgroup:" + s.uid, "owned": "owner:" + s.uid,
                     "bare": "bare:" + p["metadata"]["uid"]}[s.kind]
            self.pod_ident[p["metadata"]["uid"]] = (s.name, ident)
            self.ident_now[s.name] = (s.name, ident)
            c.add(p)

    def _new_group(self, s: Slot) -> None:
        if s.group is not None:
            self.c.model.apply("podgroups", "DELETED", s.group)
        s.gen += 1
        s.uid = f"pg-{s.k}-{s.gen}"
        s.group = pod_group(f"g{s.k}", s.minm)
        s.group["metadata"]["uid"] = s.uid
        self.c.add_group(s.group)

    def submit(self) -> None:
        rng = self.rng
        k = len(self.slots)
        kind = rng.choice(["gang", "gang", "owned", "bare"])
        gpus = rng.randint(1, min(2, self.max_node))
        if kind == "gang":
            minm = rng.randint(1, 2)
            n = min(minm + rng.randint(0, 1), max(1, self.total // gpus))
            minm = min(minm, n)
        else:
            minm = n = 1
        s = Slot(kind, k, rng.choice(self.queues), rng.choice([0, 0, 5, 50]), gpus, n, minm)
        self.slots.append(s)
        if kind == "gang":
            self._new_group(s)
            s.keys = [f"default/g{k}-{i}" for i in range(n)]
        elif kind == "owned":
            s.gen, s.uid = 1, f"sts-{k}-1"
            s.keys = [s.name]
        else:
            s.keys = [s.name]
        self._make(s, [key.split("/")[1] for key in s.keys])
        self.trace.append(f"t={self.c.now - T0:.0f} submit {kind} {s.name} q={s.queue} prio={s.prio} "
                          f"{n}x{gpus} GPU min={minm} uid={s.uid}")

    # ---- views
    def running(self) -> list[str]:
        return [k for k, p in self.c.pods.items() if p["spec"].get("nodeName") and p["status"]["phase"] == "Running"
                and "deletionTimestamp" not in p["metadata"]]

    def evicted_slots(self) -> list[Slot]:
        ev = {k for _, what, k in self.c.log if what.startswith("evicted")}
        return [s for s in self.slots if any(k in ev and k not in self.c.pods for k in s.keys)]

    # ---- steps
    def tally(self, seconds: float) -> None:
        held = self.c.driver.held if NOMINATED_RUNS else {}
        for key, p in self.c.pods.items():
            if (p["spec"].get("nodeName") and p["status"]["phase"] == "Running") or key in held:
                gpus = int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
                self.truth[self.pod_ident[p["metadata"]["uid"]]] += gpus * seconds

    def run(self, seconds: int) -> None:
        self.trace.append(f"t={self.c.now - T0:.0f} run {seconds}")
        for _ in range(seconds):
            self.c.run(1)
            self.cycles += 1
            self.tally(1.0)
            self.check()

    def recreate(self) -> None:
        rng, c = self.rng, self.c
        cands = self.evicted_slots()
        if not cands:
            return
        s = rng.choice(cands)
        present = [k for k in s.keys if k in c.pods]
        missing = [k for k in s.keys if k not in c.pods]
        if s.kind == "gang":
            group_pods = [k for k, p in c.pods.items()
                          if p["metadata"]["labels"].get("scheduling.x-k8s.io/pod-group") == f"g{s.k}"]
            modes = ["same", "renamed"] + (["newuid"] if not group_pods else [])
            mode = rng.choice(modes)
            if mode == "newuid":
                self._new_group(s)
                missing, present = list(s.keys), []
            if mode == "renamed" or (mode == "newuid" and rng.random() < 0.5):
                s.renamed += 1
                missing = [f"{k}r{s.renamed}" for k in missing]
            s.keys = present + missing
            self._make(s, [k.split("/")[1] for k in missing])
            self.trace.append(f"t={c.now - T0:.0f} recreate {s.name} {mode} uid={s.uid} pods={missing}")
            return
        if not missing:
            return
        mode = "same" if s.kind == "bare" else rng.choice(["same", "newuid"])
        if mode == "newuid":
            s.gen += 1
            s.uid = f"sts-{s.k}-{s.gen}"
        self._make(s, [s.name.split("/")[1]])
        self.trace.append(f"t={c.now - T0:.0f} recreate {s.name} {mode} uid={s.uid}")

    def finish(self) -> None:
        run = self.running()
        if run:
            key, phase = self.rng.choice(sorted(run)), self.rng.choice(["Succeeded", "Failed"])
            self.c.finish(key, phase)
            self.trace.append(f"t={self.c.now - T0:.0f} finish {key} {phase}")

    def delete(self) -> None:
        if self.c.pods:
            key = self.rng.choice(sorted(self.c.pods))
            self.c.slow.discard(key)
            self.c.pdb_blocked.discard(key)
            self.c.delete(key)
            self.trace.append(f"t={self.c.now - T0:.0f} delete {key}")

    def slow(self) -> None:
        run = self.running()
        if run:
            key = self.rng.choice(sorted(run))
            self.c.slow.add(key)
            self.trace.append(f"t={self.c.now - T0:.0f} slow {key}")

    def unstick(self) -> None:
        stuck = sorted(k for k, p in self.c.pods.items() if "deletionTimestamp" in p["metadata"])
        if stuck:
            key = self.rng.choice(stuck)
            self.c.slow.discard(key)
            self.c.delete(key)
            self.trace.append(f"t={self.c.now - T0:.0f} unstick {key} (its kubelet lets it go)")

    def pdb(self) -> None:
        run = self.running()
        if run:
            key = self.rng.choice(sorted(run))
            self.c.pdb_blocked ^= {key}
            self.trace.append(f"t={self.c.now - T0:.0f} pdb {key} {'on' if key in self.c.pdb_blocked else 'off'}")

    def rebuild(self) -> None:
        self.nodes_added += 1
        self.c.model.apply("nodes", "ADDED", node(f"x{self.nodes_added}", gpus=0))
        self.trace.append(f"t={self.c.now - T0:.0f} add node x{self.nodes_added} (driver rebuild)")

    def jump(self) -> None:
        if self.jumped:
            return
        self.jumped = True
        self.run(1)  # a cycle sees the last changes first (an idle hour of cycles would change nothing more)
        dt = pool_mod.EVICTED_BOOKS_S + self.rng.randint(1, 20)
        self.tally(dt)  # the running pods run on meanwhile
        self.c.now += dt
        self.trace.append(f"t={self.c.now - T0:.0f} jumped {dt:.0f} s (no cycle)")

    # ---- the invariants
    def check(self) -> None:
        c = self.c
        t = c.now - 1  # the cycle's time
        where = f"seed {self.seed}, t={c.now - T0:.0f}"
        try:  # (4)
            _sound(c)
        except AssertionError as exc:
            raise AssertionError(f"{where}: {exc}\n" + "\n".join(self.trace)) from None
        for name, job in c.driver.jobs.items():
            ident = self.ident_now.get(name)
            assert ident is not None, f"{where}: the driver knows a job {name} no pod of the scenario names"
            got, ran = job.attained_at(c.now), self.truth[ident]
            seen = self.seen.setdefault(name, set())
            if ident not in seen:
                seen.add(ident)
                if len(seen) > 1:  # (2) a new job under an old name
                    assert got <= ran + TOL, (f"{where}: new job {ident} under an old name starts with {got:.0f} "
                                              f"GPU-s, ran {ran:.0f}\n" + "\n".join(self.trace))
            # (1) no double counting
            assert got <= ran + TOL, (f"{where}: {name} ({ident[1]}, {job.status}) attained {got:.0f} GPU-s, "
                                      f"ran {ran:.0f}\n" + "\n".join(self.trace))
        for s in self.slots:  # (5) a gang never runs below its minMember unless members ended or are going
            if s.kind != "gang":
                continue
            pods = [c.pods[k] for k in s.keys if k in c.pods]
            bound = [p for p in pods if p["spec"].get("nodeName") and p["status"]["phase"] in ("Pending", "Running")
                     and "deletionTimestamp" not in p["metadata"]]
            whole = len(pods) == len(s.keys) and not any(
                p["status"]["phase"] in ("Succeeded", "Failed") or "deletionTimestamp" in p["metadata"] for p in pods)
            assert not (bound and whole and len(bound) < s.minm), (
                f"{where}: gang {s.name} (minMember {s.minm}) runs {len(bound)} pod(s)\n" + "\n".join(self.trace))
        for name, (until, info) in c.driver.evicted_books.items():  # (3)
            assert t <= until <= t + pool_mod.EVICTED_BOOKS_S, f"{where}: stale books {name}: until {until - T0}"
            assert info.evicted, f"{where}: unmarked books {name}"

    def play(self) -> None:
        rng = self.rng
        for _ in range(rng.randint(2, 4)):
            self.submit()
        steps = [(self.run, 30), (self.submit, 8), (self.finish, 6), (self.delete, 4), (self.slow, 8),
                 (self.unstick, 4), (self.rebuild, 5), (self.recreate, 20), (self.pdb, 3), (self.jump, 1)]
        fns, weights = zip(*steps, strict=True)
        while self.cycles < CYCLES:
            fn = rng.choices(fns, weights)[0]
            if fn == self.run:
                self.run(rng.choice([1, 1, 2, 3, 5, 8, 13]))
            elif fn == self.submit and len(self.slots) >= 12:
                continue
            else:
                fn()


KNOWN = {1: "known limit: a stuck victim evicted and a refused eviction of another pod of the same gang in one "
              "cycle: the refused pod's run is counted from its start on top of the service at the eviction",
}


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN[s]))
                                  if s in KNOWN else s for s in SEEDS])
def test_pool_books_fuzz(seed: int) -> None:
    World(seed).play()


def test_a_gang_whose_held_members_lapse_does_not_start_below_its_minimum(monkeypatch) -> None:
    # seed 12's first 60 cycles: an elastic gang (3 pods, minMember 2) has two members held on a node whose victims
    # are stuck; the cycle grouped its units before the lapse (the held members assumed), so the unit held only the
    # third pod, and the job was built from it alone (nmin 1) and bound: one pod of a gang of minimum 2 ran
    monkeypatch.setattr(__import__(__name__), "CYCLES", 60)
    World(12).play()
