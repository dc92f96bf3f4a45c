"""One request through the router: decide (LoadBoard.route, logged), forward the body unchanged,
and pass the answer back. While nothing has reached the client, a backend that cannot be reached
or drops the connection is marked down and the request goes to another backend (a retry); once
part of a stream has been sent, a failure ends the stream with an error event that says why,
then the end marker (as vLLM ends a failed stream: clients read until `data: [DONE]`).
Every request ends exactly once: answered, failed with a reason, or cancelled by its client
(whose leaving closes the backend connection, which aborts the request there)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import time
from dataclasses import dataclass, field

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from pagesim.cluster.routers import LoadBoard, Router
from pagesim.route.backends import Backend, exception_reason
from pagesim.route.decisions import DecisionLog
from pagesim.route.prompts import routed_request
from pagesim.serve.bodies import GONE, ApiError, parse_json, until_disconnect
from pagesim.serve.protocol import error_body

FORWARDED_HEADERS = ("content-type", "authorization", "accept", "x-request-id")
DONE = b"data: [DONE]"  # the OpenAI stream's end marker


class NoBackend(ApiError):
    status, kind = 503, "server_error"


class BackendFailed(ApiError):
    status, kind = 502, "server_error"


class _Unreachable(Exception):
    """The backend could not be reached, or cut the connection before anything reached the client."""


@dataclass
class Proxy:
    backends: list[Backend]
    router: Router
    board: LoadBoard
    session: object  # an aiohttp.ClientSession
    block_size: int = 16
    tokenizer: object | None = None
    session_header: str = "x-session-id"
    timeout_s: float = 600.0
    log: DecisionLog = field(default_factory=lambda: DecisionLog(None))
    outcomes: dict[str, int] = field(default_factory=lambda: {"ok": 0, "failed": 0, "cancelled": 0, "rejected": 0})
    _ids: itertools.count = field(default_factory=itertools.count)
    _streaming: set[tuple[int, int]] = field(default_factory=set)  # (request, backend) streams not yet ended

    async def forward(self, request: Request, path: str, chat: bool) -> Response:
        raw = await request.body()
        data = parse_json(raw)
        routed = routed_request(data, chat, next(self._ids), self.block_size, self.tokenizer,
                                request.headers.get(self.session_header))
        stream = isinstance(data, dict) and data.get("stream") is True
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED_HEADERS}
        tried: list[int] = []
        for attempt in itertools.count():
            among = [b.index for b in self.backends if b.up and b.index not in tried]
            if not among:
                self.outcomes["failed" if tried else "rejected"] += 1
                raise (BackendFailed if tried else NoBackend)(self._why_none(tried))
            seen = [dataclasses.replace(r) for r in self.board.loads]
            index = self.board.route(self.router, routed, time.monotonic(), among=among)
            backend = self.backends[index]
            backend.routed += 1
            self.log.routed(routed, attempt, index, among, seen, request.headers.get("x-request-id"))
            try:
                return await self._send(request, backend, path, raw, headers, stream, routed.request_id)
            except _Unreachable as e:  # nothing reached the client: another backend may answer
                backend.failures += 1
                backend.down(self.board, str(e))
                tried.append(index)
                retry = any(b.up and b.index not in tried for b in self.backends)
                backend.retries += retry
                self._end(routed.request_id, index, "retried" if retry else "failed", final=False)
            except BaseException:  # the client left, or a bug: the request ends here
                self._end(routed.request_id, index, "cancelled")
                raise
        raise AssertionError("unreachable")

    def _why_none(self, tried: list[int]) -> str:
        downs = "; ".join(f"{b.url}: {b.reason or 'up'}" for b in self.backends)
        if tried:
            return f"every backend failed this request or is down ({downs})"
        return f"no backend is accepting requests ({downs})"

    def _end(self, request_id: int, index: int, outcome: str, final: bool = True) -> None:
        """An attempt ended (final: and with it the request)."""
        self.board.finished(self.router, request_id, index, time.monotonic())
        self.log.ended(request_id, index, outcome)
        if final:
            self.outcomes[outcome] += 1

    async def _send(self, request: Request, backend: Backend, path: str, raw: bytes, headers: dict, stream: bool,
                    request_id: int) -> Response:
        """The backend's answer as this router's response. _Unreachable while a retry is still
        possible; once the answer has begun, its end is logged here (or in the stream)."""
        import aiohttp

        url = f"{backend.url}{path}"
        try:
            resp = await until_disconnect(request, self.session.post(
                url, data=raw, headers=headers, timeout=aiohttp.ClientTimeout(total=self.timeout_s)))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise _Unreachable(f"{path} failed ({exception_reason(e)})") from None
        if resp is GONE:
            self._end(request_id, backend.index, "cancelled")
            return Response(status_code=499)
        kind = resp.headers.get("content-type", "application/json")
        if not stream or resp.status != 200:
            body = await until_disconnect(request, self._read_all(resp))
            if body is GONE:
                resp.close()
                self._end(request_id, backend.index, "cancelled")
                return Response(status_code=499)
            self._end(request_id, backend.index, "ok" if resp.status < 500 else "failed")
            return Response(body, status_code=resp.status, media_type=kind)
        first = await until_disconnect(request, self._first_chunk(resp))
        if first is GONE:
            resp.close()
            self._end(request_id, backend.index, "cancelled")
            return Response(status_code=499)
        self._streaming.add((request_id, backend.index))
        return _Relayed(self._relay(resp, first, backend, request_id), resp,
                        lambda: self._end_stream(request_id, backend.index, "cancelled"), media_type=kind)

    def _end_stream(self, request_id: int, index: int, outcome: str) -> None:
        """A relayed stream ended: once, by whichever of the relay and the response sees it first."""
        if (request_id, index) in self._streaming:
            self._streaming.discard((request_id, index))
            self._end(request_id, index, outcome)

    @staticmethod
    async def _read_all(resp) -> bytes:
        import aiohttp

        try:
            return await resp.read()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            resp.close()
            raise _Unreachable(f"the answer was cut ({exception_reason(e)})") from None

    @staticmethod
    async def _first_chunk(resp) -> bytes:
        import aiohttp

        try:
            chunk = await resp.content.readany()
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            resp.close()
            raise _Unreachable(f"the stream was cut before its first chunk ({exception_reason(e)})") from None
        if not chunk:
            resp.close()
            raise _Unreachable("the stream ended before its first chunk")
        return chunk

    async def _relay(self, resp, first: bytes, backend: Backend, request_id: int):
        """The stream, chunk by chunk as the backend sends them (whole events: the part of an event
        a chunk ends in waits for the rest). A cut after the first chunk ends it with an error event
        and the end marker (the client has part of an answer: it cannot be retried)."""
        import aiohttp

        outcome = "cancelled"  # the client left (this generator is closed or cancelled)
        previous, chunk = b"", first
        held = b""  # the start of an event not yet whole: it goes out with the chunk that ends it
        try:
            while True:
                # the end marker makes the answer whole: its client may leave before the backend's EOF
                if DONE in previous[-len(DONE):] + chunk:
                    outcome = "ok"
                whole, held = _whole_events(held + chunk)
                if whole:
                    yield whole
                previous = chunk
                try:
                    chunk = await resp.content.readany()
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                    if outcome == "ok":
                        return
                    outcome = "failed"
                    backend.failures += 1
                    message = f"backend {backend.url} failed mid-stream ({exception_reason(e)})"
                    # a half event held back is dropped: the error event is the client's next line
                    yield f"data: {json.dumps(error_body(message, 'server_error'))}\n\n".encode() + DONE + b"\n\n"
                    return
                if not chunk:
                    outcome = "ok"
                    if held:
                        yield held
                    return
        finally:
            resp.close()  # closing the connection aborts the request on a backend still running it
            self._end_stream(request_id, backend.index, outcome)


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """data cut after its last whole server-sent event (one that a blank line ends), and the rest."""
    ends = [at + len(blank) for blank in (b"\n\n", b"\r\r", b"\r\n\r\n") if (at := data.rfind(blank)) >= 0]
    cut = max(ends, default=0)
    return data[:cut], data[cut:]


class _Relayed(StreamingResponse):
    """A relayed stream whose backend response is closed, and whose request is ended, however
    the response ends (a generator cancelled before its first step never runs its finally)."""

    def __init__(self, chunks, upstream, on_close, media_type: str):
        super().__init__(chunks, status_code=200, media_type=media_type)
        self._upstream, self._on_close = upstream, on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # the relay ends with its own outcome if it started
            self._upstream.close()
            self._on_close()  # else: cancelled
