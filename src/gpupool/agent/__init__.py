"""gpupool's node agent: GPU discovery, health, stack validation and metrics from NVML, published on the
Kubernetes Node (GPU Feature Discovery labels, a per-GPU inventory annotation, conditions) for the scheduler.

* :mod:`.backend`: the :class:`~gpupool.agent.backend.GpuBackend` interface and its dataclasses;
  :mod:`.nvml` (real GPUs, ``nvidia-ml-py``) and :mod:`.fake` (a YAML/JSON description) implement it;
* :mod:`.report`: what the agent publishes (:class:`~gpupool.agent.report.NodeReport`) and the annotation the
  scheduler reads (:data:`~gpupool.agent.report.ANN_GPU_INVENTORY`).
"""
