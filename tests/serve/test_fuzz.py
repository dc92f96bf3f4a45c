"""Hypothesis over request bodies against the live server (issue 26 item 8): whatever the body,
the answer is JSON (or a stream of JSON events), 2xx or 4xx with an OpenAI error body, never
5xx, and the server still answers /health afterwards.

Bodies mix the fields the server honours, with values of the right type near and past their
bounds (NaN, infinities, denormals, huge integers, out-of-vocabulary ids, content parts of
other types), values of any JSON type, unknown fields and raw bytes. Bounded: 100 bodies of small
prompts and outputs (a minute or two here)."""

from __future__ import annotations

import json
import string

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from .conftest import MODEL

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8)
EXTREME_FLOATS = st.sampled_from([0.0, -0.0, 1e-320, 5e-324, 1e-5, 0.5, 1.0, 2.0, 2.0000001, -1.0, 1e308,
                                  float("nan"), float("inf"), float("-inf")])
ASCII = st.text(alphabet=string.printable, max_size=40)
PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "input_audio", ""])},
                             optional={"text": ASCII | ANY_JSON, "image_url": ANY_JSON})
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | ANY_JSON},
    optional={"content": ASCII | st.lists(PART, max_size=3) | st.none() | ANY_JSON})

# Each field: values of its type near and past its bounds ("plausible"), or any JSON at all
PLAUSIBLE = {
    "model": st.sampled_from([MODEL, "no-such-model", ""]),
    "max_tokens": st.integers(-2, 24) | st.sampled_from([2**63, 10**30]),
    "temperature": EXTREME_FLOATS | st.floats(0, 2),
    "top_p": EXTREME_FLOATS | st.floats(0, 1),
    "top_k": st.integers(-3, 300),
    "n": st.integers(-1, 3),
    "seed": st.integers(-2**64, 2**64),
    "stop": ASCII | st.lists(st.text(max_size=3), max_size=40),
    "ignore_eos": st.booleans(),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({}, optional={"include_usage": st.booleans()}),
}
COMPLETION_FIELDS = {
    "prompt": ASCII | st.text(max_size=8) | st.lists(st.integers(-5, 200), max_size=30)
    | st.lists(ASCII, max_size=2) | st.lists(st.lists(st.integers(0, 127), max_size=20), max_size=2),
    "logprobs": st.integers(-2, 25) | st.booleans(),
}
CHAT_FIELDS = {
    "messages": st.lists(MESSAGE, max_size=3),
    "max_completion_tokens": st.integers(-2, 24),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(-2, 25),
}


def bodies(fields: dict, required: str) -> st.SearchStrategy:
    """Mostly plausible bodies (the required field present, each other field plausible), some
    where any field may hold any JSON value, and unknown fields."""
    plausible = st.fixed_dictionaries({required: fields[required]},
                                      optional={k: v for k, v in {**PLAUSIBLE, **fields}.items() if k != required})
    wild = st.fixed_dictionaries({}, optional={k: v | ANY_JSON for k, v in {**PLAUSIBLE, **fields}.items()}
                                 | {"unknown_field": ANY_JSON})
    return plausible | plausible | wild


REQUEST = (st.tuples(st.just("/v1/completions"), bodies(COMPLETION_FIELDS, "prompt"))
           | st.tuples(st.just("/v1/chat/completions"), bodies(CHAT_FIELDS, "messages"))
           | st.tuples(st.sampled_from(["/v1/completions", "/v1/chat/completions"]), st.binary(max_size=64)))


def check_answer(resp: httpx.Response, raw: str) -> None:
    assert resp.status_code < 500, f"{resp.status_code} for {raw[:300]}: {resp.text[:500]}"
    assert 200 <= resp.status_code < 300 or 400 <= resp.status_code < 500, resp.status_code
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"], error
    elif resp.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in resp.text.split("\n\n") if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", resp.text[-300:]
        for event in events[:-1]:
            assert "error" not in json.loads(event), event
    else:
        assert resp.json()["choices"], resp.text


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(request=REQUEST)
def test_any_body_gets_json_and_no_5xx(server, request):
    path, body = request
    raw = body if isinstance(body, bytes) else json.dumps(body)  # allow_nan: NaN / Infinity literals, as Python sends
    resp = httpx.post(f"{server.base}{path}", content=raw, headers={"content-type": "application/json"}, timeout=60)
    event(f"status {resp.status_code}")  # pytest --hypothesis-show-statistics: how many bodies were served
    check_answer(resp, raw if isinstance(raw, str) else repr(raw))


@pytest.fixture(autouse=True, scope="module")
def still_healthy_after(server):
    yield
    assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
    ok = httpx.post(f"{server.base}/v1/completions", json={"prompt": [5, 6], "max_tokens": 2, "ignore_eos": True},
                    timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
