"""Facade for one release: reading pods moved to :mod:`gpupool.k8s.objects` (``fields``: accessors, shape checks,
quantities; ``gpu_asks``: the GPU spellings; ``pods``: :func:`describe_pod`, gangs and queues)."""

from gpupool.k8s.objects.fields import (  # noqa: F401
    MIB,
    MIG_PROFILE,
    RequestParseError,
    annotations_of,
    check_pod_shape,
    check_selector_terms,
    is_terminal,
    is_waiting_for,
    labels_of,
    node_name_of,
    object_key,
    parse_time,
    pod_key,
    pod_resources,
    spec_unreadable,
)
from gpupool.k8s.objects.gpu_asks import GpuAsk, gpu_ask, gpu_spec_of, gpu_types_of
from gpupool.k8s.objects.pods import (
    PodInfo,
    QueueSpec,
    describe_pod,
    hami_devices,
    min_member_of,
    parse_pod,
    parse_pod_group,
    parse_queue,
    pod_group_of,
    queue_of,
)

__all__ = [
    "RequestParseError", "PodInfo", "QueueSpec", "GpuAsk",
    "parse_pod", "describe_pod", "pod_key", "pod_group_of", "queue_of", "min_member_of",
    "parse_pod_group", "parse_queue", "pod_resources", "gpu_ask", "gpu_spec_of", "gpu_types_of", "hami_devices",
    "annotations_of", "labels_of", "node_name_of", "is_terminal", "is_waiting_for", "parse_time",
    "check_pod_shape", "check_selector_terms", "object_key", "spec_unreadable",
]
