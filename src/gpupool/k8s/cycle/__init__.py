"""One planning cycle, no I/O: the cache -> a :class:`~gpupool.k8s.cycle.plan.Plan`. Imports
:mod:`gpupool.k8s.cache` and :mod:`gpupool.k8s.objects`."""
