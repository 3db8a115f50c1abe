"""What the node agent reads from a GPU driver: one interface, two backends.

* :class:`GpuBackend`: the interface (a ``typing.Protocol``): driver versions, the devices with their fixed
  properties, their topology, a sample of their changing readings, and the driver's error events.
* ``NvmlBackend`` (:mod:`gpupool.agent.nvml`): the real one, over NVML through ``nvidia-ml-py`` (``pynvml``).
* ``FakeBackend`` (:mod:`gpupool.agent.fake`): driven by a YAML/JSON description (the recorded H200 of
  ``../shared/reference/nvml-h200/nvml.json`` among them), with events and faults injected by tests and demos.

The dataclasses here are the contract between the backends and everything above them (discovery, labels,
health, stack validation, metrics); no NVML type leaks past a backend. Units: MiB for memory, W for power,
degrees C, percent for utilisation, seconds since the epoch for times.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = ["DriverInfo", "GpuBackend", "GpuDevice", "GpuEvent", "GpuSample", "MigInstance", "MigProfile",
           "BackendError", "TOPOLOGY_LEVELS", "ARCHITECTURES", "MIB", "architecture_from_compute", "cuda_version"]


class BackendError(RuntimeError):
    """The driver cannot be read (NVML not loadable, no driver, a call failed); the message says which."""


TOPOLOGY_LEVELS = ("SAME", "NVLINK", "SINGLE", "MULTIPLE", "HOSTBRIDGE", "NODE", "SYSTEM")
"""Link between two GPUs, fastest first: the same device, NVLink, the same PCIe switch (``SINGLE``), several
PCIe switches (``MULTIPLE``), the same host bridge, the same NUMA node / CPU socket (``NODE``), across sockets
(``SYSTEM``); NVML's ``nvmlGpuTopologyLevel_t`` names (``NVML_TOPOLOGY_INTERNAL`` = ``SINGLE`` board)."""


@dataclass(frozen=True, slots=True)
class DriverInfo:
    """``driver``: kernel driver version (``"580.159.04"``); ``cuda_driver``: the CUDA version the driver
    supports, ``"13.0"`` (NVML reports 13000); ``nvml``: NVML library version."""

    driver: str
    cuda_driver: str
    nvml: str = ""


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG GPU-instance profile the GPU offers: ``name`` as the device plugin spells it (``"1g.18gb"``,
    ``"1g.18gb+me"``), NVML profile ``id``, compute ``slices``, how many instances fit (``instances``), usable
    memory (MiB, below the nominal size in the name), streaming multiprocessors."""

    id: int
    name: str
    slices: int
    instances: int
    memory_mib: int
    sms: int = 0


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG device that exists: its profile name, placement (start slice, size) and UUID (``MIG-...``)."""

    profile: str
    start: int
    size: int
    uuid: str = ""
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """A GPU's fixed properties (read once at discovery; a GPU reset may change ``mig_*``).

    ``index``: NVML index; ``minor``: ``/dev/nvidiaN`` minor number; ``name``: NVML product name
    (``"NVIDIA H200"``); ``memory_mib``: total memory; ``compute``: compute capability ``(major, minor)``;
    ``architecture``: lower-case family (``"hopper"``, ``"ampere"``...); ``pci_bus_id``: ``"00000000:00:06.0"``;
    ``numa_node``: None where NVML does not report it; ``mig_enabled``: current MIG mode; ``mig_profiles``:
    what it offers (empty where MIG is not supported); ``mig_instances``: MIG devices that exist;
    ``nvlink_peers``: PCI bus ids of the GPUs its active NVLinks reach; ``power_limit_w``: enforced limit.
    ``lost``: the driver counts the GPU (``nvmlDeviceGetCount``) but it could not be read at discovery
    (``NVML_ERROR_GPU_IS_LOST``: it fell off the bus before it was first read); only ``index`` and what could
    still be read (``uuid``, ``pci_bus_id``, else ``""``) are known, ``name`` is ``""`` and ``memory_mib`` 0.
    """

    index: int
    uuid: str
    name: str
    memory_mib: int
    minor: int = -1
    compute: tuple[int, int] = (0, 0)
    architecture: str = ""
    pci_bus_id: str = ""
    numa_node: int | None = None
    mig_enabled: bool = False
    mig_profiles: tuple[MigProfile, ...] = ()
    mig_instances: tuple[MigInstance, ...] = ()
    nvlink_peers: tuple[str, ...] = ()
    power_limit_w: float = 0.0
    serial: str = ""
    vbios: str = ""
    lost: bool = False


@dataclass(frozen=True, slots=True)
class GpuSample:
    """A GPU's changing readings at one time (None where the GPU does not support the query).

    ``util_gpu`` / ``util_memory``: percent; ``memory_used_mib`` / ``memory_free_mib``; ``power_w``;
    ``temperature_c``; ``ecc_volatile_uncorrected``: double-bit errors since the driver loaded;
    ``remapped_rows``: ``(correctable, uncorrectable, pending, failed)`` (row remapping, Ampere and later);
    ``retired_pages_pending``: page retirement (older GPUs); ``throttle_reasons``: NVML clock-event reasons
    bit mask (``nvmlClocksEventReason*``); ``lost``: the GPU fell off the bus (``NVML_ERROR_GPU_IS_LOST``).
    """

    index: int
    uuid: str
    time: float
    util_gpu: float | None = None
    util_memory: float | None = None
    memory_used_mib: int | None = None
    memory_free_mib: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    ecc_volatile_uncorrected: int | None = None
    remapped_rows: tuple[int, int, int, int] | None = None
    retired_pages_pending: bool | None = None
    throttle_reasons: int = 0
    lost: bool = False


@dataclass(frozen=True, slots=True)
class GpuEvent:
    """An error event of the driver: ``kind`` is ``"xid"`` (``code`` = the XID number), ``"ecc_dbe"``
    (double-bit ECC error) or ``"reset"`` (the GPU was reset: what made it unhealthy is cleared); ``uuid`` of
    the GPU, ``time`` seconds since the epoch."""

    uuid: str
    kind: str
    code: int = 0
    time: float = 0.0
    detail: str = field(default="", compare=False)


@runtime_checkable
class GpuBackend(Protocol):
    """Reads one node's GPUs. Every method raises :class:`BackendError` when the driver cannot answer."""

    def driver(self) -> DriverInfo:
        """Driver, CUDA driver and NVML versions."""
        ...

    def devices(self) -> list[GpuDevice]:
        """Every GPU, by NVML index."""
        ...

    def topology(self) -> dict[tuple[int, int], str]:
        """``(i, j) -> level`` (one of :data:`TOPOLOGY_LEVELS`) for every pair of GPU indices ``i < j``."""
        ...

    def sample(self) -> list[GpuSample]:
        """The current readings of every GPU (a GPU that cannot be read has ``lost=True``)."""
        ...

    def events(self, timeout_s: float) -> list[GpuEvent]:
        """Error events that arrived, waiting up to ``timeout_s`` seconds for the first one."""
        ...

    def close(self) -> None:
        """Release the driver (NVML shutdown)."""
        ...


MIB = 1 << 20

ARCHITECTURES: dict[int, str] = {2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere",
                                 8: "ada-lovelace", 9: "hopper", 10: "blackwell", 13: "rubin"}
"""NVML ``nvmlDeviceArchitecture_t`` values (``NVML_DEVICE_ARCH_*``) -> the family names GFD uses."""


def architecture_from_compute(major: int, minor: int) -> str:
    """The GPU family from the compute capability, as GPU Feature Discovery's ``getArchFamily`` has it
    (k8s-device-plugin ``internal/lm/resource.go``): 9.x -> ``hopper``, 8.9 -> ``ada-lovelace``..."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    return {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper", 10: "blackwell",
            12: "blackwell", 13: "rubin"}.get(major, "undefined" if major else "")


def cuda_version(value: int | float | str) -> str:
    """The CUDA driver version as ``"major.minor"``: NVML's integer form (``13000``, i.e. 1000 * major + 10 *
    minor) -> ``"13.0"``; a small integer is a major version (``12`` -> ``"12.0"``); a float (an unquoted YAML
    ``12.8``) or a string ``"12.8"`` is major.minor as written; ``""`` (unknown) passes. ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
        if value >= 1000 and value.is_integer():
            return cuda_version(int(value))
        text = repr(value)
        if not re.fullmatch(r"\d+\.\d+", text):
            raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
        return text
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"CUDA version {value!r}: must not be negative")
        return f"{value // 1000}.{(value % 1000) // 10}" if value >= 1000 else f"{value}.0"
    if isinstance(value, str):
        text = value.strip()
        if re.fullmatch(r"\d{1,9}", text):
            return cuda_version(int(text))
        if text == "" or re.fullmatch(r"\d{1,9}(\.\d{1,9}){1,2}", text):
            return text
    raise ValueError(f"CUDA version {value!r}: expected \"12.8\" or NVML's 12080")
