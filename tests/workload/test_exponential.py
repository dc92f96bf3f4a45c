"""pagesim.workload.exponential against numpy itself: the same draws, bit for bit, and the
ziggurat tables against an independent derivation in decimal arithmetic."""

from decimal import Decimal, localcontext
from itertools import islice

import numpy as np
import pytest

from pagesim.workload.arrivals import gamma_arrivals, poisson_arrivals
from pagesim.workload.exponential import _ZIGGURAT_R, standard_exponentials, ziggurat_tables

R = float(_ZIGGURAT_R)
# seeds of one 32-bit word, of two, and of more words than SeedSequence's pool of four
SEEDS = [0, 1, 2, 7, 42, 12345, 2**31 - 1, 2**32 - 1, 2**32, 2**63 + 11, 2**64, 2**160 + 5, 3**200]


def numpy_exponential(seed, scale, size):
    return np.random.default_rng(seed).exponential(scale, size=size).tolist()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("scale", [1.0, 1 / 3, 0.25, 1e-3, 250.0])
def test_draws_equal_numpys(seed, scale):
    mine = [scale * x for x in islice(standard_exponentials(seed), 3000)]
    assert mine == numpy_exponential(seed, scale, 3000)


def test_numpy_integer_seeds_and_bad_seeds():
    assert list(islice(standard_exponentials(np.int64(9)), 50)) == numpy_exponential(9, 1.0, 50)
    with pytest.raises(ValueError, match="seed"):
        next(standard_exponentials(-1))
    with pytest.raises(TypeError):
        next(standard_exponentials(1.5))


def branches_taken(seed, size):
    """Which ziggurat branch each of numpy's own first `size` draws took, read off numpy's raw
    PCG64 words and outputs: 'fast' (one word), 'tail' (layer 0, a second word), 'wedge' (a
    second word, accepted) and 'rejected' (two words, no output: the draw starts again).
    Checks that the words it accounts for are exactly the words numpy consumed."""
    outputs = numpy_exponential(seed, 1.0, size)
    rng = np.random.default_rng(seed)
    rng.exponential(1.0, size=size)
    next_word = int(rng.bit_generator.random_raw())
    words = [int(w) for w in np.random.default_rng(seed).bit_generator.random_raw(2 * size + 100)]
    consumed = words.index(next_word)
    k, w, _ = ziggurat_tables()
    counts = dict(fast=0, tail=0, wedge=0, rejected=0)
    at = 0
    for out in outputs:
        while True:
            bits = words[at] >> 3
            layer, u = bits & 0xFF, bits >> 8
            if u < k[layer]:
                counts["fast"] += 1
                at += 1
                break
            at += 2
            if layer == 0:
                assert out >= R
                counts["tail"] += 1
                break
            if out == u * w[layer]:
                counts["wedge"] += 1
                break
            counts["rejected"] += 1
    assert at == consumed
    return counts


def test_rare_branches_are_drawn_and_equal():
    # ~1 % of draws go to the wedge, ~1 % are rejected, ~0.04 % land in the tail beyond r
    totals = dict(fast=0, tail=0, wedge=0, rejected=0)
    for seed in range(8):
        assert list(islice(standard_exponentials(seed), 25_000)) == numpy_exponential(seed, 1.0, 25_000)
        for name, n in branches_taken(seed, 25_000).items():
            totals[name] += n
    assert totals["tail"] >= 40 and totals["wedge"] >= 1000 and totals["rejected"] >= 1000, totals
    assert totals["fast"] + totals["tail"] + totals["wedge"] == 8 * 25_000


def decimal_tables(r_text, digits=40):
    """The ziggurat's layers by the textbook recursion (Marsaglia & Tsang), in Decimal."""
    with localcontext() as ctx:
        ctx.prec = digits
        r = Decimal(r_text)
        v = (r + 1) * (-r).exp()
        x = [Decimal(0)] * 256
        x[255] = r
        for i in range(254, -1, -1):
            x[i] = -(v / x[i + 1] + (-x[i + 1]).exp()).ln()
        two53 = Decimal(2) ** 53
        k = [int(r / (r + 1) * two53), 0] + [int(x[i - 1] / x[i] * two53) for i in range(2, 256)]
        w = [float((r + 1) / two53)] + [float(x[i] / two53) for i in range(1, 256)]
        f = [1.0] + [float((-x[i]).exp()) for i in range(1, 256)]
        return (k, w, f), x[0]


def test_tables_are_the_recursions_and_r_closes_it():
    (k, w, f), top = decimal_tables(_ZIGGURAT_R)
    assert ziggurat_tables() == (k, w, f)
    # r is the root to its 29 digits: the recursion from it ends at x[0] = 0 within 1e-26
    # (x[0] moves ~20x as far as r does); Marsaglia & Tsang's 18 digits miss by 1e-16
    assert abs(top) < Decimal("1e-26")
    _, top_paper = decimal_tables("7.69711747013104972")
    assert abs(top_paper) > Decimal("1e-17")


def numpy_poisson(rate, seed, size):
    return np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=size), dtype=np.float64)


@pytest.mark.parametrize("count", [0, 1, 2, 4095, 4096, 4097, 8192, 9000])
def test_poisson_counts_equal_numpys_cumsum(count):
    assert poisson_arrivals(3.5, count=count, seed=11) == numpy_poisson(3.5, 11, count).tolist()


@pytest.mark.parametrize("last", [4095, 4096, 8191, 8192])
def test_poisson_durations_at_block_boundaries(last):
    # durations that end exactly at, just before and just after the 4096th / 8192nd arrival
    ref = numpy_poisson(4.0, 5, 9000)
    for duration in (ref[last - 1], np.nextafter(ref[last - 1], 0.0), (ref[last - 1] + ref[last]) / 2):
        want = ref[ref <= duration].tolist()
        assert poisson_arrivals(4.0, duration=float(duration), seed=5) == want
    assert len(poisson_arrivals(4.0, duration=float(ref[last - 1]), seed=5)) == last


@pytest.mark.parametrize("count", [1, 4096, 4097, 10_000])
def test_gamma_stays_numpys(count):
    gaps = np.random.default_rng(3).gamma(0.5, 1.0 / (2.0 * 0.5), size=count)
    want = np.cumsum(gaps, dtype=np.float64)
    assert gamma_arrivals(2.0, 0.5, count=count, seed=3) == want.tolist()
    duration = float(want[-1])
    assert gamma_arrivals(2.0, 0.5, duration=duration, seed=3) == want[want <= duration].tolist()
