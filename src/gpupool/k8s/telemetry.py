"""GPU telemetry from NVIDIA dcgm-exporter or a Prometheus server, per (node, GPU index).

Two sources, same result (:class:`GpuSample` records in a :class:`GpuTelemetry` store):

* :class:`DcgmExporterSource` scrapes dcgm-exporter endpoints (Prometheus text format, parsed with
  ``prometheus_client.parser.text_string_to_metric_families``);
* :class:`PrometheusSource` asks a Prometheus server once per poll
  (``GET /api/v1/query?query={__name__=~"DCGM_FI_DEV_(GPU_UTIL|...)"}``).

Series are keyed by the node label (dcgm-exporter's ``Hostname``, which is the node name when the
exporter runs with ``NODE_NAME`` set as the NVIDIA chart does; ``kubernetes_node`` and ``node`` are
tried next) and the ``gpu`` label (DCGM's device index); the ``UUID`` label is kept. A scrape target may
also be pinned to a node (``node=url``) when its ``Hostname`` is a pod name.

DCGM's index is the physical GPU; gpupool's device index is the position among the devices the node
advertises (``status.allocatable``). They differ once a failed GPU is withdrawn, so readings are matched
to gpupool's devices by identity (:meth:`GpuTelemetry.device_map`: UUID when the node publishes its
devices' UUIDs, index only when every GPU DCGM sees is advertised), and a failed GPU the node no longer
advertises never marks another one unhealthy.

What the scheduler reads:

* :meth:`GpuTelemetry.health_mask`: a GPU whose last XID error is set is unhealthy, except the
  application-level XIDs that NVIDIA's device plugin also ignores (13, 31, 43, 45, 68);
* :meth:`GpuTelemetry.load`: mean GPU utilisation (0..1) per node, for a load-aware score.

Data older than ``max_age`` seconds is ignored everywhere (a node whose exporter died reads as
"unknown": healthy, load ``default``), so a silent exporter can neither cordon nor attract work.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from gpupool.catalog import APPLICATION_XIDS
from gpupool.cluster import ClusterState

log = logging.getLogger(__name__)

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
FB_USED = "DCGM_FI_DEV_FB_USED"
FB_FREE = "DCGM_FI_DEV_FB_FREE"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
XID_ERRORS = "DCGM_FI_DEV_XID_ERRORS"

FIELDS: dict[str, str] = {
    GPU_UTIL: "utilization",
    FB_USED: "fb_used_mib",
    FB_FREE: "fb_free_mib",
    POWER_USAGE: "power_w",
    XID_ERRORS: "xid",
}
"""dcgm-exporter metric -> :class:`GpuSample` field."""

NODE_LABELS: tuple[str, ...] = ("Hostname", "kubernetes_node", "node")
"""Labels that name the node, first present wins."""

_SUMMED = {"fb_used_mib", "fb_free_mib"}  # MIG instances of one GPU each report their own share


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU's latest readings. ``None`` where the exporter did not report that counter.

    ``utilization`` is a ratio 0..1 (DCGM reports percent); ``fb_*`` in MiB; ``power_w`` in watts;
    ``xid`` the last XID error (0 = none); ``timestamp`` in seconds since the epoch.
    """

    node: str
    gpu: int
    timestamp: float
    utilization: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    power_w: float | None = None
    xid: int = 0
    uuid: str = ""
    model: str = ""

    @property
    def memory_used_ratio(self) -> float | None:
        """FB used / (used + free), or ``None`` when either is missing."""
        if self.fb_used_mib is None or self.fb_free_mib is None:
            return None
        total = self.fb_used_mib + self.fb_free_mib
        return self.fb_used_mib / total if total > 0 else None


def _node_of(labels: Mapping[str, str], node_labels: Sequence[str]) -> str:
    for key in node_labels:
        value = labels.get(key)
        if value:
            return value
    return ""


class _Merger:
    """Folds series into samples: duplicates (one series per pod on a shared GPU) keep the largest value;
    MIG instances of one GPU (``GPU_I_ID``) add up their frame buffer and take the largest of the rest."""

    def __init__(self, node_labels: Sequence[str], node: str | None, now: float) -> None:
        self.node_labels = node_labels
        self.node = node
        self.now = now
        self.values: dict[tuple[str, int], dict[str, dict[str, float]]] = {}
        self.meta: dict[tuple[str, int], dict[str, object]] = {}

    def add(self, metric: str, labels: Mapping[str, str], value: float, timestamp: float | None) -> None:
        field = FIELDS.get(metric)
        if field is None or value is None or math.isnan(value):
            return
        node = self.node or _node_of(labels, self.node_labels)
        try:
            gpu = int(labels.get("gpu", ""))
        except ValueError:
            return
        if not node or gpu < 0:
            return
        key = (node, gpu)
        per_instance = self.values.setdefault(key, {}).setdefault(field, {})
        instance = labels.get("GPU_I_ID", "")
        per_instance[instance] = max(value, per_instance.get(instance, -math.inf))
        meta = self.meta.setdefault(key, {"ts": None, "uuid": "", "model": ""})
        if timestamp is not None:
            meta["ts"] = timestamp if meta["ts"] is None else max(float(meta["ts"]), timestamp)
        meta["uuid"] = meta["uuid"] or labels.get("UUID", "")
        meta["model"] = meta["model"] or labels.get("modelName", "")

    def samples(self) -> list[GpuSample]:
        out = []
        for (node, gpu), fields in self.values.items():
            merged: dict[str, float] = {}
            for field, per_instance in fields.items():
                vals = per_instance.values()
                merged[field] = sum(vals) if field in _SUMMED and len(per_instance) > 1 else max(vals)
            meta = self.meta[(node, gpu)]
            util = merged.get("utilization")
            out.append(GpuSample(
                node=node,
                gpu=gpu,
                timestamp=self.now if meta["ts"] is None else float(meta["ts"]),
                utilization=None if util is None else min(max(util / 100.0, 0.0), 1.0),
                fb_used_mib=merged.get("fb_used_mib"),
                fb_free_mib=merged.get("fb_free_mib"),
                power_w=merged.get("power_w"),
                xid=int(merged.get("xid", 0)),
                uuid=str(meta["uuid"]),
                model=str(meta["model"]),
            ))
        out.sort(key=lambda s: (s.node, s.gpu))
        return out


def parse_dcgm_text(text: str, *, node: str | None = None, now: float | None = None,
                    node_labels: Sequence[str] = NODE_LABELS) -> list[GpuSample]:
    """Samples from one dcgm-exporter page (Prometheus text format).

    ``node`` pins every series to that node (else the node label is read); series without a timestamp
    get ``now`` (default: the current time). Counters other than :data:`FIELDS` are ignored.
    Raises ``ValueError`` on a page that is not in the text format.
    """
    merger = _Merger(node_labels, node, time.time() if now is None else now)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            merger.add(sample.name, sample.labels, sample.value, sample.timestamp)
    return merger.samples()


def parse_prometheus_response(payload: Mapping, *, node_labels: Sequence[str] = NODE_LABELS) -> list[GpuSample]:
    """Samples from a Prometheus ``/api/v1/query`` answer (``resultType`` vector).

    Raises ``ValueError`` when the answer is an error or not a vector.
    """
    if payload.get("status") != "success":
        raise ValueError(f"prometheus query failed: {payload.get('errorType', '')} {payload.get('error', '')}".strip())
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    merger = _Merger(node_labels, None, time.time())
    for item in data.get("result") or []:
        labels = item.get("metric") or {}
        ts, raw = item.get("value") or (None, None)
        try:
            value = float(raw)
        except (TypeError, ValueError):
            continue
        merger.add(labels.get("__name__", ""), labels, value, None if ts is None else float(ts))
    return merger.samples()


class GpuTelemetry:
    """Thread-safe store of the latest :class:`GpuSample` per (node, GPU); readers see only fresh data.

    ``max_age``: seconds after which a sample is ignored. ``ignore_xids``: XIDs that do not make a GPU
    unhealthy (default :data:`APPLICATION_XIDS`). ``clock``: time source (``time.time``).
    """

    def __init__(self, max_age: float = 60.0, ignore_xids: Iterable[int] = APPLICATION_XIDS,
                 clock: Callable[[], float] = time.time) -> None:
        if max_age <= 0:
            raise ValueError("max_age must be > 0")
        self.max_age = float(max_age)
        self.ignore_xids = frozenset(int(x) for x in ignore_xids)
        self.clock = clock
        self._samples: dict[tuple[str, int], GpuSample] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ writing
    def update(self, samples: Iterable[GpuSample]) -> int:
        """Keep each sample unless an equally new or newer one is held for its GPU; returns how many were kept."""
        kept = 0
        with self._lock:
            for s in samples:
                old = self._samples.get((s.node, s.gpu))
                if old is None or s.timestamp >= old.timestamp:
                    self._samples[(s.node, s.gpu)] = s
                    kept += 1
        return kept

    def ingest_text(self, text: str, *, node: str | None = None, now: float | None = None,
                    node_labels: Sequence[str] = NODE_LABELS) -> int:
        """Parse one dcgm-exporter page (see :func:`parse_dcgm_text`) and store it."""
        return self.update(parse_dcgm_text(text, node=node, now=self.clock() if now is None else now,
                                           node_labels=node_labels))

    def ingest_prometheus(self, payload: Mapping, *, node_labels: Sequence[str] = NODE_LABELS) -> int:
        """Store a Prometheus ``/api/v1/query`` answer (see :func:`parse_prometheus_response`)."""
        return self.update(parse_prometheus_response(payload, node_labels=node_labels))

    def prune(self, now: float | None = None) -> int:
        """Forget stale samples; returns how many went."""
        cutoff = (self.clock() if now is None else now) - self.max_age
        with self._lock:
            stale = [k for k, s in self._samples.items() if s.timestamp < cutoff]
            for k in stale:
                del self._samples[k]
        return len(stale)

    # ------------------------------------------------------------------ reading
    def fresh(self, now: float | None = None) -> dict[tuple[str, int], GpuSample]:
        """Every sample no older than ``max_age``, by (node, gpu)."""
        cutoff = (self.clock() if now is None else now) - self.max_age
        with self._lock:
            return {k: s for k, s in self._samples.items() if s.timestamp >= cutoff}

    def get(self, node: str, gpu: int, now: float | None = None) -> GpuSample | None:
        """The fresh sample of one GPU, or ``None`` (never seen, or stale)."""
        with self._lock:
            s = self._samples.get((node, gpu))
        if s is None or s.timestamp < (self.clock() if now is None else now) - self.max_age:
            return None
        return s

    def is_unhealthy(self, sample: GpuSample) -> bool:
        return sample.xid != 0 and sample.xid not in self.ignore_xids

    def unhealthy(self, now: float | None = None) -> dict[tuple[str, int], int]:
        """(node, gpu) -> XID for every fresh GPU with a device-level XID error."""
        return {k: s.xid for k, s in self.fresh(now).items() if self.is_unhealthy(s)}

    def device_map(self, state: ClusterState, now: float | None = None) -> dict[tuple[str, int], int]:
        """(node, DCGM ``gpu`` index) -> gpupool device index, for every fresh sample whose GPU gpupool can
        identify; a GPU the node no longer advertises (or one that cannot be identified) is left out.

        gpupool's device indices are the devices the node advertises (``status.allocatable``), so after a
        GPU fails and the device plugin withdraws it, DCGM's index no longer equals gpupool's. Matching:

        1. by identity, when the node publishes its devices' UUIDs (``NodeSpec.gpu_ids``, e.g. HAMi's node
           registration): the sample's ``UUID`` label names the device; a UUID not advertised is not mapped;
        2. else by index, when DCGM reports no more GPUs for the node than it advertises (every GPU is
           advertised, in index / minor-number order, as the NVIDIA device plugin enumerates them);
        3. else (DCGM sees more GPUs than the node advertises: some were withdrawn) nothing is mapped by
           position; :meth:`health_mask` then reasons about the withdrawn devices (see there).
        """
        out: dict[tuple[str, int], int] = {}
        by_node: dict[str, list[GpuSample]] = {}
        for (node, _), sample in self.fresh(now).items():
            by_node.setdefault(node, []).append(sample)
        for node, samples in by_node.items():
            i = state.node_index.get(node)
            if i is None:
                continue
            advertised = int(state.gpu_count[i])
            ids = state.nodes[i].gpu_ids
            if ids:
                index = {u: g for g, u in enumerate(ids)}
                for s in samples:
                    if s.uuid in index:
                        out[(node, s.gpu)] = index[s.uuid]
                    elif not s.uuid and len(samples) <= advertised and s.gpu < advertised:
                        out[(node, s.gpu)] = s.gpu
            elif len(samples) <= advertised:
                for s in samples:
                    if 0 <= s.gpu < advertised:
                        out[(node, s.gpu)] = s.gpu
        return out

    def health_mask(self, state: ClusterState, now: float | None = None) -> np.ndarray:
        """(n_nodes, max_gpus) bool like ``state.gpu_exists``, False where fresh telemetry shows an XID error
        on that device, matched by identity (:meth:`device_map`), never by position in gpupool's list.

        GPUs without fresh data count as healthy; GPUs the state does not have are ignored. On a node where
        DCGM sees ``n`` GPUs but only ``a < n`` are advertised and the GPUs cannot be identified: when at most
        ``n - a`` of them show an error, the withdrawn devices are the failed ones (the device plugin withdraws
        unhealthy devices) and every advertised GPU stays healthy; when more show one, some advertised GPU
        is failed but which one is unknown, so all the node's GPUs are marked unhealthy (never a healthy
        GPU chosen in a failed one's place, never a failed one handed out).
        """
        mask = state.gpu_exists & ~state.gpu_marked  # a GPU its node's agent marked stays unhealthy
        mapping = self.device_map(state, now)
        fresh = self.fresh(now)
        seen: dict[str, int] = {}
        for (node, _) in fresh:
            seen[node] = seen.get(node, 0) + 1
        failed: dict[str, int] = {}
        for (node, gpu) in self.unhealthy(now):
            i = state.node_index.get(node)
            if i is None:
                continue
            g = mapping.get((node, gpu))
            if g is not None:
                if 0 <= g < state.max_gpus:
                    mask[i, g] = False
                continue
            if not state.nodes[i].gpu_ids:
                failed[node] = failed.get(node, 0) + 1
        for node, count in failed.items():
            i = state.node_index[node]
            withdrawn = seen[node] - int(state.gpu_count[i])
            if withdrawn > 0 and count > withdrawn:
                mask[i] = False
                log.warning("failed GPU among the advertised ones cannot be identified; node's GPUs marked unhealthy",
                            extra={"node": node, "failed": count, "withdrawn": withdrawn})
        return mask

    def apply_health(self, state: ClusterState, now: float | None = None) -> list[tuple[str, int, bool]]:
        """Make ``state.gpu_healthy`` follow :meth:`health_mask`; returns the (node, gpu, healthy) changes."""
        mask = self.health_mask(state, now)
        changed = np.argwhere(state.gpu_exists & (mask != state.gpu_healthy))
        out = []
        for i, g in changed:
            state.set_gpu_health(int(i), int(g), bool(mask[i, g]))
            out.append((state.node_names[i], int(g), bool(mask[i, g])))
        return out

    def gpu_load(self, state: ClusterState, now: float | None = None, default: float = np.nan) -> np.ndarray:
        """(n_nodes, max_gpus) float: fresh utilisation 0..1 per GPU, ``default`` where unknown or absent."""
        out = np.full((state.n_nodes, state.max_gpus), default, dtype=np.float64)
        mapping = self.device_map(state, now)
        for (node, gpu), s in self.fresh(now).items():
            i = state.node_index.get(node)
            g = mapping.get((node, gpu))
            if i is not None and g is not None and 0 <= g < state.max_gpus and state.gpu_exists[i, g] \
                    and s.utilization is not None:
                out[i, g] = s.utilization
        return out

    def load(self, state: ClusterState, now: float | None = None, default: float = 0.0) -> np.ndarray:
        """(n_nodes,) float: mean fresh utilisation 0..1 of each node's GPUs that report one; ``default`` for
        nodes with no fresh reading (and CPU-only nodes)."""
        per_gpu = self.gpu_load(state, now)
        known = ~np.isnan(per_gpu)
        count = known.sum(axis=1)
        total = np.where(known, per_gpu, 0.0).sum(axis=1)
        return np.where(count > 0, total / np.maximum(count, 1), default)


# ---------------------------------------------------------------------- sources
def _http_get(url: str, timeout: float, accept: str) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept, "User-Agent": "gpupool-telemetry"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http(s) URLs from config)
        return resp.read()


class DcgmExporterSource:
    """Scrapes dcgm-exporter ``/metrics`` endpoints.

    ``endpoints``: URLs, or ``node=URL`` strings pinning that page to a node name (for exporters whose
    ``Hostname`` label is not the node name). A failing endpoint is logged and skipped; the last error
    of each is kept in ``errors``.
    """

    def __init__(self, endpoints: Iterable[str], timeout: float = 5.0,
                 node_labels: Sequence[str] = NODE_LABELS) -> None:
        self.targets: list[tuple[str | None, str]] = []
        for item in endpoints:
            node, sep, url = item.partition("=")
            if sep and "://" not in node:
                self.targets.append((node.strip(), url.strip()))
            else:
                self.targets.append((None, item.strip()))
        self.timeout = timeout
        self.node_labels = tuple(node_labels)
        self.errors: dict[str, str] = {}

    def collect(self, now: float | None = None) -> list[GpuSample]:
        out: list[GpuSample] = []
        for node, url in self.targets:
            try:
                body = _http_get(url, self.timeout, "text/plain;version=0.0.4")
                out.extend(parse_dcgm_text(body.decode("utf-8", "replace"), node=node, now=now,
                                           node_labels=self.node_labels))
                self.errors.pop(url, None)
            except (OSError, ValueError) as exc:
                self.errors[url] = str(exc)
                log.warning("dcgm-exporter scrape failed", extra={"url": url, "error": str(exc)})
        return out


class PrometheusSource:
    """Reads the DCGM counters from a Prometheus server's HTTP API in one instant query.

    ``selector`` adds label matchers (e.g. ``'job="dcgm-exporter"'``).
    """

    def __init__(self, url: str, timeout: float = 5.0, node_labels: Sequence[str] = NODE_LABELS,
                 selector: str = "") -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.node_labels = tuple(node_labels)
        self.selector = selector
        self.errors: dict[str, str] = {}

    @property
    def query(self) -> str:
        names = "|".join(m.removeprefix("DCGM_FI_DEV_") for m in FIELDS)
        extra = f",{self.selector}" if self.selector else ""
        return f'{{__name__=~"DCGM_FI_DEV_({names})"{extra}}}'

    def collect(self, now: float | None = None) -> list[GpuSample]:
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': self.query})}"
        try:
            payload = json.loads(_http_get(url, self.timeout, "application/json"))
            samples = parse_prometheus_response(payload, node_labels=self.node_labels)
            self.errors.pop(self.url, None)
            return samples
        except (OSError, ValueError) as exc:
            self.errors[self.url] = str(exc)
            log.warning("prometheus query failed", extra={"url": self.url, "error": str(exc)})
            return []


class TelemetryPoller:
    """Polls ``sources`` every ``interval`` seconds into ``telemetry`` on a daemon thread."""

    def __init__(self, telemetry: GpuTelemetry, sources: Sequence[DcgmExporterSource | PrometheusSource],
                 interval: float = 15.0) -> None:
        self.telemetry = telemetry
        self.sources = list(sources)
        self.interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> int:
        kept = 0
        for source in self.sources:
            kept += self.telemetry.update(source.collect(now=self.telemetry.clock()))
        self.telemetry.prune()
        return kept

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception:  # never let a bad page kill the poller
                log.exception("telemetry poll failed")
            self._stop.wait(self.interval)

    def start(self) -> TelemetryPoller:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gpupool-telemetry", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None


__all__ = [
    "APPLICATION_XIDS", "FIELDS", "NODE_LABELS", "DcgmExporterSource", "GpuSample", "GpuTelemetry",
    "PrometheusSource", "TelemetryPoller", "parse_dcgm_text", "parse_prometheus_response",
]
