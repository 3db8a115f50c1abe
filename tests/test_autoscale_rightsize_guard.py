"""Right-sizing guards (issue 30 items 2, 4): no dearer and roomier wins at once; a slice change in a full
pool does not stall."""

from __future__ import annotations

from gpupool.engine.rightsize import RightSizer, SliceOption
from gpupool.sim.inference_suite import Shape, run_suite

HALF = SliceOption("mig", "3g.71gb", 0.5, 71_000, 0.43)
WHOLE = SliceOption("whole", "1xH200", 1.0, 143_000, 1.0)
CAPS = {"3g.71gb": 2.0, "1xH200": 10.0}


def test_same_cost_more_capacity_switches_despite_hysteresis_and_dwell() -> None:
    rs = RightSizer([WHOLE, HALF], hysteresis=0.2, min_dwell_s=600)
    assert rs.choose(0, 0.5, CAPS, 1000).option is HALF  # one half-GPU replica: the least cost
    c = rs.choose(30, 3.0, CAPS, 1000)  # 2 x 3g = 1 GPU = 1 x 1xH200, five times the capacity
    assert c.option is WHOLE and "more capacity" in c.reason


def test_dearer_option_still_waits_for_hysteresis() -> None:
    rs = RightSizer([WHOLE, HALF], hysteresis=0.2, min_dwell_s=600)
    rs.choose(0, 5.0, CAPS, 1000)  # 1 x 1xH200
    c = rs.choose(30, 0.5, CAPS, 1000)  # 3g is cheaper but the dwell has not passed
    assert c.option is WHOLE and "min dwell" in c.reason


def test_step_down_in_a_full_pool_does_not_keep_the_old_slice_for_good() -> None:
    # before: 16 half-GPU replicas filled the 8-GPU pool, the switch to whole GPUs never started (13 GPU-h)
    cold = Shape("cold-step-down", "12 rps from a cold start, 2 rps at 30 min, 12 at 70", 100,
                 ((0, 12), (30, 12), (30.05, 2), (70, 2), (70.05, 12)))
    cells = run_suite([cold], seeds=(9,), policies=["gpupool"])
    assert cells[0].gpu_hours < 6, cells[0]


def test_slice_switch_leaves_the_pool_room_for_the_new_slice() -> None:
    from gpupool.sim.inference import SimState, load_throughput_table
    from gpupool.sim.inference_policies import RightSizedPolicy, TokenStats, build_policy
    from gpupool.sim.inference_suite import SHAPES, suite_scenario

    sc = suite_scenario(SHAPES[0], ["gpupool"])
    table = load_throughput_table(None, "H200")
    pol = build_policy("gpupool", sc, table, TokenStats(1000.0, 250.0, 1000.0))
    assert isinstance(pol, RightSizedPolicy) and pol.current == "1xH200"
    old = "3g.71gb"
    n_old = int(sc.pool_gpus / table.slices[old].gpu_fraction)  # the old slice fills the pool
    full = SimState(now_s=700.0, replicas={old: n_old}, ready={old: n_old}, pool_gpus=sc.pool_gpus)
    pol.old, pol.current = old, "1xH200"  # a switch to whole GPUs under way, none started yet
    d = pol.decide(700.0, full, {"rps": 12.0, "concurrency": 30.0, "queue_depth": 0.0})
    used = sum(n * table.slices[s].gpu_fraction for s, n in d.replicas.items())
    assert d.replicas.get("1xH200", 0) >= 1 and used <= sc.pool_gpus + 1e-9, d.replicas
