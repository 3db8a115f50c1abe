"""Network topology tiers of a job's placement, and how much a placement slows the job down.

Tiers, fastest to slowest (:data:`TIERS`):

* ``"nvlink"``: every GPU of the job sits in one NVLink domain (an HGX/DGX board; or a multi-node NVLink
  domain such as a GB200 NVL72 rack, when several nodes share one ``nvlink_domain``), or the job has at
  most one GPU and so no GPU-to-GPU traffic at all;
* ``"node"``: one node, GPUs talking over PCIe (no NVLink domain on the node);
* ``"switch"``: several nodes under one leaf switch (same ``switch``, or, when no switch is known, the same
  ``rack``: the rack's top-of-rack switch);
* ``"spine"``: nodes under different leaf switches, or whose switch is not known, so traffic crosses the
  spine (the conservative answer when the topology is unknown).

These are the levels Volcano's HyperNode tiers (lower tier = higher bandwidth: NVLink < leaf switch <
spine) and KAI's Topology ``levels`` describe; ``"node"`` is the hostname level.

Convention of the slowdown: :func:`speed_factor` (and its alias :func:`slowdown`) returns the rate, in
(0, 1], at which a job makes progress on a placement of that tier, relative to the same job on the best
placement (one NVLink domain). 1.0 = no slowdown; 0.8 = the job runs at 80 % of full speed, so a job that
needs ``T`` seconds of full-speed work takes ``T / 0.8`` seconds there. Factors multiply with any other
rate (GPU model throughput, sharing).

Default factors (:data:`DEFAULT_SPEED_FACTORS`) and where they come from. They are *engineering defaults*
chosen within the range the papers below report; the papers measure individual models, and the effect
ranges from none (compute-bound CNNs such as ResNet-50) to several-fold (models with large dense layers,
e.g. VGG). Override them (:class:`TopologyConfig`) for a workload you have measured.

* ``nvlink`` 1.0: the reference (best) placement.
* ``node`` 0.90: PCIe instead of NVLink inside one server. Bandwidth: NVLink on V100 SXM2 is 300 GB/s per
  GPU (NVIDIA Tesla V100 datasheet), 600 GB/s on A100 SXM4 and 900 GB/s on H100 SXM5 (A100 / H100
  datasheets), against 32 GB/s for PCIe Gen3 x16, 64 GB/s Gen4, 128 GB/s Gen5 (both directions; the
  V100 PCIe / A100 PCIe / H100 PCIe datasheets): about 10x less. Data-parallel training overlaps most of
  the all-reduce with compute, so the effect on the job is much smaller than the bandwidth ratio: Gandiva
  (Xiao et al., OSDI'18, its analysis of intra-server locality) finds jobs sensitive to the GPUs' placement
  inside a server to different degrees, small for most models; a 10 % loss is in that range.
* ``switch`` 0.75: several servers under one leaf switch. A 100 Gb/s InfiniBand EDR port moves 12.5 GB/s
  (200 Gb/s HDR 25 GB/s, 400 Gb/s NDR 50 GB/s; NVIDIA ConnectX-5/6/7 datasheets), one to two orders of
  magnitude below NVLink. Tiresias (Gu et al., NSDI'19) finds that consolidating a
  job on as few servers as possible matters for models with large, skewed tensors (VGG, AlexNet) and
  little for ResNet/Inception, and only consolidates the sensitive ones; Gandiva (OSDI'18, "inter-server
  locality") and the Philly analysis (Jeon et al., USENIX ATC'19, "the effect of locality on GPU
  utilization") report lower speed and GPU utilization for jobs spread over more servers. 0.75 is a
  middle value for a mix of sensitive and insensitive models.
* ``spine`` 0.65: crossing leaf switches adds hops and meets the spine's oversubscription. The Philly
  scheduler held jobs back for a placement with better locality and relaxed that only after a job had
  waited (ATC'19, "the effect of gang scheduling and locality constraints on queuing"), a sign that
  spreading further costs more. 0.65 keeps ``spine < switch`` with a gap like ``switch`` vs ``node``.

Scaling with the job's size (``ring_scaling``, on by default): in a ring all-reduce each GPU sends and
receives ``2 (n - 1) / n`` times the gradient size (Patarasuk & Yuan, JPDC 2009; the algorithm NCCL uses),
so the communication share grows as ``(n - 1) / n`` toward the large-``n`` value the table holds. With
``num_gpus = n``, ``speed = 1 - (1 - factor) * (n - 1) / n``: 2 GPUs on a switch tier run at
``1 - 0.25 * 0.5 = 0.875``, 16 at ``0.766``; ``num_gpus=None`` gives the table's value. A job of at most
one GPU always runs at 1.0.

Everything here is pure: no I/O, no state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpupool.model import NodeSpec

__all__ = [
    "DEFAULT_SPEED_FACTORS",
    "TIERS",
    "Tier",
    "TopologyConfig",
    "TopologyConstraint",
    "best_tier",
    "placement_tier",
    "slowdown",
    "speed_factor",
    "tier_at_most",
    "tier_of_nodes",
    "tier_rank",
    "worst_tier",
]

Tier = Literal["nvlink", "node", "switch", "spine"]

TIERS: tuple[str, ...] = ("nvlink", "node", "switch", "spine")
"""Topology tiers, fastest first."""

_RANK: dict[str, int] = {t: i for i, t in enumerate(TIERS)}

DEFAULT_SPEED_FACTORS: dict[str, float] = {"nvlink": 1.0, "node": 0.90, "switch": 0.75, "spine": 0.65}
"""Progress rate of a job per tier (1.0 = full speed); see the module docstring for the sources."""


def _check_tier(tier: str) -> str:
    if tier not in _RANK:
        raise ValueError(f"unknown topology tier {tier!r} (known, fastest first: {', '.join(TIERS)})")
    return tier


def tier_rank(tier: str) -> int:
    """Position of ``tier`` in :data:`TIERS` (0 = ``"nvlink"``, the fastest). ValueError if unknown."""
    return _RANK[_check_tier(tier)]


def tier_at_most(tier: str, limit: str) -> bool:
    """True when ``tier`` is ``limit`` or faster (e.g. ``tier_at_most("node", "switch")`` is True)."""
    return tier_rank(tier) <= tier_rank(limit)


def worst_tier(tiers: Sequence[str]) -> str:
    """The slowest of ``tiers`` (``"nvlink"`` for an empty sequence)."""
    return max(tiers, key=tier_rank, default="nvlink")


def best_tier(tiers: Sequence[str]) -> str:
    """The fastest of ``tiers`` (``"spine"`` for an empty sequence)."""
    return min(tiers, key=tier_rank, default="spine")


class TopologyConfig(BaseModel):
    """Overridable slowdown model: ``factors`` per tier (each in (0, 1]) and ``ring_scaling``.

    ``factors`` may name only some tiers; the others keep :data:`DEFAULT_SPEED_FACTORS`. The result must keep
    the tiers' order (a slower tier never runs faster), else ValueError.

        TopologyConfig(factors={"switch": 0.9, "spine": 0.8})
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    factors: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_SPEED_FACTORS))
    ring_scaling: bool = True

    @field_validator("factors")
    @classmethod
    def _check_factors(cls, value: dict[str, float]) -> dict[str, float]:
        merged = dict(DEFAULT_SPEED_FACTORS)
        for tier, factor in value.items():
            _check_tier(tier)
            if not 0.0 < factor <= 1.0:
                raise ValueError(f"speed factor of tier {tier!r} must be in (0, 1], got {factor!r}")
            merged[tier] = float(factor)
        for faster, slower in zip(TIERS, TIERS[1:], strict=False):
            if merged[slower] > merged[faster]:
                raise ValueError(
                    f"speed factors must not increase from fastest to slowest tier: "
                    f"{faster}={merged[faster]} < {slower}={merged[slower]}"
                )
        return merged


DEFAULT_CONFIG = TopologyConfig()


def _as_config(config: TopologyConfig | Mapping[str, float] | None) -> TopologyConfig:
    if config is None:
        return DEFAULT_CONFIG
    if isinstance(config, TopologyConfig):
        return config
    return TopologyConfig(factors=dict(config))


def speed_factor(
    tier: str, num_gpus: int | None = None, config: TopologyConfig | Mapping[str, float] | None = None
) -> float:
    """Progress rate in (0, 1] of a job of ``num_gpus`` GPUs placed at ``tier`` (1.0 = full speed).

    ``config`` overrides the factors: a :class:`TopologyConfig` or a plain ``{tier: factor}`` dict (merged
    over the defaults, ring scaling on). ``num_gpus`` <= 1 gives 1.0 (no GPU-to-GPU traffic); ``None``
    gives the tier's factor itself; otherwise, with ring scaling, ``1 - (1 - factor) * (n - 1) / n``.

    Raises ValueError for an unknown tier or a negative ``num_gpus``.
    """
    cfg = _as_config(config)
    factor = cfg.factors[_check_tier(tier)]
    if num_gpus is None:
        return factor
    if num_gpus < 0:
        raise ValueError(f"num_gpus must be >= 0, got {num_gpus}")
    if num_gpus <= 1:
        return 1.0
    if not cfg.ring_scaling:
        return factor
    return 1.0 - (1.0 - factor) * (num_gpus - 1) / num_gpus


def slowdown(
    tier: str, num_gpus: int | None = None, config: TopologyConfig | Mapping[str, float] | None = None
) -> float:
    """Same as :func:`speed_factor`: the job's progress rate in (0, 1] at ``tier`` (1.0 = no slowdown).

    Multiply the job's full-speed progress per second by this value; its run time grows by ``1 / value``.
    """
    return speed_factor(tier, num_gpus, config)


def placement_tier(nodes: Sequence[NodeSpec], gpus_per_node: Sequence[int]) -> str:
    """Tier of a placement that puts ``gpus_per_node[i]`` of the job's GPUs on ``nodes[i]``.

    Entries with 0 GPUs are ignored (e.g. a CPU-only member of a gang); a node listed twice counts once
    with the GPUs added up. Rules, in order:

    1. at most one GPU in all: ``"nvlink"`` (no GPU-to-GPU traffic, nothing to slow down);
    2. one node: ``"nvlink"`` if it has an NVLink domain, else ``"node"``;
    3. several nodes sharing one non-empty ``nvlink_domain`` (a multi-node NVLink domain): ``"nvlink"``;
    4. several nodes under one non-empty ``switch``, or (all switches unknown) in one non-empty ``rack``:
       ``"switch"``;
    5. otherwise ``"spine"`` (including nodes whose switch and rack are unknown).

    Raises ValueError when the two sequences differ in length or a count is negative.
    """
    if len(nodes) != len(gpus_per_node):
        raise ValueError(f"{len(nodes)} nodes but {len(gpus_per_node)} GPU counts")
    used: dict[str, NodeSpec] = {}
    total = 0
    for spec, count in zip(nodes, gpus_per_node, strict=True):
        if count < 0:
            raise ValueError(f"negative GPU count {count} on node {spec.name}")
        if count == 0:
            continue
        used.setdefault(spec.name, spec)
        total += count
    if total <= 1:
        return "nvlink"
    return _tier(list(used.values()))


def _tier(specs: Sequence[NodeSpec]) -> str:
    """Tier of GPUs spread over the distinct nodes ``specs`` (at least one), each assumed to hold >= 1 GPU."""
    if len(specs) == 1:
        return "nvlink" if specs[0].nvlink_domain else "node"
    domains = {s.nvlink_domain for s in specs}
    if len(domains) == 1 and "" not in domains:
        return "nvlink"
    switches = {s.switch for s in specs}
    if len(switches) == 1 and "" not in switches:
        return "switch"
    if switches == {""}:
        racks = {s.rack for s in specs}
        if len(racks) == 1 and "" not in racks:
            return "switch"
    return "spine"


def _node_list(state_like: Any) -> Sequence[NodeSpec]:
    nodes = getattr(state_like, "nodes", state_like)
    if not isinstance(nodes, Sequence):
        raise TypeError(f"expected a sequence of NodeSpec or an object with .nodes, got {type(state_like).__name__}")
    return nodes


def tier_of_nodes(
    state_like: Sequence[NodeSpec] | Any, node_indices: Sequence[int], gpus_per_node: Sequence[int] | None = None
) -> str:
    """Tier of a placement on the nodes ``node_indices`` of ``state_like``.

    ``state_like`` is a sequence of :class:`NodeSpec` or anything with a ``.nodes`` sequence of them (e.g.
    :class:`gpupool.cluster.ClusterState`). With ``gpus_per_node`` (one count per index) this is
    :func:`placement_tier`. Without it, the GPU counts are unknown and each listed node is assumed to hold
    at least one of the job's GPUs, and the job to have more than one GPU: a single node gives
    ``"nvlink"`` or ``"node"`` from its NVLink domain (use :func:`speed_factor` with ``num_gpus`` to get
    1.0 for a one-GPU job). Repeated indices count once. An empty ``node_indices`` gives ``"nvlink"``.

    Raises IndexError for an index outside the node list, ValueError on a length mismatch.
    """
    nodes = _node_list(state_like)
    n = len(nodes)
    for i in node_indices:
        if not 0 <= i < n:
            raise IndexError(f"node index {i} outside 0..{n - 1}")
    if gpus_per_node is not None:
        return placement_tier([nodes[i] for i in node_indices], gpus_per_node)
    distinct = list(dict.fromkeys(node_indices))
    if not distinct:
        return "nvlink"
    return _tier([nodes[i] for i in distinct])


@dataclass(frozen=True, slots=True)
class TopologyConstraint:
    """A job's topology requirement, as KAI (``required`` / ``preferred``) and Volcano (``hard`` / ``soft``)
    express it: keep the job's GPUs within ``tier`` (that tier or a faster one).

    * ``mode="required"``: a placement at a slower tier is not allowed (:meth:`allows` is False);
    * ``mode="preferred"``: any placement is allowed, but one within ``tier`` should be chosen when there is
      one (:meth:`satisfied_by` tells which).

    ``TopologyConstraint("required", "switch")``; ValueError for an unknown mode or tier.
    """

    mode: Literal["required", "preferred"]
    tier: Tier

    def __post_init__(self) -> None:
        if self.mode not in ("required", "preferred"):
            raise ValueError(f"topology constraint mode must be 'required' or 'preferred', got {self.mode!r}")
        _check_tier(self.tier)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TopologyConstraint:
        """From ``{"mode": ..., "tier": ...}``."""
        return cls(mode=d["mode"], tier=d["tier"])

    def satisfied_by(self, tier: str) -> bool:
        """True when a placement at ``tier`` keeps within this constraint's tier."""
        return tier_at_most(tier, self.tier)

    def allows(self, tier: str) -> bool:
        """True when a placement at ``tier`` may be used: always for ``preferred``, else :meth:`satisfied_by`."""
        return self.mode == "preferred" or self.satisfied_by(tier)
