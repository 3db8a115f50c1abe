"""A PodResources gRPC server that answers as the kubelet does, for tests and demos without a kubelet.

It serves the vendored ``v1.PodResourcesLister`` (:mod:`gpupool.agent.kubelet`) on a Unix socket, with the
kubelet's answers as ``pkg/kubelet/apis/podresources/server_v1.go`` gives them:

* ``List``: every active pod (``GetActivePods``: terminal pods are not listed), each container with its
  ``devices``; pods and containers without devices are listed too, with none;
* devices as ``containerDevicesFromResourceDeviceInstances`` (``pkg/kubelet/cm``) builds them: one
  ``ContainerDevices`` per device ID, carrying ``resource_name``, that one ID and, when the device plugin reported
  the device's NUMA nodes, one entry per NUMA node with its ``topology`` (so a device on two NUMA nodes is listed
  twice); entries come in map order (the fake keeps the order given);
* ``GetAllocatableResources``: every device the device plugins advertise, built the same way;
* ``Get``: one pod; a pod the kubelet does not run is an error ("pod NAME in namespace NS not found", which gRPC
  carries as code UNKNOWN since the kubelet returns a plain Go error).

Device IDs are whatever the test gives: the NVIDIA device plugin's are GPU UUIDs, ``UUID::replica`` under
time-slicing (see :mod:`gpupool.agent.podresources`).

Usage::

    with FakeKubelet(tmp_path / "kubelet.sock") as kubelet:
        kubelet.set_pod("default", "train-0", {"main": {"nvidia.com/gpu": ["GPU-a", "GPU-b"]}})
        ...
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

__all__ = ["FakeKubelet"]


class FakeKubelet:
    """A ``v1.PodResourcesLister`` server on the Unix socket ``path`` (started by :meth:`start` or ``with``).

    Pods: ``set_pod(namespace, name, {container: {resource: [device ids]}})`` / ``remove_pod``; ``allocatable``:
    ``{resource: [device ids]}`` for ``GetAllocatableResources``; ``numa``: device ID -> the NUMA nodes the device
    plugin reported for it. :attr:`calls` counts the calls per method.
    """

    def __init__(self, path: str | Path, allocatable: Mapping[str, Sequence[str]] | None = None,
                 numa: Mapping[str, Sequence[int]] | None = None) -> None:
        self.path = str(path)
        self.allocatable = {k: list(v) for k, v in (allocatable or {}).items()}
        self.numa = {k: list(v) for k, v in (numa or {}).items()}  # device ID -> its NUMA nodes (none: no topology)
        self.pods: dict[tuple[str, str], dict[str, dict[str, list[str]]]] = {}
        self.calls: dict[str, int] = {"List": 0, "GetAllocatableResources": 0, "Get": 0}
        self._lock = threading.Lock()
        self._server: Any = None

    # ------------------------------------------------------------------ what it reports
    def set_pod(self, namespace: str, name: str, containers: Mapping[str, Mapping[str, Sequence[str]]]) -> None:
        """The kubelet runs pod ``namespace/name`` with ``containers`` (name -> resource -> device IDs)."""
        with self._lock:
            self.pods[(namespace, name)] = {c: {r: list(ids) for r, ids in res.items()}
                                            for c, res in containers.items()}

    def remove_pod(self, namespace: str, name: str) -> None:
        """The pod is gone (no longer listed)."""
        with self._lock:
            self.pods.pop((namespace, name), None)

    def _devices(self, pb: Any, res: Mapping[str, Sequence[str]]) -> list[Any]:
        out = []
        for resource, ids in res.items():
            for dev in ids:
                nodes = self.numa.get(dev)
                if not nodes:
                    out.append(pb.ContainerDevices(resource_name=resource, device_ids=[dev]))
                    continue
                for n in nodes:
                    out.append(pb.ContainerDevices(resource_name=resource, device_ids=[dev], topology=pb.TopologyInfo(
                        nodes=[pb.NUMANode(ID=n)])))
        return out

    def _pod_message(self, pb: Any, key: tuple[str, str],
                     containers: Mapping[str, Mapping[str, Sequence[str]]]) -> Any:
        return pb.PodResources(namespace=key[0], name=key[1], containers=[
            pb.ContainerResources(name=c, devices=self._devices(pb, res)) for c, res in containers.items()])

    # ------------------------------------------------------------------ server
    def start(self) -> FakeKubelet:
        """Serve on :attr:`path` (the socket file appears before this returns)."""
        import grpc

        from gpupool.agent.kubelet import api_pb2 as pb
        from gpupool.agent.kubelet import api_pb2_grpc

        fake = self

        class Servicer(api_pb2_grpc.PodResourcesListerServicer):
            def List(self, request, context):  # noqa: N802 - the gRPC method's name
                with fake._lock:
                    fake.calls["List"] += 1
                    pods = [fake._pod_message(pb, k, c) for k, c in fake.pods.items()]
                return pb.ListPodResourcesResponse(pod_resources=pods)

            def GetAllocatableResources(self, request, context):  # noqa: N802
                with fake._lock:
                    fake.calls["GetAllocatableResources"] += 1
                    devices = fake._devices(pb, fake.allocatable)
                return pb.AllocatableResourcesResponse(devices=devices)

            def Get(self, request, context):  # noqa: N802
                key = (request.pod_namespace, request.pod_name)
                with fake._lock:
                    fake.calls["Get"] += 1
                    containers = fake.pods.get(key)
                    pod = None if containers is None else fake._pod_message(pb, key, containers)
                if pod is None:
                    context.abort(grpc.StatusCode.UNKNOWN,
                                  f"pod {request.pod_name} in namespace {request.pod_namespace} not found")
                return pb.GetPodResourcesResponse(pod_resources=pod)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(Servicer(), server)
        if server.add_insecure_port(f"unix://{Path(self.path).absolute()}") == 0:
            raise OSError(f"cannot listen on {self.path}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket file."""
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None
        Path(self.path).unlink(missing_ok=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
