"""gpupool's node agent: GPU discovery, health, stack validation and metrics from NVML, published on the
Kubernetes Node (GPU Feature Discovery labels, a per-GPU inventory annotation, conditions) for the scheduler.

* :mod:`.backend`: the :class:`~gpupool.agent.backend.GpuBackend` interface and its dataclasses;
  :mod:`.nvml` (real GPUs, ``nvidia-ml-py``) and :mod:`.fake` (a YAML/JSON description) implement it;
* :mod:`gpupool.k8s.objects.agent_report` (the agent <-> scheduler contract; ``.report`` is its facade): what the
  agent publishes (:class:`~gpupool.k8s.objects.agent_report.NodeReport`) and the annotation the scheduler reads
  (:data:`~gpupool.k8s.objects.agent_report.ANN_GPU_INVENTORY`).
"""
