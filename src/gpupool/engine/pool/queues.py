"""Hierarchical queues (teams) with quota, limit, over-quota weight and priority. No I/O but the loader.

Semantics follow KAI's ``Queue`` (``resources.gpu.{quota, limit, overQuotaWeight}``, ``parentQueue``,
``priority``) and Kueue's ClusterQueue (``nominalQuota``, ``borrowingLimit``, ``fairSharing.weight``):

* ``quota``: GPUs guaranteed to the queue while it has demand (KAI "deserved quota", Kueue "nominal
  quota"). Another queue may *borrow* quota its owner leaves idle; the owner reclaims it by preemption.
* ``limit``: the most GPUs the queue may hold, borrowing included (``None`` = unlimited; KAI ``-1``).
* ``weight``: the queue's share of capacity left idle above all quotas (KAI ``overQuotaWeight``).
* ``priority``: queues of higher priority get their quota first when quotas cannot all be met (failures
  shrank the cluster) and are served first above quota (KAI queue priority); a higher-priority queue
  below its quota may reclaim even in-quota *preemptible* work of a strictly lower-priority queue
  (KAI #2064).
* ``cpu_quota`` (cores) and ``memory_quota`` (GiB): optional; by default a queue's CPU and memory quota
  are its GPU quota times the cluster's CPU (memory) per GPU, so a GPU quota carries the matching host
  resources (weighted DRF over the three resources, :mod:`gpupool.engine.pool.fairshare`).

Only leaf queues take jobs. Queue files (YAML)::

    queues:
      - name: research            # an inner queue
        quota: 48
      - name: vision
        parent: research
        quota: 32
        limit: 64
        weight: 2
      - name: prod
        quota: 16
        priority: 10

Errors: :class:`QueueConfigError` (a ``ValueError``) naming the file, the queue and the field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpupool.inputs import did_you_mean, load_yaml, unknown_keys

__all__ = ["QueueConfigError", "QueueFile", "QueueSpec", "QueueTree", "load_queues_yaml", "queues_from_dicts"]


class QueueConfigError(ValueError):
    """A queue definition that cannot be used; the message names the file (if any), queue and field."""


class QueueSpec(BaseModel):
    """One queue as declared. GPUs may be fractional (quota 0.5 = half a GPU's worth of time)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    parent: str | None = None
    quota: float = Field(default=0.0, ge=0.0, description="guaranteed GPUs")
    limit: float | None = Field(default=None, description="most GPUs the queue may hold; None or -1: unlimited")
    weight: float = Field(default=1.0, gt=0.0, description="share of idle capacity above quota")
    priority: int = Field(default=0, ge=-(2**31), le=2**31 - 1, description="int32, as the Queue CRD's")
    cpu_quota: float | None = Field(default=None, ge=0.0, description="cores; default: GPU quota x cores per GPU")
    memory_quota: float | None = Field(default=None, ge=0.0, description="GiB; default: GPU quota x GiB per GPU")

    @field_validator("quota", "limit", "weight", "priority", "cpu_quota", "memory_quota", mode="before")
    @classmethod
    def _not_bool(cls, value: object) -> object:
        if isinstance(value, bool):  # YAML true/false would pass as 1/0
            raise ValueError(f"expected a number, got {str(value).lower()}")
        return value

    @field_validator("limit")
    @classmethod
    def _limit(cls, value: float | None) -> float | None:
        if value is None or value == -1:
            return None
        if value < 0 or not math.isfinite(value):
            raise ValueError(f"limit must be >= 0 GPUs or -1 (unlimited), got {value}")
        return float(value)

    @field_validator("quota", "weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be finite")
        return value

    @model_validator(mode="after")
    def _limit_above_quota(self) -> QueueSpec:
        if self.limit is not None and self.limit < self.quota:
            raise ValueError(f"limit {self.limit:g} is below quota {self.quota:g}")
        if self.parent == self.name:
            raise ValueError("a queue cannot be its own parent")
        return self


class QueueTree:
    """Validated queue hierarchy with per-queue arrays (index = position in ``specs``).

    * ``names``: tuple of queue names; ``index``: name -> position.
    * ``parent``: (n,) int64, parent index, -1 for a top-level queue.
    * ``children``: tuple of tuples of child indices; ``leaves``: (k,) int64 indices of leaf queues.
    * ``quota_gpu``, ``limit_gpu`` (inf = unlimited), ``weight``: (n,) float64; ``priority``: (n,) int64.
    * ``order``: queue indices parents-before-children (top-down).

    Raises :class:`QueueConfigError` for duplicate names, an unknown parent, or a cycle.
    """

    def __init__(self, specs: Sequence[QueueSpec], source: str = "") -> None:
        where = f"{source}: " if source else ""
        if not specs:
            raise QueueConfigError(f"{where}no queues defined")
        names = [s.name for s in specs]
        seen: set[str] = set()
        for n in names:
            if n in seen:
                raise QueueConfigError(f"{where}queue {n!r} is defined twice")
            seen.add(n)
        self.specs: tuple[QueueSpec, ...] = tuple(specs)
        self.names: tuple[str, ...] = tuple(names)
        self.index: dict[str, int] = {n: i for i, n in enumerate(names)}
        n = len(specs)
        parent = np.full(n, -1, dtype=np.int64)
        for i, s in enumerate(specs):
            if s.parent is not None:
                if s.parent not in self.index:
                    raise QueueConfigError(f"{where}queue {s.name!r}: parent {s.parent!r} is not defined")
                parent[i] = self.index[s.parent]
        for i in range(n):  # cycle check: walking up must reach the root within n steps
            j, steps = i, 0
            while j >= 0:
                j = int(parent[j])
                steps += 1
                if steps > n:
                    raise QueueConfigError(f"{where}queue {names[i]!r}: its parents form a cycle")
        self.parent = parent
        kids: list[list[int]] = [[] for _ in range(n)]
        for i in range(n):
            if parent[i] >= 0:
                kids[int(parent[i])].append(i)
        self.children: tuple[tuple[int, ...], ...] = tuple(tuple(k) for k in kids)
        self.is_leaf = np.array([not k for k in kids], dtype=bool)
        self.leaves = np.flatnonzero(self.is_leaf)
        self.top = tuple(i for i in range(n) if parent[i] < 0)
        order: list[int] = []
        stack = list(reversed(self.top))
        while stack:
            i = stack.pop()
            order.append(i)
            stack.extend(reversed(kids[i]))
        self.order: tuple[int, ...] = tuple(order)
        self.quota_gpu = np.array([s.quota for s in specs], dtype=np.float64)
        self.limit_gpu = np.array([math.inf if s.limit is None else s.limit for s in specs], dtype=np.float64)
        self.weight = np.array([s.weight for s in specs], dtype=np.float64)
        self.priority = np.array([s.priority for s in specs], dtype=np.int64)
        # a child may not be guaranteed more than its parent holds
        for i in range(n):
            if kids[i]:
                total = float(self.quota_gpu[list(kids[i])].sum())
                if total > self.quota_gpu[i] + 1e-9 and self.quota_gpu[i] > 0:
                    raise QueueConfigError(
                        f"{where}queue {names[i]!r}: its children's quotas add up to {total:g} GPUs, "
                        f"more than its own quota {self.quota_gpu[i]:g}"
                    )

    def __len__(self) -> int:
        return len(self.specs)

    def leaf_index(self, name: str) -> int:
        """Index of leaf queue ``name``; KeyError (listing the leaves) if unknown or not a leaf."""
        i = self.index.get(name)
        if i is None:
            leaves = ", ".join(self.names[j] for j in self.leaves)
            raise KeyError(f"unknown queue {name!r}; leaf queues: {leaves}")
        if not self.is_leaf[i]:
            raise KeyError(f"queue {name!r} has child queues; only leaf queues take jobs")
        return i

    def ancestors(self, i: int) -> list[int]:
        """``i`` and its parents up to the top level, ``i`` first."""
        out = [i]
        while self.parent[out[-1]] >= 0:
            out.append(int(self.parent[out[-1]]))
        return out

    def quota_vectors(self, cpu_per_gpu: float, mem_per_gpu: float) -> np.ndarray:
        """(n, 3) float64 quota per queue over (GPUs, milli-CPU, MiB).

        CPU and memory default to the GPU quota times ``cpu_per_gpu`` (milli-CPU) and ``mem_per_gpu`` (MiB);
        an explicit ``cpu_quota`` (cores) / ``memory_quota`` (GiB) overrides it.
        """
        out = np.empty((len(self), 3))
        for i, s in enumerate(self.specs):
            out[i, 0] = s.quota
            out[i, 1] = s.quota * cpu_per_gpu if s.cpu_quota is None else s.cpu_quota * 1000.0
            out[i, 2] = s.quota * mem_per_gpu if s.memory_quota is None else s.memory_quota * 1024.0
        return out

    def to_dicts(self) -> list[dict]:
        return [s.model_dump(exclude_none=True) for s in self.specs]


class QueueFile(BaseModel):
    """The key schema of a queue file (:func:`gpupool.inputs.unknown_keys`): a ``queues`` list of
    :class:`QueueSpec`; the values are checked by :func:`queues_from_dicts`."""

    model_config = ConfigDict(extra="forbid")

    queues: list[QueueSpec] | None = None


def _format_validation(exc: ValidationError, label: str) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(queue)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = f"unknown field{did_you_mean(str(err['loc'][-1]), QueueSpec.model_fields)}"
        parts.append(f"{label}: field {loc!r}: {msg}")
    return "; ".join(parts)


def queues_from_dicts(items: Iterable[dict], source: str = "") -> QueueTree:
    """A :class:`QueueTree` from plain dicts (the ``queues:`` list of a queue file).

    Raises :class:`QueueConfigError` naming ``source`` (a file name, or ``""``), the queue and the field.
    """
    where = f"{source}: " if source else ""
    specs = []
    for k, item in enumerate(items):
        name = item.get("name") if isinstance(item, dict) else None
        label = f"{where}queues[{k}]" + (f" ({name})" if name else "")
        if not isinstance(item, dict):
            raise QueueConfigError(f"{label}: expected a mapping, got {type(item).__name__}")
        for key in ("name", "parent"):
            if isinstance(item.get(key), int | float) and not isinstance(item.get(key), bool):
                raise QueueConfigError(f"{label}: field {key!r}: {item[key]!r} is a number; queue names are "
                                       f"strings (quote names YAML reads as numbers, e.g. '103959', '6214e9')")
        try:
            specs.append(QueueSpec(**item))
        except ValidationError as exc:
            raise QueueConfigError(_format_validation(exc, label)) from None
        except TypeError as exc:
            raise QueueConfigError(f"{label}: {exc}") from None
    return QueueTree(specs, source)


def load_queues_yaml(path: str | Path) -> QueueTree:
    """Read a queue file (see the module docstring): a mapping with a ``queues:`` list.

    Raises:
        QueueConfigError: not YAML, no ``queues`` list, an unknown or invalid field, duplicate names, an
            unknown parent, a cycle, children's quotas above their parent's; the message names the file.
        OSError: the file cannot be read.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    doc = load_yaml(text, str(path), QueueConfigError)
    if isinstance(doc, dict):
        unknown_keys(doc, QueueFile, str(path), text, QueueConfigError)
        items = doc.get("queues")
    else:
        items = doc
    if not isinstance(items, list):
        raise QueueConfigError(f"{path}: expected a 'queues:' list of queue definitions")
    return queues_from_dicts(items, str(path))
