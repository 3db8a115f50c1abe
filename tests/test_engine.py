"""Engine: filters, kube-scheduler-style unschedulable reasons, gpu_spec, health, and the score cache."""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import ALL_POLICIES, cluster, engine, node, occupy, placed, pod
from gpupool.cluster import ClusterState
from gpupool.engine.core import Engine, best_fit_gpus, most_free_gpus
from gpupool.engine.filters import (
    DEFAULT_FILTERS,
    CpuFit,
    EffectiveRequest,
    GpuFit,
    GpuModelMatch,
    MemoryFit,
    feasible,
    gpu_fit_matrix,
    unschedulable_reason,
)
from gpupool.policies import make_policy


def eff(req) -> EffectiveRequest:
    return EffectiveRequest(req, req.gpu_milli)


# ------------------------------------------------------------------------------------------ filters


def filter_cluster() -> ClusterState:
    # n0: 2 cores only; n1: 1 GiB memory only; n2: CPU-only; n3: 2 V100 both full; n4: 2 T4 idle
    s = cluster(
        node("n0", cpu=2000, gpus=4),
        node("n1", mem=1024, gpus=4),
        node("n2"),
        node("n3", gpus=2),
        node("n4", gpus=2, model="T4"),
    )
    occupy(s, 3, [1000, 1000])
    return s


@pytest.mark.parametrize(
    "plugin, req, expected",
    [
        # per node n0..n4, hand-checked against the layout of filter_cluster()
        (CpuFit(), pod("p", cpu=4000), [False, True, True, True, True]),
        (CpuFit(), pod("p", cpu=2000), [True] * 5),  # exactly the free amount fits
        (MemoryFit(), pod("p", mem=2048), [True, False, True, True, True]),
        (GpuModelMatch(), pod("p", gpus=1, spec=["V100M16"]), [True, True, False, True, False]),
        (GpuModelMatch(), pod("p", gpus=1), [True] * 5),  # no spec: every node passes this filter
        (GpuModelMatch(), pod("p", spec=["T4"]), [True] * 5),  # CPU pod: spec is irrelevant
        (GpuFit(), pod("p", gpus=1, milli=500), [True, True, False, False, True]),
        (GpuFit(), pod("p", gpus=3), [True, True, False, False, False]),
        (GpuFit(), pod("p"), [True] * 5),
    ],
)
def test_filter_masks(plugin, req, expected) -> None:
    s = filter_cluster()
    assert plugin.mask(s, eff(req), np.arange(5)).tolist() == expected


def test_gpu_fit_matrix_share_memory_health_and_model() -> None:
    s = cluster(node("n0", gpus=4), node("n1", gpus=2, model="G2"))
    occupy(s, 0, [0, 700, 0, 0])
    s.allocate(pod("big-mem", gpus=1, milli=100, gpu_mem=15000), 0, [2])  # 900 share, 1160 MiB left
    s.set_gpu_health(0, 3, False)
    nodes = np.arange(2)
    # 300 milli proportional = 4848 MiB: GPU0 ok, GPU1 (300 free, 11312 MiB) ok, GPU2 lacks memory,
    # GPU3 unhealthy; opaque G2 GPUs: share fits, memory unknown but proportional -> 0 MiB needed.
    m = gpu_fit_matrix(s, eff(pod("p", gpus=1, milli=300)), nodes)
    assert m.tolist() == [[True, True, False, False], [True, True, False, False]]
    # an explicit memory ask cannot be checked on an opaque model: refused there
    m = gpu_fit_matrix(s, eff(pod("p", gpus=1, milli=300, gpu_mem=1000)), nodes)
    assert m.tolist() == [[True, True, True, False], [False, False, False, False]]
    m = gpu_fit_matrix(s, eff(pod("p", gpus=1, milli=300, spec=["G2"])), nodes)
    assert m.tolist() == [[False] * 4, [True, True, False, False]]


def test_feasible_is_and_of_filters() -> None:
    s = filter_cluster()
    req = eff(pod("p", cpu=4000, mem=2048, gpus=1, milli=500))
    # n0 cpu, n1 memory, n2 no GPU, n3 full; only n4 (T4) passes
    assert feasible(s, req, np.arange(5)).tolist() == [False, False, False, False, True]


UNSCHEDULABLE = [
    # (case, pod, expected message) on filter_cluster(); each node is counted once, under the FIRST
    # filter it fails in the order cpu, memory, model, GPU share.
    (
        "every reason",
        pod("p", cpu=4000, mem=2048, gpus=1, milli=500, spec=["V100M16"]),
        # n0 cpu; n1 memory; n2 (CPU-only) and n4 (T4) model; n3 (full V100) GPU share
        "0/5 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 2 GPU model not in gpu_spec, "
        "1 Insufficient GPU share.",
    ),
    (
        "impossible GPU count",
        pod("p", gpus=16),
        # no node has 16 GPUs; nothing else fails
        "0/5 nodes are available: 5 Insufficient GPU share.",
    ),
    (
        "unknown model",
        pod("p", gpus=1, spec=["H100"]),
        "0/5 nodes are available: 5 GPU model not in gpu_spec, no node has GPU model H100.",
    ),
    (
        "unknown models listed",
        pod("p", gpus=1, milli=200, spec=["H100", "A10"]),
        "0/5 nodes are available: 5 GPU model not in gpu_spec, no node has GPU model H100|A10.",
    ),
]


@pytest.mark.parametrize("case, req, expected", UNSCHEDULABLE, ids=[u[0] for u in UNSCHEDULABLE])
def test_unschedulable_reason(case, req, expected) -> None:
    s = filter_cluster()
    d = engine(s, "best-fit").place(req)
    assert not d.scheduled and d.assignment is None
    assert d.reason == expected
    assert unschedulable_reason(s, eff(req), DEFAULT_FILTERS) == expected
    assert s.assignments.keys() == {"fill-3-0", "fill-3-1"}  # nothing was placed


def test_reason_counts_first_failure_only() -> None:
    s = filter_cluster()
    # 5 GPUs: n0 fails cpu first (and would fail GPUs too), the others fail GPU share
    req = pod("p", cpu=8000, gpus=5)
    assert unschedulable_reason(s, eff(req)) == "0/5 nodes are available: 1 Insufficient cpu, 4 Insufficient GPU share."


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_impossible_requests_do_not_block_others(policy) -> None:
    s = cluster(node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=2, model="T4"))
    eng = engine(s, policy)
    stream = [
        pod("a", cpu=1000, gpus=1),
        pod("huge", gpus=16),
        pod("b", cpu=1000, gpus=1, milli=500),
        pod("h100", gpus=1, spec=["H100"]),
        pod("c", cpu=1000, gpus=2),
        pod("too-much-cpu", cpu=64000),
    ]
    out = {p.name: eng.place(p) for p in stream}
    assert out["huge"].reason == "0/3 nodes are available: 3 Insufficient GPU share."
    assert out["h100"].reason == "0/3 nodes are available: 3 GPU model not in gpu_spec, no node has GPU model H100."
    assert out["too-much-cpu"].reason == "0/3 nodes are available: 3 Insufficient cpu."
    assert all(out[k].scheduled for k in ("a", "b", "c"))
    assert set(s.assignments) == {"a", "b", "c"}
    s.check_invariants()


@pytest.mark.parametrize("policy", ALL_POLICIES)
@pytest.mark.parametrize("spec, allowed", [(("T4",), {"t0", "t1"}), (("V100M16",), {"v0"}),
                                           (("T4", "V100M16"), {"t0", "t1", "v0"})])
def test_gpu_spec_filter(policy, spec, allowed) -> None:
    s = cluster(node("v0", gpus=3), node("t0", gpus=2, model="T4"), node("t1", gpus=1, model="T4"),
                node("g0", gpus=2, model="G2"))
    eng = engine(s, policy)
    for i in range(3):
        d = eng.place(pod(f"p{i}", cpu=100, gpus=1, milli=400, spec=spec))
        name, _ = placed(d)
        assert name in allowed
        assert s.model_names[s.node_model[d.assignment.node]] in spec


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_unhealthy_gpus_never_chosen(policy) -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=4))
    s.set_gpu_health(0, 0, False)
    s.set_gpu_health(1, 1, False)
    s.set_gpu_health(1, 2, False)
    eng = engine(s, policy)
    healthy = {(0, 1), (1, 0), (1, 3)}
    # 0.3-GPU pods: three fit per healthy GPU (k8s-default: one, it takes whole GPUs)
    for i in range(9):
        d = eng.place(pod(f"f{i}", gpus=1, milli=300))
        if d.scheduled:
            assert (d.assignment.node, d.assignment.gpus[0]) in healthy
    for a in s.assignments.values():
        assert all((a.node, g) in healthy for g in a.gpus)
    # a pod asking for 3 whole GPUs never fits: at most 2 healthy GPUs per node
    d = eng.place(pod("three", gpus=3))
    assert not d.scheduled
    # node 1 has 4 GPUs, 2 of them unhealthy: said apart from a node that is merely full
    assert d.reason.endswith("nodes are available: 1 node(s) had unhealthy GPUs, 1 Insufficient GPU share.")
    s.check_invariants()


def test_whole_gpu_pod_skips_unhealthy() -> None:
    for policy in ALL_POLICIES:
        st = cluster(node("n0", gpus=4))
        st.set_gpu_health(0, 0, False)
        st.set_gpu_health(0, 2, False)
        assert placed(engine(st, policy).place(pod("p", gpus=2))) == ("n0", (1, 3)), policy


# ------------------------------------------------------------------------------------- device choice


def test_best_fit_and_most_free_gpus() -> None:
    s = cluster(node("n0", gpus=4))
    occupy(s, 0, [600, 0, 200, 900])  # free: 400, 1000, 800, 100
    r = eff(pod("p", gpus=1, milli=300))
    # fitting GPUs: 0 (400), 1 (1000), 2 (800); GPU 3 has 100 < 300
    assert best_fit_gpus(s, r, 0) == (0,)  # least free that fits
    assert most_free_gpus(s, r, 0) == (1,)
    r2 = eff(pod("p", gpus=2))
    assert most_free_gpus(s, r2, 0) == (1,)  # returns what there is; the filter rejected the node anyway
    with pytest.raises(ValueError, match="cannot host"):
        best_fit_gpus(s, r2, 0)  # only GPU 1 is whole
    s.release("fill-0-2")
    assert best_fit_gpus(s, r2, 0) == (1, 2)  # equal free (1000): lowest index first


# ------------------------------------------------------------------------------------ engine basics


def test_schedule_does_not_change_state() -> None:
    s = cluster(node("n0", gpus=2))
    eng = engine(s, "best-fit")
    d = eng.schedule(pod("p", cpu=1000, gpus=1, milli=500))
    assert d.scheduled and d.reason == ""
    assert s.assignments == {} and s.version.tolist() == [0]
    d2 = eng.place(pod("p", cpu=1000, gpus=1, milli=500))
    assert (d2.assignment.node, d2.assignment.gpus) == (d.assignment.node, d.assignment.gpus)
    assert d2.assignment.gpu_memory_mib == 8080  # place reports the real booking; schedule a preview
    assert eng.release("p") == d2.assignment
    assert s.assignments == {}


def test_cached_mask_sees_release_and_health() -> None:
    s = cluster(node("n0", gpus=1), node("n1", gpus=1))
    eng = engine(s, "best-fit")
    assert placed(eng.place(pod("a", gpus=1)))[0] in {"n0", "n1"}
    assert eng.place(pod("b", gpus=1)).scheduled
    assert not eng.place(pod("c", gpus=1)).scheduled  # mask cached as all-False
    eng.release("a")
    assert eng.place(pod("c", gpus=1)).scheduled  # the released node was re-filtered
    eng.release("b")
    node_b = 1 - s.assignments["c"].node
    s.set_gpu_health(node_b, 0, False)
    d = eng.place(pod("d", gpus=1))
    assert not d.scheduled
    assert d.reason == "0/2 nodes are available: 1 node(s) had unhealthy GPUs, 1 Insufficient GPU share."


def test_small_lru_cache_gives_same_answers() -> None:
    pods = [pod(f"p{i}", cpu=500 * (i % 3), gpus=1, milli=250 * (1 + i % 4)) for i in range(40)]
    results = []
    for size in (1, 512):
        s = cluster(node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=2, model="T4"))
        eng = Engine(s, make_policy("best-fit"), seed=3, cache_size=size)
        results.append([(d.assignment.node, d.assignment.gpus) if d.scheduled else None
                        for d in map(eng.place, pods)])
    assert results[0] == results[1]


# --------------------------------------------------------------------------------- score cache check

CACHE_NODES = [
    node("a", cpu=16000, mem=65536, gpus=4),
    node("b", cpu=32000, mem=32768, gpus=4),
    node("c", cpu=8000, mem=16384, gpus=2, model="T4"),
    node("d", cpu=32000, mem=65536, gpus=8, model="V100M32"),
    node("e", cpu=16000, mem=32768),
]

SHAPES = [
    pod("s", cpu=2000, mem=4096, gpus=1, milli=250),
    pod("s", cpu=4000, mem=8192, gpus=1, milli=500),
    pod("s", cpu=1000, mem=2048, gpus=1, milli=700),
    pod("s", cpu=8000, mem=16384, gpus=1),
    pod("s", cpu=8000, mem=16384, gpus=2),
    pod("s", cpu=4000, mem=4096),
    pod("s", cpu=2000, mem=1024, gpus=1, milli=500, spec=["T4"]),
    pod("s", cpu=1000, mem=1024, gpus=4, spec=["V100M32", "V100M16"]),
]


def _named(shape, name):
    return type(shape)(name, shape.cpu_milli, shape.memory_mib, shape.num_gpu, shape.gpu_milli, shape.gpu_spec,
                       shape.gpu_memory_mib)


def _replay(ops, requests) -> ClusterState:
    """A fresh ClusterState that went through the same allocations, releases and health changes."""
    s = ClusterState(CACHE_NODES)
    for op in ops:
        if op[0] == "alloc":
            a = op[1]
            s.allocate(requests[a.pod], a.node, a.gpus, a.gpu_milli if a.gpus else None)
        elif op[0] == "release":
            s.release(op[1])
        else:
            s.set_gpu_health(*op[1:])
    return s


# fgd, best-fit and gpupool first; then every other policy that keeps no books of its own (round-robin and
# gpu-clustering do, so a fresh engine would not share their history)
CACHED = ("fgd", "best-fit", "gpupool", "spread", "dot-product", "gpu-packing", "k8s-default", "lowest-power",
          "single-node", "random")


@pytest.mark.parametrize("policy", CACHED)
def test_score_cache_matches_fresh_engine(policy) -> None:
    rnd = random.Random(7)
    workload = [_named(SHAPES[i % len(SHAPES)], f"w{i}") for i in range(3 * len(SHAPES))]
    s = ClusterState(CACHE_NODES)
    eng = Engine(s, make_policy(policy), seed=11, workload=workload)
    ops: list[tuple] = []
    requests = {}
    checks = 0
    for step in range(160):
        r = rnd.random()
        if r < 0.25 and s.assignments:
            name = rnd.choice(sorted(s.assignments))
            eng.release(name)
            ops.append(("release", name))
            continue
        if r < 0.3:
            n = rnd.randrange(4)
            g = rnd.randrange(int(s.gpu_count[n]))
            healthy = bool(rnd.random() < 0.5)
            s.set_gpu_health(n, g, healthy)
            ops.append(("health", n, g, healthy))
            continue
        req = _named(rnd.choice(SHAPES), f"p{step}")
        requests[req.name] = req
        # the decision of a fresh engine (empty caches) on a replayed copy, with the same random state
        fresh = Engine(_replay(ops, requests), make_policy(policy), seed=0, workload=workload)
        fresh.rng.bit_generator.state = eng.rng.bit_generator.state
        want = fresh.schedule(req)
        got = eng.place(req)
        if want.scheduled:
            checks += 1
            assert got.scheduled, (step, want, got)
            assert (got.assignment.node, got.assignment.gpus, got.assignment.gpu_milli) == (
                want.assignment.node, want.assignment.gpus, want.assignment.gpu_milli), step
            ops.append(("alloc", got.assignment))
        else:
            assert not got.scheduled and got.reason == want.reason, step
        s.check_invariants()
    assert checks > 40  # the stream really exercised placements
    final = _replay(ops, requests)
    for k in ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free", "gpu_healthy"):
        assert np.array_equal(getattr(final, k), getattr(s, k)), k
