"""The connection-level defences of `pagesim serve` (issue 26) and its vLLM-like operation
(issue 27), against a server started with an API key and one-second deadlines: slow or huge
clients are cut off with OpenAI-shaped errors, the key is enforced, every request has an access
line and the engine a stats line, SIGTERM drains and exits 0, and a port or host that cannot be
listened on is one line and exit 2 before the model loads."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from .conftest import ROOT, cli_env, running_server
from .test_robustness import assert_openai_error

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY = {"prompt": [5, 6, 7, 8], "max_tokens": 3, "ignore_eos": True}


@pytest.fixture(scope="module")
def guarded():
    """The server and, once the module is done, its SIGTERM status and stderr."""
    with running_server("--api-key", KEY, "--header-timeout", "1", "--body-timeout", "1", "--max-body-mib", "1",
                        "--stats-interval", "1", "--log-level", "info", "--drain-timeout", "60", "--max-connections", "4") as s:
        yield s


def raw_exchange(port: int, data: bytes, wait: float = 15.0) -> tuple[float, bytes]:
    """Send data on a fresh connection and read until the server closes it: (seconds, bytes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as conn:
        start, received = time.monotonic(), b""
        try:
            conn.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - start, received  # it closed before reading all we sent
        try:
            while chunk := conn.recv(65536):
                received += chunk
        except TimeoutError:
            pytest.fail(f"the server held the connection for {wait} s: {received[:200]!r}")
        except ConnectionResetError:
            pass  # it closed with our bytes unread
        return time.monotonic() - start, received


def port_of(server) -> int:
    return int(server.base.rsplit(":", 1)[1])


def test_the_api_key_is_required_on_v1_only(guarded):
    missing = httpx.post(f"{guarded.base}/v1/completions", json=BODY, timeout=30)
    assert assert_openai_error(missing, 401, says="Authorization: Bearer")["code"] == "invalid_api_key"
    wrong = httpx.get(f"{guarded.base}/v1/models", headers={"Authorization": "Bearer nope"}, timeout=30)
    assert_openai_error(wrong, 401)
    ok = httpx.post(f"{guarded.base}/v1/completions", json=BODY, headers=AUTH, timeout=60)
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3
    assert httpx.get(f"{guarded.base}/health", timeout=10).status_code == 200  # probes need no key


def test_partial_headers_are_cut_off_at_the_header_deadline(guarded):
    seconds, answer = raw_exchange(port_of(guarded), b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
    assert 0.5 < seconds < 5, seconds
    assert answer.startswith(b"HTTP/1.1 408") and b'"error"' in answer, answer
    seconds, answer = raw_exchange(port_of(guarded), b"")  # a connection that says nothing
    assert seconds < 5 and answer == b""


def test_a_promised_body_that_never_comes_is_cut_off(guarded):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
    seconds, answer = raw_exchange(port_of(guarded), head)
    assert 0.5 < seconds < 5, seconds
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer, answer


def test_a_body_over_the_limit_is_refused_at_once(guarded):
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Length: 100000000\r\n\r\n")
    seconds, answer = raw_exchange(port_of(guarded), head)
    assert seconds < 5 and answer.startswith(b"HTTP/1.1 413") and b"at most 1048576" in answer, answer
    # the same without a Content-Length (chunked): counted as it arrives
    big = httpx.post(f"{guarded.base}/v1/completions", content=iter([b" " * 2**19] * 3), headers=AUTH, timeout=30)
    assert_openai_error(big, 413, says="exceeds 1048576 bytes")


def test_headers_over_the_limit_are_refused(guarded):
    # 1 MB: more than one read of the socket (asyncio reads up to 256 KiB), so h11 sees the
    # incomplete headers pass the 16 KiB limit
    seconds, answer = raw_exchange(port_of(guarded), b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 2**20 + b"\r\n\r\n")
    assert seconds < 5
    assert answer == b"" or answer.startswith(b"HTTP/1.1 400"), answer  # the reply may be lost to our unread bytes


def test_a_connection_over_the_limit_gets_503(guarded):
    held = [socket.create_connection(("127.0.0.1", port_of(guarded)), timeout=10) for _ in range(4)]
    try:
        time.sleep(0.2)  # the server has accepted them (well inside the 1 s header deadline)
        seconds, answer = raw_exchange(port_of(guarded), b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), answer
        assert json.loads(body)["error"]["code"] == "too_many_connections"
    finally:
        for conn in held:
            conn.close()
    time.sleep(0.3)
    assert httpx.get(f"{guarded.base}/health", timeout=10).status_code == 200  # room again


@pytest.mark.parametrize("data", [b"\x00\x01garbage\r\n\r\n",
                                  b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"])
def test_malformed_http_gets_an_openai_400(guarded, data):
    seconds, answer = raw_exchange(port_of(guarded), data)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and seconds < 5, answer
    assert "not valid HTTP/1.1" in json.loads(body)["error"]["message"]


def test_sigterm_drains_a_stream_exits_0_and_the_log_has_access_and_stats_lines(guarded):
    """Last in the module: stops the server. A stream in flight when SIGTERM comes runs to its end
    (drain), then the process exits 0 (uvicorn alone would end it by the signal)."""
    body = {"prompt": [7] * 10, "max_tokens": 200, "temperature": 0, "stream": True, "ignore_eos": True}
    first_chunk, lines = threading.Event(), []

    def client():
        try:
            with httpx.stream("POST", f"{guarded.base}/v1/completions", json=body, headers=AUTH, timeout=60) as resp:
                for line in resp.iter_lines():
                    lines.append(line)
                    first_chunk.set()
        finally:
            first_chunk.set()

    thread = threading.Thread(target=client)
    thread.start()
    assert first_chunk.wait(60)
    sent_before_the_signal = sum(line.startswith("data: {") for line in lines)
    status, stderr = guarded.stop(timeout=90, sig=signal.SIGTERM)
    thread.join(30)
    assert status == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "nanobind" not in stderr, stderr[-3000:]
    events = [line for line in lines if line]
    assert events[-1] == "data: [DONE]" and sum(e.startswith("data: {") for e in events) == 200, "drained to the end"
    assert sent_before_the_signal < 200, "the stream was still running when SIGTERM came"
    assert "Shutting down" in stderr
    access = [line for line in stderr.splitlines() if "pagesim.serve.access" in line]
    assert any('"POST /v1/completions" 200' in line and "completion 3 tokens" in line for line in access), access
    assert any('"POST /v1/completions" 401' in line for line in access), access
    stats = [line for line in stderr.splitlines() if "pagesim.serve.stats" in line]
    assert any("generation throughput" in line and "running" in line and "KV cache usage" in line
               for line in stats), stats


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pagesim.cli", "serve", "--model", "random:llama-tiny", *args],
                          cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=120)


def test_a_port_out_of_range_is_one_line_exit_2():
    done = run_cli("--port", "70000")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "--port" in done.stderr and "70000" in done.stderr


def test_a_port_in_use_is_one_line_exit_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("--port", str(port))
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert f"--port {port}" in done.stderr and "already in use" in done.stderr


def test_a_host_that_is_not_this_machine_is_one_line_exit_2():
    done = run_cli("--host", "no-such-host.invalid")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--host" in done.stderr, done.stderr
