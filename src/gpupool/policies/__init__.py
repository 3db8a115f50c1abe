"""Placement policies, one per module; :data:`REGISTRY` maps each name to its class."""

from __future__ import annotations

from gpupool.engine.core import Policy
from gpupool.policies import fgd_compiled  # noqa: F401  (registers FGD's compiled scorer on import)
from gpupool.policies.best_fit import BestFit
from gpupool.policies.dot_product import DotProduct
from gpupool.policies.fgd import FGD
from gpupool.policies.gpu_clustering import GpuClustering
from gpupool.policies.gpu_packing import GpuPacking
from gpupool.policies.gpupool_policy import GpupoolCombined, GpupoolPolicy
from gpupool.policies.k8s_default import K8sDefault
from gpupool.policies.load_aware import LoadAware
from gpupool.policies.lowest_power import LowestPower
from gpupool.policies.random_policy import RandomPolicy
from gpupool.policies.round_robin import RoundRobin
from gpupool.policies.single_node import SingleNode
from gpupool.policies.spread import Spread

REGISTRY: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        RoundRobin, SingleNode, LowestPower, RandomPolicy, K8sDefault,
        BestFit, Spread, DotProduct, GpuPacking, GpuClustering, FGD, GpupoolPolicy, GpupoolCombined, LoadAware,
    )
}

BASELINES = ("round-robin", "single-node", "lowest-power", "random", "k8s-default")
DEFAULT_POLICY = "gpupool"


def make_policy(name: str) -> Policy:
    """A fresh policy instance by name; raises KeyError listing the known names."""
    try:
        return REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(REGISTRY)}") from None


__all__ = ["REGISTRY", "BASELINES", "DEFAULT_POLICY", "make_policy", "Policy"]
