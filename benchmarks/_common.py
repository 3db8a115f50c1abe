"""Helpers shared by the benchmark scripts (run as ``python benchmarks/<script>.py``)."""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import platform
from pathlib import Path

OPENB_TRACES = Path(os.environ.get("GPUPOOL_TRACES", Path(__file__).resolve().parents[2] / "shared" / "traces"),
                    "openb")
"""The openb trace folder: ``$GPUPOOL_TRACES/openb``, else ``../shared/traces/openb`` beside the repository."""


def json_safe(obj):
    """Non-finite floats -> None (recursively), so that a report is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [json_safe(v) for v in obj]
    return obj


def int_at_least(minimum: int):
    """An argparse ``type``: an int >= ``minimum`` (ArgumentTypeError naming the value otherwise)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def int_list(ap: argparse.ArgumentParser, option: str, text: str, minimum: int | None = None, multiple: int = 1,
             allow_empty: bool = False) -> list[int]:
    """Comma-separated ints of ``option`` (blank items skipped), each >= ``minimum`` (None: any) and a multiple
    of ``multiple``, at least one unless ``allow_empty``; a bad value ends the run with ``ap.error`` (exit 2)
    naming the option and the value."""
    values = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        try:
            v = int(item)
        except ValueError:
            ap.error(f"argument {option}: invalid int value: {item!r}")
        if (minimum is not None and v < minimum) or v % multiple:
            what = f"a multiple of {multiple} >= {minimum}" if multiple > 1 else f">= {minimum}"
            ap.error(f"argument {option}: {v} is not {what}")
        values.append(v)
    if not values and not allow_empty:
        ap.error(f"argument {option}: no value in {text!r}")
    return values


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
