"""Where a GPU share may go: only to a node where something enforces it (``--share-enforcement``).

A *share* is a GPU ask of less than whole GPUs or with a GPU memory cap (KAI ``gpu-fraction`` / ``gpu-memory``,
HAMi ``nvidia.com/gpumem`` / ``gpumem-percentage`` / ``gpucores`` below 100, Volcano ``volcano.sh/vgpu-*``,
Alibaba ``alibabacloud.com/gpu-milli``). On a device-plugin node nothing hands such a pod the GPU gpupool chose
(the NVIDIA device plugin hands whole GPUs, picked by the kubelet) and nothing caps its memory or SMs, unless
HAMi's device plugin runs there (it reads the devices from the pod's annotations and HAMi-core caps them).
Whole-GPU and MIG asks are not shares: the NVIDIA device plugin hands them over.

Modes (:data:`gpupool.k8s.SHARE_ENFORCEMENT_MODES`):

* ``none``: no share is placed; the pod's ``FailedScheduling`` names what to install;
* ``hami``: a share goes only to nodes with HAMi's registration (``hami.io/node-nvidia-register``), and only when
  asked in HAMi's spelling (``nvidia.com/gpu`` with ``gpumem`` / ``gpumem-percentage`` / ``gpucores``): HAMi's
  plugin is called by the kubelet only for containers asking ``nvidia.com/gpu``, so an annotation-only ask
  (KAI, Alibaba) or Volcano's resources would get no GPU from it;
* ``trust``: shares go anywhere, as before this setting existed (the operator vouches for some other mechanism,
  e.g. KAI's reservation pods or Volcano's vGPU device plugin).

The filters here are engine filter plugins (static: they read the node's object and the request only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest
from gpupool.k8s import SHARE_ENFORCEMENT_MODES
from gpupool.model import MILLI, PodRequest

HAMI_SPELLING = "hami"
""":attr:`gpupool.k8s.objects.gpu_asks.GpuAsk.spelling` of an ask HAMi's device plugin can serve."""


def share_spelling(request: PodRequest, spelling: str) -> str:
    """``spelling`` (the ask's spelling, e.g. ``"kai gpu-fraction"``) when ``request`` is a GPU share, else ""."""
    if request.num_gpu and (request.gpu_milli < MILLI or request.gpu_memory_mib > 0):
        return spelling or "share"
    return ""


def check_mode(mode: str, where: str) -> str:
    """``mode`` when it is one of :data:`~gpupool.k8s.SHARE_ENFORCEMENT_MODES`; else :class:`ValueError` naming
    ``where`` (the flag or config key) and the choices."""
    if mode not in SHARE_ENFORCEMENT_MODES:
        raise ValueError(f"{where}: {mode!r}: expected {', '.join(SHARE_ENFORCEMENT_MODES)}")
    return mode


def _share_of(req: EffectiveRequest) -> str:
    constraints = getattr(req, "constraints", None)
    return str(getattr(constraints, "share", "") or "")


def _names(names: Sequence[str], flags: np.ndarray, most: int = 5) -> str:
    picked = [names[i] for i in np.flatnonzero(flags)[:most]]
    more = int(flags.sum()) - len(picked)
    return ", ".join(picked) + (f" and {more} more" if more > 0 else "")


class ShareMechanismFilter:
    """Fails a node for a share unless the mode lets a share go there (see the module doc). ``hami``: (n_nodes,)
    bool, True where HAMi's device plugin registered, updated in place by whoever owns it; ``names``: the node
    names in the same order (for the reason)."""

    static = True

    def __init__(self, mode: str, hami: np.ndarray, names: Sequence[str]) -> None:
        self.mode = check_mode(mode, "share enforcement")
        self.hami = hami
        self.names = names

    @property
    def reason(self) -> str:
        on = _names(self.names, self.hami)
        if self.mode == "hami":
            where = (f"registered on: {on}" if on else "registered on no node: install its DaemonSet on the GPU "
                     "nodes, or ask for the share through a DRA ResourceClaim")
            return ("node(s) had no mechanism enforcing a GPU share (HAMi's device plugin has not registered "
                    f"there: no hami.io/node-nvidia-register annotation; {where})")
        text = ("node(s) had no mechanism enforcing a GPU share (gpupool runs with --share-enforcement none): install "
                "HAMi's device plugin and start gpupool with --share-enforcement hami, or ask for the share through "
                "a DRA ResourceClaim (NVIDIA DRA driver)")
        if on:
            text += f"; HAMi's device plugin is registered on {on}: --share-enforcement hami would use them"
        return text

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        if self.mode == "trust" or not _share_of(req):
            return np.ones(len(nodes), dtype=bool)
        if self.mode == "none":
            return np.zeros(len(nodes), dtype=bool)
        return np.asarray(self.hami[nodes], dtype=bool)


class ShareSpellingFilter:
    """``hami`` mode: fails every node for a share HAMi's device plugin cannot serve (asked through annotations
    or another vendor's resources: the kubelet never calls HAMi's plugin for it)."""

    static = True
    reason = ("node(s) cannot hand over a share asked this way: HAMi's device plugin serves only containers asking "
              "nvidia.com/gpu with nvidia.com/gpumem, nvidia.com/gpumem-percentage or nvidia.com/gpucores "
              "(not KAI gpu-fraction/gpu-memory or alibabacloud.com/gpu-milli annotations, nor volcano.sh/vgpu-*)")

    def mask(self, state: ClusterState, req: EffectiveRequest, nodes: np.ndarray) -> np.ndarray:
        share = _share_of(req)
        return np.full(len(nodes), not share or share == HAMI_SPELLING, dtype=bool)


def share_filters(mode: str, hami: np.ndarray, names: Sequence[str]) -> tuple[Any, ...]:
    """The filters for ``mode``: the spelling check (``hami`` only), then the node's mechanism."""
    mechanism = ShareMechanismFilter(mode, hami, names)
    return (ShareSpellingFilter(), mechanism) if mode == "hami" else (mechanism,)
