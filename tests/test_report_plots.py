"""Plots that read right (issue 13, point 8): titles with trace/seed/ratio/protocol, a distinct colour for
every policy, a zoom near 100 % arrived, quota and fair-share lines, legends outside the axes, and the
unallocated-GPUs bars agreeing with the table."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_hex

from gpupool import report

POLICIES = ["gpupool", "k8s-default", "best-fit", "worst-fit", "first-fit", "random", "fgd", "dot-product",
            "gpu-packing", "topology-aware", "lowest-power", "round-robin"]


def inflation_runs(seeds=(7,)) -> list[report.Run]:
    runs = []
    x = np.linspace(0, 1.3, 200)
    for i, policy in enumerate(POLICIES):
        for s in seeds:
            y = np.minimum(x, 0.95 - i / 200)
            record = {"policy": policy, "seed": s, "failed_pods": 3, "unallocated_gpus": 100.0 + i,
                      "fragmented_gpus": 10.0 * i, "idle_reserved_gpus": 300.0 if policy == "k8s-default" else 0.0}
            runs.append(report.Run("inflation", record, x, y))
    return runs


def summary_of(runs) -> list[dict]:
    out = []
    for policy in dict.fromkeys(r.policy for r in runs):
        group = [r for r in runs if r.policy == policy]
        r = group[0].record
        out.append({"policy": policy, "seeds": [g.seed for g in group], "n_seeds": len(group),
                    "unallocated_gpus": r["unallocated_gpus"], "unallocated_gpus_std": 1.0,
                    "fragmented_gpus": r["fragmented_gpus"], "idle_reserved_gpus": r["idle_reserved_gpus"]})
    return out


def job_runs(seed: int = 5) -> list[report.JobRun]:
    t = np.arange(0, 10 * 86400, 3600.0)
    names = tuple(f"vc{k}" for k in range(13))
    rng = np.random.default_rng(0)
    runs = []
    for policy in ("fifo", "round-robin", "gpupool"):
        alloc = rng.integers(0, 20, size=(len(t), len(names))).astype(float)
        fair = np.full_like(alloc, 10.0)
        queues = {n: {"quota_gpus": 8.0} for n in names}
        runs.append(report.JobRun({"policy": policy, "seed": seed, "queues": queues},
                                  rng.exponential(3600 * 10, 500), t, alloc, fair, names))
    return runs


def legend_outside_axes(fig) -> bool:
    fig.canvas.draw()
    legends = fig.legends
    assert legends, "a figure legend"
    renderer = fig.canvas.get_renderer()
    box = legends[0].get_window_extent(renderer)
    return all(not box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)


def test_line_styles_distinct_for_many_policies():
    styles = [report._line_style(i) for i in range(30)]
    assert len({(to_hex(s["color"]), s["linestyle"]) for s in styles}) == 30
    assert len({to_hex(s["color"]) for s in styles[:20]}) == 20


def test_allocation_vs_arrived_title_colours_zoom_and_legend(tmp_path):
    runs = inflation_runs(seeds=(1, 2))
    fig = report.allocation_vs_arrived_figure(runs, trace="data/openb_pod_list_gpushare40.csv", ratio=1.3)
    title = fig.get_suptitle()
    assert "openb_pod_list_gpushare40" in title and "seeds 1, 2" in title and "ratio 1.3" in title
    assert "inflation" in title and ".csv" not in title
    main, zoom = fig.axes[:2]
    colours = [to_hex(line.get_color()) for line in main.get_lines() if line.get_label() != "ideal"]
    assert len(colours) == 12 and len(set(colours)) == 12
    lo, hi = zoom.get_xlim()
    assert lo >= 80 and hi <= 115 and lo < 100 <= hi
    assert zoom.get_ylim()[1] - zoom.get_ylim()[0] < 30
    assert legend_outside_axes(fig)
    path = report.plot_allocation_vs_arrived(runs, tmp_path / "a.png", trace="x/openb.csv", ratio=1.3)
    assert path.exists() and path.stat().st_size > 0


def test_plots_keep_working_without_the_new_arguments(tmp_path):
    runs = inflation_runs()
    for path in (report.plot_allocation_vs_arrived(runs, tmp_path / "a.png"),
                 report.plot_allocation_over_time(runs, tmp_path / "b.png"),
                 report.plot_unallocated(summary_of(runs), tmp_path / "c.png"),
                 report.plot_jct_cdf(job_runs(), tmp_path / "d.png"),
                 report.plot_queue_share(job_runs(), tmp_path / "e.png")):
        assert path.exists() and path.stat().st_size > 0


def test_allocation_over_time_title_and_colours(tmp_path):
    runs = inflation_runs(seeds=(42,))
    fig = report.allocation_over_time_figure(runs, trace="traces/alibaba.csv")
    assert "alibaba" in fig.get_suptitle() and "seed 42" in fig.get_suptitle() and "replay" in fig.get_suptitle()
    colours = {to_hex(line.get_color()) for line in fig.axes[0].get_lines()}
    assert len(colours) == 12
    assert legend_outside_axes(fig)


def test_unallocated_bars_match_the_table_and_held_gpus_stand_apart(tmp_path):
    summary = summary_of(inflation_runs())
    fig = report.unallocated_figure(summary, trace="p.csv", ratio=1.0, protocol="inflation")
    ax = fig.axes[0]
    texts = [t.get_text() for t in ax.texts]
    k8s = next(e for e in summary if e["policy"] == "k8s-default")
    # the number on the k8s-default bar is the table's unallocated GPUs, not unallocated + held
    assert report._fmt(k8s["unallocated_gpus"], float("nan"), 1) in texts
    assert report._fmt(k8s["unallocated_gpus"] + k8s["idle_reserved_gpus"], float("nan"), 1) not in texts
    assert "300.0" in texts  # held but unused, its own bar
    tops = {}
    for patch in ax.patches:
        cx = round(patch.get_x() + patch.get_width() / 2, 3)
        tops[cx] = max(tops.get(cx, 0.0), patch.get_y() + patch.get_height())
    assert max(tops.values()) == pytest.approx(300.0)  # no bar stacks held GPUs onto the free ones
    assert "p" in fig.get_suptitle() and "seed 7" in fig.get_suptitle()
    assert legend_outside_axes(fig)
    path = report.plot_unallocated(summary, tmp_path / "u.png")
    assert path.stat().st_size > 0


def test_jct_cdf_title_colours_and_legend():
    fig = report.jct_cdf_figure(job_runs(seed=9), trace="data/philly.csv")
    assert "philly" in fig.get_suptitle() and "seed 9" in fig.get_suptitle()
    assert len({to_hex(line.get_color()) for line in fig.axes[0].get_lines()}) == 3
    assert legend_outside_axes(fig)


def test_queue_share_has_fair_share_and_quota_lines_and_a_grey_other(tmp_path):
    runs = job_runs()
    fig = report.queue_share_figure(runs, trace="philly.csv")
    assert "philly" in fig.get_suptitle() and "seed 5" in fig.get_suptitle()
    ax = fig.axes[0]
    styles = [line.get_linestyle() for line in ax.get_lines()]
    assert styles.count("--") == 11 and styles.count(":") == 11  # 10 queues + "other"
    labels = fig.legends[0].get_texts()
    names = [t.get_text() for t in labels]
    assert "other" in names and any("fair share" in n for n in names) and any("quota" in n for n in names)
    face = [to_hex(p.get_facecolor()) for p in fig.legends[0].get_patches()]
    assert len(set(face)) == len(face) and to_hex(report.OTHER_COLOR) in face
    assert legend_outside_axes(fig)
    path = report.plot_queue_share(runs, tmp_path / "q.png", trace="philly.csv")
    assert path.stat().st_size > 0


def test_plot_context_parts():
    assert report.plot_context("a/b/openb_gpu.csv", [3, 1, 2], 1.5, "inflation") == (
        "trace openb_gpu · seeds 1, 2, 3 · ratio 1.5 · inflation protocol")
    assert report.plot_context(None, range(1, 11)) == "seeds 1–10"
    assert report.plot_context() == ""


def legend_inside_figure(fig) -> bool:
    """The legend is drawn whole: no part of it is cut off at the figure's edges."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    box, page = fig.legends[0].get_window_extent(renderer), fig.bbox
    return box.x0 >= page.x0 - 1 and box.x1 <= page.x1 + 1 and box.y0 >= page.y0 - 1 and box.y1 <= page.y1 + 1


@pytest.mark.parametrize("policies", [3, 4, 12])
def test_unallocated_legend_is_whole_with_few_or_many_policies(policies):
    """With 3-4 policies the figure is narrow and the long "held but unused" label cut the legend off."""
    summary = summary_of(inflation_runs())
    keep = ["k8s-default", *[e["policy"] for e in summary if e["policy"] != "k8s-default"]][:policies]
    fig = report.unallocated_figure([e for e in summary if e["policy"] in keep], trace="p.csv")
    assert legend_inside_figure(fig) and legend_outside_axes(fig)


def test_zoom_panel_has_a_y_label_and_ticks_that_do_not_collide():
    fig = report.allocation_vs_arrived_figure(inflation_runs()[:3], trace="p.csv", ratio=1.3)
    fig.canvas.draw()
    zoom = fig.axes[1]
    assert zoom.get_ylabel()
    renderer = fig.canvas.get_renderer()
    lo, hi = zoom.get_xlim()
    labels = [t for t, v in zip(zoom.get_xticklabels(), zoom.get_xticks(), strict=True) if lo <= v <= hi]
    boxes = [t.get_window_extent(renderer) for t in labels if t.get_text()]
    assert len(boxes) >= 3
    assert all(a.x1 + 2 < b.x0 for a, b in zip(boxes, boxes[1:], strict=False))  # a gap between neighbours
