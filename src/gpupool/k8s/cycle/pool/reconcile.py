"""The pool driver's books reconciled with the cluster cache each cycle (a mixin of
:class:`~gpupool.k8s.cycle.pool.driver.PoolDriver`): jobs attached and submitted, riders, evicted books.
Imports engine.pool, model, k8s.requests, k8s.objects, k8s.snapshot and the driver's records."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.engine.pool import PoolJob
from gpupool.engine.pool.job import PENDING, RUNNING
from gpupool.k8s.cycle.plan import Placement
from gpupool.k8s.cycle.pool.records import EVICTED_BOOKS_S, Held, JobInfo
from gpupool.k8s.objects.jobs import job_identity, job_topology, max_member, run_time_limit, started_at
from gpupool.k8s.objects.pods import PodInfo
from gpupool.model import PodRequest


class ReconcileMixin:
    """The books part of :class:`PoolDriver` (uses its state)."""

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
             group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None, info: JobInfo,
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
        info = self.info.setdefault(name, JobInfo())
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
                    self.info[name] = info = JobInfo(members=info.members)
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
                    out.append(Placement(pi.key, None, reason=f"gang {name}: its GPU pods run; this pod waits: "
                                              f"{d.reason}", gang=name))
                    continue
                a = d.assignment
                self.model.assume(pi.key, a.node_name)
                self._register(pi.key, name)
                nominated = a.node_name in busy
                if nominated:
                    self.held[pi.key] = Held(a.node_name, now, None)
                out.append(Placement(pi.key, a.node_name, (), 0,
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
        info = self.info.setdefault(name, JobInfo())
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
                pending: Sequence[PodInfo], info: JobInfo, group: Mapping[str, Any] | None, now: float,
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
            times = [started_at(model.pods[k].obj) or model.pods[k].info.request.creation_time for k in held_keys]
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
