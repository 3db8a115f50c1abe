"""Why a pool job's pods wait: the reason each pending pod shows (a mixin of
:class:`~gpupool.k8s.cycle.pool.driver.PoolDriver`). Imports engine.pool, model, k8s conventions
and k8s.snapshot."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.engine.pool import PoolJob
from gpupool.engine.pool.job import RUNNING
from gpupool.k8s import LABEL_NVLINK_DOMAIN, LABEL_RACK, LABEL_SWITCH
from gpupool.k8s.cache.queues import gpus
from gpupool.k8s.cycle.plan import Placement
from gpupool.model import MILLI


class ReasonsMixin:
    """The waiting-reasons part of :class:`PoolDriver` (uses its state)."""

    # ------------------------------------------------------------------ reasons
    def _waiting(self, pool_units: Mapping[str, Any], now: float) -> list[Any]:
        """A placement (node None, with the reason) for every pending pod of a pool job that did not start."""
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
            out.extend(Placement(k, None, reason=why, gang=unit.gang) for k in waiting)
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
                    return (f"queue {tree.names[a]} would exceed its limit: {gpus(round(pool.alloc[a][0] * MILLI))} "
                            f"of {gpus(round(pool.limit_g[a] * MILLI))} GPU in use, {gpus(round(need * MILLI))} "
                            "more asked")
            need = job.min_pods * job.gpus_per_pod
            for a in pool.paths[job.q]:
                quota = pool.quota_g[a]
                held = pool.np_alloc[a] + pool.np_outside[a]
                if quota > 1e-6 and held + need > quota + 1e-6:
                    q = tree.names[a]
                    return (f"non-preemptible job (priority {job.priority}, at or above the pool's "
                            f"nonPreemptiblePriority {job.nonpreemptible_from}) runs only within quota: queue {q} "
                            f"holds {round(held, 3):g} of its quota {quota:g} GPU in non-preemptible work, "
                            f"{need:g} more asked")
            return (f"non-preemptible job (priority {job.priority}) waits for room within the quota of queue {q}")
        if job.seq in pool.unschedulable:  # no node can ever take it (kube-scheduler's unschedulable queue)
            why = self._topology_hint(job, job.reason)
            why = f"gang {job.name} cannot be placed together: {why}" if unit.gang is not None else why
            return (f"{why}{' ' if why.endswith('.') else '. '}Set aside from the order of queue {q} (its other pods "
                    "go on) until a node is added or changes.")
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
        why = self._topology_hint(job, pool.infeasible_reason(job))
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

    def _topology_hint(self, job: PoolJob, why: str) -> str:
        """``why`` (an infeasibility reason of ``job``), with how to fix a required topology that no domain can hold
        because the nodes carry no topology labels."""
        pool = self.pool
        assert pool is not None
        if why and job.topology == "required" and "domain" in why:
            tier = job.topology_tier
            if tier in ("switch", "spine") and not (pool.switch >= 0).any():
                why += (f"; no node carries a {LABEL_SWITCH} or {LABEL_RACK} label, so no switch domain exists: label "
                        "the nodes, or make the topology preferred")
            elif tier == "nvlink" and not (pool.multi_dom >= 0).any():
                why += (f"; no two nodes share an NVLink domain ({LABEL_NVLINK_DOMAIN} or nvidia.com/gpu.clique "
                        "labels): label the nodes, or make the topology preferred")
        return why
