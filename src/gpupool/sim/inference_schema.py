"""The key schemas of the inference scenario file (:func:`gpupool.sim.inference_policies.load_scenario`) and of
the throughput table (:func:`gpupool.sim.inference.load_throughput_table`).

Pydantic models with ``extra="forbid"`` at every level, read by :func:`gpupool.inputs.unknown_keys`: a key not
listed here (``maxReplica`` for ``maxReplicas``) is refused with the file, its line and column and the closest
known key. The values are typed ``Any``: :func:`~gpupool.sim.inference_policies.parse_scenario` and
:meth:`~gpupool.engine.autoscale.AutoscalerSpec.from_mapping` check them and name their units.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["ScenarioKeys", "ThroughputKeys"]


class _Keys(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ScalingPolicy(_Keys):
    type: Any = None
    value: Any = None
    periodSeconds: Any = None


class _ScalingRules(_Keys):
    stabilizationWindowSeconds: Any = None
    selectPolicy: Any = None
    policies: list[_ScalingPolicy] | None = None


class _Behavior(_Keys):
    scaleUp: _ScalingRules | None = None
    scaleDown: _ScalingRules | None = None


class _Target(_Keys):
    averageValue: Any = None
    value: Any = None
    averageUtilization: Any = None


class _Metric(_Keys):
    name: Any = None
    type: Any = None
    target: _Target | None = None
    activation: Any = None


class _Autoscaler(_Keys):
    """The keys :meth:`~gpupool.engine.autoscale.AutoscalerSpec.from_mapping` reads (the GpuAutoscaler spec's
    scaling fields)."""

    minReplicas: Any = None
    maxReplicas: Any = None
    tolerance: Any = None
    metrics: list[_Metric] | None = None
    behavior: _Behavior | None = None
    panicWindowSeconds: Any = None
    stableWindowSeconds: Any = None
    panicThreshold: Any = None
    cooldownPeriod: Any = None


class _Policy(_Keys):
    """The keys of every policy kind (static, recommender, rightsized) together."""

    kind: Any = None
    note: Any = None
    slice: Any = None
    slices: Any = None
    replicas: Any = None
    style: Any = None
    headroom: Any = None
    hysteresis: Any = None
    minDwellSeconds: Any = None
    reconcileSeconds: Any = None
    scrapeSeconds: Any = None
    autoscaler: _Autoscaler | None = None


class _Slo(_Keys):
    e2eSeconds: Any = None
    attainment: Any = None


class _Burst(_Keys):
    startHour: Any = None
    minutes: Any = None
    factor: Any = None
    rampSeconds: Any = None


class _Workload(_Keys):
    source: Any = None
    trace: Any = None
    troughRps: Any = None
    peakRps: Any = None
    peakHour: Any = None
    bursts: list[_Burst] | None = None


class _Replica(_Keys):
    startupSeconds: Any = None
    crashMtbfHours: Any = None
    cpuRequestCores: Any = None


class _Metrics(_Keys):
    scrapeSeconds: Any = None
    lagSeconds: Any = None
    reconcileSeconds: Any = None


class _Lending(_Keys):
    enabled: Any = None
    lendAfterSeconds: Any = None
    checkpointSeconds: Any = None
    graceSeconds: Any = None


class _Spec(_Keys):
    durationHours: Any = None
    seed: Any = None
    gpuModel: Any = None
    poolGpus: Any = None
    throughput: Any = None
    slo: _Slo | None = None
    workload: _Workload | None = None
    replica: _Replica | None = None
    metrics: _Metrics | None = None
    lending: _Lending | None = None
    policies: dict[str, _Policy] | None = None


class _Metadata(_Keys):
    name: Any = None
    labels: Any = None
    annotations: Any = None


class ScenarioKeys(_Keys):
    """The keys of an ``InferenceScenario`` file (see :mod:`gpupool.sim.inference_policies`)."""

    apiVersion: Any = None
    kind: Any = None
    metadata: _Metadata | None = None
    spec: _Spec | None = None


class _SliceRow(_Keys):
    kind: Any = None
    gpu_fraction: Any = None
    prefill_tokens_per_s: Any = None
    decode_step_ms: Any = None
    decode_step_ms_per_seq: Any = None
    memory_mib: Any = None


class _GpuThroughput(_Keys):
    source: Any = None
    slices: dict[str, _SliceRow] | None = None


class _ServedModel(_Keys):
    name: Any = None
    parameters: Any = None
    weights_mib: Any = None
    overhead_mib: Any = None
    kv_bytes_per_token: Any = None
    min_kv_tokens: Any = None
    max_num_seqs: Any = None


class ThroughputKeys(_Keys):
    """The keys of a throughput table (the shape of ``gpupool/data/inference_throughput.yaml``)."""

    model: _ServedModel | None = None
    gpus: dict[str, _GpuThroughput] | None = None
