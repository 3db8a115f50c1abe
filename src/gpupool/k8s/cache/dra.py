"""The Dynamic Resource Allocation side of the cluster cache: ResourceSlices, DeviceClasses and ResourceClaims as
typed records (parsed once per object version), which pools are complete, and which devices, shared capacity and
counters the allocated (and assumed) claims hold.

Semantics follow Kubernetes 1.36 (``k8s.io/dynamic-resource-allocation/structured``):

* a pool (driver, pool name) is used only when complete: every slice of its newest ``generation`` is present
  (``resourceSliceCount`` of them); slices of older generations are ignored;
* a device without ``allowMultipleAllocations`` is held by at most one claim; a device with it is shared up to
  its capacity (each allocation consumes ``consumedCapacity``);
* a partitionable device draws ``consumesCounters`` from its pool's ``sharedCounters`` while it is allocated;
* results with ``adminAccess`` hold nothing.

Imports ``objects`` only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from gpupool.k8s.objects.dra import (
    AllocatedDevice,
    Claim,
    Device,
    DeviceClass,
    RequestParseError,
    Slice,
    parse_claim,
    parse_device_class,
    parse_slice,
)
from gpupool.k8s.objects.fields import meta_of

log = logging.getLogger("gpupool.k8s.dra")

RESOURCE_SLICES = "resourceslices"
DEVICE_CLASSES = "deviceclasses"
RESOURCE_CLAIMS = "resourceclaims"
DRA_KINDS = (RESOURCE_SLICES, DEVICE_CLASSES, RESOURCE_CLAIMS)

DeviceKey = tuple[str, str, str]  # (driver, pool, device)
CounterKey = tuple[str, str, str]  # (driver, pool, counter set)


@dataclass
class Usage:
    """What allocations hold: exclusive devices, consumed capacity of shared devices, consumed counters.

    Copy it (:meth:`copy`) to try allocations without changing the books.
    """

    exclusive: set[DeviceKey] = field(default_factory=set)
    shared: dict[DeviceKey, dict[str, Decimal]] = field(default_factory=dict)  # qualified capacity -> consumed
    shares: dict[DeviceKey, int] = field(default_factory=dict)  # allocations of a shared device
    counters: dict[CounterKey, dict[str, Decimal]] = field(default_factory=dict)

    def copy(self) -> Usage:
        return Usage(set(self.exclusive), {k: dict(v) for k, v in self.shared.items()}, dict(self.shares),
                     {k: dict(v) for k, v in self.counters.items()})

    def restore(self, saved: Usage) -> None:
        """Back to ``saved`` (a :meth:`copy` taken earlier)."""
        self.exclusive, self.shared, self.shares, self.counters = saved.exclusive, saved.shared, saved.shares, \
            saved.counters

    def add(self, device: Device | None, result: AllocatedDevice, sign: int = 1) -> None:
        """Book (``sign`` 1) or release (-1) one allocation result; ``device`` None: a device no slice has now
        (still held by its claim: kept exclusive by key)."""
        if result.admin_access:
            return
        key = result.key
        multiple = device is not None and device.allow_multiple
        if multiple:
            before = self.shares.get(key, 0)
            self.shares[key] = before + sign
            cons = self.shared.setdefault(key, {})
            for name, amount in result.consumed.items():
                if "/" not in name:  # written as the device names it: an unqualified name is its driver's
                    name = f"{device.driver}/{name}"
                cons[name] = cons.get(name, Decimal(0)) + sign * amount
            if self.shares[key] <= 0:
                self.shares.pop(key, None)
                self.shared.pop(key, None)
            first_or_last = (before == 0) if sign > 0 else (self.shares.get(key, 0) == 0)
        else:
            if sign > 0:
                self.exclusive.add(key)
            else:
                self.exclusive.discard(key)
            first_or_last = True
        if device is not None and first_or_last:
            for cs, amounts in device.consumes:
                used = self.counters.setdefault((device.driver, device.pool, cs), {})
                for c, v in amounts.items():
                    used[c] = used.get(c, Decimal(0)) + sign * v


class DraInventory:
    """ResourceSlices, DeviceClasses and ResourceClaims as the watches report them, with the devices they hold.

    ``apply``/``replace`` take watch events and relists as :class:`~gpupool.k8s.cache.model.ClusterModel` does
    (kinds :data:`DRA_KINDS`). An object gpupool cannot read is left out and its error kept in ``errors``
    (one bad slice or claim never blocks the others). ``assumed`` holds the allocations this scheduler wrote (or is
    writing) and the watch has not shown yet: they hold their devices like allocated claims.
    """

    def __init__(self) -> None:
        self.slices: dict[str, Slice] = {}
        self.classes: dict[str, DeviceClass] = {}
        self.claims: dict[str, Claim] = {}
        self.errors: dict[str, str] = {}
        self.assumed: dict[str, tuple[tuple[AllocatedDevice, ...], str]] = {}  # claim key -> (results, node)
        self.version = 0  # bumped on every change
        self.devices_version = 0  # bumped when slices or classes change (not claims)
        self._rv: dict[tuple[str, str], str] = {}
        self._devices: tuple[int, dict[DeviceKey, Device], dict[str, list[Device]], dict[CounterKey, dict[str, Decimal]]
                             ] | None = None
        self._usage: tuple[int, Usage] | None = None
        self.full_memory: dict[DeviceKey, Decimal] = {}  # a partitionable device -> its whole GPU's memory

    # -- feeding
    def apply(self, kind: str, event_type: str, obj: Mapping[str, Any]) -> None:
        if event_type not in ("ADDED", "MODIFIED", "DELETED"):
            return
        meta = meta_of(obj)
        name = str(meta.get("name", ""))
        key = f"{meta.get('namespace')}/{name}" if kind == RESOURCE_CLAIMS else name
        rv = str(meta.get("resourceVersion", ""))
        self.version += 1
        if kind != RESOURCE_CLAIMS:
            self.devices_version += 1
        store: dict[str, Any] = {RESOURCE_SLICES: self.slices, DEVICE_CLASSES: self.classes,
                                 RESOURCE_CLAIMS: self.claims}[kind]
        if event_type == "DELETED":
            store.pop(key, None)
            self.errors.pop(f"{kind}/{key}", None)
            self._rv.pop((kind, key), None)
            if kind == RESOURCE_CLAIMS:
                self.assumed.pop(key, None)
            return
        if rv and self._rv.get((kind, key)) == rv:
            return
        if kind == RESOURCE_CLAIMS and _older(rv, self._rv.get((kind, key))):
            # an event older than what this cache holds (the scheduler's own write was fed in ahead of its
            # watch event): applying it would show an allocated claim as free again. kube-scheduler's assume
            # cache compares resourceVersions the same way.
            return
        parse = {RESOURCE_SLICES: parse_slice, DEVICE_CLASSES: parse_device_class, RESOURCE_CLAIMS: parse_claim}[kind]
        try:
            rec = parse(obj)
        except (RequestParseError, ValueError, TypeError, AttributeError) as exc:
            store.pop(key, None)
            why = str(exc)
            if self.errors.get(f"{kind}/{key}") != why:
                log.warning("%s", why, extra={"event": "dra_object_unreadable", "kind": kind, "object": key})
            self.errors[f"{kind}/{key}"] = why
            return
        self.errors.pop(f"{kind}/{key}", None)
        self._rv[(kind, key)] = rv
        store[key] = rec
        if kind == RESOURCE_CLAIMS:
            self._settle_assumed(rec)

    def replace(self, kind: str, items: Sequence[Mapping[str, Any]] | None) -> None:
        store: dict[str, Any] = {RESOURCE_SLICES: self.slices, DEVICE_CLASSES: self.classes,
                                 RESOURCE_CLAIMS: self.claims}[kind]
        self.version += 1
        if kind != RESOURCE_CLAIMS:
            self.devices_version += 1
        if items is None:
            store.clear()
            return
        keep = set()
        for obj in items:
            meta = meta_of(obj)
            name = str(meta.get("name", ""))
            key = f"{meta.get('namespace')}/{name}" if kind == RESOURCE_CLAIMS else name
            keep.add(key)
            self.apply(kind, "MODIFIED", obj)
        for key in [k for k in store if k not in keep]:
            store.pop(key, None)
            self._rv.pop((kind, key), None)
        for ek in [e for e in self.errors if e.startswith(kind + "/") and e.split("/", 1)[1] not in keep]:
            del self.errors[ek]
        if kind == RESOURCE_CLAIMS:
            for key in [k for k in self.assumed if k not in keep]:
                del self.assumed[key]

    def _settle_assumed(self, claim: Claim) -> None:
        """The watch shows ``claim``: an assumed allocation it now carries is no longer assumed."""
        if claim.key in self.assumed and claim.allocated is not None:
            del self.assumed[claim.key]

    # -- assume / forget (the live scheduler's allocations in flight)
    def assume(self, claim_key: str, results: Sequence[AllocatedDevice], node: str) -> None:
        self.assumed[claim_key] = (tuple(results), node)
        self.version += 1

    def forget(self, claim_key: str) -> None:
        if self.assumed.pop(claim_key, None) is not None:
            self.version += 1

    # -- read-outs
    def _index(self) -> tuple[dict[DeviceKey, Device], dict[str, list[Device]], dict[CounterKey, dict[str, Decimal]]]:
        if self._devices is not None and self._devices[0] == self.devices_version:
            return self._devices[1], self._devices[2], self._devices[3]
        pools: dict[tuple[str, str], list[Slice]] = {}
        for s in self.slices.values():
            pools.setdefault((s.driver, s.pool), []).append(s)
        devices: dict[DeviceKey, Device] = {}
        by_node: dict[str, list[Device]] = {}
        counters: dict[CounterKey, dict[str, Decimal]] = {}
        for (driver, pool), slices in sorted(pools.items()):
            newest = max(s.generation for s in slices)
            current = [s for s in slices if s.generation == newest]
            if len(current) != current[0].slice_count:
                continue  # incomplete: the driver is still publishing it
            for s in sorted(current, key=lambda s: s.name):
                for cs in s.counter_sets:
                    counters[(driver, pool, cs.name)] = dict(cs.counters)
                for d in s.devices:
                    devices[d.key] = d
                    if d.node:
                        by_node.setdefault(d.node, []).append(d)
                    else:
                        by_node.setdefault("", []).append(d)  # allNodes / nodeSelector devices
        full: dict[CounterKey, Decimal] = {}
        for d in devices.values():
            mem = memory_of(d)
            for cs, _ in d.consumes:
                k = (d.driver, d.pool, cs)
                if mem is not None and mem > full.get(k, Decimal(0)):
                    full[k] = mem
        self.full_memory = {d.key: max(full.get((d.driver, d.pool, cs), Decimal(0)) for cs, _ in d.consumes)
                            for d in devices.values() if d.consumes}
        self._devices = (self.devices_version, devices, by_node, counters)
        return devices, by_node, counters

    def devices(self) -> dict[DeviceKey, Device]:
        """Every usable device (complete pools only), by (driver, pool, name)."""
        return self._index()[0]

    def node_devices(self, node: str) -> list[Device]:
        """Devices local to ``node`` (slice or device ``nodeName``), in slice order."""
        return self._index()[1].get(node, [])

    def cluster_devices(self) -> list[Device]:
        """Devices not bound to one node name (``allNodes`` or a ``nodeSelector``)."""
        return self._index()[1].get("", [])

    def counter_totals(self) -> dict[CounterKey, dict[str, Decimal]]:
        return self._index()[2]

    def allocations(self) -> Iterable[tuple[str, tuple[AllocatedDevice, ...], str | None]]:
        """(claim key, results, node) of every allocated or assumed claim."""
        for key, claim in self.claims.items():
            if key in self.assumed:
                continue
            if claim.allocated is not None:
                yield key, claim.allocated, claim.allocated_node
        for key, (results, node) in self.assumed.items():
            yield key, results, node

    def usage(self) -> Usage:
        """What every allocated or assumed claim holds (a fresh copy: callers may change it)."""
        if self._usage is not None and self._usage[0] == self.version:
            return self._usage[1].copy()
        devices = self.devices()
        u = Usage()
        for _, results, _ in self.allocations():
            for r in results:
                u.add(devices.get(r.key), r)
        self._usage = (self.version, u)
        return u.copy()

    def gpu_equivalents(self, results: Iterable[AllocatedDevice]) -> float:
        """Whole-GPU equivalents held by ``results``: a device's memory over its full GPU's (a MIG partition's
        fraction, a memory share's fraction), 1.0 where that is unknown."""
        devices = self.devices()
        total = 0.0
        for r in results:
            d = devices.get(r.key)
            total += device_value(d, r, self.full_memory.get(r.key) or None) if d is not None else 1.0
        return total


def _older(rv: str, held: str | None) -> bool:
    """Whether resourceVersion ``rv`` is older than ``held`` (both etcd revisions; False when either is not a
    number)."""
    try:
        return held is not None and int(rv) < int(held)
    except ValueError:
        return False


def memory_of(device: Device) -> Decimal | None:
    """The device's ``memory`` capacity in its driver's domain (bytes), None when it publishes none."""
    return device.capacity.get(device.driver, {}).get("memory")


def device_value(device: Device, result: AllocatedDevice | None = None, full_memory: Decimal | None = None) -> float:
    """Whole-GPU equivalents of a device, or of one share of it (``result`` of a shared device): its memory over
    ``full_memory`` (the memory of the whole GPU it is part of; None: the device counts as one GPU), a share's
    consumed memory over the device's."""
    mem = memory_of(device)
    if result is not None and device.allow_multiple and mem:
        used = result.consumed.get("memory", result.consumed.get(f"{device.driver}/memory"))
        if used is not None:
            return min(1.0, float(used / mem))
    if full_memory and mem:
        return min(1.0, float(mem / full_memory))
    return 1.0
