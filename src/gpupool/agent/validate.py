"""Stack validation: what the NVIDIA GPU Operator's validator checks, run by the node agent on its own node.

Four checks, each a :class:`CheckResult` with a CamelCase ``reason`` and a ``message`` a person can act on:

1. **driver** (:func:`check_driver`): the kernel driver is loaded and NVML answers (``backend.driver()`` and
   ``backend.devices()``). Failures: ``DriverNotLoaded`` (NVML says ``Driver Not Loaded``), ``NvmlUnavailable``
   (``libnvidia-ml.so`` missing, permissions, any other NVML error), ``NoGpuFound`` (NVML answers, lists none).
2. **runtime** (:func:`check_runtime`): the container runtime can start NVIDIA containers. Sources: the host's
   runtime configuration (:data:`RUNTIME_CONFIG_PATHS`: containerd ``config.toml`` and its ``imports``, CRI-O
   ``crio.conf`` / ``crio.conf.d/*``, Docker ``daemon.json``; a runtime named ``nvidia*`` or whose binary is
   ``nvidia-container-runtime``, as ``nvidia-ctk runtime configure`` writes it) and the cluster's RuntimeClasses
   (``node.k8s.io/v1``, a RuntimeClass whose ``handler`` is ``nvidia``, as the GPU Operator creates it). Pods
   reach the NVIDIA runtime either as the default runtime or through such a RuntimeClass. Failure:
   ``RuntimeNotConfigured``.
3. **device-plugin** (:func:`check_device_plugin`): the NVIDIA device plugin registered its resources with the
   kubelet: the Node's ``status.capacity`` (else ``status.allocatable``) holds ``nvidia.com/gpu`` = GPUs found
   x ``nvidia.com/gpu.replicas`` (time-slicing / MPS, GFD's label), MIG devices per the ``nvidia.com/mig.strategy``
   label (``single``: MIG devices as ``nvidia.com/gpu``; ``mixed``: ``nvidia.com/mig-<profile>``). Failures:
   ``DevicePluginNotRegistered``, ``DevicePluginCountMismatch`` (the message says both numbers).
4. **cuda** (:func:`check_cuda`): where ``libcuda.so.1`` is present, ``cuInit(0)`` and ``cuDeviceGetCount`` (CUDA
   driver API through ``ctypes``) succeed and CUDA sees as many GPUs as NVML. No libcuda: skipped, not a
   failure. Failures: ``CudaInitFailed`` (with the ``CUresult`` name, e.g. ``CUDA_ERROR_SYSTEM_NOT_READY``),
   ``CudaDeviceCountMismatch``.

:func:`validate_stack` runs them all and returns a :class:`StackResult`: ``ok``, ``failures``, the Node
condition ``GpuStackReady`` (:meth:`StackResult.condition`) and the label ``gpupool.io/gpu-stack-ready``
(:meth:`StackResult.label`). Every input is injectable (the backend, the Node object, a RuntimeClass lister, the
host root and config paths, the libcuda loader), so each failure is tested without a GPU or a cluster.

Sources: NVIDIA GPU Operator ``validator/main.go`` (driver, toolkit, cuda, plugin validations), NVIDIA
k8s-device-plugin (resource names, MIG strategies, time-slicing ``replicas`` / ``renameByDefault``), NVIDIA
Container Toolkit ``nvidia-ctk runtime configure`` (config file layouts), CUDA ``cuda.h`` (``CUresult`` values).
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.agent.backend import BackendError, GpuBackend, GpuDevice
from gpupool.k8s.objects.agent_report import COND_STACK_READY, LABEL_STACK_READY, Condition

__all__ = ["CUDA_LIBRARIES", "CU_RESULT_NAMES", "RUNTIME_CONFIG_PATHS", "CheckResult", "RuntimeConfig",
           "StackResult", "check_cuda", "check_device_plugin", "check_driver", "check_runtime",
           "read_runtime_configs", "validate_stack"]

RESOURCE_GPU = "nvidia.com/gpu"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
RUNTIME_HANDLER = "nvidia"

RUNTIME_CONFIG_PATHS: dict[str, tuple[str, ...]] = {
    "containerd": ("/etc/containerd/config.toml", "/etc/containerd/conf.d/*.toml",
                   "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
                   "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"),
    "cri-o": ("/etc/crio/crio.conf", "/etc/crio/crio.conf.d/*"),
    "docker": ("/etc/docker/daemon.json",),
}
"""Container runtime -> host paths (glob patterns, read under ``host_root``) of its configuration."""

CUDA_LIBRARIES = ("libcuda.so.1", "libcuda.so")
"""The CUDA driver library, as the NVIDIA Container Toolkit mounts it (``ldconfig`` names)."""

CU_RESULT_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS", 1: "CUDA_ERROR_INVALID_VALUE", 2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED", 4: "CUDA_ERROR_DEINITIALIZED", 34: "CUDA_ERROR_STUB_LIBRARY",
    46: "CUDA_ERROR_DEVICE_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
    102: "CUDA_ERROR_DEVICE_NOT_LICENSED", 214: "CUDA_ERROR_ECC_UNCORRECTABLE", 304: "CUDA_ERROR_OPERATING_SYSTEM",
    801: "CUDA_ERROR_NOT_SUPPORTED", 802: "CUDA_ERROR_SYSTEM_NOT_READY", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
    804: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", 999: "CUDA_ERROR_UNKNOWN",
}
"""``CUresult`` values (``cuda.h``) used when ``cuGetErrorName`` itself cannot answer."""

_CU_HINTS = {
    34: "libcuda.so is the stub of the CUDA toolkit, not the driver's: the driver's libcuda is not mounted",
    46: "the GPU is in exclusive compute mode and busy, or unavailable",
    100: "no GPU visible to this process: check NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES and the /dev/nvidia* "
         "device nodes of the agent's container",
    214: "an uncorrectable ECC error: drain the node and reset the GPU (nvidia-smi -r)",
    304: "the OS refused (permissions on /dev/nvidia*, or a kernel module missing)",
    802: "the system is not ready: on NVSwitch systems (HGX) start nvidia-fabricmanager",
    803: "libcuda does not match the kernel driver: a second driver install left another libcuda behind",
    804: "the CUDA forward-compatibility package does not support this GPU: remove cuda-compat",
    999: "unknown error: look at dmesg for NVRM / Xid lines",
}

_CONDITION_MESSAGE_MAX = 4000  # characters; a Node condition's message stays readable in kubectl describe


# ---------------------------------------------------------------------------------------------- results
@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check's outcome. ``check``: ``driver``, ``runtime``, ``device-plugin`` or ``cuda``; ``ok``;
    ``reason``: CamelCase (``DriverNotLoaded``..., or the passing reason: ``DriverLoaded``, ``RuntimeConfigured``,
    ``DevicePluginRegistered``, ``CudaReady``, ``CudaNotPresent``, ``Skipped``); ``message`` for people;
    ``skipped``: the check could not run (an input is absent) and does not count against the node."""

    check: str
    ok: bool
    reason: str
    message: str
    skipped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "reason": self.reason, "message": self.message,
                "skipped": self.skipped}


@dataclass(frozen=True, slots=True)
class StackResult:
    """Every check of one validation, in order (driver, runtime, device-plugin, cuda)."""

    checks: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        """True when no check failed (skipped checks pass)."""
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[CheckResult]:
        return [c for c in self.checks if not c.ok]

    def get(self, check: str) -> CheckResult | None:
        """The result of one check by name, or None when it did not run."""
        return next((c for c in self.checks if c.check == check), None)

    def condition(self) -> Condition:
        """Node condition ``GpuStackReady``: ``True``/``StackReady`` with what was found, or ``False`` with the first
        failure's reason and every failure's message (joined by ``"; "``)."""
        if self.ok:
            message = "; ".join(c.message for c in self.checks) or "no checks ran"
            return Condition(COND_STACK_READY, "True", "StackReady", _cap(message))
        failures = self.failures
        return Condition(COND_STACK_READY, "False", failures[0].reason, _cap("; ".join(f.message for f in failures)))

    def label(self) -> dict[str, str]:
        """``{"gpupool.io/gpu-stack-ready": "true" | "false"}``."""
        return {LABEL_STACK_READY: "true" if self.ok else "false"}

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks]}


def _cap(message: str) -> str:
    return message if len(message) <= _CONDITION_MESSAGE_MAX else message[:_CONDITION_MESSAGE_MAX - 3] + "..."


# ---------------------------------------------------------------------------------------------- objects
def _plain(obj: Any) -> Any:
    """A Kubernetes object as the API's JSON (camelCase dicts): dicts pass; client models are serialised."""
    if obj is None or isinstance(obj, Mapping):
        return obj
    if hasattr(obj, "to_dict") or hasattr(obj, "openapi_types"):
        from kubernetes.client import ApiClient

        return ApiClient().sanitize_for_serialization(obj)
    return obj


def _dig(obj: Mapping[str, Any] | None, *keys: str) -> Any:
    for key in keys:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


# ---------------------------------------------------------------------------------------------- driver
_DRIVER_NOT_LOADED = ("driver not loaded", "driver_not_loaded", "nvidia-smi has failed")
_LIBRARY_MISSING = ("shared library not found", "library_not_found", "libnvidia-ml", "function not found")


def _driver(backend: GpuBackend, devices: Sequence[GpuDevice] | None = None
            ) -> tuple[CheckResult, list[GpuDevice] | None]:
    try:
        info = backend.driver()
        found = list(devices) if devices is not None else backend.devices()
    except BackendError as exc:
        text = str(exc)
        low = text.lower()
        if any(s in low for s in _DRIVER_NOT_LOADED):
            return CheckResult("driver", False, "DriverNotLoaded",
                               f"NVIDIA kernel driver not loaded ({text}): install the driver or check the driver "
                               "container (lsmod | grep nvidia; dmesg | grep -i nvrm)"), None
        if any(s in low for s in _LIBRARY_MISSING):
            hint = ("libnvidia-ml.so.1 is not available to the agent: install the driver's user-space libraries "
                    "or mount them (NVIDIA Container Toolkit, NVIDIA_DRIVER_CAPABILITIES=utility)")
        else:
            hint = "NVML does not answer: check the agent's access to /dev/nvidiactl and /dev/nvidia*, and dmesg"
        return CheckResult("driver", False, "NvmlUnavailable", f"{hint} ({text})"), None
    if not found:
        return CheckResult("driver", False, "NoGpuFound",
                           f"driver {info.driver} loaded but NVML lists no GPU: check lspci | grep -i nvidia and "
                           "dmesg for a GPU that failed to initialise"), found
    return CheckResult("driver", True, "DriverLoaded",
                       f"driver {info.driver} (CUDA {info.cuda_driver}) loaded, NVML lists {len(found)} "
                       f"GPU{'s' if len(found) != 1 else ''}"), found


def check_driver(backend: GpuBackend) -> CheckResult:
    """The driver is loaded and NVML answers: ``backend.driver()`` and ``backend.devices()`` succeed and list
    at least one GPU. Reasons: ``DriverLoaded``; ``DriverNotLoaded`` / ``NvmlUnavailable`` (the backend's
    :class:`BackendError` text quoted), ``NoGpuFound``."""
    return _driver(backend)[0]


# ---------------------------------------------------------------------------------------------- runtime
@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """What one runtime config file says: ``kind`` (containerd, cri-o, docker), ``path``, the NVIDIA runtimes it
    defines (``nvidia_runtimes``: names), its default runtime (``default``: a name, "" when not set), ``error``
    when the file could not be read or parsed."""

    kind: str
    path: str
    nvidia_runtimes: tuple[str, ...] = ()
    default: str = ""
    error: str = ""

    @property
    def default_is_nvidia(self) -> bool:
        return bool(self.default) and self.default in self.nvidia_runtimes


def _is_nvidia(name: str, spec: Any) -> bool:
    if "nvidia" in name.lower():
        return True
    return "nvidia-container-runtime" in json.dumps(spec, default=str)


def _containerd_runtimes(doc: Mapping[str, Any]) -> tuple[list[str], str]:
    """Runtimes and default under every ``...containerd`` table (config versions 1, 2 and 3 nest it under
    different CRI plugin ids: ``cri``, ``io.containerd.grpc.v1.cri``, ``io.containerd.cri.v1.runtime``)."""
    names: list[str] = []
    default = ""
    stack: list[Mapping[str, Any]] = [doc]
    while stack:
        table = stack.pop()
        for key, value in table.items():
            if not isinstance(value, Mapping):
                continue
            if key == "containerd" and isinstance(value.get("runtimes"), Mapping):
                names += [n for n, spec in value["runtimes"].items() if _is_nvidia(n, spec)]
                default = str(value.get("default_runtime_name") or default)
            stack.append(value)
    return names, default


def _parse(kind: str, path: str, text: str) -> tuple[list[str], str, list[str]]:
    """(nvidia runtimes, default runtime, imported paths) of one config file; raises ValueError when unreadable."""
    if kind == "docker":
        try:
            doc = json.loads(text or "{}")
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from exc
        runtimes = doc.get("runtimes") or {}
        return ([n for n, spec in runtimes.items() if _is_nvidia(n, spec)], str(doc.get("default-runtime") or ""),
                [])
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not TOML: {exc}") from exc
    if kind == "cri-o":
        runtime = _dig(doc, "crio", "runtime") or {}
        runtimes = runtime.get("runtimes") or {}
        return [n for n, spec in runtimes.items() if _is_nvidia(n, spec)], str(runtime.get("default_runtime") or ""), []
    names, default = _containerd_runtimes(doc)
    imports = [str(p) for p in doc.get("imports") or []]
    return names, default, imports


def read_runtime_configs(host_root: str = "/", paths: Mapping[str, Sequence[str]] = RUNTIME_CONFIG_PATHS,
                         kinds: Iterable[str] | None = None) -> list[RuntimeConfig]:
    """Every runtime config file that exists under ``host_root`` (the host's ``/`` as mounted in the agent's
    container, e.g. ``/host``), for the runtimes ``kinds`` (default: all in ``paths``); containerd ``imports``
    (drop-ins such as ``/etc/containerd/conf.d/99-nvidia.toml``) are followed. Files that cannot be read are
    returned with ``error`` set."""
    out: list[RuntimeConfig] = []
    seen: set[str] = set()
    wanted = set(kinds) if kinds is not None else set(paths)

    def host(p: str) -> str:
        return os.path.join(host_root, p.lstrip("/"))

    for kind, patterns in paths.items():
        if kind not in wanted:
            continue
        queue = [host(p) for p in patterns]
        while queue:
            pattern = queue.pop(0)
            for path in sorted(glob.glob(pattern)):
                if path in seen or not os.path.isfile(path):
                    continue
                seen.add(path)
                try:
                    with open(path, encoding="utf-8") as fh:
                        names, default, imports = _parse(kind, path, fh.read())
                except (OSError, UnicodeDecodeError, ValueError) as exc:
                    out.append(RuntimeConfig(kind, path, error=str(exc)))
                    continue
                out.append(RuntimeConfig(kind, path, tuple(names), default))
                queue += [host(p) if os.path.isabs(p) else os.path.join(os.path.dirname(path), p) for p in imports]
    return out


def _runtime_kind(container_runtime: str | None) -> str | None:
    """``containerd://1.7.2`` / ``cri-o://1.30`` / ``docker://26.1`` (Node ``status.nodeInfo``) -> kind."""
    if not container_runtime:
        return None
    scheme = container_runtime.split("://", 1)[0].lower()
    return {"containerd": "containerd", "cri-o": "cri-o", "crio": "cri-o", "docker": "docker"}.get(scheme, scheme)


def _class_handlers(items: Any) -> list[tuple[str, str]]:
    """(name, handler) of RuntimeClass objects: dicts, client models, or a list object with ``items``."""
    if not isinstance(items, (list, tuple)) and hasattr(items, "items") and not isinstance(items, Mapping):
        items = items.items
    elif isinstance(items, Mapping) and "items" in items:
        items = items["items"]
    out = []
    for rc in items or ():
        if isinstance(rc, str):  # a name only: taken as the GPU Operator's RuntimeClass (name = handler)
            out.append((rc, rc))
            continue
        doc = _plain(rc) or {}
        out.append((str(_dig(doc, "metadata", "name") or ""), str(doc.get("handler") or "")))
    return out


def check_runtime(runtime_classes: Callable[[], Any] | Iterable[Any] | None = None, *, host_root: str = "/",
                  config_paths: Mapping[str, Sequence[str]] = RUNTIME_CONFIG_PATHS,
                  container_runtime: str | None = None, handler: str = RUNTIME_HANDLER) -> CheckResult:
    """The container runtime is configured for NVIDIA.

    ``runtime_classes``: the cluster's RuntimeClasses (``node.k8s.io/v1``: dicts, client models,
    ``NodeV1Api().list_runtime_class()``'s list, or bare names, each then taken as its own handler, as the GPU
    Operator's ``nvidia`` RuntimeClass is), or a callable returning them; None: not checked. ``host_root``: where
    the host's filesystem is mounted; ``config_paths``: :data:`RUNTIME_CONFIG_PATHS`; ``container_runtime``: the Node's
    ``status.nodeInfo.containerRuntimeVersion`` (only that runtime's files count; None: every file found).

    Passes when the host config defines an NVIDIA runtime that pods can reach (it is the default runtime, or a
    RuntimeClass names it), or, with no host config readable, when a RuntimeClass with handler ``handler``
    exists. Fails with ``RuntimeNotConfigured`` otherwise; the message says what is missing and how to fix it.
    """
    kind = _runtime_kind(container_runtime)
    configs = read_runtime_configs(host_root, config_paths, None if kind is None else [kind])
    readable = [c for c in configs if not c.error]
    broken = [c for c in configs if c.error]
    nvidia = sorted({n for c in readable for n in c.nvidia_runtimes})
    default_nvidia = [c for c in readable if c.default_is_nvidia]
    runtime_name = kind or (readable[0].kind if readable else "containerd")
    fix_host = (f"install the NVIDIA Container Toolkit and run `nvidia-ctk runtime configure --runtime={runtime_name}`"
                f", then restart {runtime_name}")
    broken_note = "".join(f"; {c.path} unreadable: {c.error}" for c in broken)

    classes: list[tuple[str, str]] = []
    class_error = ""
    if runtime_classes is not None:
        try:
            classes = _class_handlers(runtime_classes() if callable(runtime_classes) else runtime_classes)
        except Exception as exc:  # an API error is reported, not raised: the other checks still run
            class_error = f"{type(exc).__name__}: {exc}"
    wanted = {handler, *nvidia}
    matching = [(n, h) for n, h in classes if h in wanted]
    fix_class = (f"create a RuntimeClass (apiVersion node.k8s.io/v1, kind RuntimeClass, metadata.name {handler}, "
                 f"handler {nvidia[0] if nvidia else handler})")

    if readable and not nvidia:
        files = ", ".join(c.path for c in readable)
        return CheckResult("runtime", False, "RuntimeNotConfigured",
                           f"no NVIDIA runtime in {files}: {fix_host}{broken_note}")
    if not readable:
        where = ", ".join(p for k, ps in config_paths.items() if kind is None or k == kind for p in ps)
        if runtime_classes is None:
            return CheckResult("runtime", False, "RuntimeNotConfigured",
                               f"no container runtime config found under {host_root} ({where}) and no RuntimeClass "
                               f"lister: mount the host's runtime config into the agent, or {fix_host}{broken_note}")
        if class_error:
            return CheckResult("runtime", False, "RuntimeNotConfigured",
                               f"cannot list RuntimeClasses ({class_error}) and no runtime config found under "
                               f"{host_root} ({where}): grant the agent list on runtimeclasses.node.k8s.io"
                               f"{broken_note}")
        if matching:
            return CheckResult("runtime", True, "RuntimeConfigured",
                               f"RuntimeClass {matching[0][0]} (handler {matching[0][1]}) exists; host runtime config "
                               f"not checked (none found under {host_root}){broken_note}")
        return CheckResult("runtime", False, "RuntimeNotConfigured",
                           f"no RuntimeClass with handler {handler} and no runtime config found under {host_root}: "
                           f"{fix_class}, and {fix_host}{broken_note}")

    files = ", ".join(f"{c.path} ({'/'.join(c.nvidia_runtimes)})" for c in readable if c.nvidia_runtimes)
    if default_nvidia:
        how = f"the default runtime ({default_nvidia[0].default})"
        if matching:
            how += f"; RuntimeClass {matching[0][0]} exists"
        return CheckResult("runtime", True, "RuntimeConfigured", f"NVIDIA runtime in {files}, {how}{broken_note}")
    if runtime_classes is None:
        return CheckResult("runtime", True, "RuntimeConfigured",
                           f"NVIDIA runtime in {files} (not the default; RuntimeClasses not checked){broken_note}")
    if class_error:
        return CheckResult("runtime", True, "RuntimeConfigured",
                           f"NVIDIA runtime in {files} (not the default); RuntimeClasses could not be listed "
                           f"({class_error}){broken_note}")
    usable = [(n, h) for n, h in matching if h in nvidia]
    if usable:
        return CheckResult("runtime", True, "RuntimeConfigured",
                           f"NVIDIA runtime in {files}, reached through RuntimeClass {usable[0][0]} "
                           f"(handler {usable[0][1]}){broken_note}")
    if matching:
        name, hd = matching[0]
        return CheckResult("runtime", False, "RuntimeNotConfigured",
                           f"RuntimeClass {name} names handler {hd}, but the host's runtime config defines only "
                           f"{', '.join(nvidia)} ({files}): pods using it fail with 'no runtime for {hd}'; set the "
                           f"RuntimeClass handler to {nvidia[0]} or {fix_host}{broken_note}")
    return CheckResult("runtime", False, "RuntimeNotConfigured",
                       f"NVIDIA runtime in {files} is not the default runtime and no RuntimeClass has handler "
                       f"{'/'.join(sorted(wanted))}: pods cannot reach it; {fix_class}, or make it the default "
                       f"(nvidia-ctk runtime configure --runtime={runtime_name} --set-as-default){broken_note}")


# ---------------------------------------------------------------------------------------------- device plugin
def _mig_resource(profile: str) -> str:
    """``"1g.18gb"`` / ``"MIG 1g.18gb+me"`` -> ``nvidia.com/mig-1g.18gb`` / ``nvidia.com/mig-1g.18gb.me`` (the
    device plugin's names: Kubernetes resource names allow no ``+``)."""
    name = profile.removeprefix("MIG ").strip().replace("+", ".")
    return f"nvidia.com/mig-{name}"


def _quantity(value: Any) -> int | None:
    if value is None:
        return None
    try:
        return int(str(value))
    except ValueError:
        return None


def expected_resources(devices: Sequence[GpuDevice], labels: Mapping[str, str], resources: Mapping[str, Any],
                       resource: str = RESOURCE_GPU) -> tuple[dict[str, int], str, int]:
    """(resource -> count the device plugin should advertise, MIG strategy, replicas) for ``devices``.

    The strategy is the ``nvidia.com/mig.strategy`` label; without it: ``mixed`` when the node advertises any
    ``nvidia.com/mig-*`` resource, ``single`` when a GPU has MIG enabled, else ``none``. ``replicas``: the
    ``nvidia.com/gpu.replicas`` label (time-slicing / MPS), 1 without it; every count is multiplied by it.
    """
    strategy = (labels.get(LABEL_MIG_STRATEGY) or "").strip().lower()
    if not strategy:
        if any(k.startswith("nvidia.com/mig-") for k in resources):
            strategy = "mixed"
        elif any(d.mig_enabled for d in devices):
            strategy = "single"
        else:
            strategy = "none"
    replicas = _quantity(labels.get(LABEL_REPLICAS)) or 1
    out: dict[str, int] = {resource: 0}
    for d in devices:
        if not d.mig_enabled or strategy == "none":
            out[resource] += 1
        elif strategy == "single":
            out[resource] += len(d.mig_instances)
        else:
            for inst in d.mig_instances:
                key = _mig_resource(inst.profile)
                out[key] = out.get(key, 0) + 1
    return {k: v * replicas for k, v in out.items()}, strategy, max(replicas, 1)


def check_device_plugin(node: Mapping[str, Any] | Any, devices: Sequence[GpuDevice], *,
                        resource: str = RESOURCE_GPU) -> CheckResult:
    """The device plugin registered ``resource`` with the kubelet, with the right count.

    ``node``: the Node object (API JSON dict or client model); ``devices``: the GPUs NVML found. The count read is
    ``status.capacity`` (every device the plugin registered; ``allocatable`` drops the ones it found unhealthy,
    which is the health check's business) else ``status.allocatable``; a time-slicing config with
    ``renameByDefault`` advertises ``<resource>.shared``, accepted in place of ``resource``. Reasons:
    ``DevicePluginRegistered``, ``DevicePluginNotRegistered``, ``DevicePluginCountMismatch``.
    """
    doc = _plain(node) or {}
    name = _dig(doc, "metadata", "name") or "this node"
    labels = _dig(doc, "metadata", "labels") or {}
    capacity = _dig(doc, "status", "capacity") or {}
    allocatable = _dig(doc, "status", "allocatable") or {}
    advertised_keys = set(capacity) | set(allocatable)
    expected, strategy, replicas = expected_resources(devices, labels, advertised_keys, resource)

    def advertised(key: str) -> tuple[str, int | None, int | None]:
        for k in (key, f"{key}.shared"):
            if k in capacity or k in allocatable:
                return k, _quantity(capacity.get(k, allocatable.get(k))), _quantity(allocatable.get(k))
        return key, None, None

    for key in advertised_keys:  # MIG resources advertised that NVML does not explain
        if key.startswith("nvidia.com/mig-") and key not in expected:
            expected[key] = 0
    sharing = f" x {replicas} replicas" if replicas > 1 else ""
    registered, missing, mismatched, notes = [], [], [], []
    for key, want in sorted(expected.items()):
        key_seen, got, alloc = advertised(key)
        if got is None:
            if want > 0:
                missing.append(f"{key} (expected {want})")
            continue
        if got != want:
            mismatched.append(f"the kubelet advertises {got} {key_seen} on {name} (status.capacity), NVML found "
                              f"{want // replicas} {'MIG devices' if 'mig-' in key else 'GPUs'}{sharing} = {want} "
                              f"expected (MIG strategy {strategy})")
        else:
            registered.append(f"{got} {key_seen}")
            if alloc is not None and alloc < got:
                notes.append(f"{got - alloc} {key_seen} withdrawn as unhealthy")
    if missing and not registered and not mismatched:
        return CheckResult("device-plugin", False, "DevicePluginNotRegistered",
                           f"the kubelet on {name} advertises no {', '.join(missing)}: the NVIDIA device plugin is not "
                           "running or has not registered; check the nvidia-device-plugin pod on this node and "
                           "/var/lib/kubelet/device-plugins/")
    if missing or mismatched:
        parts = mismatched + ([f"not advertised: {', '.join(missing)}"] if missing else [])
        return CheckResult("device-plugin", False, "DevicePluginCountMismatch",
                           "; ".join(parts) + ": check the device plugin's config (MIG strategy, time-slicing "
                           "replicas) and its logs, then restart it")
    if not registered:
        return CheckResult("device-plugin", True, "DevicePluginRegistered", "no GPU to register", skipped=True)
    note = f" ({'; '.join(notes)})" if notes else ""
    return CheckResult("device-plugin", True, "DevicePluginRegistered",
                       f"device plugin registered {', '.join(registered)}{sharing}{note}")


# ---------------------------------------------------------------------------------------------- cuda
def _cu_name(lib: Any, code: int) -> str:
    try:
        out = ctypes.c_char_p()
        if lib.cuGetErrorName(int(code), ctypes.byref(out)) == 0 and out.value:
            return out.value.decode()
    except (AttributeError, OSError, TypeError, ValueError):
        pass
    return CU_RESULT_NAMES.get(int(code), f"CUresult {int(code)}")


def check_cuda(nvml_count: int | None = None, *, libraries: Sequence[str] = CUDA_LIBRARIES,
               loader: Callable[[str], Any] = ctypes.CDLL, mig: bool = False) -> CheckResult:
    """A tiny CUDA check: load libcuda (``loader``, ``ctypes.CDLL``), ``cuInit(0)``, ``cuDeviceGetCount``, and
    compare with ``nvml_count`` (skipped when ``mig``: CUDA then counts MIG devices, not GPUs).

    No loadable library in ``libraries``: passes, skipped (``CudaNotPresent``). Reasons: ``CudaReady``,
    ``CudaInitFailed`` (the ``CUresult`` name and a hint), ``CudaDeviceCountMismatch``. Runs in this process:
    ``cuInit`` creates no context and allocates no GPU memory.
    """
    lib = None
    errors = []
    for name in libraries:
        try:
            lib = loader(name)
            break
        except OSError as exc:
            errors.append(str(exc))
    if lib is None:
        return CheckResult("cuda", True, "CudaNotPresent",
                           f"CUDA check skipped: no {' / '.join(libraries)} in this container", skipped=True)
    rc = int(lib.cuInit(0))
    if rc != 0:
        hint = _CU_HINTS.get(rc, "see dmesg")
        return CheckResult("cuda", False, "CudaInitFailed", f"cuInit(0) failed: {_cu_name(lib, rc)} ({rc}): {hint}")
    count = ctypes.c_int(0)
    rc = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    if rc != 0:
        hint = _CU_HINTS.get(rc, "see dmesg")
        return CheckResult("cuda", False, "CudaInitFailed",
                           f"cuDeviceGetCount failed: {_cu_name(lib, rc)} ({rc}): {hint}")
    n = int(count.value)
    if nvml_count is not None and not mig and n != nvml_count:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        env = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
        return CheckResult("cuda", False, "CudaDeviceCountMismatch",
                           f"CUDA sees {n} device{'s' if n != 1 else ''}{env}, NVML {nvml_count}: a GPU NVML lists "
                           "cannot run CUDA work (check dmesg for Xid errors, nvidia-smi -q for a GPU in a bad state)")
    return CheckResult("cuda", True, "CudaReady", f"cuInit succeeded, CUDA sees {n} device{'s' if n != 1 else ''}")


# ---------------------------------------------------------------------------------------------- all
def validate_stack(backend: GpuBackend, *, node: Mapping[str, Any] | Any | None = None,
                   devices: Sequence[GpuDevice] | None = None, discovery: Any = None,
                   runtime_classes: Callable[[], Any] | Iterable[Any] | None = None, host_root: str = "/",
                   runtime_config_paths: Mapping[str, Sequence[str]] = RUNTIME_CONFIG_PATHS,
                   container_runtime: str | None = None, cuda: bool = True,
                   cuda_libraries: Sequence[str] = CUDA_LIBRARIES, cuda_loader: Callable[[str], Any] = ctypes.CDLL,
                   resource: str = RESOURCE_GPU) -> StackResult:
    """Run the four checks; returns a :class:`StackResult`.

    ``node``: the agent's Node (for the device plugin check and ``containerRuntimeVersion``); None: the device
    plugin check is skipped. ``devices``: the GPUs already discovered (else ``discovery.devices`` /
    ``discovery["devices"]`` when given, else ``backend.devices()``). When the driver
    check fails, the device plugin and CUDA checks are skipped (they need the GPU count). ``cuda=False`` skips the
    CUDA check. The other arguments go to :func:`check_runtime` and :func:`check_cuda`.
    """
    doc = _plain(node)
    if devices is None and discovery is not None:
        devices = discovery.get("devices") if isinstance(discovery, Mapping) else getattr(discovery, "devices", None)
    driver, found = _driver(backend, devices)
    checks = [driver]
    runtime_version = container_runtime or _dig(doc, "status", "nodeInfo", "containerRuntimeVersion")
    checks.append(check_runtime(runtime_classes, host_root=host_root, config_paths=runtime_config_paths,
                                container_runtime=runtime_version))
    if found is None:
        why = "skipped: the driver check failed"
        checks.append(CheckResult("device-plugin", True, "Skipped", f"device plugin check {why}", skipped=True))
        if cuda:
            checks.append(CheckResult("cuda", True, "Skipped", f"CUDA check {why}", skipped=True))
        return StackResult(tuple(checks))
    if doc is None:
        checks.append(CheckResult("device-plugin", True, "Skipped", "device plugin check skipped: no Node object",
                                  skipped=True))
    else:
        checks.append(check_device_plugin(doc, found, resource=resource))
    if cuda:
        checks.append(check_cuda(len(found), libraries=cuda_libraries, loader=cuda_loader,
                                 mig=any(d.mig_enabled for d in found)))
    return StackResult(tuple(checks))
