"""pagesim.fidelity against hand-built cases: known shapes, known durations, a constant cost
model; the t table against a numerical integral of Student's t density."""

import math

import pytest

from pagesim.compare import CHUNKED_SYSTEMS, CompareSettings
from pagesim.core.step import BatchShape
from pagesim.core.step import STEP_KINDS
from pagesim.fidelity import band_row, pool_profiles, speed_vs_profile, step_errors
from pagesim.metrics import mean_interval, t_quantile_975
from pagesim.sim.cost.step_shapes import COLUMNS as SHAPE_COLUMNS
from pagesim.sim.cost.step_shapes import read_step_shapes, write_step_shapes
from pagesim.sim.cost import ConstantCostModel

PREFILL = BatchShape(num_prefill_tokens=8, num_prefill_seqs=1, prefill_attn_pairs=36)
DECODE = BatchShape(num_decode_seqs=4, decode_context_tokens=40)
MIXED = BatchShape(num_prefill_tokens=8, num_prefill_seqs=1, prefill_attn_pairs=36, num_decode_seqs=2,
                   decode_context_tokens=20)
SWAP_MIXED = BatchShape(num_prefill_tokens=8, num_prefill_seqs=1, prefill_attn_pairs=36, num_decode_seqs=2,
                        decode_context_tokens=20, num_swap_blocks=3, num_copy_blocks=1)
COPY_DECODE = BatchShape(num_decode_seqs=2, decode_context_tokens=20, num_copy_blocks=2)


def test_step_kind_swap_wins_then_copy():
    assert [s.kind for s in (PREFILL, DECODE, MIXED, SWAP_MIXED, COPY_DECODE)] == \
        ["prefill", "decode", "mixed", "with swap", "with copy"]


def test_step_errors_by_kind_hand_computed():
    model = ConstantCostModel(0.1)  # predicts 0.1 s for every step
    # error = 0.1 / measured - 1
    steps = [(PREFILL, 0.1), (PREFILL, 0.125), (PREFILL, 0.08),  # 0, -0.2, +0.25
             (DECODE, 0.2), (DECODE, 0.05),                       # -0.5, +1.0
             (MIXED, 0.1),                                        # 0
             (SWAP_MIXED, 0.4),                                   # -0.75
             (COPY_DECODE, 0.1 / 1.1)]                            # +0.1
    e = step_errors(steps, model)
    assert set(e) == {*STEP_KINDS, "all"}
    p = e["prefill"]
    assert p["count"] == 3
    assert p["median_abs"] == pytest.approx(0.2)
    assert p["p90_abs"] == pytest.approx(0.2 + 0.8 * 0.05)  # |errors| 0, 0.2, 0.25: 80 % of the way from 0.2 to 0.25
    assert p["bias"] == pytest.approx(0.05 / 3)
    d = e["decode"]
    assert d["count"] == 2 and d["median_abs"] == pytest.approx(0.75) and d["bias"] == pytest.approx(0.25)
    assert e["mixed"]["count"] == 1 and e["mixed"]["median_abs"] == pytest.approx(0.0)
    assert e["with swap"]["count"] == 1 and e["with swap"]["bias"] == pytest.approx(-0.75)
    assert e["with copy"]["count"] == 1 and e["with copy"]["bias"] == pytest.approx(0.1)
    a = e["all"]
    assert a["count"] == 8
    # |errors| sorted: 0, 0, 0.1, 0.2, 0.25, 0.5, 0.75, 1.0 -> median 0.225
    assert a["median_abs"] == pytest.approx(0.225)
    assert a["bias"] == pytest.approx((0 - 0.2 + 0.25 - 0.5 + 1.0 + 0 - 0.75 + 0.1) / 8)


def test_step_errors_empty_kinds_and_speed():
    model = ConstantCostModel(0.1)
    e = step_errors([(DECODE, 0.11)], model)
    assert e["prefill"] == {"count": 0, "median_abs": None, "p90_abs": None, "bias": None}
    # a run 10 %, 20 %, 40 % slower than the model on its decode steps: the median is 1.2; other kinds ignored
    steps = [(DECODE, 0.11), (DECODE, 0.12), (DECODE, 0.14), (PREFILL, 5.0), (SWAP_MIXED, 5.0)]
    assert speed_vs_profile(steps, model) == pytest.approx(1.2)
    assert speed_vs_profile([(PREFILL, 1.0)], model) is None


def test_step_shapes_csv_round_trip_and_bad_input(tmp_path):
    steps = [(PREFILL, 0.123456789), (SWAP_MIXED, 1e-5)]
    path = tmp_path / "x" / "step_shapes.csv"
    write_step_shapes(path, steps)
    header = path.read_text().splitlines()[0]
    assert header == ",".join(SHAPE_COLUMNS)
    assert header.startswith("num_prefill_tokens,num_prefill_seqs,prefill_attn_pairs,num_decode_seqs,") and \
        header.endswith(",block_size,seconds")
    assert read_step_shapes(path) == steps
    bad = tmp_path / "bad.csv"
    bad.write_text(",".join(SHAPE_COLUMNS) + "\n1,1,1,0,0,0,0,16,fast\n")
    with pytest.raises(ValueError, match=r"bad.csv: row 2, field seconds"):
        read_step_shapes(bad)
    bad.write_text("a,b\n")
    with pytest.raises(ValueError, match=r"bad.csv: row 1 \(header\)"):
        read_step_shapes(bad)


def _t_cdf(x: float, df: int, n: int = 20000) -> float:
    """P(T <= x) for x > 0: 0.5 + Simpson's rule on the density from 0 to x."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def pdf(t):
        return c * (1 + t * t / df) ** (-(df + 1) / 2)

    h = x / n
    s = pdf(0) + pdf(x) + sum((4 if i % 2 else 2) * pdf(i * h) for i in range(1, n))
    return 0.5 + s * h / 3


@pytest.mark.parametrize("df", [1, 2, 4, 9, 30, 31, 60, 200])
def test_t_table_is_the_975_quantile(df):
    assert _t_cdf(t_quantile_975(df), df) == pytest.approx(0.975, abs=2e-5)


def test_mean_interval_and_band_rows():
    mean, lo, hi = mean_interval([1.0, 2.0, 3.0, 4.0, 5.0])
    half = 2.776 * math.sqrt(2.5) / math.sqrt(5)  # sd of 1..5 is sqrt(2.5); t_{0.975,4} = 2.776
    assert (mean, lo, hi) == pytest.approx((3.0, 3.0 - half, 3.0 + half))
    inside = band_row("x", "k", [1.0, 2.0, 3.0, 4.0, 5.0], 4.5)  # in the band, 50 % off the mean
    assert inside["inside_band"] and not inside["within_tolerance"] and inside["target_met"]
    tight = band_row("x", "k", [1.0, 1.0001, 0.9999], 1.04)  # outside a narrow band, within 5 %
    assert not tight["inside_band"] and tight["within_tolerance"] and tight["target_met"]
    assert tight["rel_to_mean"] == pytest.approx(0.04)
    missed = band_row("x", "k", [1.0, 1.0001, 0.9999], 1.2)
    assert missed["target_met"] is False
    one = band_row("x", "k", [1.0, None], 1.0)  # one usable run: no band
    assert one["runs"] == 1 and one["target_met"] is None


def test_bands_of_positive_metrics_never_go_below_zero():
    """Issue 27: with --repeat 2 the t interval (12.7 x the spread) went negative, -0.011 - 0.28
    req/s. A positive metric's band is the t interval of the logs, exponentiated."""
    from pagesim.metrics import nonnegative_interval

    two = band_row("request throughput", "request_throughput", [0.05, 0.2155], 0.13)
    _, plain_low, _ = mean_interval([0.05, 0.2155])
    assert plain_low < 0 < two["low"] and two["band_method"] == "log-scale t"
    # by hand: logs of 1 and 4 are 0 and ln 4, centre ln 2, sd ln 4 / sqrt 2, t_{0.975,1} = 12.706
    mean, low, high, how = nonnegative_interval([1.0, 4.0])
    half = 12.706 * (math.log(4) / math.sqrt(2)) / math.sqrt(2)
    assert (mean, low, high, how) == pytest.approx((2.5, 2 * math.exp(-half), 2 * math.exp(half), "log-scale t"))
    # a count that was 0 in one run: the plain t interval, its low end clipped at 0
    mean, low, high, how = nonnegative_interval([0.0, 3.0])
    assert (mean, low, how) == (1.5, 0.0, "t, clipped at 0") and high == pytest.approx(1.5 + 12.706 * 1.5)
    assert nonnegative_interval([0.0, 0.0]) == (0.0, 0.0, 0.0, "t")


def _profile(factor: float, created: str) -> dict:
    shape = {"num_decode_seqs": 2, "decode_context_tokens": 20, "block_size": 16}
    return {"format": "pagesim-profile/1", "created": created, "command": "c", "block_size": 16,
            "steps": [{"kind": "decode", "shape": shape, "seconds": 0.1 * factor, "samples": [0.1 * factor]}],
            "swaps": [{"kind": "swap_out", "shape": {"num_swap_blocks": 1, "block_size": 16}, "seconds": 0.01 * factor,
                       "samples": [0.01 * factor]}], "copies": []}


def test_pool_profiles_takes_each_shapes_median():
    pooled = pool_profiles([_profile(1.0, "a"), _profile(1.5, "b"), _profile(0.9, "c")])
    assert pooled["steps"][0]["seconds"] == pytest.approx(0.1)
    assert pooled["swaps"][0]["seconds"] == pytest.approx(0.01)
    assert sorted(pooled["steps"][0]["samples"]) == pytest.approx([0.09, 0.1, 0.15])
    assert pooled["pooled_from"] == ["a", "b", "c"]
    # an even count: the lower median, a measured record with its own shape
    assert pool_profiles([_profile(1.0, "a"), _profile(1.5, "b")])["steps"][0]["seconds"] == pytest.approx(0.1)
    other = _profile(1.0, "d")
    other["steps"][0]["shape"] = {"num_decode_seqs": 3, "decode_context_tokens": 30, "block_size": 16}
    with pytest.raises(ValueError, match=r"steps\[0\]"):
        pool_profiles([_profile(1.0, "a"), other])


def test_pool_profiles_same_cell_with_other_contexts():
    """Adaptive repetitions move a decode record's middle step: same cell, a context a few tokens
    longer. Pooled, each cell is the median record with its own shape (not a mix of the two)."""
    profiles = [_profile(f, c) for f, c in ((1.0, "a"), (1.2, "b"), (0.8, "c"))]
    profiles[1]["steps"][0]["shape"] = {"num_decode_seqs": 2, "decode_context_tokens": 24, "block_size": 16}
    profiles[0]["steps"][0]["shape"] = {"num_decode_seqs": 2, "decode_context_tokens": 22, "block_size": 16}
    pooled = pool_profiles(profiles)
    assert pooled["steps"][0]["seconds"] == pytest.approx(0.1)
    assert pooled["steps"][0]["shape"]["decode_context_tokens"] == 22  # profile "a"'s, whose time is the median
    profiles[2]["swaps"] = []
    with pytest.raises(ValueError, match="number of swaps"):
        pool_profiles(profiles)


def test_settings_for_chunked_prefill_and_parallel_sampling():
    s = CompareSettings(n=4)
    assert s.serving("paged-recompute-chunked").chunked_prefill and "paged-recompute-chunked" in CHUNKED_SYSTEMS
    assert not s.serving("paged-recompute").chunked_prefill
    assert s.workload().n == 4 and CompareSettings().workload().n is None
