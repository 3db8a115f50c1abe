"""Provenance of a run, written as the ``meta`` block of every JSON result: which gpupool (version and, from a git
checkout, the commit), when, and on what machine. Figures in a results file mean little without them.

Imports nothing of gpupool but its version, so every layer may use it (docs/architecture.md).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

from gpupool import __version__

__all__ = ["run_meta", "source_commit"]


@cache
def source_commit() -> dict[str, Any] | None:
    """``{"commit": sha, "dirty": bool}`` when gpupool runs from a git checkout (an editable install), else None
    (an installed wheel, or no ``git`` on the PATH). Asked once per process; at most ~2 s if git hangs."""
    src = Path(__file__).resolve().parent
    try:
        top = subprocess.run(["git", "-C", str(src), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, timeout=2, check=False)
        if top.returncode != 0:
            return None
        root, sha = top.stdout.split()[:2]
        if not (Path(root) / "src" / "gpupool" / "__init__.py").is_file():  # some other repository around a wheel
            return None
        status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", "src"],
                                capture_output=True, text=True, timeout=2, check=False)
        return {"commit": sha, "dirty": bool(status.stdout.strip()) if status.returncode == 0 else None}
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run_meta() -> dict[str, Any]:
    """The ``meta`` block: ``gpupool`` (version), ``commit``/``dirty`` (None outside a git checkout), ``time``
    (UTC, ISO 8601, seconds), ``command`` (argv), and ``machine`` (CPU model, cores, platform, Python)."""
    src = source_commit() or {}
    return {
        "gpupool": __version__,
        "commit": src.get("commit"),
        "dirty": src.get("dirty"),
        "time": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": [Path(sys.argv[0]).name, *sys.argv[1:]] if sys.argv and sys.argv[0] else [],
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
    }
