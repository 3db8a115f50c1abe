"""GPU energy: power at a utilization, energy of a job, energy of idle GPUs.

Power model: :func:`gpupool.catalog.power_w`, linear from the model's ``idle_w`` at utilization 0 to its
``peak_w`` (board power / TDP) at 1; the catalog gives the sources of both figures. Only GPU board power
is counted (no CPU, memory, fans, network or cooling: multiply by a PUE and add host power yourself if you
need facility energy).

Opaque models (names the catalog does not know, e.g. openb's ``G2``): the catalog invents no figure for
them, so they draw ``opaque_w`` watts at any utilization, **0.0 by default**. Results that count them say
so: :func:`job_energy` returns the opaque models it met, and :func:`opaque_models` lists them for any
set of names, so a report can flag an energy total as a lower bound.

Units: watts, seconds in, kWh out (1 kWh = 3.6e6 J). The array helpers broadcast like NumPy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from gpupool.catalog import get_model, power_w
from gpupool.model import NodeSpec

__all__ = [
    "JOULES_PER_KWH",
    "OPAQUE_POWER_W",
    "EnergyEstimate",
    "energy_kwh",
    "gpu_models_of",
    "gpu_power_w",
    "idle_energy_kwh",
    "is_known_model",
    "job_energy",
    "job_energy_kwh",
    "opaque_models",
    "power_figures",
    "power_w_array",
]

JOULES_PER_KWH = 3.6e6

OPAQUE_POWER_W = 0.0
"""Default draw (W) of a GPU whose model the catalog does not know: 0, i.e. not counted."""


def is_known_model(model_name: str) -> bool:
    """True when the catalog has power figures for ``model_name`` (a key or an alias)."""
    return get_model(model_name).known


def opaque_models(model_names: Sequence[str]) -> list[str]:
    """The distinct names in ``model_names`` the catalog does not know, in first-seen order."""
    return [m for m in dict.fromkeys(model_names) if not is_known_model(m)]


def gpu_models_of(nodes: Sequence[NodeSpec]) -> list[str]:
    """One model name per GPU of ``nodes``, node by node (the order of ``ClusterState``'s device slots)."""
    return [s.gpu_model for s in nodes for _ in range(s.gpu_count)]


def _check_utilization(u: np.ndarray) -> None:
    if u.size and not (np.all(u >= 0.0) and np.all(u <= 1.0)):  # NaN fails both comparisons
        bad = u[~((u >= 0.0) & (u <= 1.0))].flat[0]
        raise ValueError(f"utilization must be within [0, 1], got {bad!r}")


def _check_seconds(s: np.ndarray) -> None:
    if s.size and not (np.all(s >= 0.0) and np.all(np.isfinite(s))):
        bad = s[~((s >= 0.0) & np.isfinite(s))].flat[0]
        raise ValueError(f"seconds must be finite and >= 0, got {bad!r}")


def gpu_power_w(
    model_name: str, utilization: float | ArrayLike, *, opaque_w: float = OPAQUE_POWER_W
) -> float | np.ndarray:
    """Board power (W) of one ``model_name`` GPU at ``utilization`` (0..1; a scalar or an array).

    Known models: ``idle_w + (peak_w - idle_w) * utilization`` (:func:`gpupool.catalog.power_w`). Opaque
    models: ``opaque_w`` whatever the utilization (0.0 by default). A scalar gives a float, an array an
    array of the same shape. Raises ValueError for a utilization outside [0, 1] or NaN.
    """
    u = np.asarray(utilization, dtype=float)
    _check_utilization(u)
    model = get_model(model_name)
    if u.ndim == 0:
        return power_w(model, float(u)) if model.known else float(opaque_w)
    if not model.known:
        return np.full(u.shape, float(opaque_w))
    return model.idle_w + (model.peak_w - model.idle_w) * u


def power_figures(
    model_names: Sequence[str], *, opaque_w: float = OPAQUE_POWER_W
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(idle_w, peak_w, known)`` arrays, one entry per name; opaque names get ``opaque_w`` for both."""
    idle = np.empty(len(model_names))
    peak = np.empty(len(model_names))
    known = np.empty(len(model_names), dtype=bool)
    cache: dict[str, tuple[float, float, bool]] = {}
    for i, name in enumerate(model_names):
        if name not in cache:
            m = get_model(name)
            cache[name] = (m.idle_w, m.peak_w, True) if m.known else (float(opaque_w), float(opaque_w), False)
        idle[i], peak[i], known[i] = cache[name]
    return idle, peak, known


def power_w_array(idle_w: ArrayLike, peak_w: ArrayLike, utilization: ArrayLike) -> np.ndarray:
    """Vectorized linear power model: ``idle_w + (peak_w - idle_w) * utilization`` (broadcast)."""
    u = np.asarray(utilization, dtype=float)
    _check_utilization(u)
    idle = np.asarray(idle_w, dtype=float)
    return idle + (np.asarray(peak_w, dtype=float) - idle) * u


def energy_kwh(idle_w: ArrayLike, peak_w: ArrayLike, utilization: ArrayLike, seconds: ArrayLike) -> np.ndarray:
    """Vectorized energy (kWh) of GPUs drawing the linear model's power for ``seconds`` (broadcast)."""
    s = np.asarray(seconds, dtype=float)
    _check_seconds(s)
    return power_w_array(idle_w, peak_w, utilization) * s / JOULES_PER_KWH


@dataclass(frozen=True, slots=True)
class EnergyEstimate:
    """Energy of some GPUs: ``kwh``; ``opaque_gpus`` of them had an unknown model (``opaque_models``) and
    were counted at ``opaque_w`` each, so with the default 0 W ``kwh`` is then a lower bound."""

    kwh: float
    gpus: int
    opaque_gpus: int
    opaque_models: tuple[str, ...]

    @property
    def complete(self) -> bool:
        """True when every GPU's model was known."""
        return self.opaque_gpus == 0


def job_energy(
    model_names_per_gpu: Sequence[str],
    utilization: float | ArrayLike,
    seconds: float | ArrayLike,
    *,
    opaque_w: float = OPAQUE_POWER_W,
) -> EnergyEstimate:
    """Energy of a job's GPUs, one model name per GPU, with the opaque ones flagged.

    ``utilization`` and ``seconds`` are scalars (the same for every GPU) or one value per GPU.
    Raises ValueError for a utilization outside [0, 1], negative seconds, or per-GPU arrays of the wrong length.
    """
    names = list(model_names_per_gpu)
    idle, peak, known = power_figures(names, opaque_w=opaque_w)
    u = np.asarray(utilization, dtype=float)
    s = np.asarray(seconds, dtype=float)
    for what, arr in (("utilization", u), ("seconds", s)):
        if arr.ndim > 1 or (arr.ndim == 1 and arr.shape[0] != len(names)):
            raise ValueError(f"{what} must be a scalar or one value per GPU ({len(names)}), got shape {arr.shape}")
    kwh = float(np.sum(energy_kwh(idle, peak, u, s))) if names else 0.0
    opaque = tuple(n for n, k in dict(zip(names, known, strict=True)).items() if not k)
    return EnergyEstimate(kwh=kwh, gpus=len(names), opaque_gpus=int(np.sum(~known)), opaque_models=opaque)


def job_energy_kwh(
    model_names_per_gpu: Sequence[str],
    utilization: float | ArrayLike,
    seconds: float | ArrayLike,
    *,
    opaque_w: float = OPAQUE_POWER_W,
) -> float:
    """kWh used by a job's GPUs (one model name per GPU) at ``utilization`` for ``seconds``.

    ``sum over GPUs of power_w(model, utilization) * seconds / 3.6e6``; see :func:`job_energy` for the
    arguments and for the flag of opaque models (which count ``opaque_w`` = 0 W by default).
    """
    return job_energy(model_names_per_gpu, utilization, seconds, opaque_w=opaque_w).kwh


def idle_energy_kwh(
    model_names_per_gpu: Sequence[str], seconds: float | ArrayLike, *, opaque_w: float = OPAQUE_POWER_W
) -> float:
    """kWh drawn by GPUs sitting idle (utilization 0, i.e. their ``idle_w``) for ``seconds``.

    ``seconds`` is a scalar or one idle time per GPU (e.g. per-device idle seconds accumulated by a
    simulation); :func:`gpu_models_of` turns a node list into the per-GPU names.
    """
    return job_energy(model_names_per_gpu, 0.0, seconds, opaque_w=opaque_w).kwh
