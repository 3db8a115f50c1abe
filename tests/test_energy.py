"""Tests of gpupool.energy: hand-computed power and energy, opaque models, vectorized helpers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpupool.clusterspec import load_cluster_yaml
from gpupool.energy import (
    EnergyEstimate,
    energy_kwh,
    gpu_models_of,
    gpu_power_w,
    idle_energy_kwh,
    is_known_model,
    job_energy,
    job_energy_kwh,
    opaque_models,
    power_figures,
    power_w_array,
)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "clusters"


@pytest.mark.parametrize(
    ("model", "util", "watts"),
    [
        ("V100M16", 0.5, 40 + (300 - 40) * 0.5),  # 170 W
        ("H100", 1.0, 700.0),
        ("H100", 0.0, 70.0),
        ("T4", 0.25, 10 + 60 * 0.25),  # 25 W
        ("NVIDIA-A100-SXM4-80GB", 1.0, 400.0),  # an alias
        ("G2", 0.7, 0.0),  # opaque: not counted
    ],
)
def test_gpu_power_w(model: str, util: float, watts: float) -> None:
    assert gpu_power_w(model, util) == pytest.approx(watts)
    assert isinstance(gpu_power_w(model, util), float)


def test_gpu_power_w_arrays_and_opaque_default() -> None:
    np.testing.assert_allclose(gpu_power_w("T4", [0.0, 0.5, 1.0]), [10.0, 40.0, 70.0])
    np.testing.assert_allclose(gpu_power_w("G2", np.zeros((2, 3))), np.zeros((2, 3)))
    assert gpu_power_w("G2", 0.3, opaque_w=250.0) == 250.0
    np.testing.assert_allclose(gpu_power_w("G2", [0.0, 1.0], opaque_w=250.0), [250.0, 250.0])
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match=r"utilization must be within \[0, 1\]"):
            gpu_power_w("T4", bad)
    with pytest.raises(ValueError):
        gpu_power_w("T4", [0.5, 2.0])


def test_job_energy_hand_values() -> None:
    # 8 V100 at full power for one hour: 8 x 300 W x 1 h = 2.4 kWh
    assert job_energy_kwh(["V100M16"] * 8, 1.0, 3600.0) == pytest.approx(2.4)
    # H100 at 50 % (70 + 630 / 2 = 385 W) and T4 at 100 % (70 W) for 2 h: 455 W x 2 h = 0.91 kWh
    assert job_energy_kwh(["H100", "T4"], [0.5, 1.0], 7200.0) == pytest.approx(0.91)
    # per-GPU seconds: A100-80GB idle (55 W) 1 h and 2 h
    assert job_energy_kwh(["A100-80GB", "A100-80GB"], 0.0, [3600.0, 7200.0]) == pytest.approx(0.165)
    assert job_energy_kwh([], 1.0, 3600.0) == 0.0
    with pytest.raises(ValueError, match="one value per GPU"):
        job_energy_kwh(["T4", "T4"], [0.5, 0.5, 0.5], 10.0)
    with pytest.raises(ValueError, match="seconds must be finite and >= 0"):
        job_energy_kwh(["T4"], 0.5, -1.0)


def test_idle_energy() -> None:
    assert idle_energy_kwh(["A100-80GB"] * 8, 3600.0) == pytest.approx(8 * 55 / 1000)  # 0.44 kWh
    assert idle_energy_kwh(["T4", "H100"], [7200.0, 3600.0]) == pytest.approx((10 * 2 + 70) / 1000)


def test_opaque_models_are_flagged() -> None:
    est = job_energy(["G2", "V100M16", "G2", "G3"], 1.0, 3600.0)
    assert est == EnergyEstimate(kwh=pytest.approx(0.3), gpus=4, opaque_gpus=3, opaque_models=("G2", "G3"))
    assert not est.complete
    assert job_energy(["T4"], 1.0, 3600.0).complete
    assert job_energy(["G2"], 1.0, 3600.0, opaque_w=100.0).kwh == pytest.approx(0.1)
    assert opaque_models(["T4", "G2", "G2", "X", "H100"]) == ["G2", "X"]
    assert is_known_model("L40S") and not is_known_model("G1")


def test_vectorized_helpers_match_scalar_ones() -> None:
    names = ["H100", "T4", "G2", "L4"]
    idle, peak, known = power_figures(names)
    np.testing.assert_array_equal(known, [True, True, False, True])
    np.testing.assert_allclose(idle, [70.0, 10.0, 0.0, 16.0])
    np.testing.assert_allclose(peak, [700.0, 70.0, 0.0, 72.0])
    util = np.array([[0.0, 0.5, 1.0, 0.2], [1.0, 1.0, 1.0, 1.0]])
    expected = np.array([[gpu_power_w(m, u) for m, u in zip(names, row, strict=True)] for row in util])
    np.testing.assert_allclose(power_w_array(idle, peak, util), expected)
    np.testing.assert_allclose(energy_kwh(idle, peak, util, 3600.0), expected / 1000)


def test_mixed_models_cluster_idle_power() -> None:
    nodes = load_cluster_yaml(EXAMPLES / "mixed-models.yaml")
    names = gpu_models_of(nodes)
    assert len(names) == 176
    # idle W: 32 H100 x 70 + 32 A100-80GB x 55 + 16 L40S x 22 + 32 L4 x 16 + 16 T4 x 10 + 48 V100M32 x 40 = 6,944 W
    assert idle_energy_kwh(names, 3600.0) == pytest.approx(6.944)
    # at full load: 32 x 700 + 32 x 400 + 16 x 350 + 32 x 72 + 16 x 70 + 48 x 300 = 58,624 W
    assert job_energy_kwh(names, 1.0, 3600.0) == pytest.approx(58.624)
    # the lowest-power models per GPU at full load, as a lowest-power policy would rank them
    per_gpu = {m: gpu_power_w(m, 1.0) for m in dict.fromkeys(names)}
    assert sorted(per_gpu, key=per_gpu.__getitem__)[:2] == ["T4", "L4"]
