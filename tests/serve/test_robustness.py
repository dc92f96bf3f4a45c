"""Requests that used to stop or confuse the server (issue 26, issue 27): each gets a 2xx or an
OpenAI-shaped 4xx, and the server goes on serving."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from .conftest import MODEL
from .test_openai_api import PROMPT, ids_of


def post(server, body, path="/v1/completions", **kwargs) -> httpx.Response:
    if isinstance(body, (bytes, str)):
        kwargs.update(content=body, headers={"content-type": "application/json"})
    else:
        kwargs.update(json=body)
    return httpx.post(f"{server.base}{path}", timeout=60, **kwargs)


def assert_openai_error(resp: httpx.Response, status: int, *, param=None, says: str = "") -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert error["message"] and error["type"] in ("invalid_request_error", "server_error")
    if param is not None:
        assert error["param"] == param, error
    assert says.lower() in error["message"].lower(), error
    return error


def finished_by_reason(server) -> dict[str, float]:
    found = {}
    for line in httpx.get(f"{server.base}/metrics", timeout=10).text.splitlines():
        match = re.match(r'vllm:request_success_total\{.*finished_reason="(\w+)"\} (\S+)$', line)
        if match:
            found[match[1]] = float(match[2])
    return found


def still_serving(server) -> None:
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    ok = post(server, {"prompt": PROMPT[:4], "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("field, value", [("temperature", 1e-320), ("temperature", 5e-324), ("temperature", 1e-9),
                                          ("top_p", 1e-320), ("top_p", 5e-324)])
def test_the_engine_killing_values_are_served_greedily(server, reference, field, value):
    """temperature below 1e-5 is greedy (vLLM's rule); a tiny top_p keeps the most likely token,
    which is greedy too. The reference is the in-process engine at temperature 0."""
    [expected] = reference(PROMPT, max_tokens=8, temperature=0.0, ignore_eos=True)
    resp = post(server, {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, field: value})
    assert resp.status_code == 200, resp.text
    assert ids_of(resp.json()["choices"][0]["text"]) == expected
    still_serving(server)


@pytest.mark.parametrize("raw, param", [
    ('{"prompt": "hi", "temperature": NaN}', "temperature"),
    ('{"prompt": "hi", "temperature": Infinity}', "temperature"),
    ('{"prompt": "hi", "top_p": NaN}', "top_p"),
    ('{"prompt": "hi", "temperature": 1e999}', "temperature"),  # JSON's way to say inf
])
def test_non_finite_sampling_values_are_said_as_such(server, raw, param):
    assert_openai_error(post(server, raw), 400, param=param, says="finite")
    still_serving(server)


@pytest.mark.parametrize("raw, says", [
    (b"hello", "not valid JSON"),
    (b"\xff\xfe{", "not valid JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"prompt": "hi", "max_tokens": ' + b"9" * 5000 + b"}", "digits"),
    (b'{"prompt": "hi", "seed": ' + b"9" * 5000 + b"}", "digits"),
    (b'["not", "an", "object"]', "valid dictionary"),
    (b"", "not valid JSON"),
    (b'{"prompt": "\\ud800", "max_tokens": 2}', "unpaired UTF-16 surrogate"),  # used to be a 500 (the tokenizer)
    (b'{"model": "\\udc80", "prompt": [5]}', "unpaired UTF-16 surrogate"),  # a 500 (the 404 quoting it)
    (b'{"prompt": "\xed\xa0\x80"}', "not UTF-8"),  # a surrogate's bytes
])
def test_malformed_bodies_get_openai_errors(server, raw, says):
    assert_openai_error(post(server, raw), 400, param="body", says=says)
    still_serving(server)


@pytest.mark.parametrize("method, path, status, says", [
    ("GET", "/v1/nothing", 404, "no route GET /v1/nothing"),
    ("POST", "/v2/completions", 404, "no route"),
    ("GET", "/v1/completions", 405, "GET is not allowed on /v1/completions"),
    ("POST", "/v1/models", 405, "allowed: GET"),
    ("DELETE", "/health", 405, "not allowed"),
])
def test_unknown_routes_and_methods_get_openai_errors(server, method, path, status, says):
    assert_openai_error(httpx.request(method, f"{server.base}{path}", timeout=30), status, says=says)


def test_health_answers_head_as_it_answers_get(server):
    """Load balancers, k8s httpGet probes and `curl -I` check health with HEAD (it was a 405)."""
    for method in ("HEAD", "GET"):
        resp = httpx.request(method, f"{server.base}/health", timeout=10)
        assert (resp.status_code, resp.content) == (200, b""), (method, resp.status_code, resp.text)


def test_an_unknown_model_is_404_and_an_absent_one_is_the_served_model(server, reference):
    error = assert_openai_error(post(server, {"model": "no-such-model", "prompt": "hi"}), 404, param="model")
    assert error["code"] == "model_not_found"
    [expected] = reference(PROMPT, max_tokens=4, temperature=0.0, ignore_eos=True)
    resp = post(server, {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
    assert resp.status_code == 200 and resp.json()["model"] == MODEL
    assert ids_of(resp.json()["choices"][0]["text"]) == expected


def test_chat_content_as_text_parts_is_the_joined_text(server, reference):
    """OpenAI's list form of content (what guidellm sends): the text parts joined with a newline,
    as vLLM does, so the prompt is the plain transcript of "first\\nsecond"."""
    parts = [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    body = {"messages": [{"role": "user", "content": parts}], "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    [expected] = reference(ids_of("user: first\nsecond\nassistant:"), max_tokens=6, temperature=0.0, ignore_eos=True)
    resp = post(server, body, "/v1/chat/completions")
    assert resp.status_code == 200, resp.text
    assert ids_of(resp.json()["choices"][0]["message"]["content"]) == expected
    image = {"messages": [{"role": "user", "content": [*parts, {"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert_openai_error(post(server, image, "/v1/chat/completions"), 400, param="messages",
                        says="messages[0].content[2] is of type 'image_url': this server takes text parts only")


def test_max_completion_tokens_wins_over_max_tokens_when_a_chat_sends_both(server):
    """OpenAI deprecated max_tokens for max_completion_tokens; vLLM's chat request takes
    `max_completion_tokens or max_tokens`, so a body with both generates the newer one's count."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "max_completion_tokens": 5,
            "temperature": 0, "ignore_eos": True}
    resp = post(server, body, "/v1/chat/completions")
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 5
    only_old = post(server, {**body, "max_completion_tokens": None}, "/v1/chat/completions")
    assert only_old.status_code == 200 and only_old.json()["usage"]["completion_tokens"] == 3


def test_too_many_stop_strings_are_refused(server):
    assert_openai_error(post(server, {"prompt": "hi", "stop": ["x"] * 33}), 400, param="stop")


def test_a_stop_string_counts_as_stop_in_the_metrics(server, reference):
    [expected] = reference(PROMPT, max_tokens=24, temperature=0.0, ignore_eos=True)
    text = bytes(expected).decode()
    stop = text[10:12]
    before = finished_by_reason(server)
    for stream in (False, True):
        body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stop": [stop], "stream": stream}
        resp = post(server, body)
        assert resp.status_code == 200
    after = finished_by_reason(server)

    assert after.get("stop", 0) - before.get("stop", 0) == 2
    assert after.get("abort", 0) == before.get("abort", 0)


def test_a_stream_is_valid_json_events_to_the_end(server):
    body = {"prompt": PROMPT[:5], "max_tokens": 3, "temperature": 1e-320, "stream": True, "n": 2}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert all("choices" in json.loads(e) for e in events[:-1])


def test_a_chat_that_fills_the_context_without_max_tokens_is_context_length_exceeded(server):
    """Chat's default max_tokens is the rest of the context; a prompt that leaves none used to be a
    500 ("max_tokens must be >= 1")."""
    max_model_len = httpx.get(f"{server.base}/v1/models", timeout=10).json()["data"][0]["max_model_len"]
    framing = len("user: \nassistant:")  # the plain transcript around the content
    for length in (max_model_len - framing, max_model_len + 50):  # exactly the context, and over it
        body = {"messages": [{"role": "user", "content": "a" * length}]}
        error = assert_openai_error(post(server, body, "/v1/chat/completions"), 400, param="max_tokens")
        assert error["code"] == "context_length_exceeded"
    body = {"messages": [{"role": "user", "content": "a" * (max_model_len - framing - 1)}], "ignore_eos": True}
    resp = post(server, body, "/v1/chat/completions")  # one token of room: one token
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 1, resp.text
    still_serving(server)
