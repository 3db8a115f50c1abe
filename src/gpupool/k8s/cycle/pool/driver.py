"""Pool mode of the live scheduler: the pool scheduler (:mod:`gpupool.engine.pool`) runs the cluster.

The job simulator and the live scheduler run the very same :class:`~gpupool.engine.pool.PoolScheduler`
cycle (queue order by fair share, job order, gangs all or nothing, reservation and backfill, reclaim,
preemption, elastic grow and shrink); this module is the Kubernetes driver of it. It feeds the scheduler
from the :class:`~gpupool.k8s.cache.model.ClusterModel` (one :class:`~gpupool.cluster.ClusterState`, one
:class:`~gpupool.engine.core.Engine`, shared) and turns each cycle's decisions into what the live
scheduler carries out:

* a pending pod belongs to a *job*: its PodGroup (scheduler-plugins, Volcano, KAI spellings), else itself;
  a job to a leaf *queue* (``Queue`` CRs; the Kueue, KAI and Volcano queue labels), else the ``default``
  queue. Only pods naming this scheduler join the pool; other pods only take capacity.
* started / grown jobs -> :class:`~gpupool.k8s.cycle.plan.Placement` (bound by the scheduler);
* evictions (reclaim, preemption, elastic shrink, consolidation) ->
  :class:`~gpupool.k8s.cycle.plan.Preemption`, one per preemptor, carried out through the Eviction API;
* a placement on a node where victims are still terminating is *nominated*
  (``status.nominatedNodeName``) and bound only when they are gone; if they do not go within their grace
  period (plus ``slack_s``), or the API refuses to evict one (a PodDisruptionBudget), the nomination lapses,
  the victims are counted again, the blocked ones are protected for ``protect_s`` and the next cycle
  chooses again.

Truth is the model: each cycle the driver reconciles the scheduler's books with what the model holds
(bound or assumed pods) for every job that changed, so a pod that finished, a binding that failed, or a
pod bound by a previous leader is folded in. Shared-GPU pods (fractions, GPU memory, MIG) are not pool
jobs: they keep the part-1 path (queue limits, no preemption) after the pool's cycle.

:class:`PoolDriver` is this module (records, queue tree, reset, the cycle) plus its mixins: :mod:`.reconcile`
(books), :mod:`.carry_out` (decisions, self-healing), :mod:`.holds` (nominations, lapses) and :mod:`.reasons`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpupool.engine.pool import PoolConfig, PoolJob, PoolScheduler, QueueConfigError, QueueTree
from gpupool.engine.pool import QueueSpec as PoolQueueSpec
from gpupool.engine.pool.job import RUNNING
from gpupool.k8s.cycle.plan import Placement, Plan
from gpupool.k8s.cycle.pool.carry_out import CarryOutMixin
from gpupool.k8s.cycle.pool.holds import HoldsMixin
from gpupool.k8s.cycle.pool.reasons import ReasonsMixin
from gpupool.k8s.cycle.pool.reconcile import ReconcileMixin
from gpupool.k8s.cycle.pool.records import Evicting, Held, JobInfo
from gpupool.k8s.cycle.units import Unit, place_unit
from gpupool.k8s.objects.jobs import is_whole_gpu
from gpupool.k8s.objects.pods import PodInfo
from gpupool.model import MILLI
from gpupool.policies import make_policy

log = logging.getLogger("gpupool.k8s.pool")

DEFAULT_QUEUE = "default"
"""The leaf queue of pods that name none (created implicitly when no Queue of that name exists)."""


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


class PoolDriver(ReconcileMixin, CarryOutMixin, HoldsMixin, ReasonsMixin):
    """Runs :class:`PoolScheduler` over a :class:`~gpupool.k8s.cache.model.ClusterModel` (sets ``model.pool``).

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
        self._nodes_ver: tuple | None = None  # (eligibility book, its node generations) the pool last saw
        self.jobs: dict[str, PoolJob] = {}
        self.info: dict[str, JobInfo] = {}
        self.job_of: dict[str, str] = {}  # pod key -> job name
        self.held: dict[str, Held] = {}
        self.evicting: dict[str, Evicting] = {}
        self.overdue: set[tuple[str, str]] = set()  # (pod, uid) taken as leaving that outlived its deadline
        self._pid = 0
        self._pending_names: set[str] = set()
        self._denominated: list[str] = []  # nominations that lapsed between cycles (reported with the next plan)
        self._before: tuple[list[float], list[float]] = ([], [])  # (GPUs held, fair share) per queue, cycle start
        self._preemptor_of: dict[int, str] = {}  # preemption id -> preemptor job, until its outcome is known
        self.refusals: dict[str, tuple[float, str]] = {}  # job -> (until, why its preemption was refused)
        self.stats = {"resets": 0, "preemptions": 0, "evictions": 0, "lapsed": 0, "refused": 0}
        # books of jobs gpupool evicted, kept until their controller re-creates the pods: job -> (until, books)
        self.evicted_books: dict[str, tuple[float, JobInfo]] = {}
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
                info = self.info.setdefault(job.name, JobInfo())
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
        self._adopt_leaving()  # victims in flight (a restart, a failover): leaving, not running
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
        self.info.setdefault(name, JobInfo()).members.add(key)
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
        :class:`~gpupool.k8s.cycle.plan.Plan` with placements, nominations and preemptions."""
        model = self.model
        state, engine = model.state, model.engine
        now = self.clock()
        tree = self._queue_tree()
        nodes_ver = (id(model.elig), int(model.elig.gen.sum())) if model.elig is not None else None
        if self.pool is None or self.pool.state is not state or self.pool.tree is not tree:
            self._reset(now)
        elif nodes_ver != self._nodes_ver:  # a node's labels, taints, cordon or Ready changed: what no node could
            self.pool.nodes_changed(now)  # take may fit now, and the other way round
        self._nodes_ver = nodes_ver
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
                placements.extend(Placement(i.key, None, reason=why, gang=unit.gang) for _, i in unit.members)
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
        self._outside_nonpreemptible()
        pool.fair_share(now)
        self._before = ([a[0] for a in pool.alloc], list(pool._fs_g))  # queue figures as the cycle found them
        res = pool.cycle(now)
        preemptions = healing + self._carry_out(res, now, placements)
        # the part-1 path for shared-GPU pods and gang repairs, after the pool
        elig = model.elig
        busy = self._evicting_nodes()  # nodes where preempted pods still terminate (no change below)
        for unit in sorted(repair, key=Unit.order) + sorted(legacy, key=Unit.order):
            for _, pi in unit.members:
                if pi.mig and elig is not None:  # MIG devices being placed count against the node's devices
                    elig.pending_mig[pi.key] = pi.mig
            try:
                placed = place_unit(unit, engine, engine.policy, book, model.policy_name, state)
            except Exception as exc:  # noqa: BLE001 - a unit that trips the engine fails alone
                log.error("placement failed", exc_info=True)
                placed = [Placement(i.key, None, gang=unit.gang,
                                         reason=f"gpupool could not place this pod: {type(exc).__name__}: {exc}")
                          for _, i in unit.members]
            for p in placed:
                if p.node is None and elig is not None:
                    elig.pending_mig.pop(p.pod, None)
                if p.node is not None:
                    self.model.assume(p.pod, p.node, tuple(p.mig))
                    model.count_log.append(p.pod)  # a repaired gang's pod joins its job's books
                    if p.node in busy:
                        self.held[p.pod] = Held(p.node, now, None)
                        p = Placement(p.pod, p.node, p.gpus, p.gpu_milli, self._held_reason(p.node),
                                           p.gpu_memory_mib, p.mig, p.gang, nominated=True)
                placements.append(p)
        placements.extend(self._place_riders(now))
        placements.extend(self._held_placements(now))
        decided = {p.pod for p in placements}
        placements.extend(p for p in self._waiting(pool_units, now) if p.pod not in decided)
        book = model.queue_book()
        return Plan(placements, None, model.policy_name, state, book, preemptions=preemptions,
                         denominated=denominated)

    def _outside_nonpreemptible(self) -> None:
        """Tell the pool the GPUs its queues' non-preemptible shares hold (fractions, GPU memory, MIG: no pool
        jobs, but held to the same quotas), so that a non-preemptible whole-GPU job counts them."""
        pool, npp = self.pool, self.config.nonpreemptible_priority
        assert pool is not None
        held: dict[str, float] = {}
        if npp is not None:
            for queue, milli in self.model.nonpreemptible_shares(npp).items():
                leaf = self._leaf(queue)
                if leaf is not None:
                    held[leaf] = held.get(leaf, 0.0) + milli / MILLI
        pool.set_outside_nonpreemptible(held)

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

    # ------------------------------------------------------------------ views
    def fair_shares(self) -> dict[str, float]:
        """GPUs of fair share per queue name (empty before the first cycle)."""
        return {} if self.pool is None else self.pool.fair_shares_by_name()
