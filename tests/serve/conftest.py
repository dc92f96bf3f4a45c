"""`pagesim serve` as a real subprocess on a free loopback port (one per test module)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:llama-tiny"


def cli_env() -> dict:
    # this checkout first, one torch thread (two shared cores: see tests/conftest.py)
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base: str = ""  # http://127.0.0.1:PORT, once the server said where it listens
    lines: list[str] = field(default_factory=list)  # its stderr so far (read by a thread: a full pipe would block it)
    listening: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self):
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1$", line.rstrip())
            if found and not self.base:
                self.base = found[1]
                self.listening.set()
        self.listening.set()

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def metrics(self) -> dict[str, float]:
        from pagesim.bench.scrape import parse_prometheus

        return parse_prometheus(httpx.get(f"{self.base}/metrics", timeout=10).text)

    def stop(self, timeout: float = 20.0, sig: int = signal.SIGINT) -> tuple[int, str]:
        """SIGINT (Ctrl-C) or SIGTERM, as a user or a supervisor stops it; returns (exit status,
        stderr). Once stopped, a second call returns the same."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._reader.join(10)
                return -9, self.stderr
        self._reader.join(10)
        return self.proc.returncode, self.stderr


@contextlib.contextmanager
def running_server(*extra: str, startup_s: float = 90.0):
    """`pagesim serve` on a free loopback port (--port 0: the server picks it and says which)."""
    proc = subprocess.Popen([sys.executable, "-m", "pagesim.cli", "serve", "--model", MODEL, "--port", "0",
                             "--num-gpu-blocks", "128", "--num-cpu-blocks", "64", *extra],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = ServerProcess(proc)
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                server.stop()
                pytest.fail(f"pagesim serve exited with {proc.returncode}: {server.stderr[-2000:]}")
            try:
                if server.base and httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"pagesim serve did not answer /health within {startup_s} s: {server.stderr[-2000:]}")
            time.sleep(0.2)
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
