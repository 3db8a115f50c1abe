"""Node eligibility per pod (kube-scheduler's NodeUnschedulable, TaintToleration and NodeAffinity plugins, and
the MIG device count) as filter plugins for the engine; and gpupool's own: no GPU share on a node where a
device-plugin GPU pod runs on GPUs the kubelet has not reported yet."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest
from gpupool.k8s.cache.sharing import share_filters, share_spelling
from gpupool.k8s.objects.fields import mapping
from gpupool.k8s.objects.gpu_asks import gpu_ask
from gpupool.k8s.objects.nodes import hami_registered_gpus, node_labels, node_name
from gpupool.model import MILLI, PodRequest


# ------------------------------------------------------------------ node eligibility (per pod)
def node_ready(node: Mapping[str, Any]) -> bool:
    """False when the node's ``Ready`` condition exists and is not ``True``."""
    conditions = mapping(node.get("status")).get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if not isinstance(cond, Mapping):
            continue
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """kube's ToleratesTaint: some toleration matches the taint's key, value and effect."""
    for t in tolerations:
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        key = t.get("key") or ""
        if op == "Exists":
            if not key or key == taint.get("key"):
                return True
        elif key == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _match_expression(expr: Mapping[str, Any], value: str | None) -> bool:
    op = expr.get("operator")
    raw = expr.get("values")
    values = [str(v) for v in raw] if isinstance(raw, list) else []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            a, b = int(value), int(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def matches_node_selector_term(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """One ``nodeSelectorTerm``: all its matchExpressions (labels) and matchFields (``metadata.name``) hold."""
    if not isinstance(term, Mapping):
        return False
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(exprs, list) or not isinstance(fields, list):
        return False
    if not exprs and not fields:
        return False  # an empty term matches no node
    labels = node_labels(node)
    name = node_name(node)
    for e in exprs:
        if not isinstance(e, Mapping) or not _match_expression(e, labels.get(str(e.get("key", "")))):
            return False
    for f in fields:
        if not isinstance(f, Mapping) or f.get("key") != "metadata.name" or not _match_expression(f, name):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may go, as its spec says; ``key`` identifies pods that see the same eligible nodes."""

    node_selector: tuple[tuple[str, str], ...] = ()
    required_terms: str = ""  # canonical JSON of requiredDuringScheduling nodeSelectorTerms ("" = none)
    tolerations: str = "[]"  # canonical JSON
    mig: tuple[tuple[str, int], ...] = ()
    share: str = ""  # the spelling of a GPU share ask ("" for none; gpupool.k8s.cache.sharing.share_spelling)

    @property
    def key(self) -> tuple:
        return (self.node_selector, self.required_terms, self.tolerations, self.mig, self.share)


def constraints_of(pod: Mapping[str, Any], mig: tuple[tuple[str, int], ...] = (), share: str = "") -> Constraints:
    spec = mapping(pod.get("spec"))
    selector = tuple(sorted((str(k), str(v)) for k, v in mapping(spec.get("nodeSelector")).items()))
    required = mapping(mapping(mapping(spec.get("affinity")).get("nodeAffinity"))
                        .get("requiredDuringSchedulingIgnoredDuringExecution"))
    terms = required.get("nodeSelectorTerms")
    if terms is not None and not isinstance(terms, list):
        terms = []  # unreadable terms match no node (describe_pod reports them)
    raw = spec.get("tolerations")
    tolerations = [t for t in (raw if isinstance(raw, list) else []) if isinstance(t, Mapping)
                   and t.get("effect") in (None, "", "NoSchedule", "NoExecute")]
    return Constraints(
        node_selector=selector,
        required_terms=json.dumps(terms, sort_keys=True, default=str) if terms is not None else "",
        tolerations=json.dumps(tolerations, sort_keys=True, default=str),
        mig=tuple(mig),
        share=share,
    )


@dataclass(frozen=True, slots=True)
class ConstrainedRequest(EffectiveRequest):
    """An :class:`EffectiveRequest` that also carries the pod's :class:`Constraints` (part of its cache key)."""

    constraints: Constraints = field(default_factory=Constraints)

    def key(self) -> tuple:
        return EffectiveRequest.key(self) + self.constraints.key


def with_share(pod: Mapping[str, Any], req: PodRequest, eff: EffectiveRequest) -> EffectiveRequest:
    """``eff`` carrying the spelling of ``pod``'s GPU share if it asks one, for the share filters
    (:mod:`gpupool.k8s.cache.sharing`) where no :class:`Constraints` are built (the extender)."""
    share = share_spelling(req, gpu_ask(pod).spelling) if req.num_gpu else ""
    return ConstrainedRequest(eff.requested, eff.gpu_milli, Constraints(share=share)) if share else eff


class Eligibility:
    """Node eligibility of pods, as engine filter plugins (:attr:`filters`), kept across cycles.

    ``nodes`` are the Node dicts in the order of ``state.node_names``. What eligibility reads of each node
    (labels, NoSchedule/NoExecute taints, cordon, Ready) is read once per node version; masks are cached
    per distinct :class:`Constraints` and refreshed only for nodes changed since (:meth:`update_node`), so a
    cycle costs what changed. Nodes without taints pass the taint check for every pod, and pods without a
    selector or required affinity match every node, without a per-node loop. The MIG count is checked live
    against ``state.assignments`` so that pods placed earlier in the cycle (or in the same gang) are counted.
    """

    CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}

    def __init__(self, state: ClusterState, nodes: Mapping[str, Mapping[str, Any]],
                 mig_capacity: Mapping[str, Mapping[str, int]] | None = None,
                 mig_used: Mapping[str, Mapping[str, int]] | None = None, share_enforcement: str = "none") -> None:
        self.state = state
        self.nodes = [nodes[name] for name in state.node_names]
        self.mig_capacity = {state.node_index[n]: dict(c) for n, c in (mig_capacity or {}).items()
                             if n in state.node_index}
        self.mig_used = {state.node_index[n]: dict(c) for n, c in (mig_used or {}).items() if n in state.node_index}
        self.pending_mig: dict[str, tuple[tuple[str, int], ...]] = {}
        # nodes with device-plugin GPU pods their kubelet map does not name yet (kept by the cluster model)
        self.unsettled: set[int] = set()
        n = len(self.nodes)
        self.gen = np.zeros(n, dtype=np.int64)  # bumped by update_node
        self.ready = np.ones(n, dtype=bool)
        self.cordoned = np.zeros(n, dtype=bool)
        self.taints: list[list[Mapping[str, Any]]] = [[] for _ in range(n)]
        self.tainted = np.zeros(n, dtype=bool)
        self.labels: list[Mapping[str, str]] = [{} for _ in range(n)]
        self.hami = np.zeros(n, dtype=bool)  # HAMi's device plugin registered (hami.io/node-nvidia-register)
        for i in range(n):
            self._read(i)
        # Constraints key -> (gen snapshot, schedulable, taints tolerated, affinity matched)
        self._masks: dict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.filters = (_SchedulableFilter(self), _TaintFilter(self), _AffinityFilter(self), _MigFilter(self),
                        _UnsettledFilter(self), *share_filters(share_enforcement, self.hami, state.node_names))

    def _read(self, i: int) -> None:
        node = self.nodes[i]
        spec = mapping(node.get("spec"))
        self.ready[i] = node_ready(node)
        self.cordoned[i] = bool(spec.get("unschedulable"))
        taints = spec.get("taints")
        self.taints[i] = [t for t in (taints if isinstance(taints, list) else [])
                          if isinstance(t, Mapping) and t.get("effect") in ("NoSchedule", "NoExecute")]
        self.tainted[i] = bool(self.taints[i])
        self.labels[i] = node_labels(node)
        self.hami[i] = hami_registered_gpus(node) is not None

    def update_node(self, i: int, node: Mapping[str, Any]) -> None:
        """Node ``i``'s object changed (labels, taints, cordon, Ready): re-read it; masks refresh its row."""
        self.nodes[i] = node
        self._read(i)
        self.gen[i] += 1

    def _rows(self, c: Constraints, idx: np.ndarray, tolerations: list[Any], terms: Any,
              sched: np.ndarray, taint_ok: np.ndarray, aff: np.ndarray) -> None:
        tolerate_cordon = tolerates(tolerations, self.CORDON)
        sched[idx] = self.ready[idx] & (~self.cordoned[idx] | tolerate_cordon)
        taint_ok[idx] = True  # untainted nodes; only the tainted ones are looked at one by one
        for i in idx[self.tainted[idx]].tolist():
            taint_ok[i] = all(tolerates(tolerations, t) for t in self.taints[i])
        if not c.node_selector and terms is None:
            aff[idx] = True
            return
        for i in idx.tolist():
            labels = self.labels[i]
            if any(labels.get(k) != v for k, v in c.node_selector):
                aff[i] = False
            elif terms is not None and not any(matches_node_selector_term(t, self.nodes[i]) for t in terms):
                aff[i] = False
            else:
                aff[i] = True

    def masks(self, c: Constraints) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(schedulable, taints tolerated, affinity matched): (n_nodes,) bool each."""
        key = c.key[:3]
        cached = self._masks.get(key)
        if cached is not None:
            snap, sched, taint_ok, aff = cached
            stale = (snap != self.gen).nonzero()[0]
            if len(stale) == 0:
                return sched, taint_ok, aff
        else:
            n = len(self.nodes)
            snap = np.full(n, -1, dtype=np.int64)
            sched, taint_ok, aff = np.ones(n, dtype=bool), np.ones(n, dtype=bool), np.ones(n, dtype=bool)
            stale = np.arange(n)
            if len(self._masks) >= 4096:
                self._masks.pop(next(iter(self._masks)))  # the oldest entry (insertion order), not all
            self._masks[key] = (snap, sched, taint_ok, aff)
        tolerations = json.loads(c.tolerations)
        terms = json.loads(c.required_terms) if c.required_terms else None
        self._rows(c, stale, tolerations, terms, sched, taint_ok, aff)
        snap[stale] = self.gen[stale]
        return sched, taint_ok, aff

    def mig_free(self, node: int, profile: str) -> int:
        cap = self.mig_capacity.get(node, {}).get(profile, 0)
        used = self.mig_used.get(node, {}).get(profile, 0)
        for pod, mig in self.pending_mig.items():
            a = self.state.assignments.get(pod)
            if a is not None and a.node == node:
                used += sum(c for p, c in mig if p == profile)
        return cap - used


def _constraints(req: EffectiveRequest) -> Constraints | None:
    return getattr(req, "constraints", None)


class _EligibilityFilter:
    reason = ""
    slot = 0
    static = True  # the node's object alone (cordon, Ready, taints, labels): it changes when the node does

    def __init__(self, book: Eligibility) -> None:
        self.book = book

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        c = _constraints(req)
        if c is None:
            return np.ones(len(nodes), dtype=bool)
        return self.book.masks(c)[self.slot][nodes]


class _SchedulableFilter(_EligibilityFilter):
    reason = "node(s) were unschedulable or not ready"
    slot = 0


class _TaintFilter(_EligibilityFilter):
    reason = "node(s) had untolerated taint"
    slot = 1


class _AffinityFilter(_EligibilityFilter):
    reason = "node(s) didn't match Pod's node affinity/selector"
    slot = 2


class _MigFilter(_EligibilityFilter):
    reason = "Insufficient MIG devices"
    static = False  # devices in use count

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        c = _constraints(req)
        if c is None or not c.mig:
            return np.ones(len(nodes), dtype=bool)
        return np.array([all(self.book.mig_free(int(n), p) >= k for p, k in c.mig) for n in nodes], dtype=bool)


class _UnsettledFilter(_EligibilityFilter):
    """No GPU share (a fraction or a memory amount) on a node where a pod holding device-plugin GPUs runs on GPUs
    the kubelet has not reported yet (the node agent's map does not name it): the kubelet may have given it any of
    the node's free GPUs, so none of them is proven free for a share. Whole-GPU asks still go there (the kubelet
    enforces their count). Lifted as soon as the map names the pod (one agent round, 10 s by default) or the pod
    ends."""

    reason = "node(s) had GPU pods the kubelet has not reported yet (GPU shares wait for the node agent's map)"
    static = False  # the pods running there decide

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        r = req.requested
        unsettled = self.book.unsettled
        if not unsettled or r.num_gpu == 0 or (r.gpu_milli >= MILLI and not r.gpu_memory_mib):
            return np.ones(len(nodes), dtype=bool)
        return np.fromiter((int(n) not in unsettled for n in nodes), dtype=bool, count=len(nodes))
