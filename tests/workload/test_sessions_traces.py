"""Session traces: the trace fields (session_id, turn, think_time) and their checks, and the session
builders (pagesim.workload.builders.sessions) on small files made here, checked against what their
rules say by hand."""

from __future__ import annotations

import json
import os

import pytest

from pagesim.workload.builders import default_data_dir
from pagesim.core.hashed_prompt import HashedPrompt
from pagesim.workload.builders.sessions import (TOKEN_ID_SPACE, AgentParams, build_agent_sessions,
                                                build_mooncake_sessions, build_sharegpt_sessions, conversation_chains)
from pagesim.workload.builders.timeline import SourceError
from pagesim.workload.sessions import extends
from pagesim.workload.trace import TraceError, dumps_trace, load_trace, parse_trace


def trace_text(*records: dict) -> str:
    return json.dumps({"format": "pagesim-trace/1", "metadata": {}, "requests": list(records)})


def test_session_fields_round_trip():
    text = trace_text({"prompt_len": 3, "output_len": 2, "session_id": "a", "turn": 0},
                      {"prompt_len": 7, "output_len": 1, "session_id": "a", "turn": 1, "think_time": 1.5})
    trace = parse_trace(text)
    assert [(r.session_id, r.turn, r.think_time) for r in trace.requests] == [("a", 0, None), ("a", 1, 1.5)]
    assert parse_trace(dumps_trace(trace)) == trace


@pytest.mark.parametrize("records, index, field, words", [
    ([{"prompt_len": 3, "output_len": 2, "turn": 0}], 0, "turn", "without a session_id"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1}], 0, "turn", "missing"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": -1, "turn": 0}], 0, "session_id", ">= 0"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1, "turn": 1}], 0, "turn", "next turn is 0"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1, "turn": 0},
      {"prompt_len": 9, "output_len": 2, "session_id": 1, "turn": 2}], 1, "turn", "next turn is 1"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1, "turn": 0, "think_time": 1}], 0, "think_time", "turns >= 1"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1, "turn": 0},
      {"prompt_len": 9, "output_len": 2, "session_id": 1, "turn": 1, "think_time": -2}], 1, "think_time", "[0, 1e9)"),
    ([{"prompt_len": 3, "output_len": 2, "session_id": 1, "turn": 0},
      {"prompt_len": 9, "output_len": 2, "session_id": 1, "turn": 1, "think_time": "5"}], 1, "think_time", "[0, 1e9)"),
])
def test_malformed_session_fields_name_the_record_and_field(records, index, field, words):
    with pytest.raises(TraceError) as caught:
        parse_trace(trace_text(*records), "t.json")
    assert (caught.value.index, caught.value.field) == (index, field)
    assert words in str(caught.value) and str(caught.value).startswith("t.json: ")


# -- Mooncake ---------------------------------------------------------------------------------


def test_conversation_chains_by_hand():
    # A: blocks (1, 2) full, 3 partial. B extends A's full blocks: A's turn 1. C also extends A's
    # blocks, but A is no longer its conversation's latest (B is): a branch, its own conversation.
    # D extends B's full blocks (1, 2, 5): turn 2. E shares nothing.
    rows = [([1, 2, 3], 1300), ([1, 2, 5, 6], 1800), ([1, 2, 7], 1100), ([1, 2, 5, 9], 2000), ([8], 100)]
    assert conversation_chains([h for h, _ in rows], [n for _, n in rows]) == [(0, 0), (0, 1), (1, 0), (0, 2), (2, 0)]


def write_jsonl(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def bench_ids(hash_ids, length):
    """The ids bench sends for a Mooncake prompt (the vocabulary of the session builder)."""
    return HashedPrompt(tuple(hash_ids), length).vocab_ids(TOKEN_ID_SPACE)


def test_mooncake_sessions_from_a_small_file(tmp_path):
    path = tmp_path / "synthetic.jsonl"
    write_jsonl(path, [
        {"timestamp": 0, "input_length": 1300, "output_length": 7, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 600, "output_length": 3, "hash_ids": [40, 41]},  # alone: dropped
        {"timestamp": 1000, "input_length": 0, "output_length": 3, "hash_ids": []},  # no prompt: dropped, counted
        {"timestamp": 2000, "input_length": 1250, "output_length": 4, "hash_ids": [1, 2, 9]},
    ])
    trace = build_mooncake_sessions(tmp_path, num=None, source=path)
    first, second = trace.requests
    assert (first.session_id, first.turn, second.session_id, second.turn) == (0, 0, 0, 1)
    assert first.prompt_token_ids == bench_ids([1, 2, 3], 1300)
    # a hash id's block is the same stream wherever it appears: block 2 alone, block 3's start
    assert first.prompt_token_ids[512:1024] == bench_ids([2], 512)
    assert first.prompt_token_ids[1024:] == bench_ids([3], 1300 - 1024)
    assert all(4 <= t < TOKEN_ID_SPACE for t in first.prompt_token_ids)
    # turn 1: turn 0's prompt and output, then its row's tokens past the 2 full blocks it shares
    assert second.prompt_len == 1300 + 7 + (1250 - 2 * 512)
    assert second.prompt_token_ids[:1300] == first.prompt_token_ids
    assert second.prompt_token_ids[1307:] == bench_ids([9], 1250 - 1024)
    assert extends(second, first)
    assert [r.arrival_time for r in trace.requests] == [0.0, 2.0]
    assert trace.metadata["history_tokens_added"] == 1307 - 1024
    assert trace.metadata["filters"][0] == {"rule": "prompt and output have at least one token (a replay needs both)",
                                            "kept": 3, "dropped": 1}
    assert dumps_trace(trace) == dumps_trace(build_mooncake_sessions(tmp_path, num=None, source=path))


@pytest.mark.parametrize("row, field, words", [  # (the reader's every check: tests/workload/test_production_traces.py)
    ({"timestamp": 5, "output_length": 1, "hash_ids": [1]}, "input_length", "missing"),
    ({"timestamp": 5, "input_length": -3, "output_length": 1, "hash_ids": [1]}, "input_length", ">= 0"),
    ({"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}, "timestamp", "earlier"),
    ({"timestamp": 5, "input_length": 600, "output_length": 1, "hash_ids": [1]}, "hash_ids", "spans 2 blocks"),
    ({"timestamp": 5, "input_length": 10, "output_length": 1, "hash_ids": ["x"]}, "hash_ids", "integers"),
])
def test_malformed_mooncake_rows_name_the_line_and_field(tmp_path, row, field, words):
    path = tmp_path / "bad.jsonl"
    write_jsonl(path, [{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [0]}, row])
    with pytest.raises(SourceError) as caught:
        build_mooncake_sessions(tmp_path, source=path)
    message = str(caught.value)
    assert message.startswith(f"{path}: line 2: field '{field}'") and words in message


# -- agents -----------------------------------------------------------------------------------


def test_agent_sessions_follow_their_parameters():
    params = AgentParams(shared_context_tokens=300, task_tokens=(5, 9), tool_calls=(2, 4), call_tokens=(3, 6),
                         result_tokens=(10, 20), tool_latency_s=2.0, answer_tokens=(7, 8), session_rate=1.0)
    trace = build_agent_sessions(num=6, seed=3, params=params)
    again = build_agent_sessions(num=6, seed=3, params=params)
    assert dumps_trace(trace) == dumps_trace(again)
    sessions: dict = {}
    for r in trace.requests:
        sessions.setdefault(r.session_id, []).append(r)
    assert len(sessions) == 6
    shared = trace.requests[0].prompt_token_ids[:300]
    for turns in sessions.values():
        assert 2 <= len(turns) <= 4 and [r.turn for r in turns] == list(range(len(turns)))
        assert all(r.prompt_token_ids[:300] == shared for r in turns)  # one shared context everywhere
        assert 305 <= turns[0].prompt_len <= 309
        for before, after in zip(turns, turns[1:]):
            assert extends(after, before) and after.think_time >= 0
            assert 10 <= after.prompt_len - before.prompt_len - before.output_len <= 20  # a tool result
            assert 3 <= before.output_len <= 6  # a tool call
        assert 7 <= turns[-1].output_len <= 8  # the answer
    parse_trace(dumps_trace(trace))  # valid as written


# -- ShareGPT ---------------------------------------------------------------------------------

DATA = default_data_dir()


@pytest.mark.skipif(not (DATA / "tokenizers" / "opt").exists(), reason=f"OPT tokenizer not at {DATA}")
@pytest.mark.skipif(not os.environ.get("PAGESIM_SLOW_TESTS"), reason="reads ShareGPT and tokenizes (about 5 s); "
                    "set PAGESIM_SLOW_TESTS=1")
def test_sharegpt_sessions_extend_their_history():
    trace = build_sharegpt_sessions(DATA, num=8, max_context=2048, max_output=64)
    sessions: dict = {}
    for r in trace.requests:
        sessions.setdefault(r.session_id, []).append(r)
    assert trace.metadata["sessions"] == len(sessions) == 8
    for turns in sessions.values():
        for before, after in zip(turns, turns[1:]):
            assert extends(after, before)
        assert all(r.output_len <= 64 and r.prompt_len + r.output_len <= 2048 for r in turns)


REPO = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_committed_sharegpt_sessions_trace():
    trace = load_trace(REPO / "traces" / "sharegpt_sessions.json")  # the loader checks turn order
    meta = trace.metadata
    assert meta["command"] == "pagesim trace build sharegpt-sessions --num 50 --seed 0 --out traces/sharegpt_sessions.json"
    assert meta["sessions"] == 50 and meta["count"] == len(trace)
    by_session: dict = {}
    for r in trace.requests:
        by_session.setdefault(r.session_id, []).append(r)
    assert len(by_session) == 50
    for turns in by_session.values():
        assert turns[0].think_time is None and all(r.think_time == meta["think_time_s"] for r in turns[1:])
        for before, after in zip(turns, turns[1:]):
            assert extends(after, before)
    assert all(r.prompt_len + r.output_len <= 2048 and r.output_len <= 512 for r in trace.requests)


@pytest.mark.skipif(not (DATA / "tokenizers" / "opt").exists(), reason=f"OPT tokenizer not at {DATA}")
@pytest.mark.skipif(not os.environ.get("PAGESIM_SLOW_TESTS"), reason="tokenizes (about 5 s); set PAGESIM_SLOW_TESTS=1")
def test_sharegpt_sessions_rebuild_is_byte_identical(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from pagesim.cli import app

    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["trace", "build", "sharegpt-sessions", "--num", "50", "--out",
                                      "traces/sharegpt_sessions.json", "--data-dir", str(DATA)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "traces/sharegpt_sessions.json").read_bytes() == (REPO / "traces/sharegpt_sessions.json").read_bytes()
