"""Cost of one DRA CEL selector evaluation per device (gpupool.k8s.objects.dra_cel, issue 28).

Method: devices shaped like NVIDIA's gpu.nvidia.com ResourceSlices (a GPU with 11 attributes and its memory
capacity, MIG devices with 8 capacities); each selector compiled once (the cache), then evaluated ``--rounds``
times per device after a warm-up, best of ``--repeat`` runs, in microseconds per evaluation:

* ``prepared``: the device's CEL input already built (:func:`selector_input` keeps it per Device object), as
  for every selector after the first on a device;
* ``first sight``: a new :class:`Device` record each time (copies made beforehand), so the input is built
  from the record and then evaluated: what a device's first selector costs after its slice changed.

Run: ``.venv/bin/python benchmarks/dra_cel_eval.py`` (a few seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import time
from decimal import Decimal

from gpupool.k8s.objects.dra import Device, SemVer
from gpupool.k8s.objects.dra_cel import CelSelectorError, compile_selector, selector_input

NV = "gpu.nvidia.com"
SELECTORS = {
    "gpu class": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "gpu-test4 regex": (
        "device.attributes['gpu.nvidia.com'].productName.lowerAscii().matches('^.*a100.*$') && "
        "(device.attributes['gpu.nvidia.com'].index == 0 || device.attributes['gpu.nvidia.com'].index == 2)"
    ),
    "mig quantities": (
        "device.capacity['gpu.nvidia.com'].multiprocessors.isGreaterThan(quantity('10')) && "
        "device.capacity['gpu.nvidia.com'].memory.isGreaterThan(quantity('10Gi'))"
    ),
    "driver semver": "device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('535.0.0'))",
}


def gpu_device() -> Device:
    attrs = {
        "type": "gpu", "productName": "NVIDIA A100-SXM4-40GB", "index": 2, "minor": 2, "uuid": "GPU-0b1c",
        "architecture": "Ampere", "brand": "Nvidia", "pcieBusID": "0000:07:00.0",
        "driverVersion": SemVer("550.54.15"), "cudaDriverVersion": SemVer("12.4.0"),
        "cudaComputeCapability": SemVer("8.0.0"),
    }
    return Device(NV, "node-a", "gpu-2", "node-a", {NV: attrs}, {NV: {"memory": Decimal(40 * 2**30)}})


def mig_device() -> Device:
    attrs = {"type": "mig", "profile": "2g.20gb", "productName": "NVIDIA A100-SXM4-40GB", "index": 0,
             "parentIndex": 2, "uuid": "MIG-1a2b", "driverVersion": SemVer("550.54.15")}
    caps = {"multiprocessors": 28, "memory": 20 * 2**30, "copyEngines": 2, "decoders": 1, "encoders": 0,
            "jpegEngines": 0, "ofaEngines": 0, "memorySlice0": 1}
    return Device(NV, "node-a", "gpu-2-mig-2g", "node-a", {NV: attrs}, {NV: {k: Decimal(v) for k, v in caps.items()}})


def per_eval_us(fn, rounds: int, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(rounds):
            fn()
        best = min(best, time.perf_counter() - t0)
    return best / rounds * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{'selector':<18} {'device':<5} {'result':<6} {'prepared µs':>12} {'first sight µs':>15}")
    for label, expression in SELECTORS.items():
        sel = compile_selector(expression)
        for kind, device in (("gpu", gpu_device()), ("mig", mig_device())):
            inp = selector_input(device)
            try:
                result = str(sel.matches(inp))
            except CelSelectorError:  # an erring pair is timed too: the allocator pays for it
                result = "error"

            def prepared(sel=sel, inp=inp):
                try:
                    sel.matches(inp)
                except CelSelectorError:
                    pass

            copies = iter([dataclasses.replace(device) for _ in range(args.rounds * (args.repeat + 1) + 1)])

            def fresh(sel=sel, copies=copies):
                try:
                    sel.matches(next(copies))
                except CelSelectorError:
                    pass

            print(f"{label:<18} {kind:<5} {result:<6} {per_eval_us(prepared, args.rounds, args.repeat):>12.1f} "
                  f"{per_eval_us(fresh, args.rounds, args.repeat):>15.1f}")


if __name__ == "__main__":
    main()
