"""Right-sizing: the GPU slice that serves a service's load at the least GPU cost, without flapping. No I/O.

A replica can be given GPU three ways (:class:`SliceOption`):

* ``mig``: a MIG profile of the catalog (:mod:`gpupool.catalog`). ``memory_mib`` is the memory the device
  reports for the profile (NVML ``memorySizeMB``: 16384 MiB for the H200's ``1g.18gb``, 9984 for the H100's
  ``1g.10gb``), never the size in its name (dcgm-exporter #544: 10 x 1024 would promise 256 MiB the device
  does not have); a profile the catalog has no device figure for is not offered. ``compute_fraction`` is
  the instance's SMs over the whole GPU's SMs where measured (H200: 16/132 for ``1g.18gb``), else
  ``compute_slices / 7``.
* ``timeslice``: a time-sliced share (1/4, 1/2 of a GPU, :data:`TIMESLICE_FRACTIONS`) with a memory cap of
  ``fraction x memory``. The NVIDIA device plugin's time-slicing neither isolates memory nor enforces the
  cap; the serving engine must keep to it (e.g. vLLM ``--gpu-memory-utilization``). ``compute_fraction`` is
  the fraction itself, an upper bound: time-slicing adds context-switch overhead.
* ``whole``: 1, 2, 4 or 8 whole GPUs per replica (:data:`WHOLE_COUNTS`).

**GPU cost convention** (``gpu_fraction``, GPUs per replica): a whole GPU costs its count; a time slice its
fraction; a MIG profile ``max(compute_slices / 7, memory_slices / 8)``: the share of the GPU's binding
resource it takes, since a MIG GPU has 7 compute slices and 8 memory slices and a profile holds both.
``compute_slices / 7`` alone (the usual convention) is right for most profiles but undercharges the
memory-heavy ones: ``1g.35gb`` takes 1 of 7 compute slices but 2 of 8 memory slices, and a GPU holds only
4 of them (``max_instances`` = 4), so it really blocks 1/4 of the GPU, not 1/7. With the max, every
profile's cost times its ``max_instances`` is <= 1 and the 1g.18gb / 2g / 3g / 4g / 7g costs are the
familiar 1/7, 2/7, 1/2 (3g: 4 of 8 memory slices, 2 per GPU), 4/7, 1.

:class:`RightSizer` picks, for a demand and a per-option capacity table, the option with the least total
cost ``replicas x gpu_fraction`` among those whose memory fits, and keeps its choice unless another is
cheaper by more than ``hysteresis`` and the current one has been held for ``min_dwell_s`` (or no longer
fits: then it switches at once).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Literal

from gpupool.catalog import get_model

__all__ = [
    "MAX_REPLICAS", "TIMESLICE_FRACTIONS", "WHOLE_COUNTS", "RightSizer", "SliceChoice", "SliceOption",
    "slice_catalog",
]

#: Time-sliced shares offered per GPU (fraction of one GPU).
TIMESLICE_FRACTIONS = (0.25, 0.5)
#: Whole-GPU counts offered per replica.
WHOLE_COUNTS = (1, 2, 4, 8)
#: Most replicas a choice may have: a demand needing more on an option (a near-zero capacity) leaves it out.
MAX_REPLICAS = 1_000_000
_MIG_COMPUTE_SLICES = 7
_MIG_MEMORY_SLICES = 8


@dataclass(frozen=True)
class SliceOption:
    """One way to give a replica GPU.

    ``kind``: ``mig`` | ``timeslice`` | ``whole``; ``name``: ``"3g.71gb"``, ``"timeslice-0.5"``,
    ``"1xH200"``; ``gpu_fraction``: GPU cost per replica in GPUs (module docstring); ``memory_mib``: usable
    memory (MiB); ``compute_fraction``: share of one GPU's SMs / throughput (may exceed 1 for whole >= 2).
    """

    kind: Literal["mig", "timeslice", "whole"]
    name: str
    gpu_fraction: float
    memory_mib: int
    compute_fraction: float


def slice_catalog(gpu_model: str) -> tuple[SliceOption, ...]:
    """The slice options of ``gpu_model`` (a catalog key or alias, e.g. ``"H200"``), cheapest kinds first:
    MIG profiles (catalog order), time slices, whole GPUs.

    Raises ValueError for a model the catalog does not know (no memory figure to size with).
    """
    m = get_model(gpu_model)
    if not m.known or m.memory_mib <= 0:
        raise ValueError(f"GPU model {gpu_model!r} is not in the catalog: no memory figure to right-size with")
    out: list[SliceOption] = []
    full_sms = max((p.sm_count for p in m.mig_profiles), default=0)
    for p in m.mig_profiles:
        cost = max(p.compute_slices / _MIG_COMPUTE_SLICES, (p.memory_slices or 0) / _MIG_MEMORY_SLICES)
        compute = p.sm_count / full_sms if p.sm_count and full_sms else p.compute_slices / _MIG_COMPUTE_SLICES
        if p.usable_memory_mib <= 0:
            continue  # what the device gives is not known: never sized from the name (dcgm-exporter #544)
        out.append(SliceOption("mig", p.name, cost, p.usable_memory_mib, compute))
    for f in TIMESLICE_FRACTIONS:
        out.append(SliceOption("timeslice", f"timeslice-{f:g}", f, int(f * m.memory_mib), f))
    for n in WHOLE_COUNTS:
        out.append(SliceOption("whole", f"{n}x{m.name}", float(n), n * m.memory_mib, float(n)))
    return tuple(out)


@dataclass(frozen=True)
class SliceChoice:
    """A right-sizing decision: ``option`` x ``replicas`` at ``gpu_cost`` GPUs (= replicas x gpu_fraction)."""

    option: SliceOption
    replicas: int
    gpu_cost: float
    reason: str


class RightSizer:
    """Chooses a :class:`SliceOption` per service as load changes, with hysteresis and a minimum dwell.

    ``options``: the candidates (e.g. :func:`slice_catalog`); ``hysteresis``: a new option must be cheaper
    than the current one by more than this fraction of the current cost (0.2 = 20 %); ``min_dwell_s``: the
    current option is kept at least this long (s) after it was chosen, unless it no longer fits.
    Raises ValueError on an empty option list, duplicate names, hysteresis outside [0, 1) or negative dwell.
    """

    def __init__(self, options: Sequence[SliceOption], hysteresis: float = 0.2, min_dwell_s: float = 600.0) -> None:
        if not options:
            raise ValueError("RightSizer needs at least one slice option")
        names = [o.name for o in options]
        if len(set(names)) != len(names):
            raise ValueError(f"slice option names must be unique: {names}")
        if not 0 <= hysteresis < 1:
            raise ValueError(f"hysteresis must be within [0, 1), got {hysteresis!r}")
        if not (isinstance(min_dwell_s, Real) and min_dwell_s >= 0):  # NaN would never let it switch
            raise ValueError(f"min_dwell_s must be >= 0, got {min_dwell_s!r}")
        self.options = tuple(options)
        self.hysteresis = hysteresis
        self.min_dwell_s = min_dwell_s
        self.current: SliceOption | None = None
        self.since_s: float = 0.0

    def _sized(self, o: SliceOption, demand: float, cap: float, min_replicas: int) -> tuple[int, float] | None:
        """(replicas, GPU cost) on ``o``; None when the replica count is past :data:`MAX_REPLICAS`."""
        q = demand / cap
        if not q <= MAX_REPLICAS:
            return None
        # a relative slack absorbs the division's rounding (10.000000000000002 -> 10); any demand > 0 needs a
        # replica (an absolute slack turned 1 / 1e9 into 0 replicas)
        n = max(min_replicas, math.ceil(q * (1 - 1e-9)), 1 if demand > 0 else 0)
        return n, n * o.gpu_fraction

    def choose(self, now_s: float, demand: float, capacity_per_replica: Mapping[str, float],
               memory_need_mib: int, min_replicas: int = 1) -> SliceChoice:
        """The option for ``demand`` (load, same unit as the capacities, e.g. requests/s or tokens/s at the
        SLO) at time ``now_s`` (s).

        ``capacity_per_replica``: option name -> what one replica on it serves within the SLO (options
        missing, <= 0 or not a finite number are not candidates); ``memory_need_mib``: memory one replica needs
        (MiB; options with less ``memory_mib`` are excluded); an option needing more than :data:`MAX_REPLICAS`
        replicas is not a candidate; replicas = ``max(min_replicas, ceil(demand / capacity))``.
        Picks the least ``replicas x gpu_fraction`` (ties: fewer replicas, then catalog order); keeps the
        current option unless that is cheaper by more than ``hysteresis`` x current cost and ``min_dwell_s``
        has passed since the current one was chosen. Raises ValueError, with the reason, when no option fits,
        or ``demand`` / ``memory_need_mib`` is negative or not finite, or ``min_replicas`` is negative.
        """
        if isinstance(demand, bool) or not isinstance(demand, Real) or not 0 <= demand < math.inf:
            raise ValueError(f"demand must be a finite number >= 0, got {demand!r}")
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, Integral) or min_replicas < 0:
            raise ValueError(f"min_replicas must be an integer >= 0, got {min_replicas!r}")
        if isinstance(memory_need_mib, bool) or not isinstance(memory_need_mib, Real) \
                or not 0 <= memory_need_mib < math.inf:
            raise ValueError(f"memory_need_mib must be a finite number >= 0, got {memory_need_mib!r}")
        feasible: list[tuple[float, int, int, SliceOption]] = []
        too_many: list[str] = []
        for i, o in enumerate(self.options):
            cap = capacity_per_replica.get(o.name)
            # a capacity that is not a positive finite number (None, NaN, +-Inf, text) makes no candidate
            if o.memory_mib < memory_need_mib or isinstance(cap, bool) or not isinstance(cap, Real) \
                    or not 0 < cap < math.inf:
                continue
            sized = self._sized(o, demand, float(cap), min_replicas)
            if sized is None:
                too_many.append(o.name)
                continue
            feasible.append((sized[1], sized[0], i, o))
        if not feasible:
            mem_ok = [o.name for o in self.options if o.memory_mib >= memory_need_mib]
            if not mem_ok:
                biggest = max(o.memory_mib for o in self.options)
                raise ValueError(f"no slice option has {memory_need_mib} MiB (largest: {biggest} MiB)")
            if too_many:
                raise ValueError(f"demand {demand:g} needs more than {MAX_REPLICAS} replicas on every option with "
                                 f"enough memory and a capacity: {too_many}")
            raise ValueError(f"no capacity given (a finite number > 0) for the options with enough memory: {mem_ok}")
        feasible.sort(key=lambda x: (x[0], x[1], x[2]))
        best_cost, best_n, _, best = feasible[0]
        cur = next((f for f in feasible if self.current is not None and f[3].name == self.current.name), None)
        if cur is None:
            why = ("first choice" if self.current is None
                   else f"{self.current.name} no longer fits ({memory_need_mib} MiB needed or no capacity)")
            self.current, self.since_s = best, now_s
            return SliceChoice(best, best_n, best_cost,
                               f"{why}: {best.name} x{best_n} = {best_cost:.3g} GPU, the least cost")
        cur_cost, cur_n, _, cur_opt = cur
        if best is cur_opt:
            return SliceChoice(cur_opt, cur_n, cur_cost, f"{cur_opt.name} x{cur_n} = {cur_cost:.3g} GPU is the "
                                                          f"least cost")
        cheaper = best_cost < cur_cost * (1 - self.hysteresis)
        dwelt = now_s - self.since_s >= self.min_dwell_s
        # no dearer and more capacity (two half-GPU slices -> one whole GPU for the same cost): switch now,
        # the headroom is free (issue 30: an idle minimum left on a slice saturated when traffic returned)
        roomier = best_cost <= cur_cost + 1e-9 and \
            best_n * float(capacity_per_replica[best.name]) > cur_n * float(capacity_per_replica[cur_opt.name]) * 1.2
        if roomier:
            old = cur_opt.name
            self.current, self.since_s = best, now_s
            return SliceChoice(best, best_n, best_cost,
                               f"switch {old} x{cur_n} ({cur_cost:.3g} GPU) -> {best.name} x{best_n} = "
                               f"{best_cost:.3g} GPU: no dearer, more capacity")
        if cheaper and dwelt:
            old = cur_opt.name
            self.current, self.since_s = best, now_s
            return SliceChoice(best, best_n, best_cost,
                               f"switch {old} ({cur_cost:.3g} GPU) -> {best.name} x{best_n} = {best_cost:.3g} GPU: "
                               f"cheaper by more than {self.hysteresis:.0%}")
        why = (f"{best.name} ({best_cost:.3g} GPU) is not cheaper by more than {self.hysteresis:.0%}" if not cheaper
               else f"{best.name} ({best_cost:.3g} GPU) is cheaper but {cur_opt.name} was chosen "
                    f"{now_s - self.since_s:g}s ago < min dwell {self.min_dwell_s:g}s")
        return SliceChoice(cur_opt, cur_n, cur_cost, f"keep {cur_opt.name} x{cur_n} = {cur_cost:.3g} GPU: {why}")
