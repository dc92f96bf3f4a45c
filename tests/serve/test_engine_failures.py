"""A failing engine step ends the requests in it, never the server (issue 26): the next request
is served and /health stays 200. An engine that keeps failing shuts the server down and the
process exits 1 with the reason, instead of lingering as a zombie that answers 503."""

from __future__ import annotations

import json
import threading

import httpx
import pytest
from fastapi.testclient import TestClient

from executor.engine import EngineConfig
from executor.models.loader import load_model
from pagesim.serve.engine_loop import MAX_FAILED_STEPS

BODY = {"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def lm():
    return load_model("random:llama-tiny")


def make_app(lm, **kwargs):
    from pagesim.serve.app import create_app

    return create_app(lm, EngineConfig(num_gpu_blocks=32, num_cpu_blocks=8), "m", stats_interval_s=0, **kwargs)


def wait_until_healthy(port: int, thread: threading.Thread) -> None:
    """Poll the in-process server's /health until it answers (30 s at most)."""
    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        thread.join(0.05)


def failing_steps(engine, how_many: int):
    """Make the engine's next `how_many` steps raise after scheduling (a forward or sampling
    failure: blocks are allocated, nothing is updated)."""
    real = engine.step
    left = {"n": how_many}

    def step(clock):
        if left["n"] > 0:
            left["n"] -= 1
            engine.scheduler.schedule(clock())  # the step got as far as its batch
            raise RuntimeError("sampling failed")
        return real(clock)

    engine.step = step


def test_a_failed_step_fails_its_request_and_the_next_one_is_served(lm):
    app = make_app(lm)
    engine = app.state.server.engine
    failing_steps(engine, 1)
    with TestClient(app) as client:
        failed = client.post("/v1/completions", json=BODY)
        assert failed.status_code == 500
        error = failed.json()["error"]
        assert error["type"] == "server_error" and "sampling failed" in error["message"]
        assert engine.scheduler.kv.num_used_blocks == 0, "the failed request's blocks were freed"
        ok = client.post("/v1/completions", json=BODY)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
        assert client.get("/health").status_code == 200


def test_a_failure_mid_stream_ends_the_stream_with_an_error_event(lm):
    app = make_app(lm)
    engine = app.state.server.engine
    real = engine.step
    calls = {"n": 0}

    def step(clock):  # the first step (prefill, first token) works, the second fails
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("forward failed")
        return real(clock)

    engine.step = step
    with TestClient(app) as client:
        with client.stream("POST", "/v1/completions", json={**BODY, "max_tokens": 5, "stream": True}) as resp:
            assert resp.status_code == 200
            events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "server_error" and "forward failed" in error["message"]
        assert any(json.loads(e).get("choices") for e in events[:-2]), "the first token went out before the failure"
        assert client.post("/v1/completions", json=BODY).status_code == 200


def test_an_engine_that_keeps_failing_is_declared_dead(lm):
    app = make_app(lm)
    server = app.state.server
    failing_steps(server.engine, 10**6)
    fatal = []
    server.loop.on_fatal = fatal.append
    with TestClient(app) as client:
        codes = [client.post("/v1/completions", json=BODY).status_code for _ in range(MAX_FAILED_STEPS)]
        assert codes == [500] * (MAX_FAILED_STEPS - 1) + [503]
        assert len(fatal) == 1 and "sampling failed" in str(fatal[0])
        health = client.get("/health")
        assert health.status_code == 500 and "sampling failed" in health.json()["error"]["message"]


def test_the_server_process_exits_1_when_the_engine_cannot_run(lm):
    """runner.serve, as `pagesim serve` calls it: the dead engine asks uvicorn to stop."""
    from pagesim.serve.limits import HttpLimits
    from pagesim.serve.runner import listen_socket, serve

    app = make_app(lm)
    failing_steps(app.state.server.engine, 10**6)
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=serve(app, sock, HttpLimits(drain_s=1), "warning")))
    thread.start()
    try:
        wait_until_healthy(port, thread)
        for _ in range(MAX_FAILED_STEPS):
            httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, timeout=30)
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop after the engine died"
        status, reason = result["out"]
        assert status == 1 and reason == "the engine failed: RuntimeError: sampling failed"
    finally:
        if thread.is_alive():  # never leave a server behind
            app.state.server.loop.on_fatal(RuntimeError("test teardown"))
            thread.join(10)
        sock.close()


MARK = 0.123  # the temperature of the request whose sampling is made to fail


@pytest.fixture
def sampling_fails_for_the_marked_request(monkeypatch):
    import executor.engine as engine_module

    real = engine_module.sample

    def sample(logits, params, generator, num=1):
        if params.temperature == MARK:
            raise ValueError("the model produced NaN or +inf logits")
        return real(logits, params, generator, num)

    monkeypatch.setattr(engine_module, "sample", sample)


def test_a_sampling_failure_fails_that_request_alone(lm, sampling_fails_for_the_marked_request):
    """Two requests in one batch: the marked one is aborted, the other gets exactly the tokens
    it gets alone (the reference: a separate engine without the marked request)."""
    from executor.engine import LLMEngine
    from pagesim.core import SamplingParams

    good = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    [expected] = LLMEngine(lm, EngineConfig(num_gpu_blocks=32, num_cpu_blocks=8)).generate([[5, 6, 7, 8]], good)
    engine = LLMEngine(lm, EngineConfig(num_gpu_blocks=32, num_cpu_blocks=8), isolate_failures=True)
    bad = engine.add_request([9, 10, 11], SamplingParams(max_tokens=6, temperature=MARK, ignore_eos=True), 0.0, 1)
    ok = engine.add_request([5, 6, 7, 8], good, 0.0, 2)
    first = engine.step(0.0)
    assert set(first.failed) == {1} and "NaN" in first.failed[1]
    assert {g.request_id for g in first.out.groups} == {1, 2}, "they were in one batch"
    assert bad.finished_seqs and not bad.seqs and bad not in engine.scheduler.running
    now = 1.0
    while engine.has_unfinished():
        assert not engine.step(now).failed
        now += 1.0
    assert ok.finished_seqs[0].output_token_ids == expected.outputs[0]
    assert engine.scheduler.kv.num_used_blocks == 0
    with pytest.raises(ValueError, match="NaN"):  # offline (the default), the error propagates
        LLMEngine(lm, EngineConfig(num_gpu_blocks=32, num_cpu_blocks=8)).generate(
            [[9, 10]], SamplingParams(max_tokens=2, temperature=MARK))


def test_the_server_answers_500_for_that_request_and_serves_the_next(lm, sampling_fails_for_the_marked_request):
    app = make_app(lm)
    with TestClient(app) as client:
        failed = client.post("/v1/completions", json={**BODY, "temperature": MARK})
        assert failed.status_code == 500
        assert "sampling failed: ValueError: the model produced NaN" in failed.json()["error"]["message"]
        assert client.post("/v1/completions", json=BODY).status_code == 200
        assert client.get("/health").status_code == 200
        assert app.state.server.engine.scheduler.kv.num_used_blocks == 0


def test_sampling_that_fails_for_everyone_is_a_dead_engine(lm, sampling_fails_for_the_marked_request):
    app = make_app(lm)
    fatal = []
    app.state.server.loop.on_fatal = fatal.append
    with TestClient(app) as client:
        codes = [client.post("/v1/completions", json={**BODY, "temperature": MARK}).status_code
                 for _ in range(MAX_FAILED_STEPS)]
        assert codes == [500] * (MAX_FAILED_STEPS - 1) + [503]
        assert len(fatal) == 1 and "sampling failed for every request of 3 steps" in str(fatal[0])
        assert client.get("/health").status_code == 500


def test_a_bug_is_a_500_that_closes_its_connection_and_every_request_has_its_status_logged(lm, caplog):
    """An unexpected exception is answered 500 by the catch-all handler, after which uvicorn closes
    the connection: the answer says `connection: close`, else a client's next request on it (a
    router's pooled connection) fails as if the server were down, and the router marks it down.
    The access line says 500, and 499 for a client gone before its body arrived (both said 0)."""
    import http.client
    import logging
    import socket

    from pagesim.serve.limits import HttpLimits
    from pagesim.serve.runner import listen_socket, serve

    caplog.set_level(logging.INFO, logger="pagesim.serve.access")
    app = make_app(lm)

    def bug(body):
        raise RuntimeError("a bug")

    app.state.server.prompt_ids = bug
    sock = listen_socket("127.0.0.1", 0)
    port = sock.getsockname()[1]
    thread = threading.Thread(target=serve, args=(app, sock, HttpLimits(drain_s=1), "warning"))
    thread.start()
    try:
        wait_until_healthy(port, thread)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("POST", "/v1/completions", json.dumps(BODY), {"content-type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 500 and resp.getheader("connection") == "close"
        assert json.loads(resp.read())["error"]["message"] == "internal error: RuntimeError: a bug"
        conn.close()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as gone:
            gone.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        for _ in range(200):  # its line comes once the server sees the connection closed
            if '"POST /v1/completions" 499' in caplog.text:
                break
            thread.join(0.05)
        access = [r.getMessage() for r in caplog.records if r.name == "pagesim.serve.access"]
        assert any('"POST /v1/completions" 500' in line for line in access), access
        assert any('"POST /v1/completions" 499' in line for line in access), access
        assert not any('" 0 ' in line for line in access), access
    finally:
        app.state.server.loop.on_fatal(RuntimeError("test teardown"))
        thread.join(10)
        sock.close()
