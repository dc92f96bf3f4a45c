"""A summary's latency percentiles (pagesim.metrics._stats: order statistics put in place by
np.partition) against sorting every value in Python, and a case by hand."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pagesim.metrics import _stats


def _by_sorting(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile of values sorted by sorted()."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos // 1)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def test_percentiles_by_hand():
    # 1..11: p50 the 6th, p90 the 10th + 0 (pos 9.0), p99 10 + 0.9 x (11 - 10)
    s = _stats("x", np.arange(1.0, 12.0))
    assert (s["x_mean"], s["x_p50"], s["x_p90"], s["x_p99"]) == (6.0, 6.0, 10.0, 10.9)


@pytest.mark.parametrize("size", [1, 2, 3, 100, 101, 5000])
def test_percentiles_are_those_of_sorting_every_value(size):
    # many ties, zeros of both signs: the same floats, bit for bit (signs of zero included)
    rng = random.Random(size)
    for _ in range(20):
        values = [rng.choice([round(rng.expovariate(2.0), 2), rng.random(), 0.0, -0.0, 1.5]) for _ in range(size)]
        s = _stats("x", np.array(values))
        for q in (50, 90, 99):
            expected, got = _by_sorting(values, q), s[f"x_p{q}"]
            assert got == expected and np.signbit(got) == np.signbit(expected), (q, values)
