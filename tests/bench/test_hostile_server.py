"""A server that lies to `pagesim bench`: every value it sends is checked, a bad one fails that
request with its reason (counted, one line per kind), the run always finishes and writes its
results, no NaN reaches summary.json, and the exit status says requests failed (issue 26)."""

from __future__ import annotations

import csv
import json

import pytest

from .conftest import LENGTHS, bench, strict_json
from .fake_server import MODEL, FakeServer, Script, honest_stream, sse

DONE = b"data: [DONE]\n\n"
EXIT_FAILED = 3


def bad_for_the_second_record(bad):
    """The second trace record's requests (prompt of 8 ids; 2 of 6 requests) get `bad`, raw SSE
    bytes; the others an honest answer. (Keyed by the request, not the order of arrival at the
    server, which concurrency may change.)"""
    def respond(payload, i):
        if len(payload["prompt"]) != LENGTHS[1][0]:
            return 200, honest_stream(payload)
        return 200, bad
    return respond


def usage_chunk(completion) -> bytes:
    # written by hand: json.dumps would refuse nothing, but the point is the raw text a server sends
    return b'data: {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": ' + completion + b"}}\n\n"


TEXT = sse({"choices": [{"index": 0, "text": "a"}]})


@pytest.mark.parametrize("value, reason", [
    (b"NaN", "usage.completion_tokens is NaN, not a token count"),
    (b"Infinity", "usage.completion_tokens is Infinity, not a token count"),
    (b"-600", "usage.completion_tokens is negative, not a token count"),
    (b'"12"', "usage.completion_tokens is a string, not a token count"),
    (b"3.5", "usage.completion_tokens is a float, not a token count"),
    (b"true", "usage.completion_tokens is a boolean, not a token count"),
    (b"1" + b"0" * 400, "usage.completion_tokens is too large, not a token count"),
])
def test_a_bad_usage_count_fails_that_request_only(small_trace, tmp_path, value, reason):
    with FakeServer(Script(respond=bad_for_the_second_record([TEXT, usage_chunk(value), DONE]))) as server:
        result, summary = bench(small_trace, server.base, "--num-requests", "6", out=tmp_path / "out")
    assert result.exit_code == EXIT_FAILED, result.output
    assert summary["num_requests"] == 6 and summary["num_finished"] == 4 and summary["num_failed"] == 2
    assert summary["failure_reasons"] == {f"failed: {reason}": 2}
    assert summary["total_output_tokens"] == 2 * (LENGTHS[0][1] + LENGTHS[2][1])  # only the honest answers counted
    assert f"2 x failed: {reason}" in result.output
    assert "the results were written" in result.output
    with open(tmp_path / "out" / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["status"] for r in rows] == ["finished", "rejected", "finished"] * 2
    assert all(int(r["output_len"]) >= 0 for r in rows)


def test_a_share_of_failures_can_be_allowed(small_trace, tmp_path):
    respond = bad_for_the_second_record([TEXT, usage_chunk(b"-1"), DONE])
    with FakeServer(Script(respond=respond)) as server:
        allowed, _ = bench(small_trace, server.base, "--num-requests", "6", "--max-failed-share", "0.34")
        refused, _ = bench(small_trace, server.base, "--num-requests", "6", "--max-failed-share", "0.33")
    assert allowed.exit_code == 0, allowed.output
    assert refused.exit_code == EXIT_FAILED and "more than --max-failed-share 0.33" in refused.output


@pytest.mark.parametrize("events, reason", [
    ([DONE], "no tokens: the stream ended without output"),
    ([sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0}}), DONE],
     "no tokens: the stream ended without output"),
    ([b"data: {not json\n\n", DONE], "malformed stream: a data line is not JSON"),
    ([b"data: [1, 2]\n\n", DONE], "malformed stream: a chunk is a list, not an object"),
    ([sse({"choices": {"text": "a"}}), DONE], "malformed chunk: choices is an object, not a list"),
    ([sse({"choices": ["a"]}), DONE], "malformed chunk: a choice is a string, not an object"),
    ([sse({"choices": [{"text": 7}]}), DONE], "malformed chunk: choices[].text is an integer, not a string"),
    ([sse({"choices": [{"text": "a"}], "usage": [1]}), DONE], "malformed chunk: usage is a list, not an object"),
    ([TEXT, TEXT], "the stream ended without [DONE]"),
    ([b"data: " + b"a" * (4 * 2**20) + b"\n\n", DONE], "malformed stream: a line too long to read"),
    ([sse({"error": {"message": "engine\nexploded " + "x" * 500}}), DONE], None),
    ([TEXT, sse({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 10_000}}), DONE],
     "usage.completion_tokens exceeds the max_tokens asked for"),
])
def test_a_malformed_stream_fails_that_request_with_its_reason(small_trace, events, reason):
    with FakeServer(Script(respond=bad_for_the_second_record(events))) as server:
        result, _ = bench(small_trace, server.base, "--num-requests", "6", "--json")
    assert result.exit_code == EXIT_FAILED, result.output
    summary = strict_json(result.stdout)
    assert summary["num_finished"] == 4 and summary["num_failed"] == 2
    [(line, count)] = summary["failure_reasons"].items()
    assert count == 2
    if reason is None:  # the server's message: one line, cut short, not its dump
        assert line.startswith("failed: error in the stream: engine exploded xxx") and line.endswith("...")
        assert "\n" not in line and len(line) < 200
    else:
        assert line == f"failed: {reason}"


def test_http_errors_are_one_counted_line_not_the_servers_dump(small_trace, tmp_path):
    dump = ("Traceback (most recent call last):\n" + "  File 'x.py', line 1\n" * 2000).encode()

    def respond(payload, i):
        if i % 2:
            return 500, [dump]
        return 400, [json.dumps({"error": {"message": f"bad request number {i} [/bold]"}}).encode()]

    with FakeServer(Script(respond=respond)) as server:
        result, summary = bench(small_trace, server.base, "--num-requests", "6", out=tmp_path / "out")
    assert result.exit_code == EXIT_FAILED, result.output
    assert summary["num_failed"] == 6 and summary["num_finished"] == 0 and summary["request_throughput"] == 0.0
    lines = summary["failure_reasons"]
    assert lines["failed: HTTP 400: bad request number N [/bold]"] == 3  # rich markup printed as text
    [(dump_line, count)] = [(k, v) for k, v in lines.items() if k.startswith("failed: HTTP 500")]
    assert count == 3 and len(dump_line) < 200 and dump_line.endswith("...")
    assert "3 x failed: HTTP 400: bad request number N [/bold]" in result.output


def test_hostile_metrics_are_left_out(small_trace, tmp_path):
    metrics = ("vllm:num_preemptions_total -Inf\n"
               "vllm:num_requests_running NaN\n"
               'vllm:kv_cache_usage_perc{model_name="a b}"} 7.5\n'  # a share above 1
               "pagesim:engine_steps_total +Inf\n"
               "vllm:num_requests_waiting 1e308\n"
               "garbage line without value\n")
    with FakeServer(Script(metrics=metrics)) as server:
        result, summary = bench(small_trace, server.base, "--num-requests", "3", out=tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert summary["num_finished"] == 3
    assert summary["num_preemptions"] is None and summary["num_steps"] is None
    assert summary["mean_batched_requests"] is None and summary["peak_kv_utilization"] is None


def test_a_counter_that_goes_down_is_no_count(small_trace):
    calls = []

    def falling():
        calls.append(1)
        return f"vllm:num_preemptions_total {max(0, 100 - 10 * len(calls))}\n"

    with FakeServer(Script(metrics=falling)) as server:
        result, _ = bench(small_trace, server.base, "--num-requests", "3", "--json")
    summary = strict_json(result.stdout)
    assert result.exit_code == 0 and summary["num_preemptions"] is None and len(calls) >= 2


@pytest.mark.parametrize("models", [b"[1, 2]", b'{"data": "nope"}', b"not json", b'{"data": [{"id": 5}]}'])
def test_an_odd_model_list_is_one_line_or_a_warning(small_trace, tmp_path, models):
    with FakeServer(Script(models=models)) as server:
        refused, _ = bench(small_trace, server.base, "--num-requests", "2")
        named, summary = bench(small_trace, server.base, "--num-requests", "2", "--model", MODEL, "--vocab-size", "50",
                               out=tmp_path / "o")
    assert refused.exit_code == 2, refused.output
    [line] = [x for x in refused.output.splitlines() if x.strip()]
    assert line.startswith("error: ") and ("--model" in line or "lists no model" in line)
    assert named.exit_code == 0, named.output
    assert summary["model"] == MODEL and summary["num_finished"] == 2 and summary["server_max_model_len"] is None


@pytest.mark.parametrize("field, value", [("max_model_len", "256"), ("max_model_len", -1), ("max_model_len", 1e400),
                                          ("vocab_size", True), ("vocab_size", [3])])
def test_a_bad_optional_model_field_is_ignored_with_a_warning(small_trace, field, value):
    entry = {"id": MODEL, "max_model_len": 4096, "vocab_size": 1000, field: value}
    raw = json.dumps({"data": [entry]}).encode()  # 1e400 is written as Infinity
    with FakeServer(Script(models=raw)) as server:
        result, _ = bench(small_trace, server.base, "--num-requests", "2", "--vocab-size", "50", "--json")
    assert result.exit_code == 0, result.output
    assert f"warning: /v1/models: {field} is" in result.output and "ignored" in result.output


def test_a_server_that_stalls_fails_by_the_timeout(small_trace):
    import time

    def stalled(payload, i):
        def events():
            yield TEXT
            time.sleep(3)  # past --timeout 1
            yield DONE
        return 200, events()

    with FakeServer(Script(respond=stalled)) as server:
        result, _ = bench(small_trace, server.base, "--num-requests", "2", "--timeout", "1", "--json")
    assert result.exit_code == EXIT_FAILED, result.output
    assert strict_json(result.stdout)["failure_reasons"] == {"failed: no complete answer within --timeout N s": 2}
