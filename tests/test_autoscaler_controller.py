"""The GpuAutoscaler controller (gpupool.k8s.autoscaler) against the kmock API server of test_k8s_scheduler and the
Prometheus stub of test_autoscaler_prometheus, both over real HTTP with the official clients.

The mock serves Deployments and StatefulSets with their ``scale`` subresource as kube-apiserver does (GET answers an
``autoscaling/v1`` Scale: ``spec.replicas``, ``status.replicas``, ``status.selector``; PATCH changes the workload's
``spec.replicas``), and GpuAutoscalers with their status subresource. Time for the recommender is a fake clock the
test moves, so stabilization windows are checked without waiting.
"""

from __future__ import annotations

import copy
import time
from typing import Any

import kmock
import pytest
from kubernetes import client

from gpupool.k8s import wire
from gpupool.k8s.autoscaler import API_VERSION, KIND
from gpupool.k8s.autoscaler.controller import AutoscalerController, AutoscalerMetrics, ControllerConfig
from gpupool.k8s.autoscaler.crd import (
    DEFAULT_QUERIES,
    SpecError,
    TargetRef,
    parse_gpu_autoscaler,
    pod_regex,
    render_query,
    slice_template_patch,
)
from gpupool.k8s.autoscaler.prometheus import PrometheusClient
from test_autoscaler_prometheus import PromError, PromStub
from test_deploy import validate_gpuautoscaler
from test_k8s_scheduler import EVENTS, Harness, wait_for

DEPLOYMENTS = kmock.resource("apps", "v1", "deployments")
STATEFULSETS = kmock.resource("apps", "v1", "statefulsets")
GPUAS = kmock.resource("gpupool.io", "v1alpha1", "gpuautoscalers")
NS = "inference"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _scale_of(obj: dict[str, Any]) -> dict[str, Any]:
    meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
    labels = ((spec.get("selector") or {}).get("matchLabels")) or {}
    return {"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid"),
                         "resourceVersion": meta.get("resourceVersion")},
            "spec": {"replicas": int(spec.get("replicas", 1))},
            "status": {"replicas": int((obj.get("status") or {}).get("replicas", spec.get("replicas", 1))),
                       "selector": ",".join(f"{k}={v}" for k, v in sorted(labels.items()))}}


class World:
    """The mock API server with workloads + GpuAutoscalers, the Prometheus stub, and a controller factory."""

    def __init__(self) -> None:
        self.h = Harness()
        self.stub = PromStub()
        self.prom = PrometheusClient(self.stub.url, timeout=2.0, retries=1, backoff=0.01)
        self.clock = Clock()
        self.apps = client.AppsV1Api(self.h.api)
        self.custom = client.CustomObjectsApi(self.h.api)
        self.controllers: list[AutoscalerController] = []
        for res, kind in ((DEPLOYMENTS, "Deployment"), (STATEFULSETS, "StatefulSet"), (GPUAS, KIND)):
            self.h.call(lambda r=res, k=kind: self.h.server.resources.__setitem__(
                r, kmock.ResourceInfo(kind=k, namespaced=True)))
        server = self.h.server

        async def serve_scale(request):
            key = (request.resource, request.namespace, request.name)
            obj = server._objects[key] if key in server._objects else None
            if obj is None or obj.deleted:
                raise kmock.KubernetesError(status=404, reason="NotFound",
                                            message=f'{request.resource.plural}.apps "{request.name}" not found')
            return _scale_of(obj.raw)

        for res in (DEPLOYMENTS, STATEFULSETS):
            # kmock's PATCH merges {"spec": {"replicas": n}} into the workload itself, as the scale subresource does;
            # GET answers a Scale object instead of the workload.
            self.h.call(lambda r=res: server["get", r, kmock.subresource("scale")] << serve_scale)

    def close(self) -> None:
        for c in self.controllers:
            c.stop()
        self.prom.close()
        self.stub.close()
        self.h.close()

    # -- objects
    def deployment(self, name: str = "llm", replicas: int = 1, kind: str = "Deployment",
                   resources: dict[str, Any] | None = None) -> None:
        body = {"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "namespace": NS},
                "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                         "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [
                             {"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                              "resources": resources or {"limits": {"nvidia.com/gpu": "1"}}}]}}}}
        if kind == "Deployment":
            wire.drain(self.apps.create_namespaced_deployment(NS, body, _preload_content=False))
        else:
            body["spec"]["serviceName"] = name
            wire.drain(self.apps.create_namespaced_stateful_set(NS, body, _preload_content=False))

    def workload(self, name: str = "llm", kind: str = "Deployment") -> dict[str, Any]:
        res = DEPLOYMENTS if kind == "Deployment" else STATEFULSETS
        return next(o for o in self.h.objects(res) if o["metadata"]["name"] == name)

    def replicas(self, name: str = "llm", kind: str = "Deployment") -> int:
        return int(self.workload(name, kind)["spec"]["replicas"])

    def autoscaler(self, name: str = "llm", **spec: Any) -> dict[str, Any]:
        body = {"apiVersion": API_VERSION, "kind": KIND,
                "metadata": {"name": name, "namespace": NS, "generation": 1},
                "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                         "minReplicas": 1, "maxReplicas": 10,
                         "metrics": [{"name": "concurrency", "query": "llm_concurrency", "target": 8}], **spec}}
        wire.drain(self.custom.create_namespaced_custom_object("gpupool.io", "v1alpha1", NS, "gpuautoscalers", body,
                                                               _preload_content=False))
        return self.get(name)

    def get(self, name: str = "llm") -> dict[str, Any]:
        return next(o for o in self.h.objects(GPUAS) if o["metadata"]["name"] == name)

    def events(self, reason: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.h.objects(EVENTS) if e.get("involvedObject", {}).get("kind") == KIND
                and (reason is None or e.get("reason") == reason)]

    def controller(self, start: bool = False, **cfg: Any) -> AutoscalerController:
        config = ControllerConfig(identity="test-0", sync_period_s=cfg.pop("sync_period_s", 30.0), batch_s=0.01,
                                  backoff_initial_s=0.05, backoff_max_s=0.3, optional_retry_s=0.5,
                                  watch_timeout_s=30, **cfg)
        ctl = AutoscalerController(self.h.api, self.prom, config, metrics=AutoscalerMetrics(), clock=self.clock)
        self.controllers.append(ctl)
        if start:
            ctl.start()
        return ctl

    def reconcile(self, ctl: AutoscalerController, name: str = "llm"):
        out = ctl.reconcile(self.get(name))
        assert ctl.recorder.flush(5)
        return out


@pytest.fixture
def world():
    w = World()
    yield w
    w.close()


def _cond(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in obj["status"]["conditions"] if c["type"] == ctype)


# ------------------------------------------------------------------ the loop, end to end
def test_controller_scales_a_deployment_from_a_prometheus_metric(world: World) -> None:
    """Watch -> reconcile -> scale write -> Event -> status, with the controller's own threads."""
    world.deployment(replicas=1)
    world.stub.set("llm_concurrency", 40.0)  # 40 requests in flight, target 8 per replica -> 5 replicas
    ctl = world.controller(start=True, sync_period_s=0.3)
    world.autoscaler()
    wait_for(lambda: world.replicas() == 5, 10, "the Deployment scaled to 5")
    # HPA default scale-up: max(+100 %, +4 pods) per 15 s from 1 -> 5 in one step
    wait_for(lambda: world.get().get("status", {}).get("currentReplicas") == 5, 10, "status.currentReplicas 5")
    st = world.get()["status"]
    assert st["desiredReplicas"] == 5 and st["lastScaleTime"].endswith("Z")
    assert st["currentMetrics"] == [{"name": "concurrency", "value": 40.0, "target": 8.0}]
    assert _cond(world.get(), "AbleToScale")["status"] == "True"
    assert _cond(world.get(), "ScalingActive")["reason"] == "ValidMetricFound"
    assert _cond(world.get(), "ScalingLimited")["reason"] == "DesiredWithinRange"
    validate_gpuautoscaler(world.get())  # what the controller writes is what the CRD defines (else pruned)
    wait_for(lambda: world.events("SuccessfulRescale"), 5, "a SuccessfulRescale Event")
    (ev,) = world.events("SuccessfulRescale")
    assert ev["message"].startswith("New size: 5; reason: ") and ev["type"] == "Normal"
    assert ev["involvedObject"]["name"] == "llm" and ev["source"]["component"] == "gpupool-autoscaler"
    scale_writes = [u for u in world.h.server.updates if u[0] == "deployments" and u[3] == "scale"]
    assert [u[4] for u in scale_writes] == [{"spec": {"replicas": 5}}]  # only the replica count, once
    assert "llm_concurrency" in world.stub.queries()
    assert ctl.metrics.ready and ctl.healthy()
    page = ctl.metrics.registry.get_sample_value
    assert page("gpupool_autoscaler_replicas", {"namespace": NS, "name": "llm", "kind": "desired"}) == 5
    assert page("gpupool_autoscaler_scale_operations_total", {"direction": "up"}) == 1
    assert page("gpupool_autoscaler_metric_value", {"namespace": NS, "name": "llm", "metric": "concurrency"}) == 40
    # deleting the GpuAutoscaler drops its state and series
    world.custom.delete_namespaced_custom_object("gpupool.io", "v1alpha1", NS, "gpuautoscalers", "llm")
    wait_for(lambda: "inference/llm" not in ctl.states, 10, "the state of the deleted GpuAutoscaler dropped")
    wait_for(lambda: page("gpupool_autoscaler_replicas", {"namespace": NS, "name": "llm", "kind": "desired"})
             is None, 5, "its series dropped")


def test_a_standby_replica_does_not_scale(world: World) -> None:
    world.deployment(replicas=1)
    world.stub.set("llm_concurrency", 40.0)
    leading = {"now": False}
    ctl = world.controller(sync_period_s=0.2)
    ctl.leader = lambda: leading["now"]
    ctl.start()
    world.autoscaler()
    wait_for(lambda: ctl.metrics.ready, 5, "cache synced")
    time.sleep(0.8)
    assert world.replicas() == 1 and not world.stub.queries()
    leading["now"] = True
    wait_for(lambda: world.replicas() == 5, 10, "scaled once leading")
    assert ctl.metrics.registry.get_sample_value("gpupool_autoscaler_leader") == 1


# ------------------------------------------------------------------ the HPA rules through the controller
def test_scale_down_waits_out_the_stabilization_window(world: World) -> None:
    world.deployment(replicas=4)
    world.autoscaler(behavior={"scaleDown": {"stabilizationWindowSeconds": 60}})
    ctl = world.controller()
    world.stub.set("llm_concurrency", 32.0)  # 32 / 8 = 4: at target
    out = world.reconcile(ctl)
    assert (out.result, out.current, out.desired) == ("unchanged", 4, 4)
    assert _cond(world.get(), "AbleToScale")["reason"] == "ReadyForNewScale"
    world.stub.set("llm_concurrency", 8.0)  # load falls: 1 replica would do
    world.clock.t += 30
    out = world.reconcile(ctl)
    assert (out.result, out.desired) == ("unchanged", 4) and world.replicas() == 4  # 4 was recommended 30 s ago
    assert _cond(world.get(), "AbleToScale")["reason"] == "ScaleDownStabilized"
    world.clock.t += 31  # the recommendation of 4 is now older than the window
    out = world.reconcile(ctl)
    assert (out.result, out.desired) == ("scaled", 1) and world.replicas() == 1
    assert [e["message"].split(";")[0] for e in world.events("SuccessfulRescale")] == ["New size: 1"]


def test_max_replicas_limits_and_says_so(world: World) -> None:
    world.deployment(replicas=2)
    world.autoscaler(maxReplicas=3)
    world.stub.set("llm_concurrency", 200.0)
    out = world.reconcile(world.controller())
    assert out.desired == 3 and world.replicas() == 3
    limited = _cond(world.get(), "ScalingLimited")
    assert (limited["status"], limited["reason"]) == ("True", "TooManyReplicas")


def test_several_metrics_highest_proposal_wins(world: World) -> None:
    world.deployment(replicas=2)
    world.autoscaler(metrics=[{"name": "concurrency", "query": "conc", "target": 8},
                              {"name": "gpu_util", "query": "util", "target": 70}])
    world.stub.set("conc", 16.0)  # 2 replicas
    world.stub.set("util", 105.0)  # 2 x 105 / 70 = 3 replicas
    out = world.reconcile(world.controller())
    assert out.desired == 3 and out.samples == {"concurrency": 16.0, "gpu_util": 105.0}
    assert "gpu_util" in _cond(world.get(), "ScalingActive")["message"]


def test_scale_from_zero_needs_the_activation_threshold(world: World) -> None:
    world.deployment(replicas=0)
    world.autoscaler(minReplicas=0, metrics=[{"name": "queue_depth", "query": "queue", "target": 4,
                                              "activation": 2}])
    ctl = world.controller()
    world.stub.set("queue", 1.0)  # below activation: stays at zero
    out = world.reconcile(ctl)
    assert (out.result, out.desired) == ("unchanged", 0) and world.replicas() == 0
    world.stub.set("queue", 9.0)  # above: activated, 9 / 4 -> 3 replicas
    world.clock.t += 15
    out = world.reconcile(ctl)
    assert (out.result, out.desired) == ("scaled", 3) and world.replicas() == 3


def _dcgm(pods: list[str], value: float, mig: bool, node: str = "gpu-1") -> list[tuple[dict[str, str], float]]:
    """dcgm-exporter series, one per pod: on GPU i, or on MIG instance i of GPU 0 (labels GPU_I_ID/PROFILE)."""
    out = []
    for i, pod in enumerate(pods):
        labels = {"namespace": NS, "pod": pod, "container": "vllm", "Hostname": node, "modelName": "NVIDIA H100 "
                  "80GB HBM3", "gpu": "0" if mig else str(i), "UUID": f"GPU-{0 if mig else i}"}
        if mig:
            labels |= {"GPU_I_ID": str(7 + i), "GPU_I_PROFILE": "1g.10gb"}
        out.append((labels, value))
    return out


def test_mig_service_keeps_its_replicas_on_gpu_util_dcgm216(world: World) -> None:
    """dcgm-exporter #216 (DCGM #80): 4 busy replicas on MIG 1g.10gb instances, scaled on gpu_util (target 70 %,
    the default query): DCGM_FI_DEV_GPU_UTIL reads 0 on each instance, the graphics engine is 90 % active. The
    controller reads the MIG instances from DCGM_FI_PROF_GR_ENGINE_ACTIVE: 90 % -> no scale-down (4 -> 1
    before)."""
    world.deployment(replicas=4, resources={"limits": {"nvidia.com/mig-1g.10gb": "1"}})
    world.autoscaler(metrics=[{"name": "gpu_util", "target": 70}],
                     behavior={"scaleDown": {"stabilizationWindowSeconds": 0}})
    cfg = parse_gpu_autoscaler(world.get())
    (m,) = cfg.metrics
    pods = [f"llm-5d4f8b7c9-{c}" for c in "abcd"]
    # what Prometheus answers for each expression over the same dcgm-exporter data
    world.stub.set(m.query, _dcgm(pods, 0.0, mig=True))
    world.stub.set(m.query.join(("avg(", ")")), 0.0)  # the default query before: avg over the MIG series
    world.stub.set(m.instance_query, _dcgm(pods, 90.0, mig=True))  # 100 x 0.9
    ctl = world.controller()
    out = world.reconcile(ctl)
    assert out.samples == {"gpu_util": 90.0} and world.replicas() >= 4
    world.clock.t += 400
    out = world.reconcile(ctl)
    assert world.replicas() >= 4  # 4 x 90 / 70 = 5.1 -> 6: kept (scaled up), never down to 1
    # whole GPUs keep DCGM_FI_DEV_GPU_UTIL; a MIG instance with no profiling reading is unknown, not idle
    world.stub.set(m.query, _dcgm(pods[:2], 35.0, mig=False) + _dcgm(pods[2:], 0.0, mig=True))
    world.stub.set(m.instance_query, _dcgm(pods[2:3], 85.0, mig=True))
    world.clock.t += 15
    assert world.reconcile(ctl).samples == {"gpu_util": pytest.approx((35.0 + 35.0 + 85.0) / 3)}


def test_scale_to_zero_at_the_scale_down_policy_pace_keda7204(world: World) -> None:
    """KEDA #7204: 4 replicas, load gone, scale-down 1 pod per 60 s, cooldown 300 s: the Deployment goes
    4 -> 3 -> 2 -> 1 at the policy's pace, then to 0; never 4 -> 0 at the cooldown."""
    world.deployment(replicas=4)
    world.autoscaler(minReplicas=0, cooldownPeriod=300,
                     behavior={"scaleDown": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}})
    ctl = world.controller()
    world.stub.set("llm_concurrency", 32.0)  # busy at the first sync: 4 replicas
    seen = []
    for _ in range(60):  # a sync every 15 s for 15 minutes; idle from the second one
        out = world.reconcile(ctl)
        seen.append(world.replicas())
        world.stub.set("llm_concurrency", 0.0)
        world.clock.t += 15
        if out.desired == 0:
            break
    drops = [b for a, b in zip(seen, seen[1:], strict=False) if b != a]
    assert drops == [3, 2, 1, 0]
    assert all(a - b <= 1 for a, b in zip(seen, seen[1:], strict=False))


def test_zero_replicas_with_min_one_is_scaling_disabled(world: World) -> None:
    """As the HPA: a target scaled to 0 by hand is left alone when minReplicas > 0."""
    world.deployment(replicas=0)
    world.autoscaler()
    world.stub.set("llm_concurrency", 100.0)
    out = world.reconcile(world.controller())
    assert out.result == "disabled" and world.replicas() == 0 and not world.stub.queries()
    assert _cond(world.get(), "ScalingActive")["reason"] == "ScalingDisabled"


def test_statefulset_target(world: World) -> None:
    world.deployment("db", replicas=1, kind="StatefulSet")
    world.autoscaler("db", scaleTargetRef={"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db"})
    world.stub.set("llm_concurrency", 17.0)
    out = world.reconcile(world.controller(), "db")
    assert out.desired == 3 and world.replicas("db", "StatefulSet") == 3
    assert [u[:4] for u in world.h.server.updates if u[3] == "scale"] == [("statefulsets", NS, "db", "scale")]


# ------------------------------------------------------------------ failures are reported, nothing is scaled
def test_prometheus_error_keeps_the_replicas_and_reports(world: World) -> None:
    world.deployment(replicas=2)
    world.autoscaler()
    world.stub.set("llm_concurrency", PromError(400, "bad_data", 'parse error: unexpected "}"'))
    out = world.reconcile(world.controller())
    assert out.result == "no_metrics" and world.replicas() == 2
    active = _cond(world.get(), "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "FailedGetPrometheusMetric")
    assert "bad_data" in active["message"] and "parse error" in active["message"]
    (ev,) = world.events("FailedGetPrometheusMetric")
    assert ev["type"] == "Warning" and "llm_concurrency" in ev["message"]
    assert world.get()["status"]["desiredReplicas"] == 2


def test_empty_vector_is_no_value_not_zero(world: World) -> None:
    """A selector matching nothing must not scale the service down to its minimum."""
    world.deployment(replicas=4)
    world.autoscaler()
    out = world.reconcile(world.controller())  # the stub answers an empty vector
    assert out.result == "no_metrics" and world.replicas() == 4
    assert "no value" in _cond(world.get(), "ScalingActive")["message"]


def test_missing_target_is_failed_get_scale(world: World) -> None:
    world.autoscaler(scaleTargetRef={"apiVersion": "apps/v1", "kind": "Deployment", "name": "nope"})
    out = world.reconcile(world.controller())
    assert out.result == "failed_get_scale"
    able = _cond(world.get(), "AbleToScale")
    assert (able["status"], able["reason"]) == ("False", "FailedGetScale") and "404" in able["message"]
    assert world.events("FailedGetScale")


def test_invalid_spec_names_the_field(world: World) -> None:
    world.deployment()
    world.autoscaler(metrics=[{"name": "concurrency", "query": "q", "target": 0}])
    out = world.reconcile(world.controller())
    assert out.result == "invalid_spec" and "spec.metrics[0].target" in out.reason
    active = _cond(world.get(), "ScalingActive")
    assert (active["status"], active["reason"]) == ("False", "InvalidSpec")
    (ev,) = world.events("InvalidSpec")
    assert "spec.metrics[0].target: must be > 0" in ev["message"]
    obj = world.get()
    obj["spec"]["metrics"][0]["target"] = 1  # the bad spec aside (the CRD would refuse it), the status is valid
    validate_gpuautoscaler(obj)
    assert world.replicas() == 1


def test_status_unchanged_is_not_rewritten(world: World) -> None:
    world.deployment(replicas=2)
    world.autoscaler()
    world.stub.set("llm_concurrency", 16.0)
    ctl = world.controller()
    world.reconcile(ctl)
    first = world.get()["status"]
    writes = len([u for u in world.h.server.updates if u[0] == "gpuautoscalers"])
    world.clock.t += 15
    world.reconcile(ctl)
    assert len([u for u in world.h.server.updates if u[0] == "gpuautoscalers"]) == writes
    assert world.get()["status"] == first  # lastTransitionTime kept


# ------------------------------------------------------------------ right-sizing
SLICE_SPEC = {"gpuModel": "H200", "demandMetric": "rps", "memoryMiB": 30000,
              "capacityPerReplica": {"3g.71gb": 20, "7g.141gb": 45, "1xH200": 45}}


def test_slice_is_chosen_and_written_to_status_only_by_default(world: World) -> None:
    world.deployment(replicas=1)
    world.autoscaler(metrics=[{"name": "rps", "query": "rps", "target": 10}], slicePolicy=dict(SLICE_SPEC))
    world.stub.set("rps", 20.0)
    out = world.reconcile(world.controller())
    # 20 rps: 1 x 3g.71gb (20 rps each; a 3g profile costs max(3/7, 4/8) = 0.5 GPU) beats 1 x 7g.141gb or 1 x H200
    # (1.0 GPU each); written to status, the target's template left alone (apply false)
    st = world.get()["status"]
    assert (st["chosenSlice"], st["sliceReplicas"], st["sliceGpuCost"]) == ("3g.71gb", 1, 0.5) == (
        out.slice, 1, 0.5)
    assert "appliedSlice" not in st
    assert world.events("SliceChosen")
    assert not [u for u in world.h.server.updates if u[0] == "deployments" and u[3] is None]
    assert world.workload()["spec"]["template"]["spec"]["containers"][0]["resources"] == {
        "limits": {"nvidia.com/gpu": "1"}}


def test_slice_apply_patches_the_pod_template_once(world: World) -> None:
    world.deployment(replicas=1)
    policy = dict(SLICE_SPEC, apply=True, allowed=["3g.71gb"], capacityPerReplica={"3g.71gb": 12})
    world.autoscaler(metrics=[{"name": "rps", "query": "rps", "target": 10}], slicePolicy=policy)
    world.stub.set("rps", 20.0)
    ctl = world.controller()
    out = world.reconcile(ctl)
    assert out.slice == "3g.71gb"
    tpl = world.workload()["spec"]["template"]
    limits = tpl["spec"]["containers"][0]["resources"]["limits"]
    assert limits.get("nvidia.com/mig-3g.71gb") == "1" and not limits.get("nvidia.com/gpu")
    assert tpl["metadata"]["annotations"]["gpupool.io/slice"] == "3g.71gb"
    assert world.get()["status"]["appliedSlice"] == "3g.71gb"
    validate_gpuautoscaler(world.get())
    (ev,) = world.events("SliceApplied")
    assert "pods roll" in ev["message"]
    patches = len([u for u in world.h.server.updates if u[0] == "deployments" and u[3] is None])
    world.clock.t += 15
    world.reconcile(ctl)
    assert len([u for u in world.h.server.updates if u[0] == "deployments" and u[3] is None]) == patches == 1


# ------------------------------------------------------------------ spec mapping (no server)
def _obj(**spec: Any) -> dict[str, Any]:
    base = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"}, "maxReplicas": 5,
            "metrics": [{"name": "gpu_util", "target": 70}]}
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "a", "namespace": "ns1"},
            "spec": {**base, **spec}}


def test_slice_policy_sizes_mig_by_the_device_memory_dcgm544() -> None:
    """A replica needing 10,000 MiB on an H100: 1g.10gb has 9,984 MiB (not the name's 10,240), so a policy
    allowing only it is refused, and with 1g.20gb allowed the slice offered is that one."""
    policy = {"gpuModel": "H100", "demandMetric": "gpu_util", "memoryMiB": 10000,
              "capacityPerReplica": {"1g.10gb": 4}}
    with pytest.raises(SpecError) as err:
        parse_gpu_autoscaler(_obj(slicePolicy=policy))
    assert err.value.field == "spec.slicePolicy.memoryMiB" and "9984 MiB" in str(err.value)
    cfg = parse_gpu_autoscaler(_obj(slicePolicy={**policy, "memoryMiB": 9984}))
    assert cfg.slice_policy is not None and cfg.slice_policy.memory_mib == 9984


def test_default_queries_are_filled_for_the_target() -> None:
    cfg = parse_gpu_autoscaler(_obj())
    (m,) = cfg.metrics
    assert m.query == 'DCGM_FI_DEV_GPU_UTIL{namespace="ns1",pod=~"llm-[a-z0-9]+-[a-z0-9]+"}'  # averaged by the client
    assert m.instance_query == \
        '100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{namespace="ns1",pod=~"llm-[a-z0-9]+-[a-z0-9]+",GPU_I_ID!=""}'
    assert parse_gpu_autoscaler(_obj(metrics=[{"name": "gpu_util", "target": 70, "query": "q"}])).metrics[0] \
        .instance_query == ""  # a query the user wrote is taken as it is
    assert m.reduce == "avg" and cfg.engine_spec.max_replicas == 5 and cfg.min_replicas == 1
    sts = TargetRef("apps/v1", "StatefulSet", "db.v2")
    assert pod_regex(sts) == "db\\\\.v2-[0-9]+"
    assert render_query(DEFAULT_QUERIES["concurrency"], "x", sts) == \
        'sum(vllm:num_requests_running{namespace="x",pod=~"db\\\\.v2-[0-9]+"})'
    assert set(DEFAULT_QUERIES) == set(__import__("gpupool.engine.autoscale", fromlist=["METRICS"]).METRICS)


@pytest.mark.parametrize("spec, field", [
    ({"scaleTargetRef": {"kind": "ReplicaSet", "name": "x"}}, "spec.scaleTargetRef.kind"),
    ({"scaleTargetRef": {"apiVersion": "extensions/v1beta1", "kind": "Deployment", "name": "x"}},
     "spec.scaleTargetRef.apiVersion"),
    ({"metrics": []}, "spec.metrics"),
    ({"metrics": [{"name": "qps", "target": 1}]}, "spec.metrics[0].name"),
    ({"metrics": [{"name": "rps", "target": 1}, {"name": "rps", "target": 2}]}, "spec.metrics[1].name"),
    ({"metrics": [{"name": "rps", "target": 1, "reduce": "median"}]}, "spec.metrics[0].reduce"),
    ({"minReplicas": 6}, "spec"),
    ({"behavior": {"scaleUp": {"policies": [{"type": "Pods", "value": 0, "periodSeconds": 15}]}}},
     "spec.behavior.scaleUp.policies[0].value"),
    ({"slicePolicy": {"gpuModel": "H200", "demandMetric": "gpu_util", "capacityPerReplica": {"9g.999gb": 1}}},
     "spec.slicePolicy"),
    ({"slicePolicy": {"gpuModel": "H200", "demandMetric": "rps", "capacityPerReplica": {"3g.71gb": 1}}},
     "spec.slicePolicy.demandMetric"),
    ({"slicePolicy": {"gpuModel": "NoSuchGPU", "demandMetric": "gpu_util", "capacityPerReplica": {"x": 1}}},
     "spec.slicePolicy.gpuModel"),
])
def test_bad_specs_name_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_gpu_autoscaler(_obj(**spec))
    assert info.value.field == field, str(info.value)


def test_slice_patch_per_kind() -> None:
    from gpupool.engine.rightsize import slice_catalog

    options = {o.name: o for o in slice_catalog("H200")}
    template = {"metadata": {}, "spec": {"containers": [
        {"name": "side", "image": "x"},
        {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "64Gi"},
                                       "requests": {"nvidia.com/gpu": "1"}}}]}}
    mig = slice_template_patch(options["3g.71gb"], template, "vllm")
    c = mig["spec"]["template"]["spec"]["containers"][0]
    assert c == {"name": "vllm", "resources": {"limits": {"nvidia.com/gpu": None, "nvidia.com/mig-3g.71gb": "1"},
                                               "requests": {"nvidia.com/gpu": None, "nvidia.com/mig-3g.71gb": "1"}}}
    assert mig["spec"]["template"]["metadata"]["annotations"] == {"gpupool.io/slice": "3g.71gb", "gpu-fraction": None}
    ts = slice_template_patch(options["timeslice-0.5"], template, "vllm")
    assert ts["spec"]["template"]["metadata"]["annotations"]["gpu-fraction"] == "0.5"
    assert ts["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": None}
    whole = slice_template_patch(options["2xH200"], template, "vllm")
    assert whole["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    with pytest.raises(SpecError, match="'nope' is not a container"):
        slice_template_patch(options["3g.71gb"], copy.deepcopy(template), "nope")


# ------------------------------------------------------------------ the CLI
def test_cli_autoscaler_with_lease_metrics_and_kubeconfig(world: World, tmp_path) -> None:
    """``gpupool autoscaler --leader-elect`` end to end: kubeconfig, Lease, scale write, /readyz /healthz /metrics,
    clean stop (the Lease released)."""
    import socket
    import threading
    import urllib.error
    import urllib.request

    from gpupool.k8s.autoscaler.cli import run_autoscaler
    from test_k8s_scheduler import LEASES, write_kubeconfig

    world.deployment(replicas=1)
    world.stub.set("llm_concurrency", 24.0)
    world.autoscaler()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    stop = threading.Event()
    runner = threading.Thread(target=run_autoscaler, args=(world.stub.url,), daemon=True, kwargs=dict(
        kubeconfig=write_kubeconfig(world.h, tmp_path), identity="as-1", sync_period=1.0, leader_elect=True,
        lease_namespace="gpupool-system", lease_duration=2.0, renew_deadline=1.5, retry_period=0.2,
        metrics_address=f"127.0.0.1:{port}", stop=stop))
    runner.start()

    def get(path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
                return resp.status, resp.read().decode()
        except (urllib.error.HTTPError, urllib.error.URLError) as exc:
            return getattr(exc, "code", 0), ""

    try:
        wait_for(lambda: world.replicas() == 3, 15, "scaled to 3 through the CLI")
        (lease,) = world.h.objects(LEASES)
        assert lease["metadata"]["name"] == "gpupool-autoscaler" and lease["spec"]["holderIdentity"] == "as-1"
        assert get("/readyz")[0] == 200 and get("/healthz")[0] == 200
        page = wait_for(lambda: (m := get("/metrics")[1]) and 'result="scaled"} 1.0' in m and m, 10, "metrics")
        assert "gpupool_autoscaler_leader 1.0" in page
        assert 'gpupool_autoscaler_replicas{kind="desired",name="llm",namespace="inference"} 3.0' in page
    finally:
        stop.set()
        runner.join(15)
    assert not runner.is_alive()
    (lease,) = world.h.objects(LEASES)
    assert lease["spec"]["holderIdentity"] == ""  # released on a clean stop: a standby takes over at once


@pytest.mark.parametrize("args, message", [
    (["--prometheus-url", "prometheus:9090"], "expected http://HOST:PORT"),
    (["--prometheus-url", "http://p:9090", "--log-format", "xml"], "log format 'xml'"),
    (["--prometheus-url", "http://p:9090", "--kubeconfig", "/nonexistent/kubeconfig"], "no usable Kubernetes"),
])
def test_cli_usage_errors_exit_2(args: list[str], message: str) -> None:
    from typer.testing import CliRunner

    from gpupool.cli import app

    result = CliRunner().invoke(app, ["autoscaler", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_the_autoscalers_watch_logs_under_its_own_logger(world: World, caplog) -> None:
    """Its reflector's lines (listed, watch expired, outages) carry the autoscaler's logger, not the scheduler's."""
    import logging

    with caplog.at_level(logging.INFO):
        world.controller(start=True, sync_period_s=0.3)
        wait_for(lambda: any(r.getMessage() == "listed" for r in caplog.records), 10, "the first list logged")
    listed = [r for r in caplog.records if r.getMessage() == "listed"]
    assert {r.name for r in listed} == {"gpupool.k8s.autoscaler"}
