"""Discovery: NVLink domains, every GFD label on the recorded H200 and the DGX H100 demo, the inventory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool.agent.backend import GpuDevice
from gpupool.agent.discovery import discover, gfd_labels, inventory_doc, mig_resource, nvlink_cliques, sanitise
from gpupool.agent.fake import FakeBackend
from gpupool.agent.report import GpuHealth, inventory_json, read_inventory

ROOT = Path(__file__).parents[1]
REFERENCE = ROOT / "../shared/reference/nvml-h200/nvml.json"
RECORDING = REFERENCE if REFERENCE.exists() else ROOT / "tests/data/agent/nvml-h200.json"
DGX = ROOT / "examples/agent/dgx-h100.yaml"
NOW = 1_790_000_000.0  # 2026-09-21T14:13:20Z

VERSIONS_H200 = {
    "nvidia.com/cuda.driver.major": "580", "nvidia.com/cuda.driver.minor": "159", "nvidia.com/cuda.driver.rev": "04",
    "nvidia.com/cuda.driver-version.major": "580", "nvidia.com/cuda.driver-version.minor": "159",
    "nvidia.com/cuda.driver-version.revision": "04", "nvidia.com/cuda.driver-version.full": "580.159.04",
    "nvidia.com/cuda.runtime.major": "13", "nvidia.com/cuda.runtime.minor": "0",
    "nvidia.com/cuda.runtime-version.major": "13", "nvidia.com/cuda.runtime-version.minor": "0",
    "nvidia.com/cuda.runtime-version.full": "13.0",
}


@pytest.fixture
def h200():
    return discover(FakeBackend.from_nvml_recording(RECORDING))


@pytest.fixture
def dgx():
    return discover(FakeBackend.from_file(DGX))


def test_sanitise_and_mig_resource_as_gfd():
    assert sanitise("NVIDIA H200") == "NVIDIA-H200"
    assert sanitise("NVIDIA  A100-SXM4-40GB ") == "NVIDIA-A100-SXM4-40GB"
    assert sanitise("Tesla (R) V100/x") == "Tesla-R-V100x"
    assert mig_resource("1g.18gb+me") == "1g.18gb.me"


def test_h200_labels_exactly(h200):
    labels = gfd_labels(h200)
    assert labels == VERSIONS_H200 | {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mig.strategy": "mixed",
    }
    assert "nvidia.com/gpu.clique" not in labels  # one GPU, no NVLink domain
    none = gfd_labels(h200, "none")
    assert "nvidia.com/mig.strategy" not in none  # GFD sets no strategy label for none
    assert gfd_labels(h200, "single")["nvidia.com/mig.strategy"] == "single"
    assert gfd_labels(h200, "single")["nvidia.com/gpu.product"] == "NVIDIA-H200"  # no MIG-enabled GPU
    assert gfd_labels(h200, machine="PowerEdge XE9680")["nvidia.com/gpu.machine"] == "PowerEdge-XE9680"
    with pytest.raises(ValueError):
        gfd_labels(h200, "some")


def test_h200_in_mig_mode_labels():
    fake = FakeBackend.from_nvml_recording(RECORDING)
    fake.set_mig(0, True, [{"profile": "1g.18gb+me", "start": 0}, {"profile": "1g.18gb", "start": 1},
                           {"profile": "1g.18gb", "start": 2}, {"profile": "3g.71gb", "start": 4, "size": 4}])
    labels = gfd_labels(discover(fake))
    assert labels["nvidia.com/gpu.replicas"] == "0"  # every H200 in MIG mode: GFD's labeller without sharing
    assert labels["nvidia.com/gpu.count"] == "1"
    assert {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-")} == {
        "nvidia.com/mig-1g.18gb.count": "2", "nvidia.com/mig-1g.18gb.product": "NVIDIA-H200-MIG-1g.18gb",
        "nvidia.com/mig-1g.18gb.replicas": "1", "nvidia.com/mig-1g.18gb.sharing-strategy": "none",
        "nvidia.com/mig-1g.18gb.memory": "16384", "nvidia.com/mig-1g.18gb.multiprocessors": "16",
        "nvidia.com/mig-1g.18gb.slices.gi": "1", "nvidia.com/mig-1g.18gb.slices.ci": "1",
        "nvidia.com/mig-1g.18gb.me.count": "1", "nvidia.com/mig-1g.18gb.me.product": "NVIDIA-H200-MIG-1g.18gb.me",
        "nvidia.com/mig-1g.18gb.me.replicas": "1", "nvidia.com/mig-1g.18gb.me.sharing-strategy": "none",
        "nvidia.com/mig-1g.18gb.me.memory": "16384", "nvidia.com/mig-1g.18gb.me.multiprocessors": "16",
        "nvidia.com/mig-1g.18gb.me.slices.gi": "1", "nvidia.com/mig-1g.18gb.me.slices.ci": "1",
        "nvidia.com/mig-3g.71gb.count": "1", "nvidia.com/mig-3g.71gb.product": "NVIDIA-H200-MIG-3g.71gb",
        "nvidia.com/mig-3g.71gb.replicas": "1", "nvidia.com/mig-3g.71gb.sharing-strategy": "none",
        "nvidia.com/mig-3g.71gb.memory": "71424", "nvidia.com/mig-3g.71gb.multiprocessors": "60",
        "nvidia.com/mig-3g.71gb.slices.gi": "3", "nvidia.com/mig-3g.71gb.slices.ci": "3",
    }
    # single: more than one profile -> GFD's invalid set
    single = gfd_labels(discover(fake), "single")
    assert (single["nvidia.com/gpu.product"], single["nvidia.com/gpu.count"], single["nvidia.com/gpu.memory"],
            single["nvidia.com/gpu.replicas"], single["nvidia.com/gpu.sharing-strategy"]) == (
        "NVIDIA-H200-MIG-INVALID", "0", "0", "0", "")
    # single with one profile everywhere
    fake.set_mig(0, True, [{"profile": "3g.71gb", "start": 0, "size": 4}, {"profile": "3g.71gb", "start": 4}])
    single = gfd_labels(discover(fake), "single")
    assert {k: single[k] for k in single if k.startswith("nvidia.com/gpu.") and "present" not in k} == {
        "nvidia.com/gpu.product": "NVIDIA-H200-MIG-3g.71gb", "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none", "nvidia.com/gpu.memory": "71424",
        "nvidia.com/gpu.multiprocessors": "60", "nvidia.com/gpu.slices.gi": "3", "nvidia.com/gpu.slices.ci": "3",
        "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
    }
    # single with a MIG-enabled GPU that has no MIG device: invalid
    fake.set_mig(0, True, [])
    assert gfd_labels(discover(fake), "single")["nvidia.com/gpu.product"] == "NVIDIA-H200-MIG-INVALID"


def test_dgx_labels(dgx):
    labels = gfd_labels(dgx)
    assert dgx.cliques and len(dgx.cliques) == 1 and dgx.cliques[0].indices == tuple(range(8))
    assert labels["nvidia.com/gpu.clique"] == dgx.cliques[0].id
    assert labels["nvidia.com/gpu.clique"].startswith("nvl-") and len(labels["nvidia.com/gpu.clique"]) == 16
    assert {k: labels[k] for k in labels if k.startswith("nvidia.com/gpu.") and k != "nvidia.com/gpu.clique"} == {
        "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8", "nvidia.com/gpu.replicas": "1", "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0",
    }
    assert labels["nvidia.com/cuda.driver-version.full"] == "570.124.06"
    assert labels["nvidia.com/cuda.driver.rev"] == "06"
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.8"
    assert labels["nvidia.com/mig.capable"] == "true"
    counts = {k: v for k, v in labels.items() if k.startswith("nvidia.com/mig-") and k.endswith(".count")}
    assert counts == {"nvidia.com/mig-3g.40gb.count": "1", "nvidia.com/mig-2g.20gb.count": "1",
                      "nvidia.com/mig-1g.10gb.count": "1"}
    assert labels["nvidia.com/mig-3g.40gb.product"] == "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"
    assert labels["nvidia.com/mig-3g.40gb.memory"] == "40448"
    assert labels["nvidia.com/mig-3g.40gb.slices.gi"] == "3"
    # single strategy on a node where only one GPU is in MIG mode: GFD's invalid set
    assert gfd_labels(dgx, "single")["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3-MIG-INVALID"
    assert all(k.startswith("nvidia.com/") for k in labels)
    assert all(isinstance(v, str) and len(v) <= 63 for v in labels.values())


def test_cliques_from_topology_and_peers():
    devs = [GpuDevice(index=i, uuid=f"GPU-{i}", name="G", memory_mib=1, pci_bus_id=f"0:{i}") for i in range(5)]
    topo = {(0, 1): "NVLINK", (1, 2): "NVLINK", (3, 4): "SYSTEM"}
    cliques = nvlink_cliques(devs, topo)
    assert [c.indices for c in cliques] == [(0, 1, 2)]
    devs[3] = GpuDevice(index=3, uuid="GPU-3", name="G", memory_mib=1, pci_bus_id="0:3", nvlink_peers=("0:4",))
    cliques = nvlink_cliques(devs, topo)
    assert [c.indices for c in cliques] == [(0, 1, 2), (3, 4)]
    assert cliques[0].id != cliques[1].id
    assert nvlink_cliques(list(reversed(devs)), topo) == cliques  # order-independent ids


def test_two_nvlink_domains_give_no_clique_label():
    fake = FakeBackend.from_dict({"gpus": [{"count": 4}], "nvlink": [[0, 1], [2, 3]]})
    d = discover(fake)
    assert len(d.cliques) == 2
    assert "nvidia.com/gpu.clique" not in gfd_labels(d)
    assert d.clique_of(d.devices[0].uuid) == d.clique_of(d.devices[1].uuid) != d.clique_of(d.devices[2].uuid)


def test_no_gpus_no_labels():
    assert gfd_labels(discover(FakeBackend.from_dict({"gpus": []}))) == {}


def test_inventory_h200(h200):
    doc = inventory_doc(h200, {}, NOW)
    assert doc == {
        "version": 1, "driver": "580.159.04", "cudaDriver": "13.0", "time": "2026-09-21T14:13:20Z",
        "gpus": [{"index": 0, "uuid": "GPU-00000000-1111-2222-3333-444444444444", "minor": 0,
                  "product": "NVIDIA H200", "memoryMiB": 143771, "compute": "9.0", "pciBusId": "00000000:00:06.0",
                  "numaNode": None, "mig": {"enabled": False, "instances": []}, "nvlinkDomain": None,
                  "healthy": True, "reason": ""}]}
    raw = inventory_json(doc)
    assert read_inventory({"gpupool.io/gpu-inventory": raw}) == doc
    assert inventory_json(inventory_doc(h200, {}, NOW)) == raw  # stable string: no needless patch


def test_inventory_dgx_with_health(dgx):
    bad = dgx.devices[3].uuid
    health = {bad: GpuHealth(bad, False, "XidError", "XID 48", 48, NOW)}
    doc = inventory_doc(dgx, health, "2026-01-01T00:00:00Z")
    assert doc["time"] == "2026-01-01T00:00:00Z"
    gpus = doc["gpus"]
    assert [g["index"] for g in gpus] == list(range(8))
    assert [g["healthy"] for g in gpus] == [True, True, True, False, True, True, True, True]
    assert gpus[3]["reason"] == "XidError"
    assert {g["nvlinkDomain"] for g in gpus} == {dgx.cliques[0].id}
    assert [g["numaNode"] for g in gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert gpus[7]["mig"]["enabled"] is True
    assert [(m["profile"], m["start"], m["size"]) for m in gpus[7]["mig"]["instances"]] == [
        ("3g.40gb", 0, 4), ("2g.20gb", 4, 2), ("1g.10gb", 6, 1)]
    assert all(m["uuid"].startswith("MIG-") for m in gpus[7]["mig"]["instances"])
    json.dumps(doc)  # JSON-serialisable
