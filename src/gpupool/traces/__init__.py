"""Loaders for public GPU-cluster traces (see ``shared/traces/README.md``).

* :func:`load_openb_nodes`, :func:`load_openb_pods`: Alibaba ``cluster-trace-gpu-v2023`` ("openb")
  node and pod lists -> :class:`~gpupool.model.NodeSpec` / :class:`~gpupool.model.PodRequest`.
* :func:`load_philly_jobs`, :func:`load_itp_jobs`, :func:`load_jobs`: job-level traces (Microsoft Philly
  as flattened by Pollux, Microsoft ITP from ElasticFlow) -> :class:`JobRecord`.

Every loader is strict: a malformed row raises :class:`TraceFormatError` naming the file, the line and
the column; nothing is dropped silently (only completely empty lines are skipped).
"""

from .errors import TraceFormatError
from .jobs import JobRecord, detect_job_format, load_itp_jobs, load_jobs, load_philly_jobs
from .openb import QOS_PRIORITY, load_openb_nodes, load_openb_pods

__all__ = [
    "QOS_PRIORITY",
    "JobRecord",
    "TraceFormatError",
    "detect_job_format",
    "load_itp_jobs",
    "load_jobs",
    "load_openb_nodes",
    "load_openb_pods",
    "load_philly_jobs",
]
