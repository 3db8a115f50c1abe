"""Kubernetes drivers: translate Kubernetes objects to the engine's types and carry out its decisions.

The engine (:mod:`gpupool.engine`) does no I/O; these modules are the only place that knows the
Kubernetes spellings. Every label, annotation and resource name gpupool reads or writes is a constant
here, so the scheduler, the extender and the tests agree on one spelling (sources: the public docs and
source of NVIDIA KAI-Scheduler, HAMi, Volcano, Kueue, kubernetes-sigs/scheduler-plugins, NVIDIA
k8s-device-plugin / GPU Feature Discovery, dcgm-exporter and Alibaba's FGD simulator).

Layers, each importing only those below it (docs/architecture.md; checked by ``lint-imports``):

* :mod:`gpupool.k8s.scheduler`, :mod:`~gpupool.k8s.extender`, :mod:`~gpupool.k8s.autoscaler` and their CLIs:
  the components (the live scheduler's loop: list/watch, bind, events, conditions);
* :mod:`gpupool.k8s.cycle`: one planning cycle, no I/O (``plan``, ``units``, ``planner``: the cycle shared by
  the live scheduler and ``gpupool scheduler --dry-run``; ``pool``: the pool scheduler's driver);
* :mod:`gpupool.k8s.cache`: kube-scheduler's cache (records changed by events, assume/forget, the
  :class:`~gpupool.cluster.ClusterState` with the pods already bound counted, node eligibility), beside
  :mod:`gpupool.k8s.api` (talks to the API server: watch, calls, client, events, status, leader election);
* :mod:`gpupool.k8s.objects`: Kubernetes objects to values, parsed once (a pod -> :class:`~gpupool.model.PodRequest`,
  its gang and queue; a node -> :class:`~gpupool.model.NodeSpec`; the snapshot file format);
  :class:`~gpupool.k8s.objects.fields.RequestParseError` names the field at fault.

``requests``, ``inventory``, ``snapshot``, ``state``, ``pool``, ``wire``, ``events``, ``status`` and ``leader`` at
this level are facades for one release over the modules that now hold their names.
"""

from __future__ import annotations

# ------------------------------------------------------------------ what gpupool writes on a pod
ANNOTATION_PREFIX = "gpupool.io/"
ANN_NODE = "gpupool.io/node"
"""Node the devices below belong to; a reader trusts the other keys only when it equals ``spec.nodeName``."""
ANN_GPU_INDEX = "gpupool.io/gpu-index"
"""Device indices on the node, comma-separated (``"0,1"``); empty for a pod without GPUs."""
ANN_GPU_MILLI = "gpupool.io/gpu-milli"
"""milli-GPU taken on each listed device (``"250"`` = a quarter GPU; ``"1000"`` = whole GPUs)."""
ANN_GPU_MEMORY = "gpupool.io/gpu-memory"
"""GPU memory (MiB) reserved on each listed device; ``"0"`` when the GPU model's memory is unknown."""
ANN_MIG = "gpupool.io/mig"
"""MIG devices counted for the pod, ``profile=count`` comma-separated (``"1g.10gb=1"``)."""

WRITTEN_ANNOTATIONS = (ANN_NODE, ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_GPU_MEMORY, ANN_MIG)

# ------------------------------------------------------------------ what gpupool reads on a pod
# Whole GPUs and MIG devices (NVIDIA device plugin)
RES_GPU = "nvidia.com/gpu"
RES_MIG_PREFIX = "nvidia.com/mig-"
# HAMi (limits)
RES_HAMI_GPUMEM = "nvidia.com/gpumem"
RES_HAMI_GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
RES_HAMI_GPUCORES = "nvidia.com/gpucores"
# Volcano vGPU (limits)
RES_VOLCANO_VGPU_NUMBER = "volcano.sh/vgpu-number"
RES_VOLCANO_VGPU_MEMORY = "volcano.sh/vgpu-memory"
RES_VOLCANO_VGPU_CORES = "volcano.sh/vgpu-cores"
# KAI (annotations)
ANN_KAI_FRACTION = "gpu-fraction"
ANN_KAI_MEMORY = "gpu-memory"
ANN_KAI_NUM_DEVICES = "gpu-fraction-num-devices"
# Alibaba FGD simulator (annotations)
ANN_ALIBABA_GPU_MILLI = "alibabacloud.com/gpu-milli"
ANN_ALIBABA_GPU_COUNT = "alibabacloud.com/gpu-count"
# gpupool's own request annotation: allowed GPU models, comma-separated catalog names or GFD products
ANN_GPU_MODEL = "gpupool.io/gpu-model"
# HAMi (and Volcano vGPU, same keys) GPU type selection: comma-separated, case-insensitive substrings of the
# GPU type (product) name; the pod uses only GPUs matching one of use-gputype, and none matching nouse-gputype
ANN_HAMI_USE_GPUTYPE = "nvidia.com/use-gputype"
ANN_HAMI_NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
# What HAMi writes on a pod it scheduled: the node, and the devices per container
# ("UUID,Type,usedmem,usedcores:" per device, containers separated by ";")
ANN_HAMI_NODE = "hami.io/vgpu-node"
ANN_HAMI_DEVICES_ALLOCATED = "hami.io/vgpu-devices-allocated"
ANN_HAMI_DEVICES_TO_ALLOCATE = "hami.io/vgpu-devices-to-allocate"
# ... and what its Bind adds (pkg/util/types.go), and the node lock its device plugin reads and releases
# (pkg/util/nodelock/nodelock.go); gpupool writes them all with --share-enforcement hami (objects/hami.py)
ANN_HAMI_TIME = "hami.io/vgpu-time"
ANN_HAMI_BIND_PHASE = "hami.io/bind-phase"
ANN_HAMI_BIND_TIME = "hami.io/bind-time"
ANN_HAMI_NODE_LOCK = "hami.io/mutex.lock"

# Gangs
LABEL_POD_GROUP = "scheduling.x-k8s.io/pod-group"  # scheduler-plugins coscheduling
ANN_VOLCANO_GROUP = "scheduling.k8s.io/group-name"  # Volcano
ANN_VOLCANO_GROUP_ALT = "scheduling.volcano.sh/group-name"
ANN_KAI_POD_GROUP = "pod-group-name"  # KAI
ANN_MIN_MEMBER = "gpupool.io/min-member"  # fallback when no PodGroup object exists
ANN_KAI_MIN_MEMBER = "kai.scheduler/batch-min-member"

# Queues
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
LABEL_KAI_QUEUE = "kai.scheduler/queue"
LABEL_RUNAI_QUEUE = "runai/queue"  # KAI's older spelling
ANN_VOLCANO_QUEUE = "scheduling.volcano.sh/queue-name"

# ------------------------------------------------------------------ what gpupool reads on a node
LABEL_GPU_PRODUCT = "nvidia.com/gpu.product"
LABEL_GPU_COUNT = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY = "nvidia.com/gpu.memory"
LABEL_GPU_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_GPU_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_MIG_STRATEGY = "nvidia.com/mig.strategy"
LABEL_GPU_CLIQUE = "nvidia.com/gpu.clique"
# HAMi's node registration: the node's GPUs in device order, each with its UUID, split count, memory, cores,
# type and health (JSON list of objects in HAMi >= 2.4, "UUID,count,mem,cores,type,numa,health:" before)
ANN_HAMI_NODE_REGISTER = "hami.io/node-nvidia-register"
LABEL_ALIBABA_MODEL = "alibabacloud.com/gpu-card-model"
LABEL_RACK = "topology.gpupool.io/rack"
LABEL_SWITCH = "topology.gpupool.io/switch"
LABEL_NVLINK_DOMAIN = "topology.gpupool.io/nvlink-domain"

# ------------------------------------------------------------------ custom resources
POD_GROUP_API = ("scheduling.x-k8s.io", "v1alpha1", "podgroups")
"""scheduler-plugins coscheduling ``PodGroup`` (namespaced; ``spec.minMember``)."""
VOLCANO_POD_GROUP_API = ("scheduling.volcano.sh", "v1beta1", "podgroups")
"""Volcano ``PodGroup`` (namespaced; ``spec.minMember``, ``spec.queue``)."""
QUEUE_API = ("gpupool.io", "v1alpha1", "queues")
"""gpupool's ``Queue`` (cluster-scoped; ``spec.quota``, ``spec.limit``, ``spec.weight``, ``spec.parent``)."""
# Dynamic Resource Allocation (Kubernetes 1.34+: GA, resource.k8s.io/v1)
DRA_SLICE_API = ("resource.k8s.io", "v1", "resourceslices")
DRA_CLASS_API = ("resource.k8s.io", "v1", "deviceclasses")
DRA_CLAIM_API = ("resource.k8s.io", "v1", "resourceclaims")

DEFAULT_SCHEDULER_NAME = "gpupool"

# ------------------------------------------------------------------ what enforces a GPU share on a node
SHARE_ENFORCEMENT_MODES = ("none", "hami", "trust")
"""``--share-enforcement`` / ``shareEnforcement``: ``none`` (default) places no GPU share (less than a whole GPU,
or a GPU memory cap) on a device-plugin node, since nothing there would hand over the GPU gpupool chose or cap
the pod; ``hami`` places shares on nodes where HAMi's device plugin registered (``hami.io/node-nvidia-register``)
and writes the annotations it reads; ``trust`` places shares anywhere and writes only ``gpupool.io/*`` (the
operator vouches that something else enforces them)."""

__all__ = [name for name in dir() if name.isupper()]
