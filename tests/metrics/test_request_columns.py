"""Records as packed columns (RequestColumns, MetricsRecorder.pack): the columns give back the
same records (their token times aside), reorder and split as the list of records does, and a
packed recorder's summary is the one of its records, computed from the records as a list of
RequestRecords (the summary's request half reads columns either way; its inter-token half reads
the records' own token spans against the packed recorder's tally)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pagesim.metrics import RequestColumns, RequestRecord, summarize_requests
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = load_trace(ROOT / "traces" / "sharegpt.json")
SESSIONS = load_trace(ROOT / "traces" / "sharegpt_sessions.json")

RUNS = {  # rejections (prompts over max_model_len), n samples, sessions (session ids and turns)
    "rejects": (SHAREGPT, dict(rate=8.0, num_requests=150, max_model_len=512, warmup_s=2.0)),
    "samples": (SHAREGPT, dict(rate=4.0, num_requests=60, n=3, num_gpu_blocks=600)),
    "sessions": (SESSIONS, dict(rate=1.0, num_requests=80, prefix_caching=True)),
}


def _replay(name: str):
    trace, options = RUNS[name]
    return Replay(ReplayConfig(**options), trace).run()


def _plain(record: RequestRecord) -> RequestRecord:
    return replace(record, token_spans=(), step_times=())


@pytest.mark.parametrize("name", RUNS)
def test_columns_give_back_the_records(name):
    records = _replay(name).metrics.requests
    columns = RequestColumns.of(records)
    assert len(columns) == len(records)
    assert list(columns) == [_plain(r) for r in records]
    assert columns[3] == _plain(records[3]) and columns[-1] == _plain(records[-1])
    assert columns[2:5] == [_plain(r) for r in records[2:5]]
    if name == "rejects":
        assert {r.status for r in records} == {"finished", "rejected"}
    if name == "sessions":
        assert any(r.session_id is not None for r in records) and any(r.turn for r in records)


def test_concat_take_and_part_follow_the_list():
    parts = [_replay(name).metrics.requests for name in RUNS]
    whole = RequestColumns.concat([RequestColumns.of(p) for p in parts])
    flat = [_plain(r) for p in parts for r in p]
    assert list(whole) == flat
    chunks = list(whole.column_chunks())
    assert list(RequestColumns.concat(chunks)) == flat and all(len(c) <= 1 << 16 for c in chunks)
    order = np.random.default_rng(1).permutation(len(flat)).astype(np.int32)
    seen = whole.take(order)
    assert list(seen) == [flat[i] for i in order]
    assert list(seen.take(np.arange(5, 40)).packed()) == [flat[i] for i in order[5:40]]
    assert list(seen.part(10, 30)) == [flat[i] for i in order[10:30]]
    assert list(whole.part(len(parts[0]), len(parts[0]) + len(parts[1]))) == [_plain(r) for r in parts[1]]
    assert seen.texts("status") == [flat[i].status for i in order]
    # columns of columns, and of nothing
    assert list(RequestColumns.concat([seen.part(0, 7), whole.part(3, 9)])) == [flat[i] for i in order[:7]] + flat[3:9]
    assert len(RequestColumns.of([])) == 0 and list(RequestColumns.concat([])) == []


def test_a_count_too_large_for_the_columns_fails_loudly():
    record = _plain(_replay("samples").metrics.requests[0])
    with pytest.raises(OverflowError):
        RequestColumns.of([replace(record, request_id=2**31)])


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.parametrize("keep_steps", [True, False])
def test_a_packed_recorder_summarizes_as_its_records(name, keep_steps):
    trace, options = RUNS[name]
    metrics = Replay(ReplayConfig(**options), trace, keep_steps=keep_steps).run().metrics
    records = list(metrics.requests)
    before = metrics.summary()
    metrics.pack()
    assert isinstance(metrics.requests, RequestColumns) and metrics.span_tally is not None
    assert metrics.summary() == before
    if keep_steps:  # the records with their token spans, summarized as a list: the same request half
        of_records = summarize_requests(records, metrics.warmup_s, metrics.origin)
        assert of_records == {key: before[key] for key in of_records}
