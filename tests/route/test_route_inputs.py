"""`pagesim route`'s bad input: one line naming the flag, exit 2, before it listens; and what the
router reads of a request body (its prompt, as token ids or text)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.cluster.routers import prefix_keys
from pagesim.route.backends import backend_url, gauges_of
from pagesim.route.prompts import routed_request
from pagesim.serve.bodies import BadRequest

GOOD = ["--backend", "http://127.0.0.1:9"]


@pytest.mark.parametrize("args, says", [
    (["--backend", "localhost:8000"], "--backend 'localhost:8000': not an http(s)://HOST:PORT address"),
    (["--backend", "http://127.0.0.1:99999"], "not an http(s)://HOST:PORT"),
    (["--backend", "http://127.0.0.1:9/v2"], "not an http(s)://HOST:PORT"),
    (GOOD + ["--backend", "http://127.0.0.1:9/v1/"], "--backend: the same backend is given twice"),
    (GOOD + ["--router", "fastest"], "unknown router 'fastest'; one of: cache-aware"),
    (GOOD + ["--router", "random", "--router-param", "sed=3"], "router 'random' has no parameter 'sed'"),
    (GOOD + ["--router", "power-of-two", "--router-param", "load=tokens"], "load must be one of outstanding"),
    (GOOD + ["--router", "prefix-affinity", "--router-param", "kv_weight=-1"], "kv_weight must be a finite number"),
    (GOOD + ["--router-param", "oops"], "--router-param 'oops': expected KEY=VALUE"),
    (GOOD + ["--staleness", "0"], "--staleness"),
    (GOOD + ["--port", "70000"], "--port"),
    (GOOD + ["--tokenizer", "/nonexistent/tok"], "--tokenizer /nonexistent/tok: not a directory"),
])
def test_bad_input_is_one_line_and_exit_2(args, says):
    result = CliRunner().invoke(app, ["route", *args])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert any(says in line for line in lines), result.output


def test_backend_urls_are_normalised():
    assert backend_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert backend_url(" https://gpu-3.example:443 ") == "https://gpu-3.example:443"


def test_the_prompt_a_body_is_routed_by():
    ids = list(range(40))
    req = routed_request({"prompt": ids}, False, 7, 16)
    assert (req.request_id, req.prompt_len, req.prefix_keys) == (7, 40, prefix_keys(ids))
    # a text prompt by characters; a batch by its first prompt
    assert routed_request({"prompt": "a" * 33}, False, 0, 16).prefix_keys == prefix_keys([ord("a")] * 33)
    assert routed_request({"prompt": [ids, [1, 2]]}, False, 0, 16).prefix_keys == prefix_keys(ids)
    # a chat: its roles and texts, joined (text parts of a list content included)
    chat = routed_request({"messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}, True, 0, 4)
    assert chat.prefix_keys == prefix_keys("system: be brief\nuser: hi", 4)
    # with a tokenizer, text is matched by its tokens
    class Upper:
        def encode(self, text):
            return [ord(c.upper()) for c in text]

    assert routed_request({"prompt": "ab" * 8}, False, 0, 16, Upper()).prefix_keys == prefix_keys("AB" * 8)
    assert routed_request({"prompt": [1]}, False, 0, 16, session_id="s1").session_id == "s1"
    for body, chat, says in [([1, 2], False, "body: must be a JSON object"),
                             ({"prompt": 5}, False, "prompt: must be a string"),
                             ({"prompt": [1, True]}, False, "prompt: must be a string"),
                             ({"messages": []}, True, "messages: a non-empty list")]:
        with pytest.raises(BadRequest, match=says):
            routed_request(body, chat, 0, 16)


@pytest.mark.parametrize("method, path, status, says", [
    ("GET", "/v1/nothing", 404, "no route GET /v1/nothing"),
    ("GET", "/v1/completions", 405, "GET is not allowed on /v1/completions (allowed: POST)"),
    ("DELETE", "/health", 405, "allowed: GET, HEAD"),  # (sorted: starlette's order moves from run to run)
])
def test_unknown_routes_and_methods_get_openai_errors(method, path, status, says):
    """As `pagesim serve` answers them (the router answered starlette's {"detail": "Not Found"})."""
    from fastapi.testclient import TestClient

    from pagesim.route.app import RouteConfig, create_app

    with TestClient(create_app(RouteConfig(backends=["http://127.0.0.1:9"]))) as client:  # nothing listens on 9
        resp = client.request(method, path)
        assert client.get("/health").status_code == 503  # no backend up: the router still answers
        assert client.head("/health").status_code == 503  # as health checkers probe it (it was a 405)
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert says in error["message"], error


def test_gauges_read_from_vllm_and_pagesim_names():
    g = gauges_of({"vllm:num_requests_waiting": 3, "vllm:num_requests_running": 5, "vllm:gpu_cache_usage_perc": 0.5})
    assert (g.waiting, g.running, g.kv_usage) == (3, 5, 0.5)
    assert gauges_of({"vllm:kv_cache_usage_perc": 7.0}).kv_usage == 1.0  # a share: clamped
    assert gauges_of({}).waiting == 0


def test_the_router_loads_no_torch():
    # it starts in a moment and runs beside servers on small machines: no model code in it
    import subprocess
    import sys

    from tests.serve.conftest import ROOT, cli_env

    check = "import sys, pagesim.route.app, pagesim.cli.route; print(sorted({'torch', 'executor'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", check], cwd=ROOT, env=cli_env(), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
