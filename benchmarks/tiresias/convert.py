"""Convert gpupool job traces to the Tiresias simulator's job CSV, and read the simulator's job log back.

The peer is ``SymbioticLab/Tiresias``, folder ``simulator/`` (Gu et al., "Tiresias: A GPU Cluster
Manager for Distributed Deep Learning", NSDI 2019). Its formats, from its ``README.md``, ``jobs.py``,
``run_sim.py`` and ``log.py``:

* job trace: ``job_id,num_gpu,submit_time,iterations,model_name,duration,interval``. ``jobs.py``
  (``add_job``) turns a field into an int only when it is all digits (``str.isdigit``), and the
  duration with ``int(float(...))``; so every number we write is a non-negative integer (seconds).
  ``model_name`` must be one of its ``models.py`` names (it sizes CPU, memory and network of a
  placement, never the run time); ``iterations`` is not used by its schedulers; ``interval`` is the
  gap to the next submission.
* cluster spec: ``num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node``, one row.
* job log (``<log_path>/job.csv``, ``log.py``): ``time,job_id,num_gpu,submit_time,start_time,
  end_time,executed_time,JCT,duration,pending_time,preempt[,resume],promote`` (``resume`` only with
  the ``count`` placement scheme), one row per finished job; ``JCT = end_time - submit_time``.

The same window of jobs goes to both simulators (:func:`select_window`): ``first`` jobs in submission
order after ``offset``, submit times rebased to the window's first submission, whole seconds, one
queue. Nothing here imports or copies the peer's code.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.traces.errors import StrPath, read_table
from gpupool.traces.jobs import JobRecord

__all__ = [
    "CLUSTER_SPEC_COLUMNS",
    "JOB_LOG_COLUMNS",
    "TIRESIAS_COLUMNS",
    "TIRESIAS_MODEL",
    "PeerJob",
    "jct_summary",
    "read_job_log",
    "read_tiresias_trace",
    "select_window",
    "trace_stats",
    "write_cluster_spec",
    "write_tiresias_trace",
]

TIRESIAS_COLUMNS = ("job_id", "num_gpu", "submit_time", "iterations", "model_name", "duration", "interval")
"""Columns of a Tiresias job trace (simulator/README.md, section 2)."""
CLUSTER_SPEC_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")
"""Columns of a Tiresias cluster spec (simulator/README.md, section 2)."""
JOB_LOG_COLUMNS = ("time", "job_id", "num_gpu", "submit_time", "start_time", "end_time", "executed_time", "JCT",
                   "duration", "pending_time", "preempt", "promote")
"""Columns of the Tiresias job log (simulator/log.py ``init_log``); ``resume`` is added by the ``count``
scheme."""
TIRESIAS_MODEL = "resnet50"
"""``model_name`` written for every job: the traces do not say which model a job trained, and Tiresias uses
it only for the CPU/memory/network books of a placement (its ``models.py`` gives every model a GPU
memory use of 1)."""


def select_window(jobs: Sequence[JobRecord], first: int, offset: int = 0, max_gpus: int | None = None
                  ) -> list[JobRecord]:
    """The jobs both simulators run: ``jobs[offset:offset + first]`` (``jobs`` sorted by submission, as
    :func:`gpupool.traces.jobs.load_jobs` returns them), made whole and peer-neutral.

    * ``submit_time``: seconds from the window's first submission, rounded to whole seconds (Tiresias
      reads only digit strings as numbers); the order is kept (rounding is monotonic).
    * ``duration``: rounded to whole seconds, at least 1 (Philly durations are whole already).
    * ``queue``: ``""`` (one queue: the peer has none).
    * ``job_id`` and ``line`` are kept.

    ``max_gpus``: drop jobs asking for more GPUs than this *before* taking the window (None: keep all;
    a job larger than the cluster would never run in either simulator).

    Raises ValueError: ``first`` < 1, ``offset`` < 0, or the window is empty.
    """
    if first < 1 or offset < 0:
        raise ValueError(f"need first >= 1 and offset >= 0, got first={first}, offset={offset}")
    pool = [j for j in jobs if max_gpus is None or j.num_gpu <= max_gpus]
    window = pool[offset:offset + first]
    if not window:
        raise ValueError(f"empty window: offset {offset} is past the {len(pool)} jobs of the trace")
    start = window[0].submit_time
    return [JobRecord(j.job_id, float(round(j.submit_time - start)), float(max(1, round(j.duration))),
                      j.num_gpu, "", j.line) for j in window]


def trace_stats(jobs: Sequence[JobRecord], capacity_gpus: int | None = None) -> dict:
    """Jobs, GPU range, GPU-hours, mean duration (h, the lower bound on mean JCT), submission span (h),
    and the offered load ``GPU-hours / span / capacity`` when ``capacity_gpus`` is given."""
    dur = np.array([j.duration for j in jobs], dtype=float)
    gpus = np.array([j.num_gpu for j in jobs], dtype=float)
    span_h = (max(j.submit_time for j in jobs) - min(j.submit_time for j in jobs)) / 3600.0
    gpu_h = float((dur * gpus).sum() / 3600.0)
    out = {"jobs": len(jobs), "min_gpus": int(gpus.min()), "max_gpus": int(gpus.max()), "gpu_hours": gpu_h,
           "mean_duration_h": float(dur.mean() / 3600.0), "submit_span_h": span_h}
    if capacity_gpus:
        out["offered_load"] = gpu_h / span_h / capacity_gpus if span_h > 0 else math.inf
    return out


def write_tiresias_trace(jobs: Sequence[JobRecord], path: StrPath) -> Path:
    """Write ``jobs`` (from :func:`select_window`: whole seconds, sorted by submission) as a Tiresias
    job trace. ``job_id`` is the job's source line number (unique within one trace file, all digits as
    Tiresias wants), ``iterations`` = ``duration``, ``interval`` = gap to the next submission (0 for the
    last job).

    Raises ValueError (naming the job) for a non-whole or negative time, a duration < 1, fewer than one
    GPU, submissions out of order or a repeated line number.
    """
    out = Path(path)
    seen: set[int] = set()
    rows = []
    for i, j in enumerate(jobs):
        where = f"job {j.job_id!r} (line {j.line})"
        if j.submit_time != int(j.submit_time) or j.submit_time < 0:
            raise ValueError(f"{where}: submit_time {j.submit_time!r} is not a whole number of seconds >= 0")
        if j.duration != int(j.duration) or j.duration < 1:
            raise ValueError(f"{where}: duration {j.duration!r} is not a whole number of seconds >= 1")
        if j.num_gpu < 1:
            raise ValueError(f"{where}: num_gpu {j.num_gpu} < 1")
        if j.line in seen:
            raise ValueError(f"{where}: line number {j.line} used twice (job ids must be unique)")
        seen.add(j.line)
        nxt = jobs[i + 1].submit_time if i + 1 < len(jobs) else j.submit_time
        if nxt < j.submit_time:
            raise ValueError(f"{where}: jobs are not sorted by submit_time")
        rows.append((j.line, j.num_gpu, int(j.submit_time), int(j.duration), TIRESIAS_MODEL, int(j.duration),
                     int(nxt - j.submit_time)))
    with out.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(TIRESIAS_COLUMNS)
        w.writerows(rows)
    return out


def read_tiresias_trace(path: StrPath) -> list[JobRecord]:
    """Read a Tiresias job trace back as :class:`JobRecord` objects, in file order: ``job_id`` is the
    trace's ``job_id`` as a string and ``line`` that id (the source line :func:`write_tiresias_trace`
    wrote), ``queue`` ``""``.

    Raises TraceFormatError (file, line, column) for a missing/unknown column, a non-integer or negative
    number, ``num_gpu`` < 1, ``duration`` < 1 or a repeated ``job_id``.
    """
    jobs = []
    for row in read_table(path, TIRESIAS_COLUMNS, unique="job_id"):
        job_id = row.integer("job_id")
        num_gpu = row.integer("num_gpu", minimum=1)
        submit = row.integer("submit_time")
        duration = row.integer("duration", minimum=1)
        row.integer("iterations")
        row.integer("interval")
        row.text("model_name")
        jobs.append(JobRecord(str(job_id), float(submit), float(duration), num_gpu, "", job_id))
    return jobs


def write_cluster_spec(path: StrPath, nodes: int, gpus_per_node: int = 8, switches: int = 1,
                       cpus_per_node: int = 128, mem_gb_per_node: int = 256) -> Path:
    """Write a Tiresias cluster spec of ``switches`` x ``nodes / switches`` nodes of ``gpus_per_node`` GPUs.

    CPU and memory default to the README's example node (128 cores, 256 GB): enough that its ``yarn``
    placement (6 cores and at most 5 + 6 + 0.1 x GPUs GB per GPU) is bound by GPUs only.

    Raises ValueError when ``nodes`` is not a positive multiple of ``switches``.
    """
    if nodes < 1 or switches < 1 or nodes % switches:
        raise ValueError(f"nodes ({nodes}) must be a positive multiple of switches ({switches})")
    out = Path(path)
    with out.open("w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(CLUSTER_SPEC_COLUMNS)
        w.writerow((switches, nodes // switches, gpus_per_node, cpus_per_node, mem_gb_per_node))
    return out


@dataclass(frozen=True, slots=True)
class PeerJob:
    """One finished job of a Tiresias job log; times in seconds from the trace's time 0."""

    job_id: int
    num_gpu: int
    submit: float
    start: float
    end: float
    jct: float
    preemptions: int


def read_job_log(path: StrPath) -> list[PeerJob]:
    """Read a Tiresias ``job.csv`` (columns :data:`JOB_LOG_COLUMNS`, plus ``resume`` from the ``count``
    scheme). JCT is recomputed as ``end_time - submit_time`` and must equal the log's ``JCT`` column.

    Raises TraceFormatError (file, line, column) for a missing/unknown column, a non-integer or negative
    field, a JCT that disagrees, or a job logged twice.
    """
    jobs = []
    for row in read_table(path, JOB_LOG_COLUMNS, ("resume",), unique="job_id"):
        submit = row.integer("submit_time")
        end = row.integer("end_time")
        jct = end - submit
        if jct < 0:
            raise row.error("end_time", f"end_time {end} before submit_time {submit}")
        if row.integer("JCT") != jct:
            raise row.error("JCT", f"JCT {row.raw('JCT')} != end_time - submit_time = {jct}")
        jobs.append(PeerJob(row.integer("job_id"), row.integer("num_gpu", minimum=1), float(submit),
                            float(row.integer("start_time", maximum=None)), float(end), float(jct),
                            row.integer("preempt")))
    return jobs


def jct_summary(jct_s: Sequence[float] | np.ndarray, submit_s: Sequence[float] | np.ndarray,
                end_s: Sequence[float] | np.ndarray) -> dict:
    """Mean / median / p95 / p99 / max JCT and makespan (last end - first submission), all in hours.

    Percentiles are NumPy's default (linear interpolation), the same for both simulators. Raises
    ValueError for no jobs or arrays of different lengths."""
    jct = np.asarray(jct_s, dtype=float)
    sub = np.asarray(submit_s, dtype=float)
    end = np.asarray(end_s, dtype=float)
    if jct.size == 0 or not (jct.shape == sub.shape == end.shape):
        raise ValueError(f"need equal, non-empty arrays, got {jct.shape}, {sub.shape}, {end.shape}")
    h = 3600.0
    return {"jobs": int(jct.size), "mean_jct_h": float(jct.mean() / h), "median_jct_h": float(np.median(jct) / h),
            "p95_jct_h": float(np.percentile(jct, 95) / h), "p99_jct_h": float(np.percentile(jct, 99) / h),
            "max_jct_h": float(jct.max() / h), "makespan_h": float((end.max() - sub.min()) / h)}

