"""The incremental cluster model (:mod:`gpupool.k8s.state`): changed in place by watch events, equal to a model
built from scratch on the same objects, and a cycle whose cost follows the pending pods and the changes."""

from __future__ import annotations

import copy
import itertools
import random

import numpy as np
import pytest

from gpupool.k8s import ANN_GPU_INDEX, ANN_GPU_MILLI, ANN_NODE
from gpupool.k8s.state import ClusterModel, queue_charge

_rv = itertools.count(100)


def node(name: str, gpus: int = 4, product: str = "NVIDIA-H100-80GB-HBM3", taints=None, **labels) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "resourceVersion": str(next(_rv)),
                         "labels": {"nvidia.com/gpu.product": product, **labels}},
            "spec": {"taints": taints} if taints else {},
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus)},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, gpu: int = 1, fraction: float | None = None, node_name: str | None = None, queue: str | None = None,
        devices: tuple[int, ...] | None = None, milli: int = 1000, gpumem: int | None = None, **meta) -> dict:
    ann: dict = {}
    limits: dict = {}
    if fraction is not None:
        ann["gpu-fraction"] = str(fraction)
    elif gpumem is not None:
        limits = {"nvidia.com/gpu": str(gpu), "nvidia.com/gpumem": str(gpumem)}
    elif gpu:
        limits = {"nvidia.com/gpu": str(gpu)}
    if node_name and devices is not None:
        ann.update({ANN_NODE: node_name, ANN_GPU_INDEX: ",".join(map(str, devices)), ANN_GPU_MILLI: str(milli)})
    labels = {"kueue.x-k8s.io/queue-name": queue} if queue else {}
    p = {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}-{next(_rv)}",
                      "resourceVersion": str(next(_rv)), "annotations": ann, "labels": labels,
                      "creationTimestamp": "2025-01-01T00:00:00Z", **meta},
         "spec": {"schedulerName": "gpupool",
                  "containers": [{"name": "c", "resources": {"limits": limits, "requests": {"cpu": "1"}}}]},
         "status": {"phase": "Running" if node_name else "Pending"}}
    if node_name:
        p["spec"]["nodeName"] = node_name
    return p


def bumped(obj: dict, **changes) -> dict:
    out = copy.deepcopy(obj)
    out["metadata"]["resourceVersion"] = str(next(_rv))
    for k, v in changes.items():
        if k == "node_name":
            out["spec"]["nodeName"] = v
        elif k == "phase":
            out["status"]["phase"] = v
        elif k == "annotations":
            out["metadata"]["annotations"].update(v)
        elif k == "taints":
            out["spec"]["taints"] = v
    return out


def books(model: ClusterModel) -> tuple:
    s = model.state
    assert s is not None
    s.check_invariants()
    return (s.node_names, s.cpu_free.tolist(), s.gpu_free.tolist(), s.gpu_mem_free.tolist(),
            {k: (a.node_name, a.gpus, a.gpu_milli) for k, a in s.assignments.items()},
            {q: v for q, v in model.queue_used.items() if v})


def fresh(model: ClusterModel) -> ClusterModel:
    """A model built from scratch on the objects ``model`` holds now (what a relist gives)."""
    other = ClusterModel()
    other.replace("nodes", [r.obj for r in model.nodes.values()])
    other.replace("pods", [r.obj for r in model.pods.values()])
    other.replace("queues", None if model.queues is None else list(model.queues.values()))
    other.refresh()
    return other


def test_pod_events_change_the_state_in_place():
    m = ClusterModel()
    m.replace("nodes", [node("a"), node("b")])
    m.replace("pods", [pod("x", node_name="a", devices=(0,))])
    m.cycle()
    assert m.stats["rebuilds"] == 1
    state = m.state
    assert state.gpu_free[0, 0] == 0
    y = pod("y", node_name="b", devices=(2,))
    m.apply("pods", "ADDED", y)
    assert state.gpu_free[1, 2] == 0  # counted at once, no rebuild
    m.apply("pods", "MODIFIED", bumped(y, phase="Succeeded"))
    assert state.gpu_free[1, 2] == 1000  # finished: released
    m.apply("pods", "DELETED", m.pods["default/x"].obj)
    assert state.gpu_free[0, 0] == 1000
    m.cycle()
    assert m.stats["rebuilds"] == 1 and m.state is state
    state.check_invariants()


def test_a_cycle_parses_only_what_changed():
    m = ClusterModel()
    m.replace("nodes", [node(f"n{i}") for i in range(50)])
    m.replace("pods", [pod(f"b{i}", node_name=f"n{i % 50}") for i in range(120)])
    m.apply("pods", "ADDED", pod("p0"))
    m.cycle()
    parsed, nodes_parsed = m.stats["parsed_pods"], m.stats["parsed_nodes"]
    for i in range(1, 6):
        m.apply("pods", "ADDED", pod(f"p{i}"))
        result = m.cycle()
        assert [p.pod for p in result.placements] == [f"default/p{i}"]  # the earlier ones are assumed
    assert m.stats["parsed_pods"] == parsed + 5 and m.stats["parsed_nodes"] == nodes_parsed
    assert m.stats["rebuilds"] == 1


def test_assumed_pod_holds_its_devices_until_forgotten_or_adopted():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=1)])
    p = pod("p")
    m.replace("pods", [p, pod("q")])
    result = {x.pod: x for x in m.cycle().placements}
    placed = [k for k, x in result.items() if x.node]
    assert len(placed) == 1  # one GPU for two whole-GPU pods
    winner = placed[0]
    loser = "default/q" if winner == "default/p" else "default/p"
    assert "Insufficient GPU share" in result[loser].reason
    assert m.cycle().placements[0].pod == loser  # the winner is assumed, not planned again
    assert m.forget(winner)
    assert m.state.gpu_free[0, 0] == 1000
    assert {x.pod for x in m.cycle().placements} == {winner, loser}
    # the watch shows the new winner bound where it was placed: adopted, devices unchanged
    new_winner = next(k for k in m.assumed)
    rec = m.pods[new_winner]
    m.apply("pods", "MODIFIED", bumped(rec.obj, node_name="a",
                                       annotations={ANN_NODE: "a", ANN_GPU_INDEX: "0", ANN_GPU_MILLI: "1000"}))
    assert not m.assumed and m.pods[new_winner].counted and m.state.gpu_free[0, 0] == 0
    assert books(m) == books(fresh(m))


def test_bound_elsewhere_replaces_the_assumption():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=1), node("b", gpus=1)])
    m.replace("pods", [pod("p")])
    placed = m.cycle().placements[0]
    other = "b" if placed.node == "a" else "a"
    m.apply("pods", "MODIFIED", bumped(m.pods["default/p"].obj, node_name=other))
    assert not m.assumed
    assert m.state.assignments["default/p"].node_name == other
    assert books(m) == books(fresh(m))


def test_taint_change_touches_only_that_node():
    m = ClusterModel()
    m.replace("nodes", [node("a"), node("b")])
    m.replace("pods", [])
    m.apply("pods", "ADDED", pod("warm"))
    m.cycle()
    version = m.state.version.copy()
    tainted = bumped(m.nodes["a"].obj, taints=[{"key": "k", "value": "v", "effect": "NoSchedule"}])
    m.apply("nodes", "MODIFIED", tainted)
    assert m.stats["rebuilds"] == 1
    assert (m.state.version - version).tolist() == [1, 0]
    m.apply("pods", "ADDED", pod("p"))
    assert m.cycle().placements[0].node == "b"


def test_capacity_change_rebuilds():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=2)])
    m.replace("pods", [pod("x", node_name="a", devices=(1,))])
    m.cycle()
    grown = node("a", gpus=4)
    m.apply("nodes", "MODIFIED", grown)
    m.apply("pods", "ADDED", pod("y", gpu=3))
    placed = m.cycle().placements[0]
    assert m.stats["rebuilds"] == 2 and placed.node == "a" and set(placed.gpus) == {0, 2, 3}


@pytest.mark.parametrize("seed", range(12))
def test_random_events_keep_the_books_equal_to_a_rebuild(seed):
    """Random adds, binds, finishes, deletions, moves and node taints, with cycles in between: after each
    step the incremental books equal those of a model built from scratch on the same objects."""
    rng = random.Random(seed)
    m = ClusterModel(seed=seed)
    nodes = [node(f"n{i}", gpus=rng.choice([2, 4, 8])) for i in range(6)]
    m.replace("nodes", nodes)
    m.replace("pods", [])
    m.replace("queues", [{"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": q},
                          "spec": {"quota": 4, "limit": 12}} for q in ("qa", "qb")])
    m.cycle()
    names = itertools.count()
    compared = 0
    for step in range(100):
        roll = rng.random()
        live = [r for r in m.pods.values()]
        if roll < 0.35 or not live:
            kind = rng.random()
            p = pod(f"p{next(names)}", gpu=rng.choice([1, 1, 2]),
                    fraction=rng.choice([None, 0.25, 0.5]) if kind < 0.5 else None,
                    gpumem=rng.choice([None, 20000]) if kind >= 0.5 else None,
                    queue=rng.choice([None, "qa", "qb"]))
            m.apply("pods", "ADDED", p)
        elif roll < 0.55:
            m.cycle()
        elif roll < 0.75:
            for key in list(m.assumed):  # the binders finish: most bound as placed, some fail
                if rng.random() < 0.2:
                    m.forget(key)
                    continue
                a = m.state.assignments[key]
                rec = m.pods[key]
                m.apply("pods", "MODIFIED", bumped(rec.obj, node_name=a.node_name, annotations={
                    ANN_NODE: a.node_name, ANN_GPU_INDEX: ",".join(map(str, a.gpus)),
                    ANN_GPU_MILLI: str(a.gpu_milli)}))
        elif roll < 0.8:
            r = rng.choice(live)
            m.apply("pods", "MODIFIED", bumped(r.obj, phase=rng.choice(["Succeeded", "Failed"])))
        elif roll < 0.9:
            r = rng.choice(live)
            m.apply("pods", "DELETED", r.obj)
        elif roll < 0.95 and m.assumed:
            m.forget(rng.choice(list(m.assumed)))
        else:
            i = rng.randrange(len(nodes))
            nodes[i] = bumped(m.nodes[f"n{i}"].obj, taints=rng.choice(
                [None, [{"key": "x", "effect": "NoSchedule"}]]))
            m.apply("nodes", "MODIFIED", nodes[i])
        if m.assumed:
            continue  # a rebuilt model knows nothing of assumptions: compare when none is in flight
        if m.state is not None and not m._dirty:
            assert books(m) == books(fresh(m)), f"step {step}"
            compared += 1
    assert compared >= 10
    m.state.check_invariants()


def test_relist_detects_no_drift_when_books_are_right():
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.replace("pods", [pod("x", node_name="a", devices=(0,))])
    m.cycle()
    m.replace("pods", [r.obj for r in m.pods.values()])
    m.cycle()
    assert m.stats["rebuilds"] == 2 and m.stats["drift"] == 0


def test_relist_reports_drift():
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.replace("pods", [pod("x", node_name="a", devices=(0,))])
    m.cycle()
    m.state.release("default/x")  # a bug's worth of drift: the books lost a pod
    m.replace("pods", [r.obj for r in m.pods.values()])
    m.cycle()
    assert m.stats["drift"] == 1 and m.state.gpu_free[0, 0] == 0


def test_queue_charge_of_memory_shares():
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.replace("pods", [pod("x", node_name="a", gpumem=70000, devices=(0,), milli=1)])
    m.cycle()
    info = m.pods["default/x"].info
    a = m.state.assignments["default/x"]
    assert queue_charge(info, a, m.state) == int(np.ceil(70000 * 1000 / 81559))
    assert queue_charge(info, None, None) == 1  # declared share: the lower bound used before placing


def _queue(name: str, limit) -> dict:
    return {"apiVersion": "gpupool.io/v1alpha1", "kind": "Queue", "metadata": {"name": name},
            "spec": {"quota": limit, "limit": limit}}


def test_time_sliced_pods_are_charged_their_slice():
    sliced = node("ts", gpus=8, product="NVIDIA-L4-SHARED")  # 2 physical L4 x 4 replicas
    sliced["metadata"]["labels"].update({"nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.count": "2",
                                         "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    m = ClusterModel()
    m.replace("nodes", [sliced])
    m.replace("queues", [_queue("team", 1)])
    m.replace("pods", [pod(f"s{i}", queue="team", creationTimestamp=f"2025-01-01T00:00:0{i}Z") for i in range(5)])
    result = {p.pod: p for p in m.cycle().placements}
    placed = sorted(k for k, p in result.items() if p.node)
    assert placed == [f"default/s{i}" for i in range(4)]  # 4 x 250 milli = the 1-GPU limit
    assert all(result[k].gpu_milli == 250 for k in placed)
    assert "queue team would exceed its limit: 1 of 1 GPU in use" in result["default/s4"].reason


def test_exact_charge_releases_a_pod_that_breaks_the_limit():
    m = ClusterModel(share_enforcement="trust")  # memory-sized pods are placed: something enforces the cap
    m.replace("nodes", [node("a")])
    m.replace("queues", [_queue("team", 1)])
    m.replace("pods", [pod("m0", gpumem=50000, queue="team", creationTimestamp="2025-01-01T00:00:01Z"),
                       pod("m1", gpumem=50000, queue="team", creationTimestamp="2025-01-01T00:00:02Z")])
    result = {p.pod: p for p in m.cycle().placements}
    assert result["default/m0"].node == "a" and result["default/m1"].node is None
    assert "queue team would exceed its limit: 0.614 of 1 GPU in use, 0.614 more asked" in result["default/m1"].reason
    assert list(m.state.assignments) == ["default/m0"]  # the trial placement of m1 was released


def test_gang_minimum_within_the_limit_and_the_rest_one_by_one():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=8)])
    m.replace("queues", [_queue("team", 3)])
    m.replace("podgroups", [{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                             "metadata": {"name": "g", "namespace": "default"}, "spec": {"minMember": 2}}])
    members = [pod(f"w{i}", queue="team", labels=None) for i in range(5)]
    for p in members:
        p["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "team", "scheduling.x-k8s.io/pod-group": "g"}
    m.replace("pods", members)
    result = m.cycle().placements
    assert sum(1 for p in result if p.node) == 3
    waiting = [p for p in result if not p.node]
    assert all("gang default/g has its minMember without this pod" in p.reason for p in waiting)
    assert all("2 of 3 GPU in use" not in p.reason for p in waiting)  # charged as kept: 3 of 3
    m2 = ClusterModel()
    m2.replace("nodes", [node("a", gpus=8)])
    m2.replace("queues", [_queue("team", 1)])
    m2.replace("podgroups", [{"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                              "metadata": {"name": "g", "namespace": "default"}, "spec": {"minMember": 2}}])
    m2.replace("pods", [copy.deepcopy(p) for p in members])
    result = m2.cycle().placements
    assert not any(p.node for p in result) and not m2.state.assignments  # the minimum breaks the limit


def test_forbidden_queues_make_queued_pods_wait_until_listed():
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.forbid("queues", "403 Forbidden")
    m.replace("pods", [pod("q", queue="team"), pod("free")])
    result = {p.pod: p for p in m.cycle().placements}
    assert result["default/free"].node == "a"  # pods of no queue are not held up
    assert result["default/q"].node is None and "Queue objects cannot be read (403 Forbidden)" in result[
        "default/q"].reason
    m.replace("queues", [_queue("team", 2)])
    assert m.cycle().placements[0].node == "a"


# ------------------------------------------------------------------ found by trying to break it
def _other_scheduler(p: dict) -> dict:
    p["spec"]["schedulerName"] = "kai-scheduler"
    return p


def test_named_devices_are_counted_before_guessed_ones_whatever_the_event_order():
    """A pod another scheduler bound without naming devices (guessed onto GPU 0), then gpupool's own pod whose
    annotation names GPU 0: the named pod gets GPU 0 and the guessed one moves, as a rebuild counts them."""
    m = ClusterModel(share_enforcement="trust")  # the new fractional pod is placed: something enforces shares
    m.replace("nodes", [node("a", gpus=2)])
    m.replace("pods", [])
    m.refresh()
    m.apply("pods", "ADDED", _other_scheduler(pod("other", fraction=0.5, node_name="a")))
    m.apply("pods", "ADDED", pod("mine", node_name="a", devices=(0,)))
    assert m.state.assignments["default/mine"].gpus == (0,)
    assert m.state.assignments["default/other"].gpus == (1,)
    assert books(m) == books(fresh(m))
    m.apply("pods", "ADDED", pod("new", fraction=0.5))
    assert m.cycle().placements[0].gpus == (1,)  # never onto the GPU gpupool's annotation says is fully held


def test_relist_with_another_gpu_count_rebuilds_without_a_false_drift():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=4)])
    m.replace("pods", [])
    m.cycle()
    m.replace("nodes", [node("a", gpus=8)])
    m.apply("pods", "ADDED", pod("y", gpu=6))
    assert m.cycle().placements[0].node == "a"
    smaller = node("a", gpus=8)
    smaller["status"]["allocatable"]["cpu"] = "16"
    m.replace("nodes", [smaller])
    m.refresh()
    assert m.stats["drift"] == 0


def test_an_annotation_below_the_request_never_undercounts():
    held = pod("held", node_name="a")
    held["metadata"]["annotations"] = {ANN_NODE: "a", ANN_GPU_INDEX: "0", ANN_GPU_MILLI: ""}
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=1)])
    m.replace("pods", [_other_scheduler(held), pod("newcomer", fraction=0.9)])
    assert m.cycle().placements[0].node is None
    assert m.state.gpu_free[0, 0] == 0


def test_a_late_deleted_of_an_older_uid_keeps_the_recreated_pod():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=2)])
    m.replace("pods", [])
    m.refresh()
    first = pod("y", node_name="a", devices=(1,), uid="U1")
    m.apply("pods", "ADDED", first)
    m.apply("pods", "ADDED", pod("y", node_name="a", devices=(1,), uid="U2"))
    m.apply("pods", "DELETED", first)
    assert "default/y" in m.state.assignments and m.pods["default/y"].uid == "U2"


def test_bookmarks_and_nameless_nodes_change_nothing():
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.replace("pods", [])
    m.refresh()
    m.apply("pods", "BOOKMARK", {"metadata": {"resourceVersion": "9"}})
    m.apply("nodes", "ADDED", {"kind": "Node", "metadata": {}})
    assert not m._dirty and list(m.nodes) == ["a"] and m.skipped_nodes()


def test_an_empty_queue_list_in_a_snapshot_means_the_crd_is_installed():
    from gpupool.k8s.snapshot import plan, snapshot_from_objects

    objs = [node("a"), pod("p", queue="team-a")]
    assert plan(snapshot_from_objects(objs)).placements[0].node == "a"  # no Queue CRD: no limits
    empty = {"apiVersion": "gpupool.io/v1alpha1", "kind": "QueueList", "items": []}
    result = plan(snapshot_from_objects([*objs, empty])).placements[0]
    assert result.node is None and result.reason.startswith("queue team-a not found")
    m = ClusterModel()
    m.replace("nodes", [node("a")])
    m.replace("queues", [])
    m.replace("pods", [pod("p", queue="team-a")])
    assert m.cycle().placements[0].reason == result.reason  # the live model says the same


def test_a_pod_that_failed_is_not_planned_again_while_nothing_changed():
    m = ClusterModel()
    m.replace("nodes", [node("a", gpus=1)])
    m.replace("queues", [_queue("team", 8)])
    m.replace("pods", [pod("big", gpu=2), pod("q", gpu=2, queue="team")])
    first = {p.pod: p.reason for p in m.cycle().placements}
    again = {p.pod: p.reason for p in m.cycle().placements}
    assert again == first and m.stats["skipped_unchanged"] == 2
    m.apply("queues", "MODIFIED", _queue("team", 9))  # a Queue change: both are planned again
    m.cycle()
    assert m.stats["skipped_unchanged"] == 2
    m.apply("nodes", "ADDED", node("b", gpus=4))  # room at last
    assert {p.pod: p.node for p in m.cycle().placements} == {"default/big": "b", "default/q": "b"}
