"""Request bodies and client disconnects, shared by `pagesim serve` and `pagesim route` (light to
import: no torch): the error an answer ends with (OpenAI's error fields), a body read as JSON
with one clear message for each way it can be wrong, and a wait that ends when the client leaves."""

from __future__ import annotations

import asyncio
import json
import re


class ApiError(Exception):
    """A request that ends without its answer: HTTP status, OpenAI error type, param and code."""

    status, kind = 400, "invalid_request_error"

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param, self.code = param, code


class BadRequest(ApiError):
    pass


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # how a UTF-16 surrogate can get into JSON text
_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_json(raw: bytes):
    """The body as JSON, or BadRequest saying what is wrong with it (a 100k-deep nesting, a
    5000-digit number, text that is not UTF-8, an unpaired surrogate such as "\\ud800" included)."""
    try:
        text = raw.decode("utf-8-sig")  # strict: the bytes of a surrogate are no UTF-8 (json.loads would pass them)
        data = json.loads(text)
    except RecursionError:
        raise BadRequest("body: the JSON is nested too deeply", "body") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"body: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})", "body") from None
    except UnicodeDecodeError:
        raise BadRequest("body: not valid JSON (not UTF-8 text)", "body") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts (4300)
        raise BadRequest(f"body: not valid JSON ({str(e).split(';')[0]})", "body") from None
    if _SURROGATE_ESCAPE.search(text) and _has_lone_surrogate(data):  # a paired escape is one character
        raise BadRequest("body: not valid JSON (a string holds an unpaired UTF-16 surrogate, \\ud800-\\udfff, "
                         "which is not a character)", "body")
    return data


def _has_lone_surrogate(data) -> bool:
    pending = [data]
    while pending:  # not recursive: the nesting is as deep as json.loads allowed
        item = pending.pop()
        if isinstance(item, str):
            if _SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            pending.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


GONE = object()  # until_disconnect's answer when the client left first


async def until_disconnect(request, awaitable):
    """awaitable's result, or GONE if the client (a starlette Request) disconnects first; the
    work is then cancelled, and waited for, so the caller may close what it was driving."""
    work = asyncio.ensure_future(awaitable)

    async def gone():
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(gone())
    await asyncio.wait((work, watcher), return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if work.done():
        return work.result()
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return GONE
