"""The outcome of a planning cycle: :class:`Placement`, :class:`Preemption`, :class:`Plan`, the plan as text, and
the annotations gpupool writes on a pod it places."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MEMORY, ANN_GPU_MILLI, ANN_MIG, ANN_NODE
from gpupool.k8s.cache.devices import InventoryInfo
from gpupool.k8s.cache.queues import QueueBook
from gpupool.model import MILLI


# ------------------------------------------------------------------ the plan
@dataclass(frozen=True, slots=True)
class Placement:
    """Where one pending pod goes (``node`` None: it stays pending, ``reason`` says why)."""

    pod: str
    node: str | None
    gpus: tuple[int, ...] = ()
    gpu_milli: int = 0
    reason: str = ""
    gpu_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    gang: str | None = None
    invalid: bool = False  # the pod's request could not be read (not a matter of capacity)
    nominated: bool = False  # held on ``node`` while preemption victims terminate: set nominatedNodeName, no bind
    waited_s: float | None = None  # seconds since the preemption that made room for it (None: no preemption)
    claims: tuple[Any, ...] = ()  # ClaimAllocation per ResourceClaim to allocate before binding (DRA)
    hami_devices: str = ""  # --share-enforcement hami on a HAMi node: the device string HAMi's plugin reads

    def to_json(self) -> dict[str, Any]:
        """``gpu_milli`` and ``gpu_memory_mib`` are per listed GPU (MiB; 0 = in proportion to the share);
        ``annotations``: what the live scheduler writes on the pod when it binds it."""
        out: dict[str, Any] = {"pod": self.pod, "node": self.node, "gpus": list(self.gpus),
                               "gpu_milli": self.gpu_milli, "gpu_memory_mib": self.gpu_memory_mib,
                               "reason": self.reason}
        if self.mig:
            out["mig"] = {p: c for p, c in self.mig}
        if self.gang:
            out["gang"] = self.gang
        if self.invalid:
            out["invalid"] = True
        if self.nominated:
            out["nominated"] = True
        if self.claims:
            out["claims"] = [{"claim": ca.claim.key, "devices": [
                {"request": r.request, "driver": r.driver, "pool": r.pool, "device": r.device,
                 **({"consumedCapacity": {k: str(v) for k, v in r.consumed.items()}} if r.consumed else {})}
                for r in ca.results]} for ca in self.claims]
        if self.hami_devices:
            out["hami_devices"] = self.hami_devices
        if self.node is not None:
            out["annotations"] = assignment_annotations(self)
        return out


@dataclass
class Preemption:
    """Pods to evict so that a waiting job can start: all or nothing (the pool's victim solver chose them).

    * ``id``: unique per model; outcomes are reported back by it
      (:meth:`~gpupool.k8s.cache.model.ClusterModel.preemption_refused`);
    * ``action``: ``reclaim`` (a queue below its fair share takes GPUs back), ``preempt`` (a higher-order job
      of the same queue), ``shrink`` (an elastic job gives extra workers back), ``consolidate`` (moved to
      defragment);
    * ``preemptor``: the job that waits for the room (PodGroup key or pod key; "" when none);
    * ``reason``: the message for the victims' Event and ``DisruptionTarget`` condition;
    * ``victims``: ``(pod key, uid)`` to evict through the Eviction API;
    * ``nominated``: the preemptor's pods held on the victims' devices (``status.nominatedNodeName``);
    * ``grace_s``: the longest ``terminationGracePeriodSeconds`` among the victims (s).
    """

    id: int
    action: str
    preemptor: str
    reason: str
    victims: list[tuple[str, str]]
    nominated: list[Placement] = field(default_factory=list)
    grace_s: float = 30.0


@dataclass
class Plan:
    """The outcome of :func:`plan`: a :class:`Placement` per pending pod, in the order they were decided.

    ``state`` is the engine's state after the placements (None when there was nothing to do or no node);
    ``queues`` the queue book after them.
    """

    placements: list[Placement]
    inventory: InventoryInfo | None
    policy: str
    state: ClusterState | None = None
    queues: QueueBook | None = None
    skipped_nodes: dict[str, str] = field(default_factory=dict)
    preemptions: list[Preemption] = field(default_factory=list)  # evictions to carry out (pool mode)
    denominated: list[str] = field(default_factory=list)  # pods whose nomination lapsed: clear nominatedNodeName

    @property
    def placed(self) -> list[Placement]:
        return [p for p in self.placements if p.node is not None and not p.nominated]

    @property
    def skipped(self) -> list[dict[str, str]]:
        """Nodes left out (``{"node", "reason"}``) and bound pods not (fully) counted (``{"pod", "reason"}``)."""
        nodes = dict(self.skipped_nodes)
        pods: dict[str, str] = {}
        if self.inventory is not None:
            nodes.update(self.inventory["skipped_nodes"])
            pods = self.inventory["skipped_pods"]
        return ([{"node": n, "reason": r} for n, r in nodes.items()]
                + [{"pod": k, "reason": r} for k, r in pods.items()])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"placements": [p.to_json() for p in self.placements],
                               "summary": {"policy": self.policy, "pending": len(self.placements),
                                           "placed": len(self.placed)}}
        if self.queues is not None and self.queues.known:
            out["queues"] = {name: {"used_gpus": self.queues.used.get(name, 0) / MILLI,
                                    "quota_gpus": q.quota_milli / MILLI,
                                    "limit_gpus": None if q.limit_milli is None else q.limit_milli / MILLI}
                             for name, q in sorted(self.queues.specs.items())}
        skipped = self.skipped
        if skipped:
            out["skipped"] = skipped
        if self.preemptions:
            out["preemptions"] = [{"id": p.id, "action": p.action, "preemptor": p.preemptor, "reason": p.reason,
                                   "victims": [k for k, _ in p.victims],
                                   "nominated": {n.pod: n.node for n in p.nominated}} for p in self.preemptions]
            out["summary"]["evictions"] = sum(len(p.victims) for p in self.preemptions)
            out["summary"]["nominated"] = sum(1 for p in self.placements if p.nominated)
        return out


def format_plan(result: Plan) -> str:
    """A plain-text table of a plan (one line per pod)."""
    rows = [("POD", "NODE", "GPUS", "MILLI", "MIB", "REASON")]
    for p in result.placements:
        placed = p.node is not None and bool(p.gpus)
        rows.append((p.pod, p.node or "-", ",".join(map(str, p.gpus)) or "-", str(p.gpu_milli) if placed else "-",
                     str(p.gpu_memory_mib) if placed and p.gpu_memory_mib else "-", p.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5] for r in rows]
    lines.append("(MILLI and MIB: share and GPU memory taken on each listed GPU)")
    for item in result.skipped:
        what = f"node {item['node']}" if "node" in item else f"bound pod {item['pod']}"
        lines.append(f"skipped {what}: {item['reason']}")
    for pre in result.preemptions:
        for key, _ in pre.victims:
            lines.append(f"would evict {key} ({pre.action}): {pre.reason}")
    placed = len(result.placed)
    nominated = sum(1 for p in result.placements if p.nominated)
    held = f", {nominated} nominated (bound once the evicted pods are gone)" if nominated else ""
    lines.append(f"{placed} of {len(result.placements)} pending pod(s) placed{held} (policy {result.policy}; "
                 "dry run, nothing bound)")
    return "\n".join(lines)


def assignment_annotations(p: Placement) -> dict[str, str]:
    """The annotations gpupool writes on a pod it places."""
    ann = {
        ANN_NODE: p.node or "",
        ANN_GPU_INDEX: ",".join(str(g) for g in p.gpus),
        ANN_GPU_MILLI: str(p.gpu_milli),
        ANN_GPU_MEMORY: str(p.gpu_memory_mib),
    }
    if p.mig:
        ann[ANN_MIG] = ",".join(f"{prof}={n}" for prof, n in p.mig)
    return ann
