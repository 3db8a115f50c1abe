"""The ``GpuAutoscaler`` custom resource: its spec read into typed settings, the default queries, the slice patch.

``spec`` (CRD: ``deploy/autoscaler/gpuautoscalers.gpupool.io.yaml``; an example: ``examples/autoscale/``)::

    scaleTargetRef: {apiVersion: apps/v1, kind: Deployment | StatefulSet, name: NAME}
    minReplicas: 1            # 0: scale to zero (KEDA semantics: activation thresholds, cooldownPeriod)
    maxReplicas: 10
    metrics:                  # several: the highest proposal wins (HPA)
      - name: concurrency     # one of gpupool.engine.autoscale.METRICS
        target: 8             # per replica (gpu_util / tensor_active / cpu_util: percent; latency: seconds)
        activation: 0         # KEDA activationThreshold (from zero only when the value is above it)
        query: PROMQL         # optional: DEFAULT_QUERIES[name]; ${namespace} ${name} ${pods} are substituted
                              # (gpu_util by default: DCGM_FI_DEV_GPU_UTIL per whole GPU, 100 x
                              # DCGM_FI_PROF_GR_ENGINE_ACTIVE per MIG instance: DEFAULT_INSTANCE_QUERIES)
        reduce: sum           # optional: how several series become one value (sum | avg | max | min)
    tolerance: 0.1
    behavior: {scaleUp: {...}, scaleDown: {...}}     # HPA v2 (autoscaling/v2 HorizontalPodAutoscalerBehavior)
    panicWindowSeconds: 6     # Knative panic mode (on concurrency); absent: off
    cooldownPeriod: 300       # KEDA: seconds below activation before 1 -> 0
    slicePolicy: {gpuModel: H200, allowed: [...], hysteresis: 0.2, minDwellSeconds: 600,
                  demandMetric: rps, capacityPerReplica: {SLICE: load one replica serves}, memoryMiB: 40000,
                  container: NAME, apply: false}

Errors are :class:`SpecError` naming the field (``spec.metrics[1].target: must be > 0``), so a bad object gets a
``ScalingActive=False / InvalidSpec`` condition and a Warning Event with the field, and the others go on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from string import Template
from typing import Any

from gpupool.k8s.autoscaler import API_VERSION, KIND

TARGET_KINDS = {"Deployment": "apps/v1", "StatefulSet": "apps/v1"}
"""Kinds whose ``scale`` subresource the controller drives (the API group each must be in)."""

# Per-pod selection that needs nothing but the target's name: a Deployment's pods are NAME-<template hash>-<suffix>,
# a StatefulSet's NAME-<ordinal>. dcgm-exporter (pod mapping on) and a kubernetes_sd scrape label series with
# `namespace` and `pod`.
POD_REGEX = {"Deployment": "${name}-[a-z0-9]+-[a-z0-9]+", "StatefulSet": "${name}-[0-9]+"}
_SEL = 'namespace="${namespace}",pod=~"${pods}"'
DEFAULT_QUERIES: dict[str, str] = {
    # vLLM's /metrics (vllm/engine/metrics.py): requests running / waiting per engine, request counter, e2e histogram
    "concurrency": "sum(vllm:num_requests_running{" + _SEL + "})",
    "queue_depth": "sum(vllm:num_requests_waiting{" + _SEL + "})",
    "rps": "sum(rate(vllm:request_success_total{" + _SEL + "}[1m]))",
    "latency_p95_s": "histogram_quantile(0.95, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{"
                     + _SEL + "}[1m])))",
    "latency_p99_s": "histogram_quantile(0.99, sum by (le) (rate(vllm:e2e_request_latency_seconds_bucket{"
                     + _SEL + "}[1m])))",
    # dcgm-exporter (etc/default-counters.csv): GPU utilisation in percent, per GPU (the controller averages the
    # series; those of MIG instances come from DEFAULT_INSTANCE_QUERIES); tensor pipe activity as a 0..1 ratio
    "gpu_util": "DCGM_FI_DEV_GPU_UTIL{" + _SEL + "}",
    "tensor_active": "100 * avg(DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{" + _SEL + "})",
    # cAdvisor CPU seconds over kube-state-metrics' CPU requests: percent of the request, as the HPA's cpu metric
    "cpu_util": "100 * sum(rate(container_cpu_usage_seconds_total{" + _SEL + ',container!=""}[1m])) / '
                "sum(kube_pod_container_resource_requests{" + _SEL + ',resource="cpu"})',
}
"""PromQL per metric name (``${namespace}``, ``${name}`` of the target, ``${pods}``: a regex of its pod names)."""

DEFAULT_INSTANCE_QUERIES: dict[str, str] = {
    # dcgm-exporter #216 (DCGM #80): DCGM_FI_DEV_GPU_UTIL reads 0 on MIG instances; the profiling metric of the
    # graphics engine is per GPU instance (label GPU_I_ID), a 0..1 ratio
    "gpu_util": "100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{" + _SEL + ',GPU_I_ID!=""}',
}
"""PromQL per metric name for the pods that run on MIG instances: with the default query of a metric named here, the
controller reads the series of MIG instances (``GPU_I_ID`` set) from this one and those of whole GPUs from the
default (:func:`gpupool.k8s.autoscaler.prometheus.per_instance`)."""

DEFAULT_REDUCE = {"concurrency": "sum", "queue_depth": "sum", "rps": "sum", "latency_p95_s": "max",
                  "latency_p99_s": "max", "gpu_util": "avg", "tensor_active": "avg", "cpu_util": "avg"}
"""How a query answering several series is made one value: totals add up, percentages average, latency takes the
worst (the recommender wants totals for concurrency / queue_depth / rps and per-replica averages for the rest)."""

ENGINE_KEYS = ("minReplicas", "maxReplicas", "tolerance", "behavior", "panicWindowSeconds", "stableWindowSeconds",
               "panicThreshold", "cooldownPeriod")
"""Spec fields handed as they are to :meth:`gpupool.engine.autoscale.AutoscalerSpec.from_mapping`."""

SLICE_ANNOTATION = "gpupool.io/slice"
"""Pod-template annotation naming the slice the controller applied (read back: nothing is patched twice)."""
FRACTION_ANNOTATION = "gpu-fraction"  # KAI's spelling, read by gpupool (gpupool.k8s.requests)
RES_GPU = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"


class SpecError(ValueError):
    """A GpuAutoscaler spec gpupool cannot use; ``field`` is its path (``spec.metrics[0].target``)."""

    def __init__(self, field_path: str, message: str) -> None:
        self.field = field_path
        super().__init__(f"{field_path}: {message}")


@dataclass(frozen=True)
class TargetRef:
    api_version: str
    kind: str
    name: str

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass(frozen=True)
class MetricQuery:
    """One metric: its name (engine METRICS), the PromQL sent (placeholders filled), target, activation, reducer;
    ``instance_query``: the PromQL read for MIG instances instead of ``query``'s series of them ("" = none:
    a query the user wrote is taken as it is)."""

    name: str
    query: str
    target: float
    activation: float = 0.0
    reduce: str = "sum"
    instance_query: str = ""


@dataclass(frozen=True)
class SlicePolicy:
    """``spec.slicePolicy``. ``capacity``: slice name -> load one replica on it serves within the SLO, in the unit
    of ``demand_metric``; ``memory_mib``: memory one replica needs (MiB); ``apply``: patch the target's pod template
    (this rolls its pods); ``container``: the container whose limits are patched (None: the first)."""

    gpu_model: str
    demand_metric: str
    capacity: Mapping[str, float]
    allowed: tuple[str, ...] = ()
    hysteresis: float = 0.2
    min_dwell_s: float = 600.0
    memory_mib: int = 0
    container: str | None = None
    apply: bool = False


@dataclass(frozen=True)
class GpuAutoscalerConfig:
    """A GpuAutoscaler read: where it is, what it scales, how (``engine_spec``: the recommender's settings)."""

    namespace: str
    name: str
    uid: str
    generation: int
    target: TargetRef
    metrics: tuple[MetricQuery, ...]
    engine_spec: Any  # gpupool.engine.autoscale.AutoscalerSpec
    min_replicas: int
    max_replicas: int
    slice_policy: SlicePolicy | None = None
    raw_spec: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _num(value: Any, where: str, *, minimum: float | None = None, positive: bool = False,
         integer: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SpecError(where, f"expected a number, got {value!r}")
    try:
        finite = math.isfinite(float(value))
    except OverflowError:  # an int past float range (YAML/JSON allow 10**400)
        finite = False
    if not finite:
        raise SpecError(where, f"expected a finite number, got {str(value)[:40]}")
    if integer and float(value) != int(value):
        raise SpecError(where, f"expected a whole number, got {value!r}")
    if positive and value <= 0:
        raise SpecError(where, f"must be > 0, got {value!r}")
    if minimum is not None and value < minimum:
        raise SpecError(where, f"must be >= {minimum:g}, got {value!r}")
    return float(value)


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(where, f"expected a mapping, got {type(value).__name__}")
    return value


def pod_regex(target: TargetRef) -> str:
    """A PromQL regex (as written inside a double-quoted PromQL string) of the target's pod names."""
    # Kubernetes names hold [a-z0-9.-]; only '.' is special in a regex, written \\. inside a PromQL string
    return Template(POD_REGEX[target.kind]).safe_substitute(name=target.name.replace(".", "\\\\."))


def render_query(template: str, namespace: str, target: TargetRef) -> str:
    """``template`` with ``${namespace}``, ``${name}``, ``${kind}``, ``${pods}`` filled (other ``$`` text kept)."""
    return Template(template).safe_substitute(namespace=namespace, name=target.name, kind=target.kind,
                                              pods=pod_regex(target))


def _metrics_known() -> tuple[str, ...]:
    from gpupool.engine.autoscale import METRICS

    return tuple(METRICS)


def parse_target(spec: Mapping[str, Any]) -> TargetRef:
    ref = _map(spec.get("scaleTargetRef"), "spec.scaleTargetRef")
    if not ref:
        raise SpecError("spec.scaleTargetRef", "required (apiVersion, kind, name of a Deployment or StatefulSet)")
    kind, name = ref.get("kind"), ref.get("name")
    api_version = str(ref.get("apiVersion") or TARGET_KINDS.get(str(kind), ""))
    if not isinstance(kind, str) or kind not in TARGET_KINDS:
        raise SpecError("spec.scaleTargetRef.kind", f"{kind!r}: gpupool scales {' and '.join(TARGET_KINDS)}")
    if api_version != TARGET_KINDS[kind]:
        raise SpecError("spec.scaleTargetRef.apiVersion", f"{api_version!r}: a {kind} is {TARGET_KINDS[kind]}")
    if not isinstance(name, str) or not name:
        raise SpecError("spec.scaleTargetRef.name", "required")
    return TargetRef(api_version, str(kind), name)


def parse_metrics(spec: Mapping[str, Any], namespace: str, target: TargetRef) -> tuple[MetricQuery, ...]:
    raw = spec.get("metrics")
    if not isinstance(raw, list) or not raw:
        raise SpecError("spec.metrics", "at least one metric is needed (name, target)")
    known = _metrics_known()
    out, seen = [], set()
    for i, m in enumerate(raw):
        where = f"spec.metrics[{i}]"
        m = _map(m, where)
        name = m.get("name")
        if name not in known:
            raise SpecError(f"{where}.name", f"{name!r}: expected one of {', '.join(known)}")
        if name in seen:
            raise SpecError(f"{where}.name", f"{name!r} given twice")
        seen.add(name)
        raw_target = m.get("target")
        if isinstance(raw_target, Mapping):  # HPA v2 MetricTarget spelling: {averageValue: 8}
            key = next((k for k in ("averageValue", "value", "averageUtilization") if k in raw_target), None)
            if key is None:
                raise SpecError(f"{where}.target", "expected a number or {averageValue: N}")
            raw_target = raw_target[key]
        target_value = _num(raw_target, f"{where}.target", positive=True)
        activation = _num(m.get("activation", 0.0), f"{where}.activation", minimum=0)
        query = m.get("query") or DEFAULT_QUERIES.get(name)
        instance = "" if m.get("query") else DEFAULT_INSTANCE_QUERIES.get(name, "")
        if not isinstance(query, str) or not query.strip():
            raise SpecError(f"{where}.query", "expected PromQL text")
        reduce = m.get("reduce") or DEFAULT_REDUCE.get(name, "sum")
        if reduce not in ("sum", "avg", "max", "min"):
            raise SpecError(f"{where}.reduce", f"{reduce!r}: expected sum, avg, max or min")
        out.append(MetricQuery(name, render_query(query, namespace, target), target_value, activation, reduce,
                               render_query(instance, namespace, target) if instance else ""))
    return tuple(out)


def parse_slice_policy(spec: Mapping[str, Any], metrics: Sequence[MetricQuery]) -> SlicePolicy | None:
    raw = spec.get("slicePolicy")
    if raw is None:
        return None
    sp = _map(raw, "spec.slicePolicy")
    where = "spec.slicePolicy"
    gpu_model = sp.get("gpuModel")
    if not isinstance(gpu_model, str) or not gpu_model:
        raise SpecError(f"{where}.gpuModel", "required (e.g. H200)")
    names = [m.name for m in metrics]
    demand = sp.get("demandMetric") or next((n for n in ("rps", "concurrency") if n in names), None)
    if demand not in names:
        raise SpecError(f"{where}.demandMetric", f"{demand!r}: must be one of spec.metrics ({', '.join(names)})")
    cap = _map(sp.get("capacityPerReplica"), f"{where}.capacityPerReplica")
    if not cap:
        raise SpecError(f"{where}.capacityPerReplica", "required: slice name -> load one replica on it serves")
    capacity = {str(k): _num(v, f"{where}.capacityPerReplica.{k}", positive=True) for k, v in cap.items()}
    allowed = sp.get("allowed") or []
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise SpecError(f"{where}.allowed", "expected a list of slice names")
    hysteresis = _num(sp.get("hysteresis", 0.2), f"{where}.hysteresis", minimum=0)
    if hysteresis >= 1:  # the RightSizer refuses it: an InvalidSpec here, not a failed reconcile each period
        raise SpecError(f"{where}.hysteresis", f"a fraction within [0, 1) expected (0.2 = 20 %), got {hysteresis:g}")
    dwell = _num(sp.get("minDwellSeconds", 600), f"{where}.minDwellSeconds", minimum=0)
    memory = int(_num(sp.get("memoryMiB", 0), f"{where}.memoryMiB", minimum=0, integer=True))
    container = sp.get("container")
    if container is not None and not isinstance(container, str):
        raise SpecError(f"{where}.container", f"expected a container name, got {container!r}")
    apply = sp.get("apply", False)
    if not isinstance(apply, bool):
        raise SpecError(f"{where}.apply", f"expected true or false, got {apply!r}")
    policy = SlicePolicy(gpu_model, str(demand), capacity, tuple(allowed), hysteresis, dwell, memory, container,
                         apply)
    options = slice_options(policy)  # the names must exist in the catalog
    if memory and not any(o.memory_mib >= memory for o in options):
        biggest = max(options, key=lambda o: o.memory_mib)
        raise SpecError(f"{where}.memoryMiB", f"{memory} MiB: no allowed slice with a capacity has that much "
                                              f"(largest: {biggest.name}, {biggest.memory_mib} MiB)")
    return policy


def slice_options(policy: SlicePolicy) -> tuple[Any, ...]:
    """The catalog's slices of ``policy.gpu_model`` that are allowed and have a capacity; raises SpecError naming
    an unknown slice or model."""
    from gpupool.engine.rightsize import slice_catalog

    where = "spec.slicePolicy"
    try:
        catalog = tuple(slice_catalog(policy.gpu_model))
    except (KeyError, ValueError) as exc:
        raise SpecError(f"{where}.gpuModel", f"{policy.gpu_model!r}: {exc}") from None
    names = {o.name for o in catalog}
    for name in (*policy.allowed, *policy.capacity):
        if name not in names:
            raise SpecError(f"{where}", f"slice {name!r} is not in the {policy.gpu_model} catalog "
                                        f"({', '.join(sorted(names))})")
    options = tuple(o for o in catalog if (not policy.allowed or o.name in policy.allowed)
                    and o.name in policy.capacity)
    if not options:
        raise SpecError(f"{where}.capacityPerReplica", "no allowed slice has a capacity")
    return options


def parse_gpu_autoscaler(obj: Mapping[str, Any]) -> GpuAutoscalerConfig:
    """Read a GpuAutoscaler (the API object as a dict). Raises :class:`SpecError` naming the bad field."""
    from gpupool.engine.autoscale import AutoscalerSpec

    if not isinstance(obj, Mapping):
        raise SpecError("(object)", f"expected a GpuAutoscaler mapping, got {type(obj).__name__}")
    if obj.get("apiVersion") not in (None, API_VERSION) or obj.get("kind") not in (None, KIND):
        raise SpecError("apiVersion", f"{obj.get('apiVersion')}/{obj.get('kind')} is not a {API_VERSION} {KIND}")
    meta = _map(obj.get("metadata"), "metadata")
    spec = _map(obj.get("spec"), "spec")
    namespace = str(meta.get("namespace") or "default")
    target = parse_target(spec)
    metrics = parse_metrics(spec, namespace, target)
    engine_in: dict[str, Any] = {k: spec[k] for k in ENGINE_KEYS if k in spec}
    engine_in["metrics"] = [{"name": m.name, "target": m.target, "activation": m.activation} for m in metrics]
    try:
        engine_spec = AutoscalerSpec.from_mapping(engine_in)
    except SpecError:
        raise
    except (ValueError, TypeError, KeyError) as exc:
        text = str(exc)  # "spec.field: why" or "spec: why" (about several fields): not "spec: spec: why"
        field, _, why = text.partition(": ")
        if field.startswith("spec") and why:
            raise SpecError(field, why) from None
        raise SpecError("spec", text) from None
    slice_policy = parse_slice_policy(spec, metrics)
    return GpuAutoscalerConfig(namespace, str(meta.get("name") or ""), str(meta.get("uid") or ""),
                               int(meta.get("generation") or 0), target, metrics, engine_spec,
                               int(engine_spec.min_replicas), int(engine_spec.max_replicas), slice_policy, spec)


# ------------------------------------------------------------------ slice -> pod template
def slice_template_patch(option: Any, template: Mapping[str, Any], container: str | None = None) -> dict[str, Any]:
    """A strategic-merge patch of a Deployment / StatefulSet giving each replica ``option``'s GPU slice.

    ``option``: a :class:`gpupool.engine.rightsize.SliceOption`; ``template``: the target's ``spec.template``.
    ``mig`` -> limit ``nvidia.com/mig-<name>: 1``; ``whole`` -> ``nvidia.com/gpu: <count>``; ``timeslice`` -> the
    pod annotation ``gpu-fraction`` (KAI's spelling, which gpupool schedules), no GPU resource. The other GPU
    resources and the annotation are removed (``null``), and ``gpupool.io/slice`` names what was applied.
    Raises :class:`SpecError` when the container is not in the template.
    """
    containers = ((template.get("spec") or {}).get("containers")) or []
    if not containers:
        raise SpecError("spec.scaleTargetRef", "the target's pod template has no container")
    names = [c.get("name") for c in containers]
    name = container or names[0]
    if name not in names:
        raise SpecError("spec.slicePolicy.container", f"{name!r} is not a container of the target ({', '.join(names)})")
    current = next(c for c in containers if c.get("name") == name).get("resources") or {}
    gpu_keys = {k for part in ("limits", "requests") for k in (current.get(part) or {})
                if k == RES_GPU or k.startswith(MIG_PREFIX)}
    want: dict[str, str] = {}
    annotations: dict[str, str | None] = {SLICE_ANNOTATION: option.name, FRACTION_ANNOTATION: None}
    if option.kind == "mig":
        want[MIG_PREFIX + option.name] = "1"
    elif option.kind == "whole":
        want[RES_GPU] = str(max(1, int(round(option.gpu_fraction))))
    elif option.kind == "timeslice":
        annotations[FRACTION_ANNOTATION] = f"{option.gpu_fraction:g}"
    else:
        raise SpecError("spec.slicePolicy", f"slice kind {option.kind!r} unknown")
    limits: dict[str, str | None] = {k: None for k in gpu_keys}
    limits.update(want)
    resources: dict[str, Any] = {"limits": limits}
    if any(k in (current.get("requests") or {}) for k in gpu_keys):
        # extended resources: requests must equal limits; drop the old keys from requests, set the new ones
        resources["requests"] = {**{k: None for k in gpu_keys if k in (current.get("requests") or {})}, **want}
    return {"spec": {"template": {"metadata": {"annotations": annotations},
                                  "spec": {"containers": [{"name": name, "resources": resources}]}}}}


__all__ = ["DEFAULT_INSTANCE_QUERIES", "DEFAULT_QUERIES", "DEFAULT_REDUCE", "ENGINE_KEYS", "GpuAutoscalerConfig",
           "MetricQuery", "POD_REGEX", "SLICE_ANNOTATION", "SlicePolicy", "SpecError", "TARGET_KINDS", "TargetRef",
           "parse_gpu_autoscaler", "parse_metrics", "parse_slice_policy", "parse_target", "pod_regex", "render_query",
           "slice_options", "slice_template_patch"]
