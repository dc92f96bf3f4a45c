"""Weighted statistics of many values in bounded memory: the pooled inter-token latencies of a
run (every request's token-to-token gaps, as vLLM pools them), whose count grows with the run's
steps.

The gaps are never materialised at once: `TokenGaps` keeps, per driver, one count per step
(4 bytes) and the distinct gaps across breaks, and hands out (values, weights) a stretch of
steps at a time. The statistics read those chunks in a few passes: the mean and the standard
deviation from correctly rounded sums (`exact_weighted_sum`), the percentiles from order
statistics found by a radix select over the values' bit patterns, 16 bits a pass
(`weighted_percentiles`). Results are the same floats as numpy gives on the
values repeated by their weights (tests/metrics/test_itl_weighted.py), so a run's summary does
not depend on how the gaps are grouped.

numpy is imported inside the functions: `import pagesim.metrics` stays light.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

if TYPE_CHECKING:
    import numpy as np

    from pagesim.metrics.records import RequestRecord

Chunks = Callable[[], Iterable[tuple["np.ndarray", "np.ndarray"]]]  # each call: a fresh pass over (values, weights)

CHUNK = 1 << 16  # values per chunk: every pass's temporaries stay this size
FOLD_SPANS = 1 << 14  # span entries gathered before they are folded into the counts
DIGIT_BITS = 16  # the radix select's digit (order statistics): four passes over a value's 64 bits
NUM_DIGITS = 1 << DIGIT_BITS
MAX_WEIGHT = 1 << 26  # weights exact_weighted_sum takes (below it, each product is exact)
SORTED_AT_ONCE = 4 * CHUNK  # values up to which order statistics sort them all (a few MB), not radix-select


class TokenGaps:
    """Every request's token-to-token gaps pooled, as (gap, weight) pairs, in memory that grows
    with steps, not tokens: a gap between a request's tokens at steps k and k + 1 is the
    driver's gap between those steps, weighted by how many requests had both; a gap across a
    break in a request's tokens (a preemption, a step without it) is kept once per pair of
    steps, weighted by the requests that broke there."""

    def __init__(self, records: list[RequestRecord], tallies: Iterable[SpanTally | GapCounts] = ()):
        """records: those whose gaps count (their token spans, grouped by the step times they
        point into); tallies: drivers' spans folded as they were recorded (records kept without
        spans), or their gaps counted (GapCounts), each a driver of its own."""
        by_times: dict[int, SpanTally] = {}  # per driver: the records sharing one step-time array
        for r in records:
            if r.token_spans:
                tally = by_times.get(id(r.step_times))
                if tally is None:
                    tally = by_times[id(r.step_times)] = SpanTally(r.step_times)
                tally.add(r.token_spans)
        # per driver: its SpanTally's drivers_entry (worked out once for the passes over them), or GapCounts
        self.drivers = [t.drivers_entry() if isinstance(t, SpanTally) else t
                        for t in (*by_times.values(), *tallies) if t.num_requests]

    def chunks(self):
        """(values, weights) a stretch at a time; together every distinct gap once per driver."""
        for driver in self.drivers:
            yield from _step_chunks(*driver) if isinstance(driver, tuple) else driver.chunks()

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every (value, weight) pair at once (for tests and small runs)."""
        import numpy as np

        parts = list(self.chunks())
        if not parts:
            return np.zeros(0), np.zeros(0, dtype=np.int32)
        return np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts])


class SpanTally:
    """One driver's requests' token spans folded into what their pooled gaps need, in memory
    that grows with steps and distinct breaks, not requests: held[k], the requests with tokens at
    steps k and k + 1 (a difference array over the steps, 4 bytes a step), and the distinct
    breaks (from a span's last step to the same request's next span) with how many requests
    broke there. Spans are added a request at a time and folded FOLD_SPANS entries at a time.

    A recorder that keeps no spans in its records folds those of its measured requests here as
    they leave (warmup_s and origin: the warm-up it measured them by, which a summary checks)."""

    def __init__(self, step_times: Sequence[float], warmup_s: float | None = None, origin: float | None = None):
        self.step_times = step_times
        self.warmup_s, self.origin = warmup_s, origin
        self.num_requests = 0
        self._pending = array("i")  # spans not folded yet, flattened, and how many spans each request has
        self._pending_counts = array("i")
        self._diff = array("i")  # +1 where a span starts, -1 at its last step, over the steps (grown as needed)
        self._pairs = _PairCounts()

    def add(self, spans: Sequence[int]) -> None:
        """One request's spans, flattened [a0, b0, a1, b1, ...] (steps a .. b - 1 gave it tokens)."""
        self._pending.extend(spans)
        self._pending_counts.append(len(spans) // 2)
        self.num_requests += 1
        if len(self._pending) >= FOLD_SPANS:
            self._fold()

    def _fold(self) -> None:
        import numpy as np

        if not self._pending:
            return
        spans = np.frombuffer(self._pending, dtype=np.int32).astype(np.int64)
        starts, stops = spans[0::2], spans[1::2]
        size = int(stops.max()) + 1
        if len(self._diff) < size:
            self._diff.frombytes(bytes(self._diff.itemsize * (size - len(self._diff))))
        # (counted over the steps the batch spans only: its temporaries stay the batch's size,
        # not the run's steps)
        low = int(starts.min())
        diff = np.frombuffer(self._diff, dtype=np.int32)[low:size]
        np.add(diff, np.bincount(starts - low, minlength=size - low), out=diff, casting="unsafe")
        np.subtract(diff, np.bincount(stops - 1 - low, minlength=size - low), out=diff, casting="unsafe")
        del diff  # (the array cannot grow while numpy views its buffer)
        same_request = np.ones(len(starts), dtype=bool)
        same_request[np.cumsum(self._pending_counts) - 1] = False  # a last span has no next
        # (requests in the batch break together, at a prefill step: one pair per pair of steps),
        # each pair as (last step << 32) | next start
        self._pairs.add(((stops[:-1][same_request[:-1]] - 1) << 32) | starts[1:][same_request[:-1]])
        self._pending, self._pending_counts = array("i"), array("i")

    def gap_counts(self) -> GapCounts:
        """The same gaps as distinct values with counts, without the step times: what a summary
        needs of this driver. Distinct within each stretch of steps (TokenGaps' chunks): about
        half a replay's steps have a gap of their own, so that is nearly as few as distinct over
        the run, and the temporaries stay a stretch's size, not the run's (the statistics do not
        depend on how the gaps are grouped)."""
        import numpy as np

        pieces = list(self.gap_count_pieces())
        values, counts = [v for v, _ in pieces], [c for _, c in pieces]
        del pieces
        largest = max((int(c.max()) for c in counts if len(c)), default=0)
        # (2 bytes a count where they fit: most are a batch's requests)
        dtype = np.uint16 if largest < 1 << 16 else np.int32
        return GapCounts(np.concatenate(values) if values else np.zeros(0),
                         np.concatenate([c.astype(dtype) for c in counts]) if counts else np.zeros(0, dtype=dtype),
                         self.num_requests, self.warmup_s, self.origin)

    def gap_count_pieces(self):
        """gap_counts' values and counts (int64), a stretch of steps at a time."""
        import numpy as np

        for gaps, weights in TokenGaps([], (self,)).chunks():
            distinct, where = np.unique(gaps, return_inverse=True)
            count = np.bincount(where, weights=weights, minlength=len(distinct)).astype(np.int64)
            if len(count) and count.max() >= MAX_WEIGHT:  # (the exact sums take smaller weights: keep them apart)
                distinct, count = gaps, weights.astype(np.int64)
            yield distinct, count

    def drivers_entry(self):
        """(step times, held, break gaps, break weights): this driver's gaps, as chunks() reads them."""
        import numpy as np

        self._fold()
        step_times = self.step_times
        # (a view of the driver's packed array where it is one, not a copy)
        times = np.frombuffer(step_times) if isinstance(step_times, array) else np.asarray(step_times, dtype=float)
        n = len(times)
        diff = np.frombuffer(self._diff, dtype=np.int32)[:max(n - 1, 0)]
        held = np.zeros(n - 1, dtype=np.int32) if n > 1 else np.zeros(0, dtype=np.int32)
        held[:len(diff)] = diff
        held = np.cumsum(held, dtype=np.int32, out=held)
        unique, counts = self._pairs.result()
        return times, held, times[unique & 0xFFFFFFFF] - times[unique >> 32], counts.astype(np.int32)


def _step_chunks(times, held, break_values, break_weights):
    """A driver's (gaps, weights) from its drivers_entry, a stretch of steps at a time, then the
    gaps across breaks."""
    for i in range(0, len(held), CHUNK):
        part = held[i:i + CHUNK]
        inside = part > 0
        yield (times[i + 1:i + 1 + len(part)] - times[i:i + len(part)])[inside], part[inside]
    if len(break_values):
        yield break_values, break_weights


@dataclass
class GapCounts:
    """A driver's pooled token gaps as values with counts (distinct within each stretch of steps:
    SpanTally.gap_counts): a tally's stand-in in TokenGaps and in a summary's span_tallies."""

    values: np.ndarray
    weights: np.ndarray
    num_requests: int
    warmup_s: float | None = None
    origin: float | None = None

    def chunks(self):
        for i in range(0, len(self.values), CHUNK):
            yield self.values[i:i + CHUNK], self.weights[i:i + CHUNK]


class _PairCounts:
    """Distinct step pairs with counts, merged as they come: memory grows with distinct pairs
    (merging whenever the pending ones outnumber the merged, so each pair is merged O(log) times)."""

    def __init__(self):
        import numpy as np

        self.unique, self.counts = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        self.pending: list[np.ndarray] = []
        self.num_pending = 0

    def add(self, pairs: np.ndarray) -> None:
        self.pending.append(pairs)
        self.num_pending += len(pairs)
        if self.num_pending > max(len(self.unique), CHUNK):
            self._merge()

    def _merge(self) -> None:
        import numpy as np

        fresh = np.concatenate(self.pending) if self.pending else np.zeros(0, dtype=np.int64)
        values = np.concatenate([self.unique, fresh])
        weights = np.concatenate([self.counts, np.ones(len(fresh), dtype=np.int64)])
        self.unique, where = np.unique(values, return_inverse=True)
        self.counts = np.bincount(where, weights=weights, minlength=len(self.unique)).astype(np.int64)
        self.pending, self.num_pending = [], 0

    def result(self):
        self._merge()
        return self.unique, self.counts


def _keys(values: np.ndarray) -> np.ndarray:
    """Each value's bits as a signed integer in the values' order (the low 63 bits flipped for
    negatives, so that integer order is value order; the flip undoes itself)."""
    import numpy as np

    bits = values.view(np.int64)
    return bits ^ ((bits >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))


def _order_statistics(chunks: Chunks, ranks: list[int]) -> list[float]:
    """The k-th smallest (0-based) of the values each repeated weight times, for each k in ranks:
    a radix select over the values' keys (_keys), DIGIT_BITS at a time from the top. Each pass
    counts, for each rank, the weight of the values that share the digits found so far, by their
    next digit, and the rank's digit is where its count is reached; after the last digit the key,
    and so the value, is known. (Memory: a histogram per rank and a chunk, whatever the values.)
    At most SORTED_AT_ONCE values in all are sorted instead (the same order statistics)."""
    import numpy as np

    parts, size = [], 0
    for values, weights in chunks():
        parts.append((values, weights))
        size += len(values)
        if size > SORTED_AT_ONCE:
            break
    else:  # (few values, as a request statistic's or a short run's gaps: sorted at once, faster)
        values = np.concatenate([v for v, _ in parts]) if parts else np.zeros(0)
        weights = np.concatenate([w for _, w in parts]) if parts else np.zeros(0, dtype=np.int64)
        order = np.argsort(_keys(values), kind="stable")  # (key order: the radix select's)
        upto = np.cumsum(weights[order], dtype=np.int64)
        return [values[order[int(np.searchsorted(upto, k, side="right"))]] for k in ranks]
    del parts
    prefixes = [0] * len(ranks)  # per rank: its key's digits found so far (its top bits)
    left = list(ranks)  # per rank: its rank among the values that share those digits
    for shift in range(64 - DIGIT_BITS, -1, -DIGIT_BITS):
        above = shift + DIGIT_BITS
        wanted = sorted(set(prefixes))
        hists = {prefix: np.zeros(NUM_DIGITS, dtype=np.int64) for prefix in wanted}
        for values, weights in chunks():
            keys = _keys(values)
            # (the top digit as a signed number shifted to 0 .. NUM_DIGITS - 1; the others unsigned)
            digits = (keys >> shift) + NUM_DIGITS // 2 if above == 64 else (keys >> shift) & (NUM_DIGITS - 1)
            for prefix in wanted:
                inside = (keys >> above) == prefix if above < 64 else slice(None)
                hists[prefix] += np.bincount(digits[inside], weights=weights[inside], minlength=NUM_DIGITS).astype(np.int64)
        uptos = {prefix: np.cumsum(hist) for prefix, hist in hists.items()}
        for i, prefix in enumerate(prefixes):
            upto = uptos[prefix]
            digit = int(np.searchsorted(upto, left[i], side="right"))
            left[i] -= int(upto[digit - 1]) if digit else 0
            if above == 64:
                digit -= NUM_DIGITS // 2
            prefixes[i] = (prefix << DIGIT_BITS) | digit if above < 64 else digit
    keys = np.array(prefixes, dtype=np.int64)
    return list(_keys(keys.view(np.float64)).view(np.float64))


def _total_weight(chunks: Chunks) -> int:
    import numpy as np

    return sum(int(w.sum(dtype=np.int64)) for _, w in chunks())


def weighted_percentiles_of(chunks: Chunks, qs: list[float], count: int | None = None) -> list[float]:
    """np.percentile(np.repeat(values, weights), qs) exactly (its default linear method: the
    same two order statistics and the same interpolation arithmetic), without the repeat, over
    values and weights given a chunk at a time; count: their total weight, where known."""
    import numpy as np

    count = _total_weight(chunks) if count is None else count
    virtuals = (np.asarray(qs, dtype=float) / 100) * (count - 1)
    lows = [int(np.floor(v)) for v in virtuals]
    ranks = sorted({min(k, count - 1) for lo in lows for k in (lo, lo + 1)})
    nth = dict(zip(ranks, _order_statistics(chunks, ranks)))
    results = []
    for virtual, lo in zip(virtuals, lows):
        if virtual >= count - 1:
            results.append(float(nth[count - 1]))
            continue
        a, b = nth[lo], nth[lo + 1]
        gamma = virtual - np.floor(virtual)
        diff = b - a
        results.append(float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma))
    return results


def weighted_percentiles(values: np.ndarray, weights: np.ndarray, qs: list[float]) -> list[float]:
    """weighted_percentiles_of over one chunk: np.percentile(np.repeat(values, weights), qs)."""
    return weighted_percentiles_of(lambda: [(values, weights)], qs)


def exact_weighted_sum_of(chunks: Iterable[tuple[np.ndarray, np.ndarray]]) -> float:
    """sum(v * w) over every chunk's values and weights, correctly rounded: the same float however
    the values are grouped or ordered (one run's gaps weighted by the requests in it, or every
    token's gap one by one), and the same float math.fsum gives of the exact products.

    Summed exactly in integers, at numpy speed (math.fsum over the products, as lists, was up to
    6 % of a replay): each value is +-m * 2**(f - 1075), m its 53-bit mantissa and f its exponent
    field, both read from its bits (a subnormal: f = 1, no leading 1); m is cut into pieces
    small enough that a piece times a weight, summed over a chunk, stays below 2**63, so
    np.add.at's int64 sums of them per exponent are exact; those sums, shifted to their
    exponents, add up as Python integers, and one division by a power of two rounds the total
    once (int / int is correctly rounded, half to even, as fsum rounds). A non-finite value makes
    the sum NaN (as the split products made it before)."""
    import numpy as np

    total = 0  # the exact sum, in units of 2**_LOWEST
    for values, weights in chunks:
        if weights.size and int(weights.max()) >= MAX_WEIGHT:
            raise ValueError(f"weights up to {int(weights.max())} reach 2**26: products would round")
        for i in range(0, len(values), CHUNK):
            v, w = values[i:i + CHUNK], weights[i:i + CHUNK]
            if not v.size:
                continue
            if not np.isfinite(v).all():
                return math.nan
            bits = np.ascontiguousarray(v, dtype=np.float64).view(np.int64)
            fields = (bits >> 52) & 0x7FF
            mantissas = (bits & _FRACTION_BITS) | np.where(fields > 0, _LEADING_ONE, 0)
            signed = w.astype(np.int64)
            if bits.min() < 0:  # (the sign bit: negative values, and -0.0)
                signed = np.where(bits < 0, -signed, signed)
            scales = np.maximum(fields, 1)  # (a subnormal's scale is field 1's)
            low = int(scales.min())
            slots = scales - low
            # piece bits: a chunk's sum of (piece * weight) stays below 2**63
            piece_bits = 63 - (len(v) - 1).bit_length() - int(np.abs(signed).max()).bit_length()
            for shift in range(0, 53, piece_bits):
                sums = np.zeros(int(slots.max()) + 1, dtype=np.int64)
                np.add.at(sums, slots, ((mantissas >> shift) & ((1 << piece_bits) - 1)) * signed)
                for slot in np.flatnonzero(sums).tolist():
                    total += int(sums[slot]) << (slot + low - 1075 + shift - _LOWEST)
    return total / (1 << -_LOWEST)


_FRACTION_BITS = (1 << 52) - 1  # a double's stored mantissa bits
_LEADING_ONE = 1 << 52  # the leading 1 a normal double's mantissa has, not stored
_LOWEST = -1200  # below any value's lowest bit (2**-1074 as 2**52 * 2**-1126): every shift above is >= 0


def sum_in_order(values: np.ndarray, start: float = 0.0) -> float:
    """start + values[0] + values[1] + ..., each float added to the total in turn, left to right
    (as `total += v` and Python 3.11's sum() add them; np.add.accumulate, never numpy's pairwise
    sum), a chunk at a time: temporaries a chunk's size however many values."""
    import numpy as np

    total = start
    for i in range(0, len(values), CHUNK):
        total = float(np.add.accumulate(np.concatenate(([total], values[i:i + CHUNK])))[-1])
    return total


def exact_weighted_sum(values: np.ndarray, weights: np.ndarray) -> float:
    """exact_weighted_sum_of one chunk."""
    return exact_weighted_sum_of([(values, weights)])


def weighted_vllm_stats(name: str, chunks: Chunks) -> dict | None:
    """vLLM's mean / median / std / p99 in milliseconds of the values each repeated weight times:
    the median and p99 exactly as numpy gives them on the repeated values; the mean and the
    (population) std from correctly rounded sums, so equal for any grouping of the same values
    (numpy's pairwise sums round in an order that depends on the grouping). None: no values."""
    count = _total_weight(chunks)
    if not count:
        return None
    mean = exact_weighted_sum_of(chunks()) / count
    std = math.sqrt(exact_weighted_sum_of(((v - mean) ** 2, w) for v, w in chunks()) / count)
    median, p99 = weighted_percentiles_of(chunks, [50, 99], count)
    return {f"mean_{name}_ms": mean * 1000.0, f"median_{name}_ms": median * 1000.0, f"std_{name}_ms": std * 1000.0,
            f"p99_{name}_ms": p99 * 1000.0}
