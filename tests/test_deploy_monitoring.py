"""deploy/monitoring/ (ServiceMonitors, PodMonitor, PrometheusRule, Grafana dashboard) and deploy/scrapers/.

The monitoring.coreos.com objects are validated against the openAPIV3Schema of prometheus-operator's own CRDs
(tests/data/prometheus-operator/, v0.93.0, Apache-2.0), with unknown fields refused as kube-apiserver's strict
field validation refuses them; the built-in objects against the Kubernetes 1.30 schemas. Every PromQL expression
(alerts and dashboard) is parsed with promql-parser (a port of Prometheus' own parser) and the metric names it
selects are checked against docs/metrics.md.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import jsonschema
import kubernetes_validate
import promql_parser
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
MONITORING = DEPLOY / "monitoring"
METRICS_DOC = ROOT / "docs" / "metrics.md"
CRDS = Path(__file__).resolve().parent / "data" / "prometheus-operator"
K8S_VERSION = "1.30"
MONITORING_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl not found: cannot render deploy/ with `kubectl kustomize`")


def render(tmp_path: Path, *components: str) -> list[dict]:
    """`kubectl kustomize` of an overlay of deploy/ with the given components (paths relative to deploy/)."""
    rel = os.path.relpath(DEPLOY, tmp_path)
    comps = "".join(f"  - {rel}/{c}\n" for c in components)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel}\n" + (f"components:\n{comps}" if comps else ""))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


# ------------------------------------------------------------------ CRD schemas
def _strict(schema: dict) -> dict:
    """The schema with `additionalProperties: false` wherever it lists properties and neither allows extra keys
    nor preserves unknown fields: kube-apiserver prunes (or, with fieldValidation=Strict, refuses) such keys."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


@cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    out = {}
    for path in sorted(CRDS.glob("monitoring.coreos.com_*.yaml")):
        crd = yaml.safe_load(path.read_text())
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = _strict(version["schema"]["openAPIV3Schema"])
            out[(f"{spec['group']}/{version['name']}", spec["names"]["kind"])] = jsonschema.Draft4Validator(schema)
    return out


def validate_monitoring(obj: dict) -> None:
    crd_validators()[(obj["apiVersion"], obj["kind"])].validate(obj)


def test_monitoring_is_optional_and_not_in_the_default_install(tmp_path):
    base = render(tmp_path)
    assert not [o for o in base if o["kind"] in MONITORING_KINDS]
    assert not [o for o in base if "grafana_dashboard" in (o["metadata"].get("labels") or {})]
    kustomization = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert not kustomization.get("components")
    component = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    assert component["kind"] == "Component"


def test_monitoring_objects_are_valid_prometheus_operator_and_kubernetes_objects(tmp_path):
    objs = render(tmp_path, "monitoring")
    mon = [o for o in objs if o["kind"] in MONITORING_KINDS]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in mon) == [
        ("PodMonitor", "gpupool-agent"), ("PrometheusRule", "gpupool"),
        ("ServiceMonitor", "gpupool-autoscaler"), ("ServiceMonitor", "gpupool-scheduler")]
    for obj in mon:
        assert obj["metadata"]["namespace"] == "gpupool-system"
        validate_monitoring(obj)
    for obj in objs:
        if obj["kind"] not in MONITORING_KINDS:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_crd_validation_is_not_vacuous(tmp_path):
    """A misspelt field, a wrong type and a missing required field are each refused."""
    objs = render(tmp_path, "monitoring")
    sm = _of_kind(objs, "ServiceMonitor")[0]
    bad = copy.deepcopy(sm)
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring(bad)
    bad = copy.deepcopy(sm)
    del bad["spec"]["selector"]
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring(bad)
    rule = copy.deepcopy(_of_kind(objs, "PrometheusRule")[0])
    rule["spec"]["groups"][0]["rules"][0]["for"] = "two minutes"  # not a Prometheus duration
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring(rule)
    pm = copy.deepcopy(_of_kind(objs, "PodMonitor")[0])
    pm["spec"]["podMetricsEndpoints"][0]["ports"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        validate_monitoring(pm)


def _selects(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items()) and not selector.get(
        "matchExpressions")


def test_monitors_select_the_metrics_ports_of_scheduler_agent_and_autoscaler(tmp_path):
    objs = render(tmp_path, "monitoring")
    services = _of_kind(objs, "Service")
    workloads = {o["metadata"]["labels"]["app.kubernetes.io/component"]: o
                 for o in objs if o["kind"] in ("Deployment", "DaemonSet")}
    covered = set()
    for sm in _of_kind(objs, "ServiceMonitor"):
        spec = sm["spec"]
        (svc,) = [s for s in services if _selects(spec["selector"], s["metadata"]["labels"])]
        assert svc["metadata"]["namespace"] in spec["namespaceSelector"]["matchNames"]
        (ep,) = spec["endpoints"]
        (port,) = [p for p in svc["spec"]["ports"] if p["name"] == ep["port"]]
        workload = [w for w in workloads.values()
                    if _selects({"matchLabels": svc["spec"]["selector"]},
                                w["spec"]["template"]["metadata"]["labels"])]
        (w,) = workload
        (c,) = w["spec"]["template"]["spec"]["containers"]
        assert port["targetPort"] in [p["name"] for p in c["ports"]] and ep["path"] == "/metrics"
        covered.add(w["metadata"]["labels"]["app.kubernetes.io/component"])
    (pm,) = _of_kind(objs, "PodMonitor")
    (w,) = [w for w in workloads.values()
            if _selects(pm["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]
    assert w["kind"] == "DaemonSet" and w["metadata"]["namespace"] in pm["spec"]["namespaceSelector"]["matchNames"]
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    (c,) = w["spec"]["template"]["spec"]["containers"]
    assert ep["port"] in [p["name"] for p in c["ports"]] and ep["path"] == "/metrics"
    covered.add("agent")
    assert covered == {"scheduler", "agent", "autoscaler"}


# ------------------------------------------------------------------ PromQL
@cache
def documented() -> dict[str, str]:
    """Metric family -> its type (counter, gauge, histogram), from docs/metrics.md's tables."""
    text = METRICS_DOC.read_text(encoding="utf-8").split("## What to alert on", 1)[0]
    return dict(re.findall(r"^\| `([A-Za-z_:][A-Za-z0-9_:]*)` \| (counter|gauge|histogram) \|", text, re.M))


SUFFIX_TYPE = {"_total": "counter", "_bucket": "histogram", "_sum": "histogram", "_count": "histogram"}


def family(series: str) -> str:
    """The documented family a series name belongs to (`x_total` of counter x, `x_bucket` of histogram x, ...);
    AssertionError for a name docs/metrics.md does not list."""
    fams = documented()
    if series in fams and fams[series] == "gauge":
        return series
    for suffix, kind in SUFFIX_TYPE.items():
        if series.endswith(suffix) and fams.get(series[: -len(suffix)]) == kind:
            return series[: -len(suffix)]
    raise AssertionError(f"{series!r} is not a series of a family in docs/metrics.md")


def selected_names(expr: str) -> set[str]:
    """The metric names an expression selects, from promql-parser's syntax tree (ValueError if it does not parse;
    AssertionError for a selector without a metric name)."""
    names: set[str] = set()

    def walk(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            name = node.name or next((m.value for m in node.matchers.matchers
                                      if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal), None)
            assert name, f"a selector without a metric name in {expr!r}"
            names.add(name)
        elif isinstance(node, promql_parser.MatrixSelector):
            walk(node.vector_selector)
        elif isinstance(node, promql_parser.BinaryExpr):
            walk(node.lhs)
            walk(node.rhs)
        elif isinstance(node, promql_parser.Call):
            for arg in node.args:
                walk(arg)
        elif isinstance(node, promql_parser.AggregateExpr):
            walk(node.expr)
            if node.param is not None:
                walk(node.param)
        elif isinstance(node, (promql_parser.ParenExpr, promql_parser.UnaryExpr, promql_parser.SubqueryExpr)):
            walk(node.expr)

    walk(promql_parser.parse(expr))
    return names


def test_selected_names_sees_every_selector_and_refuses_bad_promql():
    assert selected_names('histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) > on() -b '
                          'and max_over_time(c[5m:1m]) or {__name__="d"} or vector(0)') == {"a_bucket", "b", "c", "d"}
    with pytest.raises(ValueError):
        selected_names("rate(x[5m)")
    with pytest.raises(AssertionError):
        family("gpupool_leader_total")  # a gauge has no _total series


def doc_alerts() -> dict[str, tuple[str, str | None]]:
    """Alert name -> (PromQL, `for` or None), from docs/metrics.md's "What to alert on" table."""
    table = METRICS_DOC.read_text(encoding="utf-8").split("## What to alert on", 1)[1]
    out = {}
    for name, expr, for_ in re.findall(r"^\| `(Gpupool\w+)` \| `((?:[^`])+)`(?: for (\w+))? \|", table, re.M):
        out[name] = (expr.replace("\\|", "|"), for_ or None)
    return out


def test_every_documented_alert_is_a_rule_with_its_expression_and_for(tmp_path):
    (rule_obj,) = _of_kind(render(tmp_path, "monitoring"), "PrometheusRule")
    rules = {r["alert"]: r for g in rule_obj["spec"]["groups"] for r in g["rules"]}
    doc = doc_alerts()
    assert len(doc) >= 13 and set(rules) == set(doc)
    for name, (expr, for_) in doc.items():
        assert " ".join(rules[name]["expr"].split()) == " ".join(expr.split()), name
        assert rules[name].get("for") == for_, name
        assert rules[name]["labels"]["severity"] in ("critical", "warning", "info")
        assert {family(n) for n in selected_names(expr)}, name


def _grafana_to_promql(expr: str) -> str:
    """A Grafana query with its variables replaced as Grafana would before sending it: the interval macros by a
    duration, a template variable by its "All" value."""
    expr = re.sub(r"\$__(rate_interval|interval|range)\b", "5m", expr)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)


def dashboard_queries(dash: dict) -> list[str]:
    queries = []
    for panel in dash["panels"]:
        queries += [t["expr"] for t in panel.get("targets", [])]
        for sub in panel.get("panels", []):
            queries += [t["expr"] for t in sub.get("targets", [])]
    return queries


def test_dashboard_queries_only_documented_metrics_and_shows_every_family():
    dash = json.loads((MONITORING / "dashboard.json").read_text())
    used: set[str] = set()
    for expr in dashboard_queries(dash):
        used |= {family(n) for n in selected_names(_grafana_to_promql(expr))}
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            (metric,) = re.findall(r"^label_values\((\w+), *\w+\)$", var["definition"])
            used.add(family(metric))
    assert used == set(documented()), set(documented()) ^ used
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, panel["title"]
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == "${datasource}"


def test_dashboard_check_is_not_vacuous():
    with pytest.raises(AssertionError):
        family("gpupool_pending_pod")
    assert _grafana_to_promql('rate(x{node=~"$node"}[$__rate_interval])') == 'rate(x{node=~".*"}[5m])'


def test_dashboard_configmap_carries_the_json_for_grafanas_sidecar(tmp_path):
    objs = render(tmp_path, "monitoring")
    (cm,) = [o for o in _of_kind(objs, "ConfigMap") if o["metadata"]["name"] == "gpupool-dashboard"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["gpupool.json"]) == json.loads((MONITORING / "dashboard.json").read_text())


# ------------------------------------------------------------------ who may scrape (NetworkPolicies)
BASE_PEER = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"gpupool.io/metrics-scraper": "true"}}}


@pytest.mark.parametrize(("component", "peer"), [
    ("scrapers/prometheus-operator", {"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}}}),
    ("scrapers/namespace", {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}),
    ("monitoring", {"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "prometheus", "app.kubernetes.io/managed-by": "prometheus-operator"}}}),
])
def test_scraper_components_admit_their_scraper_on_every_metrics_port(tmp_path, component, peer):
    """Each of the three NetworkPolicies keeps the label-based source and gains the component's, on the metrics
    port only; the base install admits the label only."""
    (tmp_path / "base").mkdir()
    (tmp_path / "with").mkdir()
    base = {o["metadata"]["name"]: o for o in _of_kind(render(tmp_path / "base"), "NetworkPolicy")}
    objs = render(tmp_path / "with", component)
    policies = {o["metadata"]["name"]: o for o in _of_kind(objs, "NetworkPolicy")}
    assert set(policies) == set(base) == {"gpupool-scheduler", "gpupool-agent", "gpupool-autoscaler"}
    for name, pol in policies.items():
        kubernetes_validate.validate(pol, K8S_VERSION, strict=True)
        (rule,) = pol["spec"]["ingress"]
        assert rule["from"] == [BASE_PEER, peer], name
        assert rule["ports"] == [{"protocol": "TCP", "port": "metrics"}]
        assert base[name]["spec"]["ingress"][0]["from"] == [BASE_PEER]


def test_deploy_readme_overlays_render(tmp_path):
    """Every overlay deploy/README.md shows (a YAML block naming ../gpupool/deploy, or a bare `patches:` block added
    to one) renders with `kubectl kustomize`, and a scrape patch there reaches all three NetworkPolicies."""
    blocks = re.findall(r"```yaml\n(.*?)```", (DEPLOY / "README.md").read_text(), re.S)
    overlays = [b for b in blocks if "../gpupool/deploy" in b]
    patches = [b for b in blocks if b.startswith("patches:")]
    assert len(overlays) >= 3 and len(patches) == 1
    rel = os.path.relpath(DEPLOY, tmp_path / "o")
    for i, block in enumerate(overlays + patches):
        text = block if block in overlays else (
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../gpupool/deploy\n"
            + block)
        d = tmp_path / "o" / str(i)
        d.mkdir(parents=True)
        (d / "kustomization.yaml").write_text(text.replace("../gpupool/deploy", "../" + rel))
        out = subprocess.run(["kubectl", "kustomize", str(d)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (block, out.stderr)
        if block in patches:
            pols = _of_kind([o for o in yaml.safe_load_all(out.stdout) if o], "NetworkPolicy")
            assert len(pols) == 3 and all(len(p["spec"]["ingress"][0]["from"]) == 2 for p in pols)
