"""gpupool.k8s.objects.dra_nvidia: slices and classes as NVIDIA's DRA driver for GPUs publishes them.

The expected spellings are the driver's (kubernetes-sigs/dra-driver-nvidia-gpu, cmd/gpu-kubelet-plugin/
deviceinfo.go, mig.go, partitions.go, driver.go, consumable_shares.go; the Helm chart's deviceclass-*.yaml); the
H200's figures are the real GPU's (tests/data/agent/nvml-h200.json, a copy of shared/reference/nvml-h200).
That the real kube-apiserver accepts them is tests/e2e/test_dra_nvidia_e2e.py's part.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from gpupool.k8s.objects import dra_nvidia as nv
from gpupool.k8s.objects.dra import DraParseError, SemVer, parse_device_class, parse_slice

ROOT = Path(__file__).parents[1]
NVML = json.loads((ROOT / "tests/data/agent/nvml-h200.json").read_text())["gpus"][0]
LGIP = ROOT / "../shared/reference/nvml-h200/mig-lgip.txt"


def devices_of(slices: list[dict]) -> dict[str, dict]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def test_h200_model_is_the_reference_gpu() -> None:
    m = nv.MODELS["NVIDIA H200"]
    assert m.product_name == NVML["name"] and m.memory_bytes == NVML["memory"]["total"]
    assert m.compute_capability == "{}.{}".format(*NVML["cuda_cc"])
    by_id = {p["id"]: p for p in NVML["gpu_instance_profiles"].values()}
    assert {p.profile_id for p in m.mig_profiles} == set(by_id)
    for p in m.mig_profiles:
        ref = by_id[p.profile_id]
        assert (p.memory_mib, p.multiprocessors, p.copy_engines, p.decoders, p.encoders, p.jpeg_engines,
                p.ofa_engines) == (ref["memorySizeMB"], ref["multiprocessorCount"], ref["copyEngineCount"],
                                   ref["decoderCount"], ref["encoderCount"], ref["jpegCount"], ref["ofaCount"])
        assert "MIG " + nv.mig_profile_name(p, m.memory_bytes) == ref["name"]


@pytest.mark.skipif(not LGIP.exists(), reason="../shared/reference/nvml-h200 absent")
def test_h200_profile_names_as_nvidia_smi_lists_them() -> None:
    listed = dict((int(i), n) for n, i in re.findall(r"MIG (\S+)\s+(\d+)\s+\d+/\d+", LGIP.read_text()))
    m = nv.MODELS["NVIDIA H200"]
    assert {p.profile_id: nv.mig_profile_name(p, m.memory_bytes) for p in m.mig_profiles} == listed


@pytest.mark.parametrize(("product", "names"), [
    ("NVIDIA H100 80GB HBM3", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
    ("NVIDIA A100-SXM4-40GB", ["1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]),
    ("NVIDIA A100-SXM4-80GB", ["1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]),
])
def test_profile_names_follow_go_nvlib(product: str, names: list[str]) -> None:
    m = nv.MODELS[product]
    assert [nv.mig_profile_name(p, m.memory_bytes) for p in m.mig_profiles] == names


def test_h200_node_split_layout_counters_and_device_names() -> None:
    slices = nv.preset_slices("dgx-h200", "node-a")
    assert len(slices) == 9  # counters first, then one slice per GPU (driver.go generateSplitResourceSlices)
    assert all(s["spec"]["pool"] == {"name": "node-a", "generation": 1, "resourceSliceCount": 9} for s in slices)
    assert [s["metadata"]["name"][:-5] for s in slices[:2]] == ["00000-gpu.nvidia.com-node-a-",
                                                                "00001-gpu.nvidia.com-node-a-"]
    first = slices[0]["spec"]
    assert "devices" not in first and [c["name"] for c in first["sharedCounters"]] == [
        f"gpu-{i}-counter-set" for i in range(8)]
    counters = first["sharedCounters"][0]["counters"]
    assert set(counters) == {"multiprocessors", "copy-engines", "decoders", "encoders", "jpeg-engines",
                             "ofa-engines", "memory", *(f"memory-slice-{i}" for i in range(8))}
    assert counters["memory"] == {"value": "140Gi"} and counters["multiprocessors"] == {"value": "132"}
    names = [d["name"] for d in slices[1]["spec"]["devices"]]
    assert names == sorted(names) and names[0] == "gpu-0" and len(names) == 1 + 7 + 7 + 4 + 3 + 2 + 1 + 1
    assert "gpu-0-mig-1g18gb-me-20-6" in names and "gpu-0-mig-3g71gb-9-4" in names and "gpu-0-mig-7g141gb-0-0" in names
    devs = devices_of(slices)
    gpu = devs["gpu-3"]
    assert {k: v for k, v in gpu["attributes"].items() if k != "uuid"} == {
        "type": {"string": "gpu"}, "productName": {"string": "NVIDIA H200"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.159.4"}, "cudaDriverVersion": {"version": "13.0.0"},
        "resource.kubernetes.io/pciBusID": {"string": "0000:61:00.0"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:48"}, "resource.kubernetes.io/numaNode": {"int": 0}}
    assert "index" not in gpu["attributes"]
    assert gpu["consumesCounters"][0]["counters"] == slices[0]["spec"]["sharedCounters"][3]["counters"]
    mig = devs["gpu-3-mig-2g35gb-14-4"]
    assert mig["attributes"]["type"] == {"string": "mig"} and mig["attributes"]["profile"] == {"string": "2g.35gb"}
    assert mig["attributes"]["parentUUID"] == gpu["attributes"]["uuid"] and "uuid" not in mig["attributes"]
    assert mig["capacity"]["memory"] == {"value": "33280Mi"} and mig["capacity"]["copyEngines"] == {"value": "2"}
    assert mig["consumesCounters"] == [{"counterSet": "gpu-3-counter-set", "counters": {
        "multiprocessors": {"value": "32"}, "copy-engines": {"value": "2"}, "decoders": {"value": "2"},
        "encoders": {"value": "0"}, "jpeg-engines": {"value": "2"}, "ofa-engines": {"value": "0"},
        "memory": {"value": "33280Mi"}, "memory-slice-4": {"value": "1"}, "memory-slice-5": {"value": "1"}}}]


def test_ampere_with_mig_mode_on_publishes_partitions_only() -> None:
    on = devices_of(nv.preset_slices("a100-80gb", "a"))
    off = devices_of(nv.preset_slices("a100-80gb", "a", mig_enabled=False))
    assert "gpu-0" not in on and "gpu-0-mig-7g80gb-0-0" in on
    assert "gpu-0" in off and set(off) - set(on) == {f"gpu-{i}" for i in range(8)}
    assert nv.preset_slices("dgx-h100", "h")[1]["spec"]["devices"][0]["name"] == "gpu-0"  # Hopper: both


def test_without_dynamic_mig_one_slice_of_full_gpus() -> None:
    for slices in (nv.preset_slices("l40s", "l"), nv.nvidia_slices("h", 4, "NVIDIA H200", mig_profiles=False)):
        assert len(slices) == 1 and "sharedCounters" not in slices[0]["spec"]
        devs = slices[0]["spec"]["devices"]
        assert all(set(d) == {"name", "attributes", "capacity"} and set(d["capacity"]) == {"memory"} for d in devs)
    assert nv.nvidia_slices("h", 4, "NVIDIA H200", mig_profiles=False)[0]["spec"]["devices"][0]["capacity"] == {
        "memory": {"value": "143771Mi"}}  # nvml.json memory.total, exactly
    assert nv.preset_slices("l40s", "l")[0]["spec"]["devices"][0]["attributes"]["architecture"] == {
        "string": "Ada Lovelace"}


@pytest.mark.parametrize(("mode", "default", "minimum", "shares"), [
    ("memory", "46068Mi", "1Mi", None), ("unlimited", "0", "0", None), ("4", "0", "0", "4")])
def test_consumable_shares(mode: str, default: str, minimum: str, shares: str | None) -> None:
    dev = nv.preset_slices("l40s", "l", consumable_shares=mode)[0]["spec"]["devices"][0]
    assert dev["allowMultipleAllocations"] is True
    assert dev["capacity"]["memory"] == {"value": "46068Mi", "requestPolicy": {
        "default": default, "validRange": {"min": minimum, "max": "46068Mi", "step": "1Mi"}}}
    if shares:
        assert dev["capacity"]["shares"]["value"] == shares
    else:
        assert "shares" not in dev["capacity"]
    parsed = parse_slice(nv.preset_slices("l40s", "l", consumable_shares=mode)[0]).devices[0]
    assert parsed.allow_multiple and parsed.capacity_policy["gpu.nvidia.com/memory"].step == Decimal(1 << 20)


def test_every_preset_parses_with_gpupool_records() -> None:
    for preset in nv.PRESETS:
        slices = nv.preset_slices(preset, f"n-{preset}", generation=3)
        parsed = [parse_slice(s) for s in slices]
        assert all(p.generation == 3 and p.slice_count == len(slices) and p.node == f"n-{preset}" for p in parsed)
        devs = [d for p in parsed for d in p.devices]
        assert len({d.name for d in devs}) == len(devs) and all(d.driver == "gpu.nvidia.com" for d in devs)
        sets = {c.name: c.counters for p in parsed for c in p.counter_sets}
        for d in devs:
            assert isinstance(d.attributes["gpu.nvidia.com"]["driverVersion"], SemVer)
            assert d.attribute("resource.kubernetes.io/pciBusID")
            for set_name, used in d.consumes:  # every consumed counter exists and fits in its set
                assert all(used[k] <= sets[set_name][k] for k in used), (preset, d.name)
        if preset == "dgx-h200":
            d = next(d for d in devs if d.name == "gpu-0-mig-1g18gb-19-0")
            assert d.capacity_of("memory") == Decimal(16384 << 20) and d.attribute("profile") == "1g.18gb"


def test_device_classes_as_the_chart_renders_them() -> None:
    classes = {c["metadata"]["name"]: c for c in nv.nvidia_device_classes()}
    assert list(classes) == ["gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com",
                             "compute-domain-daemon.nvidia.com", "compute-domain-default-channel.nvidia.com"]
    gpu = parse_device_class(classes["gpu.nvidia.com"])
    assert gpu.extended_resource_name == "nvidia.com/gpu" and gpu.selectors == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",)
    assert parse_device_class(classes["mig.nvidia.com"]).extended_resource_name is None
    assert [c["metadata"]["name"] for c in nv.nvidia_device_classes(compute_domains=False)] == [
        "gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com"]


def test_deterministic_and_generation_renames() -> None:
    assert nv.preset_slices("dgx-h100", "x") == nv.preset_slices("dgx-h100", "x")
    a, b = nv.preset_slices("dgx-h100", "x"), nv.preset_slices("dgx-h100", "x", generation=2)
    assert a[0]["metadata"]["name"] != b[0]["metadata"]["name"]
    assert devices_of(a)["gpu-0"]["attributes"]["uuid"] != devices_of(nv.preset_slices("dgx-h100", "y"))[
        "gpu-0"]["attributes"]["uuid"]
    owned = nv.preset_slices("l40s", "x", node_uid="u-1")[0]["metadata"]["ownerReferences"]
    assert owned == [{"apiVersion": "v1", "kind": "Node", "name": "x", "uid": "u-1", "controller": True}]


def test_helpers_and_errors() -> None:
    assert nv.semver("580.159.04") == "580.159.4" and nv.semver("13.0") == "13.0.0" and nv.semver("9") == "9.0.0"
    assert [nv.quantity(v) for v in (0, 16, 1024, 150_754_820_096, 140 << 30)] == ["0", "16", "1Ki", "143771Mi",
                                                                                  "140Gi"]
    with pytest.raises(ValueError, match="not major"):
        nv.semver("r580")
    with pytest.raises(ValueError, match="unknown"):
        nv.nvidia_slices("n", 8, "NVIDIA B300")
    with pytest.raises(ValueError, match="at least 1"):
        nv.nvidia_slices("n", 0)
    with pytest.raises(ValueError, match="consumable_shares"):
        nv.preset_slices("l40s", "n", consumable_shares="-2")
    broken = nv.preset_slices("l40s", "n")[0]
    broken["spec"]["devices"][0]["attributes"]["driverVersion"] = {}
    with pytest.raises(DraParseError, match="ResourceSlice .*driverVersion: no value"):
        parse_slice(broken)
