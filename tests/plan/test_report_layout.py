"""The plan report's layout features: identical results merged into one row (and one point and
curve), the cost/latency Pareto front against brute force, the headroom warning, the CSV export
against plan.json, and HTML cells carrying the numbers the sort script uses."""

from __future__ import annotations

import csv
import json
import random
import re

import pytest

from pagesim.plan.report import HEADROOM_WARNING, build_blocks, merge_identical, render_markdown
from pagesim.plan.report_plots import pareto_front


@pytest.fixture
def plan_dir(light_plan):
    """The shared light plan (tests/plan/conftest.py): 8 configurations, identical pairs among them."""
    return light_plan


def test_identical_results_share_one_row(plan_dir):
    plan, out = plan_dir
    groups = merge_identical(plan.results)
    assert any(len(g) > 1 for g in groups) and sum(len(g) for g in groups) == len(plan.results) == 8
    for g in groups:  # a group really is identical where the report looks
        assert len({(r.capacity, r.replicas, r.cost_per_hour, json.dumps(r.operating.values, sort_keys=True))
                     for r in g}) == 1
    md = (out / "report.md").read_text()
    table = md.split("## All configurations")[1].split("\n\n")[1].splitlines()[2:]
    assert len(table) == len(groups)
    merged = [row for row in table if "recompute, swap" in row]
    assert merged, table
    assert sorted(re.findall(r"\[.*?\]\((.*?)\)", md.split("## All configurations")[1])[:1]) == ["report.csv"]


def test_csv_has_every_configuration(plan_dir):
    plan, out = plan_dir
    rows = list(csv.DictReader(open(out / "report.csv")))
    table = json.loads((out / "plan.json").read_text())["table"]
    assert len(rows) == len(table) == 8
    for row, ref in zip(rows, table):
        assert (row["gpu"], int(row["block_size"]), row["preemption"]) == (ref["gpu"], ref["block_size"], ref["preemption"])
        assert float(row["capacity_rps"]) == ref["capacity_rps"]
        assert float(row["ttft_p99_at_operating_point"]) == ref["operating_values"]["ttft_p99"]
    ranks = sorted(int(r["rank"]) for r in rows)
    assert ranks == list(range(1, 9))


def test_html_cells_carry_sort_keys_and_alignment(plan_dir):
    plan, out = plan_dir
    page = (out / "report.html").read_text()
    assert '<table class="sortable">' in page and "<script>" in page and "http" not in page.split("<script>")[1]
    best = plan.recommendation
    assert f'data-sort="{best.capacity!r}"' in page
    assert f'data-sort="{best.operating.values["tpot_p99"]!r}"' in page  # "44.9 ms" sorts by 0.0449
    assert '<td class="num">' in page and "<td>a100-80gb</td>" in page


def test_headroom_warning(plan_dir):
    plan, _ = plan_dir
    saved = [r.headroom for r in plan.results]
    try:
        for r in plan.results:
            r.headroom = HEADROOM_WARNING - 0.085  # 1.5%
        md = render_markdown(build_blocks(plan))
        assert "**Warning: the recommendation keeps only 1.5% headroom** (below 10%)" in md
        assert "**Warning: the runner-up keeps only 1.5% headroom**" in md
        assert md.index("Cheapest meeting the target") < md.index("Warning: the recommendation") < md.index("Runner-up")
        for r in plan.results:
            r.headroom = HEADROOM_WARNING
        assert "keeps only" not in render_markdown(build_blocks(plan))  # (the uncertainty warning is its own)
    finally:
        for r, h in zip(plan.results, saved):
            r.headroom = h


@pytest.mark.parametrize("seed", range(5))
def test_pareto_front_against_brute_force(seed):
    rng = random.Random(seed)
    points = [(rng.random(), rng.random()) for _ in range(rng.randrange(1, 40))]
    dominated = {i for i, (x, y) in enumerate(points)
                 if any(u <= x and v <= y and (u, v) != (x, y) for u, v in points)}
    front = pareto_front(points)
    assert sorted(front) == sorted(set(range(len(points))) - dominated)
    assert [points[i][0] for i in front] == sorted(points[i][0] for i in front)


def _drawn(monkeypatch, make, plan):
    """The matplotlib figure a report figure function draws (its PNG bytes are not decoded)."""
    import pagesim.plan.report_plots as report_plots

    figures = []
    monkeypatch.setattr(report_plots, "_png", lambda fig: figures.append(fig) or b"")
    make(plan)
    (fig,) = figures
    fig.canvas.draw()
    return fig


def test_cost_annotations_stay_inside_their_axes(plan_dir, monkeypatch):
    """Issue 27: the 'cheapest' label beside a point at the right edge ran off the axes. Moved to
    the right edge here (the most capacity of all, still the cheapest), it stays inside."""
    from pagesim.plan.report_plots import cost_figure

    plan, _ = plan_dir
    best = plan.recommendation
    saved = best.capacity
    try:
        best.capacity = max(r.capacity for r in plan.results if r.capacity) * 1.5
        assert plan.recommendation is best
        fig = _drawn(monkeypatch, cost_figure, plan)
    finally:
        best.capacity = saved
    (ax,) = fig.axes
    box = ax.get_window_extent()
    labels = [t for t in ax.texts if t.get_text().startswith(("cheapest", "runner-up"))]
    assert labels and any(t.get_text().startswith("cheapest") for t in labels)
    for t in labels:
        inside = t.get_window_extent()
        assert box.x0 <= inside.x0 and inside.x1 <= box.x1 and box.y0 <= inside.y0 and inside.y1 <= box.y1, t.get_text()


def test_one_block_size_says_there_is_no_sensitivity_to_draw(plan_dir, monkeypatch):
    from pagesim.plan.report_plots import sensitivity_figure

    plan, _ = plan_dir
    saved = plan.results
    try:
        plan.results = [r for r in saved if r.point.block_size == 16]
        fig = _drawn(monkeypatch, sensitivity_figure, plan)
    finally:
        plan.results = saved
    words = " ".join(t.get_text() for ax in fig.axes for t in ax.texts)
    assert "one block size searched (16): no sensitivity to draw" in words
    both = _drawn(monkeypatch, sensitivity_figure, plan)  # two block sizes: a panel per GPU, with lines
    assert len([ax for ax in both.axes if ax.lines]) == 2


def test_limiting_reason_says_what_undecided_means():
    # "limited by undecided" named no cause: the report spells out the steady-state verdict
    from types import SimpleNamespace

    from pagesim.plan.report import _limiting

    undecided = _limiting(SimpleNamespace(limiting=["ttft_p99", "undecided"], capped=False))
    assert undecided == "ttft_p99, queue trend undecided at the longest probe"
    assert _limiting(SimpleNamespace(limiting=["queue grows"], capped=False)) == "queue grows"
    assert _limiting(SimpleNamespace(limiting=[], capped=True)) == "none up to the search cap"
