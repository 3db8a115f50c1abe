"""Every GPU booked as the node really has it (memory, per-card shares, time-slicing, health by identity,
GPU type selection, devices named by other schedulers), through the dry-run planner.

The replayed cases live in ../shared/cases/k8s-turn2 (EXPECTED.md there); each test of a case asserts one
right value of its correct outcome. Synthetic variants cover the spellings the cases do not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine
from gpupool.engine.filters import UNKNOWN_MEMORY_REASON
from gpupool.k8s.inventory import (
    build_state,
    hami_registered_gpus,
    node_spec_from_node,
    slices_to_request,
)
from gpupool.k8s.requests import RequestParseError, describe_pod, parse_pod
from gpupool.k8s.snapshot import load_snapshot, plan, snapshot_from_objects
from gpupool.k8s.telemetry import GpuTelemetry
from gpupool.model import NodeSpec, PodRequest
from gpupool.policies import make_policy

CASES = Path(__file__).parents[1] / "../shared/cases/k8s-turn2"
NOW = 1_000_000.0


def case(path: str) -> Path:
    p = CASES / path
    if not p.exists():
        pytest.skip(f"{p} not present (shared data folder not checked out)")
    return p


def placements(result) -> dict[str, Any]:
    return {p.pod: p for p in result.placements}


def run_case(path: str, dcgm: str | None = None):
    prepare = None
    if dcgm is not None:
        tel = GpuTelemetry(max_age=60.0, clock=lambda: NOW)
        tel.ingest_text(case(dcgm).read_text(encoding="utf-8"), now=NOW)

        def prepare(state: ClusterState) -> None:
            tel.apply_health(state, now=NOW)

    # the cases are about booking shares: "trust" vouches that something on the nodes enforces them
    return placements(plan(load_snapshot(case(path)), prepare_state=prepare, share_enforcement="trust"))


# ------------------------------------------------------------------ synthetic objects
def node(name: str, gpus: int, product: str | None = "NVIDIA-H100-80GB-HBM3", labels: dict[str, str] | None = None,
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    lab = {"kubernetes.io/hostname": name, **(labels or {})}
    if product:
        lab["nvidia.com/gpu.product"] = product
    alloc = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": lab, "annotations": annotations or {}},
            "spec": {}, "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, limits: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
        node_name: str | None = None, containers: list[dict[str, str]] | None = None, ts: int = 0,
        scheduler: str = "gpupool") -> dict[str, Any]:
    ctrs = [{"name": f"c{i}", "resources": {"limits": lim, "requests": {"cpu": "100m", "memory": "64Mi"}}}
            for i, lim in enumerate(containers if containers is not None else [limits or {}])]
    p: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "annotations": annotations or {},
                     "creationTimestamp": f"2025-05-01T10:{ts // 60:02d}:{ts % 60:02d}Z"},
        "spec": {"schedulerName": scheduler, "containers": ctrs},
        "status": {"phase": "Running" if node_name else "Pending"},
    }
    if node_name:
        p["spec"]["nodeName"] = node_name
    return p


def plan_of(*objects: dict[str, Any], policy: str = "gpupool") -> dict[str, Any]:
    return placements(plan(snapshot_from_objects(list(objects)), policy=policy, share_enforcement="trust"))


# ================================================================== the replayed cases
# ------------------------------------------------------------------ kai-257: GPU memory from the node's label
def test_kai257a_uncatalogued_gpu_uses_its_gfd_memory_label():
    got = run_case("kai-257/snapshot_a.yaml")
    assert sum(p.node == "ws-4080" for p in got.values()) == 2  # 2 x 8000 of 16376 MiB


def test_kai257a_third_pod_waits_for_memory():
    got = run_case("kai-257/snapshot_a.yaml")
    assert got["dev/a-2"].node is None


def test_kai257b_unlabelled_unknown_gpu_says_memory_unknown():
    got = run_case("kai-257/snapshot_b.yaml")
    assert all(p.node is None for p in got.values())
    assert all(UNKNOWN_MEMORY_REASON in p.reason for p in got.values())


def test_kai257c_catalog_gpu_control():
    got = run_case("kai-257/snapshot_c.yaml")
    assert sum(p.node == "l4-1" for p in got.values()) == 2


# ------------------------------------------------------------------ kai-416: no GPU memory over-booked
def test_kai416a_l40s_memory_never_overbooked():
    got = run_case("kai-416/snapshot_a.yaml")
    placed = [p for p in got.values() if p.node]
    assert sum(p.gpu_memory_mib for p in placed) <= 46068
    assert len(placed) == 23


def test_kai416b_label_below_catalog_wins():
    got = run_case("kai-416/snapshot_b.yaml")
    placed = [p for p in got.values() if p.node]
    assert sum(p.gpu_memory_mib for p in placed) <= 40536
    assert len(placed) == 19  # 19 x 2040 = 38760; a 20th would need 40800 MiB


# ------------------------------------------------------------------ hami-302: per-card shares
def test_hami302_two_card_share_pod_is_accepted_on_two_distinct_cards():
    got = run_case("hami-302/snapshot.yaml")
    p = got["team-b/multi-card"]
    assert p.node is not None and len(set(p.gpus)) == 2


def test_hami302_two_card_share_pod_gets_its_share_on_each_card():
    got = run_case("hami-302/snapshot.yaml")
    p = got["team-b/multi-card"]
    assert (p.gpu_milli, p.gpu_memory_mib) == (100, 1000)


def test_hami302_memory_shares_never_overbook_a_card():
    result = plan(load_snapshot(case("hami-302/snapshot.yaml")), share_enforcement="trust")
    result.state.check_invariants()
    assert (result.state.gpu_mem_free >= 0).all()


# ------------------------------------------------------------------ hami-707: GPU type selection
def test_hami707_use_gputype_goes_to_the_a100():
    assert run_case("hami-707/snapshot.yaml")["ml/want-a100"].node == "a100-node"


def test_hami707_nouse_gputype_avoids_the_t4():
    assert run_case("hami-707/snapshot.yaml")["ml/not-t4"].node == "a100-node"


def test_hami707_gpupool_model_annotation_still_works():
    assert run_case("hami-707/snapshot.yaml")["ml/control"].node == "a100-node"


# ------------------------------------------------------------------ k8s-92592: allocatable and health
def test_k8s92592a_no_placement_beyond_allocatable():
    assert run_case("k8s-92592/snapshot_a.yaml")["ml/new-job"].node is None


def test_k8s92592b_dcgm_error_of_a_withdrawn_gpu_does_not_mark_the_healthy_one():
    p = run_case("k8s-92592/snapshot_b.yaml", dcgm="k8s-92592/dcgm_b.txt")["ml/new-job"]
    assert (p.node, p.gpus) == ("gpu-node", (0,))


# ------------------------------------------------------------------ gpu-operator-386: time-slicing
def test_gpuop386_two_slice_pod_gets_two_distinct_physical_gpus():
    p = run_case("gpu-operator-386/snapshot.yaml")["ci/two-gpus"]
    assert p.node == "ts-node" and sorted(p.gpus) == [0, 1]


def test_gpuop386_one_slice_pods_all_fit():
    got = run_case("gpu-operator-386/snapshot.yaml")
    assert all(got[f"ci/one-slice-{i}"].node == "ts-node" for i in range(3))


def test_gpuop386_a_slice_is_a_quarter_gpu_not_a_whole_one():
    got = run_case("gpu-operator-386/snapshot.yaml")
    assert {p.gpu_milli for p in got.values()} == {250}


def test_gpuop386_never_more_slices_than_replicas_per_gpu():
    result = plan(load_snapshot(case("gpu-operator-386/snapshot.yaml")), share_enforcement="trust")
    result.state.check_invariants()
    # GPU 0: the bound slice + 1 of two-gpus + 2 single slices; GPU 1: 1 of two-gpus + 1 single slice
    assert list(result.state.gpu_free[0][:2]) == [0, 500]


# ================================================================== synthetic variants
# ------------------------------------------------------------------ GPU memory
def test_label_below_catalog_wins_in_the_state():
    spec = node_spec_from_node(node("a", 1, "NVIDIA-A100-SXM4-40GB", {"nvidia.com/gpu.memory": "40536"}))
    assert spec.gpu_memory_mib == 40536
    assert int(ClusterState([spec]).gpu_mem_cap[0, 0]) == 40536


def test_catalog_figure_without_a_label():
    spec = node_spec_from_node(node("a", 1, "NVIDIA-A100-SXM4-40GB"))
    assert spec.gpu_memory_mib == 0 and int(ClusterState([spec]).gpu_mem_cap[0, 0]) == 40960


def test_plain_a100_is_unknown_memory_not_zero_that_never_limits():
    got = plan_of(node("a", 1, "A100"), pod("m", annotations={"gpu-memory": "1000"}))
    assert got["ml/m"].node is None and UNKNOWN_MEMORY_REASON in got["ml/m"].reason


def test_unknown_model_with_label_takes_memory_pods():
    got = plan_of(node("a", 1, "A100", {"nvidia.com/gpu.memory": "81920"}),
                  *[pod(f"m{i}", annotations={"gpu-memory": "40000"}, ts=i) for i in range(3)])
    assert sum(p.node == "a" for p in got.values()) == 2


def test_unknown_memory_takes_whole_gpu_pods():
    assert plan_of(node("a", 1, "A100"), pod("w", {"nvidia.com/gpu": "1"}))["ml/w"].node == "a"


def test_unknown_memory_takes_share_only_pods_by_share():
    got = plan_of(node("a", 1, "A100"), *[pod(f"f{i}", annotations={"gpu-fraction": "0.5"}, ts=i) for i in range(3)])
    assert sum(p.node == "a" for p in got.values()) == 2


def test_unknown_memory_refuses_hami_share_with_memory():
    got = plan_of(node("a", 1, "A100"), pod("h", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000",
                                                  "nvidia.com/gpucores": "30"}))
    assert UNKNOWN_MEMORY_REASON in got["ml/h"].reason


def test_unreadable_memory_label_falls_back_to_the_catalog():
    spec = node_spec_from_node(node("a", 1, "NVIDIA-L4", {"nvidia.com/gpu.memory": "lots"}))
    assert ClusterState([spec]).gpu_mem_cap[0, 0] == 23034


def test_nodespec_rejects_negative_gpu_memory():
    with pytest.raises(ValueError, match="gpu_memory_mib"):
        NodeSpec("n", 1000, 1000, 1, "H100", gpu_memory_mib=-1)


# ------------------------------------------------------------------ per-card shares, every spelling
@pytest.mark.parametrize("spelling", [
    dict(limits={"nvidia.com/gpu": "3", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20"}),
    dict(limits={"volcano.sh/vgpu-number": "3", "volcano.sh/vgpu-memory": "2000", "volcano.sh/vgpu-cores": "20"}),
    dict(annotations={"gpu-fraction": "0.2", "gpu-fraction-num-devices": "3"}),
    dict(annotations={"alibabacloud.com/gpu-milli": "200", "alibabacloud.com/gpu-count": "3"}),
], ids=["hami", "volcano", "kai-fraction", "alibaba"])
def test_three_card_share_gets_three_distinct_cards(spelling):
    got = plan_of(node("a", 4), pod("s", **spelling))
    p = got["ml/s"]
    assert p.node == "a" and len(set(p.gpus)) == 3 and p.gpu_milli == 200


def test_kai_gpu_memory_on_several_devices():
    req = parse_pod(pod("k", annotations={"gpu-memory": "3000", "gpu-fraction-num-devices": "2"}))
    assert (req.num_gpu, req.gpu_memory_mib) == (2, 3000)


def test_share_pod_needs_enough_cards_with_room():
    # 2 cards, each already 90% used: a 2-card 20% share does not fit, a 2-card 10% share does
    objs = [node("a", 2), pod("b0", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "90"}, node_name="a"),
            pod("b1", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "90"}, node_name="a", ts=1),
            pod("big", {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "20"}, ts=2),
            pod("small", {"nvidia.com/gpu": "2", "nvidia.com/gpucores": "10"}, ts=3)]
    got = plan_of(*objs)
    assert got["ml/big"].node is None and sorted(got["ml/small"].gpus) == [0, 1]


@pytest.mark.parametrize("policy", ["gpupool", "fgd", "best-fit", "spread", "gpu-packing", "dot-product",
                                    "gpu-clustering", "round-robin", "random", "single-node", "lowest-power"])
def test_every_policy_gives_a_multi_card_share_distinct_cards(policy):
    state = ClusterState([NodeSpec("a", 64000, 10**6, 4, "H100"), NodeSpec("b", 64000, 10**6, 2, "H100")])
    engine = Engine(state, make_policy(policy))
    for i in range(3):
        d = engine.place(PodRequest(f"p{i}", num_gpu=3, gpu_milli=300, gpu_memory_mib=1000))
        assert d.assignment is not None and d.assignment.node_name == "a" and len(set(d.assignment.gpus)) == 3
        assert d.assignment.gpu_milli == 300 and d.assignment.gpu_memory_mib == 1000
    state.check_invariants()
    assert int(state.gpu_free[0].sum()) == 4000 - 3 * 3 * 300


def test_hami_two_containers_are_two_cards_not_double_memory():
    req = parse_pod(pod("c", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"},
                                         {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}]))
    assert (req.num_gpu, req.gpu_memory_mib) == (2, 4000)


def test_hami_containers_with_different_shares_book_the_larger_per_card():
    req = parse_pod(pod("c", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000",
                                          "nvidia.com/gpucores": "10"},
                                         {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "2000",
                                          "nvidia.com/gpucores": "30"}]))
    assert (req.num_gpu, req.gpu_milli, req.gpu_memory_mib) == (3, 300, 4000)


def test_hami_container_without_gpu_asks_nothing():
    req = parse_pod(pod("c", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}, {}]))
    assert (req.num_gpu, req.gpu_memory_mib) == (1, 4000)


def test_hami_mixed_memory_kinds_is_a_clear_error_naming_both_containers():
    with pytest.raises(RequestParseError, match=r"spec.containers\[0\].*spec.containers\[1\]"):
        parse_pod(pod("c", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"},
                                       {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}]))


def test_a_bad_pod_does_not_block_the_others():
    got = plan_of(node("a", 1), pod("bad", containers=[{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"},
                                                       {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}]),
                  pod("good", {"nvidia.com/gpu": "1"}, ts=1))
    assert got["ml/bad"].node is None and got["ml/bad"].invalid and got["ml/good"].node == "a"


# ------------------------------------------------------------------ time-slicing
@pytest.mark.parametrize("replicas", [2, 4, 8])
def test_time_sliced_one_slice_pods_fill_every_replica(replicas):
    labels = {"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    objs = [node("ts", 2 * replicas, "NVIDIA-L4-SHARED", labels)]
    objs += [pod(f"p{i}", {"nvidia.com/gpu": "1"}, ts=i) for i in range(2 * replicas + 1)]
    got = plan_of(*objs)
    assert sum(p.node == "ts" for p in got.values()) == 2 * replicas
    assert {p.gpu_milli for p in got.values() if p.node} == {1000 // replicas}


@pytest.mark.parametrize("replicas", [2, 4, 8])
def test_time_sliced_multi_slice_pod_takes_distinct_gpus(replicas):
    labels = {"nvidia.com/gpu.replicas": str(replicas), "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    p = plan_of(node("ts", 3 * replicas, "NVIDIA-L4-SHARED", labels), pod("k", {"nvidia.com/gpu": "3"}))["ml/k"]
    assert p.node == "ts" and sorted(p.gpus) == [0, 1, 2] and p.gpu_milli == 1000 // replicas


def test_time_sliced_and_plain_nodes_in_one_cluster():
    labels = {"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing"}
    got = plan_of(node("plain", 1, "NVIDIA-L4"), node("ts", 4, "NVIDIA-L4-SHARED", labels),
                  *[pod(f"p{i}", {"nvidia.com/gpu": "1"}, ts=i) for i in range(6)], policy="best-fit")
    on = [p for p in got.values() if p.node]
    assert len(on) == 5  # 1 whole GPU on the plain node + 4 slices on the time-sliced one
    assert sorted(p.gpu_milli for p in on) == [250, 250, 250, 250, 1000]


def test_replicas_inferred_from_gpu_count_when_label_missing():
    spec = node_spec_from_node(node("ts", 8, "NVIDIA-L4-SHARED", {"nvidia.com/gpu.count": "2"}))
    assert (spec.gpu_count, spec.gpu_replicas) == (2, 4)


def test_slices_to_request_units():
    req = slices_to_request(PodRequest("p", num_gpu=2, gpu_milli=1000), 4)
    assert (req.num_gpu, req.gpu_milli, req.total_gpu_milli) == (2, 250, 500)
    share = PodRequest("q", num_gpu=1, gpu_milli=300)
    assert slices_to_request(share, 4) is share


# ------------------------------------------------------------------ GPU type selection
TYPES = [node("t4", 4, "Tesla-T4"), node("a100", 4, "NVIDIA-A100-SXM4-80GB"), node("h100", 4)]


@pytest.mark.parametrize("annotations,allowed", [
    ({"nvidia.com/use-gputype": "A100"}, {"a100"}),
    ({"nvidia.com/use-gputype": "a100,H100"}, {"a100", "h100"}),
    ({"nvidia.com/use-gputype": "Tesla"}, {"t4"}),
    ({"nvidia.com/use-gputype": "NVIDIA A100"}, {"a100"}),  # NVML spelling with a space
    ({"nvidia.com/nouse-gputype": "T4,H100"}, {"a100"}),
    ({"nvidia.com/nouse-gputype": "T4"}, {"a100", "h100"}),
    ({"nvidia.com/use-gputype": "A100,H100", "nvidia.com/nouse-gputype": "80GB-HBM3"}, {"a100"}),
])
def test_gpu_type_selection(annotations, allowed):
    for policy in ("gpupool", "spread"):
        objs = TYPES + [pod(f"p{i}", {"nvidia.com/gpu": "1"}, annotations=annotations, ts=i) for i in range(4)]
        got = plan_of(*objs, policy=policy)
        assert all(p.node is not None for p in got.values())
        assert {p.node for p in got.values()} <= allowed


def test_gpu_type_nowhere_says_so():
    got = plan_of(*TYPES, pod("v", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": "V100"}))
    assert got["ml/v"].node is None and "no node has GPU type V100" in got["ml/v"].reason


def test_gpu_type_is_part_of_the_cache_key():
    state = ClusterState([node_spec_from_node(n) for n in TYPES])
    engine = Engine(state, make_policy("gpupool"))
    a = describe_pod(pod("a", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/use-gputype": "T4"})).request
    b = describe_pod(pod("b", {"nvidia.com/gpu": "1"}, annotations={"nvidia.com/nouse-gputype": "T4"})).request
    assert engine.place(a).assignment.node_name == "t4"
    assert engine.place(b).assignment.node_name != "t4"


# ------------------------------------------------------------------ health by identity
def dcgm(node_name: str, xids: dict[int, int], uuids: dict[int, str] | None = None) -> str:
    lines = []
    for g, x in xids.items():
        u = (uuids or {}).get(g, f"GPU-{g:04d}")
        lines.append(f'DCGM_FI_DEV_XID_ERRORS{{gpu="{g}",UUID="{u}",Hostname="{node_name}"}} {x}')
    return "\n".join(lines) + "\n"


def health(objs: list[dict[str, Any]], text: str) -> np.ndarray:
    state, _ = build_state([o for o in objs if o["kind"] == "Node"], [])
    tel = GpuTelemetry(clock=lambda: NOW)
    tel.ingest_text(text, now=NOW)
    return tel.health_mask(state, now=NOW)


def test_health_by_index_when_every_gpu_is_advertised():
    mask = health([node("n", 2)], dcgm("n", {0: 0, 1: 79}))
    assert list(mask[0][:2]) == [True, False]


def test_withdrawn_failed_gpu_marks_nothing():
    mask = health([node("n", 1)], dcgm("n", {0: 79, 1: 0}))
    assert bool(mask[0][0])


def test_more_failures_than_withdrawn_marks_the_node():
    mask = health([node("n", 2)], dcgm("n", {0: 79, 1: 79, 2: 0}))
    assert not mask[0][:2].any()


REGISTER = json.dumps([{"id": "GPU-aaaa", "index": 0, "count": 10, "devmem": 81559, "type": "NVIDIA-H100",
                        "health": True},
                       {"id": "GPU-bbbb", "index": 1, "count": 10, "devmem": 81559, "type": "NVIDIA-H100",
                        "health": True}])


def test_health_by_uuid_when_the_node_publishes_its_devices():
    n = node("n", 20, annotations={"hami.io/node-nvidia-register": REGISTER})
    mask = health([n], dcgm("n", {0: 0, 1: 79}, {0: "GPU-bbbb", 1: "GPU-aaaa"}))
    assert list(mask[0][:2]) == [False, True]


# ------------------------------------------------------------------ HAMi nodes and pods bound by HAMi
def test_hami_split_count_is_slots_not_cards():
    spec = node_spec_from_node(node("n", 20, annotations={"hami.io/node-nvidia-register": REGISTER}))
    assert (spec.gpu_count, spec.gpu_ids) == (2, ("GPU-aaaa", "GPU-bbbb"))


def test_hami_register_legacy_format():
    n = node("n", 20, annotations={"hami.io/node-nvidia-register":
                                   "GPU-aaaa,10,32768,100,NVIDIA-Tesla V100,0,true:GPU-bbbb,10,32768,100,"
                                   "NVIDIA-Tesla V100,0,false:"})
    gpus = hami_registered_gpus(n)
    assert [(g.uuid, g.healthy) for g in gpus] == [("GPU-aaaa", True), ("GPU-bbbb", False)]
    assert node_spec_from_node(n).gpu_count == 1


def test_pod_bound_by_hami_is_counted_on_the_device_it_names():
    n = node("n", 20, annotations={"hami.io/node-nvidia-register": REGISTER})
    bound = pod("h", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "60000", "nvidia.com/gpucores": "50"},
                node_name="n", scheduler="hami-scheduler",
                annotations={"hami.io/vgpu-node": "n",
                             "hami.io/vgpu-devices-allocated": "GPU-bbbb,NVIDIA,60000,50:;"})
    state, info = build_state([n], [bound])
    assert info["assignments"]["ml/h"].gpus == (1,)
    assert int(state.gpu_mem_free[0, 1]) == 81559 - 60000


def test_pod_bound_by_hami_for_another_node_is_counted_conservatively():
    n = node("n", 20, annotations={"hami.io/node-nvidia-register": REGISTER})
    bound = pod("h", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "60000"}, node_name="n",
                annotations={"hami.io/vgpu-node": "other",
                             "hami.io/vgpu-devices-allocated": "GPU-bbbb,NVIDIA,60000,0:;"})
    state, info = build_state([n], [bound])
    assert info["assignments"]["ml/h"].gpus == (0,)  # lowest free, the pod still counted


def test_dry_run_cli_reads_dcgm_files(tmp_path):
    """``gpupool scheduler --dry-run --dcgm-file``: health from a saved dcgm-exporter page, by GPU identity."""
    from typer.testing import CliRunner

    from gpupool.cli import app

    snapshot = CASES / "k8s-92592" / "snapshot_b.yaml"
    if not snapshot.exists():
        pytest.skip(f"{CASES} not found")
    dcgm = (CASES / "k8s-92592" / "dcgm_b.txt").read_text()
    out = tmp_path / "plan.json"
    runner = CliRunner()
    ok = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snapshot), "--json", str(out),
                             "--dcgm-file", str(CASES / "k8s-92592" / "dcgm_b.txt")])
    assert ok.exit_code == 0, ok.output
    assert json.loads(out.read_text())["placements"][0]["node"] == "gpu-node"  # the healthy GPU
    both = tmp_path / "both.txt"  # the advertised GPU has failed too: nothing left
    both.write_text(dcgm.replace('UUID="GPU-0000bbbb",Hostname="gpu-node",modelName="NVIDIA H100 80GB HBM3"} 0',
                                 'UUID="GPU-0000bbbb",Hostname="gpu-node",modelName="NVIDIA H100 80GB HBM3"} 48'))
    bad = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snapshot), "--json", str(out),
                              "--dcgm-file", str(both)])
    assert bad.exit_code == 0 and json.loads(out.read_text())["placements"][0]["node"] is None
    missing = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snapshot),
                                  "--dcgm-file", str(tmp_path / "absent.txt")])
    assert missing.exit_code == 2 and "cannot read" in missing.output
    alone = runner.invoke(app, ["scheduler", "--dcgm-file", str(both)])
    assert alone.exit_code == 2 and "go with --dry-run" in alone.output


def test_hami_registration_with_an_unreadable_number_falls_back():
    """``"devmem": 1e400`` (infinity once parsed): the registration is unreadable, the node is still used."""
    from gpupool.k8s.state import ClusterModel

    n = {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": "a", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                      "annotations": {"hami.io/node-nvidia-register": '[{"id": "G1", "devmem": 1e400}]'}},
         "status": {"allocatable": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": "2"}}}
    m = ClusterModel()
    m.replace("nodes", [n])
    state = m.refresh()
    assert state is not None and int(state.gpu_count[0]) == 2 and not m.skipped_nodes()
