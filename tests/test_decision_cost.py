"""Decision cost flat in the cluster size (issue 12, item 3), with the decisions of before.

The engine now finds changed nodes from the cluster's change log, keeps each node's first failing filter with
its mask (the unschedulable message is a count), picks the best node of a ``tie_break = "first"`` policy from a
heap, and refreshes masks and FGD / gpupool scores with compiled kernels (numba) where present. Checked here:

* every policy decides exactly as the engine before these changes (:class:`ReferenceEngine`, its code kept
  verbatim below) over a few thousand pods on a few hundred nodes, with pods that fit nowhere, releases, GPU
  failures and repairs and touched nodes, with the compiled kernels on and off;
* the failure-code message equals the full scan's, and the compiled codes equal the NumPy ones;
* the compiled FGD / gpupool scorer gives the policy's own scores, GPU choices and books, bit for bit;
* the change log, including when it is trimmed;
* without numba (``GPUPOOL_NO_NUMBA=1``, a subprocess) the decisions are the same.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest

from conftest import node, pod
from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.core import Decision, Engine
from gpupool.engine.filters import (
    CODE_STRIDE,
    DEFAULT_FILTERS,
    EffectiveRequest,
    failure_codes,
    feasible,
    reason_from_counts,
    unschedulable_reason,
)
from gpupool.engine.kernels import fgd as fgd_kernels
from gpupool.engine.kernels import filters as filter_kernels
from gpupool.model import AllocationError, NodeSpec
from gpupool.policies import REGISTRY, fgd_compiled, make_policy

needs_numba = pytest.mark.skipif(not kernels.enabled(), reason="numba not installed or GPUPOOL_NO_NUMBA set")


# --------------------------------------------------------------------------- the engine as it was (3936f61)
class _RefEntry:
    __slots__ = ("snap", "seen", "values")

    def __init__(self, n: int) -> None:
        self.snap = np.full(n, -1, dtype=np.int64)
        self.seen = -1
        self.values = None


class _RefCache:
    def __init__(self, state: ClusterState, size: int) -> None:
        self.state = state
        self.size = size
        self.entries: OrderedDict = OrderedDict()

    def get(self, key, compute, dtype):
        state = self.state
        entry = self.entries.get(key)
        if entry is None:
            entry = _RefEntry(state.n_nodes)
            entry.values = np.empty(state.n_nodes, dtype=dtype)
            self.entries[key] = entry
            if len(self.entries) > self.size:
                self.entries.popitem(last=False)
        else:
            self.entries.move_to_end(key)
            if entry.seen == state.changes:
                return entry.values
        stale = (entry.snap != state.version).nonzero()[0]
        if len(stale):
            entry.values[stale] = compute(stale)
            entry.snap[stale] = state.version[stale]
        entry.seen = state.changes
        return entry.values


class ReferenceEngine(Engine):
    """The engine's selection before the change log, failure codes, best-node heap and compiled kernels:
    version scans, ``feasible`` masks, ``argmax`` over the candidates, the full-scan unschedulable message."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._ref_mask = _RefCache(self.state, 512)
        self._ref_score = _RefCache(self.state, 512)
        self._ref_reasons: dict = {}

    def feasible_mask(self, eff):
        state, filters = self.state, self.policy.filters
        return self._ref_mask.get(eff.key(), lambda idx: feasible(state, eff, idx, filters), bool)

    def _select(self, req):
        policy, state = self.policy, self.state
        eff = policy.effective(req)
        mask = self.feasible_mask(eff)
        candidates = mask.nonzero()[0]
        if len(candidates) == 0:
            return eff, -1, ()
        if policy.node_local:
            all_scores = self._ref_score.get(
                ("score",) + policy.score_key(eff), lambda idx: policy.score(state, eff, idx), np.float64
            )
            scores = all_scores[candidates]
        else:
            scores = policy.score(state, eff, candidates)
        node = policy.pick(state, candidates, scores, self.rng)
        return eff, node, policy.select_gpus(state, eff, node)

    def unschedulable_reason(self, eff):
        key = eff.key()
        hit = self._ref_reasons.get(key)
        if hit is not None and hit[0] == self.state.changes:
            return hit[1]
        reason = unschedulable_reason(self.state, eff, self.policy.filters)
        self._ref_reasons[key] = (self.state.changes, reason)
        return reason


# --------------------------------------------------------------------------- a mixed cluster and workload
MODELS = ("V100M16", "T4", "A100", "G2")


def mixed_nodes(rng: random.Random, n: int) -> list[NodeSpec]:
    """Nodes of several models (some CPU-only, some time-sliced, some of unknown GPU memory)."""
    out = []
    for i in range(n):
        r = rng.random()
        if r < 0.08:
            out.append(node(f"n{i}", cpu=rng.choice([16000, 64000]), mem=rng.choice([32768, 131072])))
            continue
        model = rng.choice(MODELS)
        spec = NodeSpec(f"n{i}", cpu_milli=rng.choice([16000, 32000, 64000, 96000]),
                        memory_mib=rng.choice([65536, 131072, 262144]), gpu_count=rng.choice([1, 2, 4, 8]),
                        gpu_model=model, gpu_replicas=4 if r > 0.95 else 1,
                        gpu_memory_mib=0 if model != "G2" or rng.random() < 0.5 else 16384)
        out.append(spec)
    return out


def random_pod(rng: random.Random, name: str):
    r = rng.random()
    cpu = rng.choice([0, 1000, 2000, 4000, 8000, 16000])
    mem = rng.choice([0, 1024, 4096, 16384])
    if r < 0.12:
        return pod(name, cpu=cpu, mem=mem)
    if r < 0.5:
        return pod(name, cpu=cpu, mem=mem, gpus=1, milli=rng.choice([100, 250, 300, 500, 700]),
                   gpu_mem=rng.choice([0, 0, 0, 4000]), spec=rng.choice([(), (), (), ("T4",), ("A100", "V100M16")]))
    if r < 0.85:
        return pod(name, cpu=cpu, mem=mem, gpus=rng.choice([1, 1, 2, 4]),
                   spec=rng.choice([(), (), ("G2",), ("V100M16", "T4")]))
    if r < 0.92:  # too large for any node: fits nowhere
        return pod(name, cpu=cpu, mem=mem, gpus=rng.choice([8, 16]), spec=rng.choice([(), ("T4",), ("H100",)]))
    return pod(name, cpu=rng.choice([128000, 200000]), mem=mem, gpus=1)


def _outcome(d: Decision):
    a = d.assignment
    return (a.node, a.gpus, a.gpu_milli) if a is not None else d.reason


def _place(engine: Engine, p):
    """The outcome of ``engine.place(p)``; an AllocationError the policy's device choice runs into (k8s-default
    picks whole free GPUs on a time-sliced node) is an outcome too, which both engines must share."""
    try:
        return _outcome(engine.place(p))
    except AllocationError as e:
        return ("error", str(e))


def run_side_by_side(policy: str, n_nodes: int, n_pods: int, seed: int, compiled_on: bool = True) -> int:
    """Both engines through the same pods, releases, GPU failures / repairs and touches; asserts each decision
    is the same; returns how many pods fit nowhere."""
    rng = random.Random(seed)
    specs = mixed_nodes(rng, n_nodes)
    workload = [random_pod(rng, f"w{i}") for i in range(300)]
    ref_state, new_state = ClusterState(specs), ClusterState(specs)
    ref = ReferenceEngine(ref_state, make_policy(policy), seed=seed, workload=workload)
    new = Engine(new_state, make_policy(policy), seed=seed, workload=workload)
    if not compiled_on:
        new._codes = new._scorer = None
    failed = 0
    for i in range(n_pods):
        r = rng.random()
        if r < 0.2 and ref_state.assignments:
            name = rng.choice(sorted(ref_state.assignments))
            assert ref.release(name) == new.release(name)
            continue
        if r < 0.23:
            n = rng.randrange(n_nodes)
            if ref_state.gpu_count[n]:
                g = rng.randrange(int(ref_state.gpu_count[n]))
                healthy = rng.random() < 0.5
                ref_state.set_gpu_health(n, g, healthy)
                new_state.set_gpu_health(n, g, healthy)
            else:
                ref_state.touch(n)
                new_state.touch(n)
            continue
        p = random_pod(rng, f"p{i}")
        if rng.random() < 0.1:  # schedule only (no change), then place
            assert _outcome(ref.schedule(p)) == _outcome(new.schedule(p)), (policy, i)
        a, b = _place(ref, p), _place(new, p)
        assert a == b, (policy, i, p)
        failed += isinstance(a, str)
    np.testing.assert_array_equal(ref_state.gpu_free, new_state.gpu_free)
    return failed


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_every_policy_decides_as_before(policy) -> None:
    failed = run_side_by_side(policy, n_nodes=150, n_pods=1200, seed=5)
    assert failed > 50  # the stream does exercise the unschedulable path


@pytest.mark.parametrize("compiled_on", [True, False])
@pytest.mark.parametrize("policy", ["gpupool", "fgd"])
def test_gpupool_and_fgd_decide_as_before_over_thousands_of_pods(policy, compiled_on) -> None:
    failed = run_side_by_side(policy, n_nodes=300, n_pods=3000, seed=11, compiled_on=compiled_on)
    assert failed > 100


@pytest.mark.parametrize("policy", ["gpupool", "fgd"])
def test_a_best_node_heap_of_a_few_nodes_rebuilds_when_they_run_out(policy, monkeypatch) -> None:
    monkeypatch.setattr(Engine, "HEAP_KEEP", 3)
    run_side_by_side(policy, n_nodes=120, n_pods=1500, seed=13)


def test_dedup_path_of_a_large_cluster_decides_as_before() -> None:
    """Over 1,024 nodes a fresh request class is scored on distinct node states only (FGD's dedup path)."""
    run_side_by_side("gpupool", n_nodes=1100, n_pods=400, seed=3)


# --------------------------------------------------------------------------- failure codes
def _random_state(rng: random.Random, n: int = 60) -> ClusterState:
    st = ClusterState(mixed_nodes(rng, n))
    for k in range(6 * n):
        p = random_pod(rng, f"x{k}")
        nd = rng.randrange(n)
        eff = EffectiveRequest(p, p.gpu_milli)
        ok = failure_codes(st, eff, np.array([nd])) == 0
        if ok[0]:
            from gpupool.engine.core import best_fit_gpus

            st.allocate(p, nd, best_fit_gpus(st, eff, nd))
    for _ in range(n // 4):
        nd = rng.randrange(n)
        if st.gpu_count[nd]:
            st.set_gpu_health(nd, rng.randrange(int(st.gpu_count[nd])), False)
    return st


@pytest.mark.parametrize("seed", range(6))
def test_reason_from_failure_codes_equals_the_full_scan(seed) -> None:
    rng = random.Random(seed)
    st = _random_state(rng)
    nodes = np.arange(st.n_nodes)
    for i in range(80):
        p = random_pod(rng, f"q{i}")
        eff = EffectiveRequest(p, p.gpu_milli if rng.random() < 0.8 or not p.num_gpu else 1000)
        codes = failure_codes(st, eff, nodes)
        np.testing.assert_array_equal(codes == 0, feasible(st, eff, nodes))
        counts = np.bincount(codes, minlength=(len(DEFAULT_FILTERS) + 1) * CODE_STRIDE)
        assert reason_from_counts(st, eff, counts) == unschedulable_reason(st, eff)
        if kernels.enabled():
            np.testing.assert_array_equal(filter_kernels.failure_codes_default(st, eff, nodes), codes)
            sub = np.array(sorted(rng.sample(range(st.n_nodes), 5)))
            np.testing.assert_array_equal(filter_kernels.failure_codes_default(st, eff, sub), codes[sub])


# --------------------------------------------------------------------------- compiled scorer
@needs_numba
def test_compiled_fgd_mirror_is_current() -> None:
    assert fgd_compiled.fgd_mirror_current(), (
        "FGD / FragModel changed since the compiled scorer was checked: run tests/test_decision_cost.py, and if "
        f"it passes add {fgd_compiled.fingerprint()!r} to fgd_compiled.FGD_FINGERPRINTS")
    from gpupool.policies.gpupool_policy import GpupoolPolicy

    assert fgd_compiled.gpupool_final_current(), (
        "GpupoolPolicy._final_score changed: update fgd_compiled.FGDScorer._gpupool_final to match, then set "
        f"fgd_compiled.GPUPOOL_FINAL_FINGERPRINT to {kernels.source_hash(GpupoolPolicy._final_score)!r}")


@needs_numba
@pytest.mark.parametrize("name", ["fgd", "gpupool"])
@pytest.mark.parametrize("seed", range(4))
def test_compiled_scorer_equals_the_policy_score(name, seed) -> None:
    rng = random.Random(seed)
    st = _random_state(rng, 80)
    workload = [random_pod(rng, f"w{i}") for i in range(200)]
    pol = make_policy(name)
    pol.prepare(st, workload)
    twin = copy.deepcopy(pol)
    scorer = fgd_compiled.FGDScorer(twin)
    assert fgd_compiled.FGDScorer.supports(twin)
    assert scorer.final is not None  # the final score from the kernel's shares too, checked bit for bit below
    for i in range(60):
        p = random_pod(rng, f"q{i}")
        eff = EffectiveRequest(p, p.gpu_milli)
        k = rng.choice([1, 3, 7, 20, st.n_nodes])
        idx = np.array(sorted(rng.sample(range(st.n_nodes), k)))
        want = pol.score(st, eff, idx)
        got = scorer.score(st, eff, idx)
        assert got.tobytes() == want.tobytes()
        np.testing.assert_array_equal(twin._before, pol._before)
        assert twin._choices.keys() == pol._choices.keys()
        for key in pol._choices:
            np.testing.assert_array_equal(twin._choices[key], pol._choices[key])
        if i % 5 == 0:  # change some nodes between calls
            nd = rng.randrange(st.n_nodes)
            if st.gpu_count[nd]:
                st.set_gpu_health(nd, 0, not bool(st.gpu_healthy[nd, 0]))


@needs_numba
@pytest.mark.parametrize("name", ["fgd", "gpupool"])
def test_whole_gpu_pods_that_fragment_nothing_are_decided_by_the_kernel(name, monkeypatch) -> None:
    """A whole-GPU pod on nodes it leaves unfragmented scores exactly 50 (a zero decrease): the kernel says so
    itself (no detour through NumPy's exact path, which the job simulator took for 80% of its refreshes), with
    the policy's own scores, bit for bit, also next to nodes it does fragment (CPU left short)."""
    st = ClusterState([node(f"n{i}", gpus=8, cpu=64_000 if i % 3 else 5_000) for i in range(12)])
    workload = [pod(f"w{i}", cpu=4_000, gpus=1) for i in range(20)]  # Philly's typical pod: one GPU
    pol = make_policy(name)
    pol.prepare(st, workload)
    twin = copy.deepcopy(pol)
    scorer = fgd_compiled.FGDScorer(twin)
    calls: list[bool] = []
    kernel = fgd_kernels.fgd_nodes
    monkeypatch.setattr(fgd_kernels, "fgd_nodes", lambda *a: calls.append(kernel(*a)) or calls[-1])
    idx = np.arange(st.n_nodes)
    for g in (1, 2, 4, 8):
        eff = EffectiveRequest(pod(f"p{g}", cpu=1_000 * g, gpus=g), 1000)
        want = pol.score(st, eff, idx)
        got = scorer.score(st, eff, idx)
        assert got.tobytes() == want.tobytes()
        assert (np.abs(got - 50.0) < 1e-3).any()  # nodes with room for everything: unfragmented (gpupool's
        # final score adds < 1e-3); CPU-short nodes left GPUs: fragmented (fgd < 49; gpupool's stranding term
        # adds back more than that, since a pod there strands fewer GPUs than it uses)
        assert g in (1, 8) or (np.abs(got - 50.0) > 1.0).any()
    assert calls and not any(calls)  # never unsure


@needs_numba
@pytest.mark.parametrize("strand_memory", [False, True])
def test_compiled_stranding_term_equals_the_policy_and_is_skipped_when_zero(strand_memory, monkeypatch) -> None:
    """gpupool's CPU (and memory) stranding term from the kernel (``_strand_delta``) is the policy's, bit for bit;
    where nothing strands before or after the placement, the kernel says so and the scores are left as they are
    (the job simulator's case: no pod asks more CPU per GPU than its node has)."""
    rng = random.Random(7)
    st = _random_state(rng, 80)
    workload = [random_pod(rng, f"w{i}") for i in range(200)]
    pol = type("P", (make_policy("gpupool").__class__,), {"strand_memory": strand_memory})()
    pol.prepare(st, workload)
    assert pol.cpu_ratio > 0 and (pol.mem_ratio > 0) == strand_memory
    twin = copy.deepcopy(pol)
    scorer = fgd_compiled.FGDScorer(twin)
    assert scorer.final is not None
    seen: list[bool] = []
    kernel = fgd_kernels.strand_delta
    monkeypatch.setattr(fgd_kernels, "strand_delta", lambda *a: seen.append(kernel(*a)) or seen[-1])
    for i in range(80):
        p = random_pod(rng, f"q{i}")
        eff = EffectiveRequest(p, p.gpu_milli)
        idx = np.array(sorted(rng.sample(range(st.n_nodes), rng.choice([1, 5, st.n_nodes]))))
        assert scorer.score(st, eff, idx).tobytes() == pol.score(st, eff, idx).tobytes()
    assert any(seen) and not all(seen)  # both the nonzero and the all-zero case were met
    # a roomy cluster with the job simulator's pods (half a node's CPU per GPU): never anything stranded
    roomy = ClusterState([node(f"r{i}", gpus=8, cpu=64_000) for i in range(6)])
    pol2 = make_policy("gpupool")
    pol2.prepare(roomy, [pod(f"w{i}", cpu=4_000 * g, gpus=g) for i, g in enumerate((1, 2, 4, 8))])
    seen.clear()
    scorer2 = fgd_compiled.FGDScorer(copy.deepcopy(pol2))
    for g in (1, 2, 4, 8):
        eff = EffectiveRequest(pod(f"p{g}", cpu=4_000 * g, gpus=g), 1000)
        assert scorer2.score(roomy, eff, np.arange(6)).tobytes() == pol2.score(roomy, eff, np.arange(6)).tobytes()
    assert seen and not any(seen)


@needs_numba
def test_a_changed_policy_turns_the_compiled_scorer_off(monkeypatch) -> None:
    from gpupool.policies.fgd import FGD

    class Tweaked(FGD):
        def _evaluate(self, state, req, nodes):
            return super()._evaluate(state, req, nodes)

    st = ClusterState([node("n0", gpus=2)])
    policies = [make_policy("gpupool"), Tweaked(), make_policy("fgd")]
    for p in policies:
        p.prepare(st, [pod("w", gpus=1)])
    assert fgd_compiled.FGDScorer.supports(policies[0])
    assert not fgd_compiled.FGDScorer.supports(policies[1])
    assert Engine(st, policies[1])._scorer is None
    monkeypatch.setattr(fgd_compiled, "_fingerprint_ok", False)
    assert not fgd_compiled.FGDScorer.supports(policies[2])


# --------------------------------------------------------------------------- change log
def test_changed_since_lists_each_changed_node_once_and_gives_up_past_the_log(monkeypatch) -> None:
    st = ClusterState([node(f"n{i}", gpus=2) for i in range(5)])
    monkeypatch.setattr(ClusterState, "LOG_KEEP", 4)
    assert st.changed_since(0) == []
    a = st.allocate(pod("a", gpus=1), 3, (0,))
    st.set_gpu_health(1, 1, False)
    st.touch(3)
    assert st.changed_since(0) == [1, 3]
    assert st.changed_since(2) == [3]
    assert st.changed_since(3) == []
    assert st.changed_since(4) is None  # not a past count
    for _ in range(12):
        st.touch(0)
    st.release(a.pod)
    assert st.changed_since(0) is None  # trimmed away: the caller scans versions
    assert st.changed_since(st.changes - 2) == [0, 3]
    with pytest.raises(AllocationError):
        st.touch(9)


# --------------------------------------------------------------------------- without numba
_SCRIPT = """
import hashlib, json, random, sys
sys.path.insert(0, {tests!r})
from test_decision_cost import mixed_nodes, random_pod, _outcome
from gpupool.cluster import ClusterState
from gpupool.engine import kernels
from gpupool.engine.core import Engine
from gpupool.policies import make_policy
rng = random.Random(9)
state = ClusterState(mixed_nodes(rng, 120))
eng = Engine(state, make_policy("gpupool"), seed=9, workload=[random_pod(rng, f"w{{i}}") for i in range(200)])
h = hashlib.sha256()
for i in range(600):
    d = eng.place(random_pod(rng, f"p{{i}}"))
    if i % 4 == 0 and state.assignments:
        eng.release(sorted(state.assignments)[i % len(state.assignments)])
    h.update(repr(_outcome(d)).encode())
print(json.dumps({{"compiled": kernels.enabled(), "scorer": eng._scorer is not None, "hash": h.hexdigest()}}))
"""


def _run_script(env_extra: dict) -> dict:
    env = dict(os.environ, **env_extra)
    code = _SCRIPT.format(tests=str(Path(__file__).resolve().parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_decisions_are_the_same_without_numba() -> None:
    off = _run_script({"GPUPOOL_NO_NUMBA": "1"})
    assert off["compiled"] is False and off["scorer"] is False
    on = _run_script({"GPUPOOL_NO_NUMBA": "0"})
    assert on["hash"] == off["hash"]
    if kernels.AVAILABLE:
        assert on["compiled"] is True and on["scorer"] is True
    assert len(hashlib.sha256(b"").hexdigest()) == len(on["hash"])


@needs_numba
@pytest.mark.parametrize("seed", range(4))
def test_compiled_distinct_nodes_equal_the_policy_dedup(seed) -> None:
    from gpupool.policies.fgd import _distinct_rows

    rng = random.Random(seed)
    st = _random_state(rng, 200)
    for nodes in (np.arange(st.n_nodes), np.array(sorted(rng.sample(range(st.n_nodes), 120)))):
        key = np.column_stack([st.node_model[nodes], st.cpu_free[nodes], st.mem_free[nodes], st.gpu_free[nodes],
                               st.gpu_healthy[nodes], st.gpu_mem_free[nodes], st.gpu_mem_cap[nodes],
                               st.slice_milli[nodes]])
        want_first, want_inverse = _distinct_rows(key)
        first, inverse = fgd_compiled.distinct_nodes(st, nodes)
        np.testing.assert_array_equal(first, want_first)
        np.testing.assert_array_equal(inverse, want_inverse)


def test_a_policy_replaced_after_the_engine_was_built_decides() -> None:
    """The pool scheduler wraps ``engine.policy`` in a ScopedPolicy after building the engine: its ``pick``
    (allowed nodes) must decide, not the best-node heap chosen for the inner policy."""
    from gpupool.engine.pool.placement import ScopedPolicy

    st = ClusterState([node(f"n{i}", gpus=4) for i in range(6)])
    eng = Engine(st, make_policy("gpupool"), seed=1, workload=[pod("w", gpus=1, milli=500)])
    assert eng.place(pod("a", gpus=1, milli=500)).assignment.node == 0
    scoped = ScopedPolicy(eng.policy)
    scoped.allowed = np.array([False, False, False, True, True, False])
    eng.policy = scoped
    assert eng.place(pod("b", gpus=1, milli=500)).assignment.node in (3, 4)


@needs_numba
@pytest.mark.parametrize("k", [64, 65, 200, 5000])  # below 64 the kernel calls np.argsort itself
def test_compiled_radix_argsort_is_numpys_stable_argsort(k) -> None:
    rng = np.random.default_rng(k)
    for trial in range(6):
        h = rng.integers(0, 2**63, k, dtype=np.uint64) * np.uint64(2) + np.uint64(trial % 2)
        h[rng.integers(0, k, k // 3)] = h[0]  # repeated hashes: their order must be kept
        if trial % 3 == 0:
            h = h % np.uint64(7)  # most bytes equal in every key: those passes are skipped
        np.testing.assert_array_equal(fgd_kernels._stable_argsort(h), np.argsort(h, kind="stable"))


@needs_numba
def test_replaced_filters_drop_the_scores_left_out_under_the_old_masks() -> None:
    from gpupool.engine.filters import CpuFit

    specs = [node("a", cpu=2000, gpus=1), node("b", cpu=64000, gpus=8)]
    workload = [pod("w", cpu=1000, gpus=1)]
    loose = tuple(f for f in make_policy("gpupool").filters if not isinstance(f, CpuFit))
    eng = Engine(ClusterState(specs), make_policy("gpupool"), workload=workload)
    assert eng.schedule(pod("p0", cpu=4000, gpus=1, milli=300)).assignment.node == 1  # a lacks CPU: not scored
    assert eng._masked_scores
    eng.policy.filters = loose  # replaced on the policy: a passes now, with no change of its own
    eng._mask_cache.entries.clear()  # as an LRU eviction would: masks recomputed under the new filters
    fresh_policy = make_policy("gpupool")
    fresh_policy.filters = loose
    fresh = Engine(ClusterState(specs), fresh_policy, workload=workload)
    p1 = pod("p1", cpu=4000, gpus=1, milli=300)
    assert _outcome(eng.schedule(p1)) == _outcome(fresh.schedule(p1))
    eff = eng.policy.effective(p1)
    np.testing.assert_array_equal(eng._cached_scores(eff), fresh._cached_scores(eff))  # a's score too


@pytest.mark.parametrize("use_compiled", [True, False])
def test_mask_entries_keep_codes_mask_and_histogram_in_step(monkeypatch, use_compiled) -> None:
    # each mask entry keeps its failure codes, its mask (codes == 0) and their histogram, updated node by node on
    # the compiled path and on NumPy's: after many places and releases all three still agree with the codes
    if use_compiled and not kernels.enabled():
        pytest.skip("numba not installed or GPUPOOL_NO_NUMBA set")
    if not use_compiled:
        monkeypatch.setattr(kernels, "enabled", lambda: False)
    rng = np.random.default_rng(3)
    st = ClusterState([node(f"n{i}", gpus=4) for i in range(40)])
    eng = Engine(st, make_policy("gpupool"), seed=2, workload=[pod("w", gpus=1, milli=500)])
    running: list[str] = []
    shapes = [(1, 500), (1, 1000), (2, 1000), (4, 1000)]
    for i in range(400):
        if running and rng.random() < 0.45:
            eng.release(running.pop(int(rng.integers(len(running)))))
            continue
        g, milli = shapes[int(rng.integers(len(shapes)))]
        d = eng.place(pod(f"p{i}", gpus=g, milli=milli))
        if d.assignment is not None:
            running.append(f"p{i}")
    checked = 0
    for entry in eng._mask_cache.entries.values():
        if entry.codes is None or entry.counts is None:
            continue
        np.testing.assert_array_equal(entry.values, entry.codes == 0)
        np.testing.assert_array_equal(entry.counts[: int(entry.codes.max()) + 1],
                                      np.bincount(entry.codes, minlength=int(entry.codes.max()) + 1))
        assert entry.counts[int(entry.codes.max()) + 1:].sum() == 0
        checked += 1
    assert checked >= 3


_WARM_SCRIPT = """
import json, random, sys
sys.path.insert(0, {tests!r})
import numpy as np
from test_decision_cost import run_side_by_side, _random_state
from gpupool.engine import kernels
from gpupool.engine.core import Engine
from gpupool.engine.kernels import filters as filter_kernels
from gpupool.engine.pool import fairshare
from gpupool.policies import fgd_compiled, make_policy
took = kernels.warm_up()
for policy in ("gpupool", "fgd"):
    run_side_by_side(policy, n_nodes=150, n_pods=800, seed=21)
run_side_by_side("gpupool", n_nodes=1100, n_pods=150, seed=3)  # FGD's dedup of many changed nodes
st = _random_state(random.Random(2), 80)
fgd_compiled.distinct_nodes(st, np.arange(st.n_nodes))
eng = Engine(st, make_policy("gpupool"), seed=2)
from conftest import pod
filter_kernels.failure_codes_default(st, eng.policy.effective(pod("x", gpus=1, milli=500)), np.arange(st.n_nodes))
from gpupool.engine.pool.queues import QueueSpec, QueueTree
tree = QueueTree([QueueSpec(name="a", quota=2.0), QueueSpec(name="b", parent="a", weight=2.0)])
fairshare.fair_shares_compiled(tree, np.array([8.0, 64e3, 1e5]), np.ones((2, 3)), tree.quota_vectors(4e3, 8e3))
sigs = {{k: [str(s) for s in kernels.kernel(k).signatures] for k in kernels.SIGNATURES}}
print(json.dumps({{"took": sorted(took), "sigs": sigs}}))
"""


@needs_numba
def test_warm_up_compiles_every_kernel_with_the_types_the_engine_calls_it_with() -> None:
    """After ``warm_up`` no kernel compiles again: every call the engine makes (both policies, the dedup path of
    a large cluster, the failure codes) matches the types in ``kernels.SIGNATURES``. A second signature here
    means a kernel's arguments changed and the table was not updated: the live scheduler would then stall on
    a compilation in the middle of a scheduling cycle."""
    code = _WARM_SCRIPT.format(tests=str(Path(__file__).resolve().parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, GPUPOOL_NO_NUMBA="0"))
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["took"] == sorted(kernels.SIGNATURES)
    extra = {k: v for k, v in report["sigs"].items() if len(v) != 1}
    assert not extra, f"kernels compiled for types SIGNATURES does not list: {extra}"


@needs_numba
def test_warm_up_is_idempotent_and_kernel_types_reject_unknown_words() -> None:
    first = kernels.warm_up()
    assert set(first) == set(kernels.SIGNATURES) and kernels.warm_up() == first
    for name, spec in kernels.SIGNATURES.items():
        assert len(kernels.kernel_types(spec)) == len(spec.split()), name
    with pytest.raises(ValueError, match="i9"):
        kernels.kernel_types("i8[] i9")
    for bad in ("i8[,", "i8[", "i8[][]", "i8[]]", "i8[x]", "i8[,]x]", "i8[,,,]", "[]", "I8"):
        with pytest.raises(ValueError, match="unknown kernel argument type"):
            kernels.kernel_types(f"i8 {bad}")
    assert len(kernels.kernel_types("b1[,,] f8")) == 2


@needs_numba
def test_a_warm_up_that_fails_names_the_kernel_and_the_scheduler_still_starts(monkeypatch, caplog) -> None:
    import logging

    from gpupool.k8s.scheduler_cli import warm_kernels

    monkeypatch.setattr(kernels, "_warm", None)
    monkeypatch.setitem(kernels.SIGNATURES, "_stale_nodes", "i8[] i8 i8 i8[] i8[] b1[]")  # one argument short
    with pytest.raises(RuntimeError, match="warm-up of kernel _stale_nodes"):
        kernels.warm_up()
    with caplog.at_level(logging.WARNING, logger="gpupool.test.warm"):
        warm_kernels(logging.getLogger("gpupool.test.warm"))
    assert any(r.getMessage() == "engine kernels not warmed up" for r in caplog.records)


@needs_numba
@pytest.mark.parametrize("policy", ["gpupool", "fgd"])
def test_a_scoped_policy_scores_with_the_compiled_scorer_and_decides_alike(policy) -> None:
    """The pool scheduler wraps its placement policy in a ScopedPolicy (it changes only ``pick``): the engine
    scores through the wrapped policy's compiled scorer, and decides as the wrapper's NumPy path does."""
    from gpupool.engine.pool.placement import DelegatingPolicy, ScopedPolicy, Vetoed

    def place(eng, p):
        try:
            return _place(eng, p)
        except Vetoed:  # no allowed node fits: the pool scheduler tries elsewhere
            return "vetoed"

    rng = random.Random(17)
    specs = mixed_nodes(rng, 120)
    workload = [random_pod(rng, f"w{i}") for i in range(200)]
    fast_state, slow_state = ClusterState(specs), ClusterState(specs)
    fast = Engine(fast_state, ScopedPolicy(make_policy(policy)), seed=4, workload=workload)
    slow = Engine(slow_state, ScopedPolicy(make_policy(policy)), seed=4, workload=workload)
    assert fast._scorer is not None and fast._masked_scores == (policy == "gpupool")  # gpupool: memory in its key
    slow._scorer = None
    slow._masked_scores = False
    allowed = np.ones(len(specs), dtype=bool)
    allowed[::3] = False
    for i in range(900):
        p = random_pod(rng, f"p{i}")
        scoped = i % 5 == 0  # now and then a topology scope, as a gang's later pods get
        for eng in (fast, slow):
            eng.policy.allowed = allowed if scoped else None
        assert place(fast, p) == place(slow, p), i
        if i % 3 == 0 and fast_state.assignments:
            name = sorted(fast_state.assignments)[i % len(fast_state.assignments)]
            assert fast.release(name) == slow.release(name)

    class Rescored(DelegatingPolicy):
        def score(self, state, req, nodes):
            return -self.inner.score(state, req, nodes)

    # the wrapper changed after the engine was built: the engine follows (scores as the NumPy path does)
    swapped = make_policy("best-fit")
    swapped.prepare(fast_state, workload)
    for eng in (fast, slow):  # no cache cleared by hand: the engine drops the scores of the replaced policy
        eng.policy.allowed = None
        eng.policy.inner = swapped if eng is fast else make_policy("best-fit")
        if eng is slow:
            eng.policy.inner.prepare(slow_state, workload)
    for i in range(60):
        p = random_pod(rng, f"q{i}")
        assert place(fast, p) == place(slow, p), ("swapped inner", i)
    assert fast._scorer is None
    # the same score key, other scores: the scores cached before the change are dropped, not served after it
    # (FGD's scores are not compared with a fresh computation: its floors differ with the batch of nodes scored)
    state = ClusterState(specs)
    wrapper = ScopedPolicy(make_policy(policy))
    eng = Engine(state, wrapper, seed=4, workload=workload)
    for i in range(150):
        eng.place(random_pod(rng, f"r{i}"))
    assert len(eng._score_cache.entries) > 1
    plain = wrapper.inner.score
    wrapper.score = lambda st, req, nodes: -plain(st, req, nodes)
    p = random_pod(rng, "s0")
    eng.schedule(p)
    assert list(eng._score_cache.entries) in ([], [("score",) + wrapper.score_key(wrapper.effective(p))])
    assert eng._scorer is None and eng._scored is wrapper
    inner = make_policy(policy)
    own = ScopedPolicy(inner)
    assert own.scored_by() is inner
    own.score = lambda state, req, nodes: -inner.score(state, req, nodes)
    assert own.scored_by() is own
    assert ScopedPolicy(inner).scored_by() is inner
    wrapped = Rescored(inner)
    assert wrapped.scored_by() is wrapped
    assert Engine(ClusterState(specs), wrapped, seed=1)._scorer is None
    other_filters = ScopedPolicy(make_policy(policy))
    other_filters.filters = other_filters.filters[:-1]
    assert other_filters.scored_by() is other_filters


@needs_numba
def test_numba_that_cannot_wrap_the_kernels_leaves_the_engine_on_numpy_with_a_warning() -> None:
    """A numba setting that makes wrapping fail (here an unknown NUMBA_CACHE_LOCATOR_CLASSES, numba's own
    RuntimeError) turns the compiled path off as a whole: enabled() is False on every call, no kernel is left
    half-wrapped, a warning says so, and decisions are NumPy's."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CACHE_LOCATOR_CLASSES="NoSuchLocator", GPUPOOL_NO_NUMBA="0")
    code = _SCRIPT.format(tests=str(Path(__file__).resolve().parent)).replace(
        "print(json.dumps({", 'print(json.dumps({"again": kernels.enabled(), "cached": kernels.CACHED, '
        '"kinds": sorted({type(kernels.kernel(k)).__name__ for ks in kernels.KERNELS.values() for k in ks}), ')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["compiled"] is False and got["again"] is False and got["scorer"] is False
    assert got["cached"] is None and got["kinds"] == ["function"]
    assert "compiled kernels are off" in out.stderr and "NoSuchLocator" in out.stderr
    assert got["hash"] == _run_script({"GPUPOOL_NO_NUMBA": "1"})["hash"]


@needs_numba
def test_no_writable_numba_cache_compiles_in_process_instead_of_failing() -> None:
    """In a locked-down container (read-only root file system, no home directory, no NUMBA_CACHE_DIR) numba
    finds no place for its cache and refuses ``cache=True`` ("no locator available"). The engine then
    compiles its kernels uncached, with a warning, and decides as always. NUMBA_CACHE_LOCATOR_CLASSES limited to
    the NUMBA_CACHE_DIR locator, with NUMBA_CACHE_DIR unset, is numba's own way to that state."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env.update(NUMBA_CACHE_LOCATOR_CLASSES="UserProvidedCacheLocator", GPUPOOL_NO_NUMBA="0")
    code = _SCRIPT.format(tests=str(Path(__file__).resolve().parent)).replace(
        "print(json.dumps({", 'print(json.dumps({"cached": kernels.CACHED, ')
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["compiled"] is True and got["scorer"] is True and got["cached"] is False
    assert "no writable cache location" in out.stderr and "NUMBA_CACHE_DIR" in out.stderr
    assert got["hash"] == _run_script({"GPUPOOL_NO_NUMBA": "1"})["hash"]
