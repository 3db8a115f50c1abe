"""GPU fragmentation (Weng et al., ATC'23, Sec. 3) against hand-computed values, and typical pods."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import cluster, node, occupy, pod, typical
from gpupool.frag import FragModel, cluster_fragmentation, typical_pods

MODELS = ("T4", "V100M16")  # model index 0 = T4, 1 = V100M16, -1 = CPU-only node
T4, V100, NONE = 0, 1, -1


def frag1(shape: tuple, free: list[int], cpu: int = 32000, model: int = V100, mem: int | None = None,
          use_memory: bool = False) -> float:
    """Fragmentation of one node for one typical shape (prob 1)."""
    fm = FragModel(typical(shape), MODELS, use_memory=use_memory)
    mem_arr = None if mem is None else np.array([mem])
    return float(fm.frag(np.array([free]), np.array([cpu]), np.array([model]), mem_arr)[0])


FRAG_CASES = [
    # (case, shape (cpu, num_gpu, milli, prob[, spec[, mem]]), free per GPU, node cpu, node model, expected)
    # -- the task cannot run on the node: all of the node's free share is fragmented
    ("no-GPU shape", (1000, 0, 0, 1.0), [1000, 300, 0, 0], 32000, V100, 1300),
    ("no access: spec excludes model", (0, 1, 500, 1.0, ("T4",)), [1000, 300], 32000, V100, 1300),
    ("access: spec includes model", (0, 1, 500, 1.0, ("T4",)), [1000, 300], 32000, T4, 300),
    ("lack of CPU", (8000, 1, 100, 1.0), [1000, 300], 4000, V100, 1300),
    ("exactly enough CPU", (4000, 1, 100, 1.0), [1000, 300], 4000, V100, 0),
    ("too few GPUs", (0, 2, 1000, 1.0), [1000, 600], 32000, V100, 1600),
    ("too few GPUs with enough share", (0, 1, 700, 1.0), [600, 500, 0], 32000, V100, 1100),
    # -- Q3: the task fits; the GPUs whose free share is below its per-GPU ask are fragmented
    ("partial: small GPUs", (0, 1, 500, 1.0), [1000, 300, 700, 100], 32000, V100, 400),
    ("partial: exactly the ask is usable", (0, 1, 500, 1.0), [500, 499], 32000, V100, 499),
    ("partial: multi-GPU shape", (0, 2, 1000, 1.0), [1000, 1000, 600, 0], 32000, V100, 600),
    ("nothing free", (0, 1, 500, 1.0), [0, 0], 32000, V100, 0),
    ("idle node", (0, 1, 500, 1.0), [1000, 1000], 32000, V100, 0),
    # -- a CPU-only node has nothing to fragment
    ("CPU-only node", (0, 1, 500, 1.0), [0, 0], 32000, NONE, 0),
]


@pytest.mark.parametrize("case, shape, free, cpu, model, expected", FRAG_CASES, ids=[c[0] for c in FRAG_CASES])
def test_frag_cases(case, shape, free, cpu, model, expected) -> None:
    assert frag1(shape, free, cpu, model) == expected


def test_frag_expectation_over_shapes_vectorized() -> None:
    # shapes: 500-milli p=0.5, whole GPU p=0.3, CPU-only p=0.2
    fm = FragModel(typical((0, 1, 500, 0.5), (0, 1, 1000, 0.3), (2000, 0, 0, 0.2)), MODELS)
    free = np.array([[1000, 1000], [1000, 300], [400, 400], [0, 0]])
    cpu = np.array([32000, 32000, 32000, 32000])
    model = np.array([V100, V100, T4, NONE])
    # node 0 [1000, 1000]: 0.5*0 + 0.3*0 + 0.2*2000 = 400
    # node 1 [1000, 300]:  0.5*300 + 0.3*300 + 0.2*1300 = 150 + 90 + 260 = 500
    # node 2 [400, 400]:   500-shape cannot run (no GPU with 500): 800; whole: 800; cpu-only: 800 -> 800
    # node 3 CPU-only: 0
    assert np.allclose(fm.frag(free, cpu, model), [400.0, 500.0, 800.0, 0.0])


@pytest.mark.parametrize(
    "use_memory, mem, expected",
    [
        (True, 16384, 1300),  # the shape needs 32 GiB of host memory: it cannot run, everything fragmented
        (True, 32768, 300),  # enough memory: only GPU 1's 300 (< 500) is fragmented
        (False, 16384, 300),  # memory ignored (FGD's own definition reads CPU and GPU only)
        (True, None, 300),  # no memory given: not checked
    ],
)
def test_frag_memory_aware(use_memory, mem, expected) -> None:
    assert frag1((0, 1, 500, 1.0, (), 32768), [1000, 300], mem=mem, use_memory=use_memory) == expected


def test_access_matrix() -> None:
    t = typical((0, 1, 500, 0.5), (0, 1, 500, 0.25, ("T4",)), (0, 1, 500, 0.25, ("V100M16", "H100")))
    # rows: T4, V100M16, no GPU; columns: the three shapes
    assert t.access(MODELS).tolist() == [[True, True, False], [True, False, True], [False, False, False]]
    assert len(t) == 3


def test_cluster_fragmentation_uses_healthy_gpus() -> None:
    s = cluster(node("a", gpus=2), node("b", gpus=2, model="T4"), node("c"))
    occupy(s, 0, [700, 0])  # a: free [300, 1000]
    s.set_gpu_health(1, 0, False)  # b: usable [0, 1000]
    fm = FragModel(typical((0, 1, 500, 1.0)), s.model_names)
    # a: 300 < 500 fragmented; b: the unhealthy GPU contributes no free share; c: 0
    assert cluster_fragmentation(s, fm).tolist() == [300.0, 0.0, 0.0]


# ------------------------------------------------------------------------------------- typical pods


def workload():
    # 20 pods: A x8, B x5, C x5 (CPU-only), D x1, E x1
    pods = []
    pods += [pod(f"a{i}", cpu=4000, mem=1000 * (i + 1), gpus=1, milli=500) for i in range(8)]
    pods += [pod(f"b{i}", cpu=8000, mem=2048, gpus=1) for i in range(5)]
    pods += [pod(f"c{i}", cpu=2000, mem=512 * (i + 1)) for i in range(5)]
    pods += [pod("d", cpu=1000, gpus=2)]
    pods += [pod("e", cpu=500, gpus=1, milli=200)]
    return pods


def shapes(t):
    return list(zip(t.cpu_milli.tolist(), t.num_gpu.tolist(), t.gpu_milli.tolist(), strict=True))


def test_typical_pods_rank_cut_renormalize() -> None:
    t = typical_pods(workload(), 0.95)
    # counts A 8, B 5, C 5, D 1, E 1 of 20; 95% of 20 = 19.
    # B and C tie at 5: the larger shape first (cpu 8000 > 2000); D and E tie at 1: D (cpu 1000 > 500)
    # cumulative 8, 13, 18 (< 19: go on), 19 (>= 19: stop) -> A, B, C, D; E is cut
    assert shapes(t) == [(4000, 1, 500), (8000, 1, 1000), (2000, 0, 0), (1000, 2, 1000)]
    assert np.allclose(t.prob, np.array([8, 5, 5, 1]) / 19)  # renormalized over the 19 kept
    assert t.memory_mib.tolist() == [0, 0, 0, 0]  # without with_memory
    assert t.gpu_spec == ((), (), (), ())


def test_typical_pods_threshold_cut_exactly() -> None:
    # 90% of 20 = 18: A, B, C reach exactly 18 -> stop there
    t = typical_pods(workload(), 0.9)
    assert shapes(t) == [(4000, 1, 500), (8000, 1, 1000), (2000, 0, 0)]
    assert np.allclose(t.prob, np.array([8, 5, 5]) / 18)
    assert np.isclose(t.prob.sum(), 1.0)


def test_typical_pods_without_cpu_pods() -> None:
    # GPU pods only: A 8, B 5, D 1, E 1 of 15; 95% = 14.25: 8, 13, 14 (< 14.25), 15 -> all four kept
    t = typical_pods(workload(), 0.95, include_cpu_pods=False)
    assert shapes(t) == [(4000, 1, 500), (8000, 1, 1000), (1000, 2, 1000), (500, 1, 200)]
    assert np.allclose(t.prob, np.array([8, 5, 1, 1]) / 15)


def test_typical_pods_with_memory_median() -> None:
    t = typical_pods(workload(), 0.95, with_memory=True)
    # A: memories 1000..8000 -> median 4500; B: 2048; C: 512..2560 -> median 1536; D: 0
    assert t.memory_mib.tolist() == [4500, 2048, 1536, 0]


def test_typical_pods_spec_is_part_of_shape() -> None:
    pods = [pod(f"t{i}", gpus=1, milli=500, spec=["T4"]) for i in range(3)]
    pods += [pod(f"x{i}", gpus=1, milli=500) for i in range(2)]
    t = typical_pods(pods, 1.0)
    assert t.gpu_spec == (("T4",), ()) and np.allclose(t.prob, [0.6, 0.4])


def test_typical_pods_full_threshold_keeps_all() -> None:
    t = typical_pods(workload(), 1.0)
    assert len(t) == 5 and np.isclose(t.prob.sum(), 1.0)


@pytest.mark.parametrize("pods, kwargs", [([], {}), ([pod("c", cpu=1)], {"include_cpu_pods": False})])
def test_typical_pods_empty(pods, kwargs) -> None:
    with pytest.raises(ValueError, match="empty workload"):
        typical_pods(pods, **kwargs)
