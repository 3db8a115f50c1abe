"""The clairvoyant must-place replay (benchmarks/clairvoyant.py) on cases solved by hand."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import argparse_error, bench_module, node, openb_header_folder, pod

pytest.importorskip("highspy", reason="the plan needs the bench extra (highspy)")

optimum = bench_module("optimum.py")
clairvoyant = bench_module("clairvoyant.py")


def _node(gpus: list[int], cpu: int = 8000, mem: int = 16384, model: str = "V100M16"):
    return clairvoyant._Node(model, cpu, mem, list(gpus))


def _shape(cpu: int = 0, gpus: int = 1, milli: int = 1000, spec: tuple = ()) -> tuple:
    return (cpu, 0, gpus, milli, spec)


def test_packs_gpu_by_gpu_cpu_and_models() -> None:
    two = _node([1000, 1000])
    assert clairvoyant.packs(two, [_shape(milli=600), _shape(milli=400), _shape()])
    assert not clairvoyant.packs(two, [_shape(milli=600), _shape(milli=600), _shape()])  # two 600s: 2 GPUs
    assert clairvoyant.packs(two, [_shape(milli=600), _shape(milli=600)])
    assert not clairvoyant.packs(_node([1000, 500]), [_shape(gpus=2)])  # a whole pod needs free GPUs
    assert not clairvoyant.packs(_node([1000], cpu=4000), [_shape(cpu=3000, milli=100), _shape(cpu=2000, milli=100)])
    assert not clairvoyant.packs(two, [_shape(spec=("A100",))])
    assert clairvoyant.packs(two, [_shape(spec=("V100M16",))])
    # exact, not first fit decreasing: 500, 400, 300, 300, 300, 200 fill two GPUs only as 500+300+200 / 400+300+300
    assert clairvoyant.packs(two, [_shape(milli=m) for m in (500, 400, 300, 300, 300, 200)])


def test_must_place_loses_what_the_optimum_keeps() -> None:
    # one GPU; an 810-milli pod arrives before a whole-GPU pod. The optimum leaves the 810 out and holds the
    # whole pod (1.0); a scheduler that places every pod that fits must place the 810 first, and the whole
    # pod then fits nowhere: 0.81, even knowing the plan.
    nodes = [node("n0", cpu=8000, mem=16384, gpus=1)]
    prefix = [pod("a", gpus=1, milli=810), pod("w", gpus=1)]
    res = optimum.allocation_bound(nodes, prefix)
    assert res.packed == pytest.approx(1.0)
    out = clairvoyant.replay(nodes, prefix, clairvoyant.plan_nodes(nodes, res))
    assert out["held"] == pytest.approx(0.81)
    assert out["forced_gpus"] == pytest.approx(0.81) and out["broken_gpus"] == pytest.approx(1.0)
    assert out["dropped_gpus_by_class"] == {"1x1000": 1.0}
    # the other order: the whole pod takes its slot, the 810 fits nowhere and is dropped
    out = clairvoyant.replay(nodes, prefix[::-1], clairvoyant.plan_nodes(nodes, res))
    assert out["held"] == pytest.approx(1.0) and out["forced_gpus"] == 0.0


def test_forced_pod_goes_where_it_breaks_least() -> None:
    # two 1-GPU nodes; the plan gives n0 a whole pod and n1 a 500 + a 190. A forced 300 fits beside the 500
    # and 190 on n1 (breaks nothing) and must not go to n0 (it would break the whole pod).
    nodes = [node("n0", cpu=8000, mem=16384, gpus=1), node("n1", cpu=8000, mem=16384, gpus=1)]
    plan = [Counter({_shape(): 1}), Counter({_shape(milli=500): 1, _shape(milli=190): 1})]
    prefix = [pod("x", gpus=1, milli=300), pod("w", gpus=1), pod("h", gpus=1, milli=500),
              pod("s", gpus=1, milli=190)]
    out = clairvoyant.replay(nodes, prefix, plan)
    assert out["held"] == pytest.approx((300 + 1000 + 500 + 190) / 2000)
    assert out["broken_gpus"] == 0.0
    assert [p.name for p in out["placed"][0]] == ["w"]


def test_planned_gpu_choice_keeps_the_rest_of_the_plan() -> None:
    # one node of 2 GPUs planned 600 + 400 and 700 + 300; the 300 arrives first. Best fit alone could put it
    # anywhere; it must go where the rest still packs (either GPU does here, but not beside a 600 + 400).
    nodes = [node("n0", cpu=8000, mem=16384, gpus=2)]
    plan = [Counter({_shape(milli=m): 1 for m in (600, 400, 700, 300)})]
    prefix = [pod(f"p{m}", gpus=1, milli=m) for m in (300, 600, 700, 400)]
    out = clairvoyant.replay(nodes, prefix, plan)
    assert out["held"] == pytest.approx(1.0) and out["forced_gpus"] == 0.0


def test_replan_with_at_least_keeps_the_forced_pods() -> None:
    # the optimum asked to hold at least one 810 on one GPU: 810 + 190 if a 190 arrived, else the 810 alone
    nodes = [node("n0", cpu=8000, mem=16384, gpus=1)]
    prefix = [pod("a", gpus=1, milli=810), pod("w", gpus=1), pod("b", gpus=1, milli=190)]
    key = optimum.shape_key(prefix[0])
    warm = [(nodes[0], [prefix[0], prefix[2]])]
    res = optimum.allocation_bound(nodes, prefix, warm=warm, at_least={key: 1})
    assert res.packed == pytest.approx(1.0)
    assert sum(k * pat.get(res.shapes.index(key), 0) for _c, pat, k in res.patterns) == 1


def test_arguments_refused_before_any_run(tmp_path, capsys) -> None:
    traces = openb_header_folder(tmp_path)
    assert "--seeds" in argparse_error(clairvoyant.main, capsys, ["--seeds", "0", "--traces", str(traces)])
    assert "openb_pod_list_nope.csv" in argparse_error(
        clairvoyant.main, capsys, ["--variants", "nope", "--traces", str(traces)])


def _row(variant: str, seed: int, held: float, first: float) -> dict:
    return {"variant": variant, "seed": seed, "optimum_packed": 0.99, "held": held, "forced_gpus": 1.0,
            "rounds": [{"plan": 0.99, "held": first, "forced_gpus": 3.0}, {"plan": 0.985, "held": held}]}


def test_report_counts_the_seeds_that_reach_fgd_plus_one() -> None:
    rows = [_row("v", 1, 0.9810, 0.97), _row("v", 2, 0.9805, 0.975)]
    policies = {("v", "fgd", 1): 0.9700, ("v", "fgd", 2): 0.9710, ("v", "gpupool", 1): 0.975,
                ("v", "gpupool", 2): 0.976}
    lines = clairvoyant.report(rows, policies)
    # seed 1: 98.10 >= 97.00 + 1; seed 2: 98.05 < 97.10 + 1
    assert lines[2] == "| v | 2 | 99.00 | 98.08 | 97.05 | 98.05 | 97.55 | 1 of 2 |"
    assert "| v | 1 | 99.00 | 97.00 | 98.10 | 2 | 3.0 | 97.00 | 97.50 |" in lines
    # without the policies' runs for these seeds: dashes, not a count
    assert clairvoyant.report(rows, {})[2] == "| v | 2 | 99.00 | 98.08 | - | - | - | - |"


def test_merge_keeps_other_runs_and_report_only_rewrites(tmp_path, capsys, monkeypatch) -> None:
    out = tmp_path / "res"
    out.mkdir()
    saved = {"machine": [{"variants": ["default"]}], "runs": [_row("default", 42, 0.96, 0.95),
                                                             _row("multigpu50", 42, 0.98, 0.97)]}
    (out / "openb_clairvoyant.json").write_text(json.dumps(saved))
    traces = openb_header_folder(tmp_path)
    (traces / "openb_pod_list_multigpu50.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    monkeypatch.setattr(clairvoyant, "run_all", lambda variants, args: (
        [_row("multigpu50", 42, 0.981, 0.97)], [{"variants": variants}]))
    assert clairvoyant.main(["--variants", "multigpu50", "--seeds", "1", "--merge", "--traces", str(traces),
                             "--out", str(out), "--allocation", str(tmp_path / "none.json")]) == 0
    data = json.loads((out / "openb_clairvoyant.json").read_text())
    assert [(r["variant"], r["held"]) for r in data["runs"]] == [("default", 0.96), ("multigpu50", 0.981)]
    assert data["machine"] == [{"variants": ["default"]}, {"variants": ["multigpu50"]}]
    (out / "openb_clairvoyant.md").unlink()
    assert clairvoyant.main(["--report-only", "--out", str(out), "--allocation", str(tmp_path / "none.json")]) == 0
    assert "| multigpu50 | 1 | 99.00 | 98.10 |" in (out / "openb_clairvoyant.md").read_text()
    assert "--report-only" in argparse_error(clairvoyant.main, capsys, ["--report-only", "--out", str(tmp_path)])


def test_unreadable_results_files_are_refused_without_a_traceback(tmp_path, capsys) -> None:
    out = tmp_path / "res"
    out.mkdir()
    (out / "openb_clairvoyant.json").write_text("not json")
    none = str(tmp_path / "none.json")
    err = argparse_error(clairvoyant.main, capsys, ["--report-only", "--out", str(out), "--allocation", none])
    assert "not a results file" in err
    bad = tmp_path / "alloc.json"
    bad.write_text("[1]")
    err = argparse_error(clairvoyant.main, capsys, ["--report-only", "--out", str(out), "--allocation", str(bad)])
    assert "--allocation" in err


def test_packs_agrees_with_brute_force_on_random_small_nodes() -> None:
    import itertools
    import random

    rng = random.Random(7)
    for _ in range(400):
        gpus = [rng.choice([1000, 1000, 600, 300, 810]) for _ in range(rng.randint(1, 3))]
        shapes = [_shape(milli=rng.choice([100, 190, 250, 300, 470, 500, 600, 810])) for _ in range(rng.randint(0, 5))]
        brute = any(all(sum(s[3] for s, b in zip(shapes, a, strict=True) if b == g) <= free
                        for g, free in enumerate(gpus))
                    for a in itertools.product(range(len(gpus)), repeat=len(shapes)))
        assert clairvoyant.packs(_node(gpus, cpu=10**6, mem=10**6), shapes) == brute, (gpus, shapes)


def test_forced_order_best_fit_takes_the_tightest_node() -> None:
    # n1 holds a planned 600 (400 left); a 300 beyond the plan breaks nothing on either node: "first" puts it
    # on the empty n0, "best-fit" beside the 600 (100 left), which keeps n0's GPU whole
    nodes = [node("n0", cpu=8000, mem=16384, gpus=1), node("n1", cpu=8000, mem=16384, gpus=1)]
    plan = [Counter(), Counter({_shape(milli=600): 1})]
    prefix = [pod("a", gpus=1, milli=600), pod("x", gpus=1, milli=300)]
    first = clairvoyant.replay(nodes, prefix, plan)
    assert [p.name for p in first["placed"][0]] == ["x"]
    tight = clairvoyant.replay(nodes, prefix, plan, forced="best-fit")
    assert [p.name for p in tight["placed"][1]] == ["a", "x"] and tight["placed"][0] == []
    assert first["held"] == tight["held"] == pytest.approx(0.45)
