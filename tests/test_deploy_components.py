"""Optional kustomize components and overlays of deploy/: the autoscaler confined to one namespace
(deploy/autoscaler/namespaced) and the presets for KAI, Volcano and HAMi users (deploy/presets/).

Rendered with `kubectl kustomize` (its built-in kustomize, as `kubectl apply -k` renders), every object validated
against the Kubernetes 1.30 schemas, strict.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S_VERSION = "1.30"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None,
                                reason="kubectl not found: cannot render deploy/ with `kubectl kustomize`")


def kustomize(path: Path) -> list[dict]:
    out = subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def overlay(tmp_path: Path, *components: str, base: Path = DEPLOY) -> list[dict]:
    """An overlay of deploy/ with the given components (absolute paths or relative to deploy/)."""
    rel = os.path.relpath(base, tmp_path)
    comps = "".join(f"  - {os.path.relpath(DEPLOY / c, tmp_path)}\n" for c in components)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {rel}\ncomponents:\n{comps}")
    return kustomize(tmp_path)


def _autoscaler(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind
            and (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "autoscaler"]


def _base_autoscaler_rules() -> list[dict]:
    (cr,) = [d for d in yaml.safe_load_all((DEPLOY / "autoscaler" / "rbac.yaml").read_text())
             if d and d["kind"] == "ClusterRole"]
    return cr["rules"]


# ------------------------------------------------------------------ autoscaler/namespaced
def test_namespaced_autoscaler_has_no_cluster_wide_grant(tmp_path):
    objs = overlay(tmp_path, "autoscaler/namespaced")
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert not _autoscaler(objs, "ClusterRole") and not _autoscaler(objs, "ClusterRoleBinding")
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in _autoscaler(objs, "Role")}
    assert set(roles) == {("gpupool-system", "gpupool-autoscaler"), ("default", "gpupool-autoscaler-watched")}
    # the same verbs as the base ClusterRole, in the watched namespace only
    assert roles[("default", "gpupool-autoscaler-watched")]["rules"] == _base_autoscaler_rules()
    bindings = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in _autoscaler(objs, "RoleBinding")}
    watched = bindings[("default", "gpupool-autoscaler-watched")]
    assert watched["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": "gpupool-autoscaler-watched"}
    assert watched["subjects"] == [{"kind": "ServiceAccount", "name": "gpupool-autoscaler",
                                    "namespace": "gpupool-system"}]
    (dep,) = _autoscaler(objs, "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert {"name": "GPUPOOL_WATCH_NAMESPACE", "value": "default"} in c["env"]
    # the base install is unchanged: the cluster-wide grant, no watched namespace
    (tmp_path / "base").mkdir()
    base = overlay(tmp_path / "base")
    assert len(_autoscaler(base, "ClusterRole")) == 1
    (c,) = _autoscaler(base, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert "GPUPOOL_WATCH_NAMESPACE" not in [e["name"] for e in c["env"]]


def test_namespaced_autoscaler_takes_the_namespace_from_one_place(tmp_path):
    """A copy of the component with role.yaml's namespace changed moves the RoleBinding and the controller's
    --namespace with it (the kustomize replacements)."""
    comp = tmp_path / "my-namespaced"
    shutil.copytree(DEPLOY / "autoscaler" / "namespaced", comp)
    role = comp / "role.yaml"
    text = role.read_text()
    assert text.count("namespace: default") == 1
    role.write_text(text.replace("namespace: default", "namespace: ml-serving"))
    (tmp_path / "o").mkdir()
    objs = overlay(tmp_path / "o", str(comp))
    assert {(o["kind"], o["metadata"]["namespace"]) for o in _autoscaler(objs, "Role") + _autoscaler(
        objs, "RoleBinding") if o["metadata"]["name"] == "gpupool-autoscaler-watched"} == {
        ("Role", "ml-serving"), ("RoleBinding", "ml-serving")}
    (c,) = _autoscaler(objs, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    assert {"name": "GPUPOOL_WATCH_NAMESPACE", "value": "ml-serving"} in c["env"]


def test_gpupool_watch_namespace_is_the_autoscalers_namespace_option(monkeypatch):
    import gpupool.k8s.autoscaler.cli as autoscaler_cli
    from gpupool.cli import app

    seen = {}
    monkeypatch.setattr(autoscaler_cli, "run_autoscaler", lambda url, **kw: seen.update(kw, url=url))
    result = CliRunner().invoke(app, ["autoscaler", "--prometheus-url", "http://prom:9090"],
                                env={"GPUPOOL_WATCH_NAMESPACE": "ml-serving"})
    assert result.exit_code == 0, result.output
    assert seen["namespace"] == "ml-serving"
    result = CliRunner().invoke(app, ["autoscaler", "--prometheus-url", "http://prom:9090", "--namespace", "x"],
                                env={"GPUPOOL_WATCH_NAMESPACE": "ml-serving"})
    assert seen["namespace"] == "x"  # the flag wins over the environment


# ------------------------------------------------------------------ presets/{kai,volcano,hami}
SNAPSHOT = ROOT / "examples" / "snapshots" / "cluster.yaml"
PRESETS = {  # preset -> (the anchor's schedulerName, shareEnforcement)
    "kai": ("kai-scheduler", "none"),
    "volcano": ("volcano", "none"),
    "hami": ("hami-scheduler", "hami"),
}


def _scheduler_args(objs: list[dict], tmp_path: Path) -> list[str]:
    """The rendered scheduler container's arguments after `scheduler`, runnable here: --config points at the
    rendered ConfigMap's config.yaml written to tmp_path."""
    (dep,) = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == "gpupool-scheduler"]
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "scheduler"
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "gpupool-config"]
    config = tmp_path / "config.yaml"
    config.write_text(cm["data"]["config.yaml"])
    return [f"--config={config}" if a.startswith("--config=") else a for a in c["args"][1:]]


def _dry_run(args: list[str], snapshot: Path, out: Path) -> list[tuple[str, str | None]]:
    from gpupool.cli import app

    result = CliRunner().invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snapshot), "--json", str(out),
                                      *args])
    assert result.exit_code == 0, result.output
    return [(p["pod"], p["node"]) for p in json.loads(out.read_text())["placements"]]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_preset_renders_and_serves_the_anchors_scheduler_name(tmp_path, preset):
    """Each preset: valid Kubernetes 1.30 objects; the scheduler started with the anchor's scheduler name and share
    enforcement; run with those exact arguments (and the rendered config) on the example snapshot whose gpupool pods
    are renamed to the anchor's scheduler, it plans the same pods as the base install plans on the original (the
    same placements where shares are refused as in the base), and none of the pods still naming gpupool."""
    name, enforcement = PRESETS[preset]
    (tmp_path / "p").mkdir()
    objs = overlay(tmp_path / "p", f"presets/{preset}")
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    args = _scheduler_args(objs, tmp_path / "p")
    assert args[-2:] == [f"--scheduler-name={name}", f"--share-enforcement={enforcement}"]
    (cr,) = [o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "gpupool-scheduler"]
    node_writes = {v for r in cr["rules"] if "nodes" in r["resources"] and r["apiGroups"] == [""] for v in r["verbs"]}
    assert ("patch" in node_writes) == (enforcement == "hami")  # HAMi's node lock only

    (tmp_path / "b").mkdir()
    base_args = _scheduler_args(overlay(tmp_path / "b"), tmp_path / "b")
    base = _dry_run(base_args, SNAPSHOT, tmp_path / "base.json")
    assert len(base) >= 5
    renamed = tmp_path / "snapshot.yaml"
    text = SNAPSHOT.read_text()
    assert "schedulerName: gpupool" in text
    renamed.write_text(text.replace("schedulerName: gpupool", f"schedulerName: {name}"))
    served = _dry_run(args, renamed, tmp_path / "preset.json")
    assert [pod for pod, _ in served] == [pod for pod, _ in base]
    if enforcement == "none":
        assert served == base
    assert _dry_run(args, SNAPSHOT, tmp_path / "gpupool-named.json") == []
