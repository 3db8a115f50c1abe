"""Gavel's workload for the job simulator (Narayanan et al., OSDI'20; repository stanford-futuredata/gavel,
read at commit c4fa400): its throughput table, its trace format and its Continuous-Multiple job generator.

* :func:`table_from_gavel`: ``scheduler/simulation_throughputs.json`` (worker type -> ``"('<job type>', <scale
  factor>)"`` -> ``{"null": steps/s alone, ...}``) as a :class:`~gpupool.sim.throughput.ThroughputTable`: one row
  per job type and scale factor, named ``"<job type> x<scale factor>"``, speed = steps/s on the model / steps/s
  on the reference worker type (V100); 0.0 where Gavel measured nothing (the type cannot run there).
* :func:`generate_jobs`: ``scheduler/utils.py`` ``generate_job`` with ``generate_multi_gpu_jobs`` (scale factor
  1/2/4/8 with probability 0.7/0.1/0.15/0.05, the Philly distribution; duration ``60 x 10^U(1.5, 3)`` s with
  probability 0.8, else ``60 x 10^U(3, 4)`` s; the job type drawn from ``scheduler/job_table.py``'s 26 templates
  until it is distributed or the scale factor is 1), arrivals a Poisson process (``scheduler/scheduler.py``
  ``_sample_arrival_time_delta``: ``-ln(1 - U) x lam`` s), the first job at 0. The random streams are
  Gavel's: ``random.Random(seed + 2)`` for jobs, ``random.Random(seed + 3)`` for interarrival times.
* :func:`load_gavel_trace`: a Gavel trace file (``scheduler/traces/``; one job per line, tab-separated: job type,
  command, working directory, steps argument, needs data dir, total steps, scale factor, priority weight, SLO,
  arrival time s); a job's duration is its total steps over its steps/s on the reference worker type.
"""

from __future__ import annotations

import ast
import math
import random
from collections.abc import Mapping
from pathlib import Path

from gpupool.sim.jobs import JobSpec
from gpupool.sim.throughput import ThroughputTable

__all__ = ["GAVEL_JOB_TYPES", "GAVEL_MODELS", "generate_jobs", "job_type_key", "load_gavel_trace",
           "table_from_gavel"]

GAVEL_MODELS = {"v100": "V100", "p100": "P100", "k80": "K80"}
"""Gavel's worker types -> the GPU model names of the cluster files (``gpu_model``)."""

GAVEL_JOB_TYPES: tuple[tuple[str, bool], ...] = (
    *((f"ResNet-18 (batch size {b})", True) for b in (16, 32, 64, 128, 256)),
    *((f"ResNet-50 (batch size {b})", True) for b in (16, 32, 64, 128)),
    *((f"Transformer (batch size {b})", True) for b in (16, 32, 64, 128, 256)),
    *((f"LM (batch size {b})", True) for b in (5, 10, 20, 40, 80)),
    *((f"Recommendation (batch size {b})", False) for b in (512, 1024, 2048, 4096, 8192)),
    ("A3C", False), ("CycleGAN", False))
"""``scheduler/job_table.py``'s JobTable in its order: (job type, distributed). 26 templates."""


def job_type_key(job_type: str, scale_factor: int) -> str:
    """The table row of Gavel's ``(job type, scale factor)``."""
    return f"{job_type} x{scale_factor}"


def table_from_gavel(doc: Mapping, reference: str = "v100",
                     models: Mapping[str, str] = GAVEL_MODELS) -> tuple[ThroughputTable, dict[str, float]]:
    """(table, steps/s on the reference per row) from Gavel's throughputs JSON ``doc``. Only the worker types
    in ``models`` are read (not the ``_unconsolidated`` ones). Raises ValueError naming the key for a
    malformed entry or a reference worker type missing from ``doc``."""
    if reference not in doc:
        raise ValueError(f"gavel throughputs: reference worker type {reference!r} missing")
    ref: dict[str, float] = {}
    for key, entry in doc[reference].items():
        try:
            jt, sf = ast.literal_eval(key)
            ref[job_type_key(str(jt), int(sf))] = float(entry["null"])
        except (ValueError, SyntaxError, TypeError, KeyError):
            raise ValueError(f"gavel throughputs: {reference}: key {key!r} is not a ('job type', scale factor) "
                             f"with a 'null' figure") from None
    rows: dict[str, dict[str, float]] = {k: {} for k in ref}
    for worker, model in models.items():
        for key, entry in doc.get(worker, {}).items():
            jt, sf = ast.literal_eval(key)
            row = job_type_key(str(jt), int(sf))
            if row in rows and ref[row] > 0:
                rows[row][model] = float(entry["null"]) / ref[row]
        for row in rows:
            rows[row].setdefault(model, 0.0)
    return ThroughputTable(rows, models.get(reference, reference)), ref


def _scale_factor(rng: random.Random) -> int:
    r = rng.uniform(0, 1)
    return 2 if 0.7 <= r <= 0.8 else 4 if 0.8 <= r <= 0.95 else 8 if 0.95 <= r else 1


def _duration(rng: random.Random) -> float:
    if rng.random() >= 0.8:
        return 60 * (10 ** rng.uniform(3, 4))
    return 60 * (10 ** rng.uniform(1.5, 3))


def generate_jobs(n: int, jobs_per_hour: float, seed: int) -> list[JobSpec]:
    """``n`` jobs of Gavel's Continuous-Multiple workload (see the module docstring), ``jobs_per_hour`` the
    Poisson arrival rate. Each JobSpec's ``duration`` is its run time on the reference (V100) alone and its
    ``job_type`` the table row (:func:`job_type_key`). Raises ValueError for n < 0 or a rate <= 0."""
    if n < 0 or not jobs_per_hour > 0:
        raise ValueError(f"need n >= 0 and jobs_per_hour > 0, got {n}, {jobs_per_hour}")
    jobs_rng, arrivals_rng = random.Random(seed + 2), random.Random(seed + 3)
    lam = 3600.0 / jobs_per_hour
    out, t = [], 0.0
    for i in range(n):
        sf = _scale_factor(jobs_rng)
        run_time = _duration(jobs_rng)
        while True:
            jt, distributed = jobs_rng.choice(GAVEL_JOB_TYPES)
            if sf == 1 or distributed:
                break
        out.append(JobSpec(f"gavel-{i}", t, run_time, sf, job_type=job_type_key(jt, sf), line=i + 1))
        t += -math.log(1.0 - arrivals_rng.random()) * lam
    return out


def load_gavel_trace(path: str | Path, ref_steps_per_s: Mapping[str, float]) -> list[JobSpec]:
    """Jobs of a Gavel trace file (see the module docstring); ``ref_steps_per_s``: from
    :func:`table_from_gavel`. Raises ValueError naming the file, line and field for a malformed line or a
    job type and scale factor without a reference throughput."""
    out = []
    for lineno, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        f = line.split("\t")
        if len(f) != 10:
            raise ValueError(f"{path}:{lineno}: expected 10 tab-separated fields, got {len(f)}")
        try:
            steps, sf, arrival = float(f[5]), int(f[6]), float(f[9])
        except ValueError:
            raise ValueError(f"{path}:{lineno}: total steps, scale factor or arrival time is not a number") from None
        key = job_type_key(f[0], sf)
        tp = ref_steps_per_s.get(key)
        if not tp or not (steps > 0 and sf >= 1 and math.isfinite(arrival)):
            raise ValueError(f"{path}:{lineno}: job type {key!r}: no reference throughput, or steps / scale factor "
                             f"/ arrival out of range")
        out.append(JobSpec(f"gavel-{lineno}", arrival, steps / tp, sf, job_type=key, line=lineno))
    return out
