"""Property tests: random place/release/health streams over random small clusters, for every policy.

After every step the books balance (``check_invariants``), no GPU share leaves 0..1000, no GPU memory is
over-allocated, device assignments agree with the per-GPU books, and each placed pod sits on healthy
devices of an allowed model. A pod reported unschedulable really fits no node (checked by brute force).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import ALL_POLICIES, engine
from gpupool.cluster import ClusterState
from gpupool.model import MILLI, NodeSpec, PodRequest

MODELS = ("V100M16", "T4", "G2")  # two catalog models and an opaque one (GPU memory unknown)

node_specs = st.lists(
    st.tuples(
        st.sampled_from([2000, 8000, 32000]),  # cpu
        st.sampled_from([4096, 65536]),  # memory
        st.integers(0, 4),  # GPUs
        st.sampled_from(MODELS),
    ),
    min_size=1,
    max_size=4,
)


@st.composite
def requests(draw):
    num = draw(st.sampled_from([0, 1, 1, 1, 2, 4]))
    if num == 0:
        milli = 0
    elif num == 1:
        milli = draw(st.sampled_from([100, 250, 300, 500, 700, 1000]) | st.integers(1, MILLI))
    else:
        milli = MILLI
    spec = draw(st.sampled_from([(), (), ("T4",), ("V100M16", "G2"), ("H100",)])) if num else ()
    gpu_mem = draw(st.sampled_from([0, 0, 0, 4000, 20000])) if num else 0
    return dict(cpu_milli=draw(st.sampled_from([0, 500, 2000, 8000])),
                memory_mib=draw(st.sampled_from([0, 1024, 8192])),
                num_gpu=num, gpu_milli=milli, gpu_spec=spec, gpu_memory_mib=gpu_mem)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("place"), requests()),
        st.tuples(st.just("place"), requests()),
        st.tuples(st.just("release"), st.integers(0, 1000)),
        st.tuples(st.just("health"), st.integers(0, 3), st.integers(0, 3), st.booleans()),
    ),
    min_size=1,
    max_size=25,
)


def effective_milli(policy: str, req: PodRequest) -> int:
    return MILLI if policy == "k8s-default" and req.num_gpu else req.gpu_milli


def fitting_gpus(state: ClusterState, req: PodRequest, n: int, milli: int) -> list[int]:
    """GPUs of node n that could take ``milli`` of ``req``: an independent, loop-by-loop reading of the rules."""
    out = []
    model = state.nodes[n].gpu_model
    for g in range(state.nodes[n].gpu_count):
        if not state.gpu_healthy[n, g] or state.gpu_free[n, g] < milli:
            continue
        if req.gpu_spec and model not in req.gpu_spec:
            continue
        cap = int(state.gpu_mem_cap[n, g])
        if req.gpu_memory_mib:
            if cap == 0 or state.gpu_mem_free[n, g] < req.gpu_memory_mib:
                continue
        elif state.gpu_mem_free[n, g] < cap * milli // MILLI:
            continue
        out.append(g)
    return out


def fits_somewhere(state: ClusterState, req: PodRequest, milli: int) -> bool:
    for n in range(state.n_nodes):
        if state.cpu_free[n] < req.cpu_milli or state.mem_free[n] < req.memory_mib:
            continue
        if len(fitting_gpus(state, req, n, milli)) >= req.num_gpu:
            return True
    return False


def check_books(state: ClusterState) -> None:
    state.check_invariants()
    assert (state.gpu_free >= 0).all() and (state.gpu_free <= MILLI).all()
    assert (state.gpu_mem_free >= 0).all() and (state.gpu_mem_free <= state.gpu_mem_cap).all()
    assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    held = np.zeros_like(state.gpu_free, dtype=np.int64)
    for a in state.assignments.values():
        assert len(set(a.gpus)) == len(a.gpus)
        for g in a.gpus:
            assert state.gpu_exists[a.node, g]
            held[a.node, g] += a.gpu_milli
    assert (held <= MILLI).all()
    assert (held == np.where(state.gpu_exists, MILLI - state.gpu_free, 0)).all()


@pytest.mark.parametrize("policy", ALL_POLICIES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=node_specs, stream=ops)
def test_random_streams_keep_books(policy, specs, stream) -> None:
    nodes = [NodeSpec(f"n{i}", cpu, mem, gpus, model if gpus else "") for i, (cpu, mem, gpus, model) in
             enumerate(specs)]
    state = ClusterState(nodes)
    workload = [PodRequest(f"w{i}", **op[1]) for i, op in enumerate(stream) if op[0] == "place"]
    eng = engine(state, policy, seed=len(stream), workload=workload or None)
    for i, op in enumerate(stream):
        if op[0] == "place":
            req = PodRequest(f"p{i}", **op[1])
            milli = effective_milli(policy, req)
            could = fits_somewhere(state, req, milli)
            d = eng.place(req)
            if d.scheduled:
                a = d.assignment
                assert could
                assert len(a.gpus) == req.num_gpu and a.gpu_milli == (milli if req.num_gpu else 0)
                assert a.requested_gpu_milli == req.gpu_milli
                for g in a.gpus:
                    assert state.gpu_healthy[a.node, g], "placed on an unhealthy GPU"
                    if req.gpu_spec:
                        assert state.nodes[a.node].gpu_model in req.gpu_spec
                assert state.assignments[req.name] == a
            else:
                assert not could, f"{policy} left {req} unscheduled although a node fits: {d.reason}"
                assert d.reason.startswith(f"0/{state.n_nodes} nodes are available: ")
                assert req.name not in state.assignments
        elif op[0] == "release":
            if state.assignments:
                name = sorted(state.assignments)[op[1] % len(state.assignments)]
                a = eng.release(name)
                assert a.pod == name and name not in state.assignments
        else:
            n = op[1] % state.n_nodes
            if state.gpu_count[n]:
                state.set_gpu_health(n, op[2] % int(state.gpu_count[n]), op[3])
        check_books(state)
    for name in list(state.assignments):
        eng.release(name)
    check_books(state)
    assert (state.gpu_free == np.where(state.gpu_exists, MILLI, 0)).all()
    assert (state.cpu_free == state.cpu_cap).all() and (state.gpu_mem_free == state.gpu_mem_cap).all()
