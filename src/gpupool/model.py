"""Plain value types shared by the engine, the simulator and every driver.

Units, everywhere in gpupool:

* CPU in milli-cores (``32000`` = 32 cores),
* memory in MiB,
* GPU share in milli-GPU (``1000`` = one whole GPU); a pod asking for a fraction of one GPU has
  ``num_gpu == 1`` and ``gpu_milli < 1000`` (the convention of the Alibaba openb trace and of the
  FGD simulator, Weng et al., USENIX ATC'23); a pod asking ``N > 1`` GPUs with ``gpu_milli < 1000``
  gets ``N`` distinct GPUs with that share on each (HAMi ``nvidia.com/gpu: N`` + ``gpucores``),
* time in seconds.

These types do no I/O and know nothing of Kubernetes or of the simulator.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

MILLI = 1000
"""milli-GPU in one whole GPU."""

MAX_CPU_MILLI = 10**9
"""Largest CPU capacity or request accepted (milli-cores; a million cores)."""
MAX_MEMORY_MIB = 2**34
"""Largest memory capacity or request accepted (MiB; 16 PiB)."""
MAX_GPUS_PER_NODE = 64
"""Most GPUs one node may declare."""
MAX_POD_GPUS = 4096
"""Most GPUs one pod may ask for (it can never fit, but is reported rather than rejected as absurd)."""


def _check_int(owner: str, field_name: str, value: object, high: int, error: type[Exception]) -> None:
    if type(value) is int and 0 <= value <= high:  # the common case, without the slow ABC isinstance
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise error(f"{owner}: {field_name} must be an integer, got {value!r}")
    if not 0 <= value <= high:
        raise error(f"{owner}: {field_name} {value} outside 0..{high}")


def _check_model_name(owner: str, model: object, error: type[Exception]) -> None:
    if not isinstance(model, str) or not model or model != model.strip() or "|" in model or "\n" in model:
        raise error(f"{owner}: GPU model {model!r} must be a non-empty name without surrounding spaces or '|'")


class GpupoolError(Exception):
    """Base class of gpupool's own errors."""


class InvalidRequestError(GpupoolError, ValueError):
    """A pod request that no scheduler could ever honour as written (e.g. ``gpu_milli`` > 1000)."""


class AllocationError(GpupoolError):
    """An allocation that would over-commit a node or a GPU, or touch an unknown pod or device."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node as the cluster declares it.

    ``gpu_model`` names an entry of :mod:`gpupool.catalog` (unknown names are kept as opaque models);
    ``""`` for a CPU-only node. ``gpu_memory_mib`` is the memory of each GPU (MiB) as the node reports it
    (GPU Feature Discovery's ``nvidia.com/gpu.memory`` label); it wins over the catalog's figure, and
    ``0`` means "take the catalog's figure" (unknown when the catalog does not know the model either:
    such GPUs take whole-GPU and share-only pods but no pod that asks for an amount of GPU memory).
    ``gpu_replicas`` is how many time-slicing / MPS replicas the device plugin advertises per GPU
    (``nvidia.com/gpu.replicas``; 1 = not shared): a whole-GPU ask on such a node is in replicas
    ("slices"), each ``1000 // gpu_replicas`` milli of a distinct GPU (see
    :meth:`gpupool.cluster.ClusterState.share_on`). ``gpu_product`` is the product name the node
    reports (e.g. ``NVIDIA-A100-SXM4-80GB``; ``""``: the same as ``gpu_model``), matched by HAMi-style
    GPU type selection. ``gpu_ids`` are the identities (UUIDs) of the advertised GPUs in device-index
    order when the node publishes them (``()``: unknown), used to match telemetry and other
    schedulers' device annotations by identity rather than position.
    Topology (``""`` = none): ``nvlink_domain`` groups GPUs joined by NVLink
    (an 8-GPU HGX board is one domain), ``rack`` the rack, ``switch`` the InfiniBand / Ethernet leaf
    switch above it; ``labels`` are free-form (e.g. Kubernetes node labels).
    """

    name: str
    cpu_milli: int
    memory_mib: int
    gpu_count: int = 0
    gpu_model: str = ""
    nvlink_domain: str = ""
    rack: str = ""
    switch: str = ""
    labels: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    gpu_memory_mib: int = 0
    gpu_replicas: int = 1
    gpu_product: str = ""
    gpu_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"node name must be a non-empty string, got {self.name!r}")
        owner = f"node {self.name}"
        _check_int(owner, "cpu_milli", self.cpu_milli, MAX_CPU_MILLI, ValueError)
        _check_int(owner, "memory_mib", self.memory_mib, MAX_MEMORY_MIB, ValueError)
        _check_int(owner, "gpu_count", self.gpu_count, MAX_GPUS_PER_NODE, ValueError)
        _check_int(owner, "gpu_memory_mib", self.gpu_memory_mib, MAX_MEMORY_MIB, ValueError)
        _check_int(owner, "gpu_replicas", self.gpu_replicas, MILLI, ValueError)
        if self.gpu_replicas < 1:
            raise ValueError(f"{owner}: gpu_replicas must be at least 1, got {self.gpu_replicas}")
        if not isinstance(self.gpu_product, str):
            raise ValueError(f"{owner}: gpu_product must be a string, got {self.gpu_product!r}")
        if not isinstance(self.gpu_ids, tuple) or not all(isinstance(x, str) for x in self.gpu_ids):
            raise ValueError(f"{owner}: gpu_ids must be a tuple of strings, got {self.gpu_ids!r}")
        if self.gpu_count > 0 and not self.gpu_model:
            raise ValueError(f"node {self.name}: {self.gpu_count} GPUs but no GPU model")
        if self.gpu_model:
            _check_model_name(owner, self.gpu_model, ValueError)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """What one pod asks for.

    * ``num_gpu``: GPUs wanted; ``gpu_milli``: share of *each* of them (1..1000). A fractional pod has
      ``num_gpu == 1`` and ``gpu_milli < 1000``; a whole-GPU pod has ``gpu_milli == 1000``; a CPU pod 0/0.
      ``num_gpu > 1`` with ``gpu_milli < 1000`` is a per-card share: ``num_gpu`` distinct GPUs, each
      giving ``gpu_milli`` (and ``gpu_memory_mib``).
    * ``gpu_memory_mib``: GPU memory per GPU (MiB); 0 means "in proportion to the share"
      (``gpu_milli / 1000`` of the GPU's memory, the time-slicing-with-memory-cap convention).
    * ``gpu_spec``: allowed GPU models (exact catalog keys or opaque names); empty means any.
    * ``gpu_type_include`` / ``gpu_type_exclude``: HAMi-style GPU type selection
      (``nvidia.com/use-gputype`` / ``nouse-gputype``): case-insensitive substrings of the GPU model or
      product name; a GPU qualifies when it matches one of ``gpu_type_include`` (if any are given) and
      none of ``gpu_type_exclude``.
    * ``priority``: larger is more important; Kubernetes' int32 range (system classes up to 2,000,001,000).
      ``qos`` is kept as given (LS, BE, Burstable, Guaranteed).

    Raises :class:`InvalidRequestError` when the combination is impossible.
    """

    name: str
    cpu_milli: int = 0
    memory_mib: int = 0
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_spec: tuple[str, ...] = ()
    gpu_memory_mib: int = 0
    qos: str = ""
    priority: int = 0
    creation_time: float | None = None
    deletion_time: float | None = None
    labels: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    gpu_type_include: tuple[str, ...] = ()
    gpu_type_exclude: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InvalidRequestError(f"pod name must be a non-empty string, got {self.name!r}")
        owner = f"pod {self.name}"
        _check_int(owner, "cpu_milli", self.cpu_milli, MAX_CPU_MILLI, InvalidRequestError)
        _check_int(owner, "memory_mib", self.memory_mib, MAX_MEMORY_MIB, InvalidRequestError)
        _check_int(owner, "num_gpu", self.num_gpu, MAX_POD_GPUS, InvalidRequestError)
        _check_int(owner, "gpu_milli", self.gpu_milli, MILLI, InvalidRequestError)
        _check_int(owner, "gpu_memory_mib", self.gpu_memory_mib, MAX_MEMORY_MIB, InvalidRequestError)
        prio = self.priority
        if type(prio) is not int or not -(2**31) <= prio < 2**31:  # Kubernetes' int32 range, system classes included
            if isinstance(prio, bool) or not isinstance(prio, numbers.Integral):
                raise InvalidRequestError(f"{owner}: priority must be an integer, got {prio!r}")
            if not -(2**31) <= prio < 2**31:
                raise InvalidRequestError(f"{owner}: priority {prio} outside the int32 range "
                                          f"{-(2**31)}..{2**31 - 1}")
        if not isinstance(self.gpu_spec, tuple):
            raise InvalidRequestError(f"{owner}: gpu_spec must be a tuple of GPU model names, got {self.gpu_spec!r}")
        for model in self.gpu_spec:
            _check_model_name(owner, model, InvalidRequestError)
        for label, types in (("gpu_type_include", self.gpu_type_include),
                             ("gpu_type_exclude", self.gpu_type_exclude)):
            if not isinstance(types, tuple) or not all(isinstance(t, str) and t.strip() for t in types):
                raise InvalidRequestError(f"{owner}: {label} must be a tuple of non-empty strings, got {types!r}")
        if self.gpu_memory_mib and not self.num_gpu:
            raise InvalidRequestError(f"{owner}: gpu_memory_mib without num_gpu")
        for label, t in (("creation_time", self.creation_time), ("deletion_time", self.deletion_time)):
            if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not math.isfinite(t)):
                raise InvalidRequestError(f"{owner}: {label} must be a finite number of seconds, got {t!r}")
        if (self.creation_time is not None and self.deletion_time is not None
                and self.deletion_time < self.creation_time):
            raise InvalidRequestError(f"{owner}: deletion_time before creation_time")
        if self.num_gpu == 0:
            if self.gpu_milli != 0:
                raise InvalidRequestError(f"pod {self.name}: gpu_milli {self.gpu_milli} without num_gpu")
        else:
            if not 1 <= self.gpu_milli <= MILLI:
                raise InvalidRequestError(
                    f"pod {self.name}: gpu_milli {self.gpu_milli} outside 1..{MILLI} for {self.num_gpu} GPU(s)"
                )

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU (``num_gpu * gpu_milli``)."""
        return self.num_gpu * self.gpu_milli

    @property
    def is_fractional(self) -> bool:
        """True for a pod that shares one GPU (``num_gpu == 1`` and ``gpu_milli < 1000``); a per-card share over
        several GPUs (``num_gpu > 1``, ``gpu_milli < 1000``) is not "fractional" in this sense."""
        return self.num_gpu == 1 and self.gpu_milli < MILLI

    @property
    def is_gpu(self) -> bool:
        return self.num_gpu > 0


@dataclass(frozen=True, slots=True)
class Assignment:
    """Where a pod was placed, down to the device.

    ``gpus`` are device indices on the node; each got ``gpu_milli`` milli-GPU and ``gpu_memory_mib`` MiB.
    ``requested_gpu_milli`` is what the pod asked per GPU; it is below ``gpu_milli`` only when a policy
    hands out whole GPUs to fractional pods (``k8s-default``).
    """

    pod: str
    node: int
    node_name: str
    gpus: tuple[int, ...]
    gpu_milli: int
    gpu_memory_mib: int
    requested_gpu_milli: int
    cpu_milli: int
    memory_mib: int

    @property
    def allocated_gpu_milli(self) -> int:
        return len(self.gpus) * self.gpu_milli

    @property
    def used_gpu_milli(self) -> int:
        return len(self.gpus) * self.requested_gpu_milli
