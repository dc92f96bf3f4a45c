"""What a server streams back, trusted in nothing: every value a measurement uses is checked
(type, finite, non-negative, within what was asked for) before it is used, and a value that
cannot be a measurement fails that one request with a short, stable reason (ServerValueError),
never the run. Reasons name the field and the kind of problem, not the value or the server's
text at length, so that `failure_reasons` counts one line per kind of failure."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field

MAX_TOKEN_COUNT = 10**9  # a larger "token count" is not one (and would overflow float sums)
MAX_ERROR_BODY = 64 * 1024  # bytes of an error response read for its message
MAX_REASON_CHARS = 160


class ServerValueError(Exception):
    """A value the server sent that cannot be a measurement: fails that request with this reason."""


@dataclass
class Timing:
    """What the client saw of one request, in the client's clock (perf_counter seconds)."""

    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk carrying text
    finish: float | None = None
    prompt_tokens: int | None = None  # from the server's usage, when it sends one
    completion_tokens: int | None = None
    error: str | None = None
    output_token_ids: list[int] | None = None  # the first choice's generated ids, where the server returns them


def short(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """One line of printable text, at most `limit` characters: a server's message as a reason."""
    line = " ".join("".join(ch if ch.isprintable() else " " for ch in str(text)).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def kind_of(value) -> str:
    """How a bad value is named in a reason: its kind, not its digits (so reasons group)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return "a float"
    if isinstance(value, int):
        return "negative" if value < 0 else "an integer"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else "an object" if isinstance(value, dict) else type(value).__name__


def token_count(value, name: str) -> int:
    """value as a token count: an int (not a bool), 0 <= value <= MAX_TOKEN_COUNT."""
    if isinstance(value, int) and not isinstance(value, bool):
        if 0 <= value <= MAX_TOKEN_COUNT:
            return value
        raise ServerValueError(f"{name} is {'negative' if value < 0 else 'too large'}, not a token count")
    raise ServerValueError(f"{name} is {kind_of(value)}, not a token count")


def error_message(body: bytes) -> str:
    """The message of an error response: OpenAI's error.message, FastAPI's detail, or the text."""
    text = body.decode("utf-8", errors="replace")
    try:
        data = json.loads(text)
    except ValueError:
        return short(text) or "(empty body)"
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return short(error["message"])
        for candidate in (error, data.get("detail"), data.get("message")):
            if isinstance(candidate, str):
                return short(candidate)
    return short(text)


@dataclass
class Chunk:
    has_text: bool
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    has_usage: bool = False
    token_ids: list[int] | None = None  # the first choice's new ids (vLLM's return_token_ids), where sent


def parse_chunk(data: bytes, endpoint_type: str) -> Chunk:
    """One `data:` payload of a completions or chat stream."""
    try:
        chunk = json.loads(data)
    except ValueError:  # also UnicodeDecodeError
        raise ServerValueError("malformed stream: a data line is not JSON") from None
    if not isinstance(chunk, dict):
        raise ServerValueError(f"malformed stream: a chunk is {kind_of(chunk)}, not an object")
    if chunk.get("error") is not None:  # vLLM reports a failure mid-stream as an error chunk
        error = chunk["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ServerValueError(f"error in the stream: {short(message) if isinstance(message, str) else 'no message'}")
    choices = chunk.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list):
        raise ServerValueError(f"malformed chunk: choices is {kind_of(choices)}, not a list")
    has_text = False
    token_ids = None
    for choice in choices:
        if not isinstance(choice, dict):
            raise ServerValueError(f"malformed chunk: a choice is {kind_of(choice)}, not an object")
        if endpoint_type == "chat":
            delta = choice.get("delta")
            if delta is not None and not isinstance(delta, dict):
                raise ServerValueError(f"malformed chunk: choices[].delta is {kind_of(delta)}, not an object")
            text, name = (delta or {}).get("content"), "choices[].delta.content"
        else:
            text, name = choice.get("text"), "choices[].text"
        if text is not None and not isinstance(text, str):
            raise ServerValueError(f"malformed chunk: {name} is {kind_of(text)}, not a string")
        has_text = has_text or bool(text)
        ids = choice.get("token_ids")
        if ids is not None:
            if not isinstance(ids, list) or not all(type(t) is int and 0 <= t < MAX_TOKEN_COUNT for t in ids):
                raise ServerValueError("malformed chunk: choices[].token_ids is not a list of token ids")
            if choice.get("index", 0) == 0:
                token_ids = (token_ids or []) + ids
    usage = chunk.get("usage")
    if usage is None:  # OpenAI sends "usage": null on every chunk but the last
        return Chunk(has_text, token_ids=token_ids)
    if not isinstance(usage, dict):
        raise ServerValueError(f"malformed chunk: usage is {kind_of(usage)}, not an object")
    counts = {name: None if usage.get(name) is None else token_count(usage[name], f"usage.{name}")
              for name in ("prompt_tokens", "completion_tokens")}
    return Chunk(has_text, counts["prompt_tokens"], counts["completion_tokens"], has_usage=True, token_ids=token_ids)


def check_tokens(timing: Timing, max_tokens: int, n: int) -> None:
    """After a stream ended with [DONE]: it must have produced tokens, and no more than asked."""
    if timing.completion_tokens is None:
        produced = len(timing.chunk_times)  # no usage: count the text chunks
    else:
        produced = timing.completion_tokens
    if produced == 0:
        raise ServerValueError("no tokens: the stream ended without output")
    if timing.completion_tokens is not None and timing.completion_tokens > max_tokens * n:
        raise ServerValueError("usage.completion_tokens exceeds the max_tokens asked for")


def reason_group(reason: str) -> str:
    """A reason with its numbers (not an HTTP status) as N: requests that failed alike count as one line."""
    return re.sub(r"(?<!HTTP )(?<![\d.])\d+(\.\d+)?", "N", reason)


def failure_lines(reasons) -> dict[str, int]:
    """reason group -> count, most frequent first."""
    counts: dict[str, int] = {}
    for reason in reasons:
        group = reason_group(reason)
        counts[group] = counts.get(group, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def exception_reason(e: Exception) -> str:
    """A transport failure as a short reason (aiohttp's messages can quote the whole line read)."""
    import aiohttp
    from aiohttp.http_exceptions import LineTooLong

    if isinstance(e, LineTooLong) or (isinstance(e, ValueError) and "Chunk too big" in str(e)):
        return "malformed stream: a line too long to read"
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return "the server closed the connection"
    if isinstance(e, aiohttp.ClientPayloadError):
        return "broken response body"
    if isinstance(e, aiohttp.ClientConnectionError):
        return short(f"connection failed: {e}", 100)
    return short(f"{type(e).__name__}: {e}")


async def stream_one(client, url: str, payload: dict, timing: Timing, endpoint_type: str, clock,
                     headers: dict[str, str] | None = None) -> None:
    """Send one streamed request and read its answer into timing; a bad answer sets timing.error."""
    async with client.post(url, json=payload, headers=headers) as resp:
        if resp.status != 200:
            timing.error = f"HTTP {resp.status}: {error_message(await resp.content.read(MAX_ERROR_BODY))}"
            return
        async for raw in resp.content:  # one line at a time
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue  # blank separators, comments, event: lines
            data = line[5:].strip()
            if data == b"[DONE]":
                timing.finish = clock()
                break
            try:
                chunk = parse_chunk(data, endpoint_type)
            except ServerValueError as e:
                timing.error = str(e)
                return
            if chunk.has_usage:
                timing.prompt_tokens, timing.completion_tokens = chunk.prompt_tokens, chunk.completion_tokens
            if chunk.has_text:
                timing.chunk_times.append(clock())
            if chunk.token_ids is not None:
                timing.output_token_ids = (timing.output_token_ids or []) + chunk.token_ids
        else:
            timing.error = "the stream ended without [DONE]"
            return
    try:
        check_tokens(timing, payload.get("max_tokens") or payload["max_completion_tokens"], payload.get("n", 1))
    except ServerValueError as e:
        timing.error = str(e)
