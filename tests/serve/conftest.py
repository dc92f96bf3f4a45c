"""`pagesim serve` as a real subprocess on a free loopback port (one per test module)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

import httpx
import pytest

from pagesim.bench import child
from pagesim.bench.child import ChildFailed, CliChild

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:llama-tiny"


def cli_env() -> dict:
    return child.cli_env(ROOT)


class ServerProcess(CliChild):
    def metrics(self) -> dict[str, float]:
        from pagesim.bench.scrape import parse_prometheus

        return parse_prometheus(httpx.get(f"{self.base}/metrics", timeout=10).text)


def start(args: list[str]) -> ServerProcess:
    """`pagesim ARGS` (serve or route) from this checkout."""
    return ServerProcess.start(args, ROOT)


def wait_healthy(server: ServerProcess, deadline: float) -> None:
    """The child's /health answers by the deadline, or the test fails with its stderr."""
    try:
        server.wait_healthy(deadline)
    except ChildFailed as failed:
        pytest.fail(str(failed))


@contextlib.contextmanager
def running_server(*extra: str, startup_s: float = 90.0):
    """`pagesim serve` on a free loopback port (--port 0: the server picks it and says which)."""
    server = start(["serve", "--model", MODEL, "--port", "0", "--num-gpu-blocks", "128", "--num-cpu-blocks", "64",
                    *extra])
    try:
        wait_healthy(server, time.monotonic() + startup_s)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="package")
def server():
    """One server for every test here; its teardown is the shutdown test: Ctrl-C with a stream
    still in flight must end the process with status 0 and no traceback, and end the stream."""
    with running_server("--prefix-caching") as s:
        yield s
        status, stderr, client_ended = stop_with_a_stream_in_flight(s)
        assert status == 0, stderr
        assert "Traceback" not in stderr, stderr
        assert client_ended, "the client's stream did not end when the server stopped"


def stop_with_a_stream_in_flight(server: ServerProcess) -> tuple[int, str, bool]:
    body = {"model": MODEL, "prompt": [7] * 20, "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
    started = threading.Event()

    def client():
        try:
            with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as resp:
                for _ in resp.iter_lines():
                    started.set()
        except httpx.HTTPError:
            pass  # the server may cut the stream while it shuts down
        finally:
            started.set()

    thread = threading.Thread(target=client)
    thread.start()
    assert started.wait(60)
    status, stderr = server.stop()
    thread.join(30)
    return status, stderr, not thread.is_alive()


@pytest.fixture(scope="package")
def reference():
    """generate(prompt ids, params) -> output token lists, on the model the server loaded."""
    from executor.engine import EngineConfig, LLMEngine
    from executor.models.loader import load_model
    from pagesim.core import SamplingParams

    lm = load_model(MODEL)

    def generate(prompt: list[int], **params) -> list[list[int]]:
        engine = LLMEngine(lm, EngineConfig(num_gpu_blocks=128, num_cpu_blocks=64))
        return engine.generate([prompt], SamplingParams(**params))[0].outputs

    return generate
