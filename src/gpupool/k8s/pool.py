"""Pool mode of the live scheduler: the pool scheduler (:mod:`gpupool.engine.pool`) runs the cluster.

The job simulator and the live scheduler run the very same :class:`~gpupool.engine.pool.PoolScheduler`
cycle (queue order by fair share, job order, gangs all or nothing, reservation and backfill, reclaim,
preemption, elastic grow and shrink); this module is the Kubernetes driver of it. It feeds the scheduler
from the :class:`~gpupool.k8s.state.ClusterModel` (one :class:`~gpupool.cluster.ClusterState`, one
:class:`~gpupool.engine.core.Engine`, shared) and turns each cycle's decisions into what the live
scheduler carries out:

* a pending pod belongs to a *job*: its PodGroup (scheduler-plugins, Volcano, KAI spellings), else itself;
  a job to a leaf *queue* (``Queue`` CRs; the Kueue, KAI and Volcano queue labels), else the ``default``
  queue. Only pods naming this scheduler join the pool; other pods only take capacity.
* started / grown jobs -> :class:`~gpupool.k8s.snapshot.Placement` (bound by the scheduler);
* evictions (reclaim, preemption, elastic shrink, consolidation) ->
  :class:`~gpupool.k8s.snapshot.Preemption`, one per preemptor, carried out through the Eviction API;
* a placement on a node where victims are still terminating is *nominated*
  (``status.nominatedNodeName``) and bound only when they are gone; if they do not go within their grace
  period (plus ``slack_s``), or the API refuses to evict one (a PodDisruptionBudget), the nomination lapses,
  the victims are counted again, the blocked ones are protected for ``protect_s`` and the next cycle
  chooses again.

Truth is the model: each cycle the driver reconciles the scheduler's books with what the model holds
(bound or assumed pods) for every job that changed, so a pod that finished, a binding that failed, or a
pod bound by a previous leader is folded in. Shared-GPU pods (fractions, GPU memory, MIG) are not pool
jobs: they keep the part-1 path (queue limits, no preemption) after the pool's cycle.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupool.cluster import slice_ask
from gpupool.engine.pool import PoolConfig, PoolJob, PoolScheduler, QueueConfigError, QueueTree
from gpupool.engine.pool import QueueSpec as PoolQueueSpec
from gpupool.engine.pool.job import PENDING, RUNNING
from gpupool.k8s import LABEL_NVLINK_DOMAIN, LABEL_RACK, LABEL_SWITCH
from gpupool.k8s.requests import PodInfo, annotations_of, labels_of
from gpupool.model import MILLI, Assignment, PodRequest
from gpupool.policies import make_policy

log = logging.getLogger("gpupool.k8s.pool")

DEFAULT_QUEUE = "default"
"""The leaf queue of pods that name none (created implicitly when no Queue of that name exists)."""

ANN_MAX_MEMBER = "gpupool.io/max-member"
"""PodGroup (or pod) annotation: most pods of an elastic gang that may run (default: every pod it has)."""
ANN_TOPOLOGY = "gpupool.io/topology"
"""PodGroup (or pod) annotation: ``required``, ``preferred`` (default) or ``none``."""
ANN_TOPOLOGY_TIER = "gpupool.io/topology-tier"
"""PodGroup (or pod) annotation: the slowest tier the gang may cross: ``nvlink``, ``node`` or ``switch``."""
ANN_KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
ANN_KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"

_ACTIONS = {"reclaimed": "reclaim", "preempted": "preempt", "consolidated": "consolidate", "shrunk": "shrink"}
EVICTED_BOOKS_S = 3600.0
"""How long (seconds) the books of a job gpupool evicted wait for its controller to re-create its pods."""
_HOSTNAME = "kubernetes.io/hostname"


def live_config(**overrides: Any) -> PoolConfig:
    """The pool configuration for Kubernetes (``overrides``: any :class:`PoolConfig` field).

    Priority then FIFO within a queue (KAI's default job order; ``order="tiresias"`` for 2D-LAS), weighted DRF
    fair share, gang reservation after 600 s of waiting, reclaim and preemption on, elastic grow/shrink on,
    consolidation off (a move restarts the user's pods), minimum runtime 60 s before a pod may be evicted, and
    no restart of a job in the cycle that evicted it (its pods are being deleted; their controller makes new
    ones, which wait as usual).
    """
    base = dict(order="fifo", reserve_after_s=600.0, consolidate=False, min_run_s=60.0, reclaim_min_run_s=60.0,
                fair_share_refresh_s=0.0, restart_evicted=False)
    base.update(overrides)
    return PoolConfig(**base)


def _tier_of_label(label: str) -> str:
    """A node label (KAI / Kueue topology level) -> gpupool's topology tier."""
    if label in (_HOSTNAME, "node"):
        return "node"
    if label in (LABEL_NVLINK_DOMAIN, "nvidia.com/gpu.clique"):
        return "nvlink"
    return "switch"  # rack, switch, block, zone: one leaf switch / rack is the scope gpupool knows


def job_topology(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(mode, tier)`` of a job from its PodGroup (else its first pod): gpupool's annotations
    (:data:`ANN_TOPOLOGY`, :data:`ANN_TOPOLOGY_TIER`), KAI's ``spec.topologyConstraint``
    (``requiredTopologyLevel`` / ``preferredTopologyLevel``, node labels), Volcano's ``spec.networkTopology``
    (``mode: hard|soft``, ``highestTierAllowed``: 1 = NVLink, 2+ = switch), Kueue's pod annotations
    (``podset-required-topology`` / ``podset-preferred-topology``). Default ``("preferred", "switch")``;
    an unreadable value falls back to the default (the gang is still placed)."""
    for obj in (group, pod):
        if not isinstance(obj, Mapping):
            continue
        ann = annotations_of(obj)
        mode = str(ann.get(ANN_TOPOLOGY, "")).strip().lower()
        tier = str(ann.get(ANN_TOPOLOGY_TIER, "")).strip().lower()
        if mode in ("required", "preferred", "none"):
            return mode, tier if tier in ("nvlink", "node", "switch") else "switch"
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        tc = spec.get("topologyConstraint")
        if isinstance(tc, Mapping):
            if tc.get("requiredTopologyLevel"):
                return "required", _tier_of_label(str(tc["requiredTopologyLevel"]))
            if tc.get("preferredTopologyLevel"):
                return "preferred", _tier_of_label(str(tc["preferredTopologyLevel"]))
        nt = spec.get("networkTopology")
        if isinstance(nt, Mapping):
            m = str(nt.get("mode", "hard")).lower()
            try:
                highest = int(nt.get("highestTierAllowed", 2))
            except (TypeError, ValueError):
                highest = 2
            return ("required" if m == "hard" else "preferred"), ("nvlink" if highest <= 1 else "switch")
        if ann.get(ANN_KUEUE_REQUIRED):
            return "required", _tier_of_label(str(ann[ANN_KUEUE_REQUIRED]))
        if ann.get(ANN_KUEUE_PREFERRED):
            return "preferred", _tier_of_label(str(ann[ANN_KUEUE_PREFERRED]))
    return "preferred", "switch"


def max_member(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> int | None:
    """:data:`ANN_MAX_MEMBER` of the PodGroup (else the pod), or None (no cap, or unreadable)."""
    for obj in (group, pod):
        if isinstance(obj, Mapping):
            raw = annotations_of(obj).get(ANN_MAX_MEMBER)
            if raw is not None:
                try:
                    n = int(str(raw).strip())
                except ValueError:
                    return None
                return n if n >= 1 else None
    return None


LABEL_KUEUE_MAX_EXEC = "kueue.x-k8s.io/max-exec-time-seconds"
"""Kueue's maximum execution time of a job (seconds), a label on the job or its pods."""


def run_time_limit(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> float | None:
    """The run-time limit a job declares, in seconds: Kueue's :data:`LABEL_KUEUE_MAX_EXEC` on its PodGroup or
    pod, else the pod's ``spec.activeDeadlineSeconds`` (the limit the kubelet enforces); None when there is
    none or it is not a whole number of seconds >= 1 (the job is then ranked by the learned sizes)."""
    candidates: list[Any] = []
    for obj in (group, pod):
        if isinstance(obj, Mapping):
            candidates.append(labels_of(obj).get(LABEL_KUEUE_MAX_EXEC))
    if isinstance(pod, Mapping) and isinstance(pod.get("spec"), Mapping):
        candidates.append(pod["spec"].get("activeDeadlineSeconds"))
    for raw in candidates:
        if raw is None or isinstance(raw, bool):
            continue
        text = str(raw).strip()
        if text.isdigit() and 1 <= int(text) <= 10**12:  # whole seconds; beyond 30,000 years: a typo, ignored
            return float(int(text))
    return None


def is_whole_gpu(info: PodInfo) -> bool:
    """Does the pod ask whole GPUs (device-plugin units) or none: a pool job? Shared asks (a fraction, GPU
    memory, MIG devices) are not: they keep the part-1 placement path."""
    r = info.request
    if info.mig:
        return False
    return r.num_gpu == 0 or slice_ask(r.gpu_milli, r.gpu_milli, r.gpu_memory_mib)


@dataclass
class _Held:
    """A placement gpupool holds (assumed in the model) but does not bind yet: victims still on its node."""

    node: str
    since: float
    pid: int | None
    job: str = ""  # its job: a gang binds together, when no member's node has victims left (all or nothing)


@dataclass
class _Evicting:
    uid: str
    node: str
    deadline: float
    pid: int
    job: str = ""  # the victim's job: job_of forgets its pods at the eviction, a lapse still protects the job


@dataclass
class _JobInfo:
    """What the driver keeps per job name across cycles and scheduler rebuilds."""

    members: set[str] = field(default_factory=set)
    submit: float = math.nan  # when the job was first seen (its oldest pod's creation): job order, never reset
    restarted: bool = False  # it ran before: its wait counts from its pods' re-creation (an eviction)
    attained: float = 0.0  # GPU-seconds of service before the current run (while it runs: see run_since)
    run_since: float = math.nan  # when its current run began, kept across a scheduler rebuild (nan: none)
    protected_until: float = -math.inf
    spec: tuple = ()
    limit_s: float | None = None  # the run-time limit it declared (seconds), and the largest size estimate
    estimate: float = 0.0  # (GPU-s) it had under that limit: a gang that shrank or lost a finished pod keeps it
    evicted: str = ""  # gpupool evicted it and it has not run since: its identity (job_identity), else ""
    evicted_attained: float = 0.0  # its service (GPU-s) when evicted: what it waits and runs again with on
    # re-created pods (attained stays the service before the evicted run, for a lapse)
    evicted_uids: frozenset = frozenset()  # the uids of the pods evicted: those back (a lapse) ran before
    evicted_at: float = math.nan  # when it was evicted: a lapse or a refusal continues that run from then
    run_uids: frozenset = frozenset()  # the uids of the pods its current run is on (new pods: a new job)


def job_identity(group: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> str:
    """What makes a job the same job when its pods are re-created: its PodGroup object's uid, else the uid of
    its pods' controller (the Job, JobSet, PyTorchJob or StatefulSet that re-creates them); "" when neither is
    known (bare pods: a pod re-applied under the same name is a new job)."""
    meta = group.get("metadata") if isinstance(group, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if isinstance(uid, str) and uid:
        return "podgroup:" + uid
    for obj in pods:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str) and ref["uid"]:
                return "owner:" + ref["uid"]
    return ""


class PoolDriver:
    """Runs :class:`PoolScheduler` over a :class:`~gpupool.k8s.state.ClusterModel` (sets ``model.pool``).

    ``config``: the pool's :class:`PoolConfig` (default :func:`live_config`); ``clock``: wall-clock seconds
    (pod ages, reservations, minimum runtimes); ``slack_s``: how long past its grace period a victim may take
    to go before its preemptor's nomination lapses; ``protect_s``: how long a victim the API refused to evict
    is not chosen again; ``heal_after_s``: how long a GPU stays unhealthy (its node's agent marked it, or
    telemetry shows an XID) before the pods of this scheduler on it are evicted so that their controllers
    re-create them elsewhere (self-healing).
    """

    def __init__(self, model: Any, config: PoolConfig | None = None, default_queue: str = DEFAULT_QUEUE,
                 clock: Callable[[], float] = time.time, slack_s: float = 30.0, protect_s: float = 60.0,
                 heal_after_s: float = 30.0) -> None:
        self.model = model
        self.config = config or live_config()
        self.default_queue = default_queue
        self.clock = clock
        self.slack_s = slack_s
        self.protect_s = protect_s
        self.heal_after_s = heal_after_s
        self._bad_since: dict[tuple[str, int], float] = {}  # (node, GPU) unhealthy since
        self.pool: PoolScheduler | None = None
        self.tree: QueueTree | None = None
        self.tree_error = ""
        self.queue_errors: dict[str, str] = {}  # queues left out of the pool's tree -> why
        self.hetero: set[str] = set()  # gangs whose GPU pods differ in size (the part-1 path places them)
        self.riders: dict[str, list[PodInfo]] = {}  # job -> its pending 0-GPU pods (an MPI launcher)
        self._tree_key: tuple | None = None
        self.jobs: dict[str, PoolJob] = {}
        self.info: dict[str, _JobInfo] = {}
        self.job_of: dict[str, str] = {}  # pod key -> job name
        self.held: dict[str, _Held] = {}
        self.evicting: dict[str, _Evicting] = {}
        self._pid = 0
        self._pending_names: set[str] = set()
        self._denominated: list[str] = []  # nominations that lapsed between cycles (reported with the next plan)
        self._before: tuple[list[float], list[float]] = ([], [])  # (GPUs held, fair share) per queue, cycle start
        self._preemptor_of: dict[int, str] = {}  # preemption id -> preemptor job, until its outcome is known
        self.refusals: dict[str, tuple[float, str]] = {}  # job -> (until, why its preemption was refused)
        self.stats = {"resets": 0, "preemptions": 0, "evictions": 0, "lapsed": 0, "refused": 0}
        # books of jobs gpupool evicted, kept until their controller re-creates the pods: job -> (until, books)
        self.evicted_books: dict[str, tuple[float, _JobInfo]] = {}
        model.pool = self

    # ------------------------------------------------------------------ the queue tree
    def _queue_tree(self) -> QueueTree:
        """The pool's queue tree from the Queue CRs. A Queue the pool cannot use (limit below quota, its parent
        missing or unusable, a cycle of parents, children guaranteed more than it) is left out with the reason in
        ``queue_errors``, and so are the queues under it; every other queue keeps working."""
        specs, errors, known = self.model.queue_specs()
        key = (tuple(sorted((n, s) for n, s in specs.items())), self.default_queue)
        if key == self._tree_key and self.tree is not None:
            return self.tree
        bad: dict[str, str] = {}
        pool_specs: dict[str, PoolQueueSpec] = {}
        for name, s in specs.items():
            try:
                pool_specs[name] = PoolQueueSpec(
                    name=s.name, parent=s.parent or None, quota=s.quota_milli / MILLI,
                    limit=None if s.limit_milli is None else s.limit_milli / MILLI, weight=max(s.weight, 1e-9),
                    priority=s.priority)
            except ValueError as exc:  # pydantic's ValidationError is a ValueError
                msg = "; ".join(e.get("msg", "") for e in getattr(exc, "errors", lambda: [])()) or str(exc)
                bad[name] = f"queue {name}: {msg}"
        tree = None
        for _ in range(len(pool_specs) + 2):
            changed = True
            while changed:  # queues under a missing or unusable parent go too
                changed = False
                for name, q in list(pool_specs.items()):
                    if q.parent and q.parent not in pool_specs:
                        why = bad.get(q.parent)
                        bad[name] = (f"queue {name}: its parent {q.parent} is not usable ({why})" if why else
                                     f"queue {name}: parent queue {q.parent} not found")
                        del pool_specs[name]
                        changed = True
            out = list(pool_specs.values())
            if self.default_queue not in pool_specs:
                out.append(PoolQueueSpec(name=self.default_queue))
            try:
                tree = QueueTree(out, "Queues")
                break
            except (QueueConfigError, ValueError) as exc:
                named = [n for n in pool_specs if f"'{n}'" in str(exc)]
                if not named:
                    break
                bad[named[0]] = str(exc).removeprefix("Queues: ")
                del pool_specs[named[0]]
        if tree is None:
            tree = QueueTree([PoolQueueSpec(name=self.default_queue)])
        self._tree_key = key
        self.queue_errors = bad
        self.tree_error = "; ".join(bad.values())
        if bad:
            log.warning("queues left out of the pool", extra={"event": "queue_tree_error", "queues": sorted(bad)})
        self.tree = tree
        return tree

    def _leaf(self, queue: str | None) -> str | None:
        tree = self.tree
        name = queue or self.default_queue
        if self.model.queues is None and not self.model.queues_blocked:
            name = self.default_queue  # no Queue CRD: queue labels name nothing gpupool knows; one pool for all
        if tree is None or name not in tree.index or not tree.is_leaf[tree.index[name]]:
            return None
        return name

    def _queue_problem(self, queue: str | None) -> str:
        """Why pods of ``queue`` cannot be pool jobs (they wait with this reason), "" if they can (or if the
        part-1 path reports the queue itself: not found, unreadable)."""
        tree = self.tree
        if queue is None or tree is None or self._leaf(queue) is not None:
            return ""
        if queue in self.queue_errors:
            return f"{self.queue_errors[queue]}; pods of queue {queue} wait until it is fixed"
        if queue in tree.index and not tree.is_leaf[tree.index[queue]]:
            leaves = [tree.names[c] for c in tree.children[tree.index[queue]]]
            return (f"queue {queue} has child queues ({', '.join(leaves)}); only leaf queues take pods: name one "
                    "of them")
        return ""

    # ------------------------------------------------------------------ rebuild
    def _reset(self, now: float) -> None:
        """A new scheduler over the model's current state (first cycle, a rebuilt state, other Queues): every
        pool pod the model holds is adopted; job memory (attained service, wait, protection) is kept."""
        model = self.model
        self.stats["resets"] += 1
        learned = self.pool.sizes if self.pool is not None else None  # job sizes learned so far stay learned
        self.pool = PoolScheduler(model.state, make_policy(model.policy_name), self.tree, self.config, seed=model.seed,
                                  engine=model.engine, sizes=learned)
        st = model.state
        if (st.gpu_replicas > 1).any():  # a whole-GPU ask takes one replica of a time-sliced GPU
            self.pool.slot_milli = st.slice_milli[:, None]
        ran: dict[str, float] = {}  # running jobs -> their service up to now (for those not re-attached)
        for job in self.jobs.values():
            if job.status == RUNNING:  # its service before this run, and when this run began (re-attached so)
                info = self.info.setdefault(job.name, _JobInfo())
                info.attained, info.run_since = job.attained, job.run_since
                ran[job.name] = job.attained_at(now)
        self.jobs.clear()
        self.job_of.clear()
        for info in self.info.values():
            info.members.clear()
            info.spec = ()
        sizes: dict[str, set[int]] = {}
        for rec in model.pods.values():
            if rec.info is not None and rec.info.pod_group and not rec.terminal and rec.info.request.num_gpu:
                sizes.setdefault(rec.info.pod_group, set()).add(rec.info.request.num_gpu)
        self.hetero = {g for g, n in sizes.items() if len(n) > 1}
        names: set[str] = set()
        for key, rec in model.pods.items():
            if (rec.counted or key in model.assumed) and rec.info is not None:
                name = self._name_of(rec)
                if name is not None:
                    self._register(key, name)
                    names.add(name)
        # a job gpupool evicted whose pods all left the count (evicting, or gone) has no pod to name it: reconciled
        # too, so that its books go to evicted_books (identity-checked and expiring) as without the rebuild
        names |= {n for n, i in self.info.items() if i.evicted}
        for name in sorted(names):  # a fixed order: job numbers (tie-breaks among equal victims) do not vary
            self._reconcile(name, None, now)
        for name, total in ran.items():  # its pods went before the rebuild: that run ended, nothing re-attached it
            info = self.info.get(name)
            if info is not None and math.isfinite(info.run_since):
                info.attained, info.run_since = total, math.nan
                if not info.members and not info.evicted:  # none of its pods is left: it ended, as a cycle finds
                    del self.info[name]  # without the rebuild (pods waiting under its name are a new job)
        self._pending_names = set()

    def _register(self, key: str, name: str) -> None:
        """Pod ``key`` is a member of job ``name``."""
        self.info.setdefault(name, _JobInfo()).members.add(key)
        self.job_of[key] = name

    def _name_of(self, rec: Any) -> str | None:
        """Job name of a pod record if it is a pool pod (ours, whole GPUs, in a leaf queue), else None."""
        info = rec.info
        if info is None or not is_whole_gpu(info):
            return None
        spec = rec.obj.get("spec") if isinstance(rec.obj.get("spec"), Mapping) else {}
        if (spec.get("schedulerName") or "default-scheduler") != self.model.scheduler_name:
            return None
        if self._leaf(info.queue) is None:
            return None
        if info.pod_group and info.pod_group in self.hetero:
            return None  # a gang of unequal GPU pods: placed and charged by the part-1 path
        return info.pod_group or rec.key

    # ------------------------------------------------------------------ the cycle
    def cycle(self, out: list[Any], units: Sequence[Any]) -> Any:
        """Plan one cycle. ``out``: placements already decided (unreadable pods); ``units``: the pending
        units the model grouped (single pods and gangs with their minMember complete). Returns a
        :class:`~gpupool.k8s.snapshot.Plan` with placements, nominations and preemptions."""
        from gpupool.k8s import snapshot as snap

        model = self.model
        state, engine = model.state, model.engine
        now = self.clock()
        tree = self._queue_tree()
        if self.pool is None or self.pool.state is not state or self.pool.tree is not tree:
            self._reset(now)
        pool = self.pool
        assert pool is not None
        placements: list[Any] = list(out)
        denominated, self._denominated = self._denominated, []
        self._lapse(now, denominated)
        self._expire_evicted_books(now)
        pool.resync_free()

        # which units are pool jobs; the rest keep the part-1 path
        book = model.queue_book()
        pool_units: dict[str, Any] = {}
        legacy: list[Any] = []
        repair: list[Any] = []
        for unit in units:
            queues = {info.queue for _, info in unit.members}
            why = self._queue_problem(next(iter(queues))) if len(queues) == 1 and not book.blocked else ""
            if why:
                placements.extend(snap.Placement(i.key, None, reason=why, gang=unit.gang) for _, i in unit.members)
                continue
            name = self._unit_job(unit, book)
            if name is None:
                legacy.append(unit)
                continue
            held = self._held_keys(name)
            if unit.gang is not None and held and unit.need > 0:
                repair.append(unit)  # a gang that lost members below its minimum gets them back first
                continue
            pool_units[name] = unit
        touched = set(pool_units) | (self._pending_names - set(pool_units))
        for key in model.count_log:
            name = self.job_of.get(key)
            if name is None:
                rec = model.pods.get(key)
                if rec is not None:
                    name = self._name_of(rec)
                    if name is not None:
                        self._register(key, name)
            if name is not None:
                touched.add(name)
        model.count_log.clear()
        for name in sorted(touched):
            self._reconcile(name, pool_units.get(name), now)
        self._pending_names = set(pool_units)

        healing = self._heal(now)
        pool.fair_share(now)
        self._before = ([a[0] for a in pool.alloc], list(pool._fs_g))  # queue figures as the cycle found them
        res = pool.cycle(now)
        preemptions = healing + self._carry_out(res, now, placements)
        # the part-1 path for shared-GPU pods and gang repairs, after the pool
        elig = model.elig
        busy = self._evicting_nodes()  # nodes where preempted pods still terminate (no change below)
        for unit in sorted(repair, key=snap._Unit.order) + sorted(legacy, key=snap._Unit.order):
            for _, pi in unit.members:
                if pi.mig and elig is not None:  # MIG devices being placed count against the node's devices
                    elig.pending_mig[pi.key] = pi.mig
            try:
                placed = snap._place_unit(unit, engine, engine.policy, book, model.policy_name, state)
            except Exception as exc:  # noqa: BLE001 - a unit that trips the engine fails alone
                log.error("placement failed", exc_info=True)
                placed = [snap.Placement(i.key, None, gang=unit.gang,
                                         reason=f"gpupool could not place this pod: {type(exc).__name__}: {exc}")
                          for _, i in unit.members]
            for p in placed:
                if p.node is None and elig is not None:
                    elig.pending_mig.pop(p.pod, None)
                if p.node is not None:
                    self.model.assume(p.pod, p.node, tuple(p.mig))
                    model.count_log.append(p.pod)  # a repaired gang's pod joins its job's books
                    if p.node in busy:
                        self.held[p.pod] = _Held(p.node, now, None)
                        p = snap.Placement(p.pod, p.node, p.gpus, p.gpu_milli, self._held_reason(p.node),
                                           p.gpu_memory_mib, p.mig, p.gang, nominated=True)
                placements.append(p)
        placements.extend(self._place_riders(now))
        placements.extend(self._held_placements(now))
        decided = {p.pod for p in placements}
        placements.extend(p for p in self._waiting(pool_units, now) if p.pod not in decided)
        book = model.queue_book()
        return snap.Plan(placements, None, model.policy_name, state, book, preemptions=preemptions,
                         denominated=denominated)

    def _unit_job(self, unit: Any, book: Any) -> str | None:
        queues = {info.queue for _, info in unit.members}
        if len(queues) != 1 or book.blocked:
            return None
        queue = next(iter(queues))
        if queue is not None and (queue in book.errors or (book.known and queue not in book.specs)):
            return None  # the part-1 path reports it
        if self._leaf(queue) is None:
            return None
        for _pod, info in unit.members:
            if not is_whole_gpu(info):
                return None
        if unit.gang is not None and len({i.request.num_gpu for _, i in unit.members if i.request.num_gpu}) > 1:
            self.hetero.add(unit.gang)  # unequal GPU pods: all or nothing on the part-1 path, not a pool job
            return None
        if unit.gang is not None:
            self.hetero.discard(unit.gang)
        return unit.gang or unit.members[0][1].key

    # ------------------------------------------------------------------ books
    def _held_keys(self, name: str) -> list[str]:
        model = self.model
        st = model.state
        info = self.info.get(name)
        if info is None or st is None:
            return []
        out = []
        for k in info.members:
            if k in st.assignments and k not in self.evicting:
                rec = model.pods.get(k)
                if rec is not None and (rec.counted or k in model.assumed):
                    out.append(k)
        return out

    def _job(self, name: str, reqs: Sequence[PodRequest], queue: str, n: int, nmin: int, nmax: int,
             group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None, info: _JobInfo,
             limit: float | None) -> PoolJob:
        """The scheduler's job: topology from ``group`` / ``pod``; its books (submission, service, protection)
        from ``info``; its size estimate from the run-time limit it declares (seconds, :func:`run_time_limit`)
        x its GPUs, the largest it had under that limit: an elastic gang that shrank, or lost a pod that
        finished, still has the service of its whole run ahead of it; a new limit starts afresh."""
        mode, tier = job_topology(group, pod)
        g = max((r.num_gpu for r in reqs), default=0)
        if limit is None or not g:
            info.limit_s, info.estimate = None, 0.0
        else:
            if info.limit_s != limit:
                info.limit_s, info.estimate = limit, 0.0
            info.estimate = max(info.estimate, limit * g * n)
        job = PoolJob(name=name, queue=queue, gpus_per_pod=g, n_pods=n, submit_time=info.submit,
                      priority=max((r.priority for r in reqs), default=0),
                      cpu_per_pod=max((r.cpu_milli for r in reqs), default=0),
                      mem_per_pod=max((r.memory_mib for r in reqs), default=0),
                      min_pods=nmin, max_pods=nmax, topology=mode, topology_tier=tier,
                      size_estimate=info.estimate if info.limit_s is not None else None)
        job.attained = info.evicted_attained if info.evicted else info.attained
        job.protected_until = info.protected_until
        job.pods = list(reqs)
        return job

    def _group_obj(self, gkey: str | None) -> Mapping[str, Any] | None:
        if gkey is None:
            return None
        for store in self.model.pod_groups.values():
            obj = store.get(gkey)
            if obj is not None:
                return obj
        return None

    def _reconcile(self, name: str, unit: Any, now: float) -> None:
        """Make the scheduler's view of job ``name`` match the model: held pods running, pending pods waiting."""
        pool = self.pool
        model = self.model
        assert pool is not None
        st = model.state
        if unit is not None and name not in self.info and name in self.evicted_books:
            self._restore_books(name, unit, now)
        elif unit is not None and (old := self.info.get(name)) is not None and old.evicted and \
                not self._held_keys(name) and \
                self._identity(name, [obj for obj, _ in unit.members]) != old.evicted:
            del self.info[name]  # a new job under the name of one gpupool evicted, before its books were put away
        if unit is not None:
            for _, pi in unit.members:
                self._register(pi.key, name)
        info = self.info.setdefault(name, _JobInfo())
        held_keys = self._held_keys(name)
        job = self.jobs.get(name)
        gkey = name if (unit is not None and unit.gang is not None) else None
        if gkey is None:
            for k in held_keys:
                rec = model.pods.get(k)
                if rec is not None and rec.info is not None and rec.info.pod_group:
                    gkey = rec.info.pod_group
                    break
        group = self._group_obj(gkey)
        groups, _ = model.group_sizes()
        min_member = groups.get(gkey, 1) if gkey else 1
        if gkey and gkey not in groups:
            declared = [model.pods[k].info.min_member for k in held_keys if model.pods[k].info.min_member]
            declared += [pi.min_member for _, pi in (unit.members if unit else []) if pi.min_member]
            min_member = max(declared) if declared else 1
        first_pod = unit.members[0][0] if unit is not None else None
        cap = max_member(group, first_pod)
        pending = [pi for _, pi in unit.members] if unit is not None else []
        pending = [pi for pi in pending if pi.key not in held_keys]
        # 0-GPU members of a gang with GPU pods (an MPI launcher) ride along: the job is its GPU pods, the riders
        # count toward minMember and are placed once the GPU pods run
        gpu = any(model.pods[k].info.request.num_gpu for k in held_keys) or any(pi.request.num_gpu for pi in pending)
        if gpu and gkey:
            riders_held = [k for k in held_keys if not model.pods[k].info.request.num_gpu]
            riders = [pi for pi in pending if not pi.request.num_gpu]
            held_keys = [k for k in held_keys if model.pods[k].info.request.num_gpu]
            pending = [pi for pi in pending if pi.request.num_gpu]
            n_riders = len(riders_held) + len(riders)
            if n_riders:
                min_member = max(1, min_member - n_riders)
            if riders:
                self.riders[name] = riders
            else:
                self.riders.pop(name, None)
        else:
            self.riders.pop(name, None)
        # ---- the running part
        if job is not None and job.status == RUNNING:
            now_placed = {a.pod: a for a in job.placed}
            same = set(now_placed) == set(held_keys) and all(st.assignments[k] is now_placed[k] for k in held_keys)
            if not same:
                # every GPU pod gone and none waiting: the job left (its pods completed, or their owner deleted
                # them); gpupool's own evictions requeue it elsewhere. Its service is a job size to learn from.
                # A 0-GPU launcher that outlives its workers (an MPIJob gathering results) holds no GPU service;
                # a job of 0-GPU pods has no GPU size at all
                def gpu_pod(k: str) -> bool:
                    r = model.pods.get(k)
                    return r is not None and r.info is not None and r.info.request.num_gpu > 0

                left = bool(job.gpus_per_pod) and not any(map(gpu_pod, held_keys)) and not any(
                    pi.request.num_gpu for pi in pending) and all(  # a lapsed nomination's pods are only forgotten
                    (r := model.pods.get(k)) is None or r.terminal or not gpu_pod(k) for k in info.members)
                pool.detach(job, now, requeue=False, finished=left)
                if not info.evicted:  # (marked: only its 0-GPU launcher ran, the books are evicted_attained)
                    info.attained = job.attained  # its service up to now, this run included
                self.jobs.pop(name, None)
                job = None
                if not held_keys and not info.evicted and pending and not (
                        {model.pods[pi.key].uid for pi in pending if pi.key in model.pods} & info.run_uids):
                    # every pod it ran on is gone (not evicted by gpupool) and new pods wait under its name: a new
                    # job, as when they come a cycle later
                    self.info[name] = info = _JobInfo(members=info.members)
                if gkey and held_keys and len(held_keys) < min_member and all(k in self.held for k in held_keys):
                    # a gang held whole (none of it bound) lost a member: the rest must not bind below its minimum;
                    # its holds go and it waits whole again
                    for k in held_keys:
                        self._drop_hold(k, self._denominated)
                    held_keys = []
                if held_keys:  # the run goes on from now on the pods held now (as the scheduler's own resize);
                    # marked (its launcher ran alone): _attach tells a lapse from re-created pods
                    job = self._attach(name, held_keys, min_member, cap, pending, info, group, now,
                                       None if info.evicted else now)
            elif pending:
                self._set_growth(job, held_keys, pending, cap)
        elif held_keys:
            if job is not None:  # pending in the scheduler, running in the cluster (a lapsed eviction)
                pool.detach(job, now, requeue=False)
                self.jobs.pop(name, None)
            job = self._attach(name, held_keys, min_member, cap, pending, info, group, now, None)
        if job is not None and job.status == RUNNING:
            return
        # ---- the waiting part
        if not pending:
            if job is not None and job.status == PENDING:
                pool.detach(job, now, requeue=False)
            self.jobs.pop(name, None)
            if not held_keys:
                for k in info.members:
                    if self.job_of.get(k) == name:
                        del self.job_of[k]
                info.members.clear()
                if not self._alive(name):
                    self.info.pop(name, None)
                    if info.evicted:  # evicted by gpupool, every pod gone: its books wait for the pods' return
                        info.spec, info.run_since = (), math.nan  # attained: before the evicted run (a lapse)
                        self.evicted_books[name] = (now + EVICTED_BOOKS_S, info)
            return
        if gkey and not held_keys and len(pending) < min_member:
            # a gang whose held members lapsed in this cycle: the cycle grouped its units before the lapse, with
            # those members assumed, so the unit holds only the others; the job is all its waiting GPU pods (it
            # must not start below its minimum)
            have = {pi.key for pi in pending}
            pending = pending + [r.info for k in sorted(info.members) if k not in have
                                 and (r := model.pods.get(k)) is not None and r.info is not None and not r.terminal
                                 and not r.counted and k not in model.assumed and r.info.request.num_gpu]
        created = [pi.request.creation_time for pi in pending if pi.request.creation_time]
        if math.isnan(info.submit):
            info.submit = min(created) if created else now
        # the wait (reservations) counts from when it began waiting: submission, or the re-creation of its pods
        # after an eviction, as the job simulator counts it from the requeue
        waiting_since = (max(created) if created else now) if info.restarted else info.submit
        n = len(pending) if cap is None else min(len(pending), cap)
        nmin = min(max(1, min_member if gkey else 1), n)
        queue = self._leaf(pending[0].queue) or self.default_queue
        reqs = sorted((pi.request for pi in pending), key=lambda r: (-r.priority, r.creation_time or 0.0, r.name))
        limit = run_time_limit(group, first_pod)
        spec = (tuple(r.name for r in reqs), nmin, n, queue, tuple(r.priority for r in reqs), gkey and repr(group),
                limit)
        if job is not None and job.status == PENDING and info.spec == spec:
            return
        if job is not None and job.status == PENDING:
            pool.detach(job, now, requeue=False)
        job = self._job(name, reqs, queue, n, nmin, n, group, first_pod, info, limit)  # order: priority, submission
        info.spec = spec
        pool.submit(job, now, waiting_since if math.isfinite(waiting_since) else None)
        self.jobs[name] = job

    def _place_riders(self, now: float) -> list[Any]:
        """Place the 0-GPU members of gangs whose GPU pods run (an MPI launcher), one by one."""
        from gpupool.k8s import snapshot as snap

        model = self.model
        engine = model.engine
        out = []
        busy = self._evicting_nodes()
        for name, riders in list(self.riders.items()):
            job = self.jobs.get(name)
            if job is None or job.status != RUNNING:
                continue
            for pi in riders:
                if pi.key not in model.pending:
                    continue
                d = engine.place(pi.request)
                if d.assignment is None:
                    out.append(snap.Placement(pi.key, None, reason=f"gang {name}: its GPU pods run; this pod waits: "
                                              f"{d.reason}", gang=name))
                    continue
                a = d.assignment
                self.model.assume(pi.key, a.node_name)
                self._register(pi.key, name)
                nominated = a.node_name in busy
                if nominated:
                    self.held[pi.key] = _Held(a.node_name, now, None)
                out.append(snap.Placement(pi.key, a.node_name, (), 0,
                                          self._held_reason(a.node_name) if nominated else
                                          f"gang {name}: its GPU pods run; placed on {a.node_name}", gang=name,
                                          nominated=nominated))
            self.riders.pop(name, None)
        return out

    def _alive(self, name: str) -> bool:
        return any(h for h in self.held if self.job_of.get(h) == name)

    def _identity(self, name: str, objs: Sequence[Mapping[str, Any]]) -> str:
        """:func:`job_identity` of job ``name`` from its PodGroup (a gang's name is its PodGroup's key) and pod
        objects ``objs``."""
        return job_identity(self._group_obj(name), objs)

    def _mark_evicted(self, name: str, keys: Sequence[str], attained: float, now: float) -> None:
        """gpupool evicts job ``name`` (pods ``keys``, ``attained`` GPU-s of service): it waits again from its pods'
        re-creation, and its books are marked for their return (:meth:`_restore_books`) or a lapse (:meth:`_attach`)."""
        info = self.info.setdefault(name, _JobInfo())
        info.restarted = True
        objs = [rec.obj for k in keys if (rec := self.model.pods.get(k)) is not None]
        info.evicted, info.evicted_attained, info.evicted_at = self._identity(name, objs), attained, now
        info.evicted_uids = frozenset(r.uid for k in keys if (r := self.model.pods.get(k)) is not None)

    def _drop_hold(self, key: str, denominated: list[str]) -> None:
        """Held placement ``key`` lapses: the pod is forgotten (pending again) and its nomination withdrawn."""
        del self.held[key]
        self.model.forget(key)
        self.model.count_log.append(key)
        denominated.append(key)

    def _restore_books(self, name: str, unit: Any, now: float) -> None:
        """Job ``name`` waits again with no books: if gpupool evicted it (within :data:`EVICTED_BOOKS_S`) and its
        re-created pods are the same job (:func:`job_identity`), it gets its books back: its submission and the
        service it had, as a requeued job in the job simulator. A new job under the same name starts afresh."""
        until, info = self.evicted_books.pop(name)
        if now > until or not info.evicted:
            return
        if self._identity(name, [obj for obj, _ in unit.members]) == info.evicted:
            self.info[name] = info  # marked until it runs: it waits with evicted_attained (see _job, _attach)

    def _expire_evicted_books(self, now: float) -> None:
        for name in [n for n, (until, _) in self.evicted_books.items() if now > until]:
            del self.evicted_books[name]

    def _attach(self, name: str, held_keys: Sequence[str], min_member: int, cap: int | None,
                pending: Sequence[PodInfo], info: _JobInfo, group: Mapping[str, Any] | None, now: float,
                run_since: float | None) -> PoolJob:
        pool = self.pool
        model = self.model
        assert pool is not None
        st = model.state
        placed = [st.assignments[k] for k in sorted(held_keys)]
        reqs = [model.pods[k].info.request for k in sorted(held_keys)]
        h = len(placed)
        queue = self._leaf(model.pods[held_keys[0]].info.queue) or self.default_queue
        extra = [pi.request for pi in pending]
        nmax = h + len(extra) if cap is None else max(h, min(cap, h + len(extra)))
        if info.evicted and any(model.pods[k].info.request.num_gpu for k in held_keys):
            # it runs (again). All its evicted pods back and nothing else (a lapse, a refused eviction): the run
            # the eviction ended goes on, from the service and the time of the eviction. Some back (a partial lapse)
            # or with new pods: the service at the eviction, the run from now; re-created pods only: the run from
            # their start (below)
            back = {model.pods[k].uid for k in held_keys} & info.evicted_uids
            if not back or back != info.evicted_uids or len(back) != len(held_keys):
                info.attained = info.evicted_attained
                if back and run_since is None:
                    run_since = now
            elif run_since is None and math.isfinite(info.evicted_at):  # (not from its pods' start: a resize
                # before the eviction booked part of that run in attained already)
                info.attained, run_since = info.evicted_attained, info.evicted_at
            info.evicted, info.evicted_uids = "", frozenset()
        if math.isnan(info.submit):
            created = [t for k in held_keys if (t := model.pods[k].info.request.creation_time) is not None]
            info.submit = min(created) if created else now
        job = self._job(name, reqs + extra, queue, h, min(min_member, h), nmax, group, None, info,
                        run_time_limit(group, model.pods[held_keys[0]].obj))
        if run_since is None and math.isfinite(info.run_since):  # a rebuilt scheduler: the run it had
            run_since = info.run_since
        if all(k in self.held for k in held_keys):  # held whole (none of its pods bound): begins when it binds,
            run_since = math.inf  # also when re-attached after a held member went
        info.run_since = math.nan
        info.run_uids = frozenset(model.pods[k].uid for k in held_keys)
        if run_since is None:  # when its pods started running (status.startTime), else when they were created
            times = [_started_at(model.pods[k].obj) or model.pods[k].info.request.creation_time for k in held_keys]
            run_since = now if any(t is None for t in times) else max(t for t in times if t is not None)
            run_since = min(now, run_since)
        pool.attach(job, placed, now, run_since=run_since)
        self.jobs[name] = job
        info.spec = ()
        return job

    def _set_growth(self, job: PoolJob, held_keys: Sequence[str], pending: Sequence[PodInfo], cap: int | None) -> None:
        """A running elastic job's pending pods: what it may grow into (when nothing else waits)."""
        reqs = {r.name: r for r in job.pods}
        placed = [reqs[a.pod] if a.pod in reqs else self.model.pods[a.pod].info.request for a in job.placed]
        extra = [pi.request for pi in pending]
        job.pods = placed + extra
        h = len(placed)
        job.max_pods = h + len(extra) if cap is None else max(h, min(cap, h + len(extra)))
        if job.elastic:
            self.pool.elastic_running[job.seq] = job  # type: ignore[union-attr]

    # ------------------------------------------------------------------ decisions -> Kubernetes
    def _evicting_nodes(self) -> Counter:
        return Counter(e.node for e in self.evicting.values())

    def _held_reason(self, node: str) -> str:
        n = sum(1 for e in self.evicting.values() if e.node == node)
        return f"nominated to node {node}: waiting for {n} preempted pod(s) to terminate there"

    def _carry_out(self, res: Any, now: float, placements: list[Any]) -> list[Any]:
        from gpupool.k8s import snapshot as snap

        pool = self.pool
        model = self.model
        assert pool is not None
        st = model.state
        # a victim the scheduler placed again in this very cycle (a consolidation move, or a restart) runs its
        # pods under the names of the pods being evicted: on Kubernetes its controller makes new pods, which
        # wait as usual; the new placement is dropped
        victims = {id(v) for v, _, action, _ in res.evictions if action != "shrunk"}
        moved = {id(j) for j in res.started if id(j) in victims}
        for job in res.started:
            if id(job) in moved:
                for a in list(job.placed):
                    if a.pod in st.assignments:
                        model.engine.release(a.pod)
                pool.detach(job, now, requeue=False)
                self.jobs.pop(job.name, None)
        # evictions first: victims leave the books (their devices are already free in the state)
        groups: dict[int, Any] = {}
        by_preemptor: dict[str, Any] = {}
        for victim, pods, action, preemptor in res.evictions:
            if action != "shrunk":  # it waits again: from when its pods are re-created, as from a requeue
                self._mark_evicted(victim.name, [a.pod for a in pods], victim.attained, now)
            pname = preemptor.name if preemptor is not None else ""
            act = _ACTIONS.get(action, action)
            pre = by_preemptor.get(pname + "|" + act)
            if pre is None:
                self._pid += 1
                pre = snap.Preemption(self._pid, act, pname, self._message(act, victim, preemptor), [],
                                      grace_s=0.0)
                by_preemptor[pname + "|" + act] = pre
                groups[pre.id] = pre
            for a in pods:
                rec = model.pods.get(a.pod)
                if rec is None:
                    continue
                grace = _grace_s(rec.obj)
                pre.grace_s = max(pre.grace_s, grace)
                pre.victims.append((a.pod, rec.uid))
                self.evicting[a.pod] = _Evicting(rec.uid, a.node_name, now + grace + self.slack_s, pre.id,
                                                 victim.name)
                model.release_evicted(a.pod)
                model.count_log.append(a.pod)
                self.stats["evictions"] += 1
        evicting_nodes = self._evicting_nodes()
        new: list[tuple[PoolJob, list[Assignment]]] = [(j, list(j.placed)) for j in res.started if id(j) not in moved]
        new += [(j, list(j.placed[old:])) for j, old, n in res.resized if n > old]
        for job, pods in new:
            # a job some of whose pods wait for victims is held whole: members on free nodes are not bound before
            # the others (a lapse would leave them running below the gang's minimum)
            busy_nodes = [a.node_name for a in pods if a.node_name in evicting_nodes]
            for a in pods:
                self.model.assume(a.pod, a.node_name)
                rec = model.pods[a.pod]
                self._register(a.pod, job.name)
                if busy_nodes:
                    busy = a.node_name if a.node_name in evicting_nodes else busy_nodes[0]
                    pid = next((e.pid for e in self.evicting.values() if e.node == busy), None)
                    self.held[a.pod] = _Held(a.node_name, now, pid, job.name)
                    reason = (self._held_reason(a.node_name) if a.node_name in evicting_nodes else
                              f"nominated to node {a.node_name}: held with the rest of its job, which waits for "
                              f"preempted pods to terminate on node {busy}")
                    p = snap.Placement(a.pod, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
                                       reason, a.gpu_memory_mib, (), _gang(rec), nominated=True)
                    if pid is not None and pid in groups:
                        groups[pid].nominated.append(p)
                    placements.append(p)
                    continue
                engine = model.engine
                mask = engine.feasible_mask(engine.policy.effective(rec.info.request))  # after the placement
                feasible = int(mask.sum()) + int(not mask[a.node])
                why = (snap._success_reason(model.policy_name, a, feasible, _gang(rec), ()) +
                       f"; queue {pool.tree.names[job.q]}")
                placements.append(snap.Placement(a.pod, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0, why,
                                                 a.gpu_memory_mib, (), _gang(rec)))
            if busy_nodes and job.status == RUNNING and all(a.pod in self.held for a in job.placed):
                job.run_since = math.inf  # held whole while victims terminate: its run begins when it binds
            info = self.info.get(job.name)
            if info is not None:
                info.restarted = True
                info.spec = ()
                info.run_uids = frozenset(r.uid for a in job.placed if (r := model.pods.get(a.pod)) is not None)
                if info.evicted:  # the pool started it again (on re-created pods): its books are the pool job's
                    info.attained, info.evicted, info.evicted_uids = job.attained, "", frozenset()
        # the preemptor of each group: nominated placements of its pods already attached above
        for pre in groups.values():
            self.stats["preemptions"] += 1
            if pre.preemptor:
                self._preemptor_of[pre.id] = pre.preemptor
                if len(self._preemptor_of) > 4096:  # outcomes that never came (a lost leader): forget the oldest
                    del self._preemptor_of[next(iter(self._preemptor_of))]
            if pre.preemptor:
                pj = self.jobs.get(pre.preemptor)
                if pj is not None:
                    for a in pj.placed:
                        h = self.held.get(a.pod)
                        if h is not None and h.pid is None:
                            h.pid = pre.id
        return list(groups.values())

    def _heal(self, now: float) -> list[Any]:
        """Self-healing: pods of this scheduler on a GPU unhealthy for ``heal_after_s`` are evicted (their whole
        job: a gang without one member is no use), one :class:`Preemption` per job, action ``heal``."""
        from gpupool.k8s import snapshot as snap

        model = self.model
        st = model.state
        bad = np.argwhere(st.gpu_exists & ~st.gpu_healthy)
        if not len(bad):
            self._bad_since.clear()
            return []
        seen: set[tuple[str, int]] = set()
        broken: dict[str, list[str]] = {}  # job (or pod) -> why
        for i, g in bad.tolist():
            node = st.node_names[i]
            seen.add((node, g))
            since = self._bad_since.setdefault((node, g), now)
            if now - since < self.heal_after_s:
                continue
            for key in list(model.on_node.get(node, ())) + [k for k, a in model.assumed.items() if a.node == node]:
                a = st.assignments.get(key)
                rec = model.pods.get(key)
                if a is None or rec is None or g not in a.gpus or key in self.evicting:
                    continue
                spec = rec.obj.get("spec") if isinstance(rec.obj.get("spec"), Mapping) else {}
                if (spec.get("schedulerName") or "default-scheduler") != model.scheduler_name:
                    continue  # another scheduler's pod: its scheduler decides
                name = self.job_of.get(key) or key
                broken.setdefault(name, []).append(f"GPU {g} of node {node} unhealthy for {now - since:.0f}s")
        for k in [k for k in self._bad_since if k not in seen]:
            del self._bad_since[k]
        out = []
        for name, why in sorted(broken.items()):
            job = self.jobs.get(name)
            keys = [name] if job is None else [a.pod for a in job.placed]
            if job is not None and job.status == RUNNING:
                self.pool.detach(job, now, requeue=False)  # type: ignore[union-attr]
                self.jobs.pop(name, None)
                self._mark_evicted(name, keys, job.attained, now)
            self._pid += 1
            pre = snap.Preemption(self._pid, "heal", "", f"gpupool self-healing: {why[0]}; the pod is evicted so "
                                  "that its controller re-creates it on healthy GPUs", [], grace_s=0.0)
            for key in keys:
                rec = model.pods.get(key)
                a = model.state.assignments.get(key)
                if rec is None or a is None:
                    continue
                grace = _grace_s(rec.obj)
                pre.grace_s = max(pre.grace_s, grace)
                pre.victims.append((key, rec.uid))
                self.evicting[key] = _Evicting(rec.uid, a.node_name, now + grace + self.slack_s, pre.id, name)
                if key in model.assumed:
                    model.forget(key)
                else:
                    model.release_evicted(key)  # its devices: the failed one stays unhealthy, the others are free
                model.count_log.append(key)
            if pre.victims:
                log.warning("pods on a failed GPU evicted", extra={"event": "gpu_heal", "job": name, "why": why[0]})
                self.stats["healed"] = self.stats.get("healed", 0) + 1
                out.append(pre)
        return out

    def _message(self, action: str, victim: PoolJob, preemptor: PoolJob | None) -> str:
        pool = self.pool
        assert pool is not None
        tree = pool.tree
        q = tree.names[victim.q]
        if preemptor is None:
            return f"gpupool {action}: job {victim.name} (queue {q}) gives pods back"
        pq = tree.names[preemptor.q]
        alloc, fs = self._before
        if action == "reclaim":
            return (f"reclaimed by {preemptor.name} of queue {pq} (held {alloc[preemptor.q]:g} GPUs, fair share "
                    f"{fs[preemptor.q]:.3g}) from queue {q} (held {alloc[victim.q]:g}, fair share {fs[victim.q]:.3g})")
        if action == "shrink":
            return f"elastic job {victim.name} (queue {q}) gives extra workers back to {preemptor.name}"
        if action == "consolidate":
            return f"moved to make room for {preemptor.name} (queue {pq}): consolidation"
        return (f"preempted by {preemptor.name} (priority {preemptor.priority}) in queue {pq}; victim priority "
                f"{victim.priority}")

    # ------------------------------------------------------------------ nominations
    def _held_placements(self, now: float) -> list[Any]:
        """Held placements whose node, and the nodes of every other held pod of their job, have no terminating
        victim any more: bind now (a gang all together)."""
        from gpupool.k8s import snapshot as snap

        model = self.model
        st = model.state
        busy = self._evicting_nodes()
        # a node where a pod bound by someone else could not be counted in full (its devices overlap what gpupool
        # holds there): another scheduler took the freed GPUs; the held placements there lapse and are planned again
        clash = {r.node for k in model.skipped_pods if (r := model.pods.get(k)) is not None and r.node}
        lapsing = {k for k, h in self.held.items() if h.node in clash and h.node not in busy}
        clashed = {self.held[k].job for k in lapsing if self.held[k].job}  # a member lapses: its job's all do
        waiting = {h.job for h in self.held.values() if h.job and h.node in busy}  # a member still waits
        bound: set[str] = set()
        out = []
        for key, h in list(self.held.items()):
            if key in lapsing or (h.job and h.job in clashed):
                self._drop_hold(key, self._denominated)
                log.info("nomination lapsed: another pod took the GPUs", extra={"event": "nomination_clash",
                                                                                "pod": key, "node": h.node})
                continue
            if h.node in busy or (h.job and h.job in waiting):
                continue
            a = st.assignments.get(key) if st is not None else None
            if a is None or key not in model.assumed:
                del self.held[key]
                continue
            del self.held[key]
            rec = model.pods.get(key)
            out.append(snap.Placement(key, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
                                      f"victims gone from node {a.node_name}: binding", a.gpu_memory_mib, (),
                                      _gang(rec) if rec is not None else None, waited_s=max(0.0, now - h.since)))
            bound.add(h.job)
        for name in bound:  # a job held whole (run_since inf) binds: its run begins now
            job = self.jobs.get(name)
            if (job is not None and job.status == RUNNING and job.run_since == math.inf
                    and not any(h.job == name for h in self.held.values())):
                self.pool.begin_run(job, now)  # type: ignore[union-attr]
        return out

    def is_evicting(self, key: str, uid: str) -> bool:
        """Is pod ``key`` (this ``uid``) a victim being evicted (not counted: its devices went to the preemptor)?"""
        e = self.evicting.get(key)
        return e is not None and e.uid == uid

    def _victim_gone(self, key: str, e: _Evicting) -> bool:
        rec = self.model.pods.get(key)
        return rec is None or rec.uid != e.uid or rec.terminal

    def _lapse(self, now: float, denominated: list[str]) -> None:
        """Victims that went are forgotten; victims past their deadline are counted again and the placements
        waiting for their node lapse."""
        late: list[str] = []
        for key, e in list(self.evicting.items()):
            if self._victim_gone(key, e):
                del self.evicting[key]
            elif now > e.deadline:
                late.append(key)
        if late:
            self.stats["lapsed"] += 1
            log.warning("preempted pods did not terminate in time; nomination lapses",
                        extra={"event": "nomination_lapsed", "pods": late})
            self._restore(late, denominated, protect=True, now=now)

    def _restore(self, victims: Sequence[str], denominated: list[str], protect: bool, now: float) -> None:
        model = self.model
        nodes = {self.evicting[k].node for k in victims if k in self.evicting}
        jobs = {h.job for h in self.held.values() if h.job and h.node in nodes}  # held whole, they lapse whole
        for key, h in list(self.held.items()):
            if h.node in nodes or (h.job and h.job in jobs):
                self._drop_hold(key, denominated)
        for key in victims:
            e = self.evicting.pop(key, None)
            if e is None:
                continue
            rec = model.pods.get(key)
            if rec is not None and rec.uid == e.uid:
                model.recount(key)
                model.count_log.append(key)
                if e.job and e.job not in self.info and e.job in self.evicted_books:
                    self.info[e.job] = self.evicted_books.pop(e.job)[1]  # its books come back with its pods
            if protect:
                self._protect(self.job_of.get(key) or e.job or None, now)

    def preemption_refused(self, pid: int, blocked: dict[str, str]) -> None:
        """The dry run of preemption ``pid`` was refused (see :meth:`ClusterModel.preemption_refused`): its
        victims are counted again at once, the placements waiting for them lapse, the blocked victims are
        protected for ``protect_s``."""
        now = self.clock()
        self.stats["refused"] += 1
        victims = [k for k, e in self.evicting.items() if e.pid == pid]
        jobs = {k: self.evicting[k].job for k in victims}
        preemptor = self._preemptor_of.pop(pid, "")
        if preemptor:
            listed = "; ".join(f"{k}: {w}" for k, w in sorted(blocked.items())[:3])
            self.refusals[preemptor] = (now + self.protect_s, f"eviction of its victims refused ({listed}); "
                                                              "other victims are looked for")
        log.info("preemption refused; choosing again", extra={"event": "preemption_refused", "id": pid,
                                                              "blocked": sorted(blocked)})
        self._restore(victims, self._denominated, protect=False, now=now)
        for key in blocked:
            self._protect(self.job_of.get(key) or jobs.get(key) or None, now)

    def eviction_failed(self, key: str, why: str) -> None:
        """A victim's real eviction failed: it is counted again and the placements waiting for its node lapse."""
        if key in self.evicting:
            log.info("eviction failed", extra={"event": "eviction_failed", "pod": key, "reason": why})
            self._restore([key], self._denominated, protect=True, now=self.clock())

    def _protect(self, name: str | None, now: float) -> None:
        if name is None:
            return
        info = self.info.setdefault(name, _JobInfo())
        info.protected_until = now + self.protect_s
        job = self.jobs.get(name)
        if job is not None:
            job.protected_until = info.protected_until

    # ------------------------------------------------------------------ reasons
    def _waiting(self, pool_units: Mapping[str, Any], now: float) -> list[Any]:
        """A placement (node None, with the reason) for every pending pod of a pool job that did not start."""
        from gpupool.k8s import snapshot as snap

        pool = self.pool
        model = self.model
        assert pool is not None
        out = []
        for name, unit in pool_units.items():
            job = self.jobs.get(name)
            keys = [pi.key for _, pi in unit.members]
            waiting = [k for k in keys if k in model.pending]
            if not waiting:
                continue
            why = self._why(job, unit, now)
            out.extend(snap.Placement(k, None, reason=why, gang=unit.gang) for k in waiting)
        return out

    def _why(self, job: PoolJob | None, unit: Any, now: float) -> str:
        pool = self.pool
        assert pool is not None
        model = self.model
        if job is None:
            return "waiting for the pool scheduler"
        tree = pool.tree
        q = tree.names[job.q]
        if job.status == RUNNING:
            if len(job.placed) >= job.max_pods:
                return f"elastic job {job.name} is at its max-member {job.max_pods}"
            return (f"elastic job {job.name} runs {len(job.placed)} of up to {job.max_pods} pods; it grows into idle "
                    "GPUs when no other job waits")
        if not pool._admissible(job, job.min_pods):
            for a in pool.paths[job.q]:
                need = job.min_pods * job.gpus_per_pod
                if pool.alloc[a][0] + need > pool.limit_g[a] + 1e-6:
                    from gpupool.k8s.snapshot import _gpus

                    return (f"queue {tree.names[a]} would exceed its limit: {_gpus(round(pool.alloc[a][0] * MILLI))} "
                            f"of {_gpus(round(pool.limit_g[a] * MILLI))} GPU in use, {_gpus(round(need * MILLI))} "
                            "more asked")
            return (f"non-preemptible job (priority {job.priority}) waits for room within the quota of queue {q}")
        d = model.engine.schedule(job.pods[0])
        held, share = pool.alloc[job.q][0], pool._fs_g[job.q]
        below = ""
        if held + job.min_pods * job.gpus_per_pod <= share + 1e-6:
            below = (f"; queue {q} holds {held:g} GPUs of its fair share {share:.3g}: GPUs borrowed by other queues "
                     f"are taken back once their pods have run {pool.cfg.reclaim_min_run_s:g} s (min runtime)")
        refused = self.refusals.get(job.name)
        if refused is not None and refused[0] <= now:
            del self.refusals[job.name]
            refused = None
        if d.assignment is None:
            why = f"gang {job.name} cannot be placed together: {d.reason}" if unit.gang is not None else d.reason
            return f"{why}; {refused[1]}" if refused is not None else why + below
        why = pool.infeasible_reason(job)
        if why and job.topology == "required" and "domain" in why:
            tier = job.topology_tier
            if tier in ("switch", "spine") and not (pool.switch >= 0).any():
                why += (f"; no node carries a {LABEL_SWITCH} or {LABEL_RACK} label, so no switch domain exists: label "
                        "the nodes, or make the topology preferred")
            elif tier == "nvlink" and not (pool.multi_dom >= 0).any():
                why += (f"; no two nodes share an NVLink domain ({LABEL_NVLINK_DOMAIN} or nvidia.com/gpu.clique "
                        "labels): label the nodes, or make the topology preferred")
        if why:
            return f"gang {job.name} cannot be placed together: {why}" if unit.gang else f"job {job.name}: {why}"
        r = pool.reservation
        if r is not None and r.job is job:
            return (f"gang {job.name}: nodes reserved for it after {now - job.pending_since:.0f}s of waiting; it "
                    "starts when the pods running there end")
        parts = [f"waiting in queue {q} (holds {pool.alloc[job.q][0]:g} GPUs, fair share {pool._fs_g[job.q]:.3g})"]
        if unit.gang is not None:
            parts.insert(0, f"gang {job.name} cannot be placed together now ({job.min_pods} pod(s) x "
                            f"{job.gpus_per_pod} GPU(s) at once)")
        if r is not None and r.job is not job:
            parts.append(f"nodes are reserved for gang {r.job.name}")
        return "; ".join(parts)

    def mark(self) -> int:
        """A point to :meth:`abort` to (the last preemption id handed out)."""
        return self._pid

    def abort(self, mark: int) -> None:
        """A cycle failed after :meth:`mark`: forget the evictions it decided (none was carried out) and the
        placements it held, and rebuild the scheduler from the cluster at the next cycle."""
        for key in [k for k, e in self.evicting.items() if e.pid > mark]:
            del self.evicting[key]
        self.held = {k: h for k, h in self.held.items() if k in self.model.assumed}
        self.pool = None

    # ------------------------------------------------------------------ views
    def fair_shares(self) -> dict[str, float]:
        """GPUs of fair share per queue name (empty before the first cycle)."""
        return {} if self.pool is None else self.pool.fair_shares_by_name()


def _started_at(pod: Mapping[str, Any]) -> float | None:
    """``status.startTime`` (seconds since the epoch), None when absent or unreadable."""
    from datetime import datetime

    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    raw = status.get("startTime")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _grace_s(pod: Mapping[str, Any]) -> float:
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    raw = spec.get("terminationGracePeriodSeconds", 30)
    try:
        return max(0.0, float(raw))
    except (TypeError, ValueError):
        return 30.0


def _gang(rec: Any) -> str | None:
    return rec.info.pod_group if rec is not None and rec.info is not None else None


__all__ = ["ANN_MAX_MEMBER", "ANN_TOPOLOGY", "ANN_TOPOLOGY_TIER", "DEFAULT_QUEUE", "PoolDriver", "is_whole_gpu",
           "job_topology", "live_config", "max_member"]
