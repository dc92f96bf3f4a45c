"""The relay's accounting, on a fake backend response: a stream whose client leaves after the end
marker is ok; one it leaves before is cancelled; a cut after the first chunk is an error event and
the end marker; each ends exactly once (the outstanding count goes back to 0 once)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from pagesim.cluster.routers import LoadBoard, RoutedRequest, make_router
from pagesim.route.backends import Backend
from pagesim.route.proxy import Proxy


class FakeContent:
    def __init__(self, chunks):
        self.chunks = list(chunks)

    async def readany(self) -> bytes:
        if not self.chunks:
            await asyncio.Event().wait()  # a backend that sends nothing more (and never ends)
        item = self.chunks.pop(0)
        if isinstance(item, Exception):
            raise item
        return item


class FakeResponse:
    def __init__(self, chunks):
        self.content, self.closed = FakeContent(chunks), False

    def close(self):
        self.closed = True


def relay(chunks, take: int):
    """Read `take` chunks of a relayed stream, then leave; returns (chunks read, outcomes, the
    outstanding count, whether the backend response was closed)."""
    proxy = Proxy([Backend(0, "http://127.0.0.1:1")], make_router("round-robin"), LoadBoard(1), session=None)
    proxy.board.route(proxy.router, RoutedRequest(0, 1), 0.0)
    resp = FakeResponse(chunks[1:])

    async def run():
        proxy._streaming.add((0, 0))
        stream = proxy._relay(resp, chunks[0], proxy.backends[0], 0)
        got = []
        async for chunk in stream:
            got.append(chunk)
            if len(got) == take:
                break
        await stream.aclose()
        proxy._end_stream(0, 0, "cancelled")  # what the response does when it ends: a no-op once ended
        return got

    got = asyncio.run(run())
    return got, proxy.outcomes, proxy.board.loads[0].outstanding, resp.closed


A, B, DONE = b'data: {"choices": [{"text": "a"}]}\n\n', b'data: {"choices": [{"text": "b"}]}\n\n', b"data: [DONE]\n\n"


def test_a_client_that_leaves_after_the_end_marker_is_answered():
    got, outcomes, outstanding, closed = relay([A, B, DONE], take=3)
    assert got == [A, B, DONE] and outcomes["ok"] == 1 and outcomes["cancelled"] == 0
    assert outstanding == 0 and closed


def test_a_client_that_leaves_before_it_is_cancelled_once():
    got, outcomes, outstanding, closed = relay([A, B, DONE], take=1)
    assert got == [A] and outcomes["cancelled"] == 1 and outcomes["ok"] == 0
    assert outstanding == 0 and closed


def error_then_done(chunk: bytes) -> dict:
    """The error of a relay's last chunk: one error event, then the end marker (as vLLM ends a
    failed stream; a client reading to `data: [DONE]` waited forever without it)."""
    event, done = chunk.split(b"\n\n", 1)
    assert done == DONE, chunk
    return json.loads(event.decode().removeprefix("data: "))["error"]


def test_a_cut_after_the_first_chunk_ends_with_an_error_event_and_the_end_marker():
    got, outcomes, outstanding, _ = relay([A, aiohttp.ClientPayloadError("cut")], take=5)
    assert got[0] == A and len(got) == 2 and outcomes["failed"] == 1
    error = error_then_done(got[1])
    assert "backend http://127.0.0.1:1 failed mid-stream" in error["message"] and "cut" in error["message"]
    assert outstanding == 0


def test_a_cut_after_the_end_marker_is_still_answered():
    got, outcomes, _, _ = relay([A, DONE, aiohttp.ClientPayloadError("late")], take=5)
    assert got == [A, DONE] and outcomes["ok"] == 1 and outcomes["failed"] == 0


def test_a_cut_inside_an_event_drops_its_half_and_the_error_event_is_whole():
    """A backend's chunk may end inside an event; cut there, the error event used to be appended to
    that half ('data: {"choi' + 'data: {"error": ...}'), a line no client can read (the openai client
    raised a JSONDecodeError instead of the backend's failure)."""
    got, outcomes, outstanding, _ = relay([A + B[:12], B[12:] + b'data: {"cho', aiohttp.ClientPayloadError("cut")],
                                          take=5)
    assert got[:2] == [A, B], "whole events go out as their ends arrive"
    assert len(got) == 3 and got[2].startswith(b"data: {")
    error = error_then_done(got[2])
    assert "failed mid-stream" in error["message"] and outcomes["failed"] == 1 and outstanding == 0
    split = [b"data: [DO", b"NE]\n\n"]  # and a stream split inside its end marker is whole and answered
    got, outcomes, _, _ = relay([A, *split, aiohttp.ClientPayloadError("late")], take=5)
    assert got == [A, DONE] and outcomes["ok"] == 1
