"""The server through the official `openai` client, checked against LLMEngine.generate on the
same random weights (the reference: the executor driven in-process, no HTTP)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .conftest import MODEL


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=60)


def ids_of(text: str) -> list[int]:
    return list(text.encode())  # the byte-level tokenizer of a random: model, written out


PROMPT = [5 + (7 * i) % 100 for i in range(40)]  # 2.5 blocks of 16


def test_models_lists_the_served_model(client):
    [model] = client.models.list().data
    assert model.id == MODEL


def test_greedy_completion_equals_generate(client, reference):
    [expected] = reference(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0.0,
                                     extra_body={"ignore_eos": True}, logprobs=0)
    choice = resp.choices[0]
    assert ids_of(choice.text) == expected
    assert choice.finish_reason == "length"
    assert resp.usage.prompt_tokens == len(PROMPT) and resp.usage.completion_tokens == 24
    assert len(choice.logprobs.token_logprobs) == 24 and all(lp < 0 for lp in choice.logprobs.token_logprobs)
    # a second request with the same 32-token prefix reads it from the (SHA-256 keyed) prefix
    # cache and still gives the reference's tokens
    other = PROMPT[:32] + [9, 9, 9]
    [expected_other] = reference(other, max_tokens=8, temperature=0.0, ignore_eos=True)
    again = client.completions.create(model=MODEL, prompt=other, max_tokens=8, temperature=0.0,
                                      extra_body={"ignore_eos": True})
    assert ids_of(again.choices[0].text) == expected_other


def test_text_prompt_is_byte_tokenized(client, reference):
    [expected] = reference(ids_of("Hello, pagesim"), max_tokens=6, temperature=0.0, ignore_eos=True)
    resp = client.completions.create(model=MODEL, prompt="Hello, pagesim", max_tokens=6, temperature=0.0,
                                     extra_body={"ignore_eos": True})
    assert ids_of(resp.choices[0].text) == expected


def test_streaming_chunks_are_the_same_tokens(client, reference):
    [expected] = reference(PROMPT, max_tokens=12, temperature=0.0, ignore_eos=True)
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0.0, stream=True,
                                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert ids_of(text) == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and not any(finishes[:-1])
    assert len([c for c in chunks if c.choices]) == 12, "one chunk per token"
    assert chunks[-1].usage.completion_tokens == 12 and not chunks[-1].choices


def test_sse_wire_format(server):
    body = {"model": MODEL, "prompt": PROMPT[:5], "max_tokens": 3, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = "".join(resp.iter_text())
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[6:])["object"] == "text_completion"


def test_chat_uses_the_plain_transcript_for_a_model_without_template(client, reference):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    prompt = ids_of("system: be brief\nuser: hi\nassistant:")
    [expected] = reference(prompt, max_tokens=10, temperature=0.0, ignore_eos=True)
    resp = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0.0,
                                          extra_body={"ignore_eos": True})
    assert resp.choices[0].message.role == "assistant"
    assert ids_of(resp.choices[0].message.content) == expected
    assert resp.usage.prompt_tokens == len(prompt)
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0.0,
                                            stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert ids_of("".join(c.choices[0].delta.content or "" for c in chunks)) == expected
    assert chunks[-1].choices[0].finish_reason == "length"


def test_parallel_samples_equal_generate_with_the_same_seed(client, reference):
    expected = reference(PROMPT, n=3, max_tokens=8, temperature=0.8, top_p=0.9, seed=11, ignore_eos=True)
    resp = client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8, temperature=0.8, top_p=0.9,
                                     seed=11, extra_body={"ignore_eos": True})
    assert [ids_of(c.text) for c in sorted(resp.choices, key=lambda c: c.index)] == expected
    assert len({tuple(e) for e in expected}) > 1, "the samples differ (the check would be weak otherwise)"
    assert resp.usage.completion_tokens == 24
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, n=3, max_tokens=8, temperature=0.8,
                                            top_p=0.9, seed=11, stream=True, extra_body={"ignore_eos": True}))
    for i in range(3):
        assert ids_of("".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == i)) == expected[i]


def test_stop_string_cuts_the_output(client, reference):
    [expected] = reference(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    text = bytes(expected).decode()
    stop = text[10:12]
    cut = text[:text.find(stop)]
    for stream in (False, True):
        resp = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0.0, stop=[stop],
                                         stream=stream, extra_body={"ignore_eos": True})
        if stream:
            chunks = [c for c in resp if c.choices]
            got, reason = "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason
        else:
            got, reason = resp.choices[0].text, resp.choices[0].finish_reason
        assert (got, reason) == (cut, "stop")


@pytest.mark.parametrize("body, param", [
    ({"model": MODEL, "prompt": [5] * 250, "max_tokens": 64}, "max_tokens"),  # 314 > 256 tokens
    ({"model": MODEL, "prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "prompt": "hi", "max_tokens": "many"}, "max_tokens"),
    ({"model": MODEL, "prompt": "hi", "seed": 2**70}, "seed"),  # a torch generator would refuse it
    ({"model": MODEL, "prompt": [3, 500]}, "prompt"),  # outside the 128-token vocabulary
    ({"model": MODEL, "prompt": "h\u00e9"}, "prompt"),  # a byte the 128-token byte tokenizer lacks
    ({"model": MODEL}, "prompt"),
    ("{not json", "body"),
])
def test_bad_requests_get_400_and_the_server_keeps_serving(server, client, body, param):
    kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, str) else {"json": body}
    resp = httpx.post(f"{server.base}/v1/completions", timeout=30, **kwargs)
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]
    ok = client.completions.create(model=MODEL, prompt=PROMPT[:4], max_tokens=2, extra_body={"ignore_eos": True})
    assert ok.usage.completion_tokens == 2


def test_openai_client_raises_bad_request(client):
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=250)


def wait_until_idle(server, timeout: float = 20.0) -> dict:
    """The server's metrics once it runs nothing and holds no KV block."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = server.metrics()
        if metrics["pagesim:kv_blocks_used"] == 0 and metrics["vllm:num_requests_running"] == 0:
            return metrics
        assert time.monotonic() < deadline, f"blocks not freed after the client left: {metrics}"
        time.sleep(0.1)


def test_disconnect_mid_stream_frees_the_blocks(server):
    before = server.metrics()
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        for _ in range(6):  # a few tokens in
            next(lines)
        during = server.metrics()
    # leaving the block closed the connection after ~3 of 200 tokens
    assert during["vllm:num_requests_running"] == 1
    assert during["pagesim:kv_blocks_used"] >= 3  # 40 prompt tokens and more in blocks of 16
    after = wait_until_idle(server)
    ended = after.get("vllm:request_success_total", 0) - before.get("vllm:request_success_total", 0)
    assert ended == 1
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 200, "it stopped early"


def test_a_client_that_stops_waiting_for_a_whole_answer_frees_its_blocks(server):
    before = server.metrics()
    # 4 samples x 200 tokens: 200 steps, far longer than the client waits
    body = {"model": MODEL, "prompt": PROMPT, "n": 4, "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base}/v1/completions", json=body, timeout=httpx.Timeout(60, read=0.1))
    after = wait_until_idle(server)
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] < 800, "it stopped early"
