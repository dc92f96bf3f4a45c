"""A fake OpenAI-compatible server on 127.0.0.1 for bench tests: it answers /v1/models, /metrics
and streamed completions (and chat completions) with whatever a test scripts, honest or hostile.
Plain http.server in a thread, so it shares no code with the client under test."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

MODEL = "fake-model"


def sse(obj) -> bytes:
    """One server-sent event line; obj may be bytes (sent as they are) or JSON-able."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return b"data: " + data + b"\n\n"


def honest_stream(payload: dict) -> list[bytes]:
    """What a correct server sends: one chunk per token, a usage chunk, [DONE]."""
    n = payload.get("n", 1)
    max_tokens = payload.get("max_tokens") or payload["max_completion_tokens"]
    chat = "messages" in payload
    events = []
    for _ in range(max_tokens):
        for i in range(n):
            choice = {"index": i, "delta": {"content": "x"}} if chat else {"index": i, "text": "x"}
            events.append(sse({"choices": [choice], "usage": None}))
    prompt = payload.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else 7
    events.append(sse({"choices": [], "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": max_tokens * n}}))
    events.append(b"data: [DONE]\n\n")
    return events


@dataclass
class Script:
    """What the server answers. respond(payload, call_number) -> (status, body chunks)."""

    models: object = field(default_factory=lambda: {"object": "list", "data": [
        {"id": MODEL, "object": "model", "max_model_len": 4096, "vocab_size": 1000}]})
    models_status: int = 200
    metrics: str | Callable[[], str] = "vllm:num_requests_running 1\nvllm:num_preemptions_total 0\n"
    respond: Callable[[dict, int], tuple[int, list[bytes]]] = lambda payload, i: (200, honest_stream(payload))


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a client that hung up (bench timed out): expected
        pass


class FakeServer:
    def __init__(self, script: Script | None = None, port: int = 0):
        self.script = script or Script()
        self.payloads: list[dict] = []  # every completion request received, in order of arrival
        self.paths: list[str] = []  # and the path each was sent to
        self.headers: list[dict[str, str]] = []  # and its headers (names in lower case)
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, status: int, chunks: list[bytes], content_type: str = "application/json"):
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in chunks:
                    self.wfile.write(chunk)
                    self.wfile.flush()

            def do_GET(self):
                if self.path == "/v1/models":
                    body = server.script.models
                    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
                    self._send(server.script.models_status, [raw])
                elif self.path == "/metrics":
                    metrics = server.script.metrics
                    self._send(200, [(metrics() if callable(metrics) else metrics).encode()], "text/plain")
                else:
                    self._send(404, [b'{"error": {"message": "not found"}}'])

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length))
                with server._lock:
                    server.payloads.append(payload)
                    server.paths.append(self.path)
                    server.headers.append({k.lower(): v for k, v in self.headers.items()})
                    number = len(server.payloads) - 1
                status, chunks = server.script.respond(payload, number)
                self._send(status, chunks, "text/event-stream" if status == 200 else "application/json")

        self.httpd = _QuietServer(("127.0.0.1", port), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)
