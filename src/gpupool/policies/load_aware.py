"""``load-aware``: placement for inference replicas: avoid hot GPUs and nodes, spread a service's replicas.

Score of a feasible node for a GPU pod (higher is better; vectorized over the candidate nodes):

    score = W_SPREAD / (1 + peers) + W_COOL * (1 - util) + W_MEM * (1 - mem_used) - W_HOT * hot

* ``peers``: replicas of the pod's service already on the node. Spreading replicas over nodes keeps the
  service up when a node fails or drains (the aim of kube-scheduler's default topology spreading,
  ``PodTopologySpread`` with ``whenUnsatisfiable: ScheduleAnyway`` over ``kubernetes.io/hostname``).
  The service of a pod is its ``gpupool.io/service`` label, else ``app.kubernetes.io/instance``, else
  ``app.kubernetes.io/name``, else ``app``; running pods whose labels this policy has not seen are grouped
  by name (a Deployment pod ``ns/web-7d4b9c8f6d-x2x7q`` and a StatefulSet pod ``ns/web-3`` both belong to
  ``ns/web``), and a pending pod counts both kinds of peer.
* ``util`` (0..1) and ``mem_used`` (fraction of the GPU's memory): mean over the ``num_gpu`` coolest GPUs
  of the node that fit the pod (the ones :meth:`LoadAware.select_gpus` would take). They come from live
  telemetry (dcgm-exporter ``DCGM_FI_DEV_GPU_UTIL`` and ``DCGM_FI_DEV_FB_USED``) attached to the state with
  :func:`set_gpu_load`; where a GPU has no fresh reading, its booked share stands in (``1 - free/1000`` and
  ``1 - mem_free/mem_cap``), so without telemetry the policy still spreads load.
* ``hot``: 1 when one of those GPUs is at or above ``HOT_UTIL`` (80 %) utilisation or ``HOT_MEM`` (90 %)
  memory used: an inference replica there would queue behind another tenant's work or run out of KV-cache
  memory, so such a node is taken only when nothing cooler fits (``W_HOT`` exceeds what spreading gains).

Weights: a free node (no peer) beats a node holding a peer unless the free node is much busier
(``W_SPREAD`` 2 vs ``W_COOL`` 1 + ``W_MEM`` 0.5): availability first, then load. CPU-only pods score
``W_SPREAD / (1 + peers)`` plus the node's free CPU fraction.

The scores depend on telemetry and on other pods, so ``node_local`` is False (scored afresh every cycle).

Live scheduler: ``gpupool scheduler --policy load-aware`` runs a scheduler whose every pod is placed this
way; with ``telemetry`` configured, :func:`telemetry_prepare` (used by ``gpupool scheduler``) attaches the
readings each cycle. gpupool runs one policy per scheduler process (one profile), so to use it only for
inference, run a second ``gpupool scheduler`` with its own ``schedulerName`` (e.g. ``gpupool-inference``)
and ``--policy load-aware``, and set ``spec.template.spec.schedulerName: gpupool-inference`` in the
inference Deployment.
"""

from __future__ import annotations

import re
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.core import Policy
from gpupool.engine.filters import EffectiveRequest, enough_fitting_gpus, gpu_fit_matrix
from gpupool.model import MILLI, Assignment, PodRequest

__all__ = ["HOT_MEM", "HOT_UTIL", "SERVICE_LABELS", "GpuLoad", "LoadAware", "gpu_load_of", "service_of",
           "set_gpu_load", "telemetry_load", "telemetry_prepare"]

W_SPREAD = 2.0
W_COOL = 1.0
W_MEM = 0.5
W_HOT = 3.0
#: Utilisation (0..1) at or above which a GPU is hot.
HOT_UTIL = 0.8
#: Memory-used fraction at or above which a GPU is hot.
HOT_MEM = 0.9
#: Pod labels naming the service a replica belongs to, first match wins.
SERVICE_LABELS = ("gpupool.io/service", "app.kubernetes.io/instance", "app.kubernetes.io/name", "app")

_DEPLOYMENT_POD = re.compile(r"^(.+)-[a-z0-9]{6,10}-[a-z0-9]{5}$")  # <deployment>-<template hash>-<suffix>
_ORDINAL_POD = re.compile(r"^(.+)-\d+$")                              # <statefulset>-<ordinal>, sim <svc>-<n>


@dataclass(frozen=True)
class GpuLoad:
    """Live readings of every GPU: ``util`` (n_nodes, max_gpus) float64 utilisation 0..1 and
    ``mem_used_mib`` (n_nodes, max_gpus) float64 MiB; NaN where there is no fresh reading."""

    util: np.ndarray
    mem_used_mib: np.ndarray


_LOADS: weakref.WeakKeyDictionary[ClusterState, GpuLoad] = weakref.WeakKeyDictionary()


def set_gpu_load(state: ClusterState, util: np.ndarray | None = None,
                 mem_used_mib: np.ndarray | None = None) -> None:
    """Attach live GPU readings to ``state`` for ``load-aware``: ``util`` (n_nodes, max_gpus) 0..1 and
    ``mem_used_mib`` (n_nodes, max_gpus) MiB, NaN = unknown (None: all unknown); utilisation is clipped to
    [0, 1] and memory to >= 0. Replaces earlier readings.
    Raises ValueError on a wrong shape."""
    shape = (state.n_nodes, state.max_gpus)
    arrays = []
    for name, a in (("util", util), ("mem_used_mib", mem_used_mib)):
        a = np.full(shape, np.nan) if a is None else np.asarray(a, dtype=np.float64)
        if a.shape != shape:
            raise ValueError(f"{name}: shape {a.shape}, expected {shape} (n_nodes, max_gpus)")
        arrays.append(a)
    _LOADS[state] = GpuLoad(np.clip(arrays[0], 0.0, 1.0), np.maximum(arrays[1], 0.0))  # NaN kept


def gpu_load_of(state: ClusterState) -> GpuLoad | None:
    """The readings attached to ``state`` by :func:`set_gpu_load`, or None."""
    return _LOADS.get(state)


def telemetry_load(telemetry: Any, state: ClusterState, now: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(util, mem_used_mib), both (n_nodes, max_gpus) float64 with NaN where unknown, from a
    :class:`gpupool.k8s.telemetry.GpuTelemetry` (its fresh samples matched to gpupool's devices with its
    ``device_map``)."""
    util = np.asarray(telemetry.gpu_load(state, now), dtype=np.float64)
    mem = np.full((state.n_nodes, state.max_gpus), np.nan)
    mapping = telemetry.device_map(state, now)
    for (node, gpu), s in telemetry.fresh(now).items():
        i = state.node_index.get(node)
        g = mapping.get((node, gpu))
        if i is not None and g is not None and 0 <= g < state.max_gpus and state.gpu_exists[i, g] \
                and s.fb_used_mib is not None:
            mem[i, g] = s.fb_used_mib
    return util, mem


def telemetry_prepare(telemetry: Any) -> Any:
    """A ``prepare_state`` callable for the live scheduler: GPU health from ``telemetry`` (as before), then
    its utilisation and memory attached to the state for ``load-aware``."""

    def prepare(state: ClusterState) -> Any:
        changed = telemetry.apply_health(state)
        set_gpu_load(state, *telemetry_load(telemetry, state))
        return changed

    return prepare


def _name_group(pod: str) -> str:
    m = _DEPLOYMENT_POD.match(pod) or _ORDINAL_POD.match(pod)
    return m.group(1) if m else pod


def service_of(req: PodRequest) -> str | None:
    """The service label value of ``req`` (first of :data:`SERVICE_LABELS`), None without one."""
    labels = dict(req.labels)
    for k in SERVICE_LABELS:
        if labels.get(k):
            return f"label:{labels[k]}"
    return None


class LoadAware(Policy):
    name = "load-aware"
    description = "inference replicas: avoid hot GPUs (live telemetry), spread each service"
    node_local = False

    def __init__(self) -> None:
        self._svc: dict[str, str] = {}          # pod -> label service key, for pods whose labels were seen
        self._prepared: dict[str, str] = {}     # the same for the workload given to prepare (kept)
        self._where: dict[str, tuple[int, tuple[str, ...]]] = {}  # pod -> (node, its group keys)
        self._count: dict[str, Counter[int]] = {}                 # group key -> node -> replicas
        self._synced: tuple[int, int] | None = None               # (id(state), state.changes) of the books

    # ------------------------------------------------------------------ books of replicas per node
    def prepare(self, state: ClusterState, workload: Sequence[PodRequest] | None) -> None:
        for r in workload or ():
            s = service_of(r)
            if s:
                self._prepared[r.name] = s
        self._svc.update(self._prepared)
        self._synced = None

    def _prune(self, state: ClusterState) -> None:
        """Forget the service of pods that are neither placed nor in the prepared workload (a long-running
        scheduler scores pods that are then deleted while pending): keeps ``_svc`` bounded by the pods
        placed, the workload and 1,024."""
        if len(self._svc) <= 2 * len(state.assignments) + len(self._prepared) + 1024:
            return
        placed = state.assignments
        self._svc = {p: s for p, s in self._svc.items() if p in placed or p in self._prepared}

    def _keys(self, pod: str) -> tuple[str, ...]:
        """The group keys ``pod`` is counted under: its name group, and with a known label its label and
        the (label, name) pair (so that a pod under both is subtracted once, see :meth:`peers`)."""
        s = self._svc.get(pod)
        g = "name:" + _name_group(pod)
        return (g,) if s is None else (g, s, f"{s}|{g}")

    def _add(self, pod: str, node: int) -> None:
        keys = self._keys(pod)
        self._where[pod] = (node, keys)
        for k in keys:
            self._count.setdefault(k, Counter())[node] += 1

    def _remove(self, pod: str) -> None:
        node, keys = self._where.pop(pod, (None, ()))
        for k in keys:
            c = self._count.get(k)
            if c is not None and node is not None:
                c[node] -= 1
                if c[node] <= 0:
                    del c[node]

    def _sync(self, state: ClusterState) -> None:
        if self._synced == (id(state), state.changes):
            return
        self._where.clear()
        self._count.clear()
        for pod, a in state.assignments.items():
            self._add(pod, a.node)
        self._synced = (id(state), state.changes)

    def on_allocate(self, state: ClusterState, assignment: Assignment) -> None:
        if self._synced is not None and self._synced[0] == id(state) and assignment.pod not in self._where:
            self._add(assignment.pod, assignment.node)
            self._synced = (id(state), state.changes)

    def on_release(self, state: ClusterState, assignment: Assignment) -> None:
        if assignment.pod not in self._prepared:
            self._svc.pop(assignment.pod, None)  # a pod placed again is scored again, which relearns it
        if self._synced is not None and self._synced[0] == id(state):
            self._remove(assignment.pod)
            self._synced = (id(state), state.changes)

    def peers(self, state: ClusterState, req: PodRequest, nodes: np.ndarray) -> np.ndarray:
        """(len(nodes),) int64: replicas of ``req``'s service on each of ``nodes`` (the pod itself excluded)."""
        self._sync(state)
        self._prune(state)
        s = service_of(req)
        if s:
            self._svc[req.name] = s
        keys = self._keys(req.name)
        counts: Counter[int] = Counter()
        for sign, k in zip((1, 1, -1), keys, strict=False):  # name + label - both
            for n, v in self._count.get(k, {}).items():
                counts[n] += sign * v
        here = self._where.get(req.name)
        if here is not None:
            counts[here[0]] -= 1
        lookup = np.zeros(state.n_nodes, dtype=np.int64)
        for n, v in counts.items():
            if 0 <= n < state.n_nodes:
                lookup[n] = max(v, 0)
        return lookup[nodes]

    # ------------------------------------------------------------------ load per GPU
    def _gpu_heat(self, state: ClusterState, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(util, mem_used fraction), each (len(nodes), max_gpus): telemetry where fresh, else the bookings."""
        booked_util = 1.0 - state.gpu_free[nodes] / MILLI
        cap = state.gpu_mem_cap[nodes].astype(np.float64)
        booked_mem = np.where(cap > 0, 1.0 - state.gpu_mem_free[nodes] / np.maximum(cap, 1), booked_util)
        load = _LOADS.get(state)
        if load is None:
            return booked_util, booked_mem
        live_util = load.util[nodes]
        util = np.where(np.isnan(live_util), booked_util, live_util)
        live_mem = load.mem_used_mib[nodes] / np.maximum(cap, 1)  # NaN stays NaN; cap 0: booked (below)
        mem = np.where(np.isnan(live_mem) | (cap <= 0), booked_mem, np.minimum(live_mem, 1.0))
        return util, mem

    def score(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        spread = W_SPREAD / (1.0 + self.peers(state, req.requested, nodes))
        if req.num_gpu == 0:
            return spread + state.cpu_free[nodes] / np.maximum(state.cpu_cap[nodes], 1)
        util, mem = self._gpu_heat(state, nodes)
        fits = gpu_fit_matrix(state, req, nodes)
        k = req.num_gpu
        # the k coolest fitting GPUs of each node (by utilisation, then memory): what select_gpus takes
        key = np.where(fits, util + mem * 1e-6, np.inf)
        if k == 1:
            order = key.argmin(axis=1)[:, None]
        else:
            order = np.argpartition(key, min(k, key.shape[1]) - 1, axis=1)[:, :k]
        u = np.take_along_axis(np.where(fits, util, 1.0), order, axis=1)
        m = np.take_along_axis(np.where(fits, mem, 1.0), order, axis=1)
        hot = ((u >= HOT_UTIL) | (m >= HOT_MEM)).any(axis=1)
        return spread + W_COOL * (1.0 - u.mean(axis=1)) + W_MEM * (1.0 - m.mean(axis=1)) - W_HOT * hot

    def select_gpus(self, state: ClusterState, req: EffectiveRequest, node: int) -> tuple[int, ...]:
        """The ``num_gpu`` fitting GPUs of ``node`` with the least utilisation, then memory used, then index."""
        if req.num_gpu == 0:
            return ()
        idx = enough_fitting_gpus(state, req, node)
        util, mem = self._gpu_heat(state, np.array([node]))
        key = (util[0] + mem[0] * 1e-6).tolist()  # utilisation, then memory (both 0..1), then index
        return tuple(sorted(idx, key=lambda g: (key[g], g))[: req.num_gpu])
