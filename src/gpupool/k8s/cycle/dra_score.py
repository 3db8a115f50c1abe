"""gpupool's choice among the devices a claim could take (the allocator's scores, :mod:`gpupool.k8s.cycle.dra`):
flexibility of a GPU (the kinds of request it can still serve), fragmentation (the free share of a GPU that no
single free device could take any more), the fullest shared device, and the free whole-GPU equivalents of a node
for best fit. No I/O; memoised per GPU model and usage so that equal GPUs across nodes cost one evaluation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from gpupool.k8s.cache.dra import CounterKey, DraInventory, Usage, device_value
from gpupool.k8s.objects.dra import Device


class FragmentationScores:
    """Mixed into :class:`~gpupool.k8s.cycle.dra.DraAllocator` (which supplies ``_matches`` and
    ``_counters_fit``)."""

    inv: DraInventory
    _members: tuple[int, dict[CounterKey, tuple[int, list[Device]]]] | None
    _strand_cache: dict[tuple, Any]
    _kind_cache: dict[tuple, tuple[Device, frozenset[str]]]

    def _matches(self, selectors: tuple[str, ...], d: Device) -> tuple[bool, str | None]:
        raise NotImplementedError

    @staticmethod
    def _counters_fit(d: Device, u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]],
                      plus: Device | None = None) -> bool:
        raise NotImplementedError

    def _set_members(self) -> dict[CounterKey, tuple[int, list[Device]]]:
        """Counter set -> (shape id, the devices drawing on it); sets of one GPU model share a shape id."""
        if self._members is not None and self._members[0] == self.inv.devices_version:
            return self._members[1]
        members: dict[CounterKey, list[Device]] = {}
        for d in self.inv.devices().values():
            for cs, _ in d.consumes:
                members.setdefault((d.driver, d.pool, cs), []).append(d)
        shapes: dict[tuple, int] = {}
        out: dict[CounterKey, tuple[int, list[Device]]] = {}
        for ck, devs in members.items():
            shape = tuple(sorted((tuple(sorted((cs == ck[2], tuple(sorted(a.items()))) for cs, a in e.consumes)),
                                  e.allow_multiple) for e in devs))
            out[ck] = (shapes.setdefault(shape, len(shapes)), devs)
        self._members = (self.inv.devices_version, out)
        self._strand_cache.clear()
        return out

    def _stranded(self, ck: CounterKey, devs: Sequence[Device], u: Usage,
                  totals: Mapping[CounterKey, Mapping[str, Decimal]], plus: Device | None) -> float:
        """Free share of a GPU (counter set) that no free device of it could take whole: its free fraction less
        the largest device still allocatable (``plus`` taken first, if given)."""
        total = totals.get(ck) or {}
        used = u.counters.get(ck, {})
        extra = dict(next((a for cs, a in plus.consumes if cs == ck[2]), {})) if plus is not None else {}
        names = ["memory"] if "memory" in total else list(total)
        fractions = [1 - float((used.get(n, Decimal(0)) + extra.get(n, Decimal(0))) / total[n])
                     for n in names if total.get(n)]
        free = min(fractions) if fractions else 0.0
        if free <= 1e-9:
            return 0.0
        full = self.inv.full_memory
        largest = 0.0
        for e in devs:
            if e is plus or e.key in u.exclusive or u.shares.get(e.key):
                continue
            v = device_value(e, None, full.get(e.key))
            if v > largest and self._counters_fit(e, u, totals, plus=plus):
                largest = v
        return max(0.0, free - largest)

    def _loss(self, d: Device, u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]]) -> float:
        """Fragmentation taking ``d`` adds: on each GPU (counter set) it draws from, the growth of the free share
        that no single free device could take (a MIG partition on an untouched GPU strands what no larger profile
        fits in any more; on a GPU partitioned already it may strand nothing new). A whole device, or a share of
        a shared one, strands nothing. Memoised per GPU model, usage of that GPU and device position, so equal
        GPUs across nodes cost one evaluation."""
        if not d.consumes:
            return 0.0
        members = self._set_members()
        loss = 0.0
        for cs, amounts in d.consumes:
            ck = (d.driver, d.pool, cs)
            shape, devs = members.get(ck, (-1, []))
            state = tuple(sorted(u.counters.get(ck, {}).items()))
            taken = tuple(sorted(e.name.split("-mig-")[-1] for e in devs
                                 if e.key in u.exclusive or u.shares.get(e.key)))
            key = (shape, state, taken, tuple(sorted(amounts.items())), d.allow_multiple)
            hit = self._strand_cache.get(key)
            if hit is None:
                hit = (self._stranded(ck, devs, u, totals, d) - self._stranded(ck, devs, u, totals, None))
                if len(self._strand_cache) > 200_000:
                    self._strand_cache.clear()
                self._strand_cache[key] = hit
            loss += hit
        return loss

    def _kinds(self, d: Device) -> frozenset[str]:
        """The DeviceClasses whose selectors ``d`` matches (an error counts as no match)."""
        key = ("kinds", id(d))
        hit = self._kind_cache.get(key)
        if hit is not None and hit[0] is d:
            return hit[1]
        kinds = frozenset(name for name, cls in self.inv.classes.items() if self._matches(cls.selectors, d)[0])
        self._kind_cache[key] = (d, kinds)
        return kinds

    def _flexibility(self, d: Device, u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]]) -> int:
        """How many kinds of request the GPU of ``d`` can still serve (the DeviceClasses its allocatable devices
        match, plus sharing where a shared device is free): an Ampere GPU in MIG mode serves only MIG requests
        (1), an untouched Hopper GPU whole and MIG requests (2), a GPU partitioned already only MIG (1). Taking a
        device of the least flexible GPU keeps the others for the requests only they can serve."""
        if not d.consumes:
            if d.allow_multiple and u.shares.get(d.key):
                return 1
            return len(self._kinds(d)) + (1 if d.allow_multiple else 0)
        members = self._set_members()
        out: set[str] = set()
        for cs, _ in d.consumes:
            ck = (d.driver, d.pool, cs)
            shape, devs = members.get(ck, (-1, []))
            state = tuple(sorted(u.counters.get(ck, {}).items()))
            key = ("flex", shape, state, len(self.inv.classes))
            hit = self._strand_cache.get(key)
            if hit is None:
                kinds: set[str] = set()
                for e in devs:
                    if e.key in u.exclusive or u.shares.get(e.key) or not self._counters_fit(e, u, totals):
                        continue
                    kinds |= self._kinds(e)
                    if e.allow_multiple:
                        kinds.add("(shared)")
                hit = frozenset(kinds)
                self._strand_cache[key] = hit
            out |= hit
        return len(out)

    @staticmethod
    def _leftover(d: Device, u: Usage, cons: Mapping[str, Decimal] | None) -> float:
        """Fraction of a shared device's capacity left after this share (best fit among shared devices); 0 for
        a device taken whole."""
        if not d.allow_multiple or not cons:
            return 0.0
        used = u.shared.get(d.key, {})
        fractions = [1.0 - f for f in _fractions(d, {q: used.get(q, Decimal(0)) + a for q, a in cons.items()})]
        return min(fractions) if fractions else 0.0

    def free_gpus(self, devices: Sequence[Device], u: Usage, totals: Mapping[CounterKey, Mapping[str, Decimal]]
                  ) -> float:
        """Whole-GPU equivalents still free among ``devices``: per GPU with counters its free memory fraction,
        a shared device its free capacity fraction, an exclusive device 1 if free."""
        free = 0.0
        seen: set[CounterKey] = set()
        for d in devices:
            if d.consumes:
                for cs, _ in d.consumes:
                    ck = (d.driver, d.pool, cs)
                    if ck in seen:
                        continue
                    seen.add(ck)
                    total = totals.get(ck) or {}
                    used = u.counters.get(ck, {})
                    names = ["memory"] if "memory" in total else list(total)
                    fr = [1 - float(used.get(n, Decimal(0)) / total[n]) for n in names if total.get(n)]
                    free += min(fr) if fr else 0.0
            elif d.key in u.exclusive:
                continue
            elif d.allow_multiple and u.shares.get(d.key):
                free += 1.0 - self._used_fraction(d, u)
            else:
                free += 1.0
        return free

    @staticmethod
    def _used_fraction(d: Device, u: Usage) -> float:
        fractions = _fractions(d, u.shared.get(d.key, {}))
        return max(fractions) if fractions else 0.0


def _fractions(d: Device, amounts: Mapping[str, Decimal]) -> list[float]:
    """Each qualified capacity amount as a fraction of the device's capacity (capacities it lacks skipped)."""
    out = []
    for q, amount in amounts.items():
        dom, _, name = q.rpartition("/")
        cap = d.capacity.get(dom, {}).get(name)
        if cap:
            out.append(float(amount / cap))
    return out
