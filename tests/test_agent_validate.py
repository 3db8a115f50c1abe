"""Stack validation (gpupool.agent.validate): every check's pass and each failure with its reason, without a GPU
or a cluster: a stand-in backend, host config files under tmp_path, Node dicts, RuntimeClass listers, a fake
libcuda."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from gpupool.agent.backend import BackendError, DriverInfo, GpuDevice, GpuSample, MigInstance
from gpupool.agent.report import COND_STACK_READY, LABEL_STACK_READY
from gpupool.agent.validate import (
    CheckResult,
    StackResult,
    check_cuda,
    check_device_plugin,
    check_driver,
    check_runtime,
    read_runtime_configs,
    validate_stack,
)

H200 = Path("../shared/reference/nvml-h200/nvml.json")


class StandIn:
    """The smallest GpuBackend: ``n`` H100s; ``error`` makes every call raise BackendError."""

    def __init__(self, n: int = 2, error: str | None = None, mig: dict[int, tuple[str, ...]] | None = None) -> None:
        self.error = error
        self._devices = []
        for i in range(n):
            profiles = (mig or {}).get(i)
            self._devices.append(GpuDevice(
                index=i, uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", name="NVIDIA H100 80GB HBM3",
                memory_mib=81559, minor=i, compute=(9, 0), architecture="hopper",
                pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
                mig_enabled=profiles is not None,
                mig_instances=tuple(MigInstance(p, start=k, size=1) for k, p in enumerate(profiles or ()))))

    def _check(self) -> None:
        if self.error:
            raise BackendError(self.error)

    def driver(self) -> DriverInfo:
        self._check()
        return DriverInfo("570.124.06", "12.8", "12.570.124.06")

    def devices(self) -> list[GpuDevice]:
        self._check()
        return list(self._devices)

    def topology(self) -> dict[tuple[int, int], str]:
        return {}

    def sample(self) -> list[GpuSample]:
        return [GpuSample(d.index, d.uuid, 0.0) for d in self._devices]

    def events(self, timeout_s: float) -> list:
        return []

    def close(self) -> None:
        pass


def node(gpus: int | None = 2, *, alloc: int | None = None, labels: dict | None = None, extra: dict | None = None,
         runtime: str = "containerd://1.7.27") -> dict:
    capacity = {"cpu": "64", "memory": "512Gi"}
    allocatable = dict(capacity)
    if gpus is not None:
        capacity["nvidia.com/gpu"] = str(gpus)
        allocatable["nvidia.com/gpu"] = str(gpus if alloc is None else alloc)
    for k, v in (extra or {}).items():
        capacity[k] = allocatable[k] = str(v)
    return {"metadata": {"name": "gpu-node-1", "labels": dict(labels or {})},
            "status": {"capacity": capacity, "allocatable": allocatable,
                       "nodeInfo": {"containerRuntimeVersion": runtime}}}


CONTAINERD_V2 = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "{default}"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
"""
CONTAINERD_PLAIN = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


def host(tmp_path: Path, files: dict[str, str]) -> str:
    for rel, text in files.items():
        p = tmp_path / rel.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return str(tmp_path)


def rc(name: str, handler: str) -> dict:
    return {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": handler}


# ------------------------------------------------------------------------------------------------ driver
def test_driver_ok():
    r = check_driver(StandIn(4))
    assert r.ok and r.reason == "DriverLoaded"
    assert "570.124.06" in r.message and "4 GPUs" in r.message


@pytest.mark.parametrize("error, reason, words", [
    ("NVML: Driver Not Loaded", "DriverNotLoaded", "lsmod"),
    ("NVML Shared Library Not Found", "NvmlUnavailable", "libnvidia-ml.so.1"),
    ("NVML: Insufficient Permissions", "NvmlUnavailable", "/dev/nvidiactl"),
])
def test_driver_failures(error, reason, words):
    r = check_driver(StandIn(error=error))
    assert not r.ok and r.reason == reason
    assert error in r.message and words in r.message


def test_driver_no_gpu():
    r = check_driver(StandIn(0))
    assert not r.ok and r.reason == "NoGpuFound" and "lspci" in r.message


# ------------------------------------------------------------------------------------------------ runtime
def test_runtime_containerd_default_nvidia(tmp_path):
    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="nvidia")})
    r = check_runtime(lambda: [], host_root=root)
    assert r.ok and r.reason == "RuntimeConfigured"
    assert "default runtime (nvidia)" in r.message and "config.toml" in r.message


def test_runtime_containerd_via_runtimeclass(tmp_path):
    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="runc")})
    r = check_runtime(lambda: [rc("nvidia", "nvidia")], host_root=root)
    assert r.ok and "RuntimeClass nvidia" in r.message


def test_runtime_not_default_and_no_runtimeclass(tmp_path):
    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="runc")})
    r = check_runtime(lambda: [rc("kata", "kata-qemu")], host_root=root)
    assert not r.ok and r.reason == "RuntimeNotConfigured"
    assert "not the default" in r.message and "create a RuntimeClass" in r.message and "--set-as-default" in r.message


def test_runtime_host_config_without_nvidia(tmp_path):
    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_PLAIN})
    r = check_runtime(lambda: [rc("nvidia", "nvidia")], host_root=root)  # the class alone does not help
    assert not r.ok and r.reason == "RuntimeNotConfigured"
    assert "no NVIDIA runtime in" in r.message and "nvidia-ctk runtime configure --runtime=containerd" in r.message


def test_runtime_class_handler_unknown_to_host(tmp_path):
    conf = CONTAINERD_V2.format(default="runc").replace("runtimes.nvidia", "runtimes.nvidia-cdi")
    root = host(tmp_path, {"/etc/containerd/config.toml": conf})
    r = check_runtime(lambda: [rc("nvidia", "nvidia")], host_root=root)
    assert not r.ok and r.reason == "RuntimeNotConfigured"
    assert "handler nvidia" in r.message and "nvidia-cdi" in r.message
    ok = check_runtime(lambda: [rc("nvidia-cdi", "nvidia-cdi")], host_root=root)
    assert ok.ok


def test_runtime_containerd_import_dropin(tmp_path):
    """nvidia-ctk on containerd 2.x writes a drop-in that config.toml imports."""
    main = 'version = 3\nimports = ["/etc/containerd/conf.d/*.toml"]\n'
    dropin = ('version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "nvidia"\n'
              '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.nvidia]\n'
              '  runtime_type = "io.containerd.runc.v2"\n')
    root = host(tmp_path, {"/etc/containerd/config.toml": main, "/etc/containerd/conf.d/99-nvidia.toml": dropin})
    configs = read_runtime_configs(root, kinds=["containerd"])
    assert [c.nvidia_runtimes for c in configs] == [(), ("nvidia",)]
    assert check_runtime(None, host_root=root).ok


def test_runtime_crio_dropin(tmp_path):
    crio = ('[crio.runtime]\ndefault_runtime = "crun"\n[crio.runtime.runtimes.nvidia]\n'
            'runtime_path = "/usr/bin/nvidia-container-runtime"\nruntime_type = "oci"\n')
    root = host(tmp_path, {"/etc/crio/crio.conf.d/99-nvidia.conf": crio})
    r = check_runtime(lambda: {"items": [rc("nvidia", "nvidia")]}, host_root=root, container_runtime="cri-o://1.30.4")
    assert r.ok and "99-nvidia.conf" in r.message
    r = check_runtime(lambda: [], host_root=root, container_runtime="cri-o://1.30.4")
    assert not r.ok and "--runtime=cri-o" in r.message


def test_runtime_docker_daemon_json(tmp_path):
    daemon = {"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime", "args": []}}}
    root = host(tmp_path, {"/etc/docker/daemon.json": json.dumps(daemon)})
    assert check_runtime(None, host_root=root, container_runtime="docker://26.1.3").ok
    renamed = {"runtimes": {"gpu": {"path": "/usr/bin/nvidia-container-runtime"}}, "default-runtime": "gpu"}
    root = host(tmp_path, {"/etc/docker/daemon.json": json.dumps(renamed)})
    assert check_runtime(None, host_root=root).ok  # named by its binary


def test_runtime_only_the_nodes_runtime_counts(tmp_path):
    """Docker is configured, but the kubelet talks to containerd, which is not."""
    daemon = {"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    root = host(tmp_path, {"/etc/docker/daemon.json": json.dumps(daemon),
                           "/etc/containerd/config.toml": CONTAINERD_PLAIN})
    assert check_runtime(None, host_root=root).ok  # without the node's runtime: any file counts
    r = check_runtime(None, host_root=root, container_runtime="containerd://1.7.27")
    assert not r.ok and r.reason == "RuntimeNotConfigured" and "config.toml" in r.message


def test_runtime_no_config_found(tmp_path):
    r = check_runtime(None, host_root=str(tmp_path))
    assert not r.ok and r.reason == "RuntimeNotConfigured" and "mount the host's runtime config" in r.message
    r = check_runtime(lambda: [rc("nvidia", "nvidia")], host_root=str(tmp_path))
    assert r.ok and "not checked" in r.message
    r = check_runtime(lambda: [rc("runc", "runc")], host_root=str(tmp_path))
    assert not r.ok and "no RuntimeClass with handler nvidia" in r.message and "node.k8s.io/v1" in r.message


def test_runtime_lister_error(tmp_path):
    def forbidden():
        raise PermissionError("403 runtimeclasses.node.k8s.io is forbidden")

    r = check_runtime(forbidden, host_root=str(tmp_path))
    assert not r.ok and r.reason == "RuntimeNotConfigured" and "403" in r.message and "grant the agent" in r.message
    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="runc")})
    r = check_runtime(forbidden, host_root=root)
    assert r.ok and "could not be listed" in r.message  # the host config is what we know: not held against it


def test_runtime_unreadable_config(tmp_path):
    root = host(tmp_path, {"/etc/containerd/config.toml": "version = 2\n[plugins\n"})
    configs = read_runtime_configs(root, kinds=["containerd"])
    assert configs and configs[0].error.startswith("not TOML")
    r = check_runtime(lambda: [rc("nvidia", "nvidia")], host_root=root)
    assert r.ok and "unreadable" in r.message


def test_runtime_names_and_client_models(tmp_path):
    """The agent loop passes RuntimeClass names; the official client gives V1RuntimeClassList models."""
    from kubernetes.client import V1ObjectMeta, V1RuntimeClass, V1RuntimeClassList

    root = host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="runc")})
    assert check_runtime(["nvidia"], host_root=root).ok
    assert not check_runtime(["kata"], host_root=root).ok
    models = V1RuntimeClassList(items=[V1RuntimeClass(handler="nvidia", metadata=V1ObjectMeta(name="gpu"))])
    r = check_runtime(lambda: models, host_root=root)
    assert r.ok and "RuntimeClass gpu" in r.message


# ------------------------------------------------------------------------------------------------ device plugin
def test_plugin_registered():
    r = check_device_plugin(node(4), StandIn(4).devices())
    assert r.ok and r.reason == "DevicePluginRegistered" and "4 nvidia.com/gpu" in r.message


def test_plugin_not_registered():
    r = check_device_plugin(node(None), StandIn(4).devices())
    assert not r.ok and r.reason == "DevicePluginNotRegistered"
    assert "nvidia.com/gpu" in r.message and "device plugin" in r.message and "gpu-node-1" in r.message


def test_plugin_count_mismatch_says_both_numbers():
    r = check_device_plugin(node(3), StandIn(4).devices())
    assert not r.ok and r.reason == "DevicePluginCountMismatch"
    assert "advertises 3 nvidia.com/gpu" in r.message and "NVML found 4 GPUs" in r.message


def test_plugin_time_sliced():
    labels = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    r = check_device_plugin(node(8, labels=labels), StandIn(2).devices())
    assert r.ok and "x 4 replicas" in r.message
    r = check_device_plugin(node(2, labels=labels), StandIn(2).devices())
    assert not r.ok and r.reason == "DevicePluginCountMismatch"
    assert "advertises 2" in r.message and "2 GPUs x 4 replicas = 8 expected" in r.message


def test_plugin_time_sliced_renamed_shared():
    """renameByDefault: the plugin advertises nvidia.com/gpu.shared instead."""
    n = node(None, labels={"nvidia.com/gpu.replicas": "2"}, extra={"nvidia.com/gpu.shared": 4})
    r = check_device_plugin(n, StandIn(2).devices())
    assert r.ok and "nvidia.com/gpu.shared" in r.message


def test_plugin_mig_mixed():
    devs = StandIn(2, mig={1: ("3g.40gb", "3g.40gb", "1g.10gb+me")}).devices()
    labels = {"nvidia.com/mig.strategy": "mixed"}
    extra = {"nvidia.com/mig-3g.40gb": 2, "nvidia.com/mig-1g.10gb.me": 1}
    r = check_device_plugin(node(1, labels=labels, extra=extra), devs)
    assert r.ok, r.message
    r = check_device_plugin(node(1, labels=labels, extra={"nvidia.com/mig-3g.40gb": 1}), devs)
    assert not r.ok and r.reason == "DevicePluginCountMismatch"
    assert "advertises 1 nvidia.com/mig-3g.40gb" in r.message and "2 MIG devices" in r.message
    assert "nvidia.com/mig-1g.10gb.me (expected 1)" in r.message


def test_plugin_mig_strategy_inferred():
    devs = StandIn(1, mig={0: ("1g.10gb",) * 7}).devices()
    assert check_device_plugin(node(7), devs).ok  # single: MIG devices as nvidia.com/gpu
    assert check_device_plugin(node(0, extra={"nvidia.com/mig-1g.10gb": 7}), devs).ok  # mixed
    r = check_device_plugin(node(1, labels={"nvidia.com/mig.strategy": "single"}), devs)
    assert not r.ok and "advertises 1" in r.message and "7 expected (MIG strategy single)" in r.message


def test_plugin_unhealthy_devices_withdrawn_is_not_a_stack_failure():
    r = check_device_plugin(node(4, alloc=3), StandIn(4).devices())
    assert r.ok and "1 nvidia.com/gpu withdrawn as unhealthy" in r.message


def test_plugin_client_model():
    from kubernetes.client import V1Node, V1NodeStatus, V1ObjectMeta

    n = V1Node(metadata=V1ObjectMeta(name="n1", labels={}), status=V1NodeStatus(capacity={"nvidia.com/gpu": "2"},
                                                                                  allocatable={"nvidia.com/gpu": "2"}))
    assert check_device_plugin(n, StandIn(2).devices()).ok
    assert not check_device_plugin(n, StandIn(3).devices()).ok


# ------------------------------------------------------------------------------------------------ cuda
class FakeCuda:
    def __init__(self, init: int = 0, count: int = 2, count_rc: int = 0, names: bool = True) -> None:
        self.init, self.count, self.count_rc, self.names = init, count, count_rc, names
        self.calls: list[str] = []

    def cuInit(self, flags):  # noqa: N802 (the CUDA name)
        self.calls.append(f"cuInit({flags})")
        return self.init

    def cuDeviceGetCount(self, ref):  # noqa: N802
        ref._obj.value = self.count
        return self.count_rc

    def __getattr__(self, name):
        if name == "cuGetErrorName" and self.names:
            def get(code, ref):
                ctypes.cast(ref, ctypes.POINTER(ctypes.c_char_p))[0] = f"CUDA_ERROR_FROM_LIB_{code}".encode()
                return 0
            return get
        raise AttributeError(name)


def loader_of(lib):
    def load(name):
        if lib is None:
            raise OSError(f"{name}: cannot open shared object file: No such file or directory")
        return lib
    return load


def test_cuda_absent_is_skipped():
    r = check_cuda(2, loader=loader_of(None))
    assert r.ok and r.skipped and r.reason == "CudaNotPresent"


def test_cuda_ok():
    lib = FakeCuda(count=2)
    r = check_cuda(2, loader=loader_of(lib))
    assert r.ok and r.reason == "CudaReady" and "2 devices" in r.message and lib.calls == ["cuInit(0)"]


def test_cuda_init_failed_names_the_code():
    r = check_cuda(2, loader=loader_of(FakeCuda(init=802, names=False)))
    assert not r.ok and r.reason == "CudaInitFailed"
    assert "CUDA_ERROR_SYSTEM_NOT_READY (802)" in r.message and "fabricmanager" in r.message
    r = check_cuda(2, loader=loader_of(FakeCuda(init=100)))  # the library's own name for it wins
    assert "CUDA_ERROR_FROM_LIB_100" in r.message and "NVIDIA_VISIBLE_DEVICES" in r.message
    r = check_cuda(2, loader=loader_of(FakeCuda(init=12345, names=False)))
    assert "CUresult 12345" in r.message


def test_cuda_count_failed_and_mismatch(monkeypatch):
    r = check_cuda(2, loader=loader_of(FakeCuda(count_rc=3, names=False)))
    assert not r.ok and r.reason == "CudaInitFailed" and "cuDeviceGetCount" in r.message
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    r = check_cuda(2, loader=loader_of(FakeCuda(count=1)))
    assert not r.ok and r.reason == "CudaDeviceCountMismatch"
    assert "CUDA sees 1 device" in r.message and "NVML 2" in r.message and "CUDA_VISIBLE_DEVICES=0" in r.message
    assert check_cuda(2, loader=loader_of(FakeCuda(count=1)), mig=True).ok  # MIG: CUDA counts MIG devices


def test_cuda_real_library_if_present():
    """Where this machine has libcuda, the real check runs (passes or names its CUresult); else it skips."""
    r = check_cuda(None)
    assert r.reason in ("CudaNotPresent", "CudaReady", "CudaInitFailed")


# ------------------------------------------------------------------------------------------------ the stack
def ready_host(tmp_path) -> str:
    return host(tmp_path, {"/etc/containerd/config.toml": CONTAINERD_V2.format(default="runc")})


def test_stack_ready(tmp_path):
    result = validate_stack(StandIn(2), node=node(2), runtime_classes=lambda: [rc("nvidia", "nvidia")],
                            host_root=ready_host(tmp_path), cuda_loader=loader_of(FakeCuda(count=2)))
    assert isinstance(result, StackResult) and result.ok and result.failures == []
    assert [c.check for c in result.checks] == ["driver", "runtime", "device-plugin", "cuda"]
    cond = result.condition()
    assert (cond.type, cond.status, cond.reason) == (COND_STACK_READY, "True", "StackReady")
    assert "570.124.06" in cond.message and "2 nvidia.com/gpu" in cond.message
    assert result.label() == {LABEL_STACK_READY: "true"}
    assert json.loads(json.dumps(result.to_dict()))["ok"] is True


def test_stack_failures_first_reason_all_messages(tmp_path):
    result = validate_stack(StandIn(2), node=node(1), runtime_classes=lambda: [],
                            host_root=ready_host(tmp_path), cuda_loader=loader_of(FakeCuda(init=999, names=False)))
    assert not result.ok
    assert [f.reason for f in result.failures] == ["RuntimeNotConfigured", "DevicePluginCountMismatch",
                                                   "CudaInitFailed"]
    cond = result.condition()
    assert (cond.status, cond.reason) == ("False", "RuntimeNotConfigured")
    for f in result.failures:
        assert f.message in cond.message
    assert result.label() == {LABEL_STACK_READY: "false"}


def test_stack_driver_down_skips_what_needs_it(tmp_path):
    result = validate_stack(StandIn(error="NVML: Driver Not Loaded"), node=node(2), runtime_classes=["nvidia"],
                            host_root=ready_host(tmp_path), cuda_loader=loader_of(FakeCuda()))
    assert [f.reason for f in result.failures] == ["DriverNotLoaded"]
    assert result.get("device-plugin").skipped and result.get("cuda").skipped
    assert result.condition().reason == "DriverNotLoaded"


def test_stack_without_node_or_cuda(tmp_path):
    result = validate_stack(StandIn(2), runtime_classes=["nvidia"], host_root=ready_host(tmp_path), cuda=False)
    assert result.ok and result.get("device-plugin").skipped and result.get("cuda") is None


def test_stack_takes_the_agent_loops_arguments(tmp_path):
    """The agent loop (gpupool.agent.run.call_with) offers discovery, runtime class names, node, health..."""
    from types import SimpleNamespace

    backend = StandIn(2)
    discovery = SimpleNamespace(devices=backend.devices()[:1])  # what discovery saw wins over backend.devices()
    result = validate_stack(backend, discovery=discovery, runtime_classes=["nvidia"], node=node(1),
                            host_root=ready_host(tmp_path), cuda_loader=loader_of(None))
    assert result.ok, result.failures


def test_stack_runtime_from_node_info(tmp_path):
    daemon = {"default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "nvidia-container-runtime"}}}
    root = host(tmp_path, {"/etc/docker/daemon.json": json.dumps(daemon),
                           "/etc/containerd/config.toml": CONTAINERD_PLAIN})
    result = validate_stack(StandIn(1), node=node(1, runtime="containerd://1.7.27"), host_root=root, cuda=False)
    assert [f.reason for f in result.failures] == ["RuntimeNotConfigured"]


def test_condition_message_is_capped():
    long = StackResult((CheckResult("runtime", False, "RuntimeNotConfigured", "x" * 10_000),))
    assert len(long.condition().message) <= 4000


@pytest.mark.skipif(not H200.exists(), reason="H200 recording not present")
def test_h200_recording_validates(tmp_path):
    fake = pytest.importorskip("gpupool.agent.fake")
    backend = fake.FakeBackend.from_nvml_recording(H200)
    result = validate_stack(backend, node=node(1), runtime_classes=["nvidia"], host_root=ready_host(tmp_path),
                            cuda_loader=loader_of(FakeCuda(count=1)))
    assert result.ok, result.failures
    assert "580.159.04 (CUDA 13.0)" in result.get("driver").message
    backend.fail_driver()
    result = validate_stack(backend, node=node(1), runtime_classes=["nvidia"], host_root=ready_host(tmp_path))
    assert result.condition().reason == "DriverNotLoaded"
