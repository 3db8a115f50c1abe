"""GPU model catalog: memory, power and relative throughput of each GPU model, with sources.

Unknown model names (e.g. the openb trace's undisclosed ``G1``/``G2``/``G3``) are kept as *opaque*
models: :func:`get_model` returns an entry with ``known=False`` and no figures, so the engine can still
tell them apart but never invents a number for them.

Conventions used for every entry (each entry's ``source`` says where its own figures come from):

* ``memory_mib`` is the device memory total that NVML / ``nvidia-smi`` reports with the default ECC
  setting, i.e. the value GPU Feature Discovery puts in the ``nvidia.com/gpu.memory`` node label. It is
  what a pod can actually be given, so it is below the nominal capacity: GDDR6 cards (T4, A10, L4, L40S)
  lose 1/16 to in-band ECC (T4 16 GB -> 15360 MiB) and HBM cards lose a few hundred MiB to the driver
  (H100 80 GB -> 81559 MiB). ``nominal_memory_gb`` keeps the datasheet capacity.
* ``peak_w`` is the maximum board power / TDP of the form factor named in ``source`` (datasheet).
* ``idle_w`` is an *estimate*: the typical ``nvidia-smi`` power draw of that model sitting idle with no
  process (0 % utilization), taken as the middle of the readings seen in publicly posted nvidia-smi
  outputs. PCIe cards drop to P8 when idle; SXM/HBM cards stay in P0 and draw much more. Real idle power
  moves by +-30 % with temperature, persistence mode and clocks.
* ``relative_throughput`` is ``fp16_tensor_tflops / 125``: the dense (no sparsity) FP16/BF16 tensor-core
  peak from the NVIDIA datasheet, relative to V100 SXM2's 125 TFLOPS. Peak ratios are a consistent,
  citable proxy, not a measurement: measured training speedups between generations (e.g. MLPerf
  Training) are usually smaller than the peak ratio for the newer parts, whose memory bandwidth grew less
  than their tensor peak, and P100, which has no tensor cores (its plain FP16 peak is used), does better
  in real training than its 0.15 suggests. Treat them as a consistent ordering, not predicted speedups.
* MIG profile ``memory_mib`` is the nominal size in the profile name (``1g.10gb`` -> 10 x 1024 MiB),
  exactly as the NVIDIA MIG user guide / mig-parted names them. It is **not** what a pod gets: the device
  reports less for each profile (dcgm-exporter #544, #397, GFD #7), and that figure is
  ``usable_memory_mib`` (NVML ``nvmlDeviceGetGpuInstanceProfileInfo`` ``memorySizeMB``, the ``Memory`` column
  of ``nvidia-smi mig -lgip`` x 1024, GFD's ``nvidia.com/mig-<profile>.memory``), with ``sm_count``. Sizing
  uses ``usable_memory_mib`` (:func:`gpupool.engine.rightsize.slice_catalog`).

  * H200: NVML and ``nvidia-smi mig -lgip`` on a real H200 (driver 580.159.04,
    ``shared/reference/nvml-h200``): 1g.18gb has 16384 MiB and 16 SMs, 1g.35gb 33280 / 26, 2g.35gb
    33280 / 32, 3g.71gb 71424 / 60, 4g.71gb 71424 / 64, 7g.141gb 143360 / 132. (The H200 also offers
    ``1g.18gb+me``, one instance of 1g.18gb with the media engines; it is left out of the catalog's six-profile
    set, as ``+me`` is for the others.)
  * H100 80GB HBM3: ``nvidia-smi mig -lgip`` in the NVIDIA MIG user guide ("H100 MIG profiles"), the same
    figures as ``examples/agent/dgx-h100.yaml``: 1g.10gb 9984 MiB (9.75 GiB) / 16 SMs, 1g.20gb 20096 / 26,
    2g.20gb 20096 / 32, 3g.40gb 40448 / 60, 4g.40gb 40448 / 64, 7g.80gb 81152 / 132.
  * A100 80GB: the same guide's A100-SXM4-80GB listing: 1g.10gb 9728 MiB (9.50 GiB) / 14 SMs, 1g.20gb
    19968 / 14, 2g.20gb 19968 / 28, 3g.40gb 40192 / 42, 4g.40gb 40192 / 56, 7g.80gb 81152 / 98.
  * A100 40GB: its A100-SXM4-40GB listing: 1g.5gb 4864 MiB (4.75 GiB) / 14, 1g.10gb 9856 / 14, 2g.10gb
    9856 / 28, 3g.20gb 19968 / 42, 4g.20gb 19968 / 56, 7g.40gb 40192 / 98.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG profile: ``name`` like ``1g.10gb``; ``max_instances`` per GPU; ``memory_mib``;
    ``compute_slices`` of 7.

    ``memory_slices`` is how many of the GPU's 8 memory slices the profile takes (MIG user guide).
    ``memory_mib`` is the nominal size in the name (never the memory to size with); ``usable_memory_mib``:
    memory the device reports for the profile (NVML ``memorySizeMB``), below ``memory_mib``; ``sm_count``:
    streaming multiprocessors of the instance; both 0 when not measured.
    """

    name: str
    max_instances: int
    memory_mib: int
    compute_slices: int
    memory_slices: int = 0
    usable_memory_mib: int = 0
    sm_count: int = 0


@dataclass(frozen=True, slots=True)
class GpuModel:
    """Figures of one GPU model.

    * ``memory_mib``: device memory (MiB), 0 when unknown.
    * ``idle_w`` / ``peak_w``: idle and board peak power (W), 0 when unknown.
    * ``relative_throughput``: training throughput relative to V100 (= 1.0), 0 when unknown.
    * ``source``: where each figure comes from.
    * ``fp16_tensor_tflops``: dense FP16/BF16 tensor peak (datasheet) behind ``relative_throughput``.
    * ``nominal_memory_gb``: datasheet memory capacity (GB), 0 when unknown.
    """

    name: str
    memory_mib: int = 0
    idle_w: float = 0.0
    peak_w: float = 0.0
    relative_throughput: float = 0.0
    mig_profiles: tuple[MigProfile, ...] = ()
    known: bool = True
    source: str = ""
    fp16_tensor_tflops: float = 0.0
    nominal_memory_gb: float = 0.0


#: Dense FP16 tensor peak of V100 SXM2 (TFLOPS, NVIDIA V100 datasheet): the 1.0 of ``relative_throughput``.
V100_FP16_TENSOR_TFLOPS = 125.0

_THROUGHPUT_NOTE = (
    "relative_throughput = dense FP16/BF16 tensor TFLOPS / 125 (V100 SXM2), datasheet peak ratio, "
    "not a measured training speedup"
)


def _mig(name: str, max_instances: int, memory_slices: int, usable_memory_mib: int = 0,
         sm_count: int = 0) -> MigProfile:
    """A profile from its NVIDIA name (``<g>g.<mem>gb``): compute slices and memory follow from the name."""
    m = re.fullmatch(r"(\d)g\.(\d+)gb", name)
    if m is None:
        raise ValueError(f"not a MIG profile name: {name!r}")
    return MigProfile(
        name=name,
        max_instances=max_instances,
        memory_mib=int(m.group(2)) * 1024,
        compute_slices=int(m.group(1)),
        memory_slices=memory_slices,
        usable_memory_mib=usable_memory_mib,
        sm_count=sm_count,
    )


def _mig_set(names: tuple[str, str, str, str, str, str], usable_mib: tuple[int, int, int, int, int, int],
             sms: tuple[int, int, int, int, int, int]) -> tuple[MigProfile, ...]:
    """The six-profile set A100/H100/H200 share: 1g x7, 1g (double memory) x4, 2g x3, 3g x2, 4g x1, 7g x1;
    ``usable_mib`` / ``sms``: what the device reports for each (``nvidia-smi mig -lgip``), in that order."""
    shape = ((7, 1), (4, 2), (3, 2), (2, 4), (1, 4), (1, 8))
    return tuple(_mig(n, k, mem_slices, usable_memory_mib=u, sm_count=sm)
                 for n, (k, mem_slices), u, sm in zip(names, shape, usable_mib, sms, strict=True))


_MIG_SOURCE = "MIG profiles: NVIDIA MIG user guide (supported profiles) / NVIDIA mig-parted default config"

# usable memory (MiB) and SMs as each device reports them (the module docstring gives the sources)
_MIG_A100_40GB = _mig_set(("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
                          (4864, 9856, 9856, 19968, 19968, 40192), (14, 14, 28, 42, 56, 98))
_MIG_A100_80GB = _mig_set(("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                          (9728, 19968, 19968, 40192, 40192, 81152), (14, 14, 28, 42, 56, 98))
_MIG_H100 = _mig_set(("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
                     (9984, 20096, 20096, 40448, 40448, 81152), (16, 26, 32, 60, 64, 132))
# H200: measured on a real H200 (NVML profile info, ../shared/reference/nvml-h200)
_MIG_H200 = _mig_set(("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
                     (16384, 33280, 33280, 71424, 71424, 143360), (16, 26, 32, 60, 64, 132))


def _entry(
    name: str,
    *,
    memory_mib: int,
    nominal_memory_gb: float,
    idle_w: float,
    peak_w: float,
    fp16_tensor_tflops: float,
    source: str,
    mig_profiles: tuple[MigProfile, ...] = (),
) -> GpuModel:
    return GpuModel(
        name=name,
        memory_mib=memory_mib,
        idle_w=idle_w,
        peak_w=peak_w,
        relative_throughput=round(fp16_tensor_tflops / V100_FP16_TENSOR_TFLOPS, 3),
        mig_profiles=mig_profiles,
        known=True,
        source=source,
        fp16_tensor_tflops=fp16_tensor_tflops,
        nominal_memory_gb=nominal_memory_gb,
    )


CATALOG: dict[str, GpuModel] = {
    # ---------------------------------------------------------------- models of the openb trace
    "P100": _entry(
        "P100",
        memory_mib=16280,
        nominal_memory_gb=16,
        idle_w=27,
        peak_w=250,
        fp16_tensor_tflops=18.7,
        source=(
            "Tesla P100 PCIe 16 GB assumed (the trace does not say which form factor; SXM2 is 300 W, "
            "21.2 TFLOPS). memory: nvidia-smi 'Tesla P100-PCIE-16GB' shows 16280 MiB; "
            "peak 250 W and FP16 18.7 TFLOPS (no tensor cores, plain FP16 peak): NVIDIA Tesla P100 "
            "datasheet; "
            "idle: estimate, nvidia-smi readings of idle P100 PCIe (P0) are 26-30 W. " + _THROUGHPUT_NOTE
        ),
    ),
    "T4": _entry(
        "T4",
        memory_mib=15360,
        nominal_memory_gb=16,
        idle_w=10,
        peak_w=70,
        fp16_tensor_tflops=65,
        source=(
            "memory: nvidia-smi 'Tesla T4' shows 15360 MiB (16 GB GDDR6 less 1/16 for ECC); "
            "peak 70 W and mixed-precision FP16 65 TFLOPS: NVIDIA T4 Tensor Core GPU datasheet; "
            "idle: estimate, nvidia-smi readings of idle T4 (P8) are 9-10 W (~26 W in P0 with a CUDA "
            "context). " + _THROUGHPUT_NOTE
        ),
    ),
    "V100M16": _entry(
        "V100M16",
        memory_mib=16160,
        nominal_memory_gb=16,
        idle_w=40,
        peak_w=300,
        fp16_tensor_tflops=125,
        source=(
            "Tesla V100 SXM2 16 GB. memory: nvidia-smi 'Tesla V100-SXM2-16GB' shows 16160 MiB "
            "(16130 on older drivers); peak 300 W and tensor 125 TFLOPS: NVIDIA Tesla V100 datasheet (SXM2); "
            "idle: estimate, middle of nvidia-smi readings of idle V100 SXM2 (P0, 24-52 W). "
            + _THROUGHPUT_NOTE
        ),
    ),
    "V100M32": _entry(
        "V100M32",
        memory_mib=32510,
        nominal_memory_gb=32,
        idle_w=40,
        peak_w=300,
        fp16_tensor_tflops=125,
        source=(
            "Tesla V100 SXM2 32 GB. memory: nvidia-smi 'Tesla V100-SXM2-32GB' shows 32510 MiB; "
            "peak 300 W and tensor 125 TFLOPS: NVIDIA Tesla V100 datasheet (SXM2); "
            "idle: estimate, same as V100 SXM2 16 GB (readings ~40 W in P0). " + _THROUGHPUT_NOTE
        ),
    ),
    "A10": _entry(
        "A10",
        memory_mib=23028,
        nominal_memory_gb=24,
        idle_w=17,
        peak_w=150,
        fp16_tensor_tflops=125,
        source=(
            "NVIDIA A10 (not the AWS A10G). memory: nvidia-smi / GFD nvidia.com/gpu.memory shows 23028 MiB "
            "(24 GB GDDR6 less ECC); peak 150 W and FP16/BF16 tensor 125 TFLOPS dense (250 with sparsity): "
            "NVIDIA A10 Tensor Core GPU datasheet; idle: estimate, nvidia-smi readings of idle A10 (P8) are "
            "8-26 W. " + _THROUGHPUT_NOTE
        ),
    ),
    # ---------------------------------------------------------------- current data-centre models
    "A100-40GB": _entry(
        "A100-40GB",
        memory_mib=40960,
        nominal_memory_gb=40,
        idle_w=50,
        peak_w=400,
        fp16_tensor_tflops=312,
        mig_profiles=_MIG_A100_40GB,
        source=(
            "A100 SXM4 40 GB. memory: nvidia-smi 'NVIDIA A100-SXM4-40GB' shows 40960 MiB on current drivers "
            "(40536 on older ones); peak 400 W and FP16/BF16 tensor 312 TFLOPS dense: NVIDIA A100 Tensor "
            "Core GPU datasheet; idle: estimate, nvidia-smi readings of idle A100 SXM4 40 GB (P0) are "
            "42-60 W. " + _MIG_SOURCE + ". " + _THROUGHPUT_NOTE
        ),
    ),
    "A100-80GB": _entry(
        "A100-80GB",
        memory_mib=81920,
        nominal_memory_gb=80,
        idle_w=55,
        peak_w=400,
        fp16_tensor_tflops=312,
        mig_profiles=_MIG_A100_80GB,
        source=(
            "A100 SXM4 80 GB. memory: nvidia-smi / GFD 'NVIDIA-A100-SXM4-80GB' shows 81920 MiB; "
            "peak 400 W (some HGX boards are configured to 500 W) and FP16/BF16 tensor 312 TFLOPS dense: "
            "NVIDIA A100 Tensor Core GPU datasheet; idle: estimate, nvidia-smi readings of idle A100 SXM4 "
            "80 GB (P0) are 50-68 W. " + _MIG_SOURCE + ". " + _THROUGHPUT_NOTE
        ),
    ),
    "H100": _entry(
        "H100",
        memory_mib=81559,
        nominal_memory_gb=80,
        idle_w=70,
        peak_w=700,
        fp16_tensor_tflops=989,
        mig_profiles=_MIG_H100,
        source=(
            "H100 SXM5 80 GB HBM3. memory: nvidia-smi 'NVIDIA H100 80GB HBM3' shows 81559 MiB; "
            "peak 700 W and FP16/BF16 tensor 989 TFLOPS dense (1,979 with sparsity): NVIDIA H100 Tensor Core "
            "GPU datasheet (SXM); idle: estimate, nvidia-smi readings of idle H100 SXM (P0) are 67-72 W. "
            + _MIG_SOURCE
            + ". "
            + _THROUGHPUT_NOTE
        ),
    ),
    "H200": _entry(
        "H200",
        memory_mib=143771,
        nominal_memory_gb=141,
        idle_w=75,
        peak_w=700,
        fp16_tensor_tflops=989,
        mig_profiles=_MIG_H200,
        source=(
            "H200 SXM 141 GB HBM3e. memory: nvidia-smi 'NVIDIA H200' shows 143771 MiB; "
            "peak 700 W and FP16/BF16 tensor 989 TFLOPS dense (1,979 with sparsity): NVIDIA H200 Tensor Core "
            "GPU datasheet (SXM); idle: estimate, nvidia-smi readings of idle H200 SXM with persistence mode "
            "on (P0) are 73-76 W. " + _MIG_SOURCE + ". " + _THROUGHPUT_NOTE
        ),
    ),
    "L4": _entry(
        "L4",
        memory_mib=23034,
        nominal_memory_gb=24,
        idle_w=16,
        peak_w=72,
        fp16_tensor_tflops=121,
        source=(
            "NVIDIA L4. memory: nvidia-smi / GFD nvidia.com/gpu.memory shows 23034 MiB (24 GB GDDR6 "
            "less ECC); "
            "peak 72 W and FP16/BF16 tensor 121 TFLOPS dense (242 with sparsity): NVIDIA L4 Tensor Core GPU "
            "datasheet; idle: estimate, nvidia-smi readings of idle L4 (P8) are 14-19 W. " + _THROUGHPUT_NOTE
        ),
    ),
    "L40S": _entry(
        "L40S",
        memory_mib=46068,
        nominal_memory_gb=48,
        idle_w=22,
        peak_w=350,
        fp16_tensor_tflops=362,
        source=(
            "NVIDIA L40S. memory: nvidia-smi 'NVIDIA L40S' shows 46068 MiB (48 GB GDDR6 less ECC); "
            "peak 350 W and FP16/BF16 tensor 362 TFLOPS dense (733 with sparsity): NVIDIA L40S GPU "
            "datasheet; "
            "idle: estimate, nvidia-smi readings of idle L40S are 20-22 W in P8 (35-72 W when held in P0). "
            + _THROUGHPUT_NOTE
        ),
    ),
}

#: Product strings that name a catalog entry: GPU Feature Discovery ``nvidia.com/gpu.product`` values (the
#: NVML product name with spaces turned into ``-``), and the NVML names older drivers gave A100 (no
#: ``NVIDIA-`` prefix).
#: Only products whose figures match the entry are listed (e.g. PCIe A100/V100 and A10G differ in power or
#: throughput, so they stay opaque). Matching is case-insensitive and tolerates spaces instead of ``-``.
ALIASES: dict[str, str] = {
    "Tesla-P100-PCIE-16GB": "P100",
    "Tesla-T4": "T4",
    "Tesla-V100-SXM2-16GB": "V100M16",
    "Tesla-V100-SXM2-32GB": "V100M32",
    "NVIDIA-A10": "A10",
    "NVIDIA-A100-SXM4-40GB": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB",
    "NVIDIA-A100-SXM4-80GB": "A100-80GB",
    "A100-SXM4-80GB": "A100-80GB",
    "NVIDIA-H100-80GB-HBM3": "H100",
    "NVIDIA-H200": "H200",
    "NVIDIA-L4": "L4",
    "NVIDIA-L40S": "L40S",
}

#: Suffix GFD appends to ``nvidia.com/gpu.product`` when the GPU is shared (time-slicing or MPS).
SHARED_SUFFIX = "-SHARED"


def _normalize(name: str) -> str:
    """GFD-style spelling: trimmed, runs of whitespace as ``-``, upper case."""
    return re.sub(r"\s+", "-", name.strip()).upper()


_LOOKUP: dict[str, str] = {_normalize(k): k for k in CATALOG} | {_normalize(a): k for a, k in ALIASES.items()}


def resolve_name(name: str) -> str | None:
    """The catalog key ``name`` stands for (a key or an alias, either with GFD's ``-SHARED``), else None."""
    if name in CATALOG:
        return name
    norm = _normalize(name)
    if norm.endswith(SHARED_SUFFIX):
        norm = norm[: -len(SHARED_SUFFIX)]
    return _LOOKUP.get(norm)


def get_model(name: str) -> GpuModel:
    """The catalog entry for ``name``, or an opaque ``known=False`` entry.

    ``name`` may be a catalog key (``"H100"``), an alias from :data:`ALIASES` (``"NVIDIA-H100-80GB-HBM3"``,
    case-insensitive, spaces allowed as in NVML's ``"NVIDIA H100 80GB HBM3"``), either with the ``-SHARED``
    suffix GFD adds under time-slicing. Anything else is opaque and keeps the name exactly as given.
    """
    key = resolve_name(name)
    if key is not None:
        return CATALOG[key]
    return GpuModel(name=name, known=False, source="not disclosed; kept as an opaque model")


def _as_model(model: GpuModel | str) -> GpuModel:
    return model if isinstance(model, GpuModel) else get_model(model)


def power_w(model: GpuModel | str, utilization: float) -> float:
    """Board power (W) at ``utilization`` (0..1): linear from ``idle_w`` at 0 to ``peak_w`` at 1.

    Raises ValueError when ``utilization`` is outside [0, 1] (or NaN). An opaque model gives 0.0,
    like its other figures: no number is invented for it.
    """
    if not 0.0 <= utilization <= 1.0:
        raise ValueError(f"utilization must be within [0, 1], got {utilization!r}")
    m = _as_model(model)
    return m.idle_w + (m.peak_w - m.idle_w) * utilization


def mig_profile(model: GpuModel | str, name: str) -> MigProfile:
    """The MIG profile ``name`` (e.g. ``"1g.10gb"``) of ``model``; KeyError if it has no such profile."""
    m = _as_model(model)
    for p in m.mig_profiles:
        if p.name == name:
            return p
    raise KeyError(f"{m.name} has no MIG profile {name!r}")


APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})
"""XIDs caused by the application, not the device (graphics engine exception, MMU fault, GPU stopped
processing, preemptive cleanup, video processor exception): NVIDIA's k8s-device-plugin keeps such a GPU
healthy, and so do we by default."""
