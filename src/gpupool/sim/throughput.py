"""Per-job-type speeds: a throughput matrix of job types x GPU models, as Gavel keeps one (Narayanan et al.,
OSDI'20; ``scheduler/simulation_throughputs.json`` of stanford-futuredata/gavel: steps/s of each job type and
scale factor on each worker type), normalised here to a speed relative to the reference model.

A :class:`ThroughputTable` row per job type maps GPU model -> speed (reference model = 1.0; 0.0 = the type
cannot run on that model). The row ``""`` is the default of jobs without a type or of a type without a row: one
speed per model (Gavel's "per-model" world); a model missing from a row falls back to the ``""`` row, then to
the job simulator's own per-model speed (:attr:`gpupool.sim.jobs.JobSimConfig.gpu_speed`).

JSON file (:func:`load_throughput_table`)::

    {"reference": "V100", "rows": {"": {"V100": 1.0, "K80": 0.3}, "LM (batch size 80) x8": {"K80": 0.0}}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["ThroughputTable", "load_throughput_table"]


@dataclass(frozen=True)
class ThroughputTable:
    """Speeds (relative to ``reference``) of each job type (row) on each GPU model (column).

    Raises ValueError naming the job type and model for a speed that is not a finite number >= 0, or a row
    that is not a mapping."""

    rows: Mapping[str, Mapping[str, float]]
    reference: str = ""
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for jt, row in self.rows.items():
            if not isinstance(row, Mapping):
                raise ValueError(f"throughput table: job type {jt!r}: row must map GPU model -> speed, got "
                                 f"{type(row).__name__}")
            for model, v in row.items():
                if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v >= 0):
                    raise ValueError(f"throughput table: job type {jt!r}, model {model!r}: speed must be a "
                                     f"finite number >= 0, got {v!r}")

    def speed(self, job_type: str, model: str, default: float) -> float:
        """Speed of ``job_type`` on ``model``: its row, else the ``""`` row, else ``default``."""
        row = self.rows.get(job_type)
        if row is not None and model in row:
            return float(row[model])
        base = self.rows.get("")
        if base is not None and model in base:
            return float(base[model])
        return default

    def node_speeds(self, job_type: str, models: Sequence[str], default: Sequence[float]) -> np.ndarray:
        """(n_nodes,) float64 speed of ``job_type`` on each node's GPU model (``default``: per node, where the
        table has no figure), memoized per job type (``models`` / ``default`` must be the same on every call)."""
        out = self._cache.get(job_type)
        if out is None:
            out = self._cache[job_type] = np.array(
                [self.speed(job_type, m, float(d)) for m, d in zip(models, default, strict=True)], dtype=np.float64)
        return out


def load_throughput_table(path: str | Path) -> ThroughputTable:
    """Read a table (JSON, see the module docstring). Raises ValueError naming the file for malformed JSON
    or a missing ``rows`` object, and as :class:`ThroughputTable` for a bad speed."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("rows"), dict):
        raise ValueError(f"{path}: expected an object with a 'rows' object (job type -> GPU model -> speed)")
    return ThroughputTable({str(k): v for k, v in doc["rows"].items()}, str(doc.get("reference", "")))
