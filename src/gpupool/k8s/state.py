"""Facade for one release: the cluster model moved to :mod:`gpupool.k8s.cache` (``records``, ``model``) and its
planning cycle to :func:`gpupool.k8s.cycle.planner.run_cycle`. :class:`ClusterModel` here is the cache's model with
:meth:`~ClusterModel.cycle`, which the live scheduler calls (and tests replace on an instance)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpupool.cluster import ClusterState
from gpupool.k8s.cache import model
from gpupool.k8s.cache.model import KINDS
from gpupool.k8s.cache.records import Assumption, NodeRecord, PodRecord, queue_charge
from gpupool.k8s.cycle.planner import run_cycle


class ClusterModel(model.ClusterModel):
    """:class:`gpupool.k8s.cache.model.ClusterModel` with :meth:`cycle`."""

    def cycle(self, prepare_state: Callable[[ClusterState], Any] | None = None, full_inventory: bool = False,
              ) -> Any:
        """One scheduling cycle on this model: :func:`gpupool.k8s.cycle.planner.run_cycle`."""
        return run_cycle(self, prepare_state, full_inventory)


__all__ = ["ClusterModel", "NodeRecord", "PodRecord", "Assumption", "queue_charge", "KINDS"]
