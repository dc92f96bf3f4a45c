"""What keeps a slow, huge or hostile client from holding the server: limits on the HTTP
connection (uvicorn's h11 protocol, extended) and on each request (an ASGI middleware), the API
key, and one access-log line per request.

uvicorn alone times out only idle keep-alive connections: a client that sends half its headers,
or promises a 100 MB body and sends nothing, holds a connection (and a task) forever. Here:
- the request line and headers must arrive within header_timeout_s of the connection opening
  (or of the previous response ending), at most max_header_bytes of them (h11's limit);
- the body must arrive within body_timeout_s, at most max_body_bytes (413 at once when
  Content-Length says more);
- at most max_connections connections are open at once; one more is answered 503 and closed.
Every refusal has an OpenAI error body, like the application's own errors."""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time

import h11
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from pagesim.serve.limits import HttpLimits
from pagesim.serve.protocol import error_body

access_log = logging.getLogger("pagesim.serve.access")


_REASONS = {400: "Bad Request", 401: "Unauthorized", 408: "Request Timeout", 413: "Content Too Large",
            503: "Service Unavailable"}


def _json_error(status: int, message: str, param: str | None = None, code: str | None = None) -> bytes:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return json.dumps(error_body(message, kind, param, code)).encode()


def raw_error_response(status: int, message: str, code: str | None = None) -> bytes:
    """A whole HTTP/1.1 error response that closes the connection, for refusals made before (or
    instead of) h11's request cycle."""
    body = _json_error(status, message, code=code)
    head = (f"HTTP/1.1 {status} {_REASONS[status]}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode() + body


async def http_error(request, exc: HTTPException) -> JSONResponse:
    """An unknown route (404) or method (405), and starlette's other HTTP errors, with an OpenAI
    error body (the exception handler of `pagesim serve` and `pagesim route`, which serve the same routes)."""
    if exc.status_code == 404:
        message = f"no route {request.method} {request.url.path}; this server has /v1/completions, " \
                  "/v1/chat/completions, /v1/models, /health and /metrics"
    elif exc.status_code == 405:
        # (sorted: starlette joins a route's methods from a set, whose order moves from run to run)
        allowed = ", ".join(sorted(m.strip() for m in (exc.headers or {}).get("Allow", "?").split(",")))
        message = f"{request.method} is not allowed on {request.url.path} (allowed: {allowed})"
    else:
        message = str(exc.detail)
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, kind), status_code=exc.status_code, headers=exc.headers)


def guarded_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """uvicorn's h11 protocol with a header deadline, a connection limit and OpenAI-shaped 400s;
    pass as uvicorn.Config(http=...)."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(503, f"the server has {limits.max_connections} connections open, its limit; retry later",
                             "too_many_connections")
                return
            self._arm_header_deadline()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_deadline()  # the next request on this connection gets its own deadline

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:  # h11 could not parse the request (or its headers are too big)
            self._disarm()
            if self.conn.their_state is h11.ERROR and len(self.conn.trailing_data[0]) >= limits.max_header_bytes:
                msg = f"the request line and headers exceed {limits.max_header_bytes} bytes"
            else:  # uvicorn's own text names nothing
                msg = "not valid HTTP/1.1 (its request line, headers or body framing)"
            self._refuse(400, f"invalid HTTP request: {msg}")

        def _arm_header_deadline(self) -> None:
            self._disarm()
            self._header_timer = self.loop.call_later(limits.header_timeout_s, self._header_deadline)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_deadline(self) -> None:
            self._header_timer = None
            between_requests = self.cycle is None or self.cycle.response_complete
            if not (between_requests and self.conn.their_state is h11.IDLE) or self.transport.is_closing():
                return  # the headers arrived: the body's deadline is the middleware's
            if self.conn.trailing_data[0]:  # part of a request came, not all of its headers
                self._refuse(408, f"the request line and headers did not arrive within {limits.header_timeout_s:g} s")
            else:
                self.transport.close()  # an idle connection: nothing to answer

        def _refuse(self, status: int, message: str, code: str | None = None) -> None:
            self.logger.warning("%s - %s", "%s:%d" % self.client if self.client else "-", message)
            self.transport.write(raw_error_response(status, message, code))
            self.transport.close()

    return GuardedH11Protocol


class ServeGuard:
    """ASGI middleware: API key, body size and deadline (the body is read here, whole, before the
    application sees the request), and the access log line once the response has ended."""

    def __init__(self, app, limits: HttpLimits, api_key: str | None = None):
        self.app, self.limits, self.api_key = app, limits, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        start = time.perf_counter()
        status = {"code": 0}

        async def sending(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        scope.setdefault("state", {})["usage"] = usage = {}  # the application fills in its token counts
        try:
            refusal = self._unauthorized(scope) or self._too_large(scope)
            if refusal is None:
                body = await self._read_body(receive)
                if isinstance(body, tuple):
                    refusal = body
                elif body is not None:
                    await self.app(scope, _replay(body, receive), sending)
                else:
                    status["code"] = 499  # the client left before its body arrived
            if refusal is not None:
                await _send_error(sending, *refusal)
        except Exception:
            status["code"] = status["code"] or 500  # a bug: the application's handler answers it, outside this middleware
            raise
        finally:
            self._log(scope, status["code"], time.perf_counter() - start, usage)

    def _unauthorized(self, scope) -> tuple | None:
        if self.api_key is None or not scope["path"].startswith("/v1/"):
            return None
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = given.partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), self.api_key.encode()):
            return None
        return 401, "a valid API key is required: send the header 'Authorization: Bearer KEY'", "invalid_api_key"

    def _too_large(self, scope) -> tuple | None:
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if length.isdigit() and int(length) > self.limits.max_body_bytes:
            return 413, f"the body is {int(length)} bytes; this server takes at most {self.limits.max_body_bytes}", None
        return None

    async def _read_body(self, receive) -> bytes | tuple | None:
        """The whole body; a refusal (status, message, code); or None if the client left."""
        chunks, size = [], 0
        deadline = time.monotonic() + self.limits.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                return 408, f"the request body did not arrive within {self.limits.body_timeout_s:g} s", None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limits.max_body_bytes:
                return 413, f"the body exceeds {self.limits.max_body_bytes} bytes, this server's limit", None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    @staticmethod
    def _log(scope, status: int, seconds: float, usage: dict) -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return
        client = "%s:%d" % tuple(scope["client"]) if scope.get("client") else "-"
        tokens = ""
        if usage:
            tokens = f" prompt {usage.get('prompt_tokens', 0)} tokens, completion {usage.get('completion_tokens', 0)} tokens"
            if usage.get("finish_reasons"):
                tokens += f", finish {','.join(usage['finish_reasons'])}"
        access_log.info('%s "%s %s" %d %.3f s%s', client, scope["method"], scope["path"], status, seconds, tokens)


def _replay(body: bytes, receive):
    """A receive() that gives the buffered body first, then the client's own messages (a
    disconnect, which the application watches for)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed():
        return pending.pop() if pending else await receive()

    return replayed


async def _send_error(send, status: int, message: str, code: str | None) -> None:
    body = _json_error(status, message, code=code)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status in (408, 413):  # the unread rest of the body makes the connection unusable
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})
