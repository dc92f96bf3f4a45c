"""`pagesim serve` as a real subprocess on a free loopback port (one per test module)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL = "random:llama-tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli_env() -> dict:
    # this checkout first, one torch thread (two shared cores: see tests/conftest.py)
    return dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    base: str  # http://127.0.0.1:PORT

    def metrics(self) -> dict[str, float]:
        from pagesim.bench.scrape import parse_prometheus

        return parse_prometheus(httpx.get(f"{self.base}/metrics", timeout=10).text)

    def stop(self, timeout: float = 20.0) -> tuple[int, str]:
        """SIGINT (Ctrl-C), as a user stops it; returns (exit status, stderr)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            return -9, err
        return self.proc.returncode, err


@contextlib.contextmanager
def running_server(*extra: str, startup_s: float = 90.0):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "pagesim.cli", "serve", "--model", MODEL, "--port", str(port),
                             "--num-gpu-blocks", "128", "--num-cpu-blocks", "64", *extra],
                            cwd=ROOT, env=cli_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    server = ServerProcess(proc, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                pytest.fail(f"pagesim serve exited with {proc.returncode}: {proc.stderr.read()[-2000:]}")
            try:
                if httpx.get(f"{server.base}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"pagesim serve did not answer /health within {startup_s} s")
            time.sleep(0.2)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server():
    with running_server("--prefix-caching") as s:
        yield s
