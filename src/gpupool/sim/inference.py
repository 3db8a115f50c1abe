"""Inference simulator: an LLM service on GPU replicas under a request trace, scaled by a policy.

A discrete-event core (``heapq``) with no per-token events. The pieces:

* **Arrivals** (:func:`trace_arrivals`, :func:`synthetic_arrivals`): the Azure LLM conversation trace
  (timestamps, prompt and output tokens) time-warped onto a day-long rate envelope (diurnal cosine plus
  bursts, :class:`Envelope`), or a non-homogeneous Poisson process on the same envelope with token counts
  resampled from the trace. Deterministic given the seed.
* **Replicas** (:class:`SliceThroughput` from the throughput table, ``gpupool/data/inference_throughput.yaml``):
  vLLM-style continuous batching. A replica admits requests FIFO while the batch is below ``max_num_seqs``
  and the KV cache has room for the request's prompt + output tokens (reserved at admission: vLLM allocates
  pages as tokens are generated and preempts on overflow; reserving up front is the conservative
  equivalent). A prefill runs alone at ``prefill_tokens_per_s`` (decoding pauses, as vLLM without chunked
  prefill); it ends with the first token (TTFT). A decode batch of ``b`` sequences advances every sequence
  one token per ``decode_step_s + b * decode_step_s_per_seq``: between two events the batch is constant,
  so a per-replica "virtual token clock" gives each completion time exactly (fluid model, no per-token
  events). Replicas start ``startup_s`` after they are created (pod start + model load) and are charged
  GPU time from creation; a removed replica stops taking requests and is charged until it has drained.
  Crashes (optional): exponential times with ``crash_mtbf_h`` per replica; its requests are retried on
  the others (their latency counts from the original arrival); the container restarts (start-up again).
* **Router**: each request goes to the ready replica with the fewest outstanding requests per unit of
  capacity (least-request load balancing, as an inference gateway does); with none ready it waits at the
  service (Knative activator / KEDA interceptor) until one is.
* **Metrics** scraped every ``scrape_s`` and seen by the policy ``lag_s`` later (Prometheus scrape +
  adapter): ``concurrency`` (time-average of requests in flight, queued ones included), ``queue_depth``
  (requests waiting for admission, vLLM ``num_requests_waiting``), ``rps``, ``latency_p95_s`` /
  ``latency_p99_s`` (end-to-end, of the window's completions), ``gpu_util`` (``DCGM_FI_DEV_GPU_UTIL`` on a
  whole GPU, ``100 x DCGM_FI_PROF_GR_ENGINE_ACTIVE`` on a MIG instance, as the GpuAutoscaler controller reads
  them (dcgm-exporter #216: the former reads 0 on MIG): share of the window a kernel ran on the replica's
  GPU or instance, i.e. the replica was prefilling or decoding, whatever the batch size),
  ``cpu_util`` (see :class:`CpuModel`).
* **Elastic lending** (:class:`LendingSpec`): whole GPUs of the service's pool that no replica uses for
  ``lend_after_s`` are lent to elastic training jobs; when the service needs them back, each is
  reclaimed after the job's checkpoint (``checkpoint_s`` drawn uniformly, cut at ``grace_s``: the job is
  killed at the grace period and loses the work since its last checkpoint). The replica's start-up begins
  after the reclaim; the reclaim latency is reported.

Policies (:mod:`gpupool.sim.inference_policies`) are drivers of the engine's
:class:`~gpupool.engine.autoscale.Recommender` (and :class:`~gpupool.engine.rightsize.RightSizer`).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpupool.inputs import load_yaml, unknown_keys
from gpupool.model import GpupoolError

from .inference_schema import ThroughputKeys

__all__ = [
    "DAY_S",
    "Burst",
    "CpuModel",
    "Envelope",
    "InferenceConfigError",
    "LendingSpec",
    "PolicyDecision",
    "PolicyResult",
    "ReplicaSpec",
    "ServedModel",
    "SimState",
    "SliceThroughput",
    "ThroughputTable",
    "Workload",
    "load_throughput_table",
    "percentiles",
    "simulate",
    "synthetic_arrivals",
    "trace_arrivals",
]

DAY_S = 86_400.0
EMBEDDED_THROUGHPUT = "inference_throughput.yaml"


class InferenceConfigError(GpupoolError, ValueError):
    """A bad throughput table or scenario value; the message names the file and field."""


# --------------------------------------------------------------------------------------------------
# Throughput table


@dataclass(frozen=True)
class ServedModel:
    """The model served: weights (MiB), fixed overhead (MiB), KV cache bytes per token, batch cap."""

    name: str
    weights_mib: float
    overhead_mib: float
    kv_bytes_per_token: float
    min_kv_tokens: int
    max_num_seqs: int

    @property
    def memory_need_mib(self) -> int:
        """Least memory (MiB) a replica needs: weights + overhead + ``min_kv_tokens`` of KV cache."""
        kv_mib = self.min_kv_tokens * self.kv_bytes_per_token / 2**20
        return int(math.ceil(self.weights_mib + self.overhead_mib + kv_mib))


@dataclass(frozen=True)
class SliceThroughput:
    """Throughput of the served model on one slice (one row of the table).

    ``gpu_fraction``: GPU cost per replica (GPUs); ``prefill_tps``: prompt tokens/s; ``step_s``: decode
    iteration at batch 1 (s); ``step_per_seq_s``: extra seconds per sequence in the batch; ``memory_mib``:
    memory the replica may use (MiB).
    """

    name: str
    kind: str
    gpu_fraction: float
    prefill_tps: float
    step_s: float
    step_per_seq_s: float
    memory_mib: float

    def kv_tokens(self, model: ServedModel) -> int:
        """KV-cache capacity in tokens (0 when the weights do not fit)."""
        free = self.memory_mib - model.weights_mib - model.overhead_mib
        return max(0, int(free * 2**20 // model.kv_bytes_per_token))

    def step(self, batch: int) -> float:
        """Seconds per decode iteration at batch ``batch``."""
        return self.step_s + self.step_per_seq_s * batch


@dataclass(frozen=True)
class ThroughputTable:
    model: ServedModel
    gpu_model: str
    slices: dict[str, SliceThroughput]
    source: str

    def fits(self, name: str) -> bool:
        """Whether slice ``name`` holds the weights, the overhead and ``min_kv_tokens`` of KV cache."""
        return self.slices[name].memory_mib >= self.model.memory_need_mib

    def whole(self) -> SliceThroughput:
        """The whole-GPU row (kind ``whole``); raises InferenceConfigError when the table has none."""
        for s in self.slices.values():
            if s.kind == "whole":
                return s
        raise InferenceConfigError(f"{self.source}: no whole-GPU slice for {self.gpu_model}")


def _need(d: Mapping[str, Any], key: str, where: str, *, positive: bool = True) -> float:
    if key not in d:
        raise InferenceConfigError(f"{where}.{key}: missing")
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise InferenceConfigError(f"{where}.{key}: a number expected, got {v!r}")
    if not math.isfinite(v) or (positive and v <= 0) or v < 0:
        raise InferenceConfigError(f"{where}.{key}: expected a {'positive' if positive else 'non-negative'} "
                                   f"number, got {v!r}")
    return float(v)


def load_throughput_table(path: str | Path | None = None, gpu_model: str = "H200") -> ThroughputTable:
    """Read a throughput table (YAML, the shape of ``gpupool/data/inference_throughput.yaml``; None: that
    embedded file) for ``gpu_model``. Raises InferenceConfigError naming the file and the field."""
    if path is None:
        text = resources.files("gpupool.data").joinpath(EMBEDDED_THROUGHPUT).read_text(encoding="utf-8")
        source = f"embedded:{EMBEDDED_THROUGHPUT}"
    else:
        source = Path(path).name
        try:
            text = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InferenceConfigError(f"{source}: not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    doc = load_yaml(text, source, InferenceConfigError)
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict) or not isinstance(doc.get("gpus"), dict):
        raise InferenceConfigError(f"{source}: expected a mapping with 'model' and 'gpus'")
    unknown_keys(doc, ThroughputKeys, source, text, InferenceConfigError)
    m = doc["model"]
    where = f"{source}: model"
    model = ServedModel(
        name=str(m.get("name", "model")),
        weights_mib=_need(m, "weights_mib", where),
        overhead_mib=_need(m, "overhead_mib", where, positive=False),
        kv_bytes_per_token=_need(m, "kv_bytes_per_token", where),
        min_kv_tokens=int(_need(m, "min_kv_tokens", where)),
        max_num_seqs=int(_need(m, "max_num_seqs", where)),
    )
    gpus = doc["gpus"]
    if gpu_model not in gpus:
        raise InferenceConfigError(f"{source}: no throughput for GPU model {gpu_model!r} "
                                   f"(the table has: {', '.join(map(str, gpus)) or 'none'})")
    g = gpus[gpu_model]
    if not isinstance(g, dict) or not isinstance(g.get("slices"), dict) or not g["slices"]:
        raise InferenceConfigError(f"{source}: gpus.{gpu_model}.slices: a non-empty mapping expected")
    slices: dict[str, SliceThroughput] = {}
    for name, row in g["slices"].items():
        w = f"{source}: gpus.{gpu_model}.slices.{name}"
        if not isinstance(row, dict):
            raise InferenceConfigError(f"{w}: a mapping expected")
        kind = row.get("kind")
        if kind not in ("whole", "mig", "timeslice"):
            raise InferenceConfigError(f"{w}.kind: 'whole', 'mig' or 'timeslice', got {kind!r}")
        frac = _need(row, "gpu_fraction", w)
        if frac > 8:
            raise InferenceConfigError(f"{w}.gpu_fraction: at most 8 GPUs, got {frac}")
        slices[str(name)] = SliceThroughput(
            name=str(name), kind=kind, gpu_fraction=frac,
            prefill_tps=_need(row, "prefill_tokens_per_s", w),
            step_s=_need(row, "decode_step_ms", w) / 1000.0,
            step_per_seq_s=_need(row, "decode_step_ms_per_seq", w, positive=False) / 1000.0,
            memory_mib=_need(row, "memory_mib", w),
        )
    return ThroughputTable(model, gpu_model, slices, source)


# --------------------------------------------------------------------------------------------------
# Arrivals


@dataclass(frozen=True)
class Burst:
    """A burst: the rate is multiplied by ``factor`` from ``start_s`` for ``duration_s`` seconds, with
    linear ramps of ``ramp_s`` at both ends."""

    start_s: float
    duration_s: float
    factor: float
    ramp_s: float = 60.0


@dataclass(frozen=True)
class Envelope:
    """Request rate over time (requests/s): a diurnal cosine from ``trough_rps`` (at ``peak_hour`` - 12 h)
    to ``peak_rps`` (at ``peak_hour``), times the bursts."""

    trough_rps: float
    peak_rps: float
    peak_hour: float = 14.0
    bursts: tuple[Burst, ...] = ()

    def rate(self, t_s: np.ndarray) -> np.ndarray:
        """(n,) requests/s at times ``t_s`` (s from midnight)."""
        t = np.asarray(t_s, dtype=np.float64)
        phase = 2 * np.pi * (t - self.peak_hour * 3600.0) / DAY_S
        r = self.trough_rps + (self.peak_rps - self.trough_rps) * (1 + np.cos(phase)) / 2
        for b in self.bursts:
            ramp = max(b.ramp_s, 1e-9)
            up = np.clip((t - b.start_s) / ramp, 0, 1)
            down = np.clip((b.start_s + b.duration_s - t) / ramp, 0, 1)
            r = r * (1 + (b.factor - 1) * np.minimum(up, down))
        return r

    def peak(self, duration_s: float) -> float:
        """The highest rate within ``[0, duration_s]`` (requests/s), on a 10 s grid."""
        return float(self.rate(np.arange(0.0, duration_s + 10.0, 10.0)).max())


@dataclass(frozen=True)
class Workload:
    """Requests of a run: (n,) float64 ``arrival_s`` (sorted), (n,) int64 ``prompt_tokens`` and
    ``output_tokens``; ``duration_s``; ``source`` says where they come from."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    duration_s: float
    source: str
    envelope: Envelope | None = None

    def __len__(self) -> int:
        return int(self.arrival_s.shape[0])


#: Longest simulated span (s): 31 days. The arrival grid has one point per second (a longer span is memory,
#: not results).
MAX_DURATION_S = 31 * 24 * 3600.0
#: Most requests one simulated span may hold (the workload's arrays and the event loop scale with it).
MAX_REQUESTS = 20_000_000


def _cumulative(env: Envelope, duration_s: float, dt: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Grid (s) and cumulative expected requests of ``env`` over ``[0, duration_s]``. Raises
    InferenceConfigError past :data:`MAX_DURATION_S` or :data:`MAX_REQUESTS`."""
    if not 0 < duration_s <= MAX_DURATION_S:
        raise InferenceConfigError(f"the simulated span is {duration_s / 3600:g} h; at most "
                                   f"{MAX_DURATION_S / 3600:g} h (durationHours, --hours)")
    grid = np.arange(0.0, duration_s + dt, dt)
    rate = env.rate(grid)
    cum = np.concatenate([[0.0], np.cumsum((rate[1:] + rate[:-1]) / 2 * dt)])
    if not cum[-1] <= MAX_REQUESTS:
        raise InferenceConfigError(f"the workload envelope gives {cum[-1]:,.0f} requests over {duration_s / 3600:g} h, "
                                   f"more than the simulator's {MAX_REQUESTS:,} (lower peakRps / troughRps / bursts "
                                   f"or the duration)")
    return grid, cum


def trace_arrivals(time_s: np.ndarray, prompt: np.ndarray, output: np.ndarray, env: Envelope,
                   duration_s: float, seed: int, source: str) -> Workload:
    """The trace's requests, repeated and time-warped onto ``env`` over ``[0, duration_s)``.

    The trace (``time_s`` seconds from its first request, sorted) is read from a seed-chosen start row,
    wrapping around (one mean gap between copies), so its own inter-arrival pattern and token sizes are
    kept; request ``k`` at trace time ``u_k`` arrives at ``Lambda^-1(u_k * r)`` where ``r`` is the trace's
    mean rate and ``Lambda`` the envelope's cumulative rate: the local rate follows ``env`` and the
    expected count is ``Lambda(duration_s)``. Raises InferenceConfigError on an empty trace.
    """
    n = len(time_s)
    if n < 2:
        raise InferenceConfigError(f"{source}: the trace needs at least 2 requests, it has {n}")
    rng = np.random.default_rng(seed)
    gaps = np.diff(time_s)
    mean_gap = float(time_s[-1] - time_s[0]) / (n - 1)
    if mean_gap <= 0:
        raise InferenceConfigError(f"{source}: the trace's requests all have the same timestamp")
    gaps = np.concatenate([gaps, [mean_gap]])  # gap after the last row, back to the first
    grid, cum = _cumulative(env, duration_s)
    total = cum[-1]
    want = int(total * 1.05) + 10
    start = int(rng.integers(n))
    idx = (start + np.arange(want)) % n
    u = np.concatenate([[0.0], np.cumsum(gaps[idx][:-1])]) / mean_gap  # in units of mean gaps (= requests)
    keep = u < total
    u, idx = u[keep], idx[keep]
    t = np.interp(u, cum, grid)
    return Workload(t, prompt[idx].astype(np.int64), output[idx].astype(np.int64), duration_s,
                    f"{source}, time-warped onto the envelope (start row {start}, seed {seed})", env)


def synthetic_arrivals(env: Envelope, duration_s: float, seed: int, prompt: np.ndarray,
                       output: np.ndarray, source: str = "synthetic") -> Workload:
    """A non-homogeneous Poisson process with rate ``env`` on ``[0, duration_s)``; token counts are
    drawn (with replacement, seeded) from the ``prompt``/``output`` pairs given (e.g. the trace's)."""
    rng = np.random.default_rng(seed)
    grid, cum = _cumulative(env, duration_s)
    count = int(rng.poisson(cum[-1]))
    u = np.sort(rng.uniform(0.0, cum[-1], size=count))
    t = np.interp(u, cum, grid)
    pick = rng.integers(len(prompt), size=count)
    return Workload(t, prompt[pick].astype(np.int64), output[pick].astype(np.int64), duration_s,
                    f"{source} (Poisson on the envelope, seed {seed})", env)


# --------------------------------------------------------------------------------------------------
# Replicas, CPU model, lending


@dataclass(frozen=True)
class CpuModel:
    """CPU use of one inference server pod, for ``cpu_util`` (percent of ``request_cores``).

    cores = ``idle_cores`` + ``busy_cores`` x (share of time the GPU is working) + tokens/s x
    ``core_s_per_token``. The engine loop (vLLM's scheduler/API processes) keeps about one core busy
    while the GPU works, whatever the batch size: the GPU does the work, the CPU launches kernels and
    (de)tokenizes (~µs per token with a fast tokenizer). With the pod requesting ``request_cores`` (4, a
    common request for an inference pod that also serves HTTP and tokenizes), CPU utilisation tops out
    near (idle + busy)/request = 31 % while the GPU is saturated.
    """

    request_cores: float = 4.0
    idle_cores: float = 0.05
    busy_cores: float = 1.2
    core_s_per_token: float = 2e-6


@dataclass(frozen=True)
class ReplicaSpec:
    """Start-up delay (s, pod start + weights load), crash MTBF per replica (hours; None: no crashes)."""

    startup_s: float = 90.0
    crash_mtbf_h: float | None = None
    cpu: CpuModel = CpuModel()


@dataclass(frozen=True)
class LendingSpec:
    """Elastic lending of the service's idle GPUs (see the module docstring). ``pool_gpus``: GPUs set
    aside for the service; ``lend_after_s``: a GPU idle that long is lent; ``checkpoint_s``: (low, high)
    seconds an elastic job takes to checkpoint and release a GPU; ``grace_s``: the reclaim bound."""

    enabled: bool = True
    lend_after_s: float = 300.0
    checkpoint_s: tuple[float, float] = (10.0, 45.0)
    grace_s: float = 30.0


@dataclass(frozen=True)
class PolicyDecision:
    """What a policy wants: replicas per slice name (slices left out: 0), and why."""

    replicas: Mapping[str, int]
    reason: str = ""


class Policy(Protocol):
    name: str
    reconcile_s: float
    scrape_s: float

    def initial(self) -> Mapping[str, int]: ...

    def describe(self) -> str: ...

    def decide(self, now_s: float, state: SimState, samples: Mapping[str, float] | None) -> PolicyDecision: ...


class _Replica:
    __slots__ = ("rid", "sl", "state", "created", "ready_at", "waiting", "pf", "pf_end", "batch", "V",
                 "t_last", "kv_cap", "kv_used", "outstanding", "busy_since", "busy_acc", "version",
                 "inv_cap", "tokens", "busy_mark", "tokens_mark", "stopped_at")

    def __init__(self, rid: int, sl: SliceThroughput, now: float, ready_at: float, kv_cap: int,
                 inv_cap: float) -> None:
        self.rid = rid
        self.sl = sl
        self.state = 0  # 0 starting, 1 ready, 2 draining, 3 stopped
        self.created = now
        self.ready_at = ready_at
        self.waiting: deque[int] = deque()
        self.pf = -1
        self.pf_end = 0.0
        self.batch: list[tuple[float, int]] = []
        self.V = 0.0
        self.t_last = now
        self.kv_cap = kv_cap
        self.kv_used = 0
        self.outstanding = 0
        self.busy_since: float | None = None
        self.busy_acc = 0.0
        self.version = 0
        self.inv_cap = inv_cap
        self.tokens = 0
        self.busy_mark = 0.0
        self.tokens_mark = 0
        self.stopped_at = math.inf


@dataclass
class SimState:
    """What a policy may look at when it decides (read-only for policies)."""

    now_s: float = 0.0
    replicas: dict[str, int] = field(default_factory=dict)  # slice -> replicas starting or ready
    ready: dict[str, int] = field(default_factory=dict)  # slice -> ready replicas
    pool_gpus: float = math.inf


@dataclass
class PolicyResult:
    """Outcome of one policy on one workload. Latencies in seconds, GPU-hours in GPU x hours."""

    policy: str
    n_requests: int
    ttft_s: np.ndarray
    e2e_s: np.ndarray
    gpu_hours: float
    replica_changes: int
    slice_changes: int
    lent_gpu_hours: float
    reclaims: list[float]
    series: dict[str, list[float]]
    max_metric: dict[str, float]
    max_replicas: int
    min_replicas: int
    slices_used: dict[str, float]  # slice -> replica-hours
    crashes: int
    retried: int
    wall_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    unfinished: int = 0


# --------------------------------------------------------------------------------------------------
# The simulation


def simulate(workload: Workload, table: ThroughputTable, policy: Policy, *, slo_s: float,
             replica: ReplicaSpec = ReplicaSpec(), lending: LendingSpec = LendingSpec(enabled=False),
             pool_gpus: float = math.inf, lag_s: float = 15.0, seed: int = 42,
             capacity_weight: Mapping[str, float] | None = None,
             tick: Callable[[float], None] | None = None) -> PolicyResult:
    """Run ``policy`` on ``workload``; returns a :class:`PolicyResult`.

    ``slo_s``: end-to-end latency bound of a request (the plot's reference line; attainment is computed by
    the caller from ``e2e_s``). ``pool_gpus``: GPUs the service may use (replicas beyond are not started;
    the idle ones are lent when ``lending.enabled``). ``lag_s``: seconds between a scrape and the policy
    seeing it. ``capacity_weight``: slice -> relative capacity for the router (default: equal).
    ``tick(fraction)`` is called about every simulated hour. Raises InferenceConfigError when the policy
    asks for a slice the table does not have or that cannot hold the model.
    """
    import time as _time

    wall0 = _time.perf_counter()
    model = table.model
    max_seqs = model.max_num_seqs
    arr = workload.arrival_s
    prompt = workload.prompt_tokens
    out = workload.output_tokens
    n = len(workload)
    arr_l = arr.tolist()
    prompt_l = prompt.tolist()
    out_l = out.tolist()
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    ttft_l = [math.nan] * n
    e2e_l = [math.nan] * n
    rng = np.random.default_rng(seed + 7919)
    duration = workload.duration_s
    horizon = duration + 6 * 3600.0  # let the last requests finish
    weights = dict(capacity_weight or {})

    heap: list[tuple[float, int, int, int, int]] = []  # (time, seq, kind, rid, version)
    seq = 0
    EV_REPLICA, EV_READY, EV_CRASH = 0, 1, 2
    replicas: dict[int, _Replica] = {}
    ready: list[_Replica] = []
    pending: deque[int] = deque()
    next_rid = 0

    # accounting
    gpu_in_use = 0.0
    gpu_area = 0.0
    gpu_t = 0.0
    lent = 0
    lent_area = 0.0
    idle_since: float | None = None
    reclaims: list[float] = []
    slices_used: dict[str, float] = {}
    crashes = 0
    retried = 0
    in_flight = 0
    conc_area = 0.0
    conc_t = 0.0
    arrivals_window = 0
    completions_window: list[float] = []
    series: dict[str, list[float]] = {"t_s": [], "gpus": [], "replicas": [], "lent": [], "rps": [],
                                      "p99_s": [], "slice": []}
    max_metric: dict[str, float] = {}
    notes: list[str] = []
    replica_changes = 0
    slice_changes = 0
    last_slices: frozenset[str] = frozenset()
    counts_seen: list[int] = []

    def account(now: float) -> None:
        nonlocal gpu_area, gpu_t, lent_area
        t = min(now, duration)
        if t > gpu_t:
            gpu_area += gpu_in_use * (t - gpu_t)
            lent_area += lent * (t - gpu_t)
            gpu_t = t

    def conc_update(now: float) -> None:
        nonlocal conc_area, conc_t
        conc_area += in_flight * (now - conc_t)
        conc_t = now

    def push(t: float, kind: int, rep: _Replica) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, rep.rid, rep.version))

    def set_busy(rep: _Replica, now: float) -> None:
        busy = rep.pf >= 0 or bool(rep.batch)
        if busy:
            if rep.busy_since is None:
                rep.busy_since = now
        elif rep.busy_since is not None:
            rep.busy_acc += now - rep.busy_since
            rep.busy_since = None

    def advance(rep: _Replica, now: float) -> None:
        if rep.pf < 0 and rep.batch:
            sl = rep.sl
            rep.V += (now - rep.t_last) / (sl.step_s + sl.step_per_seq_s * len(rep.batch))
        rep.t_last = now

    def schedule(rep: _Replica, now: float) -> None:
        """Start the next prefill if one is admissible, else schedule the next decode completion."""
        rep.version += 1
        sl = rep.sl
        if rep.pf < 0 and rep.waiting:
            r = rep.waiting[0]
            need = min(prompt_l[r] + out_l[r], rep.kv_cap)
            if rep.kv_used + need <= rep.kv_cap and len(rep.batch) < max_seqs:
                rep.waiting.popleft()
                rep.kv_used += need
                rep.pf = r
                rep.pf_end = now + prompt_l[r] / sl.prefill_tps
                rep.tokens += prompt_l[r]
                push(rep.pf_end, EV_REPLICA, rep)
                set_busy(rep, now)
                return
        if rep.pf >= 0:
            push(rep.pf_end, EV_REPLICA, rep)
        elif rep.batch:
            step = sl.step_s + sl.step_per_seq_s * len(rep.batch)
            push(rep.t_last + max(0.0, rep.batch[0][0] - rep.V) * step, EV_REPLICA, rep)
        set_busy(rep, now)

    def finish(rep: _Replica, r: int, now: float) -> None:
        nonlocal in_flight
        e2e_l[r] = now - arr_l[r]
        completions_window.append(now - arr_l[r])
        rep.kv_used -= min(prompt_l[r] + out_l[r], rep.kv_cap)
        rep.outstanding -= 1
        rep.tokens += out_l[r]
        conc_update(now)
        in_flight -= 1

    def stop(rep: _Replica, now: float) -> None:
        nonlocal gpu_in_use
        account(now)
        rep.state = 3
        rep.version += 1
        rep.stopped_at = now
        gpu_in_use -= rep.sl.gpu_fraction
        held = (min(now, duration) - min(rep.created, duration)) / 3600.0
        slices_used[rep.sl.name] = slices_used.get(rep.sl.name, 0.0) + held
        replicas.pop(rep.rid, None)

    def on_replica(rep: _Replica, now: float) -> None:
        advance(rep, now)
        if rep.pf >= 0 and now >= rep.pf_end - 1e-12:
            r = rep.pf
            rep.pf = -1
            ttft_l[r] = now - arr_l[r]
            rem = out_l[r] - 1
            if rem <= 0:
                finish(rep, r, now)
            else:
                heapq.heappush(rep.batch, (rep.V + rem, r))
        elif rep.pf < 0:
            b = rep.batch
            while b and b[0][0] <= rep.V + 1e-6:
                _, r = heapq.heappop(b)
                finish(rep, r, now)
        if rep.state == 2 and rep.outstanding == 0:
            set_busy(rep, now)
            stop(rep, now)
            return
        schedule(rep, now)

    def dispatch(r: int, now: float) -> None:
        if not ready:
            pending.append(r)
            return
        best = ready[0]
        if len(ready) > 1:
            bv = best.outstanding * best.inv_cap
            for rep in ready:
                v = rep.outstanding * rep.inv_cap
                if v < bv:
                    best, bv = rep, v
        best.waiting.append(r)
        best.outstanding += 1
        if best.pf < 0:
            advance(best, now)
            schedule(best, now)

    def crash_time(now: float) -> float:
        if replica.crash_mtbf_h is None:
            return math.inf
        return now + float(rng.exponential(replica.crash_mtbf_h * 3600.0))

    def create(name: str, now: float, extra_delay: float) -> None:
        nonlocal next_rid, gpu_in_use
        if name not in table.slices:
            raise InferenceConfigError(f"policy {policy.name}: slice {name!r} is not in the throughput table "
                                       f"({', '.join(table.slices)})")
        sl = table.slices[name]
        kv = sl.kv_tokens(model)
        if kv < model.min_kv_tokens:
            raise InferenceConfigError(f"policy {policy.name}: slice {name} ({sl.memory_mib:g} MiB) cannot hold "
                                       f"{model.name} ({model.memory_need_mib} MiB with {model.min_kv_tokens} "
                                       f"tokens of KV cache)")
        account(now)
        rep = _Replica(next_rid, sl, now, now + extra_delay + replica.startup_s, kv,
                       1.0 / weights.get(name, 1.0))
        next_rid += 1
        replicas[rep.rid] = rep
        gpu_in_use += sl.gpu_fraction
        push(rep.ready_at, EV_READY, rep)

    def used_gpus(extra: float = 0.0) -> int:
        return int(math.ceil(gpu_in_use + extra - 1e-9))

    def apply(decision: PolicyDecision, now: float) -> None:
        nonlocal lent, replica_changes, slice_changes, last_slices
        want = {k: int(v) for k, v in decision.replicas.items() if v > 0}
        active = [r for r in replicas.values() if r.state in (0, 1)]
        have: dict[str, list[_Replica]] = {}
        for r in active:
            have.setdefault(r.sl.name, []).append(r)
        changed = False
        # scale down first (frees GPUs for the scale-up)
        for name, reps in have.items():
            extra = len(reps) - want.get(name, 0)
            if extra <= 0:
                continue
            changed = True
            reps.sort(key=lambda x: (x.state, -x.created if x.state == 0 else x.outstanding))
            for rep in reps[:extra]:
                if rep.state == 0:
                    stop(rep, now)
                else:
                    rep.state = 2
                    ready.remove(rep)
                    if rep.outstanding == 0:
                        set_busy(rep, now)
                        stop(rep, now)
        for name, count in want.items():
            missing = count - len(have.get(name, []))
            if missing <= 0:
                continue
            sl = table.slices.get(name)
            if sl is None:
                raise InferenceConfigError(f"policy {policy.name}: slice {name!r} is not in the throughput table")
            for _ in range(missing):
                need = used_gpus(sl.gpu_fraction)
                if need > pool_gpus + 1e-9:
                    notes.append(f"{now / 3600:.2f} h: the pool of {pool_gpus:g} GPUs is full, {name} not started")
                    break
                delay = 0.0
                if lending.enabled and need + lent > pool_gpus + 1e-9:
                    k = int(math.ceil(need + lent - pool_gpus - 1e-9))
                    lat = []
                    for _ in range(k):
                        lo, hi = lending.checkpoint_s
                        lat.append(min(float(rng.uniform(lo, hi)), lending.grace_s))
                    account(now)
                    lent -= k
                    reclaims.extend(lat)
                    delay = max(lat)
                create(name, now, delay)
                changed = True
        if changed:
            replica_changes += 1
        slices = frozenset(want)
        if last_slices and slices != last_slices and slices - last_slices:
            slice_changes += 1
        last_slices = slices
        if lending.enabled:
            idle = int(math.floor(pool_gpus + 1e-9)) - used_gpus() - lent
            if idle > 0:
                if idle_since is None:
                    set_idle(now)
                elif now - idle_since >= lending.lend_after_s:
                    account(now)
                    lent += idle
                    set_idle(None)
            else:
                set_idle(None)

    def set_idle(v: float | None) -> None:
        nonlocal idle_since
        idle_since = v

    # ---- metrics
    scrapes: deque[tuple[float, dict[str, float]]] = deque()
    last_scrape = 0.0

    def scrape(now: float) -> None:
        nonlocal conc_area, arrivals_window, last_scrape
        window = max(now - last_scrape, 1e-9)
        conc_update(now)
        conc = conc_area / window
        conc_area = 0.0
        queue = len(pending) + sum(len(r.waiting) for r in replicas.values() if r.state in (1, 2))
        util = []
        cpu = []
        cm = replica.cpu
        for rep in ready:
            busy = rep.busy_acc + (now - rep.busy_since if rep.busy_since is not None else 0.0)
            span = min(window, now - rep.ready_at) if now > rep.ready_at else 0.0
            share = (busy - rep.busy_mark) / span if span > 0 else 0.0
            rep.busy_mark = busy
            toks = rep.tokens - rep.tokens_mark
            rep.tokens_mark = rep.tokens
            share = min(1.0, max(0.0, share))
            util.append(100.0 * share)
            cores = cm.idle_cores + cm.busy_cores * share + toks / window * cm.core_s_per_token
            cpu.append(100.0 * cores / cm.request_cores)
        samples = {
            "concurrency": conc,
            "queue_depth": float(queue),
            "rps": arrivals_window / window,
        }
        if util:
            samples["gpu_util"] = sum(util) / len(util)
            samples["cpu_util"] = sum(cpu) / len(cpu)
        if completions_window:
            lat = sorted(completions_window)
            last = len(lat) - 1
            samples["latency_p95_s"] = lat[min(last, math.ceil(0.95 * len(lat)) - 1)]
            samples["latency_p99_s"] = lat[min(last, math.ceil(0.99 * len(lat)) - 1)]
            series_p99 = samples["latency_p99_s"]
        else:
            series_p99 = math.nan
        for k, v in samples.items():
            if now <= duration and v > max_metric.get(k, -math.inf):
                max_metric[k] = v
        arrivals_window = 0
        completions_window.clear()
        last_scrape = now
        scrapes.append((now, samples))
        if now <= duration:
            series["t_s"].append(now)
            series["gpus"].append(gpu_in_use)
            series["replicas"].append(float(sum(1 for r in replicas.values() if r.state in (0, 1))))
            series["lent"].append(float(lent))
            series["rps"].append(samples["rps"])
            series["p99_s"].append(series_p99)
            series["slice"].append(",".join(sorted(last_slices)))

    def observed(now: float) -> dict[str, float] | None:
        seen = None
        while scrapes and scrapes[0][0] <= now - lag_s + 1e-9:
            seen = scrapes.popleft()
        if seen is not None:
            scrapes.appendleft(seen)  # keep the latest visible one
            return seen[1]
        return None

    def sim_state(now: float) -> SimState:
        st = SimState(now_s=now, pool_gpus=pool_gpus)
        for r in replicas.values():
            if r.state in (0, 1):
                st.replicas[r.sl.name] = st.replicas.get(r.sl.name, 0) + 1
                if r.state == 1:
                    st.ready[r.sl.name] = st.ready.get(r.sl.name, 0) + 1
        return st

    # ---- initial replicas: ready at t=0 (the service was running before midnight)
    for name, count in policy.initial().items():
        for _ in range(count):
            create(name, 0.0, -replica.startup_s)
    last_slices = frozenset(k for k, v in policy.initial().items() if v > 0)

    i = 0
    next_scrape = policy.scrape_s
    next_reconcile = policy.reconcile_s
    next_tick = 3600.0
    inf = math.inf
    while True:
        t_a = arr_l[i] if i < n else inf
        t_h = heap[0][0] if heap else inf
        t_s = next_scrape if next_scrape < next_reconcile else next_reconcile
        now = t_a if t_a < t_h else t_h
        if t_s <= now:
            now = t_s
            if now > horizon or (now > duration and i >= n and in_flight == 0):
                break
            if now >= next_tick:
                next_tick += 3600.0
                if tick is not None:
                    tick(min(1.0, now / duration))
            if next_scrape <= now:
                scrape(now)
                next_scrape += policy.scrape_s
            if next_reconcile <= now:
                next_reconcile += policy.reconcile_s
                dec = policy.decide(now, sim_state(now), observed(now))
                apply(dec, now)
                counts_seen.append(sum(1 for r in replicas.values() if r.state in (0, 1)))
            continue
        if now == inf:
            break
        if t_a <= t_h:
            i += 1
            arrivals_window += 1
            conc_update(now)
            in_flight += 1
            dispatch(i - 1, now)
            continue
        _, _, kind, rid, version = heapq.heappop(heap)
        rep = replicas.get(rid)
        if rep is None:
            continue
        if kind == EV_REPLICA:
            if version != rep.version:
                continue
            on_replica(rep, now)
        elif kind == EV_READY:
            if rep.state != 0 or now + 1e-9 < rep.ready_at:
                continue
            rep.state = 1
            rep.t_last = now
            ready.append(rep)
            ct = crash_time(now)
            if ct < inf:
                seq += 1
                heapq.heappush(heap, (ct, seq, EV_CRASH, rep.rid, -1))
            while pending:
                dispatch(pending.popleft(), now)
        elif kind == EV_CRASH:
            if rep.state not in (1, 2):
                continue
            crashes += 1
            advance(rep, now)
            lost = list(rep.waiting) + ([rep.pf] if rep.pf >= 0 else []) + [r for _, r in rep.batch]
            rep.waiting.clear()
            rep.pf = -1
            rep.batch = []
            rep.kv_used = 0
            rep.outstanding = 0
            rep.version += 1
            set_busy(rep, now)
            if rep in ready:
                ready.remove(rep)
            if rep.state == 2:
                stop(rep, now)
            else:  # the container restarts: load the model again
                rep.state = 0
                rep.ready_at = now + replica.startup_s
                rep.V = 0.0
                push(rep.ready_at, EV_READY, rep)
            for r in lost:
                retried += 1
                ttft_l[r] = math.nan
                dispatch(r, now)
    account(duration)
    end = min(now, horizon) if now != inf else duration
    for rep in list(replicas.values()):
        stop(rep, max(end, duration))
    ttft[:] = ttft_l
    e2e[:] = e2e_l
    unfinished = int(np.isnan(e2e).sum())
    if tick is not None:
        tick(1.0)
    changes = int(np.count_nonzero(np.diff(np.asarray(counts_seen)))) if len(counts_seen) > 1 else 0
    return PolicyResult(
        policy=policy.name, n_requests=n, ttft_s=ttft, e2e_s=e2e, gpu_hours=gpu_area / 3600.0,
        replica_changes=changes, slice_changes=slice_changes, lent_gpu_hours=lent_area / 3600.0,
        reclaims=reclaims, series=series, max_metric=max_metric,
        max_replicas=max(counts_seen, default=0), min_replicas=min(counts_seen, default=0),
        slices_used=slices_used, crashes=crashes, retried=retried,
        wall_s=_time.perf_counter() - wall0, notes=notes[:20], unfinished=unfinished,
    )


def percentiles(values: np.ndarray, qs: Sequence[float] = (50, 95, 99)) -> list[float]:
    """Percentiles of the finite values (NaN, unfinished requests, count as +inf: they missed)."""
    v = np.where(np.isnan(values), np.inf, values)
    if v.size == 0:
        return [math.nan for _ in qs]
    return [float(x) for x in np.percentile(v, qs, method="higher")]
