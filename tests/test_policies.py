"""Every placement policy on tiny clusters, with the node and the devices worked out by hand.

Conventions: ``occupy(state, i, [shares])`` pre-loads GPU g of node i with one pod of ``shares[g]``
milli, directly through ClusterState (no policy sees it). Expected outcomes are computed in the
comments from each policy module's docstring formula.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import ALL_POLICIES, cluster, engine, node, occupy, placed, pod, typical
from gpupool.engine.filters import EffectiveRequest
from gpupool.policies import BASELINES, DEFAULT_POLICY, REGISTRY, make_policy
from gpupool.policies.fgd import FGD
from gpupool.policies.gpu_clustering import gpu_kind
from gpupool.policies.gpupool_policy import GpupoolPolicy, model_pressure


def eff(req) -> EffectiveRequest:
    return EffectiveRequest(req, req.gpu_milli)


def run(eng, *pods):
    """(node name, gpus) of each pod placed in turn (None where unschedulable)."""
    out = []
    for p in pods:
        d = eng.place(p)
        out.append((d.assignment.node_name, d.assignment.gpus) if d.scheduled else None)
    return out


# ------------------------------------------------------------------------------------------ registry


def test_registry_names() -> None:
    assert tuple(REGISTRY) == ALL_POLICIES
    assert set(BASELINES) <= set(REGISTRY) and DEFAULT_POLICY == "gpupool"
    for name in ALL_POLICIES:
        p = make_policy(name)
        assert p.name == name and p.description
        assert make_policy(name) is not p  # a fresh instance every time
    with pytest.raises(KeyError, match="unknown policy 'nope'; known: round-robin"):
        make_policy("nope")


# --------------------------------------------------------------------------------------- round-robin


def test_round_robin_turns_and_skips() -> None:
    # n0: 2 GPUs, n1: 1 GPU, n2: 2 GPUs; whole-GPU pods
    s = cluster(node("n0", gpus=2), node("n1", gpus=1), node("n2", gpus=2))
    eng = engine(s, "round-robin")
    assert run(eng, *(pod(f"p{i}", gpus=1) for i in range(6))) == [
        ("n0", (0,)),  # pointer 0
        ("n1", (0,)),  # pointer 1
        ("n2", (0,)),  # pointer 2
        ("n0", (1,)),  # wraps to 0; GPU 0 taken, lowest free index is 1
        ("n2", (1,)),  # pointer 1, but n1 is full: the next in turn that fits is n2
        None,  # every GPU taken
    ]
    # a failed pod does not move the pointer; a release does not either (it is at n0 after n2)
    eng.release("p1")
    assert run(eng, pod("q", gpus=1)) == [("n1", (0,))]  # from n0 (full) the next that fits is n1


def test_round_robin_fractional_devices_best_fit() -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=2))
    occupy(s, 0, [0, 700])  # n0: GPU 1 has 300 free
    eng = engine(s, "round-robin")
    # p0 -> n0 (pointer 0), on GPU 1: the fitting GPU with the least free share (300 < 1000)
    # p1 -> n1 (pointer 1), both idle: GPU 0
    assert run(eng, pod("p0", gpus=1, milli=300), pod("p1", gpus=1, milli=300)) == [("n0", (1,)), ("n1", (0,))]


# --------------------------------------------------------------------------------------- single-node


def test_single_node_fills_head_first() -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=2))
    eng = engine(s, "single-node")
    got = run(
        eng,
        pod("a", gpus=1, milli=400),  # n0 GPU 0 (all idle: lowest index)
        pod("b", gpus=1, milli=400),  # n0 GPU 0 again: least free that fits (600)
        pod("c", gpus=1, milli=400),  # GPU 0 has 200 left: GPU 1
        pod("d", gpus=1),  # no whole GPU on n0 any more: n1 GPU 0
        pod("e", cpu=1000),  # CPU pod: head node n0 still has CPU
        pod("f", gpus=1, milli=200),  # fits n0 GPU 0 (200 free, the least)
    )
    assert got == [("n0", (0,)), ("n0", (0,)), ("n0", (1,)), ("n1", (0,)), ("n0", ()), ("n0", (0,))]


# -------------------------------------------------------------------------------------- lowest-power


def test_lowest_power_prefers_t4() -> None:
    # catalog peak power: T4 70 W, V100M16 300 W, G2 opaque (no figure: last); c0 has no GPU
    s = cluster(node("v0", gpus=1), node("g0", gpus=1, model="G2"), node("t0", gpus=1, model="T4"), node("c0"))
    eng = engine(s, "lowest-power")
    assert run(eng, pod("a", gpus=1), pod("b", gpus=1), pod("c", gpus=1), pod("d", gpus=1)) == [
        ("t0", (0,)),  # -70 beats -300 and -inf
        ("v0", (0,)),  # T4 full: V100 next
        ("g0", (0,)),  # only the opaque model is left
        None,
    ]
    # a CPU pod scores 0 on a CPU-only node (no GPU drawing power), above every GPU node
    assert run(eng, pod("cpu", cpu=1000)) == [("c0", ())]


def test_lowest_power_scores() -> None:
    s = cluster(node("v0", gpus=1), node("g0", gpus=1, model="G2"), node("t0", gpus=1, model="T4"), node("c0"))
    scores = make_policy("lowest-power").score(s, eff(pod("p", gpus=1)), np.arange(4))
    assert scores.tolist() == [-300.0, -math.inf, -70.0, 0.0]


# -------------------------------------------------------------------------------------------- random


def test_random_is_seeded_and_spreads() -> None:
    pods = [pod(f"p{i}", gpus=1, milli=100) for i in range(40)]

    def layout(seed):
        s = cluster(*(node(f"n{i}", gpus=8) for i in range(4)))
        return run(engine(s, "random", seed=seed), *pods)

    a, b, c = layout(5), layout(5), layout(6)
    assert a == b  # same seed, same placements
    assert a != c  # another seed, other placements
    counts = {n: sum(1 for x in a if x[0] == n) for n in ("n0", "n1", "n2", "n3")}
    # 40 pods uniformly over 4 nodes: about 10 each; every node is used (not packed onto one)
    assert all(v >= 4 for v in counts.values()), counts


# --------------------------------------------------------------------------------------- k8s-default


def test_k8s_default_whole_gpu_for_fraction_and_least_allocated() -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=2))
    s.allocate(pod("busy", cpu=16000), 0, [])  # n0 has half its CPU taken
    eng = engine(s, "k8s-default")
    req = pod("a", cpu=4000, mem=8192, gpus=1, milli=300)
    # LeastAllocated: ((cpu_free - req) * 100 // cap + (mem_free - req) * 100 // cap) // 2
    #   n0: (12000*100//32000 = 37) + (57344*100//65536 = 87) -> 124 // 2 = 62
    #   n1: (28000*100//32000 = 87) + 87 -> 87
    scores = make_policy("k8s-default").score(s, make_policy("k8s-default").effective(req), np.arange(2))
    assert scores.tolist() == [62.0, 87.0]
    d = eng.place(req)
    a = d.assignment
    assert (a.node_name, a.gpus) == ("n1", (0,))
    assert (a.gpu_milli, a.requested_gpu_milli) == (1000, 300)  # the whole GPU is held, 300 used
    assert a.gpu_memory_mib == 16160 and s.gpu_free[1].tolist() == [0, 1000]
    # b: n1 now (24000 -> 75, 49152 -> 75) = 75 > n0 62: n1 again, on GPU 1 (GPU 0 is not shared)
    # c: n1 has no whole GPU left although only 600 of its 2000 milli are used: n0 GPU 0
    assert run(eng, pod("b", cpu=4000, mem=8192, gpus=1, milli=300),
               pod("c", cpu=4000, mem=8192, gpus=1, milli=300)) == [("n1", (1,)), ("n0", (0,))]
    s.check_invariants()


# ------------------------------------------------------------------------------------------ best-fit


@pytest.mark.parametrize(
    "n1_cpu_used, expected",
    [
        # score = trunc((1 - 0.5 * cpu_left / 128000 - 0.5 * gpu_left / 8000) * 100), pod: 2 cores + 1 GPU
        #   n0 (2 GPUs used): cpu_left 30000, gpu_left 1000 -> 1 - 0.1171875 - 0.0625 = 0.8203 -> 82
        #   n1 (1 GPU used, 8 cores used): 22000, 2000 -> 1 - 0.0859375 - 0.125 = 0.7890 -> 78
        #   n2 (idle): 30000, 3000 -> 1 - 0.1171875 - 0.1875 = 0.6953 -> 69
        (8000, ("n0", (2,), [82.0, 78.0, 69.0])),
        # n1 with all its CPU used (30 cores by "busy" + 2 by the pod): 0, 2000 -> 1 - 0.125 -> 87 > 82
        (30000, ("n1", (1,), [82.0, 87.0, 69.0])),
    ],
)
def test_best_fit_picks_fullest_node(n1_cpu_used, expected) -> None:
    s = cluster(node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=4))
    occupy(s, 0, [1000, 1000])
    occupy(s, 1, [1000])
    s.allocate(pod("busy", cpu=n1_cpu_used), 1, [])
    req = pod("p", cpu=2000, gpus=1)
    assert make_policy("best-fit").score(s, eff(req), np.arange(3)).tolist() == expected[2]
    # devices: the lowest-index idle GPU (n0: 2, n1: 1)
    assert placed(engine(s, "best-fit").place(req)) == expected[:2]


def test_best_fit_fractional_on_least_free_gpu() -> None:
    s = cluster(node("n0", gpus=4))
    occupy(s, 0, [200, 400, 0, 900])  # free 800, 600, 1000, 100
    # 500 fits GPUs 0 (800), 1 (600), 2 (1000): least free is GPU 1
    assert placed(engine(s, "best-fit").place(pod("p", gpus=1, milli=500))) == ("n0", (1,))


# -------------------------------------------------------------------------------------------- spread


def test_spread_emptiest_node_and_gpu() -> None:
    s = cluster(node("n0", gpus=4), node("n1", gpus=2), node("n2", gpus=2))
    occupy(s, 0, [0, 500])  # n0: 3500 / 4000 = 0.875 free
    occupy(s, 1, [0, 300])  # n1: 1700 / 2000 = 0.85
    eng = engine(s, "spread")
    # p1: n2 is idle (1.0); both GPUs have 1000: the first
    # p2: n2 now 1700/2000 = 0.85, n0 0.875 is the emptiest; on n0 the GPUs with most free (1000) are
    #     0, 2 and 3: the first of them
    # p3: n0 3200/4000 = 0.8 < n1 = n2 = 0.85 -> n1 or n2 (random tie); on either, the idle GPU
    got = run(eng, pod("p1", gpus=1, milli=300), pod("p2", gpus=1, milli=300), pod("p3", gpus=1, milli=300))
    assert got[:2] == [("n2", (0,)), ("n0", (0,))]
    assert got[2] in {("n1", (0,)), ("n2", (1,))}


def test_spread_unhealthy_gpus_leave_the_ratio() -> None:
    s = cluster(node("n0", gpus=2), node("n1", gpus=4))
    occupy(s, 1, [0, 0, 0, 400])
    s.set_gpu_health(1, 0, False)
    s.set_gpu_health(1, 1, False)
    # n1 counts its 2 healthy GPUs only: 1600 / 2000 = 0.8; n0 1.0
    assert make_policy("spread").score(s, eff(pod("p", gpus=1)), np.arange(2)).tolist() == [1.0, 0.8]


def test_spread_cpu_pod_by_free_cpu_fraction() -> None:
    s = cluster(node("n0", cpu=32000), node("n1", cpu=8000), node("n2", cpu=32000))
    s.allocate(pod("x", cpu=16000), 0, [])
    s.allocate(pod("y", cpu=4000), 2, [])
    # free fraction: n0 0.5, n1 1.0 (8000 of 8000), n2 0.875 (more absolute CPU, but less as a fraction)
    assert placed(engine(s, "spread").place(pod("p", cpu=1000))) == ("n1", ())


# --------------------------------------------------------------------------------------- dot-product


@pytest.mark.parametrize(
    "req, expected, scores",
    [
        # request (cpu/128000, gpu/8000); nA free (1.0, 1.0), nB free (0.5, 0.5);
        # score = trunc((1 - <free, req> / 2) * 100)
        # (64 cores, 4 GPUs) = (0.5, 0.5): nA dot 1.0 -> 50; nB dot 0.5 -> 75: nB (devices 4..7, the idle ones)
        (pod("p", cpu=64000, gpus=4), ("nB", (4, 5, 6, 7)), [50.0, 75.0]),
        # (64 cores, 1 GPU) = (0.5, 0.125): nA 0.5 + 0.125 = 0.625 -> 68.75 -> 68;
        # nB 0.25 + 0.0625 = 0.3125 -> 84.375 -> 84
        (pod("p", cpu=64000, gpus=1), ("nB", (4,)), [68.0, 84.0]),
    ],
)
def test_dot_product(req, expected, scores) -> None:
    s = cluster(node("nA", cpu=128000, mem=262144, gpus=8), node("nB", cpu=128000, mem=262144, gpus=8))
    occupy(s, 1, [1000] * 4)
    s.allocate(pod("cpu-hog", cpu=64000), 1, [])
    assert make_policy("dot-product").score(s, eff(req), np.arange(2)).tolist() == scores
    assert placed(engine(s, "dot-product").place(req)) == expected


def test_dot_product_alignment_not_just_fullness() -> None:
    # nA: 128 cores free, 1 GPU free (0.125); nB: 64 cores free (0.5), 8 GPUs free (1.0)
    s = cluster(node("nA", cpu=128000, mem=262144, gpus=8), node("nB", cpu=128000, mem=262144, gpus=8))
    occupy(s, 0, [1000] * 7)
    s.allocate(pod("cpu-hog", cpu=64000), 1, [])
    # GPU-heavy pod (8 cores = 0.0625, 1 GPU = 0.125):
    #   nA: 1.0*0.0625 + 0.125*0.125 = 0.078125 -> (1 - 0.0390625) * 100 = 96.09 -> 96
    #   nB: 0.5*0.0625 + 1.0*0.125 = 0.15625 -> (1 - 0.078125) * 100 = 92.19 -> 92
    req = pod("p", cpu=8000, gpus=1)
    assert make_policy("dot-product").score(s, eff(req), np.arange(2)).tolist() == [96.0, 92.0]
    assert placed(engine(s, "dot-product").place(req)) == ("nA", (7,))


# --------------------------------------------------------------------------------------- gpu-packing


def packing_cluster():
    s = cluster(
        node("idle4", gpus=4),
        node("used", gpus=4),  # one whole GPU used: GPUs 1..3 free
        node("shared6", gpus=2),  # GPU 0: 600 used, 400 free
        node("shared2", gpus=2),  # GPU 0: 200 used, 800 free
        node("idle2", gpus=2),
    )
    occupy(s, 1, [1000])
    occupy(s, 2, [600])
    occupy(s, 3, [200])
    return s


def test_gpu_packing_three_cases() -> None:
    s = packing_cluster()
    pol = make_policy("gpu-packing")
    nodes = np.arange(5)
    frac = pol.score(s, eff(pod("p", gpus=1, milli=300)), nodes)
    # (1) fits on a shared GPU: 100 - (free% of the chosen GPU) // 10, at least 50
    #     shared6: GPU 0 free 400 -> 40% -> 96; shared2: GPU 0 free 800 -> 80% -> 92
    # (2) needs a fully free GPU of a used node: 50 - 1 = 49 ("used")
    # (3) idle node: 33 - #GPUs: idle4 29, idle2 31
    assert frac.tolist() == [29.0, 49.0, 96.0, 92.0, 31.0]
    whole2 = pol.score(s, eff(pod("p", gpus=2)), nodes)
    # case (2) with 2 free GPUs on "used": 48; idle nodes as above (shared* cannot host 2 whole GPUs)
    assert whole2[[0, 1, 4]].tolist() == [29.0, 48.0, 31.0]
    cpu = pol.score(s, eff(pod("p", cpu=1000)), nodes)
    assert cpu.tolist() == [0.0] * 5


def test_gpu_packing_placements() -> None:
    s = packing_cluster()
    eng = engine(s, "gpu-packing")
    assert run(
        eng,
        pod("a", gpus=1, milli=300),  # 96: shared6 GPU 0 (400 free -> 100)
        pod("b", gpus=1, milli=300),  # shared6 GPU 0 has 100 left; shared2 GPU 0 (800 -> 80%) = 92 wins
        pod("c", gpus=2),  # "used" 48 beats idle2 31 and idle4 29: GPUs 1, 2
    ) == [("shared6", (0,)), ("shared2", (0,)), ("used", (1, 2))]


def test_gpu_packing_idle_prefers_smaller_node() -> None:
    s = cluster(node("big", gpus=8), node("small", gpus=2))
    # idle nodes score 33 - #GPUs: big 25, small 31
    assert placed(engine(s, "gpu-packing").place(pod("p", gpus=1, milli=500))) == ("small", (0,))


# ------------------------------------------------------------------------------------ gpu-clustering


def test_gpu_kind() -> None:
    assert [gpu_kind(1, 500), gpu_kind(1, 1000), gpu_kind(2, 1000), gpu_kind(4, 1000), gpu_kind(8, 1000),
            gpu_kind(3, 1000)] == [0, 1, 2, 3, 4, 5]


def clustering_setup():
    # four 4-GPU nodes; fill = 25 * (8000 - free) // 8000 with free the node's usable free milli
    s = cluster(*(node(f"n{i}", gpus=4) for i in range(4)))
    eng = engine(s, "gpu-clustering")
    pol = eng.policy

    def put(p, i, gpus):
        pol.on_allocate(s, s.allocate(p, i, gpus))  # what Engine.place does

    put(pod("s1", gpus=1, milli=500), 1, [0])  # n1: only shared pods
    put(pod("s2", gpus=1, milli=500), 2, [0])  # n2: shared and one-GPU pods
    put(pod("w2", gpus=1), 2, [1])
    put(pod("w3", gpus=1), 3, [0])  # n3: only one-GPU pods
    return s, eng, pol


def test_gpu_clustering_bands() -> None:
    s, eng, pol = clustering_setup()
    nodes = np.arange(4)
    # fills: n0 free 4000 -> 25*4000//8000 = 12; n1 3500 -> 14; n2 2500 -> 17; n3 3000 -> 15
    # shared pod: n0 idle band 25 -> 37; n1 only its kind 75 -> 89; n2 its kind among others 50 -> 67;
    #             n3 other kinds only 0 -> 15
    assert pol.score(s, eff(pod("p", gpus=1, milli=300)), nodes).tolist() == [37.0, 89.0, 67.0, 15.0]
    # one-GPU pod: n0 37; n1 0 + 14; n2 50 + 17 = 67; n3 75 + 15 = 90
    assert pol.score(s, eff(pod("p", gpus=1)), nodes).tolist() == [37.0, 14.0, 67.0, 90.0]
    # two-GPU pod: nobody holds that kind: idle n0 (37) beats the others (14, 17, 15)
    assert pol.score(s, eff(pod("p", gpus=2)), nodes).tolist() == [37.0, 14.0, 17.0, 15.0]
    assert pol.score(s, eff(pod("p", cpu=10)), nodes).tolist() == [0.0] * 4
    # shared pod -> n1; on it the fitting GPU with least free share: GPU 0 (500)
    assert run(eng, pod("a", gpus=1, milli=300), pod("b", gpus=1), pod("c", gpus=2)) == [
        ("n1", (0,)), ("n3", (1,)), ("n0", (0, 1))]


def test_gpu_clustering_release_updates_kinds() -> None:
    s, eng, pol = clustering_setup()
    eng.release("w3")  # n3 is idle again: band 25 + fill 12 = 37 for any GPU pod
    assert pol.kind_count[3].tolist() == [0] * 6
    assert pol.score(s, eff(pod("p", gpus=1)), np.arange(4))[3] == 37.0
    assert pol.kind_count[2].tolist() == [1, 1, 0, 0, 0, 0]


# ------------------------------------------------------------------------------------------------ fgd

# typical pods: half 500-milli, half whole-GPU pods (no CPU); n0 idle, n1 GPU 1 at 500 used
HALF_AND_WHOLE = typical((0, 1, 500, 0.5), (0, 1, 1000, 0.5))


def fgd_cluster():
    s = cluster(node("n0", gpus=2), node("n1", gpus=2))
    occupy(s, 1, [0, 500])
    return s


def test_fgd_prefers_the_half_used_gpu() -> None:
    # frag(node) = sum over typical shapes of prob * (free share that shape cannot use)
    #   n0 [1000, 1000]: 500-shape uses both, 1000-shape uses both -> 0
    #   n1 [1000, 500]:  500-shape 0; 1000-shape cannot use GPU 1's 500 -> 0.5 * 500 = 250
    # placing a 500-milli pod:
    #   n0 GPU 0 or 1 -> [500, 1000]: 1000-shape loses 500 -> 250; delta = 0 - 250 = -250
    #   n1 GPU 0 -> [500, 500]: 1000-shape loses both -> 500; delta = 250 - 500 = -250
    #   n1 GPU 1 -> [1000, 0]: nothing left that a shape cannot use -> 0; delta = 250 - 0 = +250
    # score = floor(100 * sigmoid(delta / 1000)): +250 -> floor(56.22) = 56; -250 -> floor(43.78) = 43
    s = fgd_cluster()
    pol = FGD(typical=HALF_AND_WHOLE)
    eng = engine(s, pol)
    req = pod("p", gpus=1, milli=500)
    assert pol.model.frag(s.usable_gpu_free(), s.cpu_free, s.node_model).tolist() == [0.0, 250.0]
    scores, choice = pol._evaluate(s, eff(req), np.arange(2))
    assert scores.tolist() == [43.0, 56.0] and choice.tolist() == [0, 1]
    assert math.floor(100 / (1 + math.exp(-0.25))) == 56 and math.floor(100 / (1 + math.exp(0.25))) == 43
    # the idle n0 comes first in node order, yet FGD takes the GPU with 500 free on n1
    assert placed(eng.place(req)) == ("n1", (1,))


def test_fgd_only_half_shapes_is_a_tie() -> None:
    # with 500-milli typical pods only, no placement fragments anything (500 free still fits a 500 pod, 0
    # free is not a fragment): every delta is 0, score floor(50.0) = 50, ties go to the first node and
    # lowest GPU index (tie_break = "first")
    s = fgd_cluster()
    pol = FGD(typical=typical((0, 1, 500, 1.0)))
    eng = engine(s, pol)
    assert pol._evaluate(s, eff(pod("p", gpus=1, milli=500)), np.arange(2))[0].tolist() == [50.0, 50.0]
    assert placed(eng.place(pod("p", gpus=1, milli=500))) == ("n0", (0,))


def test_fgd_cpu_exhaustion_fragments_gpus() -> None:
    # typical: whole-GPU pods with 4 cores. A CPU-only pod that leaves a node under 4 cores strands its
    # free GPUs: n0 (6 cores) would drop to 2 cores -> its 2 free GPUs (2000) become fragments, delta -2000,
    # score floor(100 * sigmoid(-2)) = 11; n1 (32 cores) keeps 28: delta 0, score 50
    s = cluster(node("n0", cpu=6000, gpus=2), node("n1", cpu=32000, gpus=2))
    pol = FGD(typical=typical((4000, 1, 1000, 1.0)))
    eng = engine(s, pol)
    req = pod("c", cpu=4000)
    assert pol.score(s, eff(req), np.arange(2)).tolist() == [11.0, 50.0]
    assert placed(eng.place(req)) == ("n1", ())


def test_fgd_whole_gpus_lowest_index_and_cpu_pods_packed() -> None:
    s = cluster(node("n0", gpus=4), node("n1", gpus=4))
    occupy(s, 0, [0, 1000])
    eng = engine(s, FGD(typical=typical((0, 1, 1000, 1.0))))
    # whole GPUs never fragment whole-GPU typical pods: every delta is 0 -> first node, lowest free GPUs
    # CPU-only pods change no fragmentation: all tie -> node order packs them onto n0
    assert run(eng, pod("w", gpus=2), pod("c1", cpu=1000), pod("c2", cpu=1000)) == [
        ("n0", (0, 2)), ("n0", ()), ("n0", ())]


def test_fgd_default_typical_and_learned_typical() -> None:
    s = cluster(node("n0", gpus=1))
    pol = FGD()
    engine(s, pol)  # no workload: one whole GPU per pod
    assert pol.model.typical.gpu_milli.tolist() == [1000] and pol.model.typical.prob.tolist() == [1.0]
    pol2 = FGD()
    engine(cluster(node("n0", gpus=1)), pol2, workload=[pod(f"p{i}", gpus=1, milli=300) for i in range(3)])
    assert pol2.model.typical.gpu_milli.tolist() == [300]


# -------------------------------------------------------------------------------------------- gpupool


def test_model_pressure_hand_computed() -> None:
    # cluster: 2 x T4 nodes (2 GPUs each) + 1 x V100M16 node (4 GPUs): capacity shares T4 0.5, V100M16 0.5
    # typical GPU demand: T4-only 1 GPU p=0.2 (demand 200), any 1 GPU p=0.6 (600), T4|V100M16 2 GPUs
    # p=0.1 (200), CPU-only p=0.1 (0) -> demand shares 0.2, 0.6, 0.2
    #   T4-only:        0.2 / 0.5 = 0.4 onto T4
    #   T4|V100M16:     0.2 / 1.0 = 0.2 onto T4 and V100M16
    # pressure: T4 0.6, V100M16 0.2, no-GPU slot 0
    s = cluster(node("t0", gpus=2, model="T4"), node("t1", gpus=2, model="T4"), node("v0", gpus=4))
    shapes = typical((0, 1, 1000, 0.2, ("T4",)), (0, 1, 1000, 0.6), (0, 2, 1000, 0.1, ("T4", "V100M16")),
                     (1000, 0, 0, 0.1))
    pressure = model_pressure(shapes, s)
    assert s.model_names == ("T4", "V100M16")
    assert np.allclose(pressure, [0.6, 0.2, 0.0])


def test_model_pressure_zero_without_gpu_spec() -> None:
    s = cluster(node("t0", gpus=2, model="T4"), node("v0", gpus=4))
    assert np.allclose(model_pressure(typical((0, 1, 1000, 0.5), (0, 1, 300, 0.5)), s), 0.0)


def test_gpupool_steers_flexible_pods_off_scarce_models() -> None:
    # typical: T4-only p=0.25, V100M16-only p=0.25, any model p=0.5, all 1 whole GPU.
    # cluster: t0 = 2 x T4 free; v0 = 2 x V100M16 free; v1 = 4 x V100M16 all taken.
    # capacity shares T4 2/8 = 0.25, V100M16 6/8 = 0.75 -> pressure T4 0.25/0.25 = 1.0, V100M16 0.25/0.75 = 1/3
    # FGD for an any-model 1-GPU pod:
    #   t0: V100-only pods cannot use T4: 0.25 * 2000 = 500 fragmented, after 0.25 * 1000 = 250: +250 -> 56
    #   v0: T4-only pods cannot use V100: the same, 56. A tie: FGD takes t0 (node order), using up the T4s.
    # gpupool: t0 56 - 25 * 1.0 = 31, v0 56 - 25 / 3 = 47.67 (minus the packing epsilon) -> v0.
    shapes = typical((0, 1, 1000, 0.25, ("T4",)), (0, 1, 1000, 0.25, ("V100M16",)), (0, 1, 1000, 0.5))
    req = pod("flex", cpu=1000, gpus=1)
    out = {}
    for pol in (FGD(typical=shapes), GpupoolPolicy(typical=shapes)):
        s = cluster(node("t0", gpus=2, model="T4"), node("v0", gpus=2), node("v1", gpus=4))
        occupy(s, 2, [1000] * 4)
        eng = engine(s, pol)
        out[pol.name] = (pol.score(s, eff(req), np.arange(2)), placed(eng.place(req)))
    assert out["fgd"][0].tolist() == [56.0, 56.0] and out["fgd"][1] == ("t0", (0,))
    eps = 1e-6 * 1000 / 8000
    assert np.allclose(out["gpupool"][0], [56 - 25.0 - eps, 56 - 25 / 3 - eps])
    assert out["gpupool"][1] == ("v0", (0,))
    # a T4-only pod still goes to the T4 node, the only one it may use
    s = cluster(node("t0", gpus=2, model="T4"), node("v0", gpus=2), node("v1", gpus=4))
    eng = engine(s, GpupoolPolicy(typical=shapes))
    assert placed(eng.place(pod("t4", gpus=1, spec=["T4"]))) == ("t0", (0,))


def test_gpupool_packing_tie_break_keeps_idle_node_whole() -> None:
    # whole-GPU typical pods: a whole-GPU pod fragments nothing, FGD scores 50 on both nodes and takes n0.
    # gpupool breaks the tie by the GPU share left: n0 4 -> 3 GPUs, n1 2 -> 1 GPU: n1 (fuller) wins.
    s = cluster(node("n0", gpus=4), node("n1", gpus=4))
    occupy(s, 1, [1000, 1000])
    pol = GpupoolPolicy(typical=typical((0, 1, 1000, 1.0)))
    eng = engine(s, pol)
    req = pod("p", cpu=1000, gpus=1)
    assert np.allclose(pol.score(s, eff(req), np.arange(2)), [50 - 1e-6 * 3000 / 8000, 50 - 1e-6 * 1000 / 8000])
    assert placed(eng.place(req)) == ("n1", (2,))
    s2 = cluster(node("n0", gpus=4), node("n1", gpus=4))
    occupy(s2, 1, [1000, 1000])
    assert placed(engine(s2, FGD(typical=typical((0, 1, 1000, 1.0)))).place(req)) == ("n0", (0,))


def test_gpupool_packs_cpu_pods_onto_gpu_busy_nodes() -> None:
    # CPU-only pods change no fragmentation here: the packing tie-break sends them to the node with the
    # fewest free GPUs (n1: 1000 left vs n0: 4000)
    s = cluster(node("n0", gpus=4), node("n1", gpus=4))
    occupy(s, 1, [1000, 1000, 1000])
    eng = engine(s, GpupoolPolicy(typical=typical((0, 1, 1000, 1.0))))
    assert run(eng, pod("c1", cpu=4000), pod("c2", cpu=4000)) == [("n1", ()), ("n1", ())]


def test_gpupool_keeps_fgd_score_where_it_is_not_tied() -> None:
    # the FGD example: n1 GPU 1 (score 56) beats every other placement (43); gpupool agrees
    s = fgd_cluster()
    pol = GpupoolPolicy(typical=HALF_AND_WHOLE)
    eng = engine(s, pol)
    assert placed(eng.place(pod("p", gpus=1, milli=500))) == ("n1", (1,))


@pytest.mark.parametrize("seed", range(6))
def test_gpupool_ties_broken_by_node_order_like_fgd(seed) -> None:
    # four identical idle nodes score exactly the same: like FGD, gpupool breaks the tie by node order,
    # whatever the seed
    assert make_policy("gpupool").tie_break == "first"
    s = cluster(*(node(f"n{i}", gpus=4) for i in range(4)))
    eng = engine(s, "gpupool", seed=seed)
    assert placed(eng.place(pod("p", cpu=1000, gpus=1, milli=500))) == ("n0", (0,))


# ----------------------------------------------------------------------------- every policy, basics


@pytest.mark.parametrize("policy", ALL_POLICIES)
def test_every_policy_places_on_single_fitting_spot(policy) -> None:
    # only n1 GPU 2 can take 600 milli: n0 is a CPU node, n1 GPUs 0, 1, 3 have 500 free, n2 is full
    s = cluster(node("n0"), node("n1", gpus=4), node("n2", gpus=1))
    occupy(s, 1, [500, 500, 0, 500])
    occupy(s, 2, [1000])
    d = engine(s, policy).place(pod("p", cpu=100, gpus=1, milli=600))
    assert placed(d) == ("n1", (2,))
    assert d.assignment.gpu_milli == (1000 if policy == "k8s-default" else 600)
    s.check_invariants()


def test_k8s_default_places_whole_gpu_pods_on_a_time_sliced_node():
    """On a node advertising 4 time-slicing replicas per GPU, a 1-GPU pod is one replica (250 milli) of a GPU:
    k8s-default (the device plugin's lowest-index order) gives the first GPU four such pods, then the second;
    it used to ask for a fully free GPU and raise AllocationError on the fifth pod."""
    from gpupool.model import NodeSpec

    state = cluster(NodeSpec("ts", cpu_milli=64000, memory_mib=262144, gpu_count=2, gpu_model="V100M16",
                             gpu_replicas=4))
    e = engine(state, "k8s-default")
    got = [placed(e.place(pod(f"p{i}", gpus=1))) for i in range(8)]
    assert got == [("ts", (0,))] * 4 + [("ts", (1,))] * 4
    assert not e.place(pod("p8", gpus=1)).scheduled
