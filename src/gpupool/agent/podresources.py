"""Where the kubelet really put each pod's GPUs: the kubelet's PodResources API, read by the node agent.

On a node without DRA, a pod asking ``nvidia.com/gpu: N`` gets the devices the kubelet's device manager picks
from those the NVIDIA device plugin advertises, not necessarily the ones gpupool booked. The kubelet reports its
choice on the gRPC service ``v1.PodResourcesLister`` (``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``,
vendored in :mod:`gpupool.agent.kubelet`) served on the Unix socket :data:`DEFAULT_SOCKET`, the one
dcgm-exporter reads to attribute GPUs to pods. ``List`` returns every pod the kubelet runs with, per container,
``devices`` entries of ``resource_name`` and ``device_ids``.

Device IDs of the NVIDIA device plugin (NVIDIA/k8s-device-plugin, ``internal/rm/devices.go``): the GPU's UUID
(``GPU-8f2c...``; ``DEVICE_ID_STRATEGY=index`` gives the NVML index instead, ``"3"``), and under time-slicing or
MPS one device per replica, ``<id>::<replica>`` (``AnnotatedID``: the part before ``::`` is the GPU). Under the
``single`` MIG strategy the IDs are MIG devices' UUIDs, which name no whole GPU: they are kept as they are and
the scheduler, not finding them among the node's GPUs, treats the pod as not reported.

:class:`PodResourcesReader` reads the map once per agent round: ``ok`` with the map, ``missing`` when the socket
does not exist (logged once: the DaemonSet lacks the hostPath mount, or the kubelet is not there), ``error`` when
the call failed (logged when the error changes). Sources: the kubelet's ``pkg/kubelet/apis/podresources``
server (``List`` answers active pods; message size up to 16 MiB, as dcgm-exporter also allows).
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpupool.k8s.objects.agent_report import POD_DEVICES_RESOURCE

__all__ = ["DEFAULT_SOCKET", "PodResourcesRead", "PodResourcesReader", "gpu_of", "list_pod_devices",
           "resolve_pods"]

log = logging.getLogger("gpupool.agent.podresources")

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
"""The kubelet's PodResources socket (``--pod-resources-socket`` changes it; "" turns the reading off)."""

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""Largest answer accepted (gRPC's default is 4 MiB; the kubelet sends up to 16 MiB)."""

REPLICA_SEPARATOR = "::"
"""The device plugin's ``AnnotatedID``: ``<GPU id>::<replica>`` under time-slicing and MPS."""


def list_pod_devices(socket_path: str, resource: str = POD_DEVICES_RESOURCE,
                     timeout_s: float = 5.0) -> dict[str, tuple[str, ...]]:
    """``namespace/name`` -> the device IDs of ``resource`` the kubelet gave the pod's containers (in the order
    ``List`` answers, each ID once: the kubelet repeats a device for each NUMA node of its topology), for every pod
    holding at least one. Raises ``FileNotFoundError`` when
    ``socket_path`` does not exist or is not a socket, ``grpc.RpcError`` when the call fails (``timeout_s``
    seconds at most)."""
    import grpc

    from gpupool.agent.kubelet import api_pb2, api_pb2_grpc

    try:
        mode = os.stat(socket_path).st_mode
    except OSError as exc:
        raise FileNotFoundError(f"{socket_path}: {exc.strerror or exc}") from None
    if not stat.S_ISSOCK(mode):
        raise FileNotFoundError(f"{socket_path}: not a socket")
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
    with grpc.insecure_channel(f"unix://{os.path.abspath(socket_path)}", options=options) as channel:
        stub = api_pb2_grpc.PodResourcesListerStub(channel)
        answer = stub.List(api_pb2.ListPodResourcesRequest(), timeout=timeout_s)
    out: dict[str, tuple[str, ...]] = {}
    for pod in answer.pod_resources:
        # the kubelet lists a device once per NUMA node it reports for it: each ID counts once per pod
        ids = dict.fromkeys(d for c in pod.containers for dev in c.devices if dev.resource_name == resource
                            for d in dev.device_ids)
        if ids:
            key = f"{pod.namespace}/{pod.name}"
            out[key] = tuple(dict.fromkeys(out.get(key, ()) + tuple(ids)))
    return out


def gpu_of(device_id: str, uuids: Iterable[str], by_index: Mapping[str, str]) -> str:
    """The UUID of the GPU a device plugin ID names: ``GPU-x`` and ``GPU-x::2`` -> ``GPU-x``; an index (``"3"``,
    ``"3::1"``, ``DEVICE_ID_STRATEGY=index``) -> that GPU's UUID through ``by_index``; anything else (a MIG device)
    is returned without its replica suffix, unresolved."""
    base = device_id.split(REPLICA_SEPARATOR, 1)[0]
    if base in uuids:
        return base
    return by_index.get(base, base)


def resolve_pods(pods: Mapping[str, Iterable[str]], devices: Iterable[Any]) -> dict[str, list[str]]:
    """``pods`` (device IDs as the kubelet reports them) with each ID resolved to its GPU's UUID by
    :func:`gpu_of`, through ``devices`` (the agent's discovered GPUs: ``uuid`` and ``index`` attributes)."""
    devices = list(devices)
    uuids = {str(d.uuid) for d in devices}
    by_index = {str(d.index): str(d.uuid) for d in devices}
    return {key: [gpu_of(i, uuids, by_index) for i in ids] for key, ids in pods.items()}


@dataclass
class PodResourcesRead:
    """One reading: ``status`` ``ok`` (``pods`` is the map), ``missing`` (no socket) or ``error`` (``error``
    says why)."""

    status: str
    pods: dict[str, tuple[str, ...]] = field(default_factory=dict)
    error: str = ""

    @property
    def up(self) -> bool:
        return self.status == "ok"


class PodResourcesReader:
    """Reads the kubelet's PodResources map on ``socket_path`` (:func:`list_pod_devices`); never raises.

    Logs once when the socket is missing (and once when it comes back), and an error when it differs from the
    last one; :attr:`last` is the last :class:`PodResourcesRead`, :attr:`reads` / :attr:`failures` count them.
    """

    def __init__(self, socket_path: str = DEFAULT_SOCKET, timeout_s: float = 5.0,
                 resource: str = POD_DEVICES_RESOURCE) -> None:
        self.socket_path = socket_path
        self.timeout_s = timeout_s
        self.resource = resource
        self.last: PodResourcesRead | None = None
        self.reads = 0
        self.failures = 0

    def read(self) -> PodResourcesRead:
        """The map now (see :class:`PodResourcesRead`)."""
        import grpc

        self.reads += 1
        previous = self.last
        try:
            result = PodResourcesRead("ok", list_pod_devices(self.socket_path, self.resource, self.timeout_s))
        except FileNotFoundError as exc:
            result = PodResourcesRead("missing", error=str(exc))
            if previous is None or previous.status != "missing":
                log.warning("kubelet PodResources socket missing (%s): whole GPUs are not reported where the kubelet "
                            "put them; mount /var/lib/kubelet/pod-resources read-only into the agent "
                            "(deploy/agent/pod-resources), or pass --pod-resources-socket '' not to read it",
                            exc, extra={"event": "pod_resources_missing", "socket": self.socket_path})
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            result = PodResourcesRead("error", error=f"{getattr(code, 'name', code)}: {details}")
            if previous is None or previous.error != result.error:
                log.warning("kubelet PodResources List failed: %s", result.error,
                            extra={"event": "pod_resources_failed", "socket": self.socket_path})
        except Exception as exc:  # noqa: BLE001 - a bad answer never stops the agent
            result = PodResourcesRead("error", error=f"{type(exc).__name__}: {exc}")
            if previous is None or previous.error != result.error:
                log.warning("kubelet PodResources List failed: %s", result.error,
                            extra={"event": "pod_resources_failed", "socket": self.socket_path})
        if not result.up:
            self.failures += 1
        elif previous is not None and not previous.up:
            log.info("kubelet PodResources answering again on %s", self.socket_path)
        self.last = result
        return result
