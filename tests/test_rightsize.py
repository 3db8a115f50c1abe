"""Tests of gpupool.engine.rightsize: slice options of a GPU model, and the RightSizer's choices (numbers)."""

from __future__ import annotations

import pytest

from gpupool.engine.rightsize import RightSizer, SliceOption, slice_catalog

H200 = {o.name: o for o in slice_catalog("H200")}
# requests/s one replica serves within the SLO, per option (made-up service; only the arithmetic matters)
CAP = {"1g.18gb": 4.0, "3g.71gb": 14.0, "timeslice-0.5": 12.0, "1xH200": 30.0}


def test_h200_slice_options() -> None:
    assert list(H200) == ["1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb", "timeslice-0.25",
                          "timeslice-0.5", "1xH200", "2xH200", "4xH200", "8xH200"]
    g1 = H200["1g.18gb"]
    # usable memory from NVML (16384 MiB, not 18 x 1024); cost max(1/7, 1/8) = 1/7; SMs 16 of 132
    assert (g1.kind, g1.memory_mib, g1.gpu_fraction, g1.compute_fraction) == ("mig", 16384, 1 / 7, 16 / 132)
    # 1g.35gb: 1 of 7 compute slices but 2 of 8 memory slices (4 per GPU): cost max(1/7, 2/8) = 0.25
    assert H200["1g.35gb"].gpu_fraction == 0.25 and H200["1g.35gb"].memory_mib == 33280
    assert H200["2g.35gb"].gpu_fraction == 2 / 7  # max(2/7, 2/8)
    assert H200["3g.71gb"].gpu_fraction == 0.5    # max(3/7, 4/8): two per GPU
    assert H200["4g.71gb"].gpu_fraction == 4 / 7  # max(4/7, 4/8)
    assert H200["7g.141gb"].gpu_fraction == 1.0 and H200["7g.141gb"].compute_fraction == 1.0
    # every profile's cost x max instances <= 1 GPU
    from gpupool.catalog import get_model
    for p in get_model("H200").mig_profiles:
        assert H200[p.name].gpu_fraction * p.max_instances <= 1.0 + 1e-12
    # time slice: memory cap = fraction x 143771 MiB
    assert H200["timeslice-0.5"] == SliceOption("timeslice", "timeslice-0.5", 0.5, 71885, 0.5)
    assert H200["timeslice-0.25"].memory_mib == 35942  # int(0.25 x 143771)
    assert H200["2xH200"] == SliceOption("whole", "2xH200", 2.0, 287542, 2.0)


def test_mig_memory_is_what_the_device_reports_not_the_name_dcgm544() -> None:
    """dcgm-exporter #544, #397, GFD #7: an H100 / A100 ``1g.10gb`` has 9,984 / 9,728 MiB, not 10 x 1024."""
    h100 = {o.name: o for o in slice_catalog("H100")}
    a100 = {o.name: o for o in slice_catalog("NVIDIA-A100-SXM4-80GB")}
    assert h100["1g.10gb"].memory_mib == 9984 and a100["1g.10gb"].memory_mib == 9728
    assert h100["7g.80gb"].memory_mib == 81152 and h100["1g.10gb"].compute_fraction == 16 / 132
    assert a100["1g.10gb"].compute_fraction == 14 / 98
    assert {o.name: o.memory_mib for o in slice_catalog("A100-40GB") if o.kind == "mig"} == {
        "1g.5gb": 4864, "1g.10gb": 9856, "2g.10gb": 9856, "3g.20gb": 19968, "4g.20gb": 19968, "7g.40gb": 40192}
    # a replica needing 10,000 MiB does not fit a 1g.10gb (its name would say 10,240)
    cap = {"1g.10gb": 4.0, "1g.20gb": 4.0, "1xH100": 30.0}
    c = RightSizer(slice_catalog("H100")).choose(0, 3.0, cap, memory_need_mib=10000)
    assert c.option.name == "1g.20gb"


def test_non_mig_model_slices() -> None:
    assert [o.kind for o in slice_catalog("T4")] == ["timeslice"] * 2 + ["whole"] * 4  # no MIG on T4
    with pytest.raises(ValueError, match="G1"):
        slice_catalog("G1")


def test_least_cost_choice() -> None:
    rs = RightSizer(slice_catalog("H200"))
    c = rs.choose(0, 30.0, CAP, memory_need_mib=15000)
    # 1g.18gb: ceil(30/4) = 8 x 1/7 = 1.143; 3g.71gb: ceil(30/14) = 3 x 0.5 = 1.5;
    # timeslice-0.5: ceil(30/12) = 3 x 0.5 = 1.5; 1xH200: 1 x 1 = 1.0 -> 1xH200
    assert (c.option.name, c.replicas, c.gpu_cost) == ("1xH200", 1, 1.0)


def test_usable_memory_excludes_what_the_nominal_name_would_admit() -> None:
    rs = RightSizer(slice_catalog("H200"))
    # 17000 MiB < 18 x 1024 = 18432 (the name) but > 16384 (usable): 1g.18gb is out.
    # demand 3: 3g.71gb 1 x 0.5 = 0.5; timeslice-0.5: 1 x 0.5 = 0.5 (tie: catalog order) -> 3g.71gb
    c = rs.choose(0, 3.0, CAP, memory_need_mib=17000)
    assert c.option.name == "3g.71gb" and c.gpu_cost == 0.5


def test_dwell_and_hysteresis() -> None:
    rs = RightSizer(slice_catalog("H200"), hysteresis=0.2, min_dwell_s=600)
    assert rs.choose(0, 30.0, CAP, 15000).option.name == "1xH200"
    # load falls to 3 at t = 100: 1g.18gb 1 x 1/7 = 0.143 is far cheaper, but 100 s < 600 s dwell: keep
    c = rs.choose(100, 3.0, CAP, 15000)
    assert c.option.name == "1xH200" and "min dwell" in c.reason
    # t = 700: 0.143 < 1.0 x (1 - 0.2) = 0.8 and 700 s >= 600 s: switch
    c = rs.choose(700, 3.0, CAP, 15000)
    assert (c.option.name, c.replicas) == ("1g.18gb", 1) and c.reason.startswith("switch")
    # t = 2000, demand 13: 1g.18gb ceil(13/4) = 4 x 1/7 = 0.571; 3g.71gb 1 x 0.5 = 0.5, cheaper by
    # 12.5 % < 20 %: keep 1g.18gb x4
    c = rs.choose(2000, 13.0, CAP, 15000)
    assert (c.option.name, c.replicas) == ("1g.18gb", 4) and "not cheaper" in c.reason


def test_without_hysteresis_it_flaps() -> None:
    flappy = RightSizer(slice_catalog("H200"), hysteresis=0.0, min_dwell_s=0)
    steady = RightSizer(slice_catalog("H200"))
    names_flappy, names_steady = [], []
    for t, demand in enumerate([12.0, 13.0, 12.0, 13.0]):
        # 12: 1g.18gb 3 x 1/7 = 0.429 < 3g.71gb 0.5;  13: 1g.18gb 4 x 1/7 = 0.571 > 0.5
        names_flappy.append(flappy.choose(t * 900, demand, CAP, 15000).option.name)
        names_steady.append(steady.choose(t * 900, demand, CAP, 15000).option.name)
    assert names_flappy == ["1g.18gb", "3g.71gb", "1g.18gb", "3g.71gb"]
    assert names_steady == ["1g.18gb"] * 4


def test_switches_at_once_when_the_current_option_no_longer_fits() -> None:
    rs = RightSizer(slice_catalog("H200"))
    assert rs.choose(0, 3.0, CAP, 15000).option.name == "1g.18gb"
    c = rs.choose(10, 3.0, CAP, 40000)  # a bigger model: 16384 MiB is too small, dwell notwithstanding
    assert c.option.name == "3g.71gb" and "no longer fits" in c.reason


def test_min_replicas_and_zero_demand() -> None:
    rs = RightSizer(slice_catalog("H200"))
    c = rs.choose(0, 0.0, CAP, 15000, min_replicas=2)  # 2 x 1/7 = 0.286
    assert (c.option.name, c.replicas) == ("1g.18gb", 2) and c.gpu_cost == pytest.approx(2 / 7)


def test_impossible_requests_say_why() -> None:
    rs = RightSizer(slice_catalog("H200"))
    with pytest.raises(ValueError, match="no slice option has 2000000 MiB"):
        rs.choose(0, 1.0, CAP, 2_000_000)
    with pytest.raises(ValueError, match="no capacity given"):
        rs.choose(0, 1.0, {"1g.18gb": 4.0}, 40000)
    with pytest.raises(ValueError, match="demand"):
        rs.choose(0, -1.0, CAP, 1)
    with pytest.raises(ValueError, match="hysteresis"):
        RightSizer(slice_catalog("H200"), hysteresis=1.5)
    with pytest.raises(ValueError, match="at least one"):
        RightSizer([])
