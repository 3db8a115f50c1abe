"""kube-scheduler's cache for gpupool: typed records changed by watch events, assume/forget, the books of
bound pods, node eligibility and queue use. Imports :mod:`gpupool.k8s.objects`, never :mod:`gpupool.k8s.cycle`."""
