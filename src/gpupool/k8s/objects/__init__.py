"""Kubernetes API objects (plain dicts) -> typed values, parsed once; no state, no I/O but reading a snapshot
file. Imports only :mod:`gpupool.k8s` conventions and the domain (model, catalog, cluster, engine filters)."""
