"""Nominated (held) placements, lapsed and refused evictions, mark/abort (a mixin of
:class:`~gpupool.k8s.cycle.pool.driver.PoolDriver`). Imports engine.pool, k8s.objects, k8s.snapshot
and the driver's records."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.engine.pool.job import RUNNING
from gpupool.k8s.cycle.plan import Placement
from gpupool.k8s.cycle.pool.records import Evicting, JobInfo
from gpupool.k8s.objects.fields import deletion_time
from gpupool.k8s.objects.jobs import gang_of, grace_s

log = logging.getLogger("gpupool.k8s.pool")


class HoldsMixin:
    """The nominations part of :class:`PoolDriver` (uses its state)."""

    # ------------------------------------------------------------------ nominations
    def _held_placements(self, now: float) -> list[Any]:
        """Held placements whose node, and the nodes of every other held pod of their job, have no terminating
        victim any more: bind now (a gang all together)."""
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
            out.append(Placement(key, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
                                      f"victims gone from node {a.node_name}: binding", a.gpu_memory_mib, (),
                                      gang_of(rec) if rec is not None else None, waited_s=max(0.0, now - h.since)))
            bound.add(h.job)
        for name in bound:  # a job held whole (run_since inf) binds: its run begins now
            job = self.jobs.get(name)
            if (job is not None and job.status == RUNNING and job.run_since == math.inf
                    and not any(h.job == name for h in self.held.values())):
                self.pool.begin_run(job, now)  # type: ignore[union-attr]
        return out

    def leaving(self, rec: Any) -> bool:
        """Is pod record ``rec`` (bound, not finished, being deleted) a pool pod on its way out? Then it is taken
        as a victim in flight (``evicting``), whoever deleted it: a preemption of this leader, of a leader before
        a restart or failover (known from the object alone: its ``deletionTimestamp``, with the
        ``DisruptionTarget`` condition an eviction sets), or its owner. It is not counted (not its queue's usage,
        never chosen as a victim again, so no second eviction for the need that evicted it); its devices are
        freed-soon: a placement there is nominated and bound once it is gone. It must be gone by its
        ``deletionTimestamp`` plus ``slack_s``, else it lapses and is counted again (and not taken as leaving
        again while that uid lives)."""
        e = self.evicting.get(rec.key)
        if e is not None and e.uid == rec.uid:
            return True
        if (rec.key, rec.uid) in self.overdue:
            return False
        name = self._name_of(rec)
        if name is None or not rec.node:
            return False
        now = self.clock()
        at = deletion_time(rec.obj)
        deadline = (now + grace_s(rec.obj) if at is None else at) + self.slack_s
        self.evicting[rec.key] = Evicting(rec.uid, rec.node, deadline, 0, name)
        log.info("pod being deleted taken as leaving", extra={
            "event": "victim_in_flight", "pod": rec.key, "node": rec.node, "job": name,
            "disruption": _disruption_reason(rec.obj), "seconds_left": round(deadline - now, 1)})
        return True

    def _adopt_leaving(self) -> None:
        """A rebuilt driver (first cycle, restart, failover, new state): the pool pods counted while being deleted
        (counted before the queue tree was known) become victims in flight (:meth:`leaving`)."""
        model = self.model
        for key, rec in list(model.pods.items()):
            if rec.counted and not rec.terminal and deletion_time(rec.obj) is not None and self.leaving(rec):
                model.release_evicted(key)

    def is_evicting(self, key: str, uid: str) -> bool:
        """Is pod ``key`` (this ``uid``) a victim being evicted (not counted: its devices went to the preemptor)?"""
        e = self.evicting.get(key)
        return e is not None and e.uid == uid

    def _victim_gone(self, key: str, e: Evicting) -> bool:
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
                self.overdue.add((key, e.uid))
        for key, uid in [o for o in self.overdue if (r := self.model.pods.get(o[0])) is None or r.uid != o[1]]:
            self.overdue.discard((key, uid))
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
        info = self.info.setdefault(name, JobInfo())
        info.protected_until = now + self.protect_s
        job = self.jobs.get(name)
        if job is not None:
            job.protected_until = info.protected_until

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


def _disruption_reason(pod: Any) -> str:
    """The reason of the pod's ``DisruptionTarget=True`` condition (``PreemptionByScheduler``,
    ``EvictionByEvictionAPI``, ...), "" if none: why it is being deleted, for the log."""
    status = pod.get("status") if isinstance(pod, Mapping) else None
    conds = status.get("conditions") if isinstance(status, Mapping) else None
    for cond in conds if isinstance(conds, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return str(cond.get("reason") or "")
    return ""
