"""``gpupool autoscaler``: a Kubernetes controller that scales GPU inference services from Prometheus metrics.

A namespaced ``GpuAutoscaler`` (``gpupool.io/v1alpha1``, CRD in ``deploy/autoscaler/``) names a Deployment or
StatefulSet (``spec.scaleTargetRef``), the metrics to scale on (each a PromQL instant query with a per-replica
target), ``minReplicas`` / ``maxReplicas``, HPA v2 ``behavior``, Knative's panic window, KEDA's cooldown, and a
``slicePolicy`` (which GPU slice each replica gets). The controller (:mod:`.controller`) lists and watches the
GpuAutoscalers, and every sync period per object: reads the target's ``scale`` subresource, runs the queries
(:mod:`.prometheus`), asks :class:`gpupool.engine.autoscale.Recommender` for the replica count (and
:class:`gpupool.engine.rightsize.RightSizer` for the slice), writes ``scale.spec.replicas``, posts an Event and
writes the object's status. Spec parsing and default queries: :mod:`.crd`. CLI: :mod:`.cli`.
"""

from __future__ import annotations

GROUP = "gpupool.io"
VERSION = "v1alpha1"
PLURAL = "gpuautoscalers"
KIND = "GpuAutoscaler"
API = (GROUP, VERSION, PLURAL)
API_VERSION = f"{GROUP}/{VERSION}"
COMPONENT = "gpupool-autoscaler"
"""``source.component`` of the Events, the default Lease name and the ServiceAccount in deploy/autoscaler/."""

__all__ = ["API", "API_VERSION", "COMPONENT", "GROUP", "KIND", "PLURAL", "VERSION"]
