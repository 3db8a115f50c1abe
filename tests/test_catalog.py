"""Tests of the GPU model catalog (figures, sources, MIG profiles, aliases, power model)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from gpupool.catalog import (
    ALIASES,
    CATALOG,
    GpuModel,
    MigProfile,
    get_model,
    mig_profile,
    power_w,
    resolve_name,
)

TRACE_MODELS = ("P100", "T4", "V100M16", "V100M32", "A10")
CURRENT_MODELS = ("A100-40GB", "A100-80GB", "H100", "H200", "L4", "L40S")
OPAQUE = ("G1", "G2", "G3")

# (name, max instances) per GPU, from /work/shared/reference/k8s-gpu-conventions.md (MIG profiles).
REF_MIG = {
    "A100-40GB": [
        ("1g.5gb", 7),
        ("1g.10gb", 4),
        ("2g.10gb", 3),
        ("3g.20gb", 2),
        ("4g.20gb", 1),
        ("7g.40gb", 1),
    ],
    "A100-80GB": [
        ("1g.10gb", 7),
        ("1g.20gb", 4),
        ("2g.20gb", 3),
        ("3g.40gb", 2),
        ("4g.40gb", 1),
        ("7g.80gb", 1),
    ],
    "H100": [
        ("1g.10gb", 7),
        ("1g.20gb", 4),
        ("2g.20gb", 3),
        ("3g.40gb", 2),
        ("4g.40gb", 1),
        ("7g.80gb", 1),
    ],
    "H200": [
        ("1g.18gb", 7),
        ("1g.35gb", 4),
        ("2g.35gb", 3),
        ("3g.71gb", 2),
        ("4g.71gb", 1),
        ("7g.141gb", 1),
    ],
}


@pytest.mark.parametrize("name", TRACE_MODELS + CURRENT_MODELS)
def test_models_present_and_known(name: str) -> None:
    assert name in CATALOG
    m = get_model(name)
    assert m is CATALOG[name]
    assert m.known
    assert m.name == name


@pytest.mark.parametrize("name", OPAQUE)
def test_undisclosed_models_stay_opaque(name: str) -> None:
    assert name not in CATALOG
    m = get_model(name)
    assert not m.known
    assert m.name == name
    assert m.memory_mib == 0
    assert m.idle_w == 0 and m.peak_w == 0 and m.relative_throughput == 0
    assert m.mig_profiles == ()


def test_unknown_name_kept_verbatim() -> None:
    m = get_model("Some GPU-SHARED")
    assert not m.known and m.name == "Some GPU-SHARED"


@pytest.mark.parametrize("m", list(CATALOG.values()), ids=list(CATALOG))
def test_known_entries_are_sane(m: GpuModel) -> None:
    assert m.known
    assert m.memory_mib > 0
    assert 0 < m.idle_w < m.peak_w
    assert m.relative_throughput > 0
    assert m.source.strip()
    # memory_mib is the NVML total: at most the nominal capacity, and not far below it (ECC takes <= 1/16).
    assert m.memory_mib <= m.nominal_memory_gb * 1024
    assert m.memory_mib >= m.nominal_memory_gb * 1024 * 15 / 16 - 64
    # relative_throughput is the datasheet tensor-peak ratio to V100 SXM2.
    assert m.relative_throughput == pytest.approx(m.fp16_tensor_tflops / 125, abs=1e-3)


def test_every_source_says_which_figures_are_estimates() -> None:
    for m in CATALOG.values():
        assert "datasheet" in m.source
        assert "estimate" in m.source


def test_reference_values() -> None:
    assert get_model("V100M16").relative_throughput == 1.0
    assert get_model("V100M32").relative_throughput == 1.0
    assert get_model("T4").memory_mib == 15360
    assert get_model("A100-80GB").memory_mib == 81920
    assert get_model("V100M32").memory_mib > get_model("V100M16").memory_mib
    assert get_model("H200").memory_mib > get_model("H100").memory_mib
    assert get_model("H100").relative_throughput > get_model("A100-80GB").relative_throughput > 1


def test_mig_profiles_match_reference() -> None:
    for key, expected in REF_MIG.items():
        profiles = CATALOG[key].mig_profiles
        assert [(p.name, p.max_instances) for p in profiles] == expected, key
        for p in profiles:
            g, mem = p.name.split(".")
            assert p.compute_slices == int(g.removesuffix("g"))
            assert 1 <= p.compute_slices <= 7
            assert p.memory_mib == int(mem.removesuffix("gb")) * 1024
            assert p.memory_slices in (1, 2, 4, 8)


def test_mig_profiles_a100_80gb() -> None:
    profiles = get_model("A100-80GB").mig_profiles
    assert profiles[0] == MigProfile("1g.10gb", 7, 10 * 1024, 1, 1, usable_memory_mib=9728, sm_count=14)
    assert mig_profile("A100-80GB", "1g.10gb").max_instances == 7
    assert mig_profile("A100-80GB", "3g.40gb") == MigProfile("3g.40gb", 2, 40 * 1024, 3, 4, 40192, 42)
    assert mig_profile(get_model("A100-80GB"), "7g.80gb").compute_slices == 7
    # the same names and shapes as the H100's, but not the same device figures (dcgm-exporter #544)
    h100 = get_model("H100").mig_profiles
    assert [(p.name, p.max_instances, p.memory_slices) for p in profiles] == [
        (p.name, p.max_instances, p.memory_slices) for p in h100]
    assert mig_profile("H100", "1g.10gb").usable_memory_mib == 9984


DGX_H100 = Path(__file__).parents[1] / "examples/agent/dgx-h100.yaml"


def test_mig_usable_memory_is_what_the_device_reports() -> None:
    """Every MIG profile of the catalog carries the device's figure (below the name's); the H100's are those of
    ``nvidia-smi mig -lgip`` as the agent's DGX H100 description has them."""
    import yaml

    for m in CATALOG.values():
        for p in m.mig_profiles:
            assert 0 < p.usable_memory_mib < p.memory_mib and p.sm_count > 0, (m.name, p.name)
    listed = {p["name"]: p for p in yaml.safe_load(DGX_H100.read_text())["defaults"]["mig_profiles"]}
    for p in get_model("H100").mig_profiles:
        row = listed[p.name]
        assert (p.usable_memory_mib, p.sm_count, p.max_instances) == (
            row["memory_mib"], row["sms"], row["instances"]), p.name


def test_only_mig_capable_models_have_profiles() -> None:
    assert {k for k, m in CATALOG.items() if m.mig_profiles} == set(REF_MIG)


def test_mig_profile_missing() -> None:
    with pytest.raises(KeyError):
        mig_profile("A100-80GB", "1g.5gb")
    with pytest.raises(KeyError):
        mig_profile("T4", "1g.10gb")
    with pytest.raises(KeyError):
        mig_profile("G1", "1g.10gb")


@pytest.mark.parametrize(
    ("alias", "key"),
    [
        ("NVIDIA-A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA-A100-SXM4-40GB", "A100-40GB"),
        ("NVIDIA-H100-80GB-HBM3", "H100"),
        ("Tesla-T4", "T4"),
        ("Tesla-V100-SXM2-16GB", "V100M16"),
        ("Tesla-V100-SXM2-32GB", "V100M32"),
        ("NVIDIA-L4", "L4"),
        ("NVIDIA-A10", "A10"),
        ("NVIDIA-L40S", "L40S"),
        ("NVIDIA-H200", "H200"),
    ],
)
def test_alias_resolution(alias: str, key: str) -> None:
    assert ALIASES[alias] == key
    assert get_model(alias) is CATALOG[key]
    assert get_model(alias + "-SHARED") is CATALOG[key]
    assert resolve_name(alias) == key


def test_all_aliases_point_at_entries() -> None:
    for alias, key in ALIASES.items():
        assert key in CATALOG, alias
        assert get_model(alias).known


def test_shared_suffix_and_spellings() -> None:
    assert get_model("T4-SHARED") is CATALOG["T4"]
    assert get_model("NVIDIA H100 80GB HBM3") is CATALOG["H100"]  # NVML / dcgm-exporter modelName
    assert get_model("Tesla T4") is CATALOG["T4"]
    assert get_model("nvidia-l40s-shared") is CATALOG["L40S"]
    assert not get_model("G1-SHARED").known
    assert not get_model("NVIDIA-A10G").known  # A10G is a different product: no invented figures


@pytest.mark.parametrize("name", ["T4", "H100", "A100-80GB"])
def test_power_interpolation(name: str) -> None:
    m = get_model(name)
    assert power_w(m, 0) == pytest.approx(m.idle_w)
    assert power_w(m, 1) == pytest.approx(m.peak_w)
    assert power_w(m, 0.5) == pytest.approx((m.idle_w + m.peak_w) / 2)
    assert power_w(name, 0.25) == pytest.approx(m.idle_w + 0.25 * (m.peak_w - m.idle_w))


def test_power_values() -> None:
    t4 = get_model("T4")
    assert power_w(t4, 0.0) == 10
    assert power_w(t4, 0.5) == 40
    assert power_w(t4, 1.0) == 70


@pytest.mark.parametrize("u", [-0.01, 1.01, -1, 2, math.nan, math.inf])
def test_power_rejects_bad_utilization(u: float) -> None:
    with pytest.raises(ValueError):
        power_w("H100", u)


def test_power_of_opaque_model_is_zero() -> None:
    assert power_w("G2", 0.7) == 0.0
    with pytest.raises(ValueError):
        power_w("G2", 1.5)


H200_REFERENCE = Path(__file__).parents[1] / "../shared/reference/nvml-h200"


@pytest.mark.skipif(not (H200_REFERENCE / "nvml.json").exists(), reason="../shared/reference/nvml-h200 absent")
def test_h200_mig_profiles_match_the_real_device() -> None:
    """Names, instance counts, usable memory (NVML memorySizeMB) and SM counts of the catalog's H200 profiles
    against the recording of a real H200 (nvml.json) and its ``nvidia-smi mig -lgip`` table."""
    gpu = json.loads((H200_REFERENCE / "nvml.json").read_text())["gpus"][0]
    real = {p["name"].removeprefix("MIG "): p for p in gpu["gpu_instance_profiles"].values()}
    lgip = {}
    for line in (H200_REFERENCE / "mig-lgip.txt").read_text().splitlines():
        m = re.match(r"\|\s+\d+\s+MIG (\S+)\s+\d+\s+\d+/(\d+)\s+([\d.]+)\s+\w+\s+(\d+)", line)
        if m:
            lgip[m.group(1)] = (int(m.group(2)), round(float(m.group(3)) * 1024), int(m.group(4)))
    profiles = get_model("H200").mig_profiles
    assert {p.name for p in profiles} == set(real) - {"1g.18gb+me"}
    for p in profiles:
        r = real[p.name]
        assert (p.max_instances, p.usable_memory_mib, p.sm_count, p.compute_slices) == (
            r["instanceCount"], r["memorySizeMB"], r["multiprocessorCount"], r["sliceCount"]), p.name
        assert lgip[p.name] == (p.max_instances, p.usable_memory_mib, p.sm_count), p.name
        assert p.usable_memory_mib < p.memory_mib  # usable is below the nominal size in the name
    assert mig_profile("H200", "1g.18gb").usable_memory_mib == 16384


def test_h200_usable_mig_memory_below_nominal() -> None:
    for p in get_model("H200").mig_profiles:
        assert 0 < p.usable_memory_mib < p.memory_mib and p.sm_count > 0
    assert [p.sm_count for p in get_model("H200").mig_profiles] == [16, 26, 32, 60, 64, 132]
    assert [p.usable_memory_mib for p in get_model("A100-80GB").mig_profiles] == [
        9728, 19968, 19968, 40192, 40192, 81152]
