"""Tests of the ``load-aware`` placement policy (scores hand-computed from the formula in its docstring:
score = 2 / (1 + peers) + 1 x (1 - util) + 0.5 x (1 - mem_used) - 3 x hot)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import cluster, engine, node, occupy, placed, pod
from gpupool.engine.filters import EffectiveRequest
from gpupool.k8s.telemetry import GpuSample, GpuTelemetry
from gpupool.model import PodRequest
from gpupool.policies import REGISTRY, make_policy
from gpupool.policies.load_aware import LoadAware, service_of, set_gpu_load, telemetry_load, telemetry_prepare

MEM = 16160  # V100M16 memory (MiB), the conftest default model


def replica(name: str, service: str | None = "llm", gpus: int = 1, milli: int = 1000) -> PodRequest:
    labels = (("app", service),) if service else ()
    return PodRequest(name, num_gpu=gpus, gpu_milli=milli, labels=labels)


def scores(state, req: PodRequest) -> np.ndarray:
    pol = LoadAware()
    return pol.score(state, EffectiveRequest(req, req.gpu_milli), np.arange(state.n_nodes))


def test_registered() -> None:
    assert "load-aware" in REGISTRY and isinstance(make_policy("load-aware"), LoadAware)
    assert not LoadAware.node_local  # telemetry and peers change without the node's version changing


def test_replicas_of_a_service_spread_over_nodes() -> None:
    state = cluster(node("n0", gpus=4), node("n1", gpus=4), node("n2", gpus=4))
    eng = engine(state, "load-aware")
    where = [placed(eng.place(replica(f"llm-{c}")))[0] for c in "abc"]
    assert sorted(where) == ["n0", "n1", "n2"]  # one per node
    # a 4th replica: every node holds 1 peer -> 2 / 2 = 1 each; loads equal -> any node, but not stacked twice
    fourth = placed(eng.place(replica("llm-d")))[0]
    fifth = placed(eng.place(replica("llm-e")))[0]
    assert fourth != fifth
    # another service is not held back by llm's replicas: each node still has an idle GPU, no peer of
    # "other": 2 / 1 + (1 - 0) + 0.5 x (1 - 0) = 3.5 everywhere
    s = scores(state, replica("other-a", service="other"))
    assert s == pytest.approx([3.5, 3.5, 3.5])


def test_running_deployment_pods_are_grouped_by_name() -> None:
    state = cluster(node("n0", gpus=2), node("n1", gpus=2))
    # running replica placed outside the engine (as the live scheduler rebuilds its state): no labels known
    state.allocate(pod("default/llm-7d4b9c8f6d-x2x7q", gpus=1), 0, [0])
    pol = LoadAware()
    req = pod("default/llm-7d4b9c8f6d-abcde", gpus=1)
    assert pol.peers(state, req, np.arange(2)).tolist() == [1, 0]
    assert pol.peers(state, pod("default/web-0", gpus=1), np.arange(2)).tolist() == [0, 0]
    assert service_of(replica("x", service="llm")) == "label:llm" and service_of(pod("y")) is None


def test_labelled_and_name_grouped_peers_are_counted_once() -> None:
    state = cluster(node("n0", gpus=4), node("n1", gpus=4))
    eng = engine(state, "load-aware")
    a = PodRequest("default/llm-7d4b9c8f6d-aaaaa", num_gpu=1, gpu_milli=1000, labels=(("app", "llm"),))
    placed(eng.place(a))
    first = eng.state.assignments[a.name].node
    b = PodRequest("default/llm-7d4b9c8f6d-bbbbb", num_gpu=1, gpu_milli=1000, labels=(("app", "llm"),))
    # a is under "label:llm", "name:default/llm" and their pair: 1 + 1 - 1 = 1 peer, not 2
    peers = eng.policy.peers(state, b, np.arange(2))
    assert peers[first] == 1 and peers[1 - first] == 0


def test_scores_avoid_hot_gpus() -> None:
    state = cluster(node("n0", gpus=1), node("n1", gpus=1))
    set_gpu_load(state, util=np.array([[0.95], [0.10]]), mem_used_mib=np.array([[0.0], [0.0]]))
    s = scores(state, replica("llm-a"))
    # n0: 2 / 1 + (1 - 0.95) + 0.5 x (1 - 0) - 3 (hot: 0.95 >= 0.8) = -0.45
    # n1: 2 / 1 + (1 - 0.10) + 0.5 x (1 - 0) = 3.4
    assert s == pytest.approx([-0.45, 3.4])
    assert placed(engine(state, "load-aware").place(replica("llm-a")))[0] == "n1"


def test_full_memory_is_hot() -> None:
    state = cluster(node("n0", gpus=1), node("n1", gpus=1))
    set_gpu_load(state, util=np.array([[0.2], [0.5]]), mem_used_mib=np.array([[0.95 * MEM], [0.2 * MEM]]))
    s = scores(state, replica("llm-a"))
    # n0: 2 + 0.8 + 0.5 x 0.05 - 3 (memory 95 % >= 90 %) = -0.175;  n1: 2 + 0.5 + 0.5 x 0.8 = 2.9
    assert s == pytest.approx([-0.175, 2.9])


def test_availability_before_mild_load_but_not_before_a_hot_gpu() -> None:
    state = cluster(node("n0", gpus=2), node("n1", gpus=2))
    state.allocate(replica("llm-a"), 0, [0])
    # n0 holds a peer and is idle; n1 is free of peers but its GPUs run at 50 %
    set_gpu_load(state, util=np.array([[1.0, 0.0], [0.5, 0.5]]), mem_used_mib=np.zeros((2, 2)))
    pol = LoadAware()
    pol.prepare(state, [replica("llm-a")])  # the workload the engine passes: llm-a's labels become known
    s = pol.score(state, EffectiveRequest(replica("llm-b"), 1000), np.arange(2))
    # n0: 2 / 2 + (1 - 0) + 0.5 = 2.5 (its free GPU 1 is the one that fits);  n1: 2 + 0.5 + 0.5 = 3.0 -> n1
    assert s == pytest.approx([2.5, 3.0])
    # n1 hot (90 %): 2 + 0.1 + 0.5 - 3 = -0.4 < 2.5 -> n0 despite the peer
    set_gpu_load(state, util=np.array([[1.0, 0.0], [0.9, 0.9]]), mem_used_mib=np.zeros((2, 2)))
    s = pol.score(state, EffectiveRequest(replica("llm-b"), 1000), np.arange(2))
    assert s == pytest.approx([2.5, -0.4])


def test_bookings_stand_in_without_telemetry() -> None:
    state = cluster(node("n0", gpus=1), node("n1", gpus=1))
    occupy(state, 0, [500])  # n0's GPU half booked (share and, in proportion, memory)
    s = scores(state, replica("llm-a", milli=250))
    # n0: 2 + (1 - 0.5) + 0.5 x (1 - 0.5) = 2.75;  n1: 2 + 1 + 0.5 = 3.5
    assert s == pytest.approx([2.75, 3.5])


def test_select_gpus_takes_the_coolest() -> None:
    state = cluster(node("n0", gpus=4))
    set_gpu_load(state, util=np.array([[0.9, 0.2, 0.5, 0.1]]), mem_used_mib=np.array([[0, 0, 0, 5000.0]]))
    pol = LoadAware()
    assert pol.select_gpus(state, EffectiveRequest(replica("a"), 1000), 0) == (3,)
    assert pol.select_gpus(state, EffectiveRequest(replica("b", gpus=2), 1000), 0) == (3, 1)
    # the node's score uses those two: util (0.1 + 0.2) / 2 = 0.15, memory (5000 / 16160 + 0) / 2
    s = pol.score(state, EffectiveRequest(replica("b", gpus=2), 1000), np.arange(1))
    assert s[0] == pytest.approx(2 + 0.85 + 0.5 * (1 - 5000 / MEM / 2))


def test_release_frees_the_node_for_the_next_replica() -> None:
    state = cluster(node("n0", gpus=2), node("n1", gpus=2))
    eng = engine(state, "load-aware")
    a, b = placed(eng.place(replica("llm-a")))[0], placed(eng.place(replica("llm-b")))[0]
    assert {a, b} == {"n0", "n1"}
    eng.release("llm-a")
    assert placed(eng.place(replica("llm-c")))[0] == a  # a's node has no peer any more


def test_service_books_stay_bounded_in_a_long_run() -> None:
    # a long-running scheduler scores pods that are then deleted while pending, and releases placed ones:
    # the pod -> service book keeps only placed pods (plus a bounded slack), not every name ever scored
    state = cluster(node("n0", gpus=2), node("n1", gpus=2))
    eng = engine(state, "load-aware")
    pol = eng.policy
    assert isinstance(pol, LoadAware)
    kept = placed(eng.place(replica("llm-keep")))[0]
    for i in range(3000):
        pol.peers(state, replica(f"llm-pending-{i}"), np.arange(2))  # scored, never placed
    assert len(pol._svc) <= 2 * len(state.assignments) + 1024 + 1
    assert pol._svc.get("llm-keep") == "label:llm"  # a placed pod keeps its service
    # its peers are still counted by label: a new replica of llm avoids the node holding llm-keep
    assert placed(eng.place(replica("llm-next")))[0] != kept
    eng.release("llm-next")
    assert "llm-next" not in pol._svc


def test_set_gpu_load_checks_shapes() -> None:
    state = cluster(node("n0", gpus=2))
    with pytest.raises(ValueError, match="util: shape"):
        set_gpu_load(state, util=np.zeros((1, 3)))


def test_telemetry_reaches_the_policy() -> None:
    state = cluster(node("n0", gpus=2), node("n1", gpus=2))
    tel = GpuTelemetry(max_age=60, clock=lambda: 1000.0)
    tel.update([GpuSample("n0", 0, 999.0, utilization=0.9, fb_used_mib=100.0, fb_free_mib=MEM - 100.0),
                GpuSample("n0", 1, 999.0, utilization=0.95, fb_used_mib=200.0, fb_free_mib=MEM - 200.0),
                GpuSample("n1", 0, 999.0, utilization=0.05)])
    util, mem = telemetry_load(tel, state)
    assert util[0].tolist() == [0.9, 0.95] and util[1, 0] == 0.05 and np.isnan(util[1, 1])
    assert mem[0].tolist() == [100.0, 200.0] and np.isnan(mem[1]).all()
    telemetry_prepare(tel)(state)  # what the live scheduler runs each cycle
    assert placed(engine(state, "load-aware").place(replica("llm-a")))[0] == "n1"
