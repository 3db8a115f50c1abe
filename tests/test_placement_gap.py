"""The offline optimum's formulation (benchmarks/optimum.py) on instances solved by hand, and the placement
terms added for issue 12 (GPU stranded by CPU, device best fit) on small hand-checked cases."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import (
    argparse_error,
    bench_module,
    cluster,
    engine,
    node,
    occupy,
    openb_header_folder,
    placed,
    pod,
    typical,
)
from gpupool.policies.gpupool_policy import GpupoolPolicy, per_gpu_milli, stranded_gpus

pytest.importorskip("highspy", reason="the optimum needs the bench extra (highspy)")

optimum = bench_module("optimum.py")


def test_bound_exact_when_big_pods_cannot_share_a_gpu() -> None:
    # one node, 2 GPUs; three 600-milli pods and one whole-GPU pod. Two pods > 500 milli never share a GPU,
    # so the best is the whole pod + one 600 (1.6 GPUs; two 600s give 1.2): 1.6 / 2 = 0.8.
    nodes = [node("n0", cpu=8000, mem=16384, gpus=2)]
    pods = [pod(f"p{i}", cpu=1000, gpus=1, milli=600) for i in range(3)] + [pod("w", cpu=1000, gpus=1)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(0.8)
    assert res.packed == pytest.approx(0.8)


def test_bound_counts_cpu_per_node_not_per_class() -> None:
    # two nodes of 2 GPUs and 4 cores; four 1-GPU pods of 3 cores: one pod per node (CPU), 2 of 4 GPUs.
    # Summing the class (8 cores, 4 GPUs) would allow two pods; the per-node pattern does not.
    nodes = [node(f"n{i}", cpu=4000, mem=16384, gpus=2) for i in range(2)]
    pods = [pod(f"p{i}", cpu=3000, gpus=1) for i in range(4)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(0.5)
    assert res.packed == pytest.approx(0.5)


def test_node_pattern_packs_gpu_by_gpu() -> None:
    # five 400-milli pods on one 2-GPU node: their shares sum to 2000, but a GPU holds two of them (800), so
    # the best node places four: 1.6 / 2 = 0.8 (bound and packing alike)
    nodes = [node("n0", cpu=8000, mem=16384, gpus=2)]
    pods = [pod(f"p{i}", cpu=1000, gpus=1, milli=400) for i in range(5)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(0.8)
    assert res.packed == pytest.approx(0.8)
    # 810 + 190 on one GPU and a whole pod on the other: full; the second 810 does not fit beside them
    pods = [pod("a", gpus=1, milli=810), pod("b", gpus=1, milli=190), pod("c", gpus=1, milli=810),
            pod("w", gpus=1)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(1.0) and res.packed == pytest.approx(1.0)
    # memory binds: each 300-milli pod asks 6 GiB of the node's 16: two pods, 0.6 of 2 GPUs
    pods = [pod(f"m{i}", cpu=100, mem=6144, gpus=1, milli=300) for i in range(6)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(0.3) and res.packed == pytest.approx(0.3)


def test_dropped_by_class_counts_what_the_packing_leaves_out() -> None:
    # five 400s and a 2-GPU pod on one 4-GPU node: the 2-GPU pod and four 400s (two GPUs of two each); one 400
    # is left out (0.4 GPU of class 1x400)
    nodes = [node("n0", cpu=64000, mem=65536, gpus=4)]
    pods = [pod(f"p{i}", cpu=1000, gpus=1, milli=400) for i in range(5)] + [pod("big", cpu=1000, gpus=2)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.packed == pytest.approx(3.6 / 4)
    assert optimum.dropped_by_class(res) == pytest.approx({"1x400": 0.4})
    assert optimum.pod_class(8, 1000) == "8x1000" and optimum.pod_class(0, 0) == "0x0"


def test_best_pattern_by_hand() -> None:
    # a 4-GPU node: one 2-GPU pod, then 3 x 600 cannot share, so 2 GPUs hold one 600 each, with a 400 beside
    # each of them: 2 + 2 * (0.6 + 0.4) = 4 GPUs; limits and values read per shape
    nd = ("V100M16", 4, 64000, 262144)
    shapes = [(1000, 1024, 2, 1000, ()), (1000, 1024, 1, 600, ()), (1000, 1024, 1, 400, ())]
    values = np.array([2.0, 0.6, 0.4])
    found, upper, pat = optimum.best_pattern(shapes, values, [1, 3, 2], nd)
    assert found == pytest.approx(4.0) and upper == pytest.approx(4.0) and pat == {0: 1, 1: 2, 2: 2}
    # without the 400s: the two free GPUs take one 600 each
    found, _, pat = optimum.best_pattern(shapes, values, [1, 3, 0], nd)
    assert found == pytest.approx(3.2) and pat == {0: 1, 1: 2}
    # CPU binds: 2.5 cores for pods of one core each -> two pods (the 2-GPU pod and a 600)
    found, _, pat = optimum.best_pattern(shapes, values, [1, 3, 2], ("V100M16", 4, 2500, 262144))
    assert found == pytest.approx(2.6) and pat == {0: 1, 1: 1}
    with pytest.raises(ValueError, match="more than one GPU"):
        optimum.best_pattern([(1000, 1024, 2, 500, ())], np.array([1.0]), [1], nd)


def test_warm_packing_starts_the_master() -> None:
    # the master from a real packing (fgd's, which places every pod here): the same bound, and the integer
    # master keeps that packing (from the patterns priced alone it finds 3.31 GPUs of the 3.5)
    nodes = [node(f"n{i}", cpu=8000, mem=16384, gpus=2) for i in range(3)]
    pods = [pod(f"p{i}", cpu=1000, gpus=1, milli=m) for i, m in enumerate([810, 190, 600, 400, 700, 300, 500])]
    warm = optimum.node_packing(nodes, pods, "fgd")
    assert sum(len(ps) for _, ps in warm) >= 5
    cold = optimum.allocation_bound(nodes, pods)
    hot = optimum.allocation_bound(nodes, pods, warm=warm)
    assert hot.bound == pytest.approx(cold.bound) == pytest.approx(3.5 / 6)
    assert hot.packed == pytest.approx(3.5 / 6)
    assert 0 < cold.packed <= cold.bound


def test_bound_respects_gpu_models_and_leaves_cpu_pods_out() -> None:
    # a T4-only pod cannot use the V100 node; the CPU-only pod adds nothing: 1 GPU of 2 at best.
    nodes = [node("v", cpu=8000, mem=16384, gpus=1), node("t", cpu=8000, mem=16384, gpus=1, model="T4")]
    pods = [pod("a", cpu=1000, gpus=1, spec=("T4",)), pod("b", cpu=1000, gpus=1, spec=("T4",)),
            pod("c", cpu=4000)]
    res = optimum.allocation_bound(nodes, pods)
    assert res.bound == pytest.approx(0.5)
    assert res.packed == pytest.approx(0.5)


def test_gpu_knapsack_by_hand() -> None:
    # one GPU: 810 + 190 fills it (1.0); 400 + 400 + 190 = 990 (0.99) does not beat it; two 600s never fit
    weights = np.array([810, 190, 400, 600])
    best, pat = optimum.best_gpu_pattern(weights, weights / 1000, np.array([1, 1, 2, 2]))
    assert best == pytest.approx(1.0) and pat == {0: 1, 1: 1}
    # worth nothing: left out; limits respected (one 400 only): 400 + 190 = 0.59
    best, pat = optimum.best_gpu_pattern(weights, np.array([0.0, 0.19, 0.4, 0.0]), np.array([1, 1, 1, 2]))
    assert best == pytest.approx(0.59) and pat == {1: 1, 2: 1}


@pytest.mark.parametrize(("pods", "expected"), [
    # five 400-milli pods on 2 GPUs: two per GPU (the node-level relaxation says all five)
    ([pod(f"p{i}", cpu=1000, gpus=1, milli=400) for i in range(5)], 0.8),
    # three 600s and a whole GPU: the whole GPU + one 600
    ([pod(f"p{i}", cpu=1000, gpus=1, milli=600) for i in range(3)] + [pod("w", cpu=1000, gpus=1)], 0.8),
    # 810 + 190 and 700 + 300 fill both GPUs; the 500 is left out
    ([pod("a", gpus=1, milli=810), pod("b", gpus=1, milli=190), pod("c", gpus=1, milli=700),
      pod("d", gpus=1, milli=300), pod("e", gpus=1, milli=500)], 1.0),
    # three 700s: one per GPU, 0.7 + 0.7 of 2
    ([pod(f"p{i}", gpus=1, milli=700) for i in range(3)], 0.7),
])
def test_gpu_packing_bound_by_hand(pods, expected: float) -> None:
    nodes = [node("n0", cpu=8000, mem=16384, gpus=2)]
    assert optimum.gpu_packing_bound(nodes, pods) == pytest.approx(expected)


def test_gpu_packing_bound_respects_models() -> None:
    # a T4-only whole pod and a T4-only 600: one T4 GPU holds one of them; the V100 takes the free 500
    nodes = [node("v", gpus=1), node("t", gpus=1, model="T4")]
    pods = [pod("a", gpus=1, spec=("T4",)), pod("b", gpus=1, milli=600, spec=("T4",)), pod("c", gpus=1, milli=500)]
    assert optimum.gpu_packing_bound(nodes, pods) == pytest.approx(0.75)


def test_arrived_prefix_stops_at_full_demand() -> None:
    nodes = [node("n0", cpu=64000, mem=65536, gpus=4)]
    trace = [pod(f"p{i}", cpu=1000, gpus=1, milli=500) for i in range(4)]
    prefix = optimum.arrived_prefix(nodes, trace, seed=1)
    assert sum(p.total_gpu_milli for p in prefix) == 4000  # eight half-GPU pods: exactly 100%


# ------------------------------------------------------------------------------ scoring terms


def test_per_gpu_milli_ignores_cpu_only_pods() -> None:
    pods = [pod("a", cpu=8000, mem=4096, gpus=1), pod("b", cpu=2000, mem=2048, gpus=1, milli=500),
            pod("c", cpu=16000, mem=9999)]
    assert per_gpu_milli(pods) == pytest.approx(10000 / 1500)
    assert per_gpu_milli(pods, "memory_mib") == pytest.approx(6144 / 1500)
    assert per_gpu_milli([pod("c", cpu=16000)]) == 0.0


def test_stranded_gpus_by_hand() -> None:
    # 4 milli-CPU per milli-GPU: 4,000 milli-CPU feeds 1,000 milli-GPU, so a node with 2 free GPUs and 4
    # free cores strands one GPU; 8 free cores feed its whole GPU; no ratio, no stranding.
    out = stranded_gpus(np.array([2000, 1000]), np.array([4000, 8000]), 4.0)
    assert np.allclose(out, [1.0, 0.0])
    assert np.allclose(stranded_gpus(np.array([2000]), np.array([0]), 0.0), [0.0])
    # memory too (8 MiB per milli-GPU): 8,192 MiB feeds 1,024 milli of the 2,000 free, the CPU all of it
    out = stranded_gpus(np.array([2000]), np.array([64000]), 4.0, np.array([8192]), 8.0)
    assert np.allclose(out, [0.976])


def test_strand_weight_moves_a_cpu_heavy_pod_off_a_cpu_poor_node() -> None:
    # Typical pods: one whole GPU and 1 core (fits both nodes before and after: FGD's scores tie). n0 has
    # 2 GPUs and 6 cores, n1 2 GPUs and 64 cores. Workload: 4 cores per GPU. n0 strands 2 - 1.5 = 0.5 GPU
    # before; a 4-core half-GPU pod there leaves 1.5 GPUs and 2 cores (feeds 0.5 GPU): 1.0 stranded, +0.5
    # caused by the pod; on n1 nothing. Without the term the tie goes to n0 (same GPU share left, node
    # order); with it, n0 loses 0.5 point and n1 wins.
    def run(weight: float) -> str:
        s = cluster(node("n0", cpu=6000, gpus=2), node("n1", cpu=64000, gpus=2))
        pol = type("P", (GpupoolPolicy,), {"strand_weight": weight})(typical=typical((1000, 1, 1000, 1.0)))
        workload = [pod("w", cpu=4000, gpus=1)]
        return placed(engine(s, pol, workload=workload).place(pod("x", cpu=4000, gpus=1, milli=500)))[0]

    assert run(0.0) == "n0"
    assert run(1.0) == "n1"


def test_strand_term_counts_only_what_the_placement_strands() -> None:
    # n0 already strands 1.5 GPUs (2 GPUs, 2 cores; 4 cores per GPU); a CPU-only pod of 1 core there strands
    # 0.25 more; n1 (2 GPUs, 9 cores) strands nothing before and 0.0 after (8 cores feed 2 GPUs). Scores
    # of the final step, by hand: n0 -0.25 x weight, n1 0 (CPU-only pods take no GPU share; FGD ties).
    s = cluster(node("n0", cpu=2000, gpus=2), node("n1", cpu=9000, gpus=2))
    pol = type("P", (GpupoolPolicy,), {"strand_weight": 2.0, "pack_epsilon": 0.0})(typical=typical((0, 1, 1000, 1.0)))
    pol.prepare(s, [pod("w", cpu=4000, gpus=1)])
    req = pol.effective(pod("x", cpu=1000))
    out = pol._final_score(s, req, np.array([0, 1]), np.zeros(2))
    assert np.allclose(out, [-0.5, 0.0])


@pytest.mark.parametrize(("best_fit", "gpu"), [(False, 1), (True, 2)])
def test_device_best_fit_between_tied_gpus(best_fit: bool, gpu: int) -> None:
    # typical pod: one whole GPU. Free shares [1000, 700, 600]; a 500-milli pod on GPU 1 or 2 leaves
    # fragments 200 + 600 = 800 or 700 + 100 = 800 (tie; GPU 0 would make 1,800). Index order takes GPU 1;
    # device best fit takes GPU 2 (100 left).
    s = cluster(node("n0", gpus=3))
    occupy(s, 0, [0, 300, 400])
    pol = type("P", (GpupoolPolicy,), {"gpu_best_fit": best_fit})(typical=typical((0, 1, 1000, 1.0)))
    assert placed(engine(s, pol).place(pod("x", gpus=1, milli=500))) == ("n0", (gpu,))



@pytest.mark.parametrize(("argv", "message"), [
    (["--variants", "nope"], "no openb_pod_list_nope.csv"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--variants", ","], "at least one name"),
    (["--time-limit", "0"], "--time-limit and --ratio above 0"),
    (["--max-iterations", "0"], "--max-iterations must be at least 1"),
    (["--no-packing"], "--no-packing goes with --node-level"),
])
def test_optimum_refuses_bad_arguments_before_writing(capsys, tmp_path, argv, message) -> None:
    traces = openb_header_folder(tmp_path)
    out = tmp_path / "out"
    assert message in argparse_error(optimum.main, capsys, ["--variants", "default", *argv, "--traces", str(traces),
                                                             "--out", str(out)])
    assert not out.exists()  # nothing written (an empty run would have replaced the results)
