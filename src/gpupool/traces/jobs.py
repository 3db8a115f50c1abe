"""Loaders for job-level GPU cluster traces: Microsoft Philly (as flattened by Pollux) and Microsoft ITP
(raw ElasticFlow release).

Both give one :class:`JobRecord` per job: when it was submitted, how long it ran and how many GPUs it
used. Times are in seconds; ``submit_time`` counts from the earliest submission in the file.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter

from .errors import StrPath, TraceFormatError, read_header, read_table

__all__ = ["JOB_FORMATS", "JobRecord", "detect_job_format", "load_itp_jobs", "load_jobs", "load_philly_jobs"]

PHILLY_COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
ITP_COLUMNS = ("job_id", "submission_time", "duration", "num_gpu")
JOB_FORMATS: dict[str, tuple[str, ...]] = {"philly": PHILLY_COLUMNS, "itp": ITP_COLUMNS}
"""Job trace formats known to :func:`load_jobs`, with their columns."""

GPU_TIME_REL_TOL = 1e-6
"""Relative tolerance of the Philly check ``gpu_time == duration * num_gpus``."""
MAX_JOB_DURATION_S = 10 * 365 * 86400.0
"""Longest job duration a trace row may give (10 years, in seconds): a larger one is a unit mistake, and
would make a simulation run (and sample) for ages."""

MAX_SUBMISSION_TIME_S = 100 * 365 * 86400.0
"""Largest ITP ``submission_time`` a row may give (100 years, in seconds, as the file counts them): a
larger one is a unit mistake (milliseconds, an epoch in nanoseconds), and far enough out that adding a
duration to it loses the duration to rounding (1e300 + 100 == 1e300: every job would take no time)."""

_TIMESTAMP_RE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")
_EPOCH = datetime(1970, 1, 1)


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job of a job-level trace.

    * ``job_id``: the trace's id (ITP), or ``"philly-<line>"`` for Philly, which has none.
    * ``submit_time``: seconds from the earliest submission in the same file (the first job is at 0.0).
    * ``duration``: run time in seconds (> 0, at most :data:`MAX_JOB_DURATION_S`).
    * ``num_gpu``: GPUs used (>= 1).
    * ``queue``: the Philly virtual cluster (``cluster`` column hash); ``""`` for ITP.
    * ``line``: the row's line number in the source file (header = line 1).
    """

    job_id: str
    submit_time: float
    duration: float
    num_gpu: int
    queue: str
    line: int


def load_philly_jobs(path: StrPath) -> list[JobRecord]:
    """Read the Philly job trace (Pollux's ``philly.csv``), sorted by submission time.

    Columns ``timestamp,duration,num_gpus,gpu_time,cluster``: ``timestamp`` is the submission wall-clock
    time ``YYYY-MM-DD HH:MM:SS`` (no time zone; only differences are used), ``duration`` seconds,
    ``num_gpus`` GPUs, ``gpu_time`` GPU-seconds (must equal ``duration * num_gpus`` within a relative
    tolerance of 1e-6), ``cluster`` the virtual-cluster hash (kept as ``queue``). The rows are not sorted
    in the file: the result is sorted by ``submit_time`` (seconds from the earliest ``timestamp``),
    stable, so jobs submitted in the same second keep their file order. ``job_id`` is
    ``"philly-<line>"``. Completely empty lines (the file ends with one) are skipped.

    Raises:
        TraceFormatError: empty file, unknown/missing/duplicate header column, a row with the wrong
            number of fields, a malformed timestamp, a non-numeric, negative or (for ``duration``) zero
            value, ``num_gpus`` < 1, an inconsistent ``gpu_time`` or an empty ``cluster``; the error
            names the file, line and column.
        OSError: the file cannot be read.
    """
    raw: list[tuple[float, float, int, str, int]] = []
    for row in read_table(path, PHILLY_COLUMNS):
        stamp = row.text("timestamp")
        if not _TIMESTAMP_RE.fullmatch(stamp):
            raise row.error("timestamp", f"expected 'YYYY-MM-DD HH:MM:SS', got {stamp!r}")
        try:
            when = (datetime.fromisoformat(stamp) - _EPOCH).total_seconds()
        except ValueError as exc:
            raise row.error("timestamp", f"invalid date/time {stamp!r} ({exc})") from None
        duration = row.number("duration", positive=True, maximum=MAX_JOB_DURATION_S)
        num_gpu = row.integer("num_gpus", minimum=1)
        gpu_time = row.number("gpu_time")
        expected = duration * num_gpu
        if not math.isclose(gpu_time, expected, rel_tol=GPU_TIME_REL_TOL):
            raise row.error(
                "gpu_time", f"gpu_time {gpu_time:g} != duration * num_gpus = {duration:g} * {num_gpu}"
            )
        queue = row.text("cluster")
        raw.append((when, duration, num_gpu, queue, row.line))

    start = min((r[0] for r in raw), default=0.0)
    jobs = [
        JobRecord(f"philly-{line}", when - start, duration, num_gpu, queue, line)
        for when, duration, num_gpu, queue, line in raw
    ]
    jobs.sort(key=attrgetter("submit_time"))
    return jobs


def load_itp_jobs(path: StrPath) -> list[JobRecord]:
    """Read one Microsoft ITP cluster job trace (ElasticFlow raw ``clusterNN.csv``), sorted by submission.

    Columns ``job_id,submission_time,duration,num_gpu``: ``job_id`` a unique id, ``submission_time``
    seconds from the start of collection, ``duration`` seconds, ``num_gpu`` GPUs. The rows are not
    sorted in the file: the result is sorted by ``submit_time`` (seconds from the earliest
    ``submission_time`` in the file), stable. ``queue`` is ``""``. Completely empty lines are skipped.

    Raises:
        TraceFormatError: empty file, unknown/missing/duplicate header column, a row with the wrong
            number of fields, an empty or duplicate ``job_id``, a non-numeric, negative or too large
            (:data:`MAX_SUBMISSION_TIME_S`) ``submission_time``, a non-positive ``duration`` or ``num_gpu`` < 1;
            the error names the
            file, line and column.
        OSError: the file cannot be read.
    """
    raw: list[tuple[str, float, float, int, int]] = []
    for row in read_table(path, ITP_COLUMNS, unique="job_id"):
        job_id = row.text("job_id")
        submitted = row.number("submission_time", maximum=MAX_SUBMISSION_TIME_S)
        duration = row.number("duration", positive=True, maximum=MAX_JOB_DURATION_S)
        num_gpu = row.integer("num_gpu", minimum=1)
        raw.append((job_id, submitted, duration, num_gpu, row.line))

    start = min((r[1] for r in raw), default=0.0)
    jobs = [
        JobRecord(job_id, submitted - start, duration, num_gpu, "", line)
        for job_id, submitted, duration, num_gpu, line in raw
    ]
    jobs.sort(key=attrgetter("submit_time"))
    return jobs


def detect_job_format(path: StrPath) -> str:
    """Tell a job trace's format from its header: ``"philly"`` or ``"itp"`` (column order is free).

    Raises:
        TraceFormatError: the file is empty or its header (line 1) is not that of a known format.
        OSError: the file cannot be read.
    """
    file, header, _ = read_header(path)
    for fmt, columns in JOB_FORMATS.items():
        if len(header) == len(columns) and set(header) == set(columns):
            return fmt
    known = "; ".join(f"{fmt}: {','.join(columns)}" for fmt, columns in JOB_FORMATS.items())
    raise TraceFormatError(file, 1, None, f"unknown job trace header {','.join(header)!r} (known: {known})")


def load_jobs(path: StrPath, fmt: str | None = None) -> list[JobRecord]:
    """Read a job trace of format ``fmt`` (``"philly"`` or ``"itp"``; ``None`` = detect from the header).

    Returns the jobs sorted by ``submit_time`` (seconds from the file's earliest submission); see
    :func:`load_philly_jobs` and :func:`load_itp_jobs` for the units.

    Raises:
        TraceFormatError: as the format's loader, or the header is not a known format (when detecting).
        ValueError: ``fmt`` is not a known format name.
        OSError: the file cannot be read.
    """
    if fmt is None:
        fmt = detect_job_format(path)
    if fmt == "philly":
        return load_philly_jobs(path)
    if fmt == "itp":
        return load_itp_jobs(path)
    raise ValueError(f"unknown job trace format {fmt!r} (expected one of {', '.join(JOB_FORMATS)})")
