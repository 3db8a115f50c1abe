"""Scaling policies for the inference simulator, and the scenario file that configures them.

Every autoscaled policy drives the engine's :class:`~gpupool.engine.autoscale.Recommender` with its own
:class:`~gpupool.engine.autoscale.AutoscalerSpec` (one engine, many drivers); ``gpupool`` adds the engine's
:class:`~gpupool.engine.rightsize.RightSizer` to choose the slice. The scenario format::

    apiVersion: gpupool.io/v1alpha1
    kind: InferenceScenario
    metadata: {name: reference}
    spec:
      durationHours: 24
      seed: 42
      gpuModel: H200
      poolGpus: 4                     # GPUs set aside for the service; the idle ones are lent
      slo: {e2eSeconds: 15, attainment: 0.99}
      workload: {source: azure-llm, trace: embedded, troughRps: 0.5, peakRps: 5, peakHour: 14,
                 bursts: [{startHour: 10.5, minutes: 20, factor: 2.5}]}
      replica: {startupSeconds: 90, crashMtbfHours: null, cpuRequestCores: 4}
      metrics: {scrapeSeconds: 15, lagSeconds: 15, reconcileSeconds: 15}
      lending: {enabled: true, lendAfterSeconds: 300, checkpointSeconds: [10, 45], graceSeconds: 30}
      policies:
        static: {kind: static, slice: 1xH200, replicas: auto}
        hpa-cpu: {kind: recommender, slice: 1xH200, autoscaler: {maxReplicas: 4, metrics: [...]}}
        gpupool: {kind: rightsized, headroom: 0.5, autoscaler: {...}}

``autoscaler`` is the ``GpuAutoscaler`` CR spec (:meth:`AutoscalerSpec.from_mapping`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gpupool.engine.autoscale import AutoscalerSpec, MetricTarget, Recommender
from gpupool.engine.autoscale_coming import with_capacity_coming
from gpupool.engine.rightsize import RightSizer, SliceOption, slice_catalog
from gpupool.inputs import load_yaml, unknown_keys

from .inference import (
    MAX_DURATION_S,
    Burst,
    CpuModel,
    Envelope,
    InferenceConfigError,
    LendingSpec,
    PolicyDecision,
    ReplicaSpec,
    ServedModel,
    SimState,
    SliceThroughput,
    ThroughputTable,
)
from .inference_schema import ScenarioKeys

__all__ = [
    "Capacity",
    "RecommenderPolicy",
    "RightSizedPolicy",
    "Scenario",
    "StaticPolicy",
    "TokenStats",
    "build_policy",
    "load_scenario",
    "parse_scenario",
    "slice_capacity",
]


# --------------------------------------------------------------------------------------------------
# Capacity model (what one replica on a slice serves within the SLO)


@dataclass(frozen=True)
class TokenStats:
    """Token sizes of the workload: means and the 99th percentile of the output (tokens)."""

    prompt_mean: float
    output_mean: float
    output_p99: float

    @classmethod
    def of(cls, prompt: np.ndarray, output: np.ndarray) -> TokenStats:
        return cls(float(np.mean(prompt)), float(np.mean(output)), float(np.percentile(output, 99)))


@dataclass(frozen=True)
class Capacity:
    """One replica's operating point: ``rps`` (requests/s), ``concurrency`` (requests in flight),
    ``batch`` (decoding sequences), ``e2e_p99_s`` (estimated end-to-end latency of a p99-length output)."""

    rps: float
    concurrency: float
    batch: float
    e2e_p99_s: float


def slice_capacity(sl: SliceThroughput, model: ServedModel, slo_s: float, stats: TokenStats,
                   headroom: float = 0.5) -> Capacity:
    """The highest request rate one replica on ``sl`` serves with the estimated end-to-end latency of a
    p99-length output under ``headroom x slo_s``.

    Model (steady state, the simulator's replica): prefill occupies the GPU a share
    ``rho = rps x prompt_mean / prefill_tps`` and stalls decoding meanwhile; by Little's law the decode
    batch is ``b = rps x output_mean x step(b) / (1 - rho)``, i.e. ``b = rps m s0 / ((1 - rho) - rps m s1)``;
    the p99 request takes ``prompt/prefill / (1 - rho) + output_p99 x step(b) / (1 - rho)``. ``b`` is capped
    by ``max_num_seqs`` and the KV cache. Returns rps 0 when even one request misses the budget.
    """
    budget = headroom * slo_s
    kv = sl.kv_tokens(model)
    ctx = stats.prompt_mean + stats.output_mean
    best = Capacity(0.0, 0.0, 0.0, math.inf)
    lam = 0.01
    while lam < 1000:
        rho = lam * stats.prompt_mean / sl.prefill_tps
        if rho >= 0.95:
            break
        denom = (1 - rho) - lam * stats.output_mean * sl.step_per_seq_s
        if denom <= 0:
            break
        b = lam * stats.output_mean * sl.step_s / denom
        if b > model.max_num_seqs or b * ctx > kv:
            break
        ttft = stats.prompt_mean / sl.prefill_tps / (1 - rho)
        e2e = ttft + stats.output_p99 * sl.step(max(1.0, b)) / (1 - rho)
        if e2e > budget:
            break
        best = Capacity(lam, b + lam * ttft, b, e2e)
        lam *= 1.02
    return best


# --------------------------------------------------------------------------------------------------
# Policies


@dataclass
class _Trace:
    """What a policy did, for the explanations: reasons and limits seen, metric peaks."""

    limited: dict[str, int] = field(default_factory=dict)
    panic_evals: int = 0
    last_reason: str = ""
    choices: list[str] = field(default_factory=list)


class StaticPolicy:
    """A fixed number of replicas of one slice for the whole run (provisioned for the peak)."""

    def __init__(self, name: str, slice_name: str, replicas: int, *, sized_for: str = "") -> None:
        if replicas < 1:
            raise InferenceConfigError(f"policy {name}: replicas must be >= 1, got {replicas}")
        self.name = name
        self.slice = slice_name
        self.replicas = replicas
        self.reconcile_s = 60.0
        self.scrape_s = 15.0
        self.sized_for = sized_for
        self.spec: AutoscalerSpec | None = None
        self.trace = _Trace()

    def describe(self) -> str:
        return f"{self.replicas} x {self.slice} for the whole run{self.sized_for}"

    def initial(self) -> Mapping[str, int]:
        return {self.slice: self.replicas}

    def decide(self, now_s: float, state: SimState, samples: Mapping[str, float] | None) -> PolicyDecision:
        return PolicyDecision({self.slice: self.replicas}, "static")


class RecommenderPolicy:
    """Replicas of one slice from the engine's Recommender with ``spec`` (HPA, KEDA, Knative styles)."""

    def __init__(self, name: str, slice_name: str, spec: AutoscalerSpec, *, reconcile_s: float = 15.0,
                 scrape_s: float = 15.0, style: str = "") -> None:
        if not spec.metrics:
            raise InferenceConfigError(f"policy {name}: the autoscaler has no metrics")
        self.name = name
        self.slice = slice_name
        self.spec = spec
        self.reconcile_s = reconcile_s
        self.scrape_s = scrape_s
        self.style = style
        self.recommender = Recommender(spec)
        self.trace = _Trace()

    def describe(self) -> str:
        ms = ", ".join(f"{m.name} {m.target:g}" for m in self.spec.metrics)
        extra = f", panic window {self.spec.panic_window_s:g} s" if self.spec.panic_window_s else ""
        return (f"{self.style}{self.slice} replicas {self.spec.min_replicas}-{self.spec.max_replicas}, target "
                f"{ms} per replica{extra}, every {self.reconcile_s:g} s")

    def initial(self) -> Mapping[str, int]:
        return {self.slice: max(1, self.spec.min_replicas)}

    def decide(self, now_s: float, state: SimState, samples: Mapping[str, float] | None) -> PolicyDecision:
        cur = state.replicas.get(self.slice, 0)
        if samples is None:
            return PolicyDecision({self.slice: cur}, "no metrics yet")
        rec = self.recommender.recommend(now_s, cur, samples, state.ready.get(self.slice, 0))
        if rec.limited_by:
            self.trace.limited[rec.limited_by] = self.trace.limited.get(rec.limited_by, 0) + 1
        self.trace.panic_evals += int(rec.panic)
        self.trace.last_reason = rec.reason
        return PolicyDecision({self.slice: rec.replicas}, rec.reason)


class RightSizedPolicy:
    """gpupool: the RightSizer picks the slice for the recent peak demand (requests/s over
    ``demand_window_s``, 1 h: the minimum replica keeps room for the traffic the service has seen in the last
    hour come back, issue 30; with 5 min the idle minimum went to a half-GPU slice that saturated on the
    return), the Recommender scales the replicas of that slice on concurrency and rps with
    per-slice targets from :func:`slice_capacity`. A slice change is a surge rollout: the new slice's
    replicas start, the old ones drain once enough of the new ones are ready."""

    def __init__(self, name: str, table: ThroughputTable, base: AutoscalerSpec, capacities: Mapping[str, Capacity],
                 options: Sequence[SliceOption], *, pool_gpus: float, reconcile_s: float = 15.0,
                 scrape_s: float = 15.0, hysteresis: float = 0.2, min_dwell_s: float = 600.0,
                 demand_window_s: float = 3600.0) -> None:
        self.name = name
        self.table = table
        self.base = base
        self.capacities = dict(capacities)
        self.options = [o for o in options if self.capacities.get(o.name, Capacity(0, 0, 0, 0)).rps > 0]
        if not self.options:
            raise InferenceConfigError(f"policy {name}: no slice serves one request within the SLO")
        self.sizer = RightSizer(self.options, hysteresis=hysteresis, min_dwell_s=min_dwell_s)
        self.pool_gpus = pool_gpus
        self.reconcile_s = reconcile_s
        self.scrape_s = scrape_s
        self.demand_window_s = demand_window_s
        self.recent: deque[tuple[float, float]] = deque()
        self.recommenders: dict[str, Recommender] = {}
        self.current = ""
        self.old: str | None = None
        self.trace = _Trace()
        self.spec = base
        first = self.sizer.choose(0.0, 0.0, {o.name: self.capacities[o.name].rps for o in self.options},
                                  table.model.memory_need_mib, max(1, base.min_replicas))
        self.current = first.option.name
        self.first = first

    def spec_for(self, slice_name: str) -> AutoscalerSpec:
        cap = self.capacities[slice_name]
        frac = self.table.slices[slice_name].gpu_fraction
        metrics = (MetricTarget("concurrency", max(1.0, round(cap.concurrency, 2))),
                   MetricTarget("rps", max(0.01, round(cap.rps, 3))))
        max_r = self.base.max_replicas
        if math.isfinite(self.pool_gpus):  # no more replicas than the pool holds
            max_r = max(1, min(max_r, int(math.floor(self.pool_gpus / frac + 1e-9))))
        return replace(self.base, metrics=metrics, max_replicas=max_r, min_replicas=min(self.base.min_replicas, max_r))

    def recommender(self, slice_name: str) -> Recommender:
        if slice_name not in self.recommenders:
            self.recommenders[slice_name] = Recommender(self.spec_for(slice_name))
        return self.recommenders[slice_name]

    def describe(self) -> str:
        caps = ", ".join(f"{o.name} {self.capacities[o.name].rps:.2g} rps" for o in self.options)
        s = self.spec_for(self.current)
        extra = f", panic window {s.panic_window_s:g} s" if s.panic_window_s else ""
        return (f"RightSizer over {len(self.options)} slices (capacity per replica at the SLO: {caps}); "
                f"Recommender on concurrency and rps per slice{extra}, every {self.reconcile_s:g} s")

    def initial(self) -> Mapping[str, int]:
        return {self.current: self.first.replicas}

    def decide(self, now_s: float, state: SimState, samples: Mapping[str, float] | None) -> PolicyDecision:
        cur = state.replicas.get(self.current, 0)
        if samples is None:
            return PolicyDecision(dict(state.replicas), "no metrics yet")
        self.recent.append((now_s, samples.get("rps", 0.0)))
        while self.recent and self.recent[0][0] < now_s - self.demand_window_s:
            self.recent.popleft()
        demand = max(v for _, v in self.recent)
        caps = {o.name: self.capacities[o.name].rps for o in self.options}
        choice = self.sizer.choose(now_s, demand, caps, self.table.model.memory_need_mib,
                                   max(1, self.base.min_replicas))
        want: dict[str, int] = {}
        if choice.option.name != self.current:
            self.old = self.current
            self.current = choice.option.name
            self.trace.choices.append(f"{now_s / 3600:.2f} h {choice.reason}")
            self.recommenders.pop(self.current, None)
            n = min(choice.replicas, self.spec_for(self.current).max_replicas)
            want[self.current] = n
            reason = choice.reason
        else:
            ready = state.ready.get(self.current, 0)
            seen, _ = with_capacity_coming(samples, self.spec_for(self.current), cur, ready)
            rec = self.recommender(self.current).recommend(now_s, max(cur, 0), seen, ready)
            if rec.limited_by:
                self.trace.limited[rec.limited_by] = self.trace.limited.get(rec.limited_by, 0) + 1
            self.trace.panic_evals += int(rec.panic)
            want[self.current] = rec.replicas
            reason = rec.reason
        if self.old is not None:
            if state.ready.get(self.current, 0) >= want[self.current]:
                self.old = None  # the new slice is serving: drain the old one
            else:
                # keep the old slice serving, but no more of it than leaves the pool room for the new one
                # (a full pool would otherwise never start the new slice: the rollout stalled for good)
                keep = state.replicas.get(self.old, 0)
                if math.isfinite(self.pool_gpus):
                    room = self.pool_gpus - want[self.current] * self.table.slices[self.current].gpu_fraction
                    keep = min(keep, max(0, int(math.floor(room / self.table.slices[self.old].gpu_fraction + 1e-9))))
                want[self.old] = keep
        self.trace.last_reason = reason
        return PolicyDecision(want, reason)


# --------------------------------------------------------------------------------------------------
# Scenario


@dataclass
class Scenario:
    """A parsed scenario file (see the module docstring)."""

    name: str
    source: str
    duration_s: float
    seed: int
    gpu_model: str
    pool_gpus: float
    slo_s: float
    attainment: float
    workload: dict[str, Any]
    envelope: Envelope
    replica: ReplicaSpec
    lending: LendingSpec
    scrape_s: float
    lag_s: float
    reconcile_s: float
    policies: dict[str, dict[str, Any]]
    throughput: str | None = None
    notes: dict[str, str] = field(default_factory=dict)


def _get(d: Mapping[str, Any], key: str, where: str, default: Any = ..., *, kind: type | tuple = (int, float),
         minimum: float | None = None, positive: bool = False) -> Any:
    if key not in d or d[key] is None:
        if default is ...:
            raise InferenceConfigError(f"{where}.{key}: missing")
        return default
    v = d[key]
    if kind == (int, float):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
            raise InferenceConfigError(f"{where}.{key}: a number expected, got {v!r}")
        if positive and v <= 0:
            raise InferenceConfigError(f"{where}.{key}: must be > 0, got {v!r}")
        if minimum is not None and v < minimum:
            raise InferenceConfigError(f"{where}.{key}: must be >= {minimum:g}, got {v!r}")
        return v
    if not isinstance(v, kind):
        raise InferenceConfigError(f"{where}.{key}: {getattr(kind, '__name__', kind)} expected, got {v!r}")
    return v


def parse_scenario(doc: Any, source: str = "<scenario>", text: str | None = None) -> Scenario:
    """A :class:`Scenario` from the parsed YAML; raises InferenceConfigError naming ``source`` and the field.

    A key the format does not have (:class:`~gpupool.sim.inference_schema.ScenarioKeys`) is refused with its
    line and column in ``text`` (the file's YAML, when given) and the closest known key."""
    if not isinstance(doc, dict) or doc.get("kind") != "InferenceScenario" or not isinstance(doc.get("spec"), dict):
        raise InferenceConfigError(f"{source}: expected 'kind: InferenceScenario' with a 'spec' mapping")
    unknown_keys(doc, ScenarioKeys, source, text, InferenceConfigError)
    spec = doc["spec"]
    w = f"{source}: spec"
    name = str((doc.get("metadata") or {}).get("name", Path(source).stem))
    duration = float(_get(spec, "durationHours", w, 24, positive=True)) * 3600.0
    if duration > MAX_DURATION_S:  # the envelope is sampled per second over the day (sizing, arrivals)
        raise InferenceConfigError(f"{w}.durationHours: at most {MAX_DURATION_S / 3600:g}, got {duration / 3600:g}")
    slo = _get(spec, "slo", w, kind=dict)
    slo_s = float(_get(slo, "e2eSeconds", f"{w}.slo", positive=True))
    attainment = float(_get(slo, "attainment", f"{w}.slo", 0.99, positive=True))
    if attainment > 1:
        raise InferenceConfigError(f"{w}.slo.attainment: a share within (0, 1], got {attainment}")
    wl = _get(spec, "workload", w, kind=dict)
    ww = f"{w}.workload"
    src = wl.get("source", "azure-llm")
    if src not in ("azure-llm", "synthetic"):
        raise InferenceConfigError(f"{ww}.source: 'azure-llm' or 'synthetic', got {src!r}")
    bursts = []
    for i, b in enumerate(_get(wl, "bursts", ww, [], kind=list)):
        bw = f"{ww}.bursts[{i}]"
        if not isinstance(b, dict):
            raise InferenceConfigError(f"{bw}: a mapping expected")
        bursts.append(Burst(float(_get(b, "startHour", bw, minimum=0)) * 3600.0,
                            float(_get(b, "minutes", bw, positive=True)) * 60.0,
                            float(_get(b, "factor", bw, positive=True)),
                            float(_get(b, "rampSeconds", bw, 60.0, minimum=0))))
    trough = float(_get(wl, "troughRps", ww, positive=True))
    peak = float(_get(wl, "peakRps", ww, positive=True))
    if peak < trough:
        raise InferenceConfigError(f"{ww}.peakRps: {peak} is below troughRps {trough}")
    peak_hour = float(_get(wl, "peakHour", ww, 14.0, minimum=0))
    if peak_hour >= 24:
        raise InferenceConfigError(f"{ww}.peakHour: an hour of the day within [0, 24), got {peak_hour:g}")
    env = Envelope(trough, peak, peak_hour, tuple(bursts))
    rep = _get(spec, "replica", w, {}, kind=dict)
    rw = f"{w}.replica"
    mtbf = rep.get("crashMtbfHours")
    if mtbf is not None:
        mtbf = float(_get(rep, "crashMtbfHours", rw, positive=True))
    replica = ReplicaSpec(float(_get(rep, "startupSeconds", rw, 90.0, minimum=0)), mtbf,
                          CpuModel(request_cores=float(_get(rep, "cpuRequestCores", rw, 4.0, positive=True))))
    met = _get(spec, "metrics", w, {}, kind=dict)
    mw = f"{w}.metrics"
    lend = _get(spec, "lending", w, {}, kind=dict)
    lw = f"{w}.lending"
    ck = _get(lend, "checkpointSeconds", lw, [10.0, 45.0], kind=list)
    if len(ck) != 2 or not all(isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < math.inf
                               for x in ck) or ck[0] > ck[1]:
        raise InferenceConfigError(f"{lw}.checkpointSeconds: [low, high] seconds expected, got {ck!r}")
    lending = LendingSpec(bool(lend.get("enabled", True)), float(_get(lend, "lendAfterSeconds", lw, 300.0, minimum=0)),
                          (float(ck[0]), float(ck[1])), float(_get(lend, "graceSeconds", lw, 30.0, minimum=0)))
    policies = _get(spec, "policies", w, kind=dict)
    if not policies:
        raise InferenceConfigError(f"{w}.policies: at least one policy")
    for pname, p in policies.items():
        if not isinstance(p, dict) or p.get("kind") not in ("static", "recommender", "rightsized"):
            raise InferenceConfigError(f"{w}.policies.{pname}.kind: 'static', 'recommender' or 'rightsized'")
    pool = spec.get("poolGpus")
    seed = _get(spec, "seed", w, 42, kind=int)
    if isinstance(seed, bool) or seed < 0:
        raise InferenceConfigError(f"{w}.seed: an integer >= 0 expected, got {seed!r}")
    return Scenario(
        name=name, source=source, duration_s=duration, seed=seed,
        gpu_model=str(spec.get("gpuModel", "H200")),
        pool_gpus=math.inf if pool is None else float(_get(spec, "poolGpus", w, positive=True)),
        slo_s=slo_s, attainment=attainment, workload=wl, envelope=env, replica=replica, lending=lending,
        scrape_s=float(_get(met, "scrapeSeconds", mw, 15.0, positive=True)),
        lag_s=float(_get(met, "lagSeconds", mw, 15.0, minimum=0)),
        reconcile_s=float(_get(met, "reconcileSeconds", mw, 15.0, positive=True)),
        policies=policies, throughput=spec.get("throughput"),
        notes={k: str(v.get("note", "")) for k, v in policies.items()},
    )


def load_scenario(path: str | Path) -> Scenario:
    """Read a scenario YAML file; raises InferenceConfigError (file and field) or OSError."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InferenceConfigError(f"{p.name}: not valid UTF-8 (byte {exc.start}: {exc.reason})") from None
    return parse_scenario(load_yaml(text, p.name, InferenceConfigError), p.name, text)


#: Most replicas a simulated policy may be asked to run from the start (static replicas, minReplicas): the
#: simulator steps every replica, so 10**8 of them is a hang, not a result.
MAX_SIM_REPLICAS = 10_000


def _check_sim_replicas(n: int, where: str) -> None:
    if n > MAX_SIM_REPLICAS:
        raise InferenceConfigError(f"{where}: at most {MAX_SIM_REPLICAS:,} replicas in the simulator, got {n:,}")


def build_policy(name: str, sc: Scenario, table: ThroughputTable,
                 stats: TokenStats) -> StaticPolicy | RecommenderPolicy | RightSizedPolicy:
    """The policy object for ``sc.policies[name]``; raises InferenceConfigError naming the field."""
    p = sc.policies[name]
    w = f"{sc.source}: spec.policies.{name}"
    kind = p["kind"]
    reconcile = float(_get(p, "reconcileSeconds", w, sc.reconcile_s, positive=True))
    scrape = float(_get(p, "scrapeSeconds", w, sc.scrape_s, positive=True))
    headroom = float(_get(p, "headroom", w, 0.5, positive=True))
    if kind == "rightsized":
        names = p.get("slices")
        cat = [o for o in slice_catalog(table.gpu_model) if o.name in table.slices]
        if names is not None and (not isinstance(names, list) or not all(isinstance(x, str) for x in names)):
            raise InferenceConfigError(f"{w}.slices: a list of slice names expected (e.g. [1xH200, 3g.71gb]), "
                                       f"got {names!r}")
        if names is not None:
            unknown = [s for s in names if s not in {o.name for o in cat}]
            if unknown:
                raise InferenceConfigError(f"{w}.slices: {unknown} not in both the throughput table and the "
                                           f"{table.gpu_model} slice catalog")
            cat = [o for o in cat if o.name in names]
        cat = [o for o in cat if table.fits(o.name)]
        # ties (equal cost) go to the first option: whole GPUs first (no MIG reconfiguration of the node)
        cat.sort(key=lambda o: {"whole": 0, "mig": 1, "timeslice": 2}.get(o.kind, 3))
        caps = {o.name: slice_capacity(table.slices[o.name], table.model, sc.slo_s, stats, headroom) for o in cat}
        try:
            base = AutoscalerSpec.from_mapping(p.get("autoscaler") or {})
        except ValueError as exc:
            raise InferenceConfigError(f"{w}.autoscaler: {exc}") from None
        _check_sim_replicas(base.min_replicas, f"{w}.autoscaler.minReplicas")
        hysteresis = float(_get(p, "hysteresis", w, 0.2, minimum=0))
        if hysteresis >= 1:
            raise InferenceConfigError(f"{w}.hysteresis: a fraction within [0, 1) expected (0.2 = 20 %), "
                                       f"got {hysteresis:g}")
        return RightSizedPolicy(name, table, base, caps, cat, pool_gpus=sc.pool_gpus, reconcile_s=reconcile,
                                scrape_s=scrape, hysteresis=hysteresis,
                                min_dwell_s=float(_get(p, "minDwellSeconds", w, 600.0, minimum=0)))
    slice_name = str(p.get("slice", table.whole().name))
    if slice_name not in table.slices:
        raise InferenceConfigError(f"{w}.slice: {slice_name!r} is not in the throughput table "
                                   f"({', '.join(table.slices)})")
    if not table.fits(slice_name):
        raise InferenceConfigError(f"{w}.slice: {slice_name} cannot hold {table.model.name}")
    if kind == "static":
        replicas = p.get("replicas", "auto")
        sized = ""
        if replicas == "auto":
            cap = slice_capacity(table.slices[slice_name], table.model, sc.slo_s, stats, headroom)
            peak = sc.envelope.peak(sc.duration_s)
            if cap.rps <= 0:
                raise InferenceConfigError(f"{w}: {slice_name} cannot serve one request within the SLO")
            replicas = max(1, math.ceil(peak / cap.rps - 1e-9))
            sized = f" (peak {peak:.1f} rps / {cap.rps:.2f} rps per replica at the SLO)"
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise InferenceConfigError(f"{w}.replicas: an integer or 'auto', got {replicas!r}")
        if replicas < 1:
            raise InferenceConfigError(f"{w}.replicas: must be >= 1, got {replicas}")
        _check_sim_replicas(replicas, f"{w}.replicas")
        return StaticPolicy(name, slice_name, replicas, sized_for=sized)
    try:
        spec = AutoscalerSpec.from_mapping(p.get("autoscaler") or {})
    except ValueError as exc:
        raise InferenceConfigError(f"{w}.autoscaler: {exc}") from None
    _check_sim_replicas(spec.min_replicas, f"{w}.autoscaler.minReplicas")
    if math.isfinite(sc.pool_gpus):
        frac = table.slices[slice_name].gpu_fraction
        cap_r = max(1, int(math.floor(sc.pool_gpus / frac + 1e-9)))
        if spec.max_replicas > cap_r:
            spec = replace(spec, max_replicas=cap_r, min_replicas=min(spec.min_replicas, cap_r))
    return RecommenderPolicy(name, slice_name, spec, reconcile_s=reconcile, scrape_s=scrape,
                             style=str(p.get("style", "")))

