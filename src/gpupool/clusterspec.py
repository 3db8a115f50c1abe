"""Cluster description files: a YAML ``Cluster`` resource -> a list of :class:`~gpupool.model.NodeSpec`.

The format, in the style of a Kubernetes resource::

    apiVersion: gpupool.io/v1alpha1
    kind: Cluster
    metadata:
      name: small
    spec:
      nodePools:
        - name: hgx              # node names hgx-0000, hgx-0001, ...
          count: 2
          gpuModel: A100-80GB    # a gpupool.catalog name or alias; unknown names are kept (opaque), with a warning
          gpusPerNode: 8
          cpuCores: 128          # or cpuMilli: 128000
          memoryGiB: 1024        # or memoryMiB: 1048576
          nvlink: true           # the node's GPUs form one NVLink domain, named after the node
          nodesPerRack: 2        # racks hgx-rack-0, hgx-rack-1, ... (omit: rack unknown)
          racksPerSwitch: 1      # leaf switches leaf-<k> (omit: each rack's own top-of-rack leaf)
          labels: {gpupool.io/tier: training}
      topology:                  # optional: the tiers' names and the node labels that carry them
        levels:
          - {name: nvlink, nodeLabel: nvidia.com/gpu.clique}
          - {name: node, nodeLabel: kubernetes.io/hostname}
          - {name: rack, nodeLabel: topology.gpupool.io/rack}
          - {name: switch, nodeLabel: topology.gpupool.io/switch}

Layout rules:

* pool ``p``'s node ``i`` is ``p-<i:04d>`` (pools keep their order; nodes are numbered from 0 in each pool);
* with ``nodesPerRack: r`` node ``i`` is in rack ``p-rack-<i // r>``; racks are never shared between pools;
* leaf switches are numbered ``leaf-0, leaf-1, ...`` across the whole cluster, in pool order: each pool
  starts a new leaf, and its rack ``j`` hangs under its ``j // racksPerSwitch``-th leaf (one leaf per rack
  when ``racksPerSwitch`` is omitted: the top-of-rack switch is the leaf). Without ``nodesPerRack`` a pool
  has no rack and no switch (the topology module then treats multi-node placements as crossing the spine);
* ``nvlink: true`` sets the node's ``nvlink_domain`` to the node name;
* every node gets the label ``gpupool.io/node-pool: <pool>``, the pool's ``labels``, and one label per
  topology level that has a ``nodeLabel`` (valued with the node's NVLink domain, name, rack or switch;
  defaults in :data:`DEFAULT_LEVELS`).

Errors: the problems are reported together in a :class:`ClusterSpecError` whose message names the file and
the YAML path (and line) of each problem, e.g. ``philly.yaml: spec.nodePools[1].gpusPerNode: must be >= 0,
got -1 (line 14)``. Checks that involve several fields of one mapping (e.g. "cpuMilli or cpuCores") run
once that mapping's own fields are valid. Unknown GPU models are not errors; they come back as warnings
(:func:`load_cluster`) or are logged (:func:`load_cluster_yaml`, :func:`cluster_from_dict`) on the
``gpupool.clusterspec`` logger.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from gpupool.catalog import get_model
from gpupool.inputs import InputFileError, did_you_mean, key_position, known_keys, load_yaml, yaml_root
from gpupool.model import MAX_CPU_MILLI, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, GpupoolError, NodeSpec

MAX_CLUSTER_NODES = 1_000_000
"""Most nodes a cluster file may describe (all pools): more is a typo (a count of 10**8 would take minutes and
gigabytes to build before anything could say so)."""

__all__ = [
    "API_VERSION",
    "DEFAULT_LEVELS",
    "KIND",
    "LEVEL_NAMES",
    "POOL_LABEL",
    "ClusterDoc",
    "ClusterSpecError",
    "LoadedCluster",
    "NodePool",
    "TopologyLevel",
    "build_nodes",
    "cluster_from_dict",
    "load_cluster",
    "load_cluster_yaml",
    "parse_cluster",
]

log = logging.getLogger(__name__)

API_VERSION = "gpupool.io/v1alpha1"
KIND = "Cluster"
POOL_LABEL = "gpupool.io/node-pool"

LEVEL_NAMES: tuple[str, ...] = ("nvlink", "node", "rack", "switch", "spine")
"""Topology level names a ``spec.topology.levels`` entry may use, fastest first (the tiers of
:mod:`gpupool.topology` plus ``rack``)."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


class ClusterSpecError(GpupoolError, ValueError):
    """An invalid cluster file or dict. ``file`` names the source; ``problems`` is a list of
    ``(yaml_path, message, line)`` (``line`` is 1-based, or None when not known); ``text``, when given, is the
    message as it stands (a YAML syntax error: ``FILE:LINE:COLUMN: invalid YAML: what``)."""

    def __init__(self, file: str, problems: list[tuple[str, str, int | None]], text: str | None = None) -> None:
        self.file = file
        self.problems = problems
        lines = [_format_problem(path, msg, line) for path, msg, line in problems]
        if text is None and len(lines) == 1:
            text = f"{file}: {lines[0]}"
        elif text is None:
            text = f"{file}: {len(lines)} problems:\n" + "\n".join(f"  {x}" for x in lines)
        super().__init__(text)


def _format_problem(path: str, msg: str, line: int | None) -> str:
    where = f"{path}: " if path else ""
    return f"{where}{msg}" + (f" (line {line})" if line is not None else "")


class _FieldErrors(ValueError):
    """Cross-field problems found by a model validator, each at a path relative to the model."""

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, p))}: {m}" for p, m in problems))


# ------------------------------------------------------------------------------------------- the schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class TopologyLevel(_Strict):
    """One level of ``spec.topology.levels``: ``name`` (one of :data:`LEVEL_NAMES`) and, optionally, the
    ``nodeLabel`` whose value on each node names that node's unit at this level."""

    name: Literal["nvlink", "node", "rack", "switch", "spine"]
    node_label: str | None = Field(None, alias="nodeLabel")

    @field_validator("node_label")
    @classmethod
    def _label_key(cls, v: str | None) -> str | None:
        if v is not None and not _LABEL_KEY.fullmatch(v):
            raise ValueError(f"not a valid Kubernetes label key: {v!r}")
        return v


DEFAULT_LEVELS: tuple[TopologyLevel, ...] = (
    TopologyLevel(name="nvlink", nodeLabel="topology.gpupool.io/nvlink-domain"),
    TopologyLevel(name="node", nodeLabel="kubernetes.io/hostname"),
    TopologyLevel(name="rack", nodeLabel="topology.gpupool.io/rack"),
    TopologyLevel(name="switch", nodeLabel="topology.gpupool.io/switch"),
    TopologyLevel(name="spine"),
)
"""Levels (and the node labels set from them) when the file has no ``spec.topology``."""


class Topology(_Strict):
    levels: list[TopologyLevel] = Field(min_length=1)

    @model_validator(mode="after")
    def _order(self) -> Topology:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen: dict[str, int] = {}
        last = -1
        for i, level in enumerate(self.levels):
            if level.name in seen:
                problems.append(
                    (("levels", i, "name"), f"duplicate level {level.name!r} (also levels[{seen[level.name]}])")
                )
                continue
            seen[level.name] = i
            rank = LEVEL_NAMES.index(level.name)
            if rank < last:
                problems.append(
                    (("levels", i, "name"), f"levels must go fastest to slowest ({' < '.join(LEVEL_NAMES)})")
                )
            last = max(last, rank)
        if problems:
            raise _FieldErrors(problems)
        return self


class NodePool(_Strict):
    """``spec.nodePools[i]``: ``count`` identical nodes (see the module doc for the fields)."""

    name: str
    count: StrictInt = Field(ge=0, le=MAX_CLUSTER_NODES)
    gpu_model: str = Field("", alias="gpuModel")
    gpus_per_node: StrictInt = Field(0, ge=0, le=MAX_GPUS_PER_NODE, alias="gpusPerNode")
    cpu_milli: StrictInt | None = Field(None, ge=0, le=MAX_CPU_MILLI, alias="cpuMilli")
    cpu_cores: float | None = Field(None, ge=0, alias="cpuCores")
    memory_mib: StrictInt | None = Field(None, ge=0, le=MAX_MEMORY_MIB, alias="memoryMiB")
    memory_gib: float | None = Field(None, ge=0, alias="memoryGiB")
    nvlink: StrictBool = False
    nodes_per_rack: StrictInt | None = Field(None, ge=1, alias="nodesPerRack")
    racks_per_switch: StrictInt | None = Field(None, ge=1, alias="racksPerSwitch")
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _DNS_LABEL.fullmatch(v) or len(v) > 50:
            raise ValueError(
                f"{v!r} is not a valid pool name (lower-case letters, digits and '-', starting and ending with "
                "a letter or digit, at most 50 characters)"
            )
        return v

    @field_validator("cpu_cores", "memory_gib", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or (v is not None and not isinstance(v, int | float)):
            raise ValueError(f"must be a number, got {v!r}")
        if v is not None and not math.isfinite(v):
            raise ValueError(f"must be a finite number, got {v!r}")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not _LABEL_KEY.fullmatch(key):
                raise ValueError(f"not a valid Kubernetes label key: {key!r}")
        return v

    @model_validator(mode="after")
    def _cross(self) -> NodePool:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        if self.cpu_milli is not None and self.cpu_cores is not None:
            problems.append((("cpuCores",), "give either cpuMilli or cpuCores, not both"))
        elif self.cpu_milli is None and self.cpu_cores is None:
            problems.append((("cpuMilli",), "required (or cpuCores)"))
        elif self.cpu_cores is not None and self.cpu_cores * 1000 > MAX_CPU_MILLI:
            problems.append((("cpuCores",), f"{self.cpu_cores:g} cores is more than a node may have "
                                            f"({MAX_CPU_MILLI // 1000:,})"))
        elif self.cpu_cores is not None and not _whole(self.cpu_cores * 1000):
            problems.append((("cpuCores",), f"{self.cpu_cores} cores is not a whole number of milli-cores"))
        if self.memory_mib is not None and self.memory_gib is not None:
            problems.append((("memoryGiB",), "give either memoryMiB or memoryGiB, not both"))
        elif self.memory_mib is None and self.memory_gib is None:
            problems.append((("memoryMiB",), "required (or memoryGiB)"))
        elif self.memory_gib is not None and self.memory_gib * 1024 > MAX_MEMORY_MIB:
            problems.append((("memoryGiB",), f"{self.memory_gib:g} GiB is more than a node may have "
                                             f"({MAX_MEMORY_MIB // 1024:,})"))
        elif self.memory_gib is not None and not _whole(self.memory_gib * 1024):
            problems.append((("memoryGiB",), f"{self.memory_gib} GiB is not a whole number of MiB"))
        if self.gpus_per_node > 0 and not self.gpu_model.strip():
            problems.append((("gpuModel",), f"required when gpusPerNode > 0 (gpusPerNode is {self.gpus_per_node})"))
        if self.gpus_per_node == 0 and self.gpu_model:
            problems.append((("gpuModel",), f"{self.gpu_model!r} given but gpusPerNode is 0"))
        if self.nvlink and self.gpus_per_node < 2:
            problems.append((("nvlink",), f"an NVLink domain needs gpusPerNode >= 2, got {self.gpus_per_node}"))
        if self.racks_per_switch is not None and self.nodes_per_rack is None:
            problems.append((("racksPerSwitch",), "needs nodesPerRack"))
        if problems:
            raise _FieldErrors(problems)
        return self

    @property
    def cpu(self) -> int:
        """CPU per node, milli-cores."""
        return self.cpu_milli if self.cpu_milli is not None else round((self.cpu_cores or 0.0) * 1000)

    @property
    def memory(self) -> int:
        """Memory per node, MiB."""
        return self.memory_mib if self.memory_mib is not None else round((self.memory_gib or 0.0) * 1024)

    @property
    def racks(self) -> int:
        """Number of racks of this pool (0 when ``nodesPerRack`` is not given)."""
        return -(-self.count // self.nodes_per_rack) if self.nodes_per_rack else 0

    @property
    def switches(self) -> int:
        """Number of leaf switches of this pool."""
        return -(-self.racks // (self.racks_per_switch or 1))


def _whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-6


class Metadata(_Strict):
    name: str = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Spec(_Strict):
    node_pools: list[NodePool] = Field(alias="nodePools", min_length=1)
    topology: Topology | None = None

    @model_validator(mode="after")
    def _pools(self) -> Spec:
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen: dict[str, int] = {}
        for i, pool in enumerate(self.node_pools):
            if pool.name in seen:
                problems.append(
                    (("nodePools", i, "name"), f"duplicate pool name {pool.name!r} (also nodePools[{seen[pool.name]}])")
                )
            seen.setdefault(pool.name, i)
        total = sum(p.count for p in self.node_pools)
        if not problems and total == 0:
            problems.append((("nodePools",), "the cluster has no node (every count is 0)"))
        if not problems and total > MAX_CLUSTER_NODES:
            problems.append((("nodePools",), f"{total:,} nodes in all; at most {MAX_CLUSTER_NODES:,}"))
        if problems:
            raise _FieldErrors(problems)
        return self


class ClusterDoc(_Strict):
    """A whole cluster file."""

    api_version: Literal["gpupool.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["Cluster"]
    metadata: Metadata
    spec: Spec

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def levels(self) -> tuple[TopologyLevel, ...]:
        return tuple(self.spec.topology.levels) if self.spec.topology else DEFAULT_LEVELS

    def to_nodes(self) -> list[NodeSpec]:
        return build_nodes(self)


# ------------------------------------------------------------------------------------------ building


def build_nodes(doc: ClusterDoc) -> list[NodeSpec]:
    """The nodes of a validated cluster document (layout rules in the module doc)."""
    levels = doc.levels
    nodes: list[NodeSpec] = []
    leaf_base = 0
    for pool in doc.spec.node_pools:
        for i in range(pool.count):
            name = f"{pool.name}-{i:04d}"
            rack = switch = ""
            if pool.nodes_per_rack:
                j = i // pool.nodes_per_rack
                rack = f"{pool.name}-rack-{j}"
                switch = f"leaf-{leaf_base + j // (pool.racks_per_switch or 1)}"
            domain = name if pool.nvlink else ""
            per_level = {"nvlink": domain, "node": name, "rack": rack, "switch": switch, "spine": doc.name}
            labels: dict[str, str] = {POOL_LABEL: pool.name}
            labels.update(pool.labels)
            for level in levels:
                if level.node_label and per_level[level.name]:
                    labels[level.node_label] = per_level[level.name]
            nodes.append(
                NodeSpec(
                    name=name,
                    cpu_milli=pool.cpu,
                    memory_mib=pool.memory,
                    gpu_count=pool.gpus_per_node,
                    gpu_model=pool.gpu_model if pool.gpus_per_node else "",
                    nvlink_domain=domain,
                    rack=rack,
                    switch=switch,
                    labels=tuple(sorted(labels.items())),
                )
            )
        leaf_base += pool.switches
    return nodes


def _warnings(doc: ClusterDoc) -> list[str]:
    out = []
    for i, pool in enumerate(doc.spec.node_pools):
        if pool.gpus_per_node and not get_model(pool.gpu_model).known:
            out.append(
                f"spec.nodePools[{i}].gpuModel: {pool.gpu_model!r} is not in the GPU catalog; kept as an opaque "
                "model (no memory, power or throughput figures)"
            )
    return out


# ------------------------------------------------------------------------------------------ errors


def _path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _describe(err: Mapping[str, Any]) -> tuple[tuple[str | int, ...], str] | list[tuple[tuple[str | int, ...], str]]:
    loc: tuple[str | int, ...] = tuple(err["loc"])
    kind = err["type"]
    ctx = err.get("ctx") or {}
    got = err.get("input")
    if kind == "value_error" and isinstance(ctx.get("error"), _FieldErrors):
        return [(loc + p, m) for p, m in ctx["error"].problems]
    if kind == "missing":
        return loc, "required"
    if kind == "extra_forbidden":
        return loc, f"unknown field{did_you_mean(str(loc[-1]), known_keys(ClusterDoc, loc[:-1]))}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        return loc, f"must be {op} {bound}, got {got!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return loc, f"must be an integer, got {got!r}"
    if kind in ("bool_type", "bool_parsing"):
        return loc, f"must be true or false, got {got!r}"
    if kind in ("string_type",):
        return loc, f"must be a string, got {got!r}"
    if kind in ("float_type", "float_parsing", "finite_number"):
        return loc, f"must be a number, got {got!r}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return loc, f"must be a mapping, got {type(got).__name__}"
    if kind == "list_type":
        return loc, f"must be a list, got {type(got).__name__}"
    if kind == "too_short":
        return loc, "must not be empty"
    if kind == "literal_error":
        return loc, f"must be {ctx.get('expected')}, got {got!r}"
    if kind == "value_error":
        return loc, str(ctx.get("error", err["msg"]))
    return loc, str(err["msg"])


def _problems(exc: ValidationError, root: yaml.Node | None) -> list[tuple[str, str, int | None]]:
    out: list[tuple[str, str, int | None]] = []
    for err in exc.errors(include_url=False):
        described = _describe(err)
        for loc, msg in described if isinstance(described, list) else [described]:
            pos = key_position(root, loc)
            out.append((_path(loc), msg, pos[0] if pos is not None else None))
    return out


# ------------------------------------------------------------------------------------------ entry points


@dataclass(frozen=True, slots=True)
class LoadedCluster:
    """A parsed cluster: ``nodes``, the validated document ``doc``, ``warnings`` (each prefixed with the
    YAML path, not the file) and the ``source`` it came from."""

    nodes: list[NodeSpec]
    doc: ClusterDoc
    warnings: list[str]
    source: str

    @property
    def name(self) -> str:
        return self.doc.name

    @property
    def total_gpus(self) -> int:
        return sum(n.gpu_count for n in self.nodes)


def _parse(data: Any, source: str, text: str | None = None) -> LoadedCluster:
    if not isinstance(data, Mapping):
        kind = "empty" if data is None else type(data).__name__
        raise ClusterSpecError(
            source, [("", f"expected a mapping (a Cluster resource) at the top level, got {kind}", None)]
        )
    try:
        doc = ClusterDoc.model_validate(data)
    except ValidationError as exc:
        root = yaml_root(text)
        raise ClusterSpecError(source, _problems(exc, root)) from None
    nodes = build_nodes(doc)
    return LoadedCluster(nodes=nodes, doc=doc, warnings=_warnings(doc), source=source)


def parse_cluster(data: Mapping[str, Any], source: str = "<dict>") -> LoadedCluster:
    """Validate a cluster given as a dict (e.g. already-parsed YAML) and build its nodes.

    Raises:
        ClusterSpecError: the document is invalid; the message starts with ``source``.
    """
    return _parse(data, source)


def cluster_from_dict(d: Mapping[str, Any], source: str = "<dict>") -> list[NodeSpec]:
    """The nodes of the cluster dict ``d``; warnings (unknown GPU models) are logged.

    Raises:
        ClusterSpecError: the document is invalid.
    """
    loaded = parse_cluster(d, source)
    for w in loaded.warnings:
        log.warning("%s: %s", source, w)
    return loaded.nodes


def load_cluster(path: str | os.PathLike[str]) -> LoadedCluster:
    """Read and validate a cluster YAML file (:func:`gpupool.inputs.load_yaml`).

    Raises:
        ClusterSpecError: invalid YAML, text that is not UTF-8, or an invalid document; the message names the
            file (as given) and the YAML path and line of every problem.
        OSError: the file cannot be read.
    """
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        bad = f"byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
        raise ClusterSpecError(source, [("", f"not UTF-8 text ({bad}); save the file as UTF-8", None)]) from None
    try:
        data = load_yaml(text, source)
    except InputFileError as exc:  # one line, FILE:LINE:COLUMN: invalid YAML: what
        raise ClusterSpecError(source, [("", "invalid YAML", None)], text=str(exc)) from None
    return _parse(data, source, text)


def load_cluster_yaml(path: str | os.PathLike[str]) -> list[NodeSpec]:
    """The nodes of the cluster YAML file ``path``; warnings (unknown GPU models) are logged.

    Raises:
        ClusterSpecError: invalid YAML or document (the message names the file and the YAML path).
        OSError: the file cannot be read.
    """
    loaded = load_cluster(path)
    for w in loaded.warnings:
        log.warning("%s: %s", loaded.source, w)
    return loaded.nodes
