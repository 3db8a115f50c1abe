"""The node agent's Prometheus endpoint: per-GPU readings under NVIDIA dcgm-exporter's names.

gpupool's scheduler telemetry (:mod:`gpupool.k8s.telemetry`, ``DcgmExporterSource``) scrapes dcgm-exporter pages;
this exporter prints the same series from the agent's NVML samples, so the scheduler works on clusters without
DCGM (point ``DcgmExporterSource`` at ``http://<node>:9400/metrics``, dcgm-exporter's port).

Series (every one a gauge, one per GPU; a reading NVML does not support is left out):

======================================  ========  =================================================================
name                                    unit      source (:class:`~gpupool.agent.backend.GpuSample` / health)
======================================  ========  =================================================================
``DCGM_FI_DEV_GPU_UTIL``                %         ``util_gpu``
``DCGM_FI_DEV_MEM_COPY_UTIL``           %         ``util_memory`` (memory controller busy)
``DCGM_FI_DEV_FB_USED``                 MiB       ``memory_used_mib``
``DCGM_FI_DEV_FB_FREE``                 MiB       ``memory_free_mib``
``DCGM_FI_DEV_POWER_USAGE``             W         ``power_w``
``DCGM_FI_DEV_GPU_TEMP``                C         ``temperature_c``
``DCGM_FI_DEV_XID_ERRORS``              XID       the last XID of the GPU (0 = none, cleared by a reset): the health
                                                  tracker's ``GpuHealth.xid``, or the XID passed in
``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``       count     ``ecc_volatile_uncorrected`` (double-bit, since the driver loaded)
``gpupool_agent_gpu_healthy``           1/0       the health tracker's verdict (else: no device-level XID, not lost)
``gpupool_agent_last_update_seconds``   s         when :meth:`GpuExporter.update` last ran (seconds since the epoch)
``gpupool_agent_pod_resources_up``      1/0       the kubelet's PodResources socket answered the last ``List`` (0:
                                                  missing or failing); absent when the agent does not read it
======================================  ========  =================================================================

Labels as dcgm-exporter has them: ``gpu`` (NVML index), ``UUID``, ``pci_bus_id``, ``device`` (``nvidia<minor>``),
``modelName``, ``Hostname`` (the node name: ``NODE_NAME``, as the NVIDIA chart sets it, else the host name), and
``DCGM_FI_DRIVER_VERSION`` when known. dcgm-exporter types ``ECC_DBE_VOL_TOTAL`` as a counter without the
``_total`` suffix, which ``prometheus_client`` cannot print; it is a gauge here (same name, same value).

Sources: dcgm-exporter ``etc/default-counters.csv`` (names, units, help texts) and its label set;
:mod:`gpupool.k8s.telemetry` (what the scheduler parses: ``gpu``, ``UUID``, ``Hostname``, ``modelName``).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpupool.agent.backend import GpuDevice, GpuSample
from gpupool.catalog import APPLICATION_XIDS
from gpupool.k8s.objects.agent_report import GpuHealth

__all__ = ["DEFAULT_PORT", "LABELS", "METRICS", "AgentExporter", "GpuExporter", "serve"]

DEFAULT_PORT = 9400
"""dcgm-exporter's port."""

LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
"""dcgm-exporter's per-GPU labels (``DCGM_FI_DRIVER_VERSION`` is added when known); ``prometheus_client`` prints
them sorted by name, which no reader depends on."""

METRICS: tuple[tuple[str, str, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "util_gpu"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", "util_memory"),
    ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", "memory_free_mib"),
    ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", "memory_used_mib"),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "power_w"),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "temperature_c"),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", "ecc_volatile_uncorrected"),
)
"""(dcgm-exporter name, its help text, :class:`GpuSample` field)."""

XID_METRIC = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
HEALTHY_METRIC = ("gpupool_agent_gpu_healthy", "1 while the gpupool agent considers the GPU healthy, 0 otherwise.")
POD_RESOURCES_METRIC = ("gpupool_agent_pod_resources_up",
                        "1 when the kubelet's PodResources socket answered the agent's last List, 0 when it is "
                        "missing or failed.")
UPDATED_METRIC = ("gpupool_agent_last_update_seconds",
                  "When the gpupool agent last refreshed its GPU readings (seconds since the epoch).")


@dataclass(frozen=True, slots=True)
class _Row:
    labels: tuple[str, ...]
    sample: GpuSample
    xid: int
    healthy: bool


def _hostname() -> str:
    return os.environ.get("NODE_NAME") or socket.gethostname()


class GpuExporter(Collector):
    """A ``prometheus_client`` collector holding a snapshot of the last readings, refreshed by the agent loop
    (:meth:`update`); scrapes read the snapshot and never touch the driver.

    ``hostname``: the ``Hostname`` label (default ``NODE_NAME``, else the host name); ``driver_version``: the
    ``DCGM_FI_DRIVER_VERSION`` label ("" = left out); ``registry``: where to register (a new
    ``CollectorRegistry`` by default, never the global one); ``max_age_s``: a snapshot older than this is not
    served (a stalled agent reads as "no data", not as stale readings; None = always served); ``clock``:
    ``time.time``.

    ``registry`` and :attr:`ready` make it usable with :class:`gpupool.k8s.metrics.MetricsServer` (see :func:`serve`).
    """

    def __init__(self, hostname: str | None = None, *, driver_version: str = "",
                 registry: CollectorRegistry | None = None, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.hostname = hostname if hostname is not None else _hostname()
        self.driver_version = driver_version
        self.max_age_s = max_age_s
        self.clock = clock
        self.registry = registry if registry is not None else CollectorRegistry()
        self._lock = threading.Lock()
        self._rows: list[_Row] = []
        self._devices: dict[str, GpuDevice] = {}
        self._updated: float | None = None
        self._pod_resources_up: bool | None = None
        self._label_names: list[str] = list(LABELS)
        self.registry.register(self)

    # ------------------------------------------------------------------ writing
    def update(self, samples: Sequence[GpuSample],
               health: Mapping[str, GpuHealth | int] | None = None,
               devices: Sequence[GpuDevice] | None = None, *, discovery: Any = None,
               driver: Any = None, pod_resources_up: bool | None = None) -> None:
        """Replace the snapshot.

        ``samples``: one :class:`GpuSample` per GPU (``backend.sample()``); ``health``: by UUID, either the health
        tracker's :class:`~gpupool.k8s.objects.agent_report.GpuHealth` (its ``xid`` and ``healthy`` are printed)
        or the last XID as an int (healthy = no XID, or an application XID); None/absent: XID 0, healthy unless the
        sample is ``lost``. ``devices``: the discovered GPUs, for ``pci_bus_id``, ``device`` and ``modelName`` (kept
        from the last call when None). A GPU in ``samples`` but not in ``devices`` is labelled ``nvidia<index>``.
        ``discovery`` (its ``devices``, when ``devices`` is None) and ``driver`` (a ``DriverInfo``: sets the
        ``DCGM_FI_DRIVER_VERSION`` label when the exporter was made without one) are what the agent loop offers;
        ``pod_resources_up``: whether the kubelet's PodResources socket answered (None: not read, no series).
        """
        health = health or {}
        if devices is None and discovery is not None:
            devices = discovery.get("devices") if isinstance(discovery, Mapping) else getattr(discovery, "devices",
                                                                                              None)
        with self._lock:
            if driver is not None and not self.driver_version:
                self.driver_version = str(getattr(driver, "driver", "") or "")
            self._label_names = list(LABELS) + (["DCGM_FI_DRIVER_VERSION"] if self.driver_version else [])
            if devices is not None:
                self._devices = {d.uuid: d for d in devices}
            rows = []
            for s in sorted(samples, key=lambda s: s.index):
                dev = self._devices.get(s.uuid)
                h = health.get(s.uuid)
                if isinstance(h, GpuHealth):
                    xid, healthy = int(h.xid), bool(h.healthy)
                else:
                    xid = int(h or 0)
                    healthy = xid == 0 or xid in APPLICATION_XIDS
                healthy = healthy and not s.lost
                minor = dev.minor if dev is not None and dev.minor >= 0 else s.index
                labels = (str(s.index), s.uuid, dev.pci_bus_id if dev else "", f"nvidia{minor}",
                          dev.name if dev else "", self.hostname)
                if self.driver_version:
                    labels += (self.driver_version,)
                rows.append(_Row(labels, s, xid, healthy))
            self._rows = rows
            self._pod_resources_up = pod_resources_up
            self._updated = self.clock()

    @property
    def ready(self) -> bool:
        """True once :meth:`update` has run (``/readyz`` of :class:`~gpupool.k8s.metrics.MetricsServer`)."""
        return self._updated is not None

    def set_ready(self, ready: bool = True) -> None:  # MetricsServer's interface; readiness follows update()
        pass

    # ------------------------------------------------------------------ reading
    def describe(self) -> list[Metric]:
        return []  # names are fixed, but the registry need not check them: nothing else registers here

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows, updated, label_names = list(self._rows), self._updated, self._label_names
            pod_resources_up = self._pod_resources_up
        if updated is not None:
            yield GaugeMetricFamily(*UPDATED_METRIC, value=updated)
        if pod_resources_up is not None:
            yield GaugeMetricFamily(*POD_RESOURCES_METRIC, value=1.0 if pod_resources_up else 0.0)
        if updated is None or (self.max_age_s is not None and self.clock() - updated > self.max_age_s):
            return
        for name, help_text, attr in METRICS:
            family = GaugeMetricFamily(name, help_text, labels=label_names)
            for row in rows:
                value = None if row.sample.lost else getattr(row.sample, attr)
                if value is not None:
                    family.add_metric(row.labels, float(value))
            yield family
        xid = GaugeMetricFamily(*XID_METRIC, labels=label_names)
        healthy = GaugeMetricFamily(*HEALTHY_METRIC, labels=label_names)
        for row in rows:
            xid.add_metric(row.labels, float(row.xid))
            healthy.add_metric(row.labels, 1.0 if row.healthy else 0.0)
        yield xid
        yield healthy

    def serve(self, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
              liveness: Callable[[], bool] | None = None) -> Any:
        """:func:`serve` this exporter; returns the started server."""
        return serve(self, host, port, liveness)

    def text(self) -> str:
        """The page a scrape gets (Prometheus text format 0.0.4)."""
        return generate_latest(self.registry).decode()


def serve(exporter: GpuExporter, host: str = "0.0.0.0", port: int = DEFAULT_PORT,
          liveness: Callable[[], bool] | None = None) -> Any:
    """Serve ``/metrics`` (the exporter's registry), ``/healthz`` (``liveness``, e.g. "the agent loop ran
    recently") and ``/readyz`` (the first :meth:`GpuExporter.update` ran) on a daemon thread, with gpupool's
    :class:`~gpupool.k8s.metrics.MetricsServer`; ``port=0`` picks a free port (``server.port``). Returns the
    started server (``stop()`` ends it)."""
    from gpupool.k8s.metrics import MetricsServer

    return MetricsServer(exporter, host=host, port=port, liveness=liveness).start()  # type: ignore[arg-type]


AgentExporter = GpuExporter
"""The name :mod:`gpupool.agent.cli` looks up (``AgentExporter()``, then ``.serve(host, port)``)."""
