"""``gpupool scheduler --dry-run --snapshot FILE``: planning on kubectl ``-o yaml`` / ``-o json`` snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpupool.cli import app
from gpupool.k8s.requests import QueueSpec
from gpupool.k8s.scheduler_cli import ConfigError, load_config, parse_duration
from gpupool.k8s.snapshot import QueueBook, SnapshotError, load_snapshot, plan, snapshot_from_objects

DATA = Path(__file__).parent / "data" / "snapshots"
ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "snapshots" / "cluster.yaml"  # the README's example
SMALL = DATA / "small.json"


@pytest.fixture(scope="module")
def cluster_plan():  # its fractional pods are placed: "trust" vouches that something on the nodes enforces shares
    return {p.pod: p for p in plan(load_snapshot(CLUSTER), share_enforcement="trust").placements}


def test_snapshot_sorts_objects():
    snap = load_snapshot(CLUSTER)
    assert len(snap.nodes) == 5 and len(snap.pods) == 17
    assert len(snap.pod_groups) == 1 and len(snap.queues or []) == 3


def test_only_pending_pods_of_gpupool_are_planned(cluster_plan):
    assert "default/web-7c9f8" not in cluster_plan  # another scheduler's pod
    assert "ml/gated" not in cluster_plan  # scheduling gate still set
    assert "ml/notebook-alice" not in cluster_plan  # already bound
    assert len(cluster_plan) == 10


def test_fractional_pod_shares_the_gpu_already_in_use(cluster_plan):
    p = cluster_plan["ml/notebook-quarter-gpu"]
    # GPU 4 of gpu-h100-a holds notebook-alice (500 milli, gpupool's annotations); GPUs 0-3 train-llama.
    assert (p.node, p.gpus, p.gpu_milli) == ("gpu-h100-a", (4,), 250)
    assert "policy gpupool chose gpu-h100-a" in p.reason


def test_cordoned_tainted_and_mig_nodes(cluster_plan):
    assert all(p.node != "gpu-h100-b" for p in cluster_plan.values())  # cordoned
    spot = cluster_plan["ml/spot-batch"]
    assert spot.node == "gpu-l4-spot" and len(spot.gpus) == 2  # tolerates the taint, selects the pool
    assert all(p.node != "gpu-l4-spot" for k, p in cluster_plan.items() if k != "ml/spot-batch")
    mig = cluster_plan["ml/mig-small"]
    assert (mig.node, mig.gpus, mig.mig) == ("gpu-a100-mig", (), (("1g.10gb", 1),))


def test_hami_pod(cluster_plan):
    p = cluster_plan["ml/infer-hami"]
    assert p.node == "gpu-h100-a" and p.gpu_milli == 300 and p.gpu_memory_mib == 20000


def test_gangs_all_or_nothing(cluster_plan):
    ddp = [cluster_plan["ml/ddp-0"], cluster_plan["ml/ddp-1"]]
    assert all(p.node for p in ddp) and all(len(p.gpus) == 2 for p in ddp)
    big = [cluster_plan["ml/big-gang-0"], cluster_plan["ml/big-gang-1"]]
    assert all(p.node is None for p in big)
    assert big[0].reason.startswith("gang ml/big-gang cannot be placed together: ml/big-gang-0: 0/5 nodes are "
                                    "available: 1 node(s) were unschedulable or not ready, 1 node(s) had "
                                    "untolerated taint, 3 Insufficient GPU share.")


def test_malformed_pod_and_queue_limit(cluster_plan):
    broken = cluster_plan["ml/broken-fraction"]
    assert broken.node is None and broken.invalid
    assert broken.reason == 'pod ml/broken-fraction: annotation gpu-fraction="1.5": must be a number in (0, 1]'
    refused = cluster_plan["ml/team-b-job"]
    assert refused.reason == "queue team-b would exceed its limit: 0 of 1 GPU in use, 2 more asked"


def test_no_gpu_is_handed_out_twice(cluster_plan):
    snap = load_snapshot(CLUSTER)
    result = plan(snap)
    result.state.check_invariants()
    assert (result.state.gpu_free >= 0).all()


def test_json_snapshot_time_slicing_not_ready_and_memory_requests():
    result = {p.pod: p for p in plan(load_snapshot(SMALL), share_enforcement="trust").placements}
    assert result["team-x/resnet-0"].to_json() == {
        "pod": "team-x/resnet-0", "node": "node-a", "gpus": [0], "gpu_milli": 600, "gpu_memory_mib": 9216,
        "reason": "policy gpupool chose node-a among 1 feasible node(s); GPU 0 at 600 milli, 9216 MiB each",
        "annotations": {"gpupool.io/node": "node-a", "gpupool.io/gpu-index": "0", "gpupool.io/gpu-milli": "600",
                        "gpupool.io/gpu-memory": "9216"}}
    # 8000 MiB do not fit in the 40% of GPU 0's 15360 MiB that is left: GPU 1.
    assert result["team-x/bert-serve"].gpus == (1,)
    assert result["team-x/too-big"].to_json() == {
        "pod": "team-x/too-big", "node": None, "gpus": [], "gpu_milli": 0, "gpu_memory_mib": 0,
        "reason": "0/2 nodes are available: 1 node(s) were unschedulable or not ready, 1 node(s) had fewer than 3 "
                  "distinct GPUs with a free time-slice (each replica asked goes to its own GPU)."}
    assert result["team-x/bad-quantity"].reason == (
        'pod team-x/bad-quantity: spec.containers[0].resources.requests["cpu"]: "two" is not a Kubernetes quantity')


def test_multi_document_yaml_and_typed_lists(tmp_path):
    nodes = {"apiVersion": "v1", "kind": "NodeList", "items": [
        {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "1"}}}]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
           "spec": {"schedulerName": "gpupool", "containers": [{"name": "c", "resources": {
               "limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Pending"}}
    f = tmp_path / "multi.yaml"
    f.write_text(yaml.safe_dump(nodes) + "---\n" + yaml.safe_dump(pod))
    (p,) = plan(load_snapshot(f)).placements
    assert (p.pod, p.node, p.gpus) == ("d/p", "n1", (0,))


@pytest.mark.parametrize("content, message", [
    ("{not json", "invalid JSON"),
    ("a: [b\n", "invalid YAML"),
    ("just a string\n", "no Kubernetes objects found"),
    ("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Service\n  metadata: {name: s}\n",
     "no Node or Pod objects found"),
])
def test_unreadable_snapshots(tmp_path, content, message):
    f = tmp_path / "bad.yaml"
    f.write_text(content)
    with pytest.raises(SnapshotError, match=message):
        load_snapshot(f)
    with pytest.raises(SnapshotError, match="cannot read"):
        load_snapshot(tmp_path / "missing.yaml")


def test_no_nodes_means_every_pod_waits():
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "d"},
           "spec": {"schedulerName": "gpupool", "containers": []}, "status": {"phase": "Pending"}}
    (p,) = plan(snapshot_from_objects([pod])).placements
    assert p.node is None and p.reason.startswith("0/0 nodes are available")


def test_queue_book_hierarchy():
    book = QueueBook({"root": QueueSpec("root", limit_milli=3000), "a": QueueSpec("a", parent="root"),
                      "b": QueueSpec("b", parent="root", limit_milli=1000)})
    book.charge("a", 2000)
    assert book.used == {"a": 2000, "root": 2000}
    assert book.admit({"a": 1000}) == ""
    assert book.admit({"a": 1500}).startswith("queue root would exceed its limit: 2 of 3 GPU in use, 1.5 more")
    assert book.admit({"b": 1500}).startswith("queue b would exceed its limit")
    assert book.admit({"nope": 1}).startswith("queue nope not found")
    assert QueueBook({}, known=False).admit({"anything": 10**6}) == ""


# ------------------------------------------------------------------ the CLI
runner = CliRunner()


def test_cli_dry_run_prints_and_writes_json(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(CLUSTER), "--json", str(out),
                                 "--share-enforcement", "trust"])
    assert result.exit_code == 0, result.output
    assert "ml/notebook-quarter-gpu" in result.output and "dry run, nothing bound" in result.output
    data = json.loads(out.read_text())
    by_pod = {p["pod"]: p for p in data["placements"]}
    assert by_pod["ml/notebook-quarter-gpu"] == {
        "pod": "ml/notebook-quarter-gpu", "node": "gpu-h100-a", "gpus": [4], "gpu_milli": 250, "gpu_memory_mib": 20389,
        "reason": by_pod["ml/notebook-quarter-gpu"]["reason"],
        "annotations": {"gpupool.io/node": "gpu-h100-a", "gpupool.io/gpu-index": "4", "gpupool.io/gpu-milli": "250",
                        "gpupool.io/gpu-memory": "20389"}}
    assert by_pod["ml/broken-fraction"]["node"] is None and "gpu-fraction" in by_pod["ml/broken-fraction"]["reason"]
    assert by_pod["ml/broken-fraction"]["invalid"] is True
    assert set(by_pod["ml/ddp-0"]) >= {"pod", "node", "gpus", "gpu_milli", "gpu_memory_mib", "reason"}
    assert data["summary"] == {"policy": "gpupool", "pending": len(by_pod), "placed": sum(
        1 for p in by_pod.values() if p["node"])}
    assert data["queues"]["team-b"]["limit_gpus"] == 1.0


def test_cli_dry_run_json_to_stdout_and_policy():
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(SMALL), "--json", "-",
                                 "--policy", "best-fit"])
    assert result.exit_code == 0, result.output
    assert {p["pod"] for p in json.loads(result.output)["placements"]} == {
        "team-x/resnet-0", "team-x/bert-serve", "team-x/too-big", "team-x/bad-quantity"}


@pytest.mark.parametrize("args, message", [
    (["--dry-run", "--snapshot", "/nonexistent.yaml"], "cannot read"),
    (["--snapshot", str(CLUSTER)], "--snapshot, --json and --dcgm-file go with --dry-run"),
    (["--dry-run", "--snapshot", str(CLUSTER), "--policy", "nope"], "unknown policy 'nope'"),
])
def test_cli_errors_exit_2(args, message):
    result = runner.invoke(app, ["scheduler", *args])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_other_scheduler_name(tmp_path):
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(CLUSTER), "--scheduler-name",
                                 "nobody", "--json", "-"])
    assert result.exit_code == 0 and json.loads(result.output)["placements"] == []


def test_config_file_of_deploy(tmp_path):
    cm = ROOT / "deploy" / "configmap.yaml"
    if not cm.exists():
        pytest.skip("deploy/ not in this build")
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_load(cm.read_text())["data"]["config.yaml"])
    s = load_config(f)
    assert s.leader_elect and s.scheduler_name == "gpupool" and s.lease_name == "gpupool-scheduler"
    assert (s.lease_duration, s.renew_deadline, s.retry_period) == (15.0, 10.0, 2.0)
    assert s.metrics_address == "0.0.0.0:8080" and s.log_format == "json"


def test_config_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("leaderElection:\n  leaseDuration: soon\n")
    with pytest.raises(ConfigError, match=r"leaderElection.leaseDuration: 'soon' is not a duration"):
        load_config(f)
    f.write_text("profiles:\n- schedulerName: a\n- schedulerName: b\n")
    with pytest.raises(ConfigError, match="gpupool runs one profile, got 2"):
        load_config(f)
    assert parse_duration("1m30s", "x") == 90 and parse_duration("500ms", "x") == 0.5 and parse_duration(3, "x") == 3


def test_help_lists_the_flags_deploy_uses():
    result = runner.invoke(app, ["scheduler", "--help"], terminal_width=200)
    for flag in ("--leader-elect", "--config", "--dry-run", "--snapshot", "--json", "--kubeconfig", "--policy"):
        assert flag in result.output


def test_readme_dry_run_commands_run_as_written(tmp_path, monkeypatch):
    """Every `gpupool scheduler --dry-run ...` line of the README and docs/ runs, from the repository root, as
    written."""
    import shlex

    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    lines, joined = [], ""
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].rstrip() if "#" in raw and not raw.lstrip().startswith("#") else raw.rstrip()
        part = line.rstrip("\\").strip()
        joined = f"{joined} {part}" if joined else part
        if line.endswith("\\"):
            continue
        if joined.startswith("gpupool scheduler --dry-run"):
            lines.append(joined)
        joined = ""
    assert len(lines) >= 3
    monkeypatch.chdir(ROOT)
    for line in lines:
        args = shlex.split(line)[1:]
        if any(a.startswith("../shared") for a in args) and not (ROOT.parent / "shared").exists():
            continue
        args = [str(tmp_path / "placements.json") if a == "placements.json" else a for a in args]
        result = runner.invoke(app, args)
        assert result.exit_code == 0, f"{line}: {result.output}"
        assert "pending pod(s) placed" in result.output or '"placements"' in result.output, line


def test_cli_snapshot_without_a_usable_node_is_an_error(tmp_path):
    lone = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(ROOT / "examples/k8s/pod-fractional.yaml")])
    assert lone.exit_code == 2 and "no usable node in the snapshot (it holds no Node" in lone.output
    nameless = tmp_path / "nameless.yaml"
    nameless.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Node", "metadata": {}, "status": {"allocatable": {"nvidia.com/gpu": "1"}}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"schedulerName": "gpupool"}}]}))
    bad = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(nameless)])
    assert bad.exit_code == 2 and "no usable node in the snapshot (" in bad.output and "metadata.name" in bad.output


def test_cli_dry_run_waits_for_victims_in_flight_and_plans_no_second_eviction(tmp_path):
    """Issue 29 on the dry-run path: a snapshot taken while a reclaim is under way (a's 8 pods nominated, 8 of b's
    pods Terminating with DisruptionTarget) plans no eviction: the Terminating pods are leaving, not b's usage nor
    victims; a's pods are placed where they free GPUs, nominated (not bound) until they are gone."""
    import datetime as dt

    from k8s_pool_harness import node, pod, queue

    now = dt.datetime.now(dt.UTC)
    objs: list[dict] = [node("n0", gpus=8), node("n1", gpus=8), queue("a", quota=8), queue("b", quota=8)]
    for i in range(16):
        p = pod(f"b-{i:02d}", 1, queue="b", created=now.timestamp() - 1_700_003_600 + i)
        n = f"n{i // 8}"
        p["spec"]["nodeName"] = n
        p["metadata"]["annotations"] = {"gpupool.io/node": n, "gpupool.io/gpu-index": str(i % 8),
                                        "gpupool.io/gpu-milli": "1000"}
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        if i >= 8:  # the victims of the reclaim, terminating (grace 30 s from now)
            p["metadata"]["deletionTimestamp"] = (now + dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
            p["status"]["conditions"].append({"type": "DisruptionTarget", "status": "True",
                                              "reason": "PreemptionByScheduler", "message": "reclaimed by a"})
        objs.append(p)
    for i in range(8):
        p = pod(f"a-{i}", 1, queue="a", created=now.timestamp() - 1_700_000_010)
        p["status"]["nominatedNodeName"] = "n1"
        objs.append(p)
    snap = tmp_path / "reclaim.json"
    snap.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objs}))
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(snap), "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert "preemptions" not in data and "evictions" not in data["summary"], data.get("preemptions")
    by_pod = {p["pod"]: p for p in data["placements"]}
    assert sorted(by_pod) == [f"default/a-{i}" for i in range(8)]
    assert {p["node"] for p in by_pod.values()} == {"n1"}  # the GPUs the victims free
    assert all("terminate" in p["reason"] for p in by_pod.values()), [p["reason"] for p in by_pod.values()]


@pytest.mark.parametrize("args, message", [
    # before: Click's 4-line usage error, "Input should be greater than or equal to 0", the value not named;
    # infinities passed
    (("--seed", "-1"), "error: --seed must be >= 0, got -1\n"),
    (("--reserve-after", "inf"), "error: --reserve-after must be a finite number >= 0, got inf\n"),
    (("--min-runtime", "nan"), "error: --min-runtime must be a finite number >= 0, got nan\n"),
    (("--min-runtime", "-5"), "error: --min-runtime must be >= 0, got -5\n"),
])
def test_scheduler_numbers_out_of_bounds_are_one_line(args, message):
    result = runner.invoke(app, ["scheduler", "--dry-run", "--snapshot", str(SMALL), *args])
    assert result.exit_code == 2
    assert result.output == message
