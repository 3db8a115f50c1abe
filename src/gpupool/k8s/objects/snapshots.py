"""The kubectl dump file format: a cluster snapshot (Nodes, Pods, PodGroups, Queues as the API returns them)
read from ``kubectl get ... -o yaml`` / ``-o json`` output. Imports nothing of gpupool.k8s but its conventions."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gpupool.inputs import yaml_error_message
from gpupool.k8s import POD_GROUP_API, QUEUE_API, VOLCANO_POD_GROUP_API
from gpupool.model import GpupoolError

log = logging.getLogger("gpupool.k8s.snapshot")


class SnapshotError(GpupoolError, ValueError):
    """A snapshot file gpupool cannot read."""


# ------------------------------------------------------------------ the snapshot
@dataclass
class ClusterSnapshot:
    """Objects as the API returns them (dicts). ``queues`` None: the Queue CRD is not installed (no limits)."""

    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    pod_groups: list[dict[str, Any]] = field(default_factory=list)
    queues: list[dict[str, Any]] | None = None
    ignored: int = 0
    resourceslices: list[dict[str, Any]] = field(default_factory=list)  # resource.k8s.io (DRA)
    deviceclasses: list[dict[str, Any]] = field(default_factory=list)
    resourceclaims: list[dict[str, Any]] = field(default_factory=list)


def _group(obj: Mapping[str, Any]) -> str:
    api = str(obj.get("apiVersion") or "")
    return api.rsplit("/", 1)[0] if "/" in api else ""


def _flatten(docs: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for doc in docs:
        if doc is None:
            continue
        if isinstance(doc, list):
            yield from _flatten(doc)
        elif isinstance(doc, Mapping) and isinstance(doc.get("items"), list) and (
            doc.get("kind") in (None, "List") or str(doc.get("kind", "")).endswith("List")
        ):
            list_kind = str(doc.get("kind", ""))
            for item in doc["items"]:
                typed_list = list_kind.endswith("List") and list_kind != "List"
                if isinstance(item, Mapping) and "kind" not in item and typed_list:
                    item = {**item, "kind": list_kind[: -len("List")], "apiVersion": doc.get("apiVersion", "v1")}
                yield from _flatten([item])
        elif isinstance(doc, Mapping):
            yield doc


def snapshot_from_objects(objects: Iterable[Any]) -> ClusterSnapshot:
    """Sort API objects (or ``v1/List`` documents holding them) into a :class:`ClusterSnapshot`."""
    snap = ClusterSnapshot()
    queues: list[dict[str, Any]] = []
    objects = list(objects)
    # `kubectl get queues.gpupool.io -o yaml` on a cluster with the CRD and no Queue writes an empty QueueList:
    # the CRD is installed (pods naming a queue wait), which a file without it cannot say
    queue_crd = any(isinstance(d, Mapping) and d.get("kind") == "QueueList"
                    and str(d.get("apiVersion", "")).startswith(QUEUE_API[0] + "/") for d in objects)
    for obj in _flatten(objects):
        kind, group = obj.get("kind"), _group(obj)
        if kind == "Node" and group == "":
            snap.nodes.append(dict(obj))
        elif kind == "Pod" and group == "":
            snap.pods.append(dict(obj))
        elif kind == "PodGroup" and group in (POD_GROUP_API[0], VOLCANO_POD_GROUP_API[0]):
            snap.pod_groups.append(dict(obj))
        elif kind == "Queue" and group == QUEUE_API[0]:
            queues.append(dict(obj))
        elif group == "resource.k8s.io" and kind in ("ResourceSlice", "DeviceClass", "ResourceClaim"):
            {"ResourceSlice": snap.resourceslices, "DeviceClass": snap.deviceclasses,
             "ResourceClaim": snap.resourceclaims}[str(kind)].append(dict(obj))
        else:
            snap.ignored += 1
    snap.queues = queues or ([] if queue_crd else None)
    return snap


def load_snapshot(path: str | Path) -> ClusterSnapshot:
    """Read a ``kubectl get ... -o yaml`` / ``-o json`` file (a ``v1/List``, several YAML documents, or one object)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise SnapshotError(f"{p}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                            "kubectl writes UTF-8") from None
    stripped = text.lstrip()
    try:
        if stripped.startswith(("{", "[")):
            docs: list[Any] = [json.loads(text)]
        else:
            docs = list(yaml.safe_load_all(text))
    except json.JSONDecodeError as exc:
        raise SnapshotError(f"{p}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from None
    except yaml.YAMLError as exc:  # one line, FILE:LINE:COLUMN: invalid YAML: what
        raise SnapshotError(yaml_error_message(exc, str(p))) from None
    except (ValueError, RecursionError) as exc:  # e.g. a YAML value PyYAML cannot construct
        raise SnapshotError(f"{p}: unreadable: {exc}") from None
    if not any(isinstance(d, Mapping | list) for d in docs):
        raise SnapshotError(f"{p}: no Kubernetes objects found")
    snap = snapshot_from_objects(docs)
    if not snap.nodes and not snap.pods:
        raise SnapshotError(f"{p}: no Node or Pod objects found (expected kubectl -o yaml/-o json output)")
    return snap
