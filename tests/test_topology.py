"""Tests of gpupool.topology: tiers of hand-made placements, speed factors, constraints."""

from __future__ import annotations

import pytest

from gpupool.cluster import ClusterState
from gpupool.model import NodeSpec
from gpupool.topology import (
    DEFAULT_SPEED_FACTORS,
    TIERS,
    TopologyConfig,
    TopologyConstraint,
    best_tier,
    placement_tier,
    slowdown,
    speed_factor,
    tier_at_most,
    tier_of_nodes,
    tier_rank,
    worst_tier,
)


def n(name: str, gpus: int = 8, domain: str | None = None, rack: str = "", switch: str = "") -> NodeSpec:
    """A node; ``domain=None`` means an NVLink domain named after the node (``""``: PCIe only)."""
    return NodeSpec(
        name, 64000, 262144, gpus, "V100M16" if gpus else "", name if domain is None else domain, rack, switch
    )


HGX_A = n("hgx-a", rack="r0", switch="leaf-0")
HGX_B = n("hgx-b", rack="r0", switch="leaf-0")
HGX_C = n("hgx-c", rack="r1", switch="leaf-0")
HGX_D = n("hgx-d", rack="r2", switch="leaf-1")
PCIE = n("pcie", gpus=4, domain="", rack="r3", switch="leaf-1")
BARE_1 = n("bare-1", domain="")  # no rack, no switch
BARE_2 = n("bare-2", domain="")
RACK_1 = n("rack-1", domain="", rack="rk")  # rack known, switch not
RACK_2 = n("rack-2", domain="", rack="rk")
NVL_1 = n("nvl72-1", gpus=4, domain="nvl72-0", switch="leaf-5")  # a multi-node NVLink domain
NVL_2 = n("nvl72-2", gpus=4, domain="nvl72-0", switch="leaf-6")


@pytest.mark.parametrize(
    ("nodes", "gpus", "tier"),
    [
        ([HGX_A], [1], "nvlink"),  # one GPU: nothing to talk to
        ([PCIE], [1], "nvlink"),
        ([HGX_A], [8], "nvlink"),
        ([PCIE], [4], "node"),
        ([PCIE], [2], "node"),
        ([HGX_A, HGX_B], [8, 8], "switch"),  # same rack, same leaf
        ([HGX_A, HGX_C], [4, 4], "switch"),  # different racks, same leaf
        ([HGX_A, HGX_D], [8, 8], "spine"),  # different leaves
        ([HGX_A, HGX_B, HGX_D], [8, 8, 1], "spine"),
        ([HGX_A, HGX_D], [8, 0], "nvlink"),  # the 0-GPU member does not count
        ([PCIE, HGX_A], [0, 3], "nvlink"),
        ([HGX_A, HGX_A], [2, 2], "nvlink"),  # the same node twice: 4 GPUs on it
        ([PCIE, PCIE], [1, 1], "node"),  # two 1-GPU members on one PCIe node
        ([BARE_1, BARE_2], [8, 8], "spine"),  # topology unknown: conservative
        ([RACK_1, RACK_2], [8, 8], "switch"),  # same rack (its ToR switch), switch unknown
        ([RACK_1, BARE_1], [8, 8], "spine"),
        ([NVL_1, NVL_2], [4, 4], "nvlink"),  # one NVLink domain across nodes
        ([NVL_1, HGX_A], [4, 4], "spine"),
        ([], [], "nvlink"),
        ([HGX_A], [0], "nvlink"),
    ],
)
def test_placement_tier(nodes: list[NodeSpec], gpus: list[int], tier: str) -> None:
    assert placement_tier(nodes, gpus) == tier


def test_placement_tier_errors() -> None:
    with pytest.raises(ValueError, match="2 nodes but 1 GPU counts"):
        placement_tier([HGX_A, HGX_B], [1])
    with pytest.raises(ValueError, match="negative GPU count -1 on node hgx-a"):
        placement_tier([HGX_A], [-1])


def test_tier_of_nodes_on_lists_and_cluster_state() -> None:
    nodes = [HGX_A, HGX_B, HGX_D, PCIE, BARE_1]
    state = ClusterState(nodes)
    for like in (nodes, state):
        assert tier_of_nodes(like, [0]) == "nvlink"
        assert tier_of_nodes(like, [3]) == "node"  # counts unknown: a PCIe node with >1 GPU assumed
        assert tier_of_nodes(like, [3], [1]) == "nvlink"  # with counts: one GPU
        assert tier_of_nodes(like, [0, 0, 0]) == "nvlink"  # repeats count once
        assert tier_of_nodes(like, [0, 1]) == "switch"
        assert tier_of_nodes(like, [1, 2]) == "spine"
        assert tier_of_nodes(like, [2, 3]) == "switch"  # both under leaf-1
        assert tier_of_nodes(like, [3, 4]) == "spine"
        assert tier_of_nodes(like, [0, 2], [8, 0]) == "nvlink"
        assert tier_of_nodes(like, []) == "nvlink"
    with pytest.raises(IndexError, match="node index 5 outside 0..4"):
        tier_of_nodes(nodes, [0, 5])
    with pytest.raises(IndexError):
        tier_of_nodes(nodes, [-1])
    with pytest.raises(TypeError):
        tier_of_nodes(42, [0])


def test_default_factors_and_order() -> None:
    assert TIERS == ("nvlink", "node", "switch", "spine")
    assert DEFAULT_SPEED_FACTORS == {"nvlink": 1.0, "node": 0.90, "switch": 0.75, "spine": 0.65}
    for tier, factor in DEFAULT_SPEED_FACTORS.items():
        assert speed_factor(tier) == factor == slowdown(tier)
    for size in (None, 2, 3, 8, 64, 1024):
        speeds = [speed_factor(t, size) for t in TIERS]
        assert speeds == sorted(speeds, reverse=True)
        assert all(0.0 < s <= 1.0 for s in speeds)


def test_ring_scaling_hand_values() -> None:
    # speed = 1 - (1 - factor) * (n - 1) / n
    assert slowdown("switch", 2) == pytest.approx(1 - 0.25 * 1 / 2)  # 0.875
    assert slowdown("switch", 16) == pytest.approx(1 - 0.25 * 15 / 16)  # 0.765625
    assert slowdown("spine", 4) == pytest.approx(1 - 0.35 * 3 / 4)  # 0.7375
    assert slowdown("node", 8) == pytest.approx(1 - 0.10 * 7 / 8)  # 0.9125
    assert slowdown("nvlink", 8) == 1.0
    for tier in TIERS:
        assert slowdown(tier, 1) == 1.0
        assert slowdown(tier, 0) == 1.0
    # without ring scaling the table value holds for every size above one GPU
    flat = TopologyConfig(ring_scaling=False)
    assert slowdown("switch", 2, flat) == 0.75
    assert slowdown("switch", 1, flat) == 1.0


def test_overrides() -> None:
    cfg = TopologyConfig(factors={"switch": 0.9, "spine": 0.8})
    assert cfg.factors == {"nvlink": 1.0, "node": 0.9, "switch": 0.9, "spine": 0.8}
    assert speed_factor("spine", config=cfg) == 0.8
    assert speed_factor("spine", config={"spine": 0.5}) == 0.5  # a plain dict works too
    assert speed_factor("node", 2, {"node": 0.8}) == pytest.approx(0.9)
    with pytest.raises(ValueError, match="must not increase"):
        TopologyConfig(factors={"spine": 0.9})  # spine faster than switch (0.75)
    with pytest.raises(ValueError, match=r"must be in \(0, 1\]"):
        TopologyConfig(factors={"spine": 0.0})
    with pytest.raises(ValueError, match="unknown topology tier 'rack'"):
        TopologyConfig(factors={"rack": 0.9})


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown topology tier 'rack'"):
        slowdown("rack")
    with pytest.raises(ValueError, match="num_gpus must be >= 0"):
        slowdown("node", -1)


def test_tier_helpers() -> None:
    assert [tier_rank(t) for t in TIERS] == [0, 1, 2, 3]
    assert tier_at_most("node", "switch") and tier_at_most("switch", "switch")
    assert not tier_at_most("spine", "switch")
    assert worst_tier(["node", "spine", "nvlink"]) == "spine"
    assert best_tier(["node", "spine", "switch"]) == "node"
    assert worst_tier([]) == "nvlink" and best_tier([]) == "spine"


def test_constraint() -> None:
    req = TopologyConstraint(mode="required", tier="switch")
    assert req.allows("nvlink") and req.allows("switch") and not req.allows("spine")
    assert req.satisfied_by("node") and not req.satisfied_by("spine")
    pref = TopologyConstraint(mode="preferred", tier="nvlink")
    assert pref.allows("spine") and not pref.satisfied_by("node") and pref.satisfied_by("nvlink")
    with pytest.raises(ValueError):
        TopologyConstraint(mode="hard", tier="switch")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TopologyConstraint(mode="required", tier="rack")  # type: ignore[arg-type]
    assert TopologyConstraint.from_dict({"mode": "required", "tier": "node"}) == TopologyConstraint("required", "node")
    with pytest.raises(ValueError, match="unknown topology tier 'rack'"):
        TopologyConstraint("preferred", "rack")  # type: ignore[arg-type]
