"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<script>.py``)."""

from __future__ import annotations

import datetime as dt
import math
import os
import platform
from pathlib import Path


def json_safe(obj):
    """Non-finite floats -> None (recursively), so that a report is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def pin_one_cpu() -> None:
    """Pin this process to one CPU it may run on (the last one, away from CPU 0's interrupts)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[-1]})
    except (AttributeError, OSError):
        pass


def machine_info() -> dict:
    """CPU model, cores, Python and NumPy versions, platform, load average and date, for a results file."""
    import numpy as np

    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": np.__version__,
            "platform": platform.platform(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds")}
