"""Minimized cases the books fuzz test (test_k8s_pool_books_fuzz.py) found in the live pool driver's job books: a
new job under an old name inherits the old job's service when its pods are seen before the old books are put away
(in the first cycle after an eviction, or after a pod deleted and re-applied between two cycles), or when the old
job's pods left just before a driver rebuild; and a nominated placement that never ran is charged as service."""

from __future__ import annotations

from k8s_pool_harness import Cluster, node, pod, queue
from test_k8s_pool_evicted_books import T0, _evict_g, _gang_cluster, _new_podgroup, _owned


def _one_gpu() -> Cluster:
    return Cluster([node("n1", gpus=1)], [queue("a", quota=1)], order="tiresias", promote_knob=0, min_run_s=0.0,
                   reclaim_min_run_s=0.0, thresholds=(100.0,))


def test_a_new_podgroup_seen_in_the_first_cycle_after_the_eviction_starts_afresh():
    # fuzz seed 7: g (600 GPU-s) is evicted; before the next cycle its PodGroup is replaced by a new one (a new
    # uid: a new job under the same name) with its pods. The driver has not stashed g's books yet (that happens
    # when a cycle finds no pod of g), so the new job takes them without the identity check: 600 GPU-s, g's
    # submission
    c, g1 = _gang_cluster()
    served = _evict_g(c)
    _new_podgroup(c, g1, "pg-uid-2")
    t = c.now - T0
    c.add(pod("g-0", 1, queue="a", group="g", created=t), pod("g-1", 1, queue="a", group="g", created=t))
    c.run(2)
    job = c.driver.jobs["default/g"]
    assert served > 500.0
    assert job.attained_at(c.now) < 10.0 and job.submit_time > c.now - 10, (job.attained_at(c.now), job.submit_time)


def test_a_pod_deleted_and_reapplied_between_two_cycles_starts_afresh():
    # fuzz seed 3: a bare pod runs 100 s; it is deleted and a new pod applied under its name before the next cycle
    # (kubectl replace --force): a new job, yet it runs on with the old pod's 100 GPU-s. A cycle later it would
    # start afresh (the old job's books go when a cycle finds none of its pods)
    c = _one_gpu()
    c.add(pod("b", 1, queue="a"))
    c.run(100)
    c.delete("default/b")
    c.add(pod("b", 1, queue="a", created=100.0))
    c.run(2)
    assert c.running() == ["default/b"]
    job = c.driver.jobs["default/b"]
    assert job.attained_at(c.now) < 10.0, job.attained_at(c.now)


def test_a_job_that_ended_just_before_a_rebuild_leaves_no_books():
    # fuzz seed 18: s-0 (a StatefulSet's pod) runs 100 s and fails; a node is added before the next cycle (the driver
    # rebuilds its scheduler). The rebuild keeps the books of every job that was running, and nothing removes those
    # of a job none of whose pods is left: driver.info keeps them for good (no expiry), and a pod of a new
    # StatefulSet under the same name, created any time later, gets 100 GPU-s and the old submission
    c = _one_gpu()
    c.add(_owned(pod("s-0", 1, queue="a"), "sts-1"))
    c.run(100)
    c.finish("default/s-0", "Failed")
    c.model.apply("nodes", "ADDED", node("n9", gpus=0))
    c.run(2)
    c.delete("default/s-0")
    c.run(2)
    assert "default/s-0" not in c.driver.info, c.driver.info["default/s-0"]
    c.run(300)
    c.add(_owned(pod("s-0", 1, queue="a", created=c.now - T0), "sts-2"))
    c.run(2)
    job = c.driver.jobs["default/s-0"]
    assert job.attained_at(c.now) < 10.0 and job.submit_time > c.now - 10, (job.attained_at(c.now), job.submit_time)


def test_a_nominated_job_is_not_charged_while_its_victim_does_not_go():
    # fuzz seed 1: hi preempts lo, whose kubelet is stuck; hi is nominated (held, not bound) until the eviction lapses
    # (grace 2 s + slack 30 s). The driver attaches hi as running from the nomination: it is charged ~32 GPU-s it
    # never ran, and keeps them after the lapse (its rank under 2D-LAS / Gittins drops for nothing)
    c = _one_gpu()
    c.add(pod("lo", 1, queue="a", grace=2))
    c.run(10)
    c.slow.add("default/lo")
    c.add(pod("hi", 1, queue="a", priority=50, created=10.0))
    c.run(20)
    assert "default/hi" not in c.running() and "default/hi" in c.driver.held
    assert c.driver.jobs["default/hi"].attained_at(c.now) < 5.0, c.driver.jobs["default/hi"].attained_at(c.now)


def test_a_refused_eviction_after_a_resize_counts_the_run_once():
    # fuzz seed 26: gang g (minMember 1) runs 2 pods 100 s, g-1 finishes: the driver books 200 GPU-s (g-0's 100 s
    # included) and g runs on from then on g-0. At 150 s hi preempts g-0 but a PodDisruptionBudget refuses: g-0 is
    # counted again and g re-attached with its run "from its pods' start" (g-0's startTime, 0 s) on the service
    # before the evicted run (200): 350 GPU-s for 250 run
    from k8s_pool_harness import pod_group

    g = pod_group("g", 1)
    g["metadata"]["uid"] = "pg-uid-1"
    c = Cluster([node("n1", gpus=2)], [queue("a", quota=2)], groups=[g], order="tiresias", promote_knob=0,
                min_run_s=0.0, reclaim_min_run_s=0.0, thresholds=(100000.0,))
    c.add(pod("g-0", 1, queue="a", group="g"), pod("g-1", 1, queue="a", group="g"))
    c.run(100)
    c.finish("default/g-1")
    c.add(pod("f", 1, queue="a", priority=50, created=100.0))
    c.run(50)
    c.pdb_blocked.add("default/g-0")
    for p in c.pods.values():  # the kubelet's startTime (the driver's "pods' start")
        p["status"].setdefault("startTime", "2023-11-14T22:13:20Z")  # T0
    c.model.apply("pods", "MODIFIED", c.pods["default/g-0"])
    c.add(pod("hi", 1, queue="a", priority=50, created=150.0))
    c.run(3)
    assert c.driver.stats["refused"] >= 1 and "default/g-0" in c.running()
    job = c.driver.jobs["default/g"]
    assert job.attained_at(c.now) <= 100.0 + (c.now - T0) + 3.0, job.attained_at(c.now)  # g-1 100 s, g-0 all along
