"""A :class:`~gpupool.agent.backend.GpuBackend` without a GPU: driven by a description, faults injected by tests.

Three ways in:

* :meth:`FakeBackend.from_nvml_recording` reads a recording of NVML answers (the H200 of
  ``../shared/reference/nvml-h200/nvml.json``) and reproduces it exactly: the same devices, MIG profiles and
  readings the real :class:`~gpupool.agent.nvml.NvmlBackend` gives on that machine.
* :meth:`FakeBackend.from_file` (YAML or JSON) / :meth:`FakeBackend.from_dict` read the compact description
  format below, for demos (``examples/agent/dgx-h100.yaml``: 8 x H100 80GB, NVLink all-to-all, one GPU in MIG
  mode) and tests. A file whose top level has ``gpus`` entries with ``cuda_cc`` (an NVML recording) is read as
  a recording.
* :func:`nvml_standin` builds a stand-in ``pynvml`` module that answers from a recording, so the real
  ``NvmlBackend`` code runs on machines without a GPU (tests, ``scripts/gpu-check.sh --dry-run``).

Description format (every key optional except ``gpus``; units as in :mod:`gpupool.agent.backend`)::

    driver: "570.124.06"           # kernel driver version
    cuda_driver: "12.8"            # CUDA version the driver supports ("12.8" or NVML's 12080)
    nvml: "12.570.124.06"
    node: dgx-01                   # seeds the generated UUIDs (default "fake")
    defaults:                      # merged into every GPU entry
      name: NVIDIA H100 80GB HBM3
      memory_mib: 81559
      compute: [9, 0]              # architecture derived from it ("hopper") unless given
      power_limit_w: 700
      mig_profiles:                # what the GPU offers (nvidia-smi mig -lgip)
        - {id: 19, name: 1g.10gb, slices: 1, instances: 7, memory_mib: 9984, sms: 16}
    gpus:
      - count: 4                   # this entry stands for 4 GPUs (indices follow on)
        numa_node: 0
      - index: 4                   # explicit fields: index, uuid, minor, pci_bus_id, numa_node, serial, vbios
        numa_node: 1
        mig:                       # MIG mode and the MIG devices that exist
          enabled: true
          instances:
            - {profile: 3g.40gb, start: 0, size: 4}     # uuid / memory_mib filled in when absent
        sample: {util_gpu: 35, temperature_c: 41}      # any GpuSample field (see below for defaults)
      - index: 5
        lost: true                 # fell off the bus before the agent started: counted, unreadable
    nvlink: all                    # "all" (all-to-all), or groups of indices: [[0, 1, 2, 3], [4, 5, 6, 7]]
    topology:                      # overrides of the generated matrix ((i, j) -> TOPOLOGY_LEVELS)
      - {gpus: [0, 1], level: SINGLE}

Generated values: UUIDs ``GPU-<uuid5(node/index)>``; PCI bus ids ``00000000:<0x18 + 0x10*index>:00.0``; minor =
index; topology NVLINK inside an NVLink group, else NODE on the same NUMA node, else SYSTEM; samples idle
(0 % utilisation, no memory used, 10 % of the power limit, 35 C, no ECC errors, rows remapped (0, 0, 0, 0),
retired pages None, no throttling).

Test hooks: :meth:`~FakeBackend.inject` (an event), :meth:`~FakeBackend.set_sample`, :meth:`~FakeBackend.lose`
(fell off the bus), :meth:`~FakeBackend.reset` (a ``reset`` event; clears loss, volatile ECC counts and pending
row remaps), :meth:`~FakeBackend.set_mig`, :meth:`~FakeBackend.fail_driver` / :meth:`~FakeBackend.heal_driver`.
"""


from __future__ import annotations

from gpupool.agent.backend import ARCHITECTURES, MIB, architecture_from_compute, cuda_version
from gpupool.agent.fake.backend import FakeBackend
from gpupool.agent.fake.pynvml_standin import nvml_standin
from gpupool.agent.fake.recording import device_from_recording, sample_fields_from_recording

__all__ = ["ARCHITECTURES", "MIB", "FakeBackend", "architecture_from_compute", "cuda_version", "device_from_recording",
           "nvml_standin", "sample_fields_from_recording"]
