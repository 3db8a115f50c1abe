"""Issue 29 / device-plugin #231, #2038: a 4-GPU node whose GPU 3 fell off the bus before the node agent
(re)started, while allocatable still says 4. The agent names the lost GPU (unhealthy, with a reason) instead of
leaving it out, and the scheduler never books more GPUs on the node than the agent calls healthy: one 4-GPU
pod and four 1-GPU pods pending -> at most 3 GPUs booked, on the dry run and on the live scheduler."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.agent.fake import FakeBackend
from gpupool.agent.health import HealthTracker
from gpupool.agent.run import Agent, FakeClock
from gpupool.k8s.objects.agent_report import ANN_GPU_INVENTORY, inventory_json
from gpupool.k8s.objects.nodes import agent_healthy_count, node_spec_from_node
from gpupool.k8s.snapshot import plan, snapshot_from_objects
from test_k8s_booking import node, placements, pod

DESCRIPTION = {"driver": "570.124.06", "cuda_driver": "12.8", "node": "gpu-4",
               "defaults": {"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "compute": [9, 0]},
               "gpus": [{"count": 3, "numa_node": 0}, {"index": 3, "numa_node": 0, "lost": True}]}


class NodeStub:
    """The agent's publisher, reduced to reading one Node and keeping what it would write."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.published: list[Any] = []

    def refresh(self) -> dict[str, Any]:
        return self.obj

    def allocatable(self, obj: dict[str, Any] | None = None) -> dict[str, str]:
        return dict(self.obj["status"]["allocatable"])

    def publish(self, report: Any, obj: Any = None) -> bool:
        self.published.append(report)
        self.obj["metadata"].setdefault("annotations", {})[ANN_GPU_INVENTORY] = inventory_json(report.inventory)
        return True


def agent_report(backend: Any, publisher: Any = None) -> Any:
    clock = FakeClock()
    agent = Agent(backend, publisher, HealthTracker(clock=clock.now), clock=clock)
    return agent.round()


def pending_pods() -> list[dict[str, Any]]:
    return [pod("big", {"nvidia.com/gpu": "4"}, ts=0)] + [pod(f"one-{i}", {"nvidia.com/gpu": "1"}, ts=i + 1)
                                                       for i in range(4)]


def booked(got: dict[str, Any]) -> int:
    return sum(len(p.gpus) for p in got.values() if p.node)


def node_with(inventory: dict[str, Any]) -> dict[str, Any]:
    return node("gpu-4", 4, annotations={ANN_GPU_INVENTORY: inventory_json(inventory)})


# ------------------------------------------------------------------ the agent
def test_fake_description_of_a_gpu_lost_before_the_agent_started():
    fake = FakeBackend.from_dict(DESCRIPTION)
    devs = fake.devices()
    assert [(d.index, d.lost, bool(d.uuid)) for d in devs] == [(0, False, True), (1, False, True), (2, False, True),
                                                              (3, True, False)]
    assert fake.sample()[3].lost and fake.sample()[3].uuid == ""
    fake.reset(3)  # found again after a reset: read as any other
    assert not fake.devices()[3].lost and fake.devices()[3].uuid


def test_agent_reports_the_gpu_the_driver_counts_but_cannot_read():
    report = agent_report(FakeBackend.from_dict(DESCRIPTION))
    gpus = report.inventory["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2, 3]
    assert [g["healthy"] for g in gpus] == [True, True, True, False]
    assert gpus[3]["reason"] == "FellOffTheBus"
    [cond] = [c for c in report.conditions if c.type == "GpuHealthy"]
    assert cond.status == "False" and "GPU 3" in cond.message and "FellOffTheBus" in cond.message
    assert report.labels["nvidia.com/gpu.count"] == "3"  # the lost GPU has no model to label


def test_agent_names_a_gpu_its_last_inventory_had_and_the_driver_no_longer_counts():
    """A reboot with the GPU dead: the driver counts 3, the Node still carries the inventory of 4 that the
    agent published before; the restarted agent reports GPU 3 missing (with its UUID), not 3 GPUs."""
    four = dict(DESCRIPTION, gpus=[{"count": 4, "numa_node": 0}])
    before = agent_report(FakeBackend.from_dict(four)).inventory
    stub = NodeStub(node_with(before))
    three = dict(DESCRIPTION, gpus=[{"count": 3, "numa_node": 0}])
    report = agent_report(FakeBackend.from_dict(three), stub)
    gpus = report.inventory["gpus"]
    assert [(g["uuid"], g["healthy"]) for g in gpus] == [(g["uuid"], i < 3) for i, g in enumerate(before["gpus"])]
    assert gpus[3]["reason"] == "GpuMissing" and gpus[3]["pciBusId"] == before["gpus"][3]["pciBusId"]
    [cond] = [c for c in report.conditions if c.type == "GpuHealthy"]
    assert cond.status == "False" and "GpuMissing" in cond.message
    # and it goes on naming it in the rounds after (the annotation it wrote keeps it)
    again = agent_report(FakeBackend.from_dict(three), stub)
    assert [g["healthy"] for g in again.inventory["gpus"]] == [True, True, True, False]


def test_agent_takes_the_identity_of_an_unreadable_gpu_from_its_last_inventory():
    four = dict(DESCRIPTION, gpus=[{"count": 4, "numa_node": 0}])
    before = agent_report(FakeBackend.from_dict(four)).inventory
    report = agent_report(FakeBackend.from_dict(DESCRIPTION), NodeStub(node_with(before)))
    gpus = report.inventory["gpus"]
    assert [g["uuid"] for g in gpus] == [g["uuid"] for g in before["gpus"]]
    assert (gpus[3]["healthy"], gpus[3]["reason"], gpus[3]["product"]) == (False, "FellOffTheBus",
                                                                           "NVIDIA H100 80GB HBM3")


def test_agent_over_nvml_reports_a_gpu_lost_before_it_was_read():
    """The real NvmlBackend over a stand-in pynvml: GPU 1 answers NVML_ERROR_GPU_IS_LOST from the start."""
    from gpupool.agent.fake import nvml_standin
    from gpupool.agent.nvml import NvmlBackend
    from test_agent_backend import two_gpu_recording

    doc = two_gpu_recording()
    doc["gpus"][1]["lost"] = True
    report = agent_report(NvmlBackend(nvml_standin(doc)))
    gpus = report.inventory["gpus"]
    assert [(g["index"], g["healthy"], g["reason"]) for g in gpus] == [(0, True, ""), (1, False, "FellOffTheBus")]
    [cond] = [c for c in report.conditions if c.type == "GpuHealthy"]
    assert cond.status == "False" and "index 1" in cond.message


# ------------------------------------------------------------------ the scheduler
def test_dry_run_books_no_more_than_the_healthy_gpus_the_agent_reports():
    report = agent_report(FakeBackend.from_dict(DESCRIPTION))
    n = node_with(report.inventory)
    assert agent_healthy_count(n) == 3 and node_spec_from_node(n).gpu_count == 3
    got = placements(plan(snapshot_from_objects([n, *pending_pods()])))
    assert booked(got) == 3  # three 1-GPU pods; the 4-GPU pod and the fourth 1-GPU pod wait
    assert got["ml/big"].node is None


@pytest.mark.parametrize("how", ["left out", "no identity"])
def test_dry_run_books_at_most_the_healthy_count_whatever_the_inventory_says(how):
    """An agent from before the fix left the GPU out (3 listed, allocatable 4); one that could not read its
    UUID lists it without one. Either way: 3 GPUs, matched to the listed identities."""
    gpus = [{"index": i, "uuid": f"GPU-{i}", "healthy": True, "reason": ""} for i in range(3)]
    if how == "no identity":
        gpus.append({"index": 3, "uuid": "", "healthy": False, "reason": "FellOffTheBus"})
    n = node_with({"version": 1, "gpus": gpus})
    spec = node_spec_from_node(n)
    assert spec.gpu_count == 3 and spec.gpu_ids == ("GPU-0", "GPU-1", "GPU-2")
    assert booked(placements(plan(snapshot_from_objects([n, *pending_pods()])))) == 3


def test_the_agent_report_is_trusted_only_when_there_is_one():
    n = node("gpu-4", 4)
    assert agent_healthy_count(n) is None and node_spec_from_node(n).gpu_count == 4
    assert booked(placements(plan(snapshot_from_objects([n, *pending_pods()])))) == 4


def test_live_scheduler_books_no_more_than_the_healthy_gpus(tmp_path: Path):
    from test_k8s_cases_live import Harness, run_live

    report = agent_report(FakeBackend.from_dict(DESCRIPTION))
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                "items": [node_with(report.inventory), *pending_pods()]}))
    h = Harness()
    try:
        live, dry = run_live(h, path)
    finally:
        h.close()
    assert sum(len(gpus) for _, gpus, _, _ in live.values()) == 3
    assert len({g for _, gpus, _, _ in live.values() for g in gpus}) == 3
