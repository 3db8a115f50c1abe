"""A kubelet-and-API stand-in for pool-mode tests of :class:`gpupool.k8s.state.ClusterModel`.

It feeds a model the objects a real API server would send as watch events and carries out each plan as the
live scheduler does: a placement becomes a binding (``spec.nodeName`` and gpupool's device annotations, as the
Binding subresource writes them), a nominated placement waits, a preemption's victims are evicted (deleted,
as a pod without a kubelet-held grace period is) unless a PodDisruptionBudget stand-in blocks them in the
dry run. Time is a test clock, so minimum runtimes and reservations are exact.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable
from typing import Any

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.pool import PoolDriver, live_config
from gpupool.k8s.state import ClusterModel

_rv = itertools.count(1000)


def node(name: str, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3", **labels: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": str(next(_rv)),
                         "labels": {"nvidia.com/gpu.product": product, **labels}},
            "spec": {},
            "status": {"allocatable": {"cpu": "128", "memory": "1024Gi", "nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def queue(name: str, quota: float = 0, limit: float | None = None, weight: float = 1, parent: str | None = None,
          priority: int = 0) -> dict:
    spec: dict[str, Any] = {"quota": quota, "weight": weight, "priority": priority}
    if limit is not None:
        spec["limit"] = limit
    if parent:
        spec["parent"] = parent
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": name, "resourceVersion": str(next(_rv))}, "spec": spec}


def pod_group(name: str, min_member: int, ns: str = "default", **annotations: str) -> dict:
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": str(next(_rv)),
                         "annotations": dict(annotations)},
            "spec": {"minMember": min_member}}


def pod(name: str, gpus: int = 1, queue: str | None = None, group: str | None = None, priority: int = 0,
        created: float = 0.0, ns: str = "default", scheduler: str = "gpupool", grace: int = 30) -> dict:
    labels: dict[str, str] = {}
    if queue:
        labels["kueue.x-k8s.io/queue-name"] = queue
    if group:
        labels["scheduling.x-k8s.io/pod-group"] = group
    import datetime as _dt

    stamp = _dt.datetime.fromtimestamp(1_700_000_000 + created, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}-{next(_rv)}",
                         "resourceVersion": str(next(_rv)), "labels": labels, "annotations": {},
                         "creationTimestamp": stamp},
            "spec": {"schedulerName": scheduler, "priority": priority, "terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)},
                                                                "requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}}


class Cluster:
    """A model in pool mode plus the objects it was told about; ``run()`` plays scheduler and kubelet."""

    def __init__(self, nodes: Iterable[dict], queues: Iterable[dict] | None = None, groups: Iterable[dict] = (),
                 **config: Any) -> None:
        self.now = 1_700_000_000.0
        self.model = ClusterModel(clock=lambda: self.now)
        self.driver = PoolDriver(self.model, live_config(**config), clock=lambda: self.now)
        self.pods: dict[str, dict] = {}
        self.pdb_blocked: set[str] = set()  # pod keys whose eviction a PodDisruptionBudget refuses
        self.slow: set[str] = set()  # victims that do not terminate (a stuck kubelet)
        self.log: list[tuple[float, str, str]] = []  # (time, what, detail)
        self.model.replace("nodes", list(nodes))
        self.model.replace("queues", list(queues) if queues is not None else None)
        self.model.replace("podgroups", list(groups))
        self.model.replace("volcanopodgroups", [])
        self.model.replace("pods", [])
        self.plans: list[Any] = []

    # ---- the API side
    def add(self, *pods: dict) -> None:
        for p in pods:
            key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
            self.pods[key] = p
            self.model.apply("pods", "ADDED", p)

    def add_group(self, group: dict) -> None:
        self.model.apply("podgroups", "ADDED", group)

    def _update(self, key: str, fn: Any) -> None:
        p = copy.deepcopy(self.pods[key])
        fn(p)
        p["metadata"]["resourceVersion"] = str(next(_rv))
        self.pods[key] = p
        self.model.apply("pods", "MODIFIED", p)

    def finish(self, key: str, phase: str = "Succeeded") -> None:
        """The pod's containers exit (a kubelet patches the phase)."""
        self._update(key, lambda p: p["status"].__setitem__("phase", phase))
        self.log.append((self.now, "finished", key))

    def delete(self, key: str) -> None:
        p = self.pods.pop(key)
        self.model.apply("pods", "DELETED", p)

    # ---- the scheduler side
    def cycle(self) -> Any:
        plan = self.model.cycle()
        self.plans.append(plan)
        for pre in plan.preemptions:
            blocked = {k: "Cannot evict pod as it would violate the pod's disruption budget."
                       for k, _ in pre.victims if k in self.pdb_blocked}
            if blocked:
                self.model.preemption_refused(pre.id, blocked)
                self.log.append((self.now, "refused", ",".join(sorted(blocked))))
                continue
            for key, _ in pre.victims:
                self.log.append((self.now, f"evicted:{pre.action}", key))
                if key in self.slow:
                    self._update(key, lambda p: p["metadata"].__setitem__("deletionTimestamp", "2025-01-01T00:00:00Z"))
                elif key in self.pods:
                    self.delete(key)
        for p in plan.placements:
            if p.node is None or p.nominated:
                continue
            self.bind(p)
        return plan

    def bind(self, p: Any) -> None:
        def write(obj: dict) -> None:
            obj["spec"]["nodeName"] = p.node
            obj["metadata"]["annotations"].update({ANN_NODE: p.node, ANN_GPU_INDEX: ",".join(map(str, p.gpus)),
                                                   ANN_GPU_MILLI: str(p.gpu_milli)})
            obj["status"]["phase"] = "Running"

        self.model.bound(p.pod)
        self._update(p.pod, write)
        self.log.append((self.now, "bound", p.pod))

    def run(self, seconds: float, step: float = 1.0) -> None:
        end = self.now + seconds
        while self.now < end:
            self.cycle()
            self.now += step

    # ---- views
    def running(self, prefix: str = "") -> list[str]:
        return sorted(k for k, p in self.pods.items() if p["spec"].get("nodeName") and k.startswith(prefix)
                      and p["status"]["phase"] == "Running")

    def pending(self, prefix: str = "") -> list[str]:
        return sorted(k for k, p in self.pods.items() if not p["spec"].get("nodeName") and k.startswith(prefix))

    def reason(self, key: str) -> str:
        for plan in reversed(self.plans):
            for p in plan.placements:
                if p.pod == key:
                    return p.reason
        return ""
