"""Whole GPUs counted where the kubelet put them (device-plugin nodes; issue 28 part 2).

The node agent publishes the kubelet's PodResources map on its Node (``gpupool.io/pod-devices``:
:func:`~gpupool.k8s.objects.agent_report.read_pod_devices`, pod -> GPU UUIDs). :class:`KubeletBooks` is the part of
:class:`~gpupool.k8s.cache.model.ClusterModel` that reads it:

* a bound device-plugin GPU pod (``nvidia.com/gpu: N``: :func:`~gpupool.k8s.cache.devices.plugin_gpus`) that the
  map names is counted on exactly those GPUs (UUID -> index through the node's ``gpu_ids``, the agent's GPU list),
  before pods whose devices only annotations name, whatever gpupool's own ``gpupool.io/gpu-index`` says (logged
  once per pod: ``kubelet_placed_elsewhere``);
* such a pod the map does not name yet (just bound, or assumed: the kubelet has not picked its GPUs) is
  *unsettled*: counted as before (its booked or the lowest free GPUs, so the count is right but not which
  GPUs), and its node takes no GPU share (``Eligibility.unsettled``, the ``_UnsettledFilter``) until the map
  names it or it ends. The safe rule: every free GPU of that node may be the pod's, so none is proven free for
  a share; whole-GPU asks still go there, the kubelet enforces their count;
* a map that changes recounts that node's pods in place (no rebuild).

A node whose GPUs have no identities (no agent inventory matching ``nvidia.com/gpu``) cannot read the map: it is
ignored there (logged once) and the node books as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.k8s.cache.devices import annotated_devices, bound_order, kubelet_devices, plugin_gpus
from gpupool.k8s.cache.records import PodRecord
from gpupool.k8s.objects.agent_report import read_pod_devices
from gpupool.k8s.objects.nodes import warn_once
from gpupool.k8s.objects.pods import PodInfo

__all__ = ["KubeletBooks", "kubelet_pods"]


def kubelet_pods(name: str, obj: Mapping[str, Any], spec: Any) -> dict[str, tuple[str, ...]] | None:
    """The node agent's kubelet map of Node ``obj`` (``gpupool.io/pod-devices``), None when absent or when the node
    has no device identities to read it with (``spec.gpu_ids``; logged once)."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), Mapping) else None
    pods = read_pod_devices(annotations)
    if pods is not None and not spec.gpu_ids:
        warn_once(name, "kubelet_map_unusable", f"node {name}: kubelet pod -> GPU map ignored: the node's GPUs have "
                  "no identities (gpupool.io/gpu-inventory missing or not matching nvidia.com/gpu)",
                  event="kubelet_map_unusable", node=name)
        return None
    return pods


class KubeletBooks:
    """The kubelet-map part of :class:`~gpupool.k8s.cache.model.ClusterModel` (a mixin: it reads and writes the
    model's ``nodes``, ``pods``, ``state``, ``elig``, ``on_node``, ``unsettled`` and ``_dirty``, and calls its
    ``_uncount`` / ``_count_in``)."""

    nodes: dict[str, Any]
    pods: dict[str, PodRecord]
    state: ClusterState | None
    elig: Any
    on_node: dict[str, set[str]]
    unsettled: dict[str, set[str]]
    _dirty: bool

    def _uncount(self, rec: PodRecord) -> None:  # pragma: no cover - the model's
        raise NotImplementedError

    def _count_in(self, state: ClusterState, rec: PodRecord) -> None:  # pragma: no cover - the model's
        raise NotImplementedError

    def _kubelet_placed(self, rec: PodRecord, info: PodInfo, state: ClusterState,
                        node: int) -> tuple[tuple[int, ...], int] | None:
        """(device indices, most devices on one GPU) where the kubelet put ``rec``'s device-plugin GPUs, when its
        node's map names it (:func:`~gpupool.k8s.cache.devices.kubelet_devices`); sets ``rec.kubelet`` and
        ``rec.unsettled`` (a device-plugin GPU pod on a node with a map that does not name it, or names devices
        that are not the node's GPUs). Logs ``kubelet_placed_elsewhere`` once per pod when gpupool's annotation
        named other GPUs."""
        rec.kubelet = rec.unsettled = False
        nrec = self.nodes.get(rec.node)
        pods = nrec.kubelet_pods if nrec is not None else None
        if pods is None or not plugin_gpus(info):
            return None
        uuids = pods.get(rec.base)
        placed = kubelet_devices(uuids, state.nodes[node].gpu_ids) if uuids else None
        # one device per GPU unless the GPUs are time-sliced (then at most as many replicas as each GPU has)
        if placed is None or len(uuids or ()) != info.request.num_gpu or placed[1] > int(state.gpu_replicas[node]):
            rec.unsettled = True
            if uuids:
                warn_once(rec.key, "kubelet_devices_unknown", "kubelet reports devices gpupool cannot place; the pod "
                          "counts as not reported", event="kubelet_devices_unknown", pod=rec.key, node=rec.node,
                          devices=list(uuids))
            return None
        rec.kubelet = True
        annotated = annotated_devices(rec.obj)
        if annotated is not None and tuple(sorted(annotated[0])) != placed[0]:
            warn_once(rec.key, "kubelet_placed_elsewhere", "the kubelet gave the pod other GPUs than gpupool booked; "
                      "counted where the kubelet put it", event="kubelet_placed_elsewhere", pod=rec.key,
                      node=rec.node, booked=list(annotated[0]), kubelet=list(placed[0]))
        return placed

    def _order(self, rec: PodRecord) -> tuple:
        """Counting order on a node: pods the kubelet map names (0), then those whose devices gpupool or HAMi named
        (1), then the rest (2); oldest first within each."""
        nrec = self.nodes.get(rec.node)
        pods = nrec.kubelet_pods if nrec is not None else None
        guessed, created, key = bound_order(rec.obj)
        rank = 0 if pods is not None and rec.base in pods else (2 if guessed else 1)
        return (rank, created, key, rec.key)

    def _recount_node(self, name: str) -> None:
        """The kubelet map of node ``name`` changed: its pods are counted again, kubelet-named ones first."""
        if self._dirty or self.state is None or name not in self.state.node_index:
            return
        recs = [r for k in list(self.on_node.get(name, ())) if (r := self.pods.get(k)) is not None and r.counted]
        for r in recs:
            self._uncount(r)
        for r in sorted(recs, key=self._order):
            self._count_in(self.state, r)
        self._sync_unsettled(name)

    def _plugin_unknown(self, key: str, node: str) -> bool:
        """Is pod ``key``, placed on ``node``, a device-plugin GPU pod that the node's kubelet map (there is one)
        does not name?"""
        rec, nrec = self.pods.get(key), self.nodes.get(node)
        return (rec is not None and rec.info is not None and nrec is not None and nrec.kubelet_pods is not None
                and plugin_gpus(rec.info) and rec.base not in nrec.kubelet_pods)

    def _set_unsettled(self, node: str, key: str, on: bool) -> None:
        keys = self.unsettled.setdefault(node, set())
        if on:
            keys.add(key)
        else:
            keys.discard(key)
        self._sync_unsettled(node)

    def _sync_unsettled(self, name: str) -> None:
        """Tell the eligibility filter whether node ``name`` has device-plugin GPU pods its kubelet map does not
        name yet (GPU shares then keep off it); the node's cached masks refresh."""
        state, elig = self.state, self.elig
        if state is None or elig is None or self._dirty:
            return
        i = state.node_index.get(name)
        if i is None:
            return
        flag = bool(self.unsettled.get(name))
        if flag != (i in elig.unsettled):
            if flag:
                elig.unsettled.add(i)
            else:
                elig.unsettled.discard(i)
            state.touch(i)

