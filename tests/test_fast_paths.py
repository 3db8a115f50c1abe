"""The engine's few-node fast paths give exactly what the vectorized forms give.

Covered: :func:`fitting_gpus` against :func:`gpu_fit_matrix`, :class:`GpuFit` node by node,
``FragModel._frag_few`` against the vectorized :meth:`FragModel.frag` (bit for bit), FGD's whole-GPU
device choice while scoring, and the usable GPU share that :class:`ClusterState` keeps in step.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import cluster, node, pod, typical
from gpupool.cluster import ClusterState
from gpupool.engine.filters import EffectiveRequest, GpuFit, fitting_gpus, gpu_fit_matrix
from gpupool.frag import FragModel
from gpupool.model import AllocationError
from gpupool.policies import make_policy


def random_state(rng: random.Random, n: int = 12) -> ClusterState:
    """Nodes of mixed models, partly allocated, with a few unhealthy GPUs."""
    models = ["V100M16", "T4", "A100", ""]
    nodes = []
    for i in range(n):
        m = rng.choice(models)
        nodes.append(node(f"n{i}", cpu=rng.choice([8000, 32000, 96000]), mem=rng.choice([16384, 65536]),
                          gpus=rng.choice([2, 4, 8]) if m else 0, model=m or None))
    st = cluster(*nodes)
    for k in range(4 * n):
        i = rng.randrange(n)
        g = int(st.gpu_count[i])
        if g == 0:
            continue
        milli = rng.choice([100, 250, 500, 1000])
        req = pod(f"p{k}", cpu=rng.choice([0, 1000, 4000]), mem=rng.choice([0, 1024]), gpus=1, milli=milli,
                  gpu_mem=rng.choice([0, 0, 2000]))
        try:
            st.allocate(req, i, (rng.randrange(g),))
        except AllocationError:
            pass
        if rng.random() < 0.1:
            st.set_gpu_health(i, rng.randrange(g), rng.random() < 0.5)
    return st


def random_request(rng: random.Random) -> EffectiveRequest:
    gpus = rng.choice([1, 1, 2, 4])
    milli = rng.choice([100, 500, 1000]) if gpus == 1 else 1000
    spec = rng.choice([(), (), ("T4",), ("A100", "V100M16"), ("H100",)])
    req = pod("r", cpu=rng.choice([0, 2000]), mem=rng.choice([0, 4096]), gpus=gpus, milli=milli, spec=spec,
              gpu_mem=rng.choice([0, 0, 3000]))
    return EffectiveRequest(req, req.gpu_milli)


@pytest.mark.parametrize("seed", range(20))
def test_fitting_gpus_and_gpu_fit_match_the_vectorized_forms(seed):
    rng = random.Random(seed)
    st = random_state(rng)
    nodes = np.arange(st.n_nodes)
    for _ in range(10):
        eff = random_request(rng)
        fits = gpu_fit_matrix(st, eff, nodes)
        for i in range(st.n_nodes):
            assert fitting_gpus(st, eff, i) == np.flatnonzero(fits[i]).tolist()
        vectorized = fits.sum(axis=1) >= eff.num_gpu
        for k in range(st.n_nodes - 1):  # pairs of nodes: the node-by-node path
            assert GpuFit().mask(st, eff, nodes[k:k + 2]).tolist() == vectorized[k:k + 2].tolist()


@pytest.mark.parametrize("seed", range(20))
def test_usable_gpu_free_follows_allocate_release_and_health(seed):
    rng = random.Random(seed)
    st = random_state(rng)
    for k in range(60):
        if st.assignments and rng.random() < 0.4:
            st.release(rng.choice(sorted(st.assignments)))
        else:
            i = rng.randrange(st.n_nodes)
            g = int(st.gpu_count[i])
            if g and rng.random() < 0.2:
                st.set_gpu_health(i, rng.randrange(g), rng.random() < 0.6)
                continue
            req = pod(f"q{k}", cpu=1000, gpus=1 if g else 0, milli=rng.choice([300, 1000]) if g else None)
            try:
                st.allocate(req, i, (rng.randrange(g),) if g else ())
            except AllocationError:
                pass
        assert (st.usable_gpu_free() == np.where(st.gpu_healthy, st.gpu_free, 0)).all()
        assert st.usable_gpu_free().dtype == np.int32
    st.check_invariants()


@pytest.mark.parametrize("use_memory", [False, True])
@pytest.mark.parametrize("seed", range(10))
def test_frag_few_is_bit_identical_to_the_vectorized_frag(seed, use_memory, monkeypatch):
    rng = random.Random(seed)
    st = random_state(rng)
    tp = typical((0, 0, 0, 0.1), (4000, 1, 1000, 0.3, (), 2048), (2000, 1, 500, 0.2, ("T4",)),
                 (8000, 2, 1000, 0.25), (1000, 1, 250, 0.15, ("A100", "V100M16"), 512))
    fm = FragModel(tp, st.model_names, use_memory=use_memory)
    free, cpu, model, mem = st.usable_gpu_free(), st.cpu_free, st.node_model, st.mem_free
    for k in range(1, st.n_nodes + 1):
        idx = np.array(rng.sample(range(st.n_nodes), min(k, 3)))
        fast = fm._frag_few(free[idx].astype(np.int64), cpu[idx], model[idx], mem[idx])
        monkeypatch.setattr(FragModel, "FEW_CELLS", 0)
        slow = fm.frag(free[idx], cpu[idx], model[idx], mem[idx])
        monkeypatch.undo()
        assert fast.tobytes() == slow.tobytes()


@pytest.mark.parametrize("name", ["fgd", "gpupool"])
@pytest.mark.parametrize("seed", range(10))
def test_fgd_whole_gpu_scores_node_by_node_as_vectorized(name, seed, monkeypatch):
    rng = random.Random(seed)
    st = random_state(rng)
    pol = make_policy(name)
    workload = [pod(f"w{i}", cpu=2000, gpus=rng.choice([1, 2]), milli=1000) for i in range(20)]
    pol.prepare(st, workload)
    for _ in range(10):
        eff = random_request(rng)
        if eff.is_fractional:
            continue
        idx = np.array(sorted(rng.sample(range(st.n_nodes), 3)))
        fast = pol.score(st, eff, idx)
        monkeypatch.setattr(type(pol), "FEW_NODES", 0)
        slow = pol.score(st, eff, idx)
        monkeypatch.undo()
        assert fast.tobytes() == slow.tobytes()
