"""The DRA benchmark's bookkeeping over the real devices: an offline best fit of a stream, and the audit of the
allocations a scheduler wrote into ResourceClaims.

Both read the stream's ResourceSlices with gpupool's own records (``gpupool.k8s.objects.dra.parse_slice``), so
they see the devices, counters and capacities the schedulers see. Whole-GPU equivalents: a full GPU counts 1, a
MIG partition ``Ng.*`` N/7 of its GPU, a share of a GPU's memory its fraction of that memory.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from dra_stream import Ask
from gpupool.k8s.objects.dra import Device, parse_claim, parse_slice

DOMAIN = "gpu.nvidia.com"


def kind_of(d: Device) -> str:
    return str(d.attribute("type") or "")


def mig_slices(d: Device) -> int:
    """N of the MIG profile ``Ng.Mgb`` (0 when the device is no MIG partition)."""
    prof = str(d.attribute("profile") or "")
    return int(prof.split("g.", 1)[0]) if kind_of(d) == "mig" and "g." in prof else 0


def gpu_equivalent(d: Device, consumed_memory: Decimal | None = None) -> float:
    """What allocating ``d`` (with ``consumed_memory`` of a shared device) is worth in whole GPUs."""
    if kind_of(d) == "mig":
        return mig_slices(d) / 7
    if d.allow_multiple:
        cap = d.capacity_of("memory") or Decimal(1)
        used = cap if consumed_memory is None else consumed_memory
        return float(used / cap)
    return 1.0


@dataclass
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    devices: list[Device] = field(default_factory=list)
    counters: dict[str, dict[str, Decimal]] = field(default_factory=dict)  # free amounts per counter set
    taken: set[str] = field(default_factory=set)  # exclusive devices allocated
    mem_used: dict[str, Decimal] = field(default_factory=dict)  # shared devices: memory consumed

    def fits_counters(self, d: Device) -> bool:
        return all(self.counters.get(s, {}).get(k, Decimal(-1)) >= v for s, used in d.consumes
                   for k, v in used.items())

    def free(self, d: Device) -> bool:
        return d.name not in self.taken and self.fits_counters(d) and not self.mem_used.get(d.name)

    def take(self, d: Device, memory: Decimal | None = None) -> None:
        for s, used in d.consumes:
            for k, v in used.items():
                self.counters[s][k] -= v
        if memory is None:
            self.taken.add(d.name)
        else:
            self.mem_used[d.name] = self.mem_used.get(d.name, Decimal(0)) + memory

    def free_gpus(self) -> float:
        """Whole-GPU equivalents left: per counter set its free memory slices / all; free plain GPUs; the
        free memory share of shared GPUs."""
        total = 0.0
        for free in self.counters.values():
            slices = [k for k in free if k.startswith("memory-slice-")]
            total += sum(1 for k in slices if free[k] > 0) / max(1, len(slices))
        for d in self.devices:
            if not d.consumes and kind_of(d) == "gpu":
                if d.allow_multiple:
                    cap = d.capacity_of("memory") or Decimal(1)
                    total += float((cap - self.mem_used.get(d.name, Decimal(0))) / cap)
                elif d.name not in self.taken:
                    total += 1.0
        return total


def _cpu_milli(q: str) -> int:
    return int(Decimal(q[:-1])) if q.endswith("m") else int(Decimal(q) * 1000)


def _mib(q: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 ** 2}
    for u, f in units.items():
        if q.endswith(u):
            return int(Decimal(q[:-2]) * Decimal(str(f)))
    return int(Decimal(q)) >> 20


def inventory(nodes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> dict[str, Node]:
    """Node name -> :class:`Node` with its allocatable CPU/memory (``kcp.sim/allocatable``) and devices."""
    import json

    out: dict[str, Node] = {}
    for n in nodes:
        alloc = json.loads(n["metadata"]["annotations"]["kcp.sim/allocatable"])
        out[n["metadata"]["name"]] = Node(n["metadata"]["name"], _cpu_milli(alloc["cpu"]), _mib(alloc["memory"]))
    for obj in slices:
        s = parse_slice(obj)
        node = out[s.node or ""]
        node.devices.extend(s.devices)
        for cs in s.counter_sets:
            node.counters[cs.name] = dict(cs.counters)
    return out


def _candidates(node: Node, ask: Ask) -> list[tuple[Device, Decimal | None]] | None:
    """The devices ``ask`` would take on ``node`` (best fit inside the node), None if it does not fit."""
    if node.cpu_milli < ask.cpu_milli or node.memory_mib < ask.memory_mib:
        return None
    if ask.kind == "gpu":
        free = [d for d in node.devices if kind_of(d) == "gpu" and node.free(d)]
        return [(d, None) for d in free[:ask.count]] if len(free) >= ask.count else None
    if ask.kind == "mig":
        options = [d for d in node.devices
                   if kind_of(d) == "mig" and d.attribute("profile") in ask.profiles and node.free(d)]
        if not options:
            return None

        def used_slices(d: Device) -> int:
            free = node.counters[d.consumes[0][0]]
            return sum(1 for k, v in free.items() if k.startswith("memory-slice-") and v <= 0)

        # the most used GPU first, then the highest placement start (keeps the low blocks whole for 3g/4g/7g)
        best = min(options, key=lambda d: (-used_slices(d), -int(d.name.rsplit("-", 1)[1]), d.name))
        return [(best, None)]
    want = Decimal(ask.memory_share_mib) * (1 << 20)
    options = []
    for d in node.devices:
        if kind_of(d) == "gpu" and d.allow_multiple and d.attribute("productName") in ask.products \
                and d.name not in node.taken:
            left = (d.capacity_of("memory") or Decimal(0)) - node.mem_used.get(d.name, Decimal(0))
            if left >= want:
                options.append((left, d.name, d))
    if not options:
        return None
    return [(min(options)[2], want)]


def best_fit(asks: list[Ask], nodes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]]) -> dict:
    """Place each ask in order on the node and devices that leave the least free (whole-GPU equivalents, then
    CPU); report the GPUs allocated when the first ask fits nowhere and at the end."""
    inv = inventory(nodes, slices)
    allocated = 0.0
    first_fail: dict | None = None
    placed = failed = 0
    for i, ask in enumerate(asks):
        best = None
        for node in inv.values():
            take = _candidates(node, ask)
            if take is None:
                continue
            gain = sum(gpu_equivalent(d, m) for d, m in take)
            key = (node.free_gpus() - gain, node.cpu_milli - ask.cpu_milli, node.name)
            if best is None or key < best[0]:
                best = (key, node, take, gain)
        if best is None:
            failed += 1
            if first_fail is None:
                first_fail = {"index": i, "pod": ask.pod, "ask": ask.template, "gpus_allocated": round(allocated, 3)}
            continue
        _, node, take, gain = best
        node.cpu_milli -= ask.cpu_milli
        node.memory_mib -= ask.memory_mib
        for d, m in take:
            node.take(d, m)
        allocated += gain
        placed += 1
    return {"placed": placed, "failed": failed, "first_failure": first_fail,
            "gpus_at_first_failure": first_fail["gpus_allocated"] if first_fail else round(allocated, 3),
            "gpus_at_end": round(allocated, 3)}


def audit(slices: Iterable[Mapping[str, Any]], claims: Iterable[Mapping[str, Any]]) -> dict:
    """What the claims' ``status.allocation`` hold: whole-GPU equivalents per claim and in all, and every
    over-allocation: an exclusive device in two claims, a counter set overdrawn, a shared device's memory
    over its capacity, a result naming no published device."""
    devices: dict[tuple[str, str, str], Device] = {}
    counter_sets: dict[tuple[str, str], dict[str, Decimal]] = {}
    for obj in slices:
        s = parse_slice(obj)
        for d in s.devices:
            devices[d.key] = d
        for cs in s.counter_sets:
            counter_sets[(s.pool, cs.name)] = dict(cs.counters)
    holders: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    drawn: dict[tuple[str, str], dict[str, Decimal]] = defaultdict(lambda: defaultdict(Decimal))
    mem: dict[tuple[str, str, str], Decimal] = defaultdict(Decimal)
    per_claim: dict[str, float] = {}
    problems: list[str] = []
    for obj in claims:
        c = parse_claim(obj)
        if not c.allocated:
            continue
        total = 0.0
        for r in c.allocated:
            d = devices.get(r.key)
            if d is None:
                problems.append(f"{c.key}: {r.key} is not a published device")
                continue
            consumed = r.consumed.get("memory", r.consumed.get(f"{d.driver}/memory")) if d.allow_multiple else None
            if d.allow_multiple:
                consumed = consumed if consumed is not None else d.capacity_of("memory")
                mem[r.key] += consumed or Decimal(0)
            holders[r.key].append(c.key)
            for set_name, used in d.consumes:
                for k, v in used.items():
                    drawn[(d.pool, set_name)][k] += v
            total += gpu_equivalent(d, consumed)
        per_claim[c.key] = total
    for key, who in holders.items():
        d = devices[key]
        if not d.allow_multiple and len(who) > 1:
            problems.append(f"{'/'.join(key)} allocated to {len(who)} claims: {', '.join(sorted(who))}")
    for key, used in mem.items():
        cap = devices[key].capacity_of("memory") or Decimal(0)
        if used > cap:
            problems.append(f"{'/'.join(key)}: {used} bytes of memory allocated, capacity {cap}")
    for key, used in drawn.items():
        have = counter_sets.get(key, {})
        over = {k: (v, have.get(k)) for k, v in used.items() if have.get(k) is None or v > have[k]}
        if over:
            problems.append(f"counter set {'/'.join(key)} overdrawn: " + ", ".join(
                f"{k} {v} > {h}" for k, (v, h) in sorted(over.items())))
    return {"claims_allocated": len(per_claim), "gpus_allocated": round(sum(per_claim.values()), 3),
            "per_claim": per_claim, "over_allocations": problems}
