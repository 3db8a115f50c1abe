"""Feasibility of the pool scheduler's jobs: whether a job could ever be held (``infeasible_reason``,
``unplaceable_reason``: host resources, static filters, GPU counts), the jobs set aside until the nodes change
(``nodes_changed``), and admission against queue limits and quotas (``_admissible``, free whole GPUs and
slots). A mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler`: its methods read the scheduler's
books, as the actions in :mod:`gpupool.engine.pool.actions` do."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpupool.engine.filters import EffectiveRequest, capacity_fit
from gpupool.engine.pool.job import PoolJob
from gpupool.model import MILLI, InvalidRequestError, PodRequest

__all__ = ["FeasibilityMixin"]

_EPS = 1e-6


class FeasibilityMixin:
    """Feasibility and admission: a mixin of PoolScheduler (see the module docstring)."""

    # ------------------------------------------------------------------ feasibility
    def _pods_per_node(self, job: PoolJob, by_gpu: np.ndarray) -> np.ndarray:
        """(n_nodes,) how many of ``job``'s pods each empty node could hold: ``by_gpu`` capped by CPU and memory."""
        cap = by_gpu
        if job.cpu_per_pod:
            cap = np.minimum(cap, self.state.cpu_cap // job.cpu_per_pod)
        if job.mem_per_pod:
            cap = np.minimum(cap, self.state.mem_cap // job.mem_per_pod)
        return cap

    def _healthy_capacity(self, job: PoolJob) -> np.ndarray:
        """(n_nodes,) how many of ``job``'s pods each node could hold emptied, on its healthy GPUs."""
        return self._pods_per_node(job, self.state.gpu_healthy.sum(axis=1) // max(1, job.gpus_per_pod))

    def infeasible_reason(self, job: PoolJob) -> str:
        """Why ``job`` could never run on this cluster with every GPU healthy and idle ("" if it can): no nodes
        could hold it (:meth:`unplaceable_reason`), or it asks more than a limit (or, non-preemptible, a quota)
        of its queues.

        The answer depends only on the job's shape, pods, queue and priority and on fixed capacities (and the
        nodes' objects: :meth:`nodes_changed`), so it is computed once per distinct combination."""
        key = (job.gpus_per_pod, job.min_pods, job.cpu_per_pod, job.mem_per_pod, job.topology, job.topology_tier,
               job.queue, job.priority, self._class_key(job))
        reason = self._infeasible.get(key)
        if reason is None:
            reason = self._infeasible[key] = self._infeasible_reason(job)
        return reason

    def _infeasible_reason(self, job: PoolJob) -> str:
        """:meth:`infeasible_reason`, not remembered (its node part is)."""
        return self.unplaceable_reason(job) or self._queue_infeasible(job)

    def unplaceable_reason(self, job: PoolJob) -> str:
        """Why no nodes of this cluster could ever hold ``job``'s minimum, whatever runs there ("" if some could):
        more pods than the nodes could hold emptied, a pod that no node takes for a reason that does not change
        with load (host CPU or memory above any node's, a node selector, affinity, taint or GPU model that no
        node matches, more GPUs than any node has of the model asked: the placement policy's ``static`` filters,
        :func:`~gpupool.engine.filters.capacity_fit`), or a required topology no domain can hold. Such a job
        waits out of its queue's order (:attr:`unschedulable`) until :meth:`nodes_changed`; one merely too big
        for the free capacity waits in order. Computed once per job shape and pod classes."""
        key = (job.gpus_per_pod, job.min_pods, job.cpu_per_pod, job.mem_per_pod, job.topology, job.topology_tier,
               self._class_key(job))
        reason = self._unplaceable.get(key)
        if reason is None:
            reason = self._unplaceable[key] = self._unplaceable_reason(job)
        return reason

    def _pod_classes(self, job: PoolJob) -> tuple[EffectiveRequest, ...]:
        """The distinct requests (as the placement policy sees them) of the pods ``job`` needs at least: its first
        ``min_pods`` (those placed first), or, before its pods are made, the one they would all be. Kept on the job
        once its pods exist."""
        if job.pod_classes:
            return job.pod_classes
        pods: Sequence[PodRequest] = job.pods[:job.min_pods]
        if not pods:  # a job asked about before submit (its pods not made yet): its pods' common request
            try:
                pods = [PodRequest(f"{job.name}/0", cpu_milli=job.cpu_per_pod, memory_mib=job.mem_per_pod,
                                   num_gpu=job.gpus_per_pod, gpu_milli=MILLI if job.gpus_per_pod else 0,
                                   priority=job.priority)]
            except InvalidRequestError:  # beyond any pod's bounds: the capacity test says no node holds it
                return ()
        effective = self.picker.effective
        classes: dict[tuple, EffectiveRequest] = {}
        for p in pods:
            eff = effective(p)
            classes.setdefault(eff.key(), eff)
        out = tuple(classes.values())
        if job.pods:
            job.pod_classes = out
        return out

    def static_fit(self, job: PoolJob) -> np.ndarray:
        """(n_nodes,) int64, read-only: an upper bound of the pods of ``job`` each node could hold emptied, by what
        does not change with load (:func:`~gpupool.engine.filters.capacity_fit` of each of its pod classes, the
        largest): 0 on a node none of its pods may use (a selector, a taint, a GPU model). Kept per pod classes
        until :meth:`nodes_changed`."""
        key = self._class_key(job)
        fit = self._static_fit.get(key)
        if fit is None:
            fit = np.full(self.state.n_nodes, 1 << 30, dtype=np.int64)
            classes = self._pod_classes(job)
            if classes:
                fit = np.max([capacity_fit(self.state, eff, self.picker.filters)[0] for eff in classes], axis=0)
            fit.flags.writeable = False
            self._static_fit[key] = fit
        return fit

    def _class_key(self, job: PoolJob) -> tuple:
        """What the placement policy reads of ``job``'s pods (part of the infeasibility memo keys)."""
        return tuple(eff.key() for eff in self._pod_classes(job))

    def _unplaceable_reason(self, job: PoolJob) -> str:
        st = self.state
        g = job.gpus_per_pod
        n = job.min_pods
        fit: np.ndarray | None = None  # pods per emptied node for any of its pods (an upper bound)
        classes = self._pod_classes(job)
        for eff in classes:
            pods, why = capacity_fit(st, eff, self.picker.filters)
            if why:  # one of the pods it needs fits no node, whatever runs
                return why if len(classes) == 1 else f"pod {eff.requested.name}: {why}"
            fit = pods if fit is None else np.maximum(fit, pods)
        cap = self._pods_per_node(job, (st.gpu_count // g) if g else np.full(st.n_nodes, job.min_pods))
        if int(cap.sum()) < n:
            return (f"needs {n} pod(s) of {g} GPU(s) ({n * g} GPUs); the cluster can hold only "
                    f"{int(cap.sum())} such pod(s) ({st.total_gpus} GPUs in all, at most {int(st.gpu_count.max())} "
                    f"per node)")
        if fit is not None:
            cap = np.minimum(cap, fit)
            if int(cap.sum()) < n:
                return (f"needs {n} pod(s) of {g} GPU(s); the nodes its pods may use can hold only {int(cap.sum())} "
                        "such pod(s)")
        if job.topology == "required" and self.cfg.topology_aware and n > 1 and not self._scopes(job, cap, n):
            return f"no {job.topology_tier} domain can hold {n} pods of {g} GPU(s) (topology required)"
        return ""

    def _queue_infeasible(self, job: PoolJob) -> str:
        n, g = job.min_pods, job.gpus_per_pod
        for a in self.paths[self.tree.leaf_index(job.queue)]:
            if n * g > self.limit_g[a] + _EPS:
                return f"needs {n * g} GPUs, above the limit {self.limit_g[a]:g} of queue {self.tree.names[a]!r}"
            if not job.preemptible and self.quota_g[a] > _EPS and n * g > self.quota_g[a] + _EPS:
                return (f"non-preemptible (priority {job.priority}) job of {n * g} GPUs above the quota "
                        f"{self.quota_g[a]:g} of queue {self.tree.names[a]!r}")
        return ""

    def nodes_changed(self, now: float) -> None:
        """The nodes' objects changed (labels, taints, cordon, Ready: what the placement policy's ``static``
        filters read; capacities make a new state, and a new scheduler): every waiting job's
        :meth:`unplaceable_reason` is taken again. A job set aside that some node could take now goes back to its
        queue, waiting since it first did; a waiting one that no node can take any more is set aside."""
        self._infeasible.clear()
        self._unplaceable.clear()
        self._static_fit.clear()
        self._failed_place = None
        for job in [j for p in self.pending for j in p.jobs]:
            why = self.unplaceable_reason(job)
            if why:
                self._dequeue(job)
                job.reason = why
                self.unschedulable[job.seq] = job
        for job in list(self.unschedulable.values()):
            if not self.unplaceable_reason(job):
                del self.unschedulable[job.seq]
                self._enqueue(job, now, job.pending_since)

    def _admissible(self, job: PoolJob, pods: int) -> bool:
        """Within every limit on the queue's path and, if non-preemptible, within the quota of every queue on
        the path that has one (a queue without a quota, 0, puts no such bound: its non-preemptible work takes
        free capacity)?"""
        need = pods * job.gpus_per_pod
        for a in self.paths[job.q]:
            if self.alloc[a][0] + need > self.limit_g[a] + _EPS:
                return False
            if (not job.preemptible and self.quota_g[a] > _EPS
                    and self.np_alloc[a] + self.np_outside[a] + need > self.quota_g[a] + _EPS):
                return False
        return True

    def _free_whole(self) -> np.ndarray:
        """(n_nodes,) int64, read-only: free whole healthy GPUs per node, kept until a node changes (every change of
        the state's free shares or health moves ``state.changes``)."""
        st = self.state
        memo = self._free_memo
        if memo is not None and memo[0] == st.changes:
            return memo[1]
        free = ((st.gpu_free >= MILLI) & st.gpu_healthy).sum(axis=1)
        free.flags.writeable = False
        self._free_memo = (st.changes, free)
        return free

    def _free_slots(self) -> np.ndarray:
        """(n_nodes, max_gpus) int: free whole-GPU slots per healthy GPU: 1 for a free GPU, or the free time-slicing
        replicas of a time-sliced one (``slot_milli`` set by the driver)."""
        st = self.state
        if isinstance(self.slot_milli, np.ndarray):
            return np.where(st.gpu_healthy, st.gpu_free // self.slot_milli, 0)
        return ((st.gpu_free >= MILLI) & st.gpu_healthy).astype(np.int64)

    def _admissible_pods(self, job: PoolJob) -> int:
        """Most pods of ``job`` (``min_pods`` to ``n_pods``) that keep its queues within their limits."""
        n = job.n_pods
        while n > job.min_pods and not self._admissible(job, n):
            n -= 1
        return n

