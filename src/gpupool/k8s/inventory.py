"""Facade for one release: Node -> NodeSpec moved to :mod:`gpupool.k8s.objects.nodes`, bound-pod device accounting to
:mod:`gpupool.k8s.cache.devices`, node eligibility to :mod:`gpupool.k8s.cache.eligibility` and :func:`build_state`
to :mod:`gpupool.k8s.cache.model`."""

from gpupool.k8s.cache.devices import (
    InventoryInfo,
    NoUsableNodeError,
    annotated_devices,
    count_bound_pod,
    lowest_free_devices,
    named_devices,
    slices_to_request,
)
from gpupool.k8s.cache.eligibility import (
    ConstrainedRequest,
    Constraints,
    Eligibility,
    constraints_of,
    matches_node_selector_term,
    node_ready,
    tolerates,
)
from gpupool.k8s.cache.model import build_state
from gpupool.k8s.objects.nodes import (  # noqa: F401
    UNKNOWN_GPU_MODEL,
    NodeParseError,
    RegisteredGpu,
    agent_marked,
    check_node_shape,
    hami_registered_gpus,
    mig_capacity,
    mig_strategy,
    node_name,
    node_spec_from_node,
)

__all__ = [
    "node_spec_from_node", "build_state", "mig_capacity", "mig_strategy", "InventoryInfo", "NodeParseError",
    "annotated_devices", "lowest_free_devices", "count_bound_pod", "named_devices", "slices_to_request",
    "hami_registered_gpus", "RegisteredGpu", "node_ready", "tolerates",
    "matches_node_selector_term", "Constraints", "constraints_of", "ConstrainedRequest", "Eligibility",
    "UNKNOWN_GPU_MODEL", "NoUsableNodeError", "check_node_shape", "node_name",
]
