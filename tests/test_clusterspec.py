"""Tests of gpupool.clusterspec: the example clusters, layout rules, and error messages (file + YAML path)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from gpupool.cluster import ClusterState
from gpupool.clusterspec import (
    DEFAULT_LEVELS,
    POOL_LABEL,
    ClusterSpecError,
    cluster_from_dict,
    load_cluster,
    load_cluster_yaml,
    parse_cluster,
)
from gpupool.model import GpupoolError, NodeSpec
from gpupool.topology import tier_of_nodes
from gpupool.traces import load_itp_jobs, load_philly_jobs

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples" / "clusters"
TRACES = ROOT.parent / "shared" / "traces"
EXAMPLE_FILES = sorted(p.name for p in EXAMPLES.glob("*.yaml"))

CAPACITY = re.compile(r"^# capacity: (\d+) nodes, (\d+) GPUs", re.M)
SIZING = re.compile(
    r"^# sizing: ([\d,]+) GPU-h / ([\d,.]+) h = ([\d.]+) busy GPUs on average; (\d+) GPUs = ([\d.]+)x", re.M
)


def _num(text: str) -> float:
    return float(text.replace(",", ""))


# ------------------------------------------------------------------------------------------ examples


def test_examples_present() -> None:
    assert {"small.yaml", "philly.yaml", "itp-cluster04.yaml", "mixed-models.yaml"} <= set(EXAMPLE_FILES)


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_example_loads_with_the_capacity_its_comment_claims(name: str) -> None:
    path = EXAMPLES / name
    loaded = load_cluster(path)
    assert loaded.warnings == []
    m = CAPACITY.search(path.read_text())
    assert m, f"{name} has no '# capacity: N nodes, M GPUs' comment"
    assert (len(loaded.nodes), loaded.total_gpus) == (int(m.group(1)), int(m.group(2)))
    # a per-model breakdown in the same comment, e.g. "(384 V100M16 + 128 P100)", must add up too
    line = path.read_text()[m.start() :].splitlines()[0]
    breakdown = re.findall(r"(\d+) ([A-Za-z0-9-]+)(?= \+|\))", line)
    per_model: dict[str, int] = {}
    for node in loaded.nodes:
        if node.gpu_count:
            per_model[node.gpu_model] = per_model.get(node.gpu_model, 0) + node.gpu_count
    assert {model: int(count) for count, model in breakdown} == per_model
    state = ClusterState(loaded.nodes)  # the engine accepts it
    assert int(state.gpu_count.sum()) == loaded.total_gpus
    assert loaded.nodes == load_cluster_yaml(path)


def test_small_example_layout() -> None:
    loaded = load_cluster(EXAMPLES / "small.yaml")
    assert loaded.name == "small"
    by_name = {n.name: n for n in loaded.nodes}
    assert list(by_name) == ["hgx-0000", "hgx-0001", "pcie-0000", "pcie-0001", "cpu-0000"]
    hgx = by_name["hgx-0001"]
    assert (hgx.cpu_milli, hgx.memory_mib, hgx.gpu_count, hgx.gpu_model) == (128000, 1024 * 1024, 8, "A100-80GB")
    assert (hgx.nvlink_domain, hgx.rack, hgx.switch) == ("hgx-0001", "hgx-rack-0", "leaf-0")
    pcie = by_name["pcie-0000"]
    assert (pcie.cpu_milli, pcie.memory_mib, pcie.gpu_count, pcie.nvlink_domain) == (32000, 131072, 4, "")
    assert (pcie.rack, pcie.switch) == ("pcie-rack-0", "leaf-1")
    cpu = by_name["cpu-0000"]
    assert (cpu.gpu_count, cpu.gpu_model, cpu.rack, cpu.switch) == (0, "", "", "")
    labels = dict(hgx.labels)
    assert labels == {
        POOL_LABEL: "hgx",
        "gpupool.io/purpose": "training",
        "nvidia.com/gpu.clique": "hgx-0001",
        "kubernetes.io/hostname": "hgx-0001",
        "topology.gpupool.io/rack": "hgx-rack-0",
        "topology.gpupool.io/switch": "leaf-0",
    }
    assert "nvidia.com/gpu.clique" not in dict(pcie.labels)  # no NVLink domain, no label
    assert [lv.name for lv in loaded.doc.levels] == ["nvlink", "node", "rack", "switch", "spine"]


def test_philly_example_topology() -> None:
    nodes = load_cluster_yaml(EXAMPLES / "philly.yaml")
    names = [n.name for n in nodes]
    assert names[0] == "v100-hgx-0000" and names[47] == "v100-hgx-0047" and names[48] == "p100-pcie-0000"
    assert [nodes[i].rack for i in (0, 7, 8, 47, 48)] == [
        "v100-hgx-rack-0", "v100-hgx-rack-0", "v100-hgx-rack-1", "v100-hgx-rack-5", "p100-pcie-rack-0",
    ]
    # 6 V100 racks: leaf-0 holds racks 0-3, leaf-1 racks 4-5; the P100 pool starts a new leaf
    switches = [nodes[i].switch for i in (0, 31, 32, 47, 48, 79)]
    assert switches == ["leaf-0", "leaf-0", "leaf-1", "leaf-1", "leaf-2", "leaf-2"]
    assert tier_of_nodes(nodes, [0]) == "nvlink"
    assert tier_of_nodes(nodes, [48]) == "node"
    assert tier_of_nodes(nodes, [0, 1]) == "switch"  # same rack
    assert tier_of_nodes(nodes, [0, 31]) == "switch"  # rack 0 and rack 3, one leaf
    assert tier_of_nodes(nodes, [0, 32]) == "spine"
    assert tier_of_nodes(nodes, [47, 48]) == "spine"


@pytest.mark.parametrize(
    ("name", "loader", "trace"),
    [
        ("philly.yaml", load_philly_jobs, "philly_pollux/philly.csv"),
        ("itp-cluster04.yaml", load_itp_jobs, "msr_itp_elasticflow/cluster04.csv"),
    ],
)
def test_trace_sized_examples_match_their_trace(name: str, loader, trace: str) -> None:
    path = TRACES / trace
    if not path.exists():
        pytest.skip(f"{path} not available")
    text = (EXAMPLES / name).read_text()
    m = SIZING.search(text)
    assert m, f"{name} has no '# sizing:' comment"
    gpu_h, span_h, avg, gpus, ratio = (_num(g) for g in m.groups())
    jobs = loader(path)
    real_gpu_h = sum(j.duration * j.num_gpu for j in jobs) / 3600
    real_span_h = max(j.submit_time for j in jobs) / 3600
    assert gpu_h == pytest.approx(real_gpu_h, abs=1)
    assert span_h == pytest.approx(real_span_h, abs=0.05)
    assert avg == pytest.approx(real_gpu_h / real_span_h, abs=0.05)
    loaded = load_cluster(EXAMPLES / name)
    assert gpus == loaded.total_gpus
    assert ratio == pytest.approx(loaded.total_gpus / avg, abs=0.005)
    assert 1.3 <= loaded.total_gpus / avg <= 1.5
    assert loaded.total_gpus % 8 == 0
    assert max(j.num_gpu for j in jobs) <= loaded.total_gpus


# ------------------------------------------------------------------------------------------ layout rules


def doc(*pools: dict, **spec: object) -> dict:
    return {
        "apiVersion": "gpupool.io/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": "t"},
        "spec": {"nodePools": list(pools), **spec},
    }


def pool(name: str = "p", **kw: object) -> dict:
    return {"name": name, "count": 1, "cpuMilli": 1000, "memoryMiB": 1024} | kw


def test_layout_rules() -> None:
    nodes = cluster_from_dict(
        doc(
            pool("a", count=5, gpuModel="T4", gpusPerNode=2, nodesPerRack=2),  # 3 racks, one leaf each
            pool("b", count=3, nodesPerRack=1, racksPerSwitch=2),  # 3 racks on 2 leaves
            pool("c", count=2),  # no rack, no switch
        )
    )
    got = [(n.name, n.rack, n.switch) for n in nodes]
    assert got == [
        ("a-0000", "a-rack-0", "leaf-0"),
        ("a-0001", "a-rack-0", "leaf-0"),
        ("a-0002", "a-rack-1", "leaf-1"),
        ("a-0003", "a-rack-1", "leaf-1"),
        ("a-0004", "a-rack-2", "leaf-2"),
        ("b-0000", "b-rack-0", "leaf-3"),
        ("b-0001", "b-rack-1", "leaf-3"),
        ("b-0002", "b-rack-2", "leaf-4"),
        ("c-0000", "", ""),
        ("c-0001", "", ""),
    ]
    assert all(n.nvlink_domain == "" for n in nodes)
    # default levels label the node with its rack and switch
    assert dict(nodes[0].labels)["topology.gpupool.io/switch"] == "leaf-0"
    assert "topology.gpupool.io/rack" not in dict(nodes[-1].labels)
    assert [lv.name for lv in DEFAULT_LEVELS] == ["nvlink", "node", "rack", "switch", "spine"]


def test_units_and_zero_count_pools() -> None:
    nodes = cluster_from_dict(
        doc(
            {"name": "x", "count": 1, "cpuCores": 0.5, "memoryGiB": 1.5},
            {"name": "y", "count": 0, "cpuMilli": 1, "memoryMiB": 1},
        )
    )
    assert nodes == [NodeSpec("x-0000", 500, 1536)]


def test_parse_cluster_and_dict_agree_with_the_file(tmp_path: Path) -> None:
    data = yaml.safe_load((EXAMPLES / "small.yaml").read_text())
    assert cluster_from_dict(data) == load_cluster_yaml(EXAMPLES / "small.yaml")
    loaded = parse_cluster(data, source="inline")
    assert loaded.source == "inline" and loaded.total_gpus == 24


# ------------------------------------------------------------------------------------------ errors

BASE = """\
apiVersion: gpupool.io/v1alpha1
kind: Cluster
metadata:
  name: t
spec:
  nodePools:
    - name: a
      count: 2
      gpuModel: V100M16
      gpusPerNode: 8
      cpuCores: 8
      memoryGiB: 64
      nvlink: true
    - name: b
      count: 1
      gpusPerNode: 4
      gpuModel: T4
      cpuMilli: 1000
      memoryMiB: 1024
"""


def write(tmp_path: Path, text: str, name: str = "philly.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("gpusPerNode: 4", "gpusPerNode: -1", "spec.nodePools[1].gpusPerNode: must be >= 0, got -1 (line 16)"),
        ("count: 1", "count: 1.5", "spec.nodePools[1].count: must be an integer, got 1.5 (line 15)"),
        ("count: 2", "count: true", "spec.nodePools[0].count: must be an integer, got True (line 8)"),
        ("count: 2", "count: -2", "spec.nodePools[0].count: must be >= 0, got -2 (line 8)"),
        ("nvlink: true", "nvlink: 1", "spec.nodePools[0].nvlink: must be true or false, got 1 (line 13)"),
        ("nvlink: true", "nvlnk: true", "spec.nodePools[0].nvlnk: unknown field; did you mean 'nvlink'? (line 13)"),
        ("cpuMilli: 1000", "cpuMilli: 1000\n      cpuCores: 1", "spec.nodePools[1].cpuCores: give either cpuMilli or"),
        ("      cpuMilli: 1000\n", "", "spec.nodePools[1].cpuMilli: required (or cpuCores) (line 14)"),
        ("memoryGiB: 64", "memoryGiB: 0.0001", "spec.nodePools[0].memoryGiB: 0.0001 GiB is not a whole number of MiB"),
        ("memoryGiB: 64", "memoryGiB: lots", "spec.nodePools[0].memoryGiB: must be a number, got 'lots' (line 12)"),
        ("      gpuModel: T4\n", "", "spec.nodePools[1].gpuModel: required when gpusPerNode > 0 (gpusPerNode is 4)"),
        ("gpusPerNode: 8", "gpusPerNode: 1", "spec.nodePools[0].nvlink: an NVLink domain needs gpusPerNode >= 2"),
        ("name: b", "name: a", "spec.nodePools[1].name: duplicate pool name 'a' (also nodePools[0]) (line 14)"),
        ("name: b", "name: B_1", "spec.nodePools[1].name: 'B_1' is not a valid pool name"),
        ("memoryMiB: 1024", "memoryMiB: 1024\n      racksPerSwitch: 2", "[1].racksPerSwitch: needs nodesPerRack"),
        ("memoryMiB: 1024", "memoryMiB: 1024\n      nodesPerRack: 0", "nodePools[1].nodesPerRack: must be >= 1, got 0"),
        ("memoryMiB: 1024", "memoryMiB: 1024\n      labels: {'bad key': x}", "spec.nodePools[1].labels: not a valid"),
        ("kind: Cluster", "kind: Pod", "kind: must be 'Cluster', got 'Pod' (line 2)"),
        ("apiVersion: gpupool.io/v1alpha1", "apiVersion: v1", "apiVersion: must be 'gpupool.io/v1alpha1', got 'v1'"),
        ("  name: t\n", "  labels: {}\n", "metadata.name: required (line 3)"),
        ("metadata:", "metdata:", "metdata: unknown field; did you mean 'metadata'? (line 3)"),
    ],
)
def test_error_names_file_and_yaml_path(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in BASE
    path = write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(ClusterSpecError) as info:
        load_cluster_yaml(path)
    text = str(info.value)
    assert text.startswith(f"{path}: ")
    assert message in text
    assert info.value.file == str(path)
    assert isinstance(info.value, GpupoolError) and isinstance(info.value, ValueError)


def test_base_is_valid(tmp_path: Path) -> None:
    assert len(load_cluster_yaml(write(tmp_path, BASE))) == 3


def test_several_problems_are_listed(tmp_path: Path) -> None:
    text = BASE.replace("gpusPerNode: 4", "gpusPerNode: -1").replace("count: 2", "count: x")
    with pytest.raises(ClusterSpecError) as info:
        load_cluster_yaml(write(tmp_path, text, "two.yaml"))
    lines = str(info.value).splitlines()
    assert lines[0] == f"{tmp_path / 'two.yaml'}: 2 problems:"
    assert lines[1] == "  spec.nodePools[0].count: must be an integer, got 'x' (line 8)"
    assert lines[2] == "  spec.nodePools[1].gpusPerNode: must be >= 0, got -1 (line 16)"
    assert [p[0] for p in info.value.problems] == ["spec.nodePools[0].count", "spec.nodePools[1].gpusPerNode"]


def test_topology_levels_errors(tmp_path: Path) -> None:
    bad = BASE + "  topology:\n    levels:\n      - {name: switch}\n      - {name: node}\n      - {name: galaxy}\n"
    with pytest.raises(ClusterSpecError, match=r"spec\.topology\.levels\[2\]\.name: must be 'nvlink', 'node'"):
        load_cluster_yaml(write(tmp_path, bad))
    bad = BASE + "  topology:\n    levels:\n      - {name: switch}\n      - {name: node}\n      - {name: switch}\n"
    with pytest.raises(ClusterSpecError) as info:
        load_cluster_yaml(write(tmp_path, bad))
    assert "spec.topology.levels[1].name: levels must go fastest to slowest" in str(info.value)
    assert "spec.topology.levels[2].name: duplicate level 'switch' (also levels[0]) (line 24)" in str(info.value)


def test_structural_errors(tmp_path: Path) -> None:
    for text, message in [
        ("", "expected a mapping (a Cluster resource) at the top level, got empty"),
        ("- a\n- b\n", "at the top level, got list"),
        ("a: [1,\n b: 2\n", "invalid YAML: expected ',' or ']'"),
        ("a: 1\n---\nb: 2\n", "invalid YAML"),
        (BASE.replace("    - name: a", "    - 3\n    - name: a", 1), "spec.nodePools[0]: must be a mapping, got int"),
        (BASE.split("    - name: a")[0] + "    []\n", "spec.nodePools: must not be empty"),
        (BASE.replace("count: 2", "count: 0").replace("count: 1", "count: 0"), "spec.nodePools: the cluster has no"),
    ]:
        with pytest.raises(ClusterSpecError) as info:
            load_cluster(write(tmp_path, text, "bad.yaml"))
        assert str(info.value).startswith(f"{tmp_path / 'bad.yaml'}" + (":" if "YAML" in message else ": "))
        assert message in str(info.value), str(info.value)
    with pytest.raises(OSError):
        load_cluster(tmp_path / "missing.yaml")
    with pytest.raises(ClusterSpecError, match=r"^<dict>: kind: required"):
        cluster_from_dict({"apiVersion": "gpupool.io/v1alpha1", "metadata": {"name": "t"}, "spec": doc(pool())["spec"]})


def test_unknown_gpu_model_is_kept_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path, BASE.replace("gpuModel: T4", "gpuModel: P40"), "opaque.yaml")
    loaded = load_cluster(path)
    assert loaded.nodes[2].gpu_model == "P40"
    assert loaded.warnings == [
        "spec.nodePools[1].gpuModel: 'P40' is not in the GPU catalog; kept as an opaque model "
        "(no memory, power or throughput figures)"
    ]
    with caplog.at_level(logging.WARNING, logger="gpupool.clusterspec"):
        nodes = load_cluster_yaml(path)
    assert nodes == loaded.nodes
    assert [r.getMessage() for r in caplog.records] == [f"{path}: {loaded.warnings[0]}"]
    # aliases of catalog models are not warned about
    alias = write(tmp_path, BASE.replace("gpuModel: T4", "gpuModel: Tesla-T4"), "alias.yaml")
    assert load_cluster(alias).warnings == []


def test_a_yaml_error_is_one_line_with_file_line_and_column(tmp_path: Path) -> None:
    # before: "FILE: invalid YAML: ... (line 4)", no column; now the form every loader uses (gpupool.inputs)
    path = write(tmp_path, BASE.replace("    - name: a", "    - name: a\n   gpusPerNode: 8", 1), "bad.yaml")
    with pytest.raises(ClusterSpecError) as info:
        load_cluster(path)
    line = BASE.splitlines().index("    - name: a") + 2
    assert re.fullmatch(rf"{re.escape(str(path))}:{line}:\d+: invalid YAML: [^\n]+", str(info.value)), str(info.value)
