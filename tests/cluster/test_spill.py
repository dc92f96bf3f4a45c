"""Replicas' records spilled to files and merged as they are read (pagesim.cluster.spill) against
plain references: the merge in chunks against one sort of every record by (time, replica, place
in its replica); the summary of the merge against the summary of the records in that order; the
spilled gap counts against the counts themselves."""

from __future__ import annotations

import random
import tempfile
from array import array

import numpy as np
import pytest

from pagesim.cluster.spill import MergedRecords, SpilledGaps, SpilledRecords
from pagesim.metrics import RequestColumns, RequestRecord, summarize_requests
from pagesim.metrics.itl import CHUNK as GAP_CHUNK
from pagesim.metrics.itl import GapCounts, SpanTally, TokenGaps, weighted_vllm_stats

STATUSES = [("finished", ""), ("rejected", "prompt too long"), ("rejected", "aborted")]


def _record(rng: random.Random, request_id: int, left: float) -> RequestRecord:
    status, reason = rng.choice(STATUSES)
    arrival = left - rng.choice([0.0, rng.random() * 5])
    done = status == "finished"
    output = rng.randint(1, 40)
    # (no token times: the columns keep none)
    return RequestRecord(request_id, status, reason, arrival, arrival + 0.01 if done else None,
                         arrival + 0.02 if done else None, left if done else None, rng.randint(1, 900), output,
                         rng.choice([1, 1, 3]), rng.randint(0, 2), 0, rng.randint(0, 64), output, (), ())


def _parts(seed: int, sizes: list[int], in_order: bool = True):
    """Per replica: its records and when each left (times drawn from a few values: many ties,
    within replicas and across them)."""
    rng = random.Random(seed)
    parts, request_id = [], 0
    for size in sizes:
        times = [round(rng.random() * 20, 1) for _ in range(size)]
        times = sorted(times) if in_order else times
        records = []
        for t in times:
            records.append(_record(rng, request_id, t))
            request_id += 1
        parts.append((records, times))
    return parts


def _spilled(parts, folder: str) -> MergedRecords:
    spilled = [SpilledRecords.write(RequestColumns.of(records), array("d", times), f"{folder}/r{k}-")
               for k, (records, times) in enumerate(parts)]
    return MergedRecords(spilled, None)


def _reference(parts):
    """Every record with its replica, sorted by (time, replica, place in its replica)."""
    rows = [(t, k, i, record) for k, (records, times) in enumerate(parts)
            for i, (record, t) in enumerate(zip(records, times))]
    return [(record, k) for _, k, _, record in sorted(rows, key=lambda row: row[:3])]


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("size", [1, 7, 64, 1 << 15])
def test_merge_in_chunks_is_one_sort_of_every_record(size, in_order):
    parts = _parts(size, [0, 50, 1, 300, 120], in_order)
    expected = _reference(parts)
    with tempfile.TemporaryDirectory() as folder:
        merged = _spilled(parts, folder)
        assert [p.in_order for p in merged.parts] == [True, in_order, True, in_order, in_order]
        chunks = list(merged.chunks(size))
        got = [(record, int(k)) for columns, owners in chunks for record, k in zip(columns, owners)]
        assert got == expected
        if in_order:  # (every part topped up to its share: a chunk holds at least one part's share, but the last)
            assert all(len(columns) >= max(1, size // 4) for columns, _ in chunks[:-1])
        assert len(merged) == len(expected)
        # a whole column (a pass of its own), then the columns built, the replicas, a record at random
        assert merged.column("arrival_time").tolist() == [r.arrival_time for r, _ in expected]
        ids, outputs = merged.columns_of(["request_id", "output_len"])
        assert (ids.tolist(), outputs.tolist()) == ([r.request_id for r, _ in expected], [r.output_len for r, _ in expected])
        assert merged.replicas().tolist() == [k for _, k in expected]
        assert merged[17] == expected[17][0] and list(merged) == [r for r, _ in expected]
        # each replica's own records, in its own order
        assert [list(p) for p in merged.parts] == [records for records, _ in parts]


@pytest.mark.parametrize("rows", [7, 1 << 15])
def test_the_merges_summary_is_that_of_the_records_in_its_order(rows, monkeypatch):
    """Read a few rows at a time or all at once (the merge's chunks, and the in-memory columns')."""
    import pagesim.cluster.spill
    import pagesim.metrics.request_columns

    parts = _parts(3, [400, 0, 250, 333])
    expected = [record for record, _ in _reference(parts)]
    whole = summarize_requests(expected, 4.0), summarize_requests(expected, 0.0)
    monkeypatch.setattr(pagesim.cluster.spill, "MERGED_ROWS", rows)
    monkeypatch.setattr(pagesim.metrics.request_columns, "COLUMN_CHUNK", rows)
    with tempfile.TemporaryDirectory() as folder:
        merged = _spilled(parts, folder)
        assert (summarize_requests(merged, 4.0), summarize_requests(merged, 0.0)) == whole
        assert summarize_requests(RequestColumns.of(expected), 4.0) == whole[0]
        assert whole[0]["num_measured"] < whole[1]["num_measured"] and whole[0]["reject_reasons"]


def test_spilled_gap_counts_read_back_the_counts():
    rng = np.random.default_rng(5)
    gaps = GapCounts(rng.random(200_000) * 0.05, rng.integers(1, 30, 200_000).astype(np.uint16), 77, 1.0, 0.0)
    with tempfile.TemporaryDirectory() as folder:
        spilled = SpilledGaps.write(gaps, f"{folder}/r0-")
        assert (spilled.num_requests, spilled.warmup_s, spilled.origin) == (77, 1.0, 0.0)
        back = list(spilled.chunks())
        assert np.array_equal(np.concatenate([v for v, _ in back]), gaps.values)
        assert np.array_equal(np.concatenate([w for _, w in back]), gaps.weights)
        assert weighted_vllm_stats("itl", spilled.chunks) == weighted_vllm_stats("itl", gaps.chunks)


def test_a_tallys_gaps_spilled_as_counted_give_its_statistics():
    """A SpanTally's gaps written a stretch at a time (gap_count_pieces) against the tally itself
    and its GapCounts (distinct over stretches of steps: more stretches than one here)."""
    rng = np.random.default_rng(8)
    steps = 3 * GAP_CHUNK + 123
    times = np.cumsum(rng.choice([0.02, 0.025, 0.03, 0.0301], steps))
    tally = SpanTally(array("d", times.tobytes()), 0.0, 0.0)
    for _ in range(500):
        a = int(rng.integers(0, steps - 10))
        b = int(rng.integers(a + 2, min(steps, a + 40_000)))
        tally.add([a, b] if rng.random() < 0.7 else [a, (a + b) // 2, (a + b) // 2 + 1, b])
    expected = weighted_vllm_stats("itl", lambda: TokenGaps([], [tally]).chunks())
    counts = tally.gap_counts()
    with tempfile.TemporaryDirectory() as folder:
        spilled = SpilledGaps.write(tally, f"{folder}/r0-")
        assert spilled.count == len(counts.values) and spilled.num_requests == 500
        assert weighted_vllm_stats("itl", spilled.chunks) == expected
    assert weighted_vllm_stats("itl", counts.chunks) == expected
    assert len(counts.values) < steps and len(np.unique(counts.values)) < len(counts.values)
