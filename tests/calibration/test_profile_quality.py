"""The better profile, without torch: step kinds, the fit's error split by kind against a known
linear truth, the step-shape log reader (bad files: one line naming file, row and field) and its
reduction to a measurable grid, and the repetition rule's confidence interval."""

import csv
import json
import math
from dataclasses import asdict, fields

import numpy as np
import pytest

from pagesim.sim.cost import BatchShape
from pagesim.sim.cost.profiled import HOLDOUT_EVERY, PROFILE_FORMAT, ProfiledCostModel
from pagesim.sim.cost.step_shapes import (COLUMNS, LoggedStep, StepShapesError, ladder_value, read_step_shapes,
                                          visited_grid)


def prefill(n, t):
    return BatchShape(num_prefill_tokens=n * t, num_prefill_seqs=n, prefill_attn_pairs=n * t * (t + 1) // 2)


def decode(b, c):
    return BatchShape(num_decode_seqs=b, decode_context_tokens=b * c)


def mixed(n, t, b, c):
    p, d = prefill(n, t), decode(b, c)
    return BatchShape(p.num_prefill_tokens, p.num_prefill_seqs, p.prefill_attn_pairs, d.num_decode_seqs,
                      d.decode_context_tokens)


def test_kinds():
    assert prefill(2, 8).kind == "prefill"
    assert decode(3, 9).kind == "decode"
    assert mixed(1, 4, 2, 9).kind == "mixed"
    assert BatchShape(num_swap_blocks=1).kind == "with swap"  # a swap-only step: moves, computes nothing
    assert BatchShape().kind == "idle"


def truth(s: BatchShape) -> float:  # a linear model the fit can represent exactly
    tokens = s.num_prefill_tokens + s.num_decode_seqs
    return 0.01 + 2e-4 * s.num_prefill_tokens + 1e-7 * s.prefill_attn_pairs + 1e-3 * s.num_decode_seqs \
        + 4e-6 * s.decode_context_tokens + 3e-3 * min(tokens, 4)


SHAPES = ([prefill(n, t) for n, t in [(1, 8), (1, 64), (2, 32), (4, 16), (1, 200), (3, 50), (8, 8), (2, 100)]]
          + [decode(b, c) for b, c in [(1, 10), (4, 100), (8, 50), (16, 30), (32, 64), (2, 300), (24, 24), (12, 120), (2, 40), (3, 70)]]
          + [mixed(*m) for m in [(1, 16, 8, 64), (1, 64, 16, 48), (2, 32, 4, 128), (1, 8, 2, 30)]])


def write_profile(path, shapes, seconds):
    recs = [{"kind": s.kind, "shape": asdict(s), "seconds": t} for s, t in zip(shapes, seconds)]
    swaps = [{"shape": {"num_swap_blocks": k}, "seconds": 2e-3 + 3e-4 * k} for k in (1, 2, 4, 8, 16, 32, 48)]
    copies = [{"shape": {"num_copy_blocks": k}, "seconds": 5e-5 + 1e-5 * k} for k in (1, 4, 16)]
    path.write_text(json.dumps({"format": PROFILE_FORMAT, "block_size": 16, "clock": "cpu", "steps": recs,
                                "swaps": swaps, "copies": copies}))


def test_per_kind_error_is_zero_on_a_linear_truth_and_counts_every_shape(tmp_path):
    path = tmp_path / "p.json"
    write_profile(path, SHAPES, [truth(s) for s in SHAPES])
    model = ProfiledCostModel.from_profile(path)
    by_kind = model.describe()["error_by_kind"]
    for kind in ("prefill", "decode", "mixed"):
        expected = sum(1 for s in SHAPES if s.kind == kind)
        held = sum(1 for i, s in enumerate(SHAPES) if s.kind == kind and i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1)
        e = by_kind[kind]
        assert e["cross_validated"]["count"] == expected and e["held_out"]["count"] == held
        assert e["train"]["count"] + held == expected
        assert e["cross_validated"]["max_abs"] < 1e-6
    # swap-heavy sizes: the per-call and per-block costs come back
    c = model.coefficients
    assert c["swap_call"] == pytest.approx(2e-3, rel=1e-6) and c["swap_block"] == pytest.approx(3e-4, rel=1e-6)
    assert by_kind["swap"]["held_out"]["count"] == 7 and by_kind["swap"]["held_out"]["max_abs"] < 1e-6


def test_per_kind_error_points_at_the_kind_that_is_off(tmp_path):
    """Mixed steps 20 % slower than the truth, everything else exact: the split must show it there."""
    path = tmp_path / "p.json"
    write_profile(path, SHAPES, [truth(s) * (1.2 if s.kind == "mixed" else 1.0) for s in SHAPES])
    by_kind = ProfiledCostModel.from_profile(path).describe()["error_by_kind"]
    # the fit spreads some of the mixed error over the others, but the mixed shapes keep most of it
    m = by_kind["mixed"]["cross_validated"]["median_abs"]
    assert m > 0.05
    for kind in ("prefill", "decode"):
        assert by_kind[kind]["cross_validated"]["median_abs"] < m / 2
    stats = by_kind["mixed"]["cross_validated"]
    assert stats["median_abs"] <= stats["p90_abs"] <= stats["max_abs"]


def test_old_profiles_still_load(tmp_path):
    """pagesim-profile/1 files written before this change (no mixed steps, no noise fields) read."""
    path = tmp_path / "old.json"
    shapes = SHAPES[:16]
    write_profile(path, shapes, [truth(s) for s in shapes])
    d = ProfiledCostModel.from_profile(path).describe()
    assert d["error_by_kind"]["mixed"]["cross_validated"]["count"] == 0


# ----------------------------------------------------------------------------- step_shapes.csv

def write_log(path, rows, header=COLUMNS):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return str(path)


def row(shape: BatchShape, seconds: float):
    return [getattr(shape, f.name) for f in fields(BatchShape)] + [seconds]


def test_read_step_shapes(tmp_path):
    shapes = [prefill(2, 8), decode(4, 30), mixed(1, 4, 2, 9)]
    steps = read_step_shapes(write_log(tmp_path / "s.csv", [row(s, 0.1 * (i + 1)) for i, s in enumerate(shapes)]))
    assert [s.shape for s in steps] == shapes and [s.seconds for s in steps] == [0.1, 0.2, pytest.approx(0.3)]


@pytest.mark.parametrize("header, rows, message", [
    (COLUMNS[:-1], [], "row 1 (header): expected the columns"),
    (COLUMNS, [[1, 1, 1, 0, 0, 0, 0, 16]], "row 2: expected 9 fields, got 8"),
    (COLUMNS, [row(prefill(1, 4), 0.1), [1, 1, 1, "x", 0, 0, 0, 16, 0.1]], "row 3, field num_decode_seqs: "
     "expected a non-negative integer, got 'x'"),
    (COLUMNS, [[1, 1, 1, 0, -2, 0, 0, 16, 0.1]], "row 2, field decode_context_tokens"),
    (COLUMNS, [[1, 1, 1, 0, 0, 0, 0, 16, "nan"]], "row 2, field seconds: expected a non-negative number"),
    (COLUMNS, [[1, 1, 1, 0, 0, 0, 0, 16, "-1"]], "row 2, field seconds"),
])
def test_bad_step_shapes_name_file_row_and_field(tmp_path, header, rows, message):
    path = write_log(tmp_path / "bad.csv", rows, header)
    with pytest.raises(StepShapesError) as e:
        read_step_shapes(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value) and "\n" not in str(e.value)


def test_missing_file(tmp_path):
    with pytest.raises(StepShapesError, match="none.csv: cannot read"):
        read_step_shapes(str(tmp_path / "none.csv"))


@pytest.mark.parametrize("x, ratio, expected", [(1, 2, 1), (0.3, 2, 1), (3, 2, 4), (5, 2, 4), (6, 2, 8),
                                                (100, 2 ** 0.5, 91), (110, 2 ** 0.5, 128), (23, 2 ** 0.5, 23)])
def test_ladder_rounds_in_log_scale(x, ratio, expected):
    assert ladder_value(x, ratio) == expected


def test_visited_grid_keeps_most_visited_and_largest_within_budget():
    steps = ([LoggedStep(decode(8, 64), 0.3)] * 50 + [LoggedStep(decode(9, 60), 0.3)] * 5  # same cell as 8 x 64
             + [LoggedStep(decode(2, 16), 0.1)] * 30 + [LoggedStep(decode(32, 128), 1.0)]   # the largest, once
             + [LoggedStep(prefill(1, 32), 0.2)] * 20 + [LoggedStep(prefill(4, 128), 2.0)]
             + [LoggedStep(mixed(1, 8, 2, 9), 0.2)] * 100)  # mixed: not a prefill or decode cell
    pre, dec = visited_grid(steps, budget_s=1e9, reps=3)
    assert set(pre) == {(1, 32), (4, 128)} and set(dec) == {(8, 64), (2, 16), (32, 128)}
    # budget: the largest of each kind first (2.0 * 5 + 1.0 * 5 * 2 = 20 s), then by visits: 8 x 64
    # (0.3 * 5 * 2 = 3 s) and 2 x 16 (1 s) fit within 24 s, 1 x 32 (1 s) does not
    pre, dec = visited_grid(steps, budget_s=24.0, reps=3)
    assert pre == [(4, 128)] and dec == [(32, 128), (8, 64), (2, 16)]
    pre, dec = visited_grid(steps, budget_s=1e9, reps=3, max_prompt_tokens=100)
    assert (4, 128) not in pre and (32, 128) not in dec


# ----------------------------------------------------------------------------- repetitions

def t_quantile_975(df: int) -> float:
    """Brute force: integrate Student's t density from 0 until it holds 0.475 (Simpson, fine steps)."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
    pdf = lambda x: c * (1 + x * x / df) ** (-(df + 1) / 2)  # noqa: E731
    area, x, h = 0.0, 0.0, 1e-4
    while area < 0.475:
        area += h / 6 * (pdf(x) + 4 * pdf(x + h / 2) + pdf(x + h))
        x += h
    return x


def test_ci95_matches_the_t_interval():
    pytest.importorskip("torch")
    from executor.profiler import ProfileGrid, ci95_rel

    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 8, 16):
        xs = list(1.0 + 0.05 * rng.normal(size=n))
        expected = t_quantile_975(n - 1) * np.std(xs, ddof=1) / math.sqrt(n) / np.median(xs)
        assert ci95_rel(xs) == pytest.approx(expected, rel=1e-3)
    assert ci95_rel([1.0]) == math.inf
    grid = ProfileGrid(reps=3, max_reps=6, target_ci=0.02)
    assert not grid.enough([1.0, 1.0]) and grid.enough([1.0, 1.0, 1.0])  # exact: stop at reps
    assert not grid.enough([1.0, 1.3, 0.8]) and grid.enough([1.0, 1.3, 0.8, 1.1, 0.9, 1.2])  # noisy: up to the cap
