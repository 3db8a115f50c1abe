"""benchmarks/openb_waste.py: the split of the free GPU share by what each GPU holds, and its argument checks."""

from __future__ import annotations

import json

import pytest

from conftest import argparse_error, bench_module, cluster, node, occupy, openb_header_folder, pod

waste = bench_module("openb_waste.py")


def test_waste_split_by_what_each_gpu_holds() -> None:
    # one node, 6 GPUs: an 810 pod (190 left beside a large pod), two 470s (60 left, below the smallest pod of
    # 100: unfillable), one 320 (680 left: other), one 900 with a 50 (50 left: two pods, so not "beside large";
    # below 100: unfillable), one idle GPU (whole), one whole-GPU pod (nothing free)
    state = cluster(node("n0", cpu=64000, mem=262144, gpus=6))
    occupy(state, 0, [810, 470, 320, 900, 0, 0])
    state.allocate(pod("b", gpus=1, milli=470), 0, [1])
    state.allocate(pod("c", gpus=1, milli=50), 0, [3])
    state.allocate(pod("w", gpus=1), 0, [5])  # a whole-GPU pod: nothing free there
    contents = {(0, 0): [810], (0, 1): [470, 470], (0, 2): [320], (0, 3): [900, 50]}
    parts, by_content = waste.classify_free(state, contents, smallest=100)
    assert parts == {"whole": 1000, "beside_large": 190, "unfillable": 60 + 50, "other": 680}
    assert by_content == {"810": 190, "470,470": 60, "320": 680, "50,900": 50, "-": 1000}


@pytest.mark.parametrize(("argv", "message"), [
    (["--variants", "nope"], "no openb_pod_list_nope.csv"),
    (["--seeds", "0"], "--seeds must be at least 1"),
    (["--policies", "nope"], "unknown policy 'nope'"),
    (["--policies", ","], "at least one name"),
])
def test_bad_arguments_are_refused_before_any_run(capsys, tmp_path, argv, message) -> None:
    traces = openb_header_folder(tmp_path)
    out = tmp_path / "out"
    assert message in argparse_error(waste.main, capsys, ["--variants", "default", *argv, "--traces", str(traces),
                                                           "--out", str(out)])
    assert not out.exists()  # nothing written


def test_a_missing_node_list_is_named(capsys, tmp_path) -> None:
    assert "no openb_node_list_gpu_node.csv" in argparse_error(waste.main, capsys, ["--traces", str(tmp_path)])


def test_dropped_table_sets_the_optimum_beside_each_policy() -> None:
    # two seeds; the optimum leaves out 810s only, gpupool whole GPUs and (one seed) an 8-GPU pod; a class
    # under one GPU in every column is not listed
    rows = [{"variant": "v", "seed": s, "policy": "gpupool", "failed_gpus_by_class": f}
            for s, f in ((42, {"1x1000": 3.0, "8x1000": 8.0}), (43, {"1x1000": 5.0, "1x50": 0.1}))]
    dropped = {("v", 42): {"1x810": 1.62}, ("v", 43): {"1x810": 0.81}}
    lines = waste.dropped_table(rows, dropped)
    assert lines[0] == "| variant | pod class | optimum's packing | gpupool |"
    assert "| v | 1x1000 | 0.0 | 4.0 |" in lines
    assert "| v | 8x1000 | 0.0 | 4.0 |" in lines
    assert "| v | 1x810 | 1.2 | 0.0 |" in lines
    assert not any("1x50" in line for line in lines)
    # without the optimum's packing: a dash
    assert "| v | 1x1000 | - | 4.0 |" in waste.dropped_table(rows, {})
    # a seed whose packing left nothing out counts as 0 in the mean
    assert "| v | 1x810 | 1.2 | 0.0 |" in waste.dropped_table(rows, {("v", 42): {"1x810": 2.43}, ("v", 43): {}})


def test_read_optimum_keeps_packings_that_left_nothing_out(tmp_path) -> None:
    path = tmp_path / "openb_optimum.json"
    assert waste.read_optimum(path) == ({}, {})
    path.write_text(json.dumps({"runs": [
        {"variant": "v", "seed": 42, "bound": 0.97, "dropped_gpus_by_class": {"1x810": 2.43}},
        {"variant": "v", "seed": 43, "bound": 0.96, "dropped_gpus_by_class": {}},  # a packing, nothing left out
        {"variant": "v", "seed": 44, "bound": 0.95, "dropped_gpus_by_class": None},  # no packing
        {"variant": "v", "seed": 45, "bound": 0.94}]}))  # GPU-by-GPU bound only
    bounds, dropped = waste.read_optimum(path)
    assert bounds == {("v", 42): 0.97, ("v", 43): 0.96, ("v", 44): 0.95, ("v", 45): 0.94}
    assert dropped == {("v", 42): {"1x810": 2.43}, ("v", 43): {}}
