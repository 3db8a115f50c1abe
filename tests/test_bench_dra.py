"""benchmarks/dra_stream.py (the openb-shaped claim stream) and benchmarks/dra_offline.py (offline best fit and
the audit of claims' allocations). The live harness (bench_dra.py) needs the real control plane; its numbers are
in benchmarks/results/dra_vs_kube_scheduler.json."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from conftest import bench_module
from gpupool.k8s.objects.dra import AllocatedDevice, claim_allocation_status, parse_claim

ds = bench_module("dra_stream.py")
do = bench_module("dra_offline.py")

TRACE = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
         "scheduled_time\n")


@pytest.fixture(scope="module")
def stream():
    if not ds.DEFAULT_TRACE.exists():
        pytest.skip(f"{ds.DEFAULT_TRACE} absent")
    return ds.build(seed=7)


def test_stream_is_deterministic_and_names_the_scheduler(stream) -> None:
    again = ds.build(seed=7)
    assert again.items() == stream.items()
    other = ds.build(seed=7, scheduler_name="gpupool")
    assert {p["spec"]["schedulerName"] for p in other.pods} == {"gpupool"}
    assert [p["metadata"]["name"] for p in other.pods] == [p["metadata"]["name"] for p in stream.pods]
    assert ds.build(seed=8).items() != stream.items()


def test_stream_shape(stream) -> None:
    assert len(stream.nodes) == 20 and stream.capacity_gpus == 160
    assert sum(a.gpus for a in stream.asks) >= 1.3 * 160
    kinds = {a.kind for a in stream.asks}
    assert kinds == {"gpu", "mig", "shared"}
    assert {a.count for a in stream.asks if a.kind == "gpu"} <= {1, 2, 4, 8}
    for a, p in zip(stream.asks, stream.pods, strict=True):
        assert ds.ask_of(p) == a
        req = p["spec"]["containers"][0]["resources"]["requests"]
        assert req == {"cpu": f"{a.cpu_milli}m", "memory": f"{a.memory_mib}Mi"}
        if a.kind == "mig":
            assert a.compute_slices in (1, 2, 3, 4, 7) and a.compute_slices * 1000 >= 7 * a.gpu_milli
            assert all(n.startswith(f"{a.compute_slices}g.") for n in a.profiles) and len(a.profiles) == 2
    templates = {t["metadata"]["name"]: t for t in stream.templates}
    assert set(templates) == {a.template for a in stream.asks}
    mig = templates["mig-1g"]["spec"]["spec"]["devices"]["requests"][0]["exactly"] if "mig-1g" in templates else None
    if mig:
        assert mig["selectors"][0]["cel"]["expression"] == (
            "device.attributes['gpu.nvidia.com'].profile in ['1g.10gb', '1g.18gb']")


def test_direct_claims_parse_with_gpupool(stream) -> None:
    st = ds.build(seed=7, claims="direct")
    assert len(st.claims) == len(st.pods) and not st.templates
    for c, a in zip(st.claims, st.asks, strict=True):
        claim = parse_claim(c)
        sub = claim.requests[0].alternatives[0]
        assert sub.device_class == ("mig.nvidia.com" if a.kind == "mig" else "gpu.nvidia.com")
        assert sub.count == (a.count if a.kind == "gpu" else 1)
        if a.kind == "shared":
            assert sub.capacity == {"memory": a.memory_share_mib << 20}


def test_cli_writes_a_list(tmp_path: Path, stream) -> None:
    out = tmp_path / "s.yaml"
    assert ds.main(["--seed", "7", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["kind"] == "List" and doc["items"] == json.loads(json.dumps(stream.items()))
    assert ds.main(["--trace", str(tmp_path / "missing.csv")]) == 1


def test_bad_trace_row_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text(TRACE + "p,1000,x,1,1000,,LS,Running,0,1,0\n")
    with pytest.raises(ValueError, match="row 2"):
        ds.read_trace(bad)


# ------------------------------------------------------------------ offline best fit and audit
def _ask(kind: str, **kw) -> object:
    base = {"pod": kw.pop("pod", "p"), "cpu_milli": kw.pop("cpu", 1000), "memory_mib": 1024, "kind": kind,
            "template": kind}
    return ds.Ask(**base, **kw)


def _cluster(monkeypatch, presets) -> tuple[list[dict], list[dict]]:
    monkeypatch.setattr(ds, "CLUSTER", presets)
    nodes, slices = [], []
    for preset, n, over in presets:
        for i in range(n):
            nodes.append(ds.node_manifest(f"{preset}-{i}", ds.nv.PRESETS[preset]))
            slices.extend(ds.nv.preset_slices(preset, f"{preset}-{i}", **over))
    return nodes, slices


def test_best_fit_packs_mig_and_fails_whole_gpus(monkeypatch) -> None:
    nodes, slices = _cluster(monkeypatch, (("dgx-h200", 1, {}),))
    asks = [_ask("mig", pod=f"m{i}", compute_slices=1, profiles=("1g.18gb",)) for i in range(7)]
    asks += [_ask("gpu", pod="g7", count=7), _ask("gpu", pod="g1", count=1)]
    r = do.best_fit(asks, nodes, slices)
    # seven 1g partitions fill one GPU (best fit keeps them together), 7 whole GPUs remain for the 7-GPU ask
    assert r["placed"] == 8 and r["failed"] == 1
    assert r["first_failure"]["pod"] == "g1" and r["gpus_at_first_failure"] == pytest.approx(8.0)


def test_best_fit_respects_cpu_and_shared_memory(monkeypatch) -> None:
    nodes, slices = _cluster(monkeypatch, (("l40s", 1, {"consumable_shares": "memory"}),))
    mib = 46068
    asks = [_ask("shared", pod="s1", memory_share_mib=mib // 2, products=("NVIDIA L40S",)),
            _ask("shared", pod="s2", memory_share_mib=mib // 2, products=("NVIDIA L40S",)),
            _ask("gpu", pod="g", count=7), _ask("gpu", pod="big", count=1, cpu=96_000)]
    r = do.best_fit(asks, nodes, slices)
    assert r["placed"] == 3 and r["first_failure"]["pod"] == "big"  # two halves share one GPU; 7 left whole
    assert r["gpus_at_end"] == pytest.approx(8.0, abs=1e-3)


def _claim(name: str, node: str, *devices: str, consumed: dict | None = None) -> dict:
    results = [AllocatedDevice("gpu", "gpu.nvidia.com", node, d, consumed=consumed or {}) for d in devices]
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}},
            "status": {"allocation": claim_allocation_status(results, node)}}


def test_audit_counts_and_finds_over_allocation() -> None:
    h200 = ds.nv.preset_slices("dgx-h200", "h")
    l40s = ds.nv.preset_slices("l40s", "l", consumable_shares="memory")
    ok = [_claim("a", "h", "gpu-0"), _claim("b", "h", "gpu-1-mig-3g71gb-9-4"), _claim("c", "h", "gpu-1-mig-4g71gb-5-0"),
          _claim("d", "l", "gpu-0", consumed={"memory": "20Gi"})]
    r = do.audit(h200 + l40s, ok)
    assert r["over_allocations"] == [] and r["claims_allocated"] == 4
    assert r["gpus_allocated"] == pytest.approx(1 + 3 / 7 + 4 / 7 + 20 * 1024 / 46068, abs=1e-3)
    bad = ok + [_claim("e", "h", "gpu-0"), _claim("f", "h", "gpu-1-mig-1g18gb-19-4"),
                _claim("g", "l", "gpu-0", consumed={"memory": "30Gi"}), _claim("x", "h", "gpu-9")]
    problems = do.audit(h200 + l40s, bad)["over_allocations"]
    assert any("gpu-0 allocated to 2 claims: ns/a, ns/e" in p for p in problems)
    assert any("counter set h/gpu-1-counter-set overdrawn" in p and "memory-slice-4 2 > 1" in p for p in problems)
    assert any("l/gpu-0: " in p and "memory allocated" in p for p in problems)
    assert any("ns/x: ('gpu.nvidia.com', 'h', 'gpu-9') is not a published device" in p for p in problems)
    unallocated = copy.deepcopy(ok[0])
    unallocated["status"] = {}
    assert do.audit(h200, [unallocated])["claims_allocated"] == 0


def test_recorder_keeps_first_binding_unschedulable_and_allocation(monkeypatch) -> None:
    bd = bench_module("bench_dra.py")
    rec = bd.Recorder(api=None)
    clock = iter([1.0, 2.0, 3.0, 4.0, 5.0])
    monkeypatch.setattr(bd.time, "monotonic", lambda: next(clock))
    unsched = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/20 nodes"}
    rec.on_pod({"metadata": {"name": "a"}, "spec": {}, "status": {"conditions": [unsched]}})  # t=1
    rec.on_pod({"metadata": {"name": "a"}, "spec": {}, "status": {"conditions": [{**unsched, "message": "x"}]}})
    rec.on_pod({"metadata": {"name": "a"}, "spec": {"nodeName": "n"}, "status": {}})  # t=3
    rec.on_claim({"metadata": {"name": "c"}, "status": {}})  # t=4: not allocated
    rec.on_claim({"metadata": {"name": "c"}, "status": {"allocation": {"devices": {"results": []}}}})  # t=5
    assert rec.unschedulable == {"a": (1.0, "0/20 nodes")} and rec.bound == {"a": 3.0}
    assert rec.allocated == {"c": 5.0} and rec.last_change == 5.0
