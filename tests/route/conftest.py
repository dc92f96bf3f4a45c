"""Three `pagesim serve` subprocesses on loopback ports (one set for the module), and `pagesim
route` subprocesses in front of them, driven by the official openai client."""

from __future__ import annotations

import contextlib
import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.serve.conftest import MODEL, ServerProcess, start, wait_healthy

STARTUP_S = 120.0


@pytest.fixture(scope="module")
def backends():
    """Three backends (started together: startup is the slow part), stopped at the module's end."""
    servers = [start(["serve", "--model", MODEL, "--port", "0", "--num-gpu-blocks", "128", "--num-cpu-blocks", "64",
                      "--log-level", "warning"]) for _ in range(3)]
    try:
        deadline = time.monotonic() + STARTUP_S
        for s in servers:
            wait_healthy(s, deadline)
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def running_router(backends: list[ServerProcess], tmp_path: Path, *args: str):
    """`pagesim route` over the backends, writing its decisions to tmp_path/decisions.jsonl."""
    router = start(["route", *[a for s in backends for a in ("--backend", s.base)], "--port", "0",
                    "--staleness", "0.2", "--decisions", str(tmp_path / "decisions.jsonl"), *args])
    try:
        wait_healthy(router, time.monotonic() + STARTUP_S)
        yield router
    finally:
        status, stderr = router.stop()
        assert "Traceback" not in stderr, stderr


def decisions(tmp_path: Path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "decisions.jsonl").read_text().splitlines()]


def finished_by_reason(server: ServerProcess, reason: str) -> int:
    """A backend's vllm:request_success_total for one finish reason."""
    text = httpx.get(f"{server.base}/metrics", timeout=10).text
    found = re.search(r'^vllm:request_success_total\{[^}]*finished_reason="%s"\} (\S+)$' % reason, text, re.M)
    return int(float(found[1])) if found else 0


def router_metric(router: ServerProcess, name: str, labels: str) -> float:
    text = httpx.get(f"{router.base}/metrics", timeout=10).text
    found = re.search(r"^%s\{%s\} (\S+)$" % (re.escape(name), re.escape(labels)), text, re.M)
    return float(found[1]) if found else 0.0
