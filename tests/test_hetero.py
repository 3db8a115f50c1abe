"""Heterogeneity-aware job placement (gpupool.engine.pool.hetero): a job goes to the GPU model the objective
prefers, a gang waits for one model rather than run at the speed of the slowest of two, objective modes,
and nothing changes where GPU models do not differ in speed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpupool.catalog import get_model
from gpupool.clusterspec import load_cluster_yaml
from gpupool.engine.pool.hetero import HeteroPolicy, heterogeneous, model_cost
from gpupool.model import NodeSpec
from gpupool.sim.jobs import JobSimConfig, JobSpec, run_jobs
from gpupool.sim.placement import catalog_speeds, hetero_placement

REPO = Path(__file__).resolve().parents[1]
MIXED = REPO / "examples" / "clusters" / "mixed-models.yaml"
H100 = get_model("H100").relative_throughput  # 7.912 V100s


def node(name: str, model: str, gpus: int = 8, switch: str = "") -> NodeSpec:
    return NodeSpec(name, cpu_milli=64_000 * gpus // 8 or 8000, memory_mib=512_000, gpu_count=gpus, gpu_model=model,
                    switch=switch or name)


def cfg(objective: str | None, **kw) -> JobSimConfig:
    return JobSimConfig(gpu_speed="catalog", reference_gpu="V100M32", objective=objective, restart_overhead_s=0.0,
                        **kw)


def by_id(res) -> dict:
    return {j["job_id"]: j for j in res.jobs}


def order(objective: str) -> list[str]:
    models = ["H100", "A100-80GB", "L40S", "L4", "T4", "V100M32"]
    speed = catalog_speeds(models, [1] * 6, "V100M32")
    idle = np.array([get_model(m).idle_w for m in models])
    peak = np.array([get_model(m).peak_w for m in models])
    cost = model_cost(objective, speed, peak, idle)
    return [models[i] for i in np.argsort(cost, kind="stable")]


def test_model_cost_orders_the_catalog_models() -> None:
    """jct: fastest first; energy: least (busy - idle) W per unit of work (L4 first, V100 last); balanced:
    the energy-delay product (H100 first, V100 last)."""
    assert order("jct") == ["H100", "L40S", "A100-80GB", "V100M32", "L4", "T4"]
    assert order("energy") == ["L4", "H100", "L40S", "T4", "A100-80GB", "V100M32"]
    assert order("balanced") == ["H100", "L40S", "A100-80GB", "L4", "T4", "V100M32"]
    with pytest.raises(ValueError, match="objective must be one of"):
        model_cost("fast", [1.0], [1.0], [0.0])
    assert np.isinf(model_cost("jct", [0.0, 1.0], [1.0, 1.0], [0.0, 0.0])[0])


def test_wrapped_only_where_models_differ_in_speed() -> None:
    mixed = load_cluster_yaml(MIXED)
    assert isinstance(hetero_placement("gpupool", mixed, "catalog", "balanced"), HeteroPolicy)
    assert hetero_placement("gpupool", mixed, "catalog", None) == "gpupool"  # opt-in
    assert hetero_placement("gpupool", mixed, "none", "jct") == "gpupool"  # speeds not modelled
    assert hetero_placement("gpupool", mixed, "catalog", "none") == "gpupool"  # speed-blind on request
    assert hetero_placement("lowest-power", mixed, "catalog", "jct") == "lowest-power"  # a baseline stays one
    same = [node("a", "A100-80GB"), node("b", "A100-80GB")]
    assert hetero_placement("gpupool", same, "catalog", "jct") == "gpupool"
    assert not heterogeneous([2.5, 2.5, 1.0], [8, 8, 0]) and heterogeneous([2.5, 1.0], [8, 8])
    with pytest.raises(ValueError, match="objective"):
        hetero_placement("gpupool", mixed, "catalog", "fastest")


@pytest.mark.parametrize(("objective", "model"), [("jct", "H100"), ("balanced", "H100"), ("energy", "L4")])
def test_a_job_goes_to_the_model_its_objective_prefers(objective: str, model: str) -> None:
    nodes = [node("t4", "T4"), node("v100", "V100M32"), node("l4", "L4"), node("h100", "H100")]
    jobs = [JobSpec("j", 0.0, 7912.0, 1)]
    res = run_jobs(nodes, jobs, "gpupool", config=cfg(objective))
    job = by_id(res)["j"]
    assert job["nodes"] == [model.lower()] or job["nodes"] == (model.lower(),)
    speed = get_model(model).relative_throughput
    assert job["jct"] == pytest.approx(7912.0 / speed, rel=1e-6)
    assert res.metrics["config"]["objective"] == objective


def test_objective_modes_trade_time_for_energy() -> None:
    """Ten 1-GPU jobs on an H100 node and an L4 node: jct and balanced run them on the H100 (7.9x faster),
    energy on the L4 (58 W above idle per V100-equivalent against 80): longer, and less busy energy."""
    nodes = [node("l4", "L4"), node("h100", "H100")]
    jobs = [JobSpec(f"j{i}", 0.0, 3600.0, 1) for i in range(8)]
    fast = run_jobs(nodes, jobs, "gpupool", config=cfg("jct"))
    green = run_jobs(nodes, jobs, "gpupool", config=cfg("energy"))
    assert fast.mean_jct_s < 0.2 * green.mean_jct_s
    busy = sum(j["energy_kwh"] for j in green.jobs), sum(j["energy_kwh"] for j in fast.jobs)
    assert busy[0] < busy[1]


def test_a_gang_waits_for_one_fast_model_rather_than_run_at_the_slowest() -> None:
    """A 16-GPU gang arrives while one of two H100 nodes is busy for ~1,000 s; a V100 node is free. Speed-blind,
    it starts at once on H100 + V100 across switches and runs at V100 speed (and slowed by the spine);
    heterogeneity-aware, it waits for the second H100 node: expected finish = wait + work / 7.9."""
    nodes = [node("h100-0", "H100", switch="s1"), node("h100-1", "H100", switch="s1"),
             node("v100-0", "V100M32", switch="s2")]
    jobs = [JobSpec("a", 0.0, 1000.0 * H100, 8), JobSpec("b", 10.0, 20.0 * 3600, 16)]
    aware = by_id(run_jobs(nodes, jobs, "gpupool", config=cfg("jct")))
    blind = by_id(run_jobs(nodes, jobs, "gpupool", config=cfg("none")))
    assert sorted(aware["b"]["nodes"]) == ["h100-0", "h100-1"]
    assert aware["b"]["start"] == pytest.approx(aware["a"]["end"])  # waited for a's node
    assert aware["b"]["end"] - aware["b"]["start"] < 1.5 * 20 * 3600 / H100  # H100 speed x the switch tier
    assert "v100-0" in blind["b"]["nodes"] and blind["b"]["start"] == pytest.approx(10.0)
    assert aware["b"]["jct"] < 0.2 * blind["b"]["jct"]


def test_a_gang_takes_one_model_that_holds_it_now() -> None:
    """When one model can hold the whole gang now, the gang goes there at once (no split, no wait)."""
    nodes = [node("h100-0", "H100", switch="s1"), node("a100-0", "A100-80GB", switch="s2"),
             node("a100-1", "A100-80GB", switch="s2")]
    res = by_id(run_jobs(nodes, [JobSpec("g", 0.0, 3600.0, 16)], "gpupool", config=cfg("jct")))
    assert sorted(res["g"]["nodes"]) == ["a100-0", "a100-1"] and res["g"]["start"] == 0.0


def test_homogeneous_speed_outcomes_are_unchanged() -> None:
    """gpu_speed='none' (every model at speed 1): the objective changes nothing, job by job."""
    nodes = [node("t4", "T4"), node("h100", "H100"), node("v100", "V100M32")]
    jobs = [JobSpec(f"j{i}", 60.0 * i, 600.0 + 50 * i, (1, 2, 8)[i % 3]) for i in range(12)]
    base = run_jobs(nodes, jobs, "gpupool", config=JobSimConfig())
    for objective in ("jct", "energy", "balanced"):
        other = run_jobs(nodes, jobs, "gpupool", config=JobSimConfig(objective=objective))
        assert [(j["job_id"], j["start"], j["end"], j["nodes"]) for j in other.jobs] == \
               [(j["job_id"], j["start"], j["end"], j["nodes"]) for j in base.jobs]
