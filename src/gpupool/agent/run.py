"""The node agent's loop: discover, then every interval sample -> health -> validation -> report -> publish.

:class:`Agent` ties the parts together; each is injected, so the loop runs on the
:class:`~gpupool.agent.fake.FakeBackend` with a :class:`FakeClock` in tests:

* at start (and again after a ``reset`` event or when a GPU's MIG mode / MIG devices changed) it runs
  discovery (``discover(backend)``, :mod:`gpupool.agent.discovery`) and reads the cluster's RuntimeClasses;
* each round: ``backend.sample()`` and the events gathered since the last round go to
  ``tracker.observe(samples, events) -> {uuid: GpuHealth}`` (:mod:`gpupool.agent.health`; the events with
  no samples when the sample failed: they are never dropped); after each discovery the tracker's
  ``set_devices(devices)`` (where it has one) tells it the node's GPUs; the Node is read
  once (``publisher.refresh()``) for its allocatable; the validator (:mod:`gpupool.agent.validate`) checks the
  stack; the :class:`~gpupool.k8s.objects.agent_report.NodeReport` (GFD labels + ``gpupool.io/gpu-stack-ready``, the
  inventory annotation, conditions ``GpuHealthy`` and ``GpuStackReady``) is built and published; the metrics
  exporter (:mod:`gpupool.agent.exporter`) is updated; when a PodResources reader is given
  (:class:`~gpupool.agent.podresources.PodResourcesReader`), the kubelet's pod -> GPU map is read each round and
  published as ``gpupool.io/pod-devices`` (a missing socket: no map, the annotation removed; a failed call: the
  last map kept);
* between rounds the driver's events are polled with a short timeout (``event_poll_s``, 1 s): an XID, an ECC
  double-bit error or a reset starts a round at once, so an unhealthy GPU is marked within about
  ``event_poll_s`` plus one publish;
* :meth:`Agent.stop` (the CLI calls it on SIGTERM / SIGINT) ends the loop within ``event_poll_s``; the
  backend is closed.

Nothing a round does may end the loop: a failed sample publishes ``GpuHealthy=Unknown`` (reason
``DriverUnavailable``), a failed publish is retried next round, any other error is logged and counted
(:attr:`Agent.errors`).
"""

from __future__ import annotations

import inspect
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpupool.agent.backend import BackendError, GpuBackend, GpuEvent
from gpupool.k8s.objects.agent_report import (
    COND_GPU_HEALTHY,
    COND_STACK_READY,
    LABEL_STACK_READY,
    Condition,
    GpuHealth,
    NodeReport,
    read_inventory,
)

__all__ = ["Agent", "FakeClock", "SystemClock", "call_with", "report_json"]

log = logging.getLogger("gpupool.agent")

URGENT_EVENTS = frozenset({"xid", "ecc_dbe", "reset"})


class SystemClock:
    """Wall time (``now``, epoch seconds), a monotonic clock (seconds) and ``sleep`` (seconds)."""

    real = True

    @staticmethod
    def now() -> float:
        return time.time()

    @staticmethod
    def monotonic() -> float:
        return time.monotonic()

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(max(0.0, seconds))


class FakeClock:
    """A clock for tests: time moves only when something sleeps (``sleep`` / :meth:`advance`), by the amount
    asked. ``start``: the epoch seconds it begins at."""

    real = False

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self.t = float(start)
        self.sleeps: list[float] = []

    def now(self) -> float:
        return self.t

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.t += max(0.0, seconds)

    advance = sleep


def call_with(fn: Callable[..., Any], *args: Any, **available: Any) -> Any:
    """``fn(*args, **kw)`` with ``kw`` the entries of ``available`` that ``fn`` accepts by name (all of them
    when it takes ``**kwargs``): the loop offers everything it knows; a part takes what it needs."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **available)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **available)
    positional = [p for p in params.values()
                  if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    taken = {p.name for p in positional[:len(args)]}
    return fn(*args, **{k: v for k, v in available.items() if k in params and k not in taken})


def report_json(report: NodeReport) -> dict[str, Any]:
    """The report as a JSON-ready dict (``--dry-run`` prints it): labels, inventory, pod devices (None: no map),
    conditions."""
    return {"labels": dict(sorted(report.labels.items())), "inventory": report.inventory,
            "podDevices": report.pod_devices,
            "conditions": [{"type": c.type, "status": c.status, "reason": c.reason, "message": c.message}
                           for c in report.conditions]}


def _default_discover(backend: GpuBackend) -> Any:
    from gpupool.agent.discovery import discover

    return discover(backend)


def _default_labels(discovery: Any, mig_strategy: str) -> dict[str, str]:
    from gpupool.agent.discovery import gfd_labels

    return gfd_labels(discovery, mig_strategy)


def _default_inventory(discovery: Any, health: Mapping[str, GpuHealth], now: float) -> dict[str, Any]:
    from gpupool.agent.discovery import inventory_doc

    return inventory_doc(discovery, health, now)


def _default_health_condition(health: Mapping[str, GpuHealth]) -> Condition:
    from gpupool.agent.health import condition

    return condition(health)


def _mig_signature(devices: Iterable[Any]) -> tuple:
    """What makes a rediscovery necessary: per GPU, its MIG mode and the MIG devices that exist."""
    return tuple(sorted((d.uuid, bool(d.mig_enabled), tuple((m.profile, m.start, m.size) for m in d.mig_instances))
                        for d in devices))


class Agent:
    """One node's agent loop.

    ``backend``: a :class:`~gpupool.agent.backend.GpuBackend`; ``publisher``: a
    :class:`~gpupool.agent.publisher.NodePublisher` or None (dry run: build reports, write nothing);
    ``tracker``: has ``observe(samples, events) -> {uuid: GpuHealth}``; ``validator``: None, or a callable
    returning a result with ``.condition()`` (a :class:`Condition`) and ``.label()`` (the
    ``gpupool.io/gpu-stack-ready`` value, or a dict of labels); it is called through :func:`call_with` with
    ``backend``, ``discovery``, ``allocatable`` (the Node's, a dict; None when unknown), ``runtime_classes``
    (RuntimeClass objects; None when unknown), ``health``, ``node``; ``exporter``: None, or an object whose
    ``update`` is called the same way with ``discovery``, ``samples``, ``health``, ``events``, ``stack``, ``driver``;
    ``interval_s``: seconds between rounds; ``clock``: :class:`SystemClock` (default) or :class:`FakeClock`.

    ``discover`` / ``labels`` / ``inventory`` / ``health_condition``: the discovery functions (default:
    :mod:`gpupool.agent.discovery`'s ``discover``, ``gfd_labels``, ``inventory_doc`` and
    :mod:`gpupool.agent.health`'s ``condition``). ``pod_resources``: None, or an object whose ``read()`` returns a
    :class:`~gpupool.agent.podresources.PodResourcesRead` (the kubelet's pod -> device IDs map).
    """

    def __init__(self, backend: GpuBackend, publisher: Any, tracker: Any, validator: Any = None,
                 exporter: Any = None, interval_s: float = 10.0, clock: Any = None, *, mig_strategy: str = "mixed",
                 event_poll_s: float = 1.0,
                 discover: Callable[[GpuBackend], Any] | None = None,
                 labels: Callable[[Any, str], dict[str, str]] | None = None,
                 inventory: Callable[[Any, Mapping[str, GpuHealth], float], dict[str, Any]] | None = None,
                 health_condition: Callable[[Mapping[str, GpuHealth]], Condition] | None = None,
                 pod_resources: Any = None) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval {interval_s!r}: must be > 0 seconds")
        self.backend, self.publisher, self.tracker = backend, publisher, tracker
        self.validator, self.exporter = validator, exporter
        self.interval_s = float(interval_s)
        self.event_poll_s = max(0.01, min(float(event_poll_s), self.interval_s))
        self.clock = clock or SystemClock()
        self.mig_strategy = mig_strategy
        self._discover = discover or _default_discover
        self._labels = labels or _default_labels
        self._inventory = inventory or _default_inventory
        self._health_condition = health_condition or _default_health_condition
        self.discovery: Any = None
        self.driver: Any = None
        self.runtime_classes: list[Any] | None = None
        self.last_round_at: float | None = None  # clock.monotonic() of the last round that finished
        self.health: dict[str, GpuHealth] = {}
        self.stack: Any = None
        self.last_report: NodeReport | None = None
        self.known_gpus: list[dict[str, Any]] = []  # GPU entries of the last inventory (the Node's, then ours)
        self.pod_resources = pod_resources
        self.pod_devices: dict[str, list[str]] | None = None  # namespace/name -> GPU UUIDs, as the kubelet put them
        self.pod_resources_up: bool | None = None  # the last PodResources read answered (None: not read)
        self._node_inventory_read = False
        self.rounds = 0
        self.discoveries = 0
        self.published = 0
        self.errors = 0
        self._mig: tuple = ()
        self._pending: list[GpuEvent] = []
        self._stop = threading.Event()

    # ------------------------------------------------------------------ parts of a round
    def discover(self) -> Any:
        """Run discovery now (raises :class:`BackendError` when the driver cannot be read)."""
        self.discovery = self._discover(self.backend)
        devices = getattr(self.discovery, "devices", None)
        if devices is None:
            devices = self.backend.devices()
        self._mig = _mig_signature(devices)
        set_devices = getattr(self.tracker, "set_devices", None)
        if set_devices is not None:  # events for a UUID not on this node are then ignored
            set_devices(devices)
        try:
            self.driver = self.backend.driver()
        except BackendError:
            self.driver = None
        self.runtime_classes = self._read_runtime_classes()
        self.discoveries += 1
        log.info("discovered %d GPU(s)", len(devices))
        return self.discovery

    def _read_runtime_classes(self) -> list[Any] | None:
        reader = getattr(self.publisher, "runtime_classes", None)
        if reader is None:
            return None
        try:
            return reader()
        except Exception as exc:  # noqa: BLE001 - validation reports "unknown" instead
            log.warning("cannot list RuntimeClasses: %s", exc)
            return None

    def _mig_changed(self) -> bool:
        try:
            return _mig_signature(self.backend.devices()) != self._mig
        except BackendError:
            return False

    def round(self, events: Iterable[GpuEvent] = ()) -> NodeReport:
        """One round now with ``events`` (and those polled since the last round); returns the report built
        (also :attr:`last_report`). Raises only what discovery raises when nothing was discovered yet."""
        events = self._pending + list(events)
        self._pending = []
        if self.discovery is None:
            self.discover()
        now = self.clock.now()
        samples: list[Any] | None
        driver_error = ""
        try:
            samples = self.backend.sample()
        except BackendError as exc:
            samples, driver_error = None, str(exc)
            log.warning("sample failed: %s", exc)
        # events are observed even when the sample failed: an XID that came with a failing NVML (a GPU
        # falling off the bus often answers Unknown first) keeps the GPU marked until a reset
        try:
            self.health = dict(self.tracker.observe(samples if samples is not None else [], events))
        except Exception as exc:  # noqa: BLE001
            self.errors += 1
            log.exception("health tracking failed: %s", exc)
        if any(e.kind == "reset" for e in events) or (samples is not None and self._mig_changed()):
            try:
                self.discover()
            except BackendError as exc:
                log.warning("rediscovery failed: %s", exc)

        self._read_pod_resources()
        node = self.publisher.refresh() if self.publisher is not None else None
        if node is not None and not self._node_inventory_read:  # what the agent before this one published
            self._node_inventory_read = True
            doc = read_inventory(((node.get("metadata") or {}).get("annotations")) or {})
            if doc is not None and not self.known_gpus:
                self.known_gpus = [dict(g) for g in doc["gpus"] if isinstance(g, Mapping)]
        if node is not None and self.runtime_classes is None:  # the list failed at discovery: try again
            self.runtime_classes = self._read_runtime_classes()
        allocatable = self.publisher.allocatable(node) if node is not None else None
        self.stack = None
        if self.validator is not None:
            try:
                self.stack = call_with(self.validator, backend=self.backend, discovery=self.discovery,
                                       allocatable=allocatable, runtime_classes=self.runtime_classes,
                                       health=self.health, node=node)
            except Exception as exc:  # noqa: BLE001 - the rest of the report still goes out
                self.errors += 1
                log.exception("stack validation failed: %s", exc)

        report = self.build_report(now, driver_error)
        self.last_report = report
        if self.exporter is not None:
            try:
                update = getattr(self.exporter, "update", self.exporter)
                call_with(update, discovery=self.discovery, samples=samples or [], health=self.health,
                          events=events, stack=self.stack, driver=self.driver,
                          pod_resources_up=self.pod_resources_up)
            except Exception as exc:  # noqa: BLE001
                self.errors += 1
                log.exception("metrics update failed: %s", exc)
        # node None: the Node could not be read (logged by the publisher); the next round tries again
        if self.publisher is not None and node is not None and self.publisher.publish(report, node):
            self.published += 1
        self.rounds += 1
        self.last_round_at = self.clock.monotonic()
        return report

    def _read_pod_resources(self) -> None:
        """Read the kubelet's pod -> GPU map (when a reader is given): resolved to GPU UUIDs on ``ok``, dropped
        when the socket is ``missing`` (the map would go stale), kept as it was on an ``error``."""
        if self.pod_resources is None:
            return
        from gpupool.agent.podresources import resolve_pods

        try:
            got = self.pod_resources.read()
            self.pod_resources_up = bool(got.up)
            if got.up:
                devices = getattr(self.discovery, "devices", None)
                if devices is None:
                    devices = self.backend.devices()
                self.pod_devices = resolve_pods(got.pods, devices)
            elif got.status == "missing":
                self.pod_devices = None
        except Exception as exc:  # noqa: BLE001 - the rest of the report still goes out
            self.errors += 1
            self.pod_resources_up = False
            log.exception("reading the kubelet's PodResources failed: %s", exc)

    def alive(self, max_age_s: float | None = None) -> bool:
        """Liveness (the metrics server's ``/healthz``): a round finished within ``max_age_s`` seconds
        (default: three intervals plus 30 s); True before the first round (discovery may take a while)."""
        if self.last_round_at is None:
            return True
        limit = max_age_s if max_age_s is not None else 3 * self.interval_s + 30.0
        return self.clock.monotonic() - self.last_round_at <= limit

    def build_report(self, now: float, driver_error: str = "") -> NodeReport:
        """The :class:`NodeReport` of the current discovery, health and stack result at ``now``.

        The inventory names every GPU the node had: one the driver counts but cannot read (lost before the
        agent started) and one the last inventory (:attr:`known_gpus`) named that the driver no longer
        counts are listed unhealthy (:func:`gpupool.agent.discovery.remember_lost`), and ``GpuHealthy`` names
        them too."""
        from gpupool.agent.discovery import inventory_faults, remember_lost

        labels = dict(self._labels(self.discovery, self.mig_strategy))
        inventory = self._inventory(self.discovery, self.health, now)
        health: Mapping[str, GpuHealth] = self.health
        if isinstance(inventory, Mapping) and isinstance(inventory.get("gpus"), list):
            inventory = remember_lost(inventory, self.known_gpus)
            self.known_gpus = [dict(g) for g in inventory["gpus"]]
            health = inventory_faults(inventory, self.health)
        conditions: list[Condition] = []
        if driver_error:
            conditions.append(Condition(COND_GPU_HEALTHY, "Unknown", "DriverUnavailable",
                                        f"NVML cannot be read: {driver_error}. Check that the NVIDIA driver is "
                                        "loaded (nvidia-smi on the node) and the agent's runtime class."))
        else:
            conditions.append(self._health_condition(health))
        if self.stack is not None:
            lab = self.stack.label()
            if isinstance(lab, Mapping):
                labels.update({str(k): str(v) for k, v in lab.items()})
            elif lab is not None:
                labels[LABEL_STACK_READY] = str(lab).lower() if isinstance(lab, bool) else str(lab)
            cond = self.stack.condition()
            if cond is not None:
                conditions.append(cond)
        conditions = [c for c in conditions if c.type in (COND_GPU_HEALTHY, COND_STACK_READY)] + \
            [c for c in conditions if c.type not in (COND_GPU_HEALTHY, COND_STACK_READY)]
        pod_devices = None
        if self.pod_devices is not None:
            from gpupool.agent.publisher import rfc3339
            from gpupool.k8s.objects.agent_report import pod_devices_doc

            pod_devices = pod_devices_doc(self.pod_devices, rfc3339(now))
        return NodeReport(labels=labels, inventory=inventory, conditions=conditions, pod_devices=pod_devices)

    # ------------------------------------------------------------------ the loop
    def poll_events(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for driver events; True when one that needs a round at once came
        (kept for the next :meth:`round`). Sleeps the rest of ``timeout_s`` through the clock when the backend
        answered early with nothing (a fake backend that does not block)."""
        t0 = self.clock.monotonic()
        real = getattr(self.clock, "real", True)
        try:
            events = self.backend.events(timeout_s if real else 0.0)  # a fake clock never waits for real
        except BackendError as exc:
            log.warning("event poll failed: %s", exc)
            events = []
        if events:
            self._pending.extend(events)
            for e in events:
                log.warning("gpu event %s %s code=%s %s", e.uuid, e.kind, e.code, e.detail)
            return any(e.kind in URGENT_EVENTS for e in events)
        left = timeout_s - (self.clock.monotonic() - t0)
        if left > timeout_s * 0.5:
            self._sleep(left)
        return False

    def _sleep(self, seconds: float) -> None:
        if getattr(self.clock, "real", True):
            self._stop.wait(seconds)
        else:
            self.clock.sleep(seconds)

    def _safe_round(self) -> None:
        try:
            self.round()
        except Exception as exc:  # noqa: BLE001 - the loop never ends on an error
            self.errors += 1
            log.exception("round failed: %s", exc)

    def run(self, max_rounds: int | None = None) -> None:
        """Discover (raising :class:`BackendError` when the driver cannot be read), then loop until
        :meth:`stop` (or ``max_rounds`` rounds, for tests). Closes the backend at the end."""
        try:
            if self.discovery is None:
                self.discover()
            self._safe_round()
            next_round = self.clock.monotonic() + self.interval_s
            while not self._stop.is_set() and (max_rounds is None or self.rounds < max_rounds):
                left = next_round - self.clock.monotonic()
                if left <= 0:
                    self._safe_round()
                    next_round = self.clock.monotonic() + self.interval_s
                    continue
                if self.poll_events(min(self.event_poll_s, left)) and not self._stop.is_set():
                    self._safe_round()  # an XID / ECC / reset: published now, the interval goes on
        finally:
            try:
                self.backend.close()
            except Exception:  # noqa: BLE001
                pass

    def stop(self) -> None:
        """Ask the loop to end (thread- and signal-safe); it ends within ``event_poll_s``."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()
