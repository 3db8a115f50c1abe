"""The GPU part of a pod's request in every spelling gpupool reads (KAI, HAMi, Volcano, Alibaba, MIG, whole
GPUs) and GPU model / type selection. Imports :mod:`gpupool.k8s.objects.fields`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from gpupool.catalog import resolve_name
from gpupool.k8s import (
    ANN_ALIBABA_GPU_COUNT,
    ANN_ALIBABA_GPU_MILLI,
    ANN_GPU_MODEL,
    ANN_HAMI_NOUSE_GPUTYPE,
    ANN_HAMI_USE_GPUTYPE,
    ANN_KAI_FRACTION,
    ANN_KAI_MEMORY,
    ANN_KAI_NUM_DEVICES,
    RES_GPU,
    RES_HAMI_GPUCORES,
    RES_HAMI_GPUMEM,
    RES_HAMI_GPUMEM_PERCENT,
    RES_MIG_PREFIX,
    RES_VOLCANO_VGPU_CORES,
    RES_VOLCANO_VGPU_MEMORY,
    RES_VOLCANO_VGPU_NUMBER,
)
from gpupool.k8s.objects.fields import (
    MIG_PROFILE,
    RequestParseError,
    annotations_of,
    container_requests,
    expect_list,
    expect_mapping,
    int_annotation,
    memory_mib,
    number,
    pod_resources,
    whole,
)
from gpupool.model import MILLI


# ------------------------------------------------------------------ GPU spellings
@dataclass(frozen=True, slots=True)
class GpuAsk:
    num_gpu: int = 0
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    spelling: str = ""


def _hami_container(res: Mapping[str, Decimal], count_key: str, mem_key: str, pct_key: str | None,
                    cores_key: str, spelling: str, where: str = "") -> GpuAsk:
    """One container's vGPU ask (HAMi / Volcano): ``count_key`` cards, each with the share from the cores
    (else memory) percentage and ``mem_key`` MiB of memory. ``where`` prefixes field names in errors."""
    prefix = f"{where}." if where else ""
    if count_key not in res:
        extra = [k for k in (mem_key, pct_key, cores_key) if k and k in res]
        raise RequestParseError(f'{prefix}resources["{extra[0]}"] given without resources["{count_key}"]')
    n = whole(res[count_key], f'{prefix}resources["{count_key}"]', minimum=1)
    cores = whole(res[cores_key], f'{prefix}resources["{cores_key}"]') if cores_key in res else 0
    pct = whole(res[pct_key], f'{prefix}resources["{pct_key}"]') if pct_key and pct_key in res else 0
    mem = whole(res[mem_key], f'{prefix}resources["{mem_key}"]') if mem_key in res else 0
    for key, value in ((cores_key, cores), (pct_key, pct)):
        if key and key in res and not 1 <= value <= 100:
            raise RequestParseError(f'{prefix}resources["{key}"]={value}: must be a percentage in 1..100')
    if mem_key in res and mem <= 0:
        raise RequestParseError(f'{prefix}resources["{mem_key}"]: must be a positive amount of MiB')
    if cores:
        milli = max(cores, pct) * 10  # with both, the larger: memory in proportion covers the percentage
    elif pct:
        milli = pct * 10  # memory in proportion to the share
    elif mem:
        milli = 1  # memory is the constraint
    else:
        milli = MILLI  # a vGPU without limits takes all of the GPU's memory: a whole GPU
    return GpuAsk(n, milli, mem, (), spelling)


def _gpu_containers(pod: Mapping[str, Any]) -> list[tuple[str, dict[str, Decimal], bool]]:
    """(field path, resources, runs beside the app) of every container and init container; sidecar init
    containers (``restartPolicy: Always``) run beside the app containers, other init containers before them."""
    spec = expect_mapping(pod.get("spec"), "spec")
    out: list[tuple[str, dict[str, Decimal], bool]] = []
    for kind in ("containers", "initContainers"):
        for i, c in enumerate(expect_list(spec.get(kind), f"spec.{kind}")):
            where = f"spec.{kind}[{i}]"
            concurrent = kind == "containers" or c.get("restartPolicy") == "Always"
            out.append((where, container_requests(c, where), concurrent))
    return out


def _hami_like(pod: Mapping[str, Any], count_key: str, mem_key: str, pct_key: str | None,
               cores_key: str, spelling: str) -> GpuAsk:
    """A vGPU pod (HAMi / Volcano), read per container as HAMi allocates: each container asking
    ``count_key: N`` gets N cards of its own with its ``mem_key`` MiB and cores share on each.

    gpupool books one share per card for the whole pod: the containers' cards add up (distinct cards,
    never one container's memory doubled onto a card), each card booked with the largest share and the
    largest memory any container asks per card (exact when the containers ask the same per card, an
    over-estimate otherwise). Init containers run before the app containers, so they count as the larger of
    their own ask and the app containers' total. Raises :class:`RequestParseError` when one container gives
    a memory amount and another a share of memory in proportion (no single per-card booking holds both),
    naming both containers.
    """
    asks: list[tuple[str, GpuAsk, bool]] = []
    keys = {k for k in (count_key, mem_key, pct_key, cores_key) if k}
    for where, res, concurrent in _gpu_containers(pod):
        if keys & res.keys():
            asks.append((where, _hami_container(res, count_key, mem_key, pct_key, cores_key, spelling, where),
                         concurrent))
    if not asks:
        return GpuAsk(spelling=spelling)
    beside = sum(a.num_gpu for _, a, concurrent in asks if concurrent)
    before = max((a.num_gpu for _, a, concurrent in asks if not concurrent), default=0)
    milli = max(a.gpu_milli for _, a, _ in asks)
    sized = [(w, a) for w, a, _ in asks if a.gpu_memory_mib]
    proportional = [(w, a) for w, a, _ in asks if not a.gpu_memory_mib and a.gpu_milli < MILLI]
    if sized and proportional:
        raise RequestParseError(
            f'{sized[0][0]} asks {sized[0][1].gpu_memory_mib} MiB of GPU memory per card but {proportional[0][0]} '
            f"a share of the GPU's memory in proportion ({proportional[0][1].gpu_milli} milli): gpupool books one "
            "share per card for the pod; give every GPU container the same kind of memory limit"
        )
    mem = max((a.gpu_memory_mib for _, a in sized), default=0)
    return GpuAsk(max(beside, before), milli, mem, (), spelling)


def _kai(ann: Mapping[str, str], res: Mapping[str, Decimal]) -> GpuAsk:
    if RES_GPU in res:
        raise RequestParseError(
            f'annotation {ANN_KAI_FRACTION if ANN_KAI_FRACTION in ann else ANN_KAI_MEMORY} together with '
            f'resources["{RES_GPU}"]: a fractional (KAI) pod must not also ask for whole GPUs'
        )
    if ANN_KAI_FRACTION in ann and ANN_KAI_MEMORY in ann:
        raise RequestParseError(f"annotations {ANN_KAI_FRACTION} and {ANN_KAI_MEMORY} are both set: give one")
    n = 1
    if ANN_KAI_NUM_DEVICES in ann:
        n = int_annotation(ann[ANN_KAI_NUM_DEVICES], f'annotation {ANN_KAI_NUM_DEVICES}="{ann[ANN_KAI_NUM_DEVICES]}"',
                            1)
    if ANN_KAI_FRACTION in ann:
        raw = ann[ANN_KAI_FRACTION]
        where = f'annotation {ANN_KAI_FRACTION}="{raw}"'
        f = number(raw, f"{where}: must be a number in (0, 1]")
        if not 0 < f <= 1:
            raise RequestParseError(f"{where}: must be a number in (0, 1]")
        milli = max(1, min(MILLI, round(f * MILLI)))
        return GpuAsk(n, milli, 0, (), "kai gpu-fraction")  # n distinct GPUs, that fraction of each
    raw = ann[ANN_KAI_MEMORY]
    mem = memory_mib(raw, f'annotation {ANN_KAI_MEMORY}="{raw}"')
    return GpuAsk(n, 1, mem, (), "kai gpu-memory")  # n distinct GPUs, that much memory on each


def _alibaba(ann: Mapping[str, str]) -> GpuAsk:
    milli = MILLI
    n = 1
    if ANN_ALIBABA_GPU_MILLI in ann:
        raw = ann[ANN_ALIBABA_GPU_MILLI]
        milli = int_annotation(raw, f'annotation {ANN_ALIBABA_GPU_MILLI}="{raw}"', 1, MILLI)
    if ANN_ALIBABA_GPU_COUNT in ann:
        raw = ann[ANN_ALIBABA_GPU_COUNT]
        n = int_annotation(raw, f'annotation {ANN_ALIBABA_GPU_COUNT}="{raw}"', 0)
    if n == 0:
        return GpuAsk(spelling="alibaba")
    return GpuAsk(n, milli, 0, (), "alibaba")  # n distinct GPUs, that share of each


def _mig(res: Mapping[str, Decimal]) -> GpuAsk:
    mig: list[tuple[str, int]] = []
    for name, value in sorted(res.items()):
        if not name.startswith(RES_MIG_PREFIX):
            continue
        profile = name[len(RES_MIG_PREFIX):]
        if not MIG_PROFILE.fullmatch(profile):
            raise RequestParseError(f'resources["{name}"]: "{profile}" is not a MIG profile like 1g.10gb')
        count = whole(value, f'resources["{name}"]')
        if count:
            mig.append((profile, count))
    return GpuAsk(0, 0, 0, tuple(mig), "mig")


def gpu_ask(pod: Mapping[str, Any], res: Mapping[str, Decimal] | None = None) -> GpuAsk:
    """The GPU part of a pod's request, from whichever spelling it uses (:class:`RequestParseError` if two
    spellings disagree or one is malformed)."""
    if res is None:
        res = pod_resources(pod)
    ann = annotations_of(pod)
    spellings = []
    if any(k.startswith(RES_MIG_PREFIX) for k in res):
        spellings.append("mig")
    if ANN_KAI_FRACTION in ann or ANN_KAI_MEMORY in ann:
        spellings.append("kai")
    if any(k in res for k in (RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES)):
        spellings.append("hami")
    if any(k in res for k in (RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, RES_VOLCANO_VGPU_CORES)):
        spellings.append("volcano")
    if ANN_ALIBABA_GPU_MILLI in ann or ANN_ALIBABA_GPU_COUNT in ann:
        spellings.append("alibaba")
    names = {
        "mig": "nvidia.com/mig-* resources",
        "kai": f"annotation {ANN_KAI_FRACTION}/{ANN_KAI_MEMORY} (KAI)",
        "hami": "nvidia.com/gpumem/gpucores resources (HAMi)",
        "volcano": "volcano.sh/vgpu-* resources (Volcano)",
        "alibaba": "alibabacloud.com/gpu-* annotations",
    }
    if len(spellings) > 1:
        raise RequestParseError(
            "conflicting GPU requests: " + " and ".join(names[s] for s in spellings) + "; use one spelling"
        )
    kind = spellings[0] if spellings else ""
    if kind == "mig":
        if RES_GPU in res and whole(res[RES_GPU], f'resources["{RES_GPU}"]'):
            raise RequestParseError(
                f'resources["{RES_GPU}"] together with nvidia.com/mig-* resources: ask for one or the other'
            )
        return _mig(res)
    if kind == "kai":
        return _kai(ann, res)
    if kind == "hami":
        return _hami_like(pod, RES_GPU, RES_HAMI_GPUMEM, RES_HAMI_GPUMEM_PERCENT, RES_HAMI_GPUCORES, "hami")
    if kind == "volcano":
        if RES_GPU in res and whole(res[RES_GPU], f'resources["{RES_GPU}"]'):
            raise RequestParseError(
                f'conflicting GPU requests: volcano.sh/vgpu-* resources (Volcano) and resources["{RES_GPU}"]; '
                "use one spelling"
            )
        return _hami_like(pod, RES_VOLCANO_VGPU_NUMBER, RES_VOLCANO_VGPU_MEMORY, None, RES_VOLCANO_VGPU_CORES,
                          "volcano")
    if kind == "alibaba":
        if RES_GPU in res:
            raise RequestParseError(
                f'alibabacloud.com/gpu-* annotations together with resources["{RES_GPU}"]: use one spelling'
            )
        return _alibaba(ann)
    if RES_GPU in res:
        n = whole(res[RES_GPU], f'resources["{RES_GPU}"]')
        return GpuAsk(n, MILLI if n else 0, 0, (), "nvidia.com/gpu")
    return GpuAsk()


def gpu_spec_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """Allowed GPU models from ``gpupool.io/gpu-model`` (catalog keys where known, else as written)."""
    raw = annotations_of(pod).get(ANN_GPU_MODEL)
    if raw is None:
        return ()
    names = [x.strip() for x in str(raw).split(",") if x.strip()]
    if not names:
        raise RequestParseError(f'annotation {ANN_GPU_MODEL}="{raw}": no GPU model named')
    return tuple(resolve_name(n) or n for n in names)


def gpu_types_of(pod: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(include, exclude): GPU type selection from HAMi's (and Volcano vGPU's) ``nvidia.com/use-gputype`` and
    ``nvidia.com/nouse-gputype`` annotations, comma-separated substrings matched case-insensitively against
    the GPU model and product name (``"A100"`` selects ``NVIDIA-A100-SXM4-80GB``). A blank value selects
    nothing, as in HAMi (every type contains the empty string)."""
    ann = annotations_of(pod)
    out: list[tuple[str, ...]] = []
    for key in (ANN_HAMI_USE_GPUTYPE, ANN_HAMI_NOUSE_GPUTYPE):
        raw = ann.get(key)
        out.append(tuple(x.strip() for x in str(raw).split(",") if x.strip()) if raw is not None else ())
    return out[0], out[1]
