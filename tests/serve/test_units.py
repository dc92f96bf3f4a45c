"""The server's pieces without a server: Prometheus text, the byte tokenizer, stop strings, the
stats line, content parts."""

from __future__ import annotations

import pytest

from pagesim.bench.scrape import parse_prometheus
from pagesim.serve.metrics import Histogram, ServerStats
from pagesim.serve.tokenizer import ByteTokenizer, PromptError


def test_histogram_buckets_are_cumulative():
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 3.0):
        h.observe(v)
    lines = h.lines("x", 'm="a"')
    assert lines[:3] == ['x_bucket{m="a",le="0.1"} 1', 'x_bucket{m="a",le="1.0"} 3', 'x_bucket{m="a",le="+Inf"} 4']
    assert parse_prometheus("\n".join(lines))["x_sum"] == pytest.approx(4.25)


def test_rendered_metrics_parse_back():
    stats = ServerStats("m", num_kv_blocks=200)
    stats.kv_blocks_used, stats.running, stats.preemptions = 50, 3, 2
    stats.on_arrival(10)
    stats.on_tokens(7)
    text = stats.render()
    values = parse_prometheus(text)
    assert values["vllm:kv_cache_usage_perc"] == 0.25 and values["vllm:num_requests_running"] == 3
    assert values["vllm:num_preemptions_total"] == 2 and values["vllm:prompt_tokens_total"] == 10
    assert values["vllm:generation_tokens_total"] == 7
    assert "# TYPE vllm:time_to_first_token_seconds histogram" in text


def test_byte_tokenizer_round_trips_and_refuses_bytes_outside_its_vocabulary():
    tok = ByteTokenizer(128)
    assert tok.encode("Hi!") == [72, 105, 33] and tok.decode([72, 105, 33]) == "Hi!"
    with pytest.raises(PromptError, match="byte 195"):
        tok.encode("\u00e9")  # UTF-8 c3 a9
    assert ByteTokenizer(256).decode(ByteTokenizer(256).encode("\u00e9")) == "\u00e9"


def test_streamed_text_holds_back_a_possible_stop_string():
    from pagesim.serve.generation import SampleState, Server

    state = SampleState(text="abc<e")
    assert Server.streamable(state, ["<end>"]) == "abc"  # "<e" may begin "<end>"
    state.text = "abc<ex"
    assert Server.streamable(state, ["<end>"]) == "<ex"
    state.text = "abc<exy\ufffd"
    assert Server.streamable(state, ["<end>"]) == "y"  # half a UTF-8 character waits too


def test_the_cli_and_the_bench_client_stay_light():
    """`pagesim --help` and `pagesim bench` never load torch, and the server's libraries load only
    inside `pagesim serve` (the client needs no GPU stack: it runs beside any server)."""
    import subprocess
    import sys

    from .conftest import ROOT, cli_env

    code = ("import sys, pagesim.cli, pagesim.bench.client, pagesim.bench.scrape; "
            "print(sorted({'torch', 'fastapi', 'uvicorn', 'transformers', 'executor'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_stats_line_gives_rates_over_the_interval():
    from pagesim.serve.stats_log import StatsSnapshot, stats_line

    before = StatsSnapshot(prompt_tokens=100, generation_tokens=50, running=0, waiting=0, swapped=0, kv_blocks_used=0,
                           kv_blocks_total=128, preemptions=1, finished=3)
    now = StatsSnapshot(prompt_tokens=160, generation_tokens=250, running=2, waiting=1, swapped=0, kv_blocks_used=32,
                        kv_blocks_total=128, preemptions=2, finished=5)
    line = stats_line(before, now, 4.0)
    # (160 - 100) / 4 = 15.0, (250 - 50) / 4 = 50.0, 32 / 128 = 25 %
    assert "prompt throughput 15.0 tokens/s" in line and "generation throughput 50.0 tokens/s" in line
    assert "running 2 reqs, waiting 1 reqs" in line and "KV cache usage 25.0% (32/128 blocks)" in line
    assert "finished 2 reqs, preemptions 1" in line
    idle = StatsSnapshot(160, 250, 0, 0, 0, 0, 128, 2, 5)
    assert stats_line(idle, idle, 4.0) is None, "an idle server is quiet"
    assert stats_line(now, idle, 4.0) is not None, "the interval that saw the last work is logged"


def test_content_parts_join_as_text_and_other_parts_are_named():
    from pagesim.serve.protocol import ChatMessage

    parts = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert parts.text(0) == "a\nb"  # vLLM joins text parts with a newline
    assert ChatMessage(role="assistant", content=None).text(0) == ""
    image = ChatMessage(role="user", content=[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}])
    with pytest.raises(ValueError, match=r"messages\[3\]\.content\[1\] is of type 'image_url'.*text parts only"):
        image.text(3)


def test_a_body_with_an_unpaired_surrogate_is_a_400_and_a_pair_is_its_character():
    """json.loads passes "\\ud800" (and the bytes ed a0 80) as a lone surrogate, which no
    tokenizer or response can encode: it used to be a 500 from the tokenizer, or from the 404 that
    quoted it as the model's name."""
    from pagesim.serve.bodies import BadRequest, parse_json

    for raw in (b'{"prompt": "\\ud800"}', b'{"messages": [{"role": "user", "content": [{"text": "a\\uDC80"}]}]}',
                b'{"model": "\\udbff", "prompt": [1]}', b'{"\\ud800": 1}'):
        with pytest.raises(BadRequest, match="unpaired UTF-16 surrogate"):
            parse_json(raw)
    with pytest.raises(BadRequest, match="not UTF-8"):
        parse_json(b'{"prompt": "\xed\xa0\x80"}')
    assert parse_json(b'{"prompt": "\\ud83d\\ude00 \\\\ud800"}') == {"prompt": "\U0001f600 \\ud800"}
    assert parse_json(b'\xef\xbb\xbf{"prompt": "a"}') == {"prompt": "a"}  # a UTF-8 byte order mark is still UTF-8


def test_a_chat_template_that_refuses_the_messages_is_a_prompt_error():
    """Templates raise on messages they do not take (Llama 2's and Mistral's raise_exception("Conversation
    roles must alternate ..."), a jinja2 TemplateError in transformers): a 400, not a 500. A template
    that does not parse stays the server's fault."""
    from jinja2 import TemplateError, TemplateSyntaxError

    from pagesim.serve.tokenizer import ServerTokenizer

    class Templated:  # what the server uses of an HF tokenizer with a chat template
        chat_template = "..."

        def __init__(self, error: Exception):
            self.error = error

        def apply_chat_template(self, messages, **kwargs):
            if messages[0]["role"] != "user":
                raise self.error
            return [1, 2]

    tok = ServerTokenizer(Templated(TemplateError("Conversation roles must alternate user/assistant")), "hf")
    assert tok.chat_prompt([{"role": "user", "content": "hi"}]) == [1, 2]
    with pytest.raises(PromptError, match="chat template refuses these messages: Conversation roles must alternate"):
        tok.chat_prompt([{"role": "assistant", "content": "hi"}])
    broken = ServerTokenizer(Templated(TemplateSyntaxError("unexpected '}'", 1)), "hf")
    with pytest.raises(TemplateSyntaxError):
        broken.chat_prompt([{"role": "assistant", "content": "hi"}])
