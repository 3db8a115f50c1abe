"""The pool scheduler's decisions carried out as placements and preemptions, and self-healing (a mixin of
:class:`~gpupool.k8s.cycle.pool.driver.PoolDriver`). Imports engine.pool, model, k8s.objects, k8s.snapshot
and the driver's records."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

import numpy as np

from gpupool.engine.pool import PoolJob
from gpupool.engine.pool.job import RUNNING
from gpupool.k8s.cycle.plan import Placement, Preemption
from gpupool.k8s.cycle.pool.records import Evicting, Held
from gpupool.k8s.cycle.units import success_reason
from gpupool.k8s.objects.jobs import gang_of, grace_s
from gpupool.model import Assignment

log = logging.getLogger("gpupool.k8s.pool")
_ACTIONS = {"reclaimed": "reclaim", "preempted": "preempt", "consolidated": "consolidate", "shrunk": "shrink"}


class CarryOutMixin:
    """The decisions part of :class:`PoolDriver` (uses its state)."""

    # ------------------------------------------------------------------ decisions -> Kubernetes
    def _evicting_nodes(self) -> Counter:
        return Counter(e.node for e in self.evicting.values())

    def _held_reason(self, node: str) -> str:
        n = sum(1 for e in self.evicting.values() if e.node == node)
        return f"nominated to node {node}: waiting for {n} preempted pod(s) to terminate there"

    def _carry_out(self, res: Any, now: float, placements: list[Any]) -> list[Any]:
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
                pre = Preemption(self._pid, act, pname, self._message(act, victim, preemptor), [],
                                      grace_s=0.0)
                by_preemptor[pname + "|" + act] = pre
                groups[pre.id] = pre
            for a in pods:
                rec = model.pods.get(a.pod)
                if rec is None:
                    continue
                grace = grace_s(rec.obj)
                pre.grace_s = max(pre.grace_s, grace)
                pre.victims.append((a.pod, rec.uid))
                self.evicting[a.pod] = Evicting(rec.uid, a.node_name, now + grace + self.slack_s, pre.id,
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
                    self.held[a.pod] = Held(a.node_name, now, pid, job.name)
                    reason = (self._held_reason(a.node_name) if a.node_name in evicting_nodes else
                              f"nominated to node {a.node_name}: held with the rest of its job, which waits for "
                              f"preempted pods to terminate on node {busy}")
                    p = Placement(a.pod, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0,
                                       reason, a.gpu_memory_mib, (), gang_of(rec), nominated=True)
                    if pid is not None and pid in groups:
                        groups[pid].nominated.append(p)
                    placements.append(p)
                    continue
                engine = model.engine
                mask = engine.feasible_mask(engine.policy.effective(rec.info.request))  # after the placement
                feasible = int(mask.sum()) + int(not mask[a.node])
                why = (success_reason(model.policy_name, a, feasible, gang_of(rec), ()) +
                       f"; queue {pool.tree.names[job.q]}")
                placements.append(Placement(a.pod, a.node_name, a.gpus, a.gpu_milli if a.gpus else 0, why,
                                                 a.gpu_memory_mib, (), gang_of(rec)))
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
            pre = Preemption(self._pid, "heal", "", f"gpupool self-healing: {why[0]}; the pod is evicted so "
                                  "that its controller re-creates it on healthy GPUs", [], grace_s=0.0)
            for key in keys:
                rec = model.pods.get(key)
                a = model.state.assignments.get(key)
                if rec is None or a is None:
                    continue
                grace = grace_s(rec.obj)
                pre.grace_s = max(pre.grace_s, grace)
                pre.victims.append((key, rec.uid))
                self.evicting[key] = Evicting(rec.uid, a.node_name, now + grace + self.slack_s, pre.id, name)
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
