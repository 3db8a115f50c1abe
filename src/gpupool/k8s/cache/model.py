"""The incremental cluster model shared by the live scheduler and ``gpupool scheduler --dry-run``.

kube-scheduler keeps an incremental cache and takes a cheap snapshot per cycle; this is gpupool's
version of that. Watch events (or the objects of a snapshot file, fed as ``ADDED`` events) update typed
records, each Kubernetes object parsed once per ``resourceVersion``:

* :class:`NodeRecord`: the node's :class:`~gpupool.model.NodeSpec`, time-slicing replicas, MIG capacity
  and the fields that decide eligibility (labels, taints, cordon, Ready);
* :class:`PodRecord`: the pod's :class:`~gpupool.k8s.objects.pods.PodInfo` (or why it cannot be read), where
  it is bound, and what it holds in the engine's state;
* PodGroups and Queues (parsed when they change).

One :class:`~gpupool.cluster.ClusterState` and one :class:`~gpupool.engine.core.Engine` live across
cycles and are changed in place: a pod bound -> ``allocate``; deleted, finished or moved -> ``release``;
a node's taints, cordon or labels changed -> its row is marked changed (``ClusterState.touch``) so the
engine's per-node caches refresh only that node. So a cycle costs what the pending pods and the changes
cost, not what the cluster costs. Only a change of the node *set* or of a node's capacity (GPU count,
model, memory, replicas, MIG layout; node added or removed) rebuilds the state from the records (no
re-parsing); a relist does the same and compares the rebuilt books with the incremental ones to catch
drift (``stats["drift"]``).

Pods gpupool places are *assumed* (kube-scheduler's assume/forget): they hold their devices in the
state from the moment they are placed until the watch shows them bound (then the record adopts the
assumption) or the driver calls :meth:`ClusterModel.forget` (the binding failed).

The model is not thread-safe: the live scheduler feeds it from its scheduling thread only (watch
events are queued by the reflectors and applied at the start of each cycle).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.k8s import DEFAULT_SCHEDULER_NAME
from gpupool.k8s.cache.devices import (
    InventoryInfo,
    NoUsableNodeError,
    annotated_devices,
    count_bound_pod,
    lenient_info,
    time_sliced,
)
from gpupool.k8s.cache.dra import DRA_KINDS, DraInventory
from gpupool.k8s.cache.eligibility import ConstrainedRequest, Constraints, Eligibility
from gpupool.k8s.cache.kubelet import KubeletBooks, kubelet_pods
from gpupool.k8s.cache.queues import QueueBook, queue_book
from gpupool.k8s.cache.records import Assumption, NodeRecord, PodRecord, queue_charge
from gpupool.k8s.cache.sharing import check_mode
from gpupool.k8s.objects import nodes as inventory
from gpupool.k8s.objects.fields import (
    RequestParseError,
    deletion_time,
    is_terminal,
    is_waiting_for,
    node_name_of,
    object_key,
    pod_key,
    spec_unreadable,
)
from gpupool.k8s.objects.jobs import is_whole_gpu
from gpupool.k8s.objects.nodes import hami_registered_gpus, mig_capacity, mig_strategy, node_labels, node_name
from gpupool.k8s.objects.pods import PodInfo, QueueSpec, describe_pod, parse_pod_group
from gpupool.model import MILLI, Assignment
from gpupool.policies import DEFAULT_POLICY, make_policy

log = logging.getLogger("gpupool.k8s.state")

NODES, PODS, PODGROUPS, VOLCANO_PODGROUPS, QUEUES = "nodes", "pods", "podgroups", "volcanopodgroups", "queues"
KINDS = (NODES, PODS, PODGROUPS, VOLCANO_PODGROUPS, QUEUES)


def _eligibility_key(obj: Mapping[str, Any]) -> str:
    spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    ready = None
    conditions = status.get("conditions")
    for cond in conditions if isinstance(conditions, list) else []:
        if isinstance(cond, Mapping) and cond.get("type") == "Ready":
            ready = cond.get("status")
    return json.dumps([sorted(node_labels(obj).items()), spec.get("taints"), bool(spec.get("unschedulable")), ready,
                       hami_registered_gpus(obj) is not None], sort_keys=True, default=str)


def _rv(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return str(meta.get("resourceVersion") or "") if isinstance(meta, Mapping) else ""


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return str(meta.get("uid") or "") if isinstance(meta, Mapping) else ""


# ------------------------------------------------------------------ the model
class ClusterModel(KubeletBooks):
    """Typed records of the cluster, kept in step by :meth:`apply`; :meth:`cycle` plans the pending pods.

    ``scheduler_name``: pods naming another scheduler are counted where bound, never placed.
    ``policy``/``seed``: the engine's placement policy and tie-break seed. ``describe`` reads a pod
    (default :func:`~gpupool.k8s.objects.pods.describe_pod`), once per resourceVersion. ``share_enforcement``:
    where a GPU share may go (:mod:`gpupool.k8s.cache.sharing`; ``none``, ``hami`` or ``trust``).
    """

    def __init__(self, scheduler_name: str = DEFAULT_SCHEDULER_NAME, policy: str = DEFAULT_POLICY, seed: int = 0,
                 describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod, assume_ttl_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, share_enforcement: str = "none") -> None:
        self.share_enforcement = check_mode(share_enforcement, "share_enforcement")
        self.scheduler_name = scheduler_name
        self.policy_name = policy
        self.seed = seed
        self.describe = describe
        self.assume_ttl_s = assume_ttl_s
        self.clock = clock
        self.nodes: dict[str, NodeRecord] = {}
        self.bad_nodes: dict[str, str] = {}  # unreadable nodes: key -> why
        self.pods: dict[str, PodRecord] = {}
        self.duplicates: dict[str, list[str]] = {}  # base key -> record keys (duplicates in a file)
        self.pending: dict[str, None] = {}  # record keys waiting for this scheduler (ordered set)
        self.assumed: dict[str, Assumption] = {}
        self.skipped_pods: dict[str, str] = {}
        self.pod_groups: dict[str, dict[str, Mapping[str, Any]]] = {PODGROUPS: {}, VOLCANO_PODGROUPS: {}}
        self.queues: dict[str, Mapping[str, Any]] | None = None
        self.queues_blocked = ""  # why Queues cannot be read (403 before any list), else ""
        self.queue_used: dict[str, int] = {}  # queue -> milli-GPU of its own counted pods (children not added)
        # queue -> (pod priority, whole GPUs) -> milli-GPU: queue_used split by priority and by whole-GPU pods or not
        self.queue_used_at: dict[str, dict[tuple[int, bool], int]] = {}
        self.queue_pods: dict[str, int] = {}  # queue -> its own counted pods
        self.group_counted: dict[str, int] = {}  # PodGroup key -> counted pods
        self.mig_used: dict[str, dict[str, int]] = {}
        self.on_node: dict[str, set[str]] = {}  # node -> keys of the pods counted there
        # node -> device-plugin GPU pods counted there that its kubelet map does not name yet (PodRecord.unsettled)
        self.unsettled: dict[str, set[str]] = {}
        self.state: ClusterState | None = None
        self.engine: Engine | None = None
        self.elig: Eligibility | None = None
        self._constraints: dict[str, Constraints] = {}
        self._last_fail: dict[str, tuple[tuple, Any]] = {}  # pod -> ((rv, state.loosened, epoch), its Placement)
        self._epoch = 0  # bumped on a rebuild (state.changes starts again) and on any Queue or PodGroup change
        self._groups_cache: tuple[dict[str, int], dict[str, str]] | None = None
        self._queue_cache: Any = None
        self._dirty = True  # the node set or a node's capacity changed: rebuild before the next cycle
        self._reshaped = True  # ... and the incremental books cannot be compared with the rebuilt ones
        self._check = False  # compare the rebuilt books with the incremental ones (after a relist)
        self.pool: Any = None  # a gpupool.k8s.cycle.pool.driver.PoolDriver when the pool scheduler runs the cluster
        self.count_log: list[str] = []  # pods counted, uncounted or forgotten since the pool last looked
        self.dra = DraInventory()  # ResourceSlices, DeviceClasses, ResourceClaims (DRA)
        self.claims_of: dict[str, list[str]] = {}  # assumed pod -> claim keys whose allocation it carries
        # preemptor -> (preemption id, victim keys, victim uids): DRA preemptions under way (cycle.planner)
        self.dra_preempting: dict[str, tuple[int, list[str], list[str]]] = {}
        self.dra_preemption_seq = 0
        self.stats = {"events": 0, "parsed_pods": 0, "parsed_nodes": 0, "rebuilds": 0, "drift": 0,
                      "incremental": 0, "skipped_unchanged": 0}

    # ------------------------------------------------------------------ feeding
    @classmethod
    def from_snapshot(cls, snapshot: Any, **kwargs: Any) -> ClusterModel:
        """A model holding the objects of a :class:`~gpupool.k8s.objects.snapshots.ClusterSnapshot` (a file's
        objects)."""
        model = cls(**kwargs)
        model.replace(NODES, snapshot.nodes)
        model.replace(PODS, snapshot.pods)
        model.replace(PODGROUPS, snapshot.pod_groups)
        model.replace(QUEUES, snapshot.queues)
        for kind in DRA_KINDS:
            items = getattr(snapshot, kind, None)
            if items:
                model.replace(kind, items)
        return model

    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """One watch event (``ADDED``/``MODIFIED``/``DELETED``) of ``kind`` (one of :data:`KINDS`)."""
        self.stats["events"] += 1
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return  # BOOKMARK and the like carry no object change
        if kind in DRA_KINDS:
            self.dra.apply(kind, event_type, obj)
            self._epoch += 1  # devices freed or added: pods that failed are planned again
        elif kind == NODES:
            name = node_name(obj)
            if not name:
                self._bad_node(obj, len(self.bad_nodes), name)
                return
            if event_type == "DELETED":
                self._delete_node(name)
            else:
                self._upsert_node(name, obj)
        elif kind == PODS:
            key = pod_key(obj) if isinstance(obj, Mapping) else ""
            if event_type == "DELETED":
                rec = self.pods.get(key)
                uid = _uid(obj)
                if rec is not None and uid and rec.uid and uid != rec.uid:
                    return  # a late DELETED of an older pod of this name: the recreated one stays
                self._delete_pod(key)
            else:
                self._upsert_pod(key, key, obj)
        elif kind in (PODGROUPS, VOLCANO_PODGROUPS):
            store = self.pod_groups[kind]
            if event_type == "DELETED":
                store.pop(object_key(obj), None)
            else:
                store[object_key(obj)] = obj
            self._groups_cache = None
            self._epoch += 1
        elif kind == QUEUES:
            if self.queues is None:
                self.queues = {}
            name = str(object_key(obj).split("/", 1)[1])
            if event_type == "DELETED":
                self.queues.pop(name, None)
            else:
                self.queues[name] = obj
            self._queue_cache = None
            self._epoch += 1
        else:
            raise ValueError(f"unknown kind {kind!r}")

    def replace(self, kind: str, items: Sequence[Mapping[str, Any]] | None) -> None:
        """A (re)list of ``kind``: records not in ``items`` go, the rest are updated; ``None`` = the kind is not
        served (CRD not installed: for Queues, no limits). A relist of nodes or pods rebuilds the state and
        checks it against the incremental books."""
        if kind in DRA_KINDS:
            self.dra.replace(kind, items)
            self._epoch += 1
        elif kind == NODES:
            self.bad_nodes.clear()
            seen: set[str] = set()
            for index, obj in enumerate(items or []):
                name = node_name(obj)
                if not name or name in seen:
                    self._bad_node(obj, index, name)
                    continue
                seen.add(name)
                self._upsert_node(name, obj)
            for name in [n for n in self.nodes if n not in seen]:
                self._delete_node(name)
            # A relist keeps the list's order (node order breaks ties): rebuild in that order.
            order = {n: i for i, n in enumerate(x for x in (node_name(o) for o in items or []) if x in seen)}
            self.nodes = dict(sorted(self.nodes.items(), key=lambda kv: order.get(kv[0], len(order))))
            self._dirty = self._check = True
        elif kind == PODS:
            seen_keys: set[str] = set()
            counts: dict[str, int] = {}
            for obj in items or []:
                base = pod_key(obj) if isinstance(obj, Mapping) else "default/"
                counts[base] = counts.get(base, 0) + 1
                key = base if counts[base] == 1 else f"{base}#{counts[base]}"
                seen_keys.add(key)
                self._upsert_pod(key, base, obj)
            for key in [k for k in self.pods if k not in seen_keys]:
                self._delete_pod(key)
            self._dirty = self._check = True
        elif kind in (PODGROUPS, VOLCANO_PODGROUPS):
            self.pod_groups[kind] = {object_key(o): o for o in items or []}
            self._groups_cache = None
            self._epoch += 1
        elif kind == QUEUES:
            self.queues = None if items is None else {str(object_key(o).split("/", 1)[1]): o for o in items}
            self.queues_blocked = ""
            self._queue_cache = None
            self._epoch += 1
        else:
            raise ValueError(f"unknown kind {kind!r}")

    # ------------------------------------------------------------------ nodes
    def _bad_node(self, obj: Any, index: int, name: str) -> None:
        if name and name in self.nodes:
            why = f"node {name}: duplicate node name (the first one is used)"
            key = name
        else:
            raw = obj.get("metadata", {}).get("name") if isinstance(obj, Mapping) and isinstance(
                obj.get("metadata"), Mapping) else None
            key = f"{raw!r}" if raw is not None else f"<node #{index} without a name>"
            why = f"node {key}: metadata.name: expected a non-empty string"
        n, base = 2, key
        while key in self.bad_nodes:
            key, n = f"{base} ({n})", n + 1
        self.bad_nodes[key] = why

    def _upsert_node(self, name: str, obj: Mapping[str, Any]) -> None:
        old = self.nodes.get(name)
        rv = _rv(obj)
        if old is not None and rv and old.rv == rv:
            return
        self.stats["parsed_nodes"] += 1
        try:
            spec = inventory.node_spec_from_node(obj)  # looked up here: tests replace it
            replicas = max(1, getattr(spec, "gpu_replicas", 1))
            cap = mig_capacity(obj) if mig_strategy(obj) == "mixed" else {}
            rec = NodeRecord(name, obj, rv, spec, "", replicas, cap, _eligibility_key(obj),
                             inventory.agent_marked(obj, spec), kubelet_pods(name, obj, spec))
        except Exception as exc:  # noqa: BLE001 - one unreadable node never stops the others
            reason = str(exc) if isinstance(exc, ValueError) else f"invalid object: {type(exc).__name__}: {exc}"
            rec = NodeRecord(name or "?", obj, rv, None, reason)
            log.warning("node skipped", extra={"event": "node_skipped", "node": name, "reason": reason})
        self.nodes[rec.name] = rec
        if old is None or old.capacity_key != rec.capacity_key or self.state is None:
            self._dirty = self._reshaped = True
            return
        if old.marked != rec.marked and rec.spec is not None:
            i = self.state.node_index.get(name)
            if i is not None:
                self._mark(self.state, i, rec.marked)
        if old.kubelet_pods != rec.kubelet_pods and rec.spec is not None:
            self._recount_node(name)
        if old.eligibility != rec.eligibility and rec.spec is not None:
            i = self.state.node_index.get(name)
            if i is not None and self.elig is not None:
                self.elig.update_node(i, obj)
                self.state.touch(i)
        elif self.elig is not None and rec.spec is not None:
            i = self.state.node_index.get(name)
            if i is not None:
                self.elig.nodes[i] = obj  # same eligibility: keep the newest object for readers

    @staticmethod
    def _mark(state: ClusterState, i: int, marked: Sequence[int]) -> None:
        """Make node ``i``'s agent marks ``marked``: marked GPUs unhealthy, unmarked ones healthy again (telemetry
        may mark them unhealthy on its own at the next cycle)."""
        want = set(int(g) for g in marked if 0 <= int(g) < state.max_gpus and state.gpu_exists[i, int(g)])
        for g in range(int(state.gpu_count[i])):
            if (g in want) != bool(state.gpu_marked[i, g]):
                state.gpu_marked[i, g] = g in want
                state.set_gpu_health(i, g, g not in want)

    def _delete_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self._dirty = self._reshaped = True

    # ------------------------------------------------------------------ pods
    def _parse(self, obj: Mapping[str, Any]) -> tuple[PodInfo | None, RequestParseError | None]:
        self.stats["parsed_pods"] += 1
        try:
            info = self.describe(obj)
            if info.request.num_gpu and ((obj.get("status") or {}).get("extendedResourceClaimStatus") or {}).get(
                    "resourceClaimName"):  # its GPUs are a DRA claim's (extended resources backed by DRA)
                info = replace(info, request=replace(info.request, num_gpu=0, gpu_milli=0, gpu_memory_mib=0))
            return info, None
        except RequestParseError as exc:
            return None, exc
        except Exception as exc:  # noqa: BLE001 - one unreadable pod never stops the others
            return None, RequestParseError(f"pod {pod_key(obj)}: invalid object: {type(exc).__name__}: {exc}")

    def _upsert_pod(self, key: str, base: str, obj: Mapping[str, Any]) -> None:
        old = self.pods.get(key)
        rv = _rv(obj)
        if old is not None and rv and old.rv == rv and old.uid == _uid(obj):
            old.obj = obj  # same version (a relist): nothing changed
            return
        if not isinstance(obj, Mapping):
            return
        self._constraints.pop(key, None)
        node = node_name_of(obj)
        terminal = is_terminal(obj)
        waiting = is_waiting_for(obj, self.scheduler_name) or (spec_unreadable(obj) and not terminal)
        info, error = self._parse(obj) if (node and not terminal) or waiting else (None, None)
        rec = PodRecord(key, base, obj, _uid(obj), rv, info, error, node, terminal, waiting)
        assumed = self.assumed.get(key)
        if assumed is not None and (assumed.uid != rec.uid or terminal or (node and node != assumed.node)
                                    or (not node and not waiting)):
            self._drop_assumption(key)
            assumed = None
        leaving = bool(node) and not terminal and self._leaving(rec)
        if old is not None and old.counted:
            same = (old.uid == rec.uid and old.node == node and not terminal and old.info == info
                    and annotated_devices(old.obj) == annotated_devices(obj) and not leaving)
            if same:
                rec.counted, rec.charge, rec.note = True, old.charge, old.note
                rec.kubelet, rec.unsettled = old.kubelet, old.unsettled
                self.pods[key] = rec
                self._set_pending(rec)
                return
            self._uncount(old)
        self.pods[key] = rec
        if key != base and key not in self.duplicates.get(base, ()):
            self.duplicates.setdefault(base, []).append(key)
        if assumed is not None and node == assumed.node:
            self._adopt(rec, assumed)
        elif node and not terminal and not leaving and not self._evicting(rec):
            self._count(rec)
        self._set_pending(rec)

    def _evicting(self, rec: PodRecord) -> bool:
        """Is ``rec`` a preemption victim on its way out? Its devices already went to its preemptor."""
        return self.pool is not None and self.pool.is_evicting(rec.key, rec.uid)

    def _leaving(self, rec: PodRecord) -> bool:
        """Is ``rec`` (bound, not finished) a pool pod being deleted (``deletionTimestamp``) that the pool driver
        takes as leaving (:meth:`~gpupool.k8s.cycle.pool.driver.PoolDriver.leaving`)? Then it is not counted: its
        devices are freed-soon, and placements on its node wait for it to go."""
        return (self.pool is not None and deletion_time(rec.obj) is not None
                and bool(self.pool.leaving(rec)))

    def _set_pending(self, rec: PodRecord) -> None:
        if rec.waiting and rec.key not in self.assumed:
            self.pending[rec.key] = None
        else:
            self.pending.pop(rec.key, None)

    def _delete_pod(self, key: str) -> None:
        rec = self.pods.pop(key, None)
        self.pending.pop(key, None)
        self.skipped_pods.pop(key, None)
        if key in self.assumed:
            self._drop_assumption(key)
        if rec is not None and rec.counted:
            self._uncount(rec)

    # ------------------------------------------------------------------ books
    def _count(self, rec: PodRecord) -> None:
        """Count a bound pod in the state (incrementally; a later rebuild counts it anyway when dirty).

        Counted as a rebuild would: pods whose devices are named (gpupool's or HAMi's annotations) before pods
        whose devices are only guessed. So when a named pod arrives on a node where guessed pods are counted,
        those are released, the named pod takes its devices, and they are counted again after it."""
        self.skipped_pods.pop(rec.key, None)
        if self._dirty or self.state is None:
            return
        guessed = []
        rank = self._order(rec)[0]
        if rank < 2:  # its devices are named (by the kubelet, or by gpupool's or HAMi's annotations)
            guessed = sorted((r for k in self.on_node.get(rec.node, ()) if (r := self.pods.get(k)) is not None
                              and r.counted and self._order(r)[0] > rank), key=self._order)
        for other in guessed:
            self._uncount(other)
        self._count_in(self.state, rec)
        for other in guessed:
            self._count_in(self.state, other)

    def _count_in(self, state: ClusterState, rec: PodRecord) -> None:
        node = state.node_index.get(rec.node)
        if node is None:
            self.skipped_pods[rec.key] = f"bound to node {rec.node}, which gpupool does not know"
            return
        lenient = ""
        info = rec.info
        if info is None:
            info = lenient_info(rec.obj, rec.error or RequestParseError("unreadable"))
            req = info.request
            lenient = (f"request unreadable ({rec.error}); counted conservatively: "
                       f"{req.num_gpu} whole GPU(s), {req.cpu_milli}m CPU, {req.memory_mib} MiB")
        if rec.key != info.key:
            note = f"duplicate pod {rec.base}: counted again as {rec.key}"
            lenient = "; ".join(x for x in (note, lenient) if x)
            info = replace(info, key=rec.key, request=replace(info.request, name=rec.key))
        devices = annotated_devices(rec.obj)
        placed = self._kubelet_placed(rec, info, state, node)
        info = time_sliced(info, self.nodes[rec.node].replicas if rec.node in self.nodes else 1)
        if placed is not None:
            gpus, per_gpu = placed
            if len(gpus) != info.request.num_gpu:  # time-slicing replicas the kubelet stacked on fewer GPUs
                one = int(state.slice_milli[node]) if state.gpu_replicas[node] > 1 else MILLI
                info = replace(info, request=replace(info.request, num_gpu=len(gpus),
                                                     gpu_milli=min(MILLI, per_gpu * one)))
            devices = (gpus, info.request.gpu_milli)
        try:
            assignment, note = count_bound_pod(state, info, node, devices)
        except Exception as exc:  # noqa: BLE001 - one unreadable pod never stops the others
            self.skipped_pods[rec.key] = f"invalid object: {type(exc).__name__}: {exc}"
            return
        note = "; ".join(x for x in (lenient, note) if x)
        if note:
            self.skipped_pods[rec.key] = note
        if assignment is not None and self.engine is not None and self.engine.state is state:
            self.engine.policy.on_allocate(state, assignment)
        rec.note = note
        self._counted(rec, info, assignment, state)

    def _counted(self, rec: PodRecord, info: PodInfo, held: Assignment | None, state: ClusterState) -> None:
        """``rec`` now holds ``held`` in ``state``: charge its queue, count it for its node, gang and MIG books."""
        rec.counted = True
        if rec.unsettled:
            self.unsettled.setdefault(rec.node, set()).add(rec.key)
            self._sync_unsettled(rec.node)
        rec.charge = queue_charge(info, held, state)
        if self.pool is not None:
            self.count_log.append(rec.key)
        self.on_node.setdefault(rec.node, set()).add(rec.key)
        self._book(rec, info, +1)

    def _book(self, rec: PodRecord, info: PodInfo, sign: int) -> None:
        if info.queue:
            self.queue_used[info.queue] = self.queue_used.get(info.queue, 0) + sign * rec.charge
            at = self.queue_used_at.setdefault(info.queue, {})
            # whole GPUs or a share as the pod asks (its own request: the same when it is counted and uncounted)
            kind = (info.request.priority, rec.info is None or is_whole_gpu(rec.info))
            at[kind] = at.get(kind, 0) + sign * rec.charge
            if not at[kind]:
                del at[kind]
            self.queue_pods[info.queue] = self.queue_pods.get(info.queue, 0) + sign
        if info.pod_group:
            self.group_counted[info.pod_group] = self.group_counted.get(info.pod_group, 0) + sign
        if info.mig:
            used = self.mig_used.setdefault(rec.node, {})
            for profile, count in info.mig:
                used[profile] = used.get(profile, 0) + sign * count
            if self.elig is not None and self.state is not None and rec.node in self.state.node_index:
                i = self.state.node_index[rec.node]
                self.elig.mig_used[i] = dict(used)
                self.state.touch(i)

    def _record_info(self, rec: PodRecord) -> PodInfo:
        if rec.info is not None:
            return rec.info
        return lenient_info(rec.obj, rec.error or RequestParseError("unreadable"))

    def _uncount(self, rec: PodRecord) -> None:
        if not rec.counted:
            return
        rec.counted = False
        if self.pool is not None:
            self.count_log.append(rec.key)
        self.on_node.get(rec.node, set()).discard(rec.key)
        if rec.key in self.unsettled.get(rec.node, ()):
            self.unsettled[rec.node].discard(rec.key)
            self._sync_unsettled(rec.node)
        self.skipped_pods.pop(rec.key, None)
        info = self._record_info(rec)
        self._book(rec, info, -1)
        state = self.state
        if state is not None and not self._dirty and rec.key in state.assignments:
            a = state.release(rec.key)
            if self.engine is not None:
                self.engine.policy.on_release(state, a)

    def _adopt(self, rec: PodRecord, a: Assumption) -> None:
        """The watch shows a pod gpupool placed as bound where it was placed: the assumption becomes the count."""
        a = self.assumed.pop(rec.key)
        self._set_unsettled(a.node, rec.key, False)
        if self.elig is not None:
            self.elig.pending_mig.pop(rec.key, None)
        state = self.state
        if self._dirty or state is None or rec.key not in state.assignments or rec.info is None:
            self._count(rec)
            return
        held = state.assignments[rec.key]
        devices = annotated_devices(rec.obj)
        placed = self._kubelet_placed(rec, rec.info, state, held.node)
        if ((devices is not None and tuple(devices[0]) != tuple(held.gpus))
                or (placed is not None and placed[0] != tuple(held.gpus))):
            # bound with other devices than assumed (another replica's binding), or the kubelet already reports
            # other GPUs than gpupool booked
            state.release(rec.key)
            self._count(rec)
            return
        self._counted(rec, rec.info, held, state)

    def _drop_assumption(self, key: str) -> None:
        a = self.assumed.pop(key, None)
        if a is not None and key in self.unsettled.get(a.node, ()):
            self._set_unsettled(a.node, key, False)
        if self.pool is not None:
            self.count_log.append(key)
        if self.elig is not None:
            self.elig.pending_mig.pop(key, None)
        state = self.state
        if state is not None and not self._dirty and key in state.assignments:
            a = state.release(key)
            if self.engine is not None:
                self.engine.policy.on_release(state, a)

    # ------------------------------------------------------------------ assume / forget
    def assume(self, key: str, node: str, mig: tuple[tuple[str, int], ...] = ()) -> None:
        """Pod ``key``, already placed in the state on ``node``, is being bound: it holds its devices and leaves
        the pending set until the watch shows it bound (:meth:`bound`) or :meth:`forget`."""
        self.assumed[key] = Assumption(self.pods[key].uid, node, self.clock(), mig=mig)
        if self._plugin_unknown(key, node):  # the kubelet will pick its GPUs: shares keep off the node meanwhile
            self._set_unsettled(node, key, True)
        self.pending.pop(key, None)
        self._last_fail.pop(key, None)

    def release_evicted(self, key: str) -> None:
        """Pod ``key`` is being evicted and its devices went to its preemptor (already released from the state by
        the pool scheduler): it leaves the books without a release; it is not counted again while the driver
        says it is evicting (:meth:`_evicting`)."""
        self.assumed.pop(key, None)
        rec = self.pods.get(key)
        if rec is not None:
            self._uncount(rec)

    def recount(self, key: str) -> None:
        """A pod that was to be evicted stays (its eviction was refused or it did not go): counted again."""
        rec = self.pods.get(key)
        if rec is not None and rec.node and not rec.terminal and not rec.counted:
            self._count(rec)

    def forget(self, key: str, uid: str | None = None) -> bool:
        """Drop the assumption for ``key`` (its binding failed): its devices are free again and, if it is still
        waiting, it is planned again. Returns whether there was one."""
        a = self.assumed.get(key)
        if a is None or (uid is not None and a.uid != uid):
            return False
        for claim_key in self.claims_of.pop(key, ()):
            self.dra.forget(claim_key)
        self._drop_assumption(key)
        rec = self.pods.get(key)
        if rec is not None:
            self._set_pending(rec)
        return True

    def bound(self, key: str) -> None:
        """The binding of ``key`` succeeded; the assumption stays until the watch shows it (or ``assume_ttl_s``)."""
        a = self.assumed.get(key)
        if a is not None:
            a.bound_at = self.clock()

    def expire(self) -> list[str]:
        """Forget assumptions whose binding succeeded more than ``assume_ttl_s`` ago but never showed up."""
        now = self.clock()
        gone = [k for k, a in self.assumed.items() if a.bound_at is not None and now - a.bound_at > self.assume_ttl_s]
        for key in gone:
            log.warning("assumption expired", extra={"event": "assumption_expired", "pod": key})
            self.forget(key)
        return gone

    # ------------------------------------------------------------------ state
    def _rebuild(self) -> None:
        """Build the state from the records (no parsing): node order as listed, bound pods counted, assumed pods
        placed again; after a relist, compare with the books kept incrementally."""
        t0 = time.perf_counter()
        old_state, check = self.state, self._check and not self._reshaped
        self._reshaped = False
        old_books = (dict(self.queue_used), dict(self.group_counted)) if old_state is not None else None
        old_assignments = dict(old_state.assignments) if old_state is not None else {}
        self._dirty = self._check = False
        self._epoch += 1
        self.stats["rebuilds"] += 1
        specs = [r.spec for r in self.nodes.values() if r.spec is not None]
        self.skipped_pods.clear()
        self.queue_used.clear()
        self.queue_used_at.clear()
        self.queue_pods.clear()
        self.group_counted.clear()
        self.mig_used.clear()
        self.on_node.clear()
        self.unsettled.clear()
        for rec in self.pods.values():
            rec.counted = False
        if not specs:
            self.state = self.engine = self.elig = None
            return
        state = ClusterState(specs)
        self.state, self.engine, self.elig = state, None, None
        for rec in self.nodes.values():
            if rec.marked and rec.spec is not None:
                self._mark(state, state.node_index[rec.name], rec.marked)
        bound = [r for r in self.pods.values() if r.node and not r.terminal and r.key not in self.assumed
                 and not self._evicting(r)]
        for rec in sorted(bound, key=self._order):
            self._count_in(state, rec)
        nodes = {n: r.obj for n, r in self.nodes.items() if r.spec is not None}
        caps = {n: r.mig_cap for n, r in self.nodes.items() if r.spec is not None and r.mig_cap}
        self.elig = Eligibility(state, nodes, caps, self.mig_used, self.share_enforcement)
        # assumptions: placed again on the same devices where they still fit, else forgotten
        for key, a in list(self.assumed.items()):
            held = old_assignments.get(key)
            rec = self.pods.get(key)
            node = state.node_index.get(a.node)
            if held is None or rec is None or rec.info is None or node is None:
                self.assumed.pop(key, None)
                if rec is not None:
                    self._set_pending(rec)
                continue
            try:
                state.allocate(rec.info.request, node, held.gpus, held.gpu_milli if held.gpus else None)
                if a.mig:
                    self.elig.pending_mig[key] = a.mig
            except Exception:  # noqa: BLE001 - it no longer fits: plan it again
                self.assumed.pop(key, None)
                self._set_pending(rec)
                continue
            if self._plugin_unknown(key, a.node):
                self.unsettled.setdefault(a.node, set()).add(key)
        self.elig.unsettled = {state.node_index[n] for n, keys in self.unsettled.items()
                               if keys and n in state.node_index}
        pol = make_policy(self.policy_name)
        pol.filters = tuple(self.elig.filters) + tuple(pol.filters)
        base_effective = pol.effective
        constraints = self._constraints

        def effective(req):
            e = base_effective(req)
            return ConstrainedRequest(e.requested, e.gpu_milli, constraints.get(req.name, Constraints()))

        pol.effective = effective  # type: ignore[method-assign]
        workload = [self._record_info(r).request for r in self.pods.values() if r.counted]
        workload += [r.info.request for r in self.pods.values() if r.key in self.pending and r.info is not None]
        self.engine = Engine(state, pol, seed=self.seed, workload=workload if len(workload) >= 50 else None)
        if check and old_state is not None:
            self._compare(old_state, old_assignments, old_books)
        log.info("state rebuilt", extra={"event": "state_rebuilt", "nodes": state.n_nodes,
                                         "pods": len(state.assignments),
                                         "seconds": round(time.perf_counter() - t0, 4)})

    def _compare(self, old: ClusterState, old_assignments: Mapping[str, Assignment],
                 old_books: tuple[dict[str, int], dict[str, int]] | None) -> None:
        """Drift check after a relist (of an unchanged node set and capacity: the relist's changes were applied
        incrementally first): the incremental books must equal the ones rebuilt from scratch."""
        new = self.state
        assert new is not None
        self.state.check_invariants()
        problems = []
        if old.node_names == new.node_names and old.gpu_free.shape == new.gpu_free.shape:
            for name in ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free"):
                if not (getattr(old, name) == getattr(new, name)).all():
                    problems.append(name)
        if set(old_assignments) != set(new.assignments):
            problems.append("assignments")
        if old_books is not None and ({k: v for k, v in old_books[0].items() if v}
                                      != {k: v for k, v in self.queue_used.items() if v}):
            problems.append("queue use")
        if problems:
            self.stats["drift"] += 1
            log.warning("incremental state drifted from the API; rebuilt",
                        extra={"event": "state_drift", "fields": problems})

    def refresh(self) -> ClusterState | None:
        """Bring the state up to date without planning (rebuild if the node set changed); returns it."""
        if self._dirty:
            self._rebuild()
        return self.state

    def touch_all(self) -> None:
        """Rebuild before the next cycle (e.g. the scheduler became leader)."""
        self._dirty = True

    # ------------------------------------------------------------------ inputs of a cycle
    def group_sizes(self) -> tuple[dict[str, int], dict[str, str]]:
        """(PodGroup key -> minMember, PodGroup key -> why it is unreadable), cached until a PodGroup changes."""
        if self._groups_cache is None:
            groups: dict[str, int] = {}
            errors: dict[str, str] = {}
            for kind in (PODGROUPS, VOLCANO_PODGROUPS):
                for obj in self.pod_groups[kind].values():
                    try:
                        gkey, min_member = parse_pod_group(obj)
                    except RequestParseError as exc:
                        errors[object_key(obj)] = str(exc)
                        continue
                    except Exception as exc:  # noqa: BLE001 - one unreadable PodGroup never stops the cycle
                        gkey = object_key(obj)
                        errors[gkey] = f"PodGroup {gkey}: invalid object: {type(exc).__name__}: {exc}"
                        continue
                    groups.setdefault(gkey, min_member)
            self._groups_cache = (groups, errors)
        return self._groups_cache

    def queue_specs(self) -> tuple[dict[str, QueueSpec], dict[str, str], bool]:
        """(specs, errors, known): the Queues parsed, cached until a Queue changes."""
        if self._queue_cache is None:
            book = queue_book(None if self.queues is None else list(self.queues.values()))
            self._queue_cache = (book.specs, book.errors, book.known)
        return self._queue_cache

    def forbid(self, kind: str, reason: str) -> None:
        """``kind`` cannot be read (403 before any list): for Queues, pods of a queue wait (limits never lapse)."""
        if kind == QUEUES:
            self.queues = None
            self.queues_blocked = reason
            self._queue_cache = None
            self._epoch += 1
        elif kind in (PODGROUPS, VOLCANO_PODGROUPS):
            self.pod_groups[kind] = {}  # gang pods wait: their PodGroup is not known
            self._groups_cache = None
            self._epoch += 1

    def queue_book(self) -> Any:
        """A :class:`~gpupool.k8s.cache.queues.QueueBook` with every counted and assumed pod charged; in pool mode
        (``pool`` set) it holds non-preemptible pods to quota with the pool's ``nonpreemptible_priority``."""
        specs, errors, known = self.queue_specs()
        npp = self.pool.config.nonpreemptible_priority if self.pool is not None else None
        book = QueueBook(specs, errors, known, blocked=self.queues_blocked, nonpreemptible_priority=npp)
        for queue, milli in self.queue_used.items():
            if milli:
                np_milli = 0 if npp is None else sum(m for (p, _), m in self.queue_used_at.get(queue, {}).items()
                                                     if p >= npp)
                book.charge(queue, milli, np_milli)
        state = self.state
        for key in self.assumed:
            rec = self.pods.get(key)
            if rec is not None and rec.info is not None and rec.info.queue and state is not None:
                milli = queue_charge(rec.info, state.assignments.get(key), state)
                book.charge(rec.info.queue, milli, milli if book.nonpreemptible(rec.info.request.priority) else 0)
        self._charge_claims(book)
        return book

    def _charge_claims(self, book: QueueBook) -> None:
        """Charge each pod's queue the whole-GPU equivalents its allocated (or assumed) claims hold (a claim shared
        by several pods is charged once, to its first holder's queue)."""
        if not self.dra.claims and not self.dra.assumed:
            return
        by_uid = {r.uid: r for r in self.pods.values() if r.uid}
        for key, results, _ in self.dra.allocations():
            claim = self.dra.claims.get(key)
            holder = None
            if claim is not None:
                for _, uid in claim.reserved_for:
                    holder = by_uid.get(uid)
                    if holder is not None:
                        break
            if holder is None:
                holder = next((self.pods.get(p) for p, keys in self.claims_of.items() if key in keys), None)
            if holder is None or holder.info is None or not holder.info.queue or holder.terminal:
                continue
            milli = int(round(self.dra.gpu_equivalents(results) * MILLI))
            book.charge(holder.info.queue, milli,
                        milli if book.nonpreemptible(holder.info.request.priority) else 0)

    def nonpreemptible_shares(self, priority: int) -> dict[str, int]:
        """{queue: milli-GPU} its own pods at or above ``priority`` that ask no whole GPUs (shares, GPU memory,
        MIG) hold, counted and assumed: non-preemptible work the pool scheduler does not run as jobs."""
        out: dict[str, int] = {}
        for queue, at in self.queue_used_at.items():
            milli = sum(m for (p, whole), m in at.items() if p >= priority and not whole)
            if milli:
                out[queue] = milli
        state = self.state
        for key in self.assumed:
            rec = self.pods.get(key)
            info = rec.info if rec is not None else None
            if (info is not None and info.queue and state is not None and info.request.priority >= priority
                    and not is_whole_gpu(info)):
                out[info.queue] = out.get(info.queue, 0) + queue_charge(info, state.assignments.get(key), state)
        return out

    def queue_status(self) -> dict[str, dict[str, Any]]:
        """What each Queue object's ``status`` should say now (the CRD's fields), by Queue name.

        ``usedGPUs``: GPUs its pods and its children's hold (fractions summed; memory-sized shares as their
        fraction of the card; pods being bound included); ``allocatedPods``: its and its children's pods holding
        GPUs or counted; ``pendingPods``: its own pods waiting for gpupool; condition ``Valid`` (False with
        reason ``InvalidSpec`` when the spec cannot be read). The pool's figures (fair share, borrowed GPUs) are
        added by :func:`gpupool.k8s.api.status.queue_statuses`.
        """
        if self.queues is None:
            return {}
        specs, errors, _ = self.queue_specs()
        book = self.queue_book()
        pods: dict[str, int] = {}
        for queue, n in self.queue_pods.items():
            if n:
                for q in book.chain(queue) or [queue]:
                    pods[q] = pods.get(q, 0) + n
        for key in self.assumed:
            rec = self.pods.get(key)
            if rec is not None and rec.info is not None and rec.info.queue:
                for q in book.chain(rec.info.queue) or [rec.info.queue]:
                    pods[q] = pods.get(q, 0) + 1
        pending: dict[str, int] = {}
        for key in self.pending:
            rec = self.pods.get(key)
            if rec is not None and rec.info is not None and rec.info.queue:
                pending[rec.info.queue] = pending.get(rec.info.queue, 0) + 1
        out: dict[str, dict[str, Any]] = {}
        for name in sorted(set(specs) | set(errors)):
            valid = {"type": "Valid", "status": "True", "reason": "SpecRead", "message": "quota and limit in force"}
            if name in errors:
                valid = {"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": errors[name][:1024]}
            out[name] = {"usedGPUs": round(book.used.get(name, 0) / MILLI, 3), "allocatedPods": pods.get(name, 0),
                         "pendingPods": pending.get(name, 0), "conditions": [valid]}
        return out

    def inventory(self) -> InventoryInfo:
        """What :func:`~gpupool.k8s.cache.model.build_state` reports, from the records (O(cluster): dry runs, tests)."""
        state = self.state
        pods: dict[str, PodInfo] = {}
        assignments: dict[str, Assignment] = {}
        for rec in self.pods.values():
            if rec.counted:
                info = self._record_info(rec)
                if rec.key != info.key:
                    info = replace(info, key=rec.key, request=replace(info.request, name=rec.key))
                pods[rec.key] = info
                if state is not None and rec.key in state.assignments:
                    assignments[rec.key] = state.assignments[rec.key]
        skipped_nodes = self.skipped_nodes()
        return {"pods": pods, "assignments": assignments,
                "mig_capacity": {n: dict(r.mig_cap) for n, r in self.nodes.items() if r.mig_cap and r.spec},
                "mig_used": {n: dict(u) for n, u in self.mig_used.items() if any(u.values())},
                "skipped_nodes": skipped_nodes, "skipped_pods": dict(self.skipped_pods),
                "nodes": {n: r.obj for n, r in self.nodes.items() if r.spec is not None}}

    def skipped_nodes(self) -> dict[str, str]:
        out = dict(self.bad_nodes)
        out.update({n: r.error for n, r in self.nodes.items() if r.spec is None})
        return out

    def _after_cycle(self) -> None:
        for key in [k for k in self._constraints if k not in self.pending and k not in self.assumed]:
            del self._constraints[key]
        for key in [k for k in self._last_fail if k not in self.pending]:
            del self._last_fail[key]

    # ------------------------------------------------------------------ preemption outcomes (pool mode)
    def preemption_refused(self, pid: int, blocked: Mapping[str, str]) -> None:
        """The API refused to evict some victims of :class:`~gpupool.k8s.cycle.plan.Preemption` ``pid`` in the dry
        run (``blocked``: pod key -> why, e.g. a PodDisruptionBudget's 429): nothing was evicted. The victims
        are counted again where they run, the preemptor's held placements are dropped (it waits again) and
        the blocked victims are not chosen again for a while (the next cycle chooses other victims)."""
        for pod, (dra_pid, _, _) in list(self.dra_preempting.items()):
            if dra_pid == pid:  # a DRA preemption (cycle.planner): the pod may choose other victims next cycle
                del self.dra_preempting[pod]
                return
        if self.pool is not None:
            self.pool.preemption_refused(pid, dict(blocked))

    def eviction_failed(self, key: str, why: str) -> None:
        """A real eviction of victim ``key`` failed after its dry run passed (a race with a PDB, or the API):
        the victim is counted again and its preemption's held placements are dropped."""
        if self.pool is not None:
            self.pool.eviction_failed(key, why)


def build_state(nodes: Sequence[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]],
                describe: Callable[[Mapping[str, Any]], PodInfo] = describe_pod,
                ) -> tuple[ClusterState, InventoryInfo]:
    """The engine's state for ``nodes`` with every bound, unfinished pod in ``pods`` counted.

    The same books as the live scheduler's and the dry run's: the objects go through a
    :class:`~gpupool.k8s.cache.model.ClusterModel` (one code path). Nodes gpupool cannot read are left out
    (``skipped_nodes``); raises :class:`NoUsableNodeError` (a ValueError) when no node is left. On a node
    whose GPUs are time-sliced (``nvidia.com/gpu.replicas``), a pod bound with ``nvidia.com/gpu: k`` counts
    ``k / replicas`` of one GPU. ``describe`` reads a pod. Returns (state, :class:`InventoryInfo`).
    """
    model = ClusterModel(scheduler_name="", describe=describe)
    model.replace("nodes", list(nodes))
    model.replace("pods", [p for p in pods if isinstance(p, Mapping)])
    state = model.refresh()
    info = model.inventory()
    if state is None:
        skipped = info["skipped_nodes"]
        raise NoUsableNodeError("no usable node" + (f" ({len(skipped)} unreadable)" if skipped else ""), skipped)
    return state, info
