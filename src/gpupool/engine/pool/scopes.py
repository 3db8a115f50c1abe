"""The cluster's topology as the pool scheduler sees it: NVLink domains and switches per node, and the
scopes a gang may use (:class:`TopologyIndex`, a mixin of PoolScheduler for now). Imports the job only."""

from __future__ import annotations

import numpy as np

from gpupool.engine.pool.job import PoolJob

__all__ = ["TopologyIndex"]


class TopologyIndex:
    """NVLink domains and switches of the nodes (``has_nvlink``, ``multi_dom``, ``switch``), the pods of a job
    each node could take (:meth:`fits_per_node`) and the topology scopes that can hold a gang (:meth:`scopes`).
    A mixin of :class:`~gpupool.engine.pool.scheduler.PoolScheduler` (it reads its state and free-GPU books)."""

    def _topology_setup(self) -> None:
        st = self.state
        n = st.n_nodes
        doms: dict[str, int] = {}
        dom = np.full(n, -1, dtype=np.int64)
        for i, d in enumerate(st.node_domain):
            if d:
                dom[i] = doms.setdefault(d, len(doms))
        counts = np.bincount(dom[dom >= 0], minlength=max(1, len(doms))) if doms else np.zeros(1, np.int64)
        self.has_nvlink = dom >= 0
        self.multi_dom = np.where((dom >= 0) & (counts[np.maximum(dom, 0)] > 1), dom, -1)
        sws: dict[str, int] = {}
        sw = np.full(n, -1, dtype=np.int64)
        for i in range(n):  # a node without a known switch hangs under its rack's top-of-rack switch
            key = st.node_switch[i] or (("rack:" + st.node_rack[i]) if st.node_rack[i] else "")
            if key:
                sw[i] = sws.setdefault(key, len(sws))
        self.switch = sw
        self.mixed_nvlink = bool(self.has_nvlink.any() and not self.has_nvlink.all())

    def fits_per_node(self, job: PoolJob, allowed: np.ndarray | None) -> np.ndarray:
        """(n_nodes,) int: pods of ``job`` each node could take now (healthy whole GPUs, CPU, memory)."""
        st = self.state
        g = job.gpus_per_pod
        if g:  # free whole-GPU slots per node: the kept count, unless GPUs are time-sliced
            f = (self._free_slots().sum(axis=1) if isinstance(self.slot_milli, np.ndarray) else self._free_whole()) // g
        else:
            f = np.full(st.n_nodes, 1 << 30, dtype=np.int64)
        if job.cpu_per_pod:
            f = np.minimum(f, st.cpu_free // job.cpu_per_pod)
        if job.mem_per_pod:
            f = np.minimum(f, st.mem_free // job.mem_per_pod)
        if allowed is not None:
            f = np.where(allowed, f, 0)
        return f

    def scopes(self, job: PoolJob, f: np.ndarray, n: int) -> list[tuple[str, np.ndarray]]:
        """The best topology scope that can hold ``n`` pods given ``f`` pods per node: ``[(level, mask
        of nodes where the first pod may go)]``, or ``[]`` when no scope within the job's tier can."""
        levels = {"nvlink": ("node", "nvlink"), "node": ("node",), "switch": ("node", "nvlink", "switch"),
                  "spine": ("node", "nvlink", "switch")}[job.topology_tier]
        whole = None  # nodes that hold the whole job, when the NVLink preference below left them out
        for level in levels:
            if level == "node":
                ok = f >= n
                if n == 1 and self.mixed_nvlink and job.gpus_per_pod > 1:  # a multi-GPU pod prefers NVLink
                    whole = ok
                    ok = ok & self.has_nvlink
                if ok.any():
                    return [("node", ok)]
                continue
            ids = self.multi_dom if level == "nvlink" else self.switch
            valid = ids >= 0
            if not valid.any():
                continue
            sums = np.bincount(ids[valid], weights=f[valid])
            good = np.flatnonzero(sums >= n)
            if len(good):
                return [(level, valid & np.isin(ids, good) & (f > 0))]
        if whole is not None and job.topology == "required" and whole.any():
            # a preference, not a requirement: one node without NVLink holds the whole pod (any tier)
            return [("node", whole)]
        return []
