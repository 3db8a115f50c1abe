"""An openb-shaped stream of pods with ResourceClaims on a mixed DRA cluster, as Kubernetes manifests.

    python benchmarks/dra_stream.py [--seed 42] [--scheduler-name default-scheduler] [--load 1.3]
                                    [--claims template|direct] [--format yaml|json] [--out FILE]

Cluster (20 nodes, 160 GPUs, slices as NVIDIA's DRA driver for GPUs publishes them, gpupool.k8s.objects.
dra_nvidia): 6 DGX H100 and 6 DGX H200 with DynamicMIG (full GPUs and every MIG partition, shared counters), 4
A100-SXM4-80GB with DynamicMIG and MIG mode on (partitions only, as on Ampere), 4 L40S with consumable shares
(``--consumable-shares=memory``: a GPU shared by memory). Each node has openb's commonest 8-GPU node shape:
96 CPUs, 384 GiB.

Pods: drawn with a seeded RNG, with replacement, from the GPU pods (``num_gpu`` >= 1: counts 1/2/4/8 and
``gpu_milli`` shares) of openb's ``multigpu50`` pod list (sampled by openb from its default list so that 2/4/8-GPU
pods make half of the GPU demand; ``--trace`` picks another) until their demand reaches ``--load`` x 160 GPUs,
in that fixed order; CPU and memory requests are the trace's. A whole-GPU ask of N becomes a request for N
devices of class ``gpu.nvidia.com``; a share f < 1 becomes, with probability 0.8 (seeded), a MIG partition of class
``mig.nvidia.com`` with the fewest compute slices g in {1,2,3,4,7} with g/7 >= f and a selector on the profile
names of that size on the cluster's GPUs (``1g.10gb``/``1g.18gb``...), else a share of an L40S's memory
(``capacity.requests.memory`` = ceil(f x 46068 Mi)). Each pod's ask is also written as JSON in its annotation
``bench.gpupool.io/ask`` (for the harness's metrics and the offline best fit).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import random
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from _common import OPENB_TRACES
from gpupool.k8s.objects import dra_nvidia as nv

NAMESPACE = "dra-bench"
ASK_ANNOTATION = "bench.gpupool.io/ask"
CLUSTER: tuple[tuple[str, int, dict], ...] = (
    ("dgx-h100", 6, {}), ("dgx-h200", 6, {}), ("a100-80gb", 4, {}), ("l40s", 4, {"consumable_shares": "memory"}))
MIG_SIZES = (1, 2, 3, 4, 7)
MIG_SHARE = 0.8  # share of fractional asks that become MIG partitions (the rest: L40S memory shares)
PODS_PER_NODE = "110"
DEFAULT_TRACE = OPENB_TRACES / "openb_pod_list_multigpu50.csv"


@dataclass(frozen=True)
class Ask:
    """What one pod asks for, in the stream's own terms (the manifests say the same in DRA's)."""

    pod: str
    cpu_milli: int
    memory_mib: int
    kind: str  # "gpu" (whole GPUs), "mig" (a MIG partition), "shared" (memory of a shared GPU)
    template: str
    count: int = 1  # whole GPUs
    compute_slices: int = 0  # MIG: g of "Ng.*"
    profiles: tuple[str, ...] = ()  # MIG: the profile names that fit
    memory_share_mib: int = 0  # shared: memory requested on the device
    products: tuple[str, ...] = ()  # shared: productName the selector allows
    gpu_milli: int = 1000  # the trace's value

    @property
    def gpus(self) -> float:
        """Whole-GPU equivalents: N, g/7 of a MIG GPU, or the memory share of the shared GPU."""
        if self.kind == "gpu":
            return float(self.count)
        if self.kind == "mig":
            return self.compute_slices / 7
        return self.memory_share_mib / (nv.MODELS["NVIDIA L40S"].memory_bytes >> 20)


@dataclass
class Stream:
    seed: int
    nodes: list[dict] = field(default_factory=list)
    slices: list[dict] = field(default_factory=list)
    classes: list[dict] = field(default_factory=list)
    templates: list[dict] = field(default_factory=list)
    claims: list[dict] = field(default_factory=list)
    pods: list[dict] = field(default_factory=list)
    asks: list[Ask] = field(default_factory=list)

    def items(self) -> list[dict]:
        """Every object, in the order to create them."""
        ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        return [ns, *self.classes, *self.nodes, *self.slices, *self.templates, *self.claims, *self.pods]

    @property
    def capacity_gpus(self) -> int:
        return sum(nv.PRESETS[p].gpus * n for p, n, _ in CLUSTER)


def node_manifest(name: str, preset: nv.NodePreset) -> dict:
    """A Node that kubelet-sim makes Ready, its allocatable from the ``kcp.sim/allocatable`` annotation."""
    alloc = {"cpu": preset.cpu, "memory": preset.memory, "pods": PODS_PER_NODE}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name, "bench.gpupool.io/preset": preset.name},
        "annotations": {"kcp.sim/allocatable": json.dumps(alloc, sort_keys=True)}}}


def mig_profiles_by_size() -> dict[int, tuple[str, ...]]:
    """g -> the names of the g-slice profiles (one memory-slice run per g, no +me variant) on the cluster."""
    out: dict[int, set[str]] = {g: set() for g in MIG_SIZES}
    for preset, _, over in CLUSTER:
        p = nv.PRESETS[preset]
        model = nv.MODELS[p.product]
        if not (over.get("dynamic_mig", p.dynamic_mig) and model.mig_capable):
            continue
        for prof in model.mig_profiles:
            if prof.profile_id in (19, 14, 9, 5, 0):
                out[prof.compute_slices].add(nv.mig_profile_name(prof, model.memory_bytes))
    return {g: tuple(sorted(v)) for g, v in out.items()}


def read_trace(path: Path) -> list[dict]:
    """The GPU pods of an openb pod list: cpu_milli, memory_mib, num_gpu, gpu_milli (ints)."""
    rows = []
    with path.open(newline="") as f:
        for i, r in enumerate(csv.DictReader(f)):
            try:
                row = {k: int(r[k]) for k in ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")}
            except (KeyError, TypeError, ValueError):
                raise ValueError(f"{path}: row {i + 2}: cpu_milli/memory_mib/num_gpu/gpu_milli not integers") from None
            if row["num_gpu"] >= 1:
                rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no pod with num_gpu >= 1")
    return rows


def _template(name: str, request: dict) -> dict:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}}}}


def ask_request(ask: Ask) -> dict:
    """The claim's ``exactly`` request for ``ask``."""
    if ask.kind == "gpu":
        return {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": ask.count}
    if ask.kind == "mig":
        names = ", ".join(f"'{p}'" for p in ask.profiles)
        return {"deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1, "selectors": [
            {"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile in [{names}]"}}]}
    products = ", ".join(f"'{p}'" for p in ask.products)
    return {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1,
            "selectors": [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].productName in [{products}]"}}],
            "capacity": {"requests": {"memory": f"{ask.memory_share_mib}Mi"}}}


def build(seed: int = 42, scheduler_name: str = "default-scheduler", load: float = 1.3,
          claims: str = "template", trace: Path | None = None) -> Stream:
    """The cluster and the pod stream for ``seed`` (deterministic: same arguments, same objects)."""
    if claims not in ("template", "direct"):
        raise ValueError(f"claims {claims!r}: not template or direct")
    if not load > 0:
        raise ValueError(f"load {load}: must be > 0")
    rng = random.Random(seed)
    st = Stream(seed=seed, classes=nv.nvidia_device_classes(compute_domains=False))
    for preset, n, over in CLUSTER:
        p = nv.PRESETS[preset]
        for i in range(n):
            name = f"{preset}-{i}"
            st.nodes.append(node_manifest(name, p))
            st.slices.extend(nv.preset_slices(preset, name, **over))
    rows = read_trace(trace or DEFAULT_TRACE)
    by_size = mig_profiles_by_size()
    l40s_mib = nv.MODELS["NVIDIA L40S"].memory_bytes >> 20
    templates: dict[str, dict] = {}
    demand = 0.0
    while demand < load * st.capacity_gpus:
        r = rows[rng.randrange(len(rows))]
        name = f"p-{len(st.asks):05d}"
        base = {"pod": name, "cpu_milli": r["cpu_milli"], "memory_mib": r["memory_mib"], "gpu_milli": r["gpu_milli"]}
        if r["num_gpu"] > 1 or r["gpu_milli"] >= 1000:
            ask = Ask(**base, kind="gpu", count=r["num_gpu"], template=f"gpu-{r['num_gpu']}")
        elif rng.random() < MIG_SHARE:
            g = next(s for s in MIG_SIZES if s * 1000 >= 7 * r["gpu_milli"])
            ask = Ask(**base, kind="mig", compute_slices=g, profiles=by_size[g], template=f"mig-{g}g")
        else:
            mib = math.ceil(r["gpu_milli"] * l40s_mib / 1000)
            ask = Ask(**base, kind="shared", memory_share_mib=mib, products=("NVIDIA L40S",),
                      template=f"shared-{mib}mi")
        demand += ask.gpus
        st.asks.append(ask)
        if claims == "template":
            templates.setdefault(ask.template, _template(ask.template, ask_request(ask)))
            source = {"name": "gpu", "resourceClaimTemplateName": ask.template}
        else:
            st.claims.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                              "metadata": {"name": name, "namespace": NAMESPACE},
                              "spec": {"devices": {"requests": [{"name": "gpu", "exactly": ask_request(ask)}]}}})
            source = {"name": "gpu", "resourceClaimName": name}
        st.pods.append({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": name, "namespace": NAMESPACE,
            "annotations": {ASK_ANNOTATION: json.dumps(asdict(ask), sort_keys=True)}},
            "spec": {"schedulerName": scheduler_name, "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [source],
                     "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10", "resources": {
                         "requests": {"cpu": f"{ask.cpu_milli}m", "memory": f"{ask.memory_mib}Mi"},
                         "claims": [{"name": "gpu"}]}}]}})
    st.templates = [templates[k] for k in sorted(templates)]
    return st


def ask_of(pod: dict) -> Ask:
    """The :class:`Ask` a stream pod carries in its annotation (ValueError naming the pod if absent or bad)."""
    meta = pod.get("metadata") or {}
    try:
        d = json.loads((meta.get("annotations") or {})[ASK_ANNOTATION])
        d["profiles"], d["products"] = tuple(d.get("profiles") or ()), tuple(d.get("products") or ())
        return Ask(**d)
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"Pod {meta.get('namespace')}/{meta.get('name')}: annotation {ASK_ANNOTATION}: {e}") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--scheduler-name", default="default-scheduler", help="the pods' spec.schedulerName")
    ap.add_argument("--load", type=float, default=1.3, help="GPU demand of the stream / the cluster's GPUs")
    ap.add_argument("--claims", choices=("template", "direct"), default="template",
                    help="a ResourceClaimTemplate per request shape, or a ResourceClaim per pod")
    ap.add_argument("--trace", type=Path, default=None, help="openb pod list (default: openb_pod_list_multigpu50.csv)")
    ap.add_argument("--format", choices=("yaml", "json"), default="yaml")
    ap.add_argument("--out", type=Path, default=None, help="output file (default: stdout)")
    args = ap.parse_args(argv)
    if not args.load > 0:
        ap.error(f"argument --load: {args.load} is not > 0")
    try:
        st = build(args.seed, args.scheduler_name, args.load, args.claims, args.trace)
    except (OSError, ValueError) as e:
        print(f"dra_stream.py: {e}", file=sys.stderr)
        return 1
    doc = {"apiVersion": "v1", "kind": "List", "items": st.items()}
    if args.format == "json":
        text = json.dumps(doc, indent=1, sort_keys=True)
    else:
        import yaml

        text = yaml.safe_dump(doc, sort_keys=True)
    if args.out:
        args.out.write_text(text)
        print(f"{len(st.nodes)} nodes, {len(st.slices)} slices, {len(st.pods)} pods "
              f"({sum(a.gpus for a in st.asks):.1f} GPUs asked of {st.capacity_gpus}) -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
