"""The server's pieces without a server: Prometheus text, the byte tokenizer, stop strings."""

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
    from pagesim.serve.app import SampleState, Server

    state = SampleState(text="abc<e")
    assert Server.streamable(state, ["<end>"]) == "abc"  # "<e" may begin "<end>"
    state.text = "abc<ex"
    assert Server.streamable(state, ["<end>"]) == "<ex"
    state.text = "abc<exy\ufffd"
    assert Server.streamable(state, ["<end>"]) == "y"  # half a UTF-8 character waits too


def test_a_dead_engine_thread_answers_503_and_health_500():
    from fastapi.testclient import TestClient

    from executor.engine import EngineConfig
    from executor.models.loader import load_model
    from pagesim.serve.app import create_app

    app = create_app(load_model("random:llama-tiny"), EngineConfig(num_gpu_blocks=32, num_cpu_blocks=8), "m")
    engine = app.state.server.engine

    def broken(clock):
        raise RuntimeError("device lost")

    engine.step = broken
    with TestClient(app) as client:
        assert client.get("/health").status_code == 200
        first = client.post("/v1/completions", json={"model": "m", "prompt": [5, 6, 7], "max_tokens": 2})
        assert first.status_code == 503 and "device lost" in first.json()["error"]["message"]
        assert client.get("/health").status_code == 500
        again = client.post("/v1/completions", json={"model": "m", "prompt": [5, 6, 7], "max_tokens": 2})
        assert again.status_code == 503


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
