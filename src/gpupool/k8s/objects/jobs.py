"""Kubernetes objects read for pool jobs: topology (gpupool, KAI, Volcano, Kueue spellings), max-member,
run-time limit, whole-GPU test, job identity, ``startTime``, grace period. No state, no I/O; imports
k8s conventions, k8s.requests and cluster only."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpupool.cluster import slice_ask
from gpupool.k8s import LABEL_NVLINK_DOMAIN
from gpupool.k8s.objects.fields import annotations_of, labels_of
from gpupool.k8s.objects.pods import PodInfo

ANN_MAX_MEMBER = "gpupool.io/max-member"
"""PodGroup (or pod) annotation: most pods of an elastic gang that may run (default: every pod it has)."""
ANN_TOPOLOGY = "gpupool.io/topology"
"""PodGroup (or pod) annotation: ``required``, ``preferred`` (default) or ``none``."""
ANN_TOPOLOGY_TIER = "gpupool.io/topology-tier"
"""PodGroup (or pod) annotation: the slowest tier the gang may cross: ``nvlink``, ``node`` or ``switch``."""
ANN_KUEUE_REQUIRED = "kueue.x-k8s.io/podset-required-topology"
ANN_KUEUE_PREFERRED = "kueue.x-k8s.io/podset-preferred-topology"
_HOSTNAME = "kubernetes.io/hostname"


def _tier_of_label(label: str) -> str:
    """A node label (KAI / Kueue topology level) -> gpupool's topology tier."""
    if label in (_HOSTNAME, "node"):
        return "node"
    if label in (LABEL_NVLINK_DOMAIN, "nvidia.com/gpu.clique"):
        return "nvlink"
    return "switch"  # rack, switch, block, zone: one leaf switch / rack is the scope gpupool knows


def job_topology(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(mode, tier)`` of a job from its PodGroup (else its first pod): gpupool's annotations
    (:data:`ANN_TOPOLOGY`, :data:`ANN_TOPOLOGY_TIER`), KAI's ``spec.topologyConstraint``
    (``requiredTopologyLevel`` / ``preferredTopologyLevel``, node labels), Volcano's ``spec.networkTopology``
    (``mode: hard|soft``, ``highestTierAllowed``: 1 = NVLink, 2+ = switch), Kueue's pod annotations
    (``podset-required-topology`` / ``podset-preferred-topology``). Default ``("preferred", "switch")``;
    an unreadable value falls back to the default (the gang is still placed)."""
    for obj in (group, pod):
        if not isinstance(obj, Mapping):
            continue
        ann = annotations_of(obj)
        mode = str(ann.get(ANN_TOPOLOGY, "")).strip().lower()
        tier = str(ann.get(ANN_TOPOLOGY_TIER, "")).strip().lower()
        if mode in ("required", "preferred", "none"):
            return mode, tier if tier in ("nvlink", "node", "switch") else "switch"
        spec = obj.get("spec") if isinstance(obj.get("spec"), Mapping) else {}
        tc = spec.get("topologyConstraint")
        if isinstance(tc, Mapping):
            if tc.get("requiredTopologyLevel"):
                return "required", _tier_of_label(str(tc["requiredTopologyLevel"]))
            if tc.get("preferredTopologyLevel"):
                return "preferred", _tier_of_label(str(tc["preferredTopologyLevel"]))
        nt = spec.get("networkTopology")
        if isinstance(nt, Mapping):
            m = str(nt.get("mode", "hard")).lower()
            try:
                highest = int(nt.get("highestTierAllowed", 2))
            except (TypeError, ValueError):
                highest = 2
            return ("required" if m == "hard" else "preferred"), ("nvlink" if highest <= 1 else "switch")
        if ann.get(ANN_KUEUE_REQUIRED):
            return "required", _tier_of_label(str(ann[ANN_KUEUE_REQUIRED]))
        if ann.get(ANN_KUEUE_PREFERRED):
            return "preferred", _tier_of_label(str(ann[ANN_KUEUE_PREFERRED]))
    return "preferred", "switch"


def max_member(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> int | None:
    """:data:`ANN_MAX_MEMBER` of the PodGroup (else the pod), or None (no cap, or unreadable)."""
    for obj in (group, pod):
        if isinstance(obj, Mapping):
            raw = annotations_of(obj).get(ANN_MAX_MEMBER)
            if raw is not None:
                try:
                    n = int(str(raw).strip())
                except ValueError:
                    return None
                return n if n >= 1 else None
    return None


LABEL_KUEUE_MAX_EXEC = "kueue.x-k8s.io/max-exec-time-seconds"
"""Kueue's maximum execution time of a job (seconds), a label on the job or its pods."""


def run_time_limit(group: Mapping[str, Any] | None, pod: Mapping[str, Any] | None) -> float | None:
    """The run-time limit a job declares, in seconds: Kueue's :data:`LABEL_KUEUE_MAX_EXEC` on its PodGroup or
    pod, else the pod's ``spec.activeDeadlineSeconds`` (the limit the kubelet enforces); None when there is
    none or it is not a whole number of seconds >= 1 (the job is then ranked by the learned sizes)."""
    candidates: list[Any] = []
    for obj in (group, pod):
        if isinstance(obj, Mapping):
            candidates.append(labels_of(obj).get(LABEL_KUEUE_MAX_EXEC))
    if isinstance(pod, Mapping) and isinstance(pod.get("spec"), Mapping):
        candidates.append(pod["spec"].get("activeDeadlineSeconds"))
    for raw in candidates:
        if raw is None or isinstance(raw, bool):
            continue
        text = str(raw).strip()
        if text.isdigit() and 1 <= int(text) <= 10**12:  # whole seconds; beyond 30,000 years: a typo, ignored
            return float(int(text))
    return None


def is_whole_gpu(info: PodInfo) -> bool:
    """Does the pod ask whole GPUs (device-plugin units) or none: a pool job? Shared asks (a fraction, GPU
    memory, MIG devices) are not: they keep the part-1 placement path."""
    r = info.request
    if info.mig:
        return False
    return r.num_gpu == 0 or slice_ask(r.gpu_milli, r.gpu_milli, r.gpu_memory_mib)


def job_identity(group: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]]) -> str:
    """What makes a job the same job when its pods are re-created: its PodGroup object's uid, else the uid of
    its pods' controller (the Job, JobSet, PyTorchJob or StatefulSet that re-creates them); "" when neither is
    known (bare pods: a pod re-applied under the same name is a new job)."""
    meta = group.get("metadata") if isinstance(group, Mapping) else None
    uid = meta.get("uid") if isinstance(meta, Mapping) else None
    if isinstance(uid, str) and uid:
        return "podgroup:" + uid
    for obj in pods:
        meta = obj.get("metadata") if isinstance(obj, Mapping) else None
        refs = meta.get("ownerReferences") if isinstance(meta, Mapping) else None
        for ref in refs if isinstance(refs, list) else ():
            if isinstance(ref, Mapping) and ref.get("controller") and isinstance(ref.get("uid"), str) and ref["uid"]:
                return "owner:" + ref["uid"]
    return ""


def started_at(pod: Mapping[str, Any]) -> float | None:
    """``status.startTime`` (seconds since the epoch), None when absent or unreadable."""
    from datetime import datetime

    status = pod.get("status") if isinstance(pod.get("status"), Mapping) else {}
    raw = status.get("startTime")
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return datetime.fromisoformat(raw.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def grace_s(pod: Mapping[str, Any]) -> float:
    spec = pod.get("spec") if isinstance(pod.get("spec"), Mapping) else {}
    raw = spec.get("terminationGracePeriodSeconds", 30)
    try:
        return max(0.0, float(raw))
    except (TypeError, ValueError):
        return 30.0


def gang_of(rec: Any) -> str | None:
    return rec.info.pod_group if rec is not None and rec.info is not None else None
