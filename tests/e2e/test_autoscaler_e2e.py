"""The GpuAutoscaler controller on a real kube-apiserver: a real Deployment scaled through its ``scale``
subresource from a metric served by a real Prometheus server (or the Prometheus API stub where none is installed).

Without a controller-manager (the suite's default) the Deployment never gets pods, but its ``scale``
subresource is served by the apiserver itself, which is all the autoscaler writes; with
``KCP_WITH=controller-manager,kubelet-sim`` its ReplicaSet makes the pods (Pending: no scheduler takes them)
and the suite's cleanup deletes the workloads before their pods. The controller runs in-process
with a token of deploy/autoscaler's ServiceAccount (so its RBAC is checked too).

Metric sources (parametrized):

* ``prometheus``: the Debian ``prometheus`` binary (2.x) on 127.0.0.1 with a temporary config scraping, every
  second, a ``prometheus_client`` exporter this test runs, which serves vLLM's ``vllm:num_requests_running``
  gauge labelled with the namespace and two pod names of the Deployment; the GpuAutoscaler uses the DEFAULT query
  for ``concurrency`` (``sum(vllm:num_requests_running{namespace=...,pod=~"llm-[a-z0-9]+-[a-z0-9]+"})``). Skipped,
  with the reason, when no ``prometheus`` is on the PATH (``apt-get install prometheus``).
* ``stub``: :class:`PromStub` (tests/test_autoscaler_prometheus.py) answering that same query.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.k8s.autoscaler import API_VERSION, KIND
from gpupool.k8s.autoscaler.controller import AutoscalerController, AutoscalerMetrics, ControllerConfig
from gpupool.k8s.autoscaler.crd import DEFAULT_QUERIES, TargetRef, render_query
from gpupool.k8s.autoscaler.prometheus import PrometheusClient
from gpupool.k8s.wire import drain

from . import livecluster as lc
from .livecluster import E2E
from .test_status_columns import table

pytestmark = pytest.mark.real_apiserver

AUTOSCALER_SA = "gpupool-autoscaler"
CRD = "gpuautoscalers.gpupool.io"
PODS = ("llm-5d8f7c9b4-abcde", "llm-5d8f7c9b4-fghij")  # what the Deployment's pods would be called


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Source:
    """Sets the in-flight requests the controller reads, through a real Prometheus or the stub."""

    def __init__(self, kind: str, ns: str, tmp: Path) -> None:
        self.kind, self.ns = kind, ns
        self.proc: subprocess.Popen | None = None
        self.query = render_query(DEFAULT_QUERIES["concurrency"], ns, TargetRef("apps/v1", "Deployment", "llm"))
        if kind == "stub":
            from test_autoscaler_prometheus import PromStub

            self.stub = PromStub()
            self.url = self.stub.url
            return
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

        self.registry = CollectorRegistry()
        self.gauge = Gauge("vllm:num_requests_running", "Requests running in the engine (vLLM).",
                           ["namespace", "pod", "model_name"], registry=self.registry)
        metrics_app = make_wsgi_app(self.registry)

        def text_format(environ: dict[str, Any], start_response: Any) -> Any:
            # Prometheus asks for OpenMetrics first; prometheus_client 0.26 writes a name with a colon as
            # vllm_num_requests_running there. vLLM's metrics reach Prometheus as vllm:..., so serve the text format.
            environ.pop("HTTP_ACCEPT", None)
            return metrics_app(environ, start_response)

        class Quiet(WSGIRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

        self.exporter = make_server("127.0.0.1", 0, text_format, handler_class=Quiet)
        threading.Thread(target=self.exporter.serve_forever, name="vllm-exporter", daemon=True).start()
        port = self.exporter.server_port
        prom_port = _free_port()
        (tmp / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: vllm\n    scrape_interval: 1s\n"
            f"    static_configs:\n      - targets: ['127.0.0.1:{port}']\n")
        self.log = tmp / "prometheus.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [shutil.which("prometheus") or "prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
                 "--log.level=warn"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.url = f"http://127.0.0.1:{prom_port}"
        probe = PrometheusClient(self.url, timeout=2.0, retries=0)
        lc.wait_for(probe.ready, 60, "prometheus /-/ready", interval=0.2, detail=self.tail)

    def set(self, total: float) -> None:
        """``total`` requests in flight, split over the two pods as a vLLM engine per pod would report them."""
        if self.kind == "stub":
            self.stub.set(self.query, [({"namespace": self.ns, "pod": p}, total / 2) for p in PODS])
            return
        for p in PODS:
            self.gauge.labels(namespace=self.ns, pod=p, model_name="meta-llama/Llama-3.1-8B").set(total / 2)

    def tail(self) -> str:
        if self.proc is None:
            return ""
        try:
            return "--- prometheus log ---\n" + self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def close(self) -> None:
        if self.kind == "stub":
            self.stub.close()
            return
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.exporter.shutdown()
        self.exporter.server_close()


@pytest.fixture(params=["prometheus", "stub"])
def source(request: pytest.FixtureRequest, e2e: E2E, tmp_path: Path) -> Iterator[Source]:
    if request.param == "prometheus" and shutil.which("prometheus") is None:
        pytest.skip("no `prometheus` binary on the PATH (Debian: apt-get install prometheus): the real-Prometheus "
                    "variant is skipped; the stub variant runs the same scenario")
    src = Source(request.param, e2e.ns, tmp_path)
    try:
        yield src
    finally:
        src.close()


@pytest.fixture(scope="session")
def autoscaler_client(control_plane: lc.ControlPlane, admin: client.ApiClient, deployed: list[str],
                      log_dir: Path) -> client.ApiClient:
    """A client holding a token of deploy/autoscaler's ServiceAccount: the controller runs with exactly its RBAC."""
    from kubernetes import config

    assert f"CustomResourceDefinition/{CRD}" in deployed
    lc.wait_for(lambda: lc.crd_established(admin, CRD), 30, f"CRD {CRD} Established")
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    resp = client.CoreV1Api(admin).create_namespaced_service_account_token(AUTOSCALER_SA, lc.SA_NAMESPACE, body,
                                                                           _preload_content=False)
    token = json.loads(resp.data)["status"]["token"]
    path = lc.token_kubeconfig(control_plane, token, log_dir / "autoscaler.kubeconfig")
    return config.new_client_from_config(config_file=str(path))


def _deployment(ns: str) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llm", "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
                     "template": {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": [
                         {"name": "vllm", "image": "vllm/vllm-openai:v0.6.3",
                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}


def _autoscaler(ns: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "llm", "namespace": ns},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
                     "minReplicas": 1, "maxReplicas": 8,
                     "metrics": [{"name": "concurrency", "target": 8}],  # the default PromQL
                     "behavior": {"scaleDown": {"stabilizationWindowSeconds": 3}},
                     "slicePolicy": {"gpuModel": "H200", "demandMetric": "concurrency", "memoryMiB": 30000,
                                     "capacityPerReplica": {"3g.71gb": 8, "7g.141gb": 20}}}}


def test_controller_scales_a_real_deployment_from_prometheus(e2e: E2E, source: Source,
                                                               autoscaler_client: client.ApiClient) -> None:
    ns = e2e.ns
    apps = client.AppsV1Api(e2e.admin)
    custom = client.CustomObjectsApi(e2e.admin)
    drain(apps.create_namespaced_deployment(ns, _deployment(ns), _preload_content=False))
    source.set(40)  # 40 requests in flight, 8 per replica -> 5 replicas
    probe = PrometheusClient(source.url, timeout=2.0, retries=0)
    # Prometheus applies a new target set after its discovery manager's 5 s throttle, then scrapes every second
    lc.wait_for(lambda: probe.value(source.query) == 40, 60, f"{source.query} = 40 in {source.kind}",
                interval=0.3, detail=source.tail)
    custom.create_namespaced_custom_object("gpupool.io", "v1alpha1", ns, "gpuautoscalers", _autoscaler(ns))

    prom = PrometheusClient(source.url, timeout=3.0, retries=2)
    ctl = AutoscalerController(autoscaler_client, prom, ControllerConfig(identity="e2e-autoscaler", namespace=ns,
                                                                         sync_period_s=1.0, backoff_max_s=2.0),
                               metrics=AutoscalerMetrics())
    e2e.inproc.append(ctl)
    t0 = time.monotonic()
    ctl.start()

    def replicas() -> int:
        return int(json.loads(drain(apps.read_namespaced_deployment_scale("llm", ns, _preload_content=False)))
                   ["spec"]["replicas"])

    def detail() -> str:
        return (f"outcomes: {list(ctl.outcomes)[-3:]}\n" + e2e.logs.tail() + "\n" + source.tail())

    lc.wait_for(lambda: replicas() == 5, 30, "the Deployment scaled to 5 through its scale subresource",
                interval=0.2, detail=detail)
    up_s = time.monotonic() - t0
    dep = json.loads(drain(apps.read_namespaced_deployment("llm", ns, _preload_content=False)))
    assert dep["spec"]["replicas"] == 5

    def status() -> dict[str, Any]:
        return custom.get_namespaced_custom_object("gpupool.io", "v1alpha1", ns, "gpuautoscalers", "llm").get(
            "status") or {}

    lc.wait_for(lambda: status().get("currentReplicas") == 5, 15, "status.currentReplicas 5", detail=detail)
    st = status()
    conds = {c["type"]: c for c in st["conditions"]}
    assert conds["AbleToScale"]["status"] == "True" and conds["ScalingActive"]["reason"] == "ValidMetricFound"
    assert st["desiredReplicas"] == 5 and st["currentMetrics"][0]["value"] == 40
    # right-sizing on 40 in flight: 5 x 3g.71gb (8 each, 0.5 GPU) = 2.5 GPUs vs 2 x 7g.141gb (20 each) = 2 GPUs
    assert (st["chosenSlice"], st["sliceReplicas"], st["sliceGpuCost"]) == ("7g.141gb", 2, 2.0)
    events = [e for e in lc.events_for(e2e.admin, ns) if e["involvedObject"].get("kind") == KIND]
    rescale = [e for e in events if e["reason"] == "SuccessfulRescale"]
    assert rescale and rescale[0]["message"].startswith("New size: 5; reason: ")
    # `kubectl get gpuautoscalers`: the printer columns, evaluated by the apiserver
    row = table(e2e.admin, f"/apis/gpupool.io/v1alpha1/namespaces/{ns}/gpuautoscalers")["llm"]
    assert (row["Target"], row["Min"], row["Max"], row["Current"], row["Desired"]) == ("llm", 1, 8, 5, 5)
    assert row["Slice"] == st["chosenSlice"]

    # load falls to 8 in flight: one replica, after the 3 s scale-down stabilization window
    source.set(8)
    t1 = time.monotonic()
    lc.wait_for(lambda: replicas() == 1, 40, "the Deployment scaled down to 1", interval=0.2, detail=detail)
    down_s = time.monotonic() - t1
    assert down_s >= 3.0 - 0.5  # not before the window
    print(f"\n[e2e] autoscaler ({source.kind}): 1 -> 5 replicas in {up_s:.2f}s from start; 5 -> 1 in {down_s:.2f}s "
          "after the load fell (3 s stabilization window, 1 s sync period"
          + (", 1 s scrape interval" if source.kind == "prometheus" else "") + ")")
    ctl.stop()
    prom.close()


def test_autoscaler_service_account_may_do_what_it_needs_and_no_more(e2e: E2E,
                                                                      autoscaler_client: client.ApiClient) -> None:
    authz = client.AuthorizationV1Api(autoscaler_client)

    def may(verb: str, group: str, resource: str, sub: str = "", ns: str = e2e.ns, name: str = "") -> bool:
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                                "subresource": sub, "namespace": ns, "name": name}}}
        return bool(json.loads(drain(authz.create_self_subject_access_review(body, _preload_content=False)))
                    ["status"].get("allowed"))

    for verb in ("get", "list", "watch"):
        assert may(verb, "gpupool.io", "gpuautoscalers")
    assert may("patch", "gpupool.io", "gpuautoscalers", "status")
    for res in ("deployments", "statefulsets"):
        assert may("get", "apps", res, "scale") and may("patch", "apps", res, "scale")
    assert may("create", "", "events") and may("patch", "", "events")
    assert may("get", "coordination.k8s.io", "leases", ns=lc.SA_NAMESPACE, name="gpupool-autoscaler")
    # and no more: no deleting workloads, no pods, no secrets, no writing the GpuAutoscaler's spec, no other Lease
    assert not may("delete", "apps", "deployments")
    assert not may("create", "apps", "deployments")
    assert not may("list", "", "pods") and not may("get", "", "secrets")
    assert not may("patch", "gpupool.io", "gpuautoscalers")
    assert not may("update", "coordination.k8s.io", "leases", ns=lc.SA_NAMESPACE, name="gpupool-scheduler")


def test_gpuautoscaler_crd_validates_and_defaults_on_the_apiserver(e2e: E2E,
                                                                    autoscaler_client: client.ApiClient) -> None:
    """The CRD's structural schema and CEL rules, as the apiserver applies them (kubectl apply answers 422)."""
    custom = client.CustomObjectsApi(e2e.admin)

    def create(name: str, **spec: Any) -> dict[str, Any]:
        body = _autoscaler(e2e.ns)
        body["metadata"]["name"] = name
        body["spec"].update(spec)
        return custom.create_namespaced_custom_object("gpupool.io", "v1alpha1", e2e.ns, "gpuautoscalers", body)

    made = create("ok")
    assert made["spec"]["minReplicas"] == 1 and made["spec"]["slicePolicy"]["apply"] is False  # defaults
    assert made["spec"]["scaleTargetRef"]["apiVersion"] == "apps/v1"
    for name, spec, text in [
        ("min-over-max", {"minReplicas": 9, "maxReplicas": 3}, "maxReplicas must be >= minReplicas"),
        ("panic-no-conc", {"panicWindowSeconds": 6, "metrics": [{"name": "rps", "target": 5}]},
         "needs a concurrency metric"),
        ("bad-kind", {"scaleTargetRef": {"kind": "Job", "name": "x"}}, "Unsupported value"),
        ("bad-target", {"metrics": [{"name": "concurrency", "target": 0}]}, "should be greater than 0"),
        ("panic-over-stable", {"panicWindowSeconds": 90}, "must be <= stableWindowSeconds"),
        ("threshold-pct", {"panicWindowSeconds": 6, "panicThreshold": 50}, "is a ratio (> 1, e.g. 2.0)"),
        ("demand-not-metric", {"metrics": [{"name": "concurrency", "target": 8}],
                               "slicePolicy": {"gpuModel": "H200", "demandMetric": "rps", "memoryMiB": 30000,
                                               "capacityPerReplica": {"3g.71gb": 4}}},
         "demandMetric must be one of spec.metrics"),
    ]:
        with pytest.raises(client.exceptions.ApiException) as info:
            create(name, **spec)
        message = json.loads(info.value.body)["message"]
        assert info.value.status == 422 and text in message, (name, message)


def test_autoscaler_writes_only_the_gpu_slice_and_scale(e2e: E2E, autoscaler_client: client.ApiClient) -> None:
    """Issue 33 item 4: as the autoscaler's ServiceAccount a kube-system Deployment's image and ServiceAccount
    were changed and it was scaled to 0. deploy/autoscaler/admission-policy.yaml: the pod template may change only
    in its containers' GPU resources and the slice annotations (what ``slice_template_patch`` writes), replicas
    only through ``scale``, and nothing at all in kube-system; each refusal a 403 naming the part."""
    from gpupool.engine.rightsize import SliceOption
    from gpupool.k8s.autoscaler.crd import slice_template_patch

    apps_admin = client.AppsV1Api(e2e.admin)
    drain(apps_admin.create_namespaced_deployment(e2e.ns, _deployment(e2e.ns), _preload_content=False))
    system = {**_deployment("kube-system"), "metadata": {"name": f"victim-{e2e.ns[-4:]}", "namespace": "kube-system"}}
    drain(apps_admin.create_namespaced_deployment("kube-system", system, _preload_content=False))
    victim = system["metadata"]["name"]
    apps = client.AppsV1Api(autoscaler_client)

    def write(fn, *args) -> tuple[int, str]:
        try:
            drain(fn(*args, _preload_content=False))
            return 200, ""
        except client.ApiException as exc:
            return exc.status, json.loads(exc.body or "{}").get("message", "")

    def template(body: dict[str, Any], ns: str = e2e.ns, name: str = "llm") -> tuple[int, str]:
        return write(apps.patch_namespaced_deployment, name, ns, body)

    try:
        # in effect once the apiserver's policy informer has it
        lc.wait_for(lambda: write(apps.patch_namespaced_deployment_scale, victim, "kube-system",
                                  {"spec": {"replicas": 0}})[0] == 403, 30, "the autoscaler policy in effect",
                    interval=0.2)
        code, msg = write(apps.patch_namespaced_deployment_scale, victim, "kube-system", {"spec": {"replicas": 0}})
        assert code == 403 and msg.endswith("denied request: the gpupool autoscaler writes nothing in namespace "
                                            "kube-system"), msg
        # allowed: scale, and the GPU slice the controller writes (mig 3g.71gb here)
        assert write(apps.patch_namespaced_deployment_scale, "llm", e2e.ns, {"spec": {"replicas": 3}}) == (200, "")
        current = json.loads(apps_admin.read_namespaced_deployment("llm", e2e.ns, _preload_content=False).data)
        option = SliceOption(kind="mig", name="3g.71gb", gpu_fraction=3 / 7, memory_mib=72192, compute_fraction=3 / 7)
        assert template(slice_template_patch(option, current["spec"]["template"])) == (200, "")
        after = json.loads(apps_admin.read_namespaced_deployment("llm", e2e.ns, _preload_content=False).data)
        limits = after["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits == {"nvidia.com/mig-3g.71gb": "1"} and after["spec"]["replicas"] == 3
        container = {"name": "vllm"}
        refusals = {}
        for what, body, expect in [
                ("image", {"spec": {"template": {"spec": {"containers": [{**container, "image": "evil:1"}]}}}},
                 "image"),
                ("serviceAccountName", {"spec": {"template": {"spec": {"serviceAccountName": "default"}}}},
                 "spec.template.spec.serviceAccountName"),
                ("replicas", {"spec": {"replicas": 0}}, "spec.replicas"),
                ("template label", {"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}},
                 "spec.template.metadata.labels"),
                ("other annotation", {"spec": {"template": {"metadata": {"annotations": {"x": "y"}}}}},
                 "annotations x"),
                ("cpu", {"spec": {"template": {"spec": {"containers": [
                    {**container, "resources": {"limits": {"cpu": "64"}}}]}}}}, "other resources"),
                ("metadata label", {"metadata": {"labels": {"x": "y"}}}, "metadata.labels"),
                ("kube-system slice", {"spec": {"template": {"spec": {"containers": [
                    {**container, "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}}}, "kube-system")]:
            code, msg = template(body, *(("kube-system", victim) if what == "kube-system slice" else ()))
            refusals[what] = code
            assert code == 403 and expect in msg, (what, code, msg)
        print(f"\n[e2e] autoscaler policy refusals: {refusals}")
        final = json.loads(apps_admin.read_namespaced_deployment("llm", e2e.ns, _preload_content=False).data)
        assert final["spec"]["template"]["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.6.3"
        assert final["spec"]["replicas"] == 3
    finally:
        drain(apps_admin.delete_namespaced_deployment(victim, "kube-system", _preload_content=False))
