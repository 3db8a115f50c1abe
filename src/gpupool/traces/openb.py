"""Loaders for the Alibaba ``cluster-trace-gpu-v2023`` ("openb") node and pod lists (FGD, ATC'23).

See ``shared/traces/README.md`` for the columns. Units follow :mod:`gpupool.model`: CPU in milli-cores,
memory in MiB, GPU share in milli-GPU, times in seconds from the start of the trace.
"""

from __future__ import annotations

from gpupool.model import (
    MAX_CPU_MILLI,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
    MAX_POD_GPUS,
    MILLI,
    InvalidRequestError,
    NodeSpec,
    PodRequest,
)

from .errors import StrPath, read_table

__all__ = ["QOS_PRIORITY", "load_openb_nodes", "load_openb_pods"]

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_REQUIRED = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time")

QOS_PRIORITY: dict[str, int] = {"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0, "": 0}
"""Pod priority derived from the openb ``qos`` column (larger is more important; empty/absent -> 0)."""


def load_openb_nodes(path: StrPath) -> list[NodeSpec]:
    """Read an openb node list (``openb_node_list_*.csv``) into :class:`NodeSpec` objects, in file order.

    Columns ``sn,cpu_milli,memory_mib,gpu,model``: ``sn`` -> ``name``, ``cpu_milli`` (milli-cores),
    ``memory_mib`` (MiB), ``gpu`` -> ``gpu_count`` (GPUs), ``model`` -> ``gpu_model``. ``model`` may be
    empty only on a CPU-only node (``gpu`` == 0).

    Raises:
        TraceFormatError: empty file, unknown/missing/duplicate header column, a row with the wrong
            number of fields, an empty node name, a duplicate node name, a non-integer or negative
            capacity, or GPUs without a model; the error names the file, line and column.
        OSError: the file cannot be read.
    """
    nodes: list[NodeSpec] = []
    for row in read_table(path, NODE_COLUMNS, unique="sn"):
        name = row.text("sn")
        cpu_milli = row.integer("cpu_milli", maximum=MAX_CPU_MILLI)
        memory_mib = row.integer("memory_mib", maximum=MAX_MEMORY_MIB)
        gpu_count = row.integer("gpu", maximum=MAX_GPUS_PER_NODE)
        model = row.text("model", allow_empty=True)
        if model and (model != model.strip() or "|" in model):
            raise row.error("model", f"GPU model {model!r} has surrounding spaces or a '|'")
        if gpu_count > 0 and not model:
            raise row.error("model", f"empty GPU model on a node with {gpu_count} GPU(s)")
        try:
            nodes.append(NodeSpec(name, cpu_milli, memory_mib, gpu_count, model))
        except ValueError as exc:  # pragma: no cover - every NodeSpec check is done above
            raise row.error(None, str(exc)) from None
    return nodes


def load_openb_pods(path: StrPath) -> list[PodRequest]:
    """Read an openb pod list (``openb_pod_list_*.csv``, every variant) into :class:`PodRequest` objects.

    Accepts the 11-column files (``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
    creation_time,deletion_time,scheduled_time``) and the 5-column ``multigpu50`` file (``name,cpu_milli,
    memory_mib,num_gpu,gpu_milli``). Pods are returned in file order. Units: ``cpu_milli`` milli-cores,
    ``memory_mib`` MiB, ``num_gpu`` GPUs, ``gpu_milli`` milli-GPU per GPU, times in seconds from the start
    of the trace (``creation_time``/``deletion_time`` are ``None`` when empty or absent).

    ``gpu_spec`` is split on ``|`` into a tuple of GPU models (empty -> ``()``). ``qos`` is kept as
    written; ``priority`` is derived from it: LS and Guaranteed -> 2, Burstable -> 1, BE or absent -> 0.
    ``pod_phase`` is not kept; ``scheduled_time`` is only checked.

    Raises:
        TraceFormatError: empty file, unknown/missing/duplicate header column, a row with the wrong
            number of fields, an empty or duplicate pod name, a non-integer or negative request,
            a non-numeric or negative time, ``deletion_time`` before ``creation_time``, an empty entry
            in ``gpu_spec``, an unknown ``qos``, or a request that :class:`PodRequest` rejects as
            impossible (:class:`~gpupool.model.InvalidRequestError`, e.g. ``gpu_milli`` > 1000); the error
            names the file, line and column.
        OSError: the file cannot be read.
    """
    pods: list[PodRequest] = []
    for row in read_table(path, POD_REQUIRED, POD_OPTIONAL, unique="name"):
        name = row.text("name")
        cpu_milli = row.integer("cpu_milli", maximum=MAX_CPU_MILLI)
        memory_mib = row.integer("memory_mib", maximum=MAX_MEMORY_MIB)
        num_gpu = row.integer("num_gpu", maximum=MAX_POD_GPUS)
        gpu_milli = row.integer("gpu_milli", maximum=MILLI)

        spec_text = row.raw("gpu_spec") or ""
        gpu_spec = tuple(spec_text.split("|")) if spec_text else ()
        if any(not model for model in gpu_spec):
            raise row.error("gpu_spec", f"empty GPU model in {spec_text!r}")
        if any(model != model.strip() for model in gpu_spec):
            raise row.error("gpu_spec", f"GPU model with surrounding spaces in {spec_text!r}")

        qos = row.raw("qos") or ""
        if qos not in QOS_PRIORITY:
            known = ", ".join(q for q in QOS_PRIORITY if q)
            raise row.error("qos", f"unknown QoS class {qos!r} (expected one of {known} or empty)")

        creation_time = row.optional_number("creation_time")
        deletion_time = row.optional_number("deletion_time")
        row.optional_number("scheduled_time")
        if creation_time is not None and deletion_time is not None and deletion_time < creation_time:
            raise row.error(
                "deletion_time", f"deletion_time {deletion_time:g} s before creation_time {creation_time:g} s"
            )

        if num_gpu > 1 and gpu_milli != MILLI:  # the openb convention: a fraction only of one GPU
            raise row.error("num_gpu", f"a fractional share ({gpu_milli} milli) needs num_gpu == 1 in an openb "
                            f"trace, got {num_gpu}")
        try:
            pod = PodRequest(
                name=name,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                gpu_spec=gpu_spec,
                qos=qos,
                priority=QOS_PRIORITY[qos],
                creation_time=creation_time,
                deletion_time=deletion_time,
            )
        except InvalidRequestError as exc:
            raise row.error(_offending_column(num_gpu, gpu_milli), str(exc)) from None
        pods.append(pod)
    return pods


def _offending_column(num_gpu: int, gpu_milli: int) -> str | None:
    """The column to blame for a request :class:`PodRequest` rejected (negatives are caught earlier)."""
    if num_gpu == 0 and gpu_milli != 0:
        return "gpu_milli"  # a GPU share without a GPU
    if num_gpu > 0 and not 1 <= gpu_milli <= MILLI:
        return "gpu_milli"
    if num_gpu > 1 and gpu_milli != MILLI:
        return "num_gpu"  # a fractional share spread over several GPUs
    return None
