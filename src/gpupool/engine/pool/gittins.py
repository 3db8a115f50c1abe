"""Job order from expected remaining service: the Gittins index within Tiresias' LAS levels (Tiresias-G).

Source: Gu et al., "Tiresias: A GPU Cluster Manager for Distributed Deep Learning", USENIX NSDI 2019,
Sec. 4.2 ("Discretized 2D-Gittins index"), and its simulator (``SymbioticLab/Tiresias``,
``simulator/run_sim.py``: ``cal_r_gittins_index``, ``dlas_sim_jobs``). A job's *size* ``S`` is its total
service in GPU-seconds (GPUs x seconds: the "2D" size). For a job that has attained ``a`` GPU-seconds and a
service quantum ``delta``, the Gittins index is

    G(a, delta) = P(S - a <= delta | S > a) / E[min(S - a, delta) | S > a]

the chance of finishing within the next quantum per GPU-second spent on the way. A higher index runs
first. With the empirical distribution of ``n`` sizes ``s_1 <= ... <= s_n``, ``i`` = #{s <= a},
``j`` = #{s <= a + delta}: ``P = (j - i) / (n - i)`` and ``E = (sum_{i<k<=j} (s_k - a) + (n - j) delta) /
(n - i)``; a job beyond every known size (``n - i = 0``) gets index 0, as in the Tiresias simulator.

:class:`SizeModel` learns the distribution *online*: every finished job adds its attained service (per
queue; a queue uses its own sizes once it has ``min_samples`` of them, the pooled sizes otherwise), on
top of an optional prior (sizes from elsewhere, e.g. an earlier window of the trace). The tables are
rebuilt when enough new sizes arrived (``refresh_every`` or 10 % more, whichever is larger), so an index
is a step function of time; :attr:`SizeModel.version` tells the scheduler when to re-sort its queues.

:class:`GittinsOrder` is :class:`~gpupool.engine.pool.ordering.TiresiasOrder` (same levels, demotion,
promotion, same preemption across levels) with jobs *within* a level ordered by a score from the model:
``"gittins"`` (the index above, highest first) or ``"remaining"`` (shortest expected remaining service
``E[S - a | S > a]`` first). Without any size yet every job scores the same, which leaves the order FIFO
within a level: Tiresias-L exactly.

No I/O here: a prior file is read by the driver (:func:`gpupool.engine.pool.gittins.parse_sizes` is a pure
parser of its text).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Hashable, Iterable, Sequence

import numpy as np

from gpupool.engine.pool.ordering import DEFAULT_THRESHOLDS, SIZE_ORDERS, TiresiasOrder

__all__ = ["DEFAULT_DELTA", "GittinsOrder", "SizeModel", "SizeTable", "parse_sizes"]

DEFAULT_DELTA = 3250.0
"""Service quantum of the index, GPU-seconds: the Tiresias simulator's static ``gittins_delta``."""


class SizeTable:
    """Empirical distribution of job sizes (GPU-seconds) with the Gittins index and expected remaining
    service at any attained service.

    ``sizes``: any iterable of positive floats (GPU-seconds); ValueError if one is negative or not finite.
    """

    __slots__ = ("n", "s", "cum")

    def __init__(self, sizes: Iterable[float]) -> None:
        s = np.sort(np.asarray(list(sizes), dtype=np.float64))
        if s.size and (not np.all(np.isfinite(s)) or s[0] < 0):
            raise ValueError("job sizes must be finite and >= 0 GPU-seconds")
        self.s = s
        self.n = int(s.size)
        self.cum = np.concatenate(([0.0], np.cumsum(s)))  # (n + 1,) prefix sums

    def gittins(self, attained: float, delta: float = DEFAULT_DELTA) -> float:
        """``G(a, delta)`` (per GPU-second) of a job that attained ``attained`` GPU-seconds; 0.0 beyond the
        largest size or for an empty table. ValueError for ``delta <= 0``."""
        if delta <= 0:
            raise ValueError(f"delta must be > 0, got {delta}")
        i = int(np.searchsorted(self.s, attained, side="right"))
        left = self.n - i
        if left <= 0:
            return 0.0
        j = int(np.searchsorted(self.s, attained + delta, side="right"))
        p = (j - i) / left
        e = (self.cum[j] - self.cum[i] - (j - i) * attained + (self.n - j) * delta) / left
        return p / e if e > 0 else math.inf

    def remaining(self, attained: float) -> float:
        """``E[S - a | S > a]`` in GPU-seconds (inf beyond the largest size or for an empty table)."""
        i = int(np.searchsorted(self.s, attained, side="right"))
        left = self.n - i
        if left <= 0:
            return math.inf
        return (self.cum[self.n] - self.cum[i]) / left - attained


class SizeModel:
    """Job sizes learned online, per queue with a pooled fallback (see the module docstring).

    ``prior``: sizes (GPU-seconds) known before the run, pooled; ``min_samples``: sizes a queue needs before
    its own table is used; ``refresh_every``: new sizes between rebuilds (at least; see the module
    docstring). ``version`` grows at every rebuild.
    """

    def __init__(self, prior: Sequence[float] = (), min_samples: int = 50, refresh_every: int = 20) -> None:
        if min_samples < 1 or refresh_every < 1:
            raise ValueError("min_samples and refresh_every must be >= 1")
        self.prior = [float(x) for x in prior]
        self.min_samples = min_samples
        self.refresh_every = refresh_every
        self.seen: dict[Hashable, list[float]] = {}
        self.n_seen = 0
        self._built_at = -1
        self.version = 0
        self.pooled = SizeTable(self.prior)
        self.tables: dict[Hashable, SizeTable] = {}

    def observe(self, group: Hashable, size: float, gpus: int | None = None) -> bool:
        """A job of ``group`` (a queue name) finished after ``size`` GPU-seconds of service; ``gpus``: its GPU
        count, if the model also learns per (queue, GPU count). True when the tables were rebuilt."""
        self.seen.setdefault(group, []).append(float(size))
        if gpus is not None:
            self.seen.setdefault((group, gpus), []).append(float(size))
        self.n_seen += 1
        grown = self.n_seen - max(self._built_at, 0)
        if self._built_at < 0 or grown >= max(self.refresh_every, 0.1 * self._built_at):
            self.rebuild()
            return True
        return False

    def rebuild(self) -> None:
        """Rebuild the pooled and per-queue tables from the prior and every size seen so far."""
        pooled: list[float] = list(self.prior)
        for g, sizes in self.seen.items():
            if not isinstance(g, tuple):
                pooled.extend(sizes)
        self.pooled = SizeTable(pooled)
        self.tables = {g: SizeTable(v) for g, v in self.seen.items() if len(v) >= self.min_samples}
        self._built_at = self.n_seen
        self.version += 1

    def table(self, group: Hashable, gpus: int | None = None) -> SizeTable:
        """The table for ``group``: that of (``group``, ``gpus``) once it has ``min_samples`` sizes (when
        ``gpus`` is given), else the queue's own once it has ``min_samples``, else the pooled one."""
        if gpus is not None:
            t = self.tables.get((group, gpus))
            if t is not None:
                return t
        return self.tables.get(group, self.pooled)


class GittinsOrder(TiresiasOrder):
    """Tiresias levels; within a level, jobs by a score of their expected remaining service.

    ``metric``: ``"gittins"`` (Tiresias-G) or ``"remaining"`` (shortest expected remaining service first);
    ``delta``: the index's quantum, GPU-seconds; ``model``: the :class:`SizeModel` (a fresh one with no
    prior by default). Other arguments as :class:`TiresiasOrder`. ValueError for an unknown metric or
    ``delta <= 0``.
    """

    name = "gittins"
    preemptive = True

    def __init__(self, thresholds: Sequence[float] = DEFAULT_THRESHOLDS, promote_knob: float | None = 8.0,
                 promote_min_s: float = 600.0, metric: str = "gittins", delta: float = DEFAULT_DELTA,
                 model: SizeModel | None = None) -> None:
        super().__init__(thresholds, promote_knob, promote_min_s)
        if metric not in SIZE_ORDERS:
            raise ValueError(f"unknown metric {metric!r} (known: {', '.join(SIZE_ORDERS)})")
        if not delta > 0:
            raise ValueError(f"delta must be > 0 GPU-seconds, got {delta}")
        self.metric = metric
        self.name = metric
        self.delta = float(delta)
        self.model = model if model is not None else SizeModel()

    def score(self, group: Hashable, attained_gpu_s: float, gpus: int | None = None) -> float:
        """Sort score within a level (smaller runs first), in units of service: the inverse Gittins index
        ``1 / G(a, delta)`` (service spent per completion, as the Tiresias simulator's ``r_gi``) or the
        expected remaining service ``E[S - a | S > a]``, from the sizes of ``group`` (and ``gpus``, see
        :meth:`SizeModel.table`). A job of index 0 (beyond every known size, or no known size ends within
        its next quantum) and, for ``remaining``, one beyond every known size score ``max(attained, largest
        known size)``: it is expected to run at least as long again, after every job of positive index.
        Every job scores 0.0 while nothing is known."""
        table = self.model.table(group, gpus)
        if not table.n:
            return 0.0
        if self.metric == "gittins":
            g = table.gittins(attained_gpu_s, self.delta)
            return 1.0 / g if g > 0 else max(attained_gpu_s, float(table.s[-1]))
        r = table.remaining(attained_gpu_s)
        return r if math.isfinite(r) else max(attained_gpu_s, float(table.s[-1]))


def _number(field: str) -> float | None:
    try:
        return float(field)
    except ValueError:
        return None


def parse_sizes(text: str, source: str = "<prior>") -> list[float]:
    """Job sizes (GPU-seconds) from a prior file's text: one number per line, or CSV with a ``size_gpu_s``
    column, or CSV with a ``gpu_time`` column (GPU-seconds: a Philly trace file as it is), or CSV with
    ``duration`` (seconds, >= 0) and ``num_gpu`` / ``num_gpus`` / ``gpus`` (> 0) columns (size = duration x
    GPUs). Fields are read with the ``csv`` module (quoting as RFC 4180, per line); a leading UTF-8 BOM, blank
    lines and ``#`` comments are skipped. A first line of numbers only is data (so ``inf`` gets the "finite"
    error), anything else is a header. ValueError naming ``source``, the line and, in a CSV,
    the column for anything else (a non-number, a header-less line with more than one field, a missing
    field, a size that is negative or not finite, a duration < 0, a GPU count <= 0)."""
    text = text.removeprefix("\ufeff")
    rows: list[tuple[int, str, list[str]]] = []
    for k, ln in enumerate(text.splitlines(), 1):
        s = ln.strip()
        if s and not s.startswith("#"):
            rows.append((k, s, [f.strip() for f in next(csv.reader([s]))]))
    if not rows:
        raise ValueError(f"{source}: no job sizes")
    k0, _, head = rows[0]
    size_col: int
    gpu_col: int | None = None
    if any(_number(f) is None for f in head):
        header = [h.lower() for h in head]
        gpu_name = next((h for h in ("num_gpu", "num_gpus", "gpus") if h in header), None)
        if "size_gpu_s" in header:
            size_col = header.index("size_gpu_s")
        elif "gpu_time" in header:  # a Philly trace (timestamp,duration,num_gpus,gpu_time,cluster): GPU-seconds
            size_col = header.index("gpu_time")
        elif "duration" in header and gpu_name is not None:
            size_col = header.index("duration")
            gpu_col = header.index(gpu_name)
        else:
            raise ValueError(f"{source}:{k0}: header needs size_gpu_s, gpu_time, or duration and num_gpu")
        rows = rows[1:]
    else:
        size_col, header = 0, []
    out: list[float] = []
    for k, ln, fields in rows:
        if not header and len(fields) != 1:
            raise ValueError(f"{source}:{k}: without a header, one job size per line; got {len(fields)} "
                             f"fields: {ln[:60]!r}")
        try:
            v = float(fields[size_col])
            g = float(fields[gpu_col]) if gpu_col is not None else None
        except (ValueError, IndexError):
            raise ValueError(f"{source}:{k}: not a job size: {ln[:60]!r}") from None
        if g is not None:
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{source}:{k}: column {header[size_col]!r}: duration must be finite and >= 0, "
                                 f"got {fields[size_col]}")
            if not (math.isfinite(g) and g > 0):
                raise ValueError(f"{source}:{k}: column {header[gpu_col]!r}: GPU count must be finite and > 0, "
                                 f"got {fields[gpu_col]}")
            v *= g
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{source}:{k}: job size must be finite and >= 0, got {v}")
        out.append(v)
    if not out:
        raise ValueError(f"{source}: no job sizes")
    return out
