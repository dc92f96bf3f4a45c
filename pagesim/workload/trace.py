"""The trace file: what a workload is, on disk and in memory.

A trace is one JSON object:

    {"format": "pagesim-trace/1",
    "metadata": {...},
    "requests": [
    {"prompt_len":21,"output_len":518},
    ...
    ]}

`save_trace` writes one request per line with a fixed key order and fixed separators, and
metadata with sorted keys, so the same trace always gives the same bytes (rebuilds can be
compared with `cmp`, diffs stay readable). `load_trace` checks every record and raises
`TraceError` naming the file, the record index and the field; it never skips a record.
See docs/traces.md for the meaning of each field.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pagesim.inputs import (MAX_JSON_DEPTH, MAX_TOKEN_COUNT, TRACE_SECONDS, InputValueError, JsonConstant,
                            first_constant, json_depth_problem, json_path, loads_marking_long_ints, regular_file,
                            too_large)

FORMAT = "pagesim-trace/1"
# The small traces of the common cases, shipped in the wheel (in a checkout, links to traces/):
# `traces/sharegpt.json` and `traces/alpaca.json` work from any folder, pip install included.
PACKAGED_TRACES = Path(__file__).resolve().parent / "traces"

# Key order in the file. Required fields first; the long token list last so a line stays
# readable up to it.
REQUEST_FIELDS = (
    "prompt_len",
    "output_len",
    "arrival_time",
    "n",
    "beam_width",
    "prefix_group",
    "shared_prefix_len",
    "session_id",
    "turn",
    "think_time",
    "hash_ids",
    "prompt_token_ids",
)
REQUIRED_FIELDS = ("prompt_len", "output_len")
TOP_LEVEL_KEYS = ("format", "metadata", "requests")


class TraceError(ValueError):
    """A trace file (or an in-memory trace being saved) breaks the format.

    The message names the file and, where they apply, the JSON line/column, the record index
    and the field; the same facts are kept as attributes for callers and tests.
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        problem: str,
        *,
        index: int | None = None,
        field: str | None = None,
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        self.index = index
        self.field = field
        self.line = line
        self.column = column
        where = [self.path if self.path is not None else "<trace>"]
        if line is not None:
            where.append(f"line {line}, column {column}")
        if index is not None:
            where.append(f"request {index}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(": ".join(where) + ": " + problem)


@dataclass
class TraceRequest:
    """One request of a workload.

    Optional fields are None when absent from the file (and stay absent when saved), so a
    file round-trips exactly; consumers read None as the default (no arrival time given,
    n = 1, beam_width = 1, no prefix group).
    """

    prompt_len: int
    output_len: int
    arrival_time: float | None = None
    n: int | None = None
    beam_width: int | None = None
    prefix_group: int | str | None = None
    shared_prefix_len: int | None = None
    # a turn of a session (pagesim.workload.sessions; docs/traces.md): turn k + 1 is sent think_time
    # seconds after turn k ends (absent: the recorded gap between their arrival times)
    session_id: int | str | None = None
    turn: int | None = None
    think_time: float | None = None
    hash_ids: list[int] | None = None  # prefix-block hashes (metadata hash_block_tokens per block)
    prompt_token_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as written to the file: fixed key order, absent fields left out."""
        out: dict[str, Any] = {}
        for name in REQUEST_FIELDS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name in _ID_LISTS else value
        return out

    @property
    def num_seqs(self) -> int:
        """Sequences this request runs at once (beam width or n, whichever applies)."""
        return max(self.n or 1, self.beam_width or 1)


@dataclass
class Trace:
    metadata: dict[str, Any] = field(default_factory=dict)
    requests: list[TraceRequest] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def prompt_lens(self) -> list[int]:
        return [r.prompt_len for r in self.requests]

    @property
    def output_lens(self) -> list[int]:
        return [r.output_len for r in self.requests]


# ---------------------------------------------------------------------------------------------
# Validation (shared by load and save, so nothing invalid is ever written either)


def _is_int(value: Any) -> bool:
    # bool is a subclass of int in Python, but `true` is not a length.
    return isinstance(value, int) and not isinstance(value, bool)


_LENGTHS_ONLY = {"prompt_len", "output_len"}
_ID_LISTS = ("hash_ids", "prompt_token_ids")


def _first_bad_id(ids: list) -> int | None:
    """Position of the first element that is not an integer >= 0 (None: all are)."""
    # all plain ints >= 0 at C speed; otherwise find the first bad one to name it
    if ids and set(map(type, ids)) == {int} and min(ids) >= 0:
        return None
    return next((pos for pos, tok in enumerate(ids) if not _is_int(tok) or tok < 0), None)


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (an object is a dict here, and _Obj inside the loader)."""
    for kind, name in ((bool, "boolean"), (dict, "object"), (list, "array"), (str, "string"), (type(None), "null")):
        if isinstance(value, kind):
            return name
    return "number"


def _check_request(record: Any, index: int, path: str | None, hash_block_tokens: int | None = None) -> TraceRequest:
    # The common record, two positive plain ints and nothing else, is valid by sight; everything
    # else (including every invalid record) takes the full check below and its messages.
    if type(record) is _Obj and record.keys() == _LENGTHS_ONLY and not record.duplicate_keys:
        prompt_len, output_len = record["prompt_len"], record["output_len"]
        if type(prompt_len) is int and type(output_len) is int and 0 < prompt_len <= MAX_TOKEN_COUNT \
                and 0 < output_len <= MAX_TOKEN_COUNT:
            return TraceRequest(prompt_len, output_len)

    def fail(field_name: str | None, problem: str) -> TraceError:
        return TraceError(path, problem, index=index, field=field_name)

    if not isinstance(record, dict):
        raise fail(None, f"must be a JSON object, got {type(record).__name__}")
    duplicates = getattr(record, "duplicate_keys", ())
    if duplicates:
        raise fail(duplicates[0], "appears more than once in the record")
    for name in record:
        if name not in REQUEST_FIELDS:
            raise fail(name, f"unknown field name (allowed: {', '.join(REQUEST_FIELDS)})")
    for name in REQUIRED_FIELDS:
        if name not in record:
            raise fail(name, "missing (every request needs prompt_len and output_len)")
        value = record[name]
        if not _is_int(value):
            raise fail(name, f"must be an integer, got {json.dumps(value)}")
        if value <= 0:
            raise fail(name, f"must be > 0, got {value}")
        if value > MAX_TOKEN_COUNT:
            raise fail(name, too_large(value))
    prompt_len = record["prompt_len"]

    arrival = record.get("arrival_time")
    if arrival is not None:
        if not (_is_int(arrival) or isinstance(arrival, float)):
            raise fail("arrival_time", f"must be a number of seconds, got {json.dumps(arrival)}")
        problem = TRACE_SECONDS.problem(arrival)  # an integer of 10^309 is no float; Unix time is fine
        if problem:
            raise fail("arrival_time", problem)
        arrival = float(arrival)

    for name in ("n", "beam_width"):
        value = record.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise fail(name, f"must be an integer, got {json.dumps(value)}")
        if value < 1:
            raise fail(name, f"must be >= 1, got {value}")
        if value > MAX_TOKEN_COUNT:
            raise fail(name, too_large(value))
    n, beam_width = record.get("n"), record.get("beam_width")
    if beam_width is not None and beam_width > 1 and n is not None and n > beam_width:
        # Beam search returns at most beam_width sequences.
        raise fail("n", f"must be <= beam_width ({beam_width}) under beam search, got {n}")

    group = record.get("prefix_group")
    if group is not None:
        if not (_is_int(group) or isinstance(group, str)):
            raise fail("prefix_group", f"must be an integer or a string, got {json.dumps(group)}")
        if (_is_int(group) and group < 0) or group == "":
            raise fail("prefix_group", f"must be >= 0 or a non-empty string, got {json.dumps(group)}")

    shared = record.get("shared_prefix_len")
    if shared is not None:
        if not _is_int(shared):
            raise fail("shared_prefix_len", f"must be an integer, got {json.dumps(shared)}")
        if shared < 0 or shared > prompt_len:
            raise fail("shared_prefix_len", f"must be in [0, prompt_len={prompt_len}], got {shared}")
        if group is None:
            raise fail("shared_prefix_len", "given without a prefix_group to share with")

    session_id, turn, think = _check_session_fields(record, fail)

    ids = record.get("prompt_token_ids")
    if ids is not None:
        if not isinstance(ids, list):
            raise fail("prompt_token_ids", f"must be a list of token ids, got {type(ids).__name__}")
        if len(ids) != prompt_len:
            raise fail("prompt_token_ids", f"has {len(ids)} ids but prompt_len is {prompt_len}")
        pos = _first_bad_id(ids)
        if pos is not None:
            raise fail("prompt_token_ids", f"element {pos} is not a token id (integer >= 0): {json.dumps(ids[pos])}")

    hashes = record.get("hash_ids")
    if hashes is not None:
        if ids is not None:
            raise fail("hash_ids", "given with prompt_token_ids (a prompt is known by one or the other)")
        if not isinstance(hashes, list):
            raise fail("hash_ids", f"must be a list of block hash ids, got {type(hashes).__name__}")
        if hash_block_tokens is None:
            raise fail("hash_ids", "given, but the metadata has no hash_block_tokens (tokens per hashed block)")
        blocks = -(-prompt_len // hash_block_tokens)
        if len(hashes) != blocks:
            raise fail("hash_ids", f"has {len(hashes)} ids but prompt_len {prompt_len} spans {blocks} blocks of "
                       f"{hash_block_tokens} tokens")
        pos = _first_bad_id(hashes)
        if pos is not None:
            raise fail("hash_ids", f"element {pos} is not a hash id (integer >= 0): {json.dumps(hashes[pos])}")

    return TraceRequest(
        prompt_len=prompt_len,
        output_len=record["output_len"],
        arrival_time=arrival,
        n=n,
        beam_width=beam_width,
        prefix_group=group,
        shared_prefix_len=shared,
        session_id=session_id,
        turn=turn,
        think_time=think,
        hash_ids=None if hashes is None else list(hashes),
        prompt_token_ids=None if ids is None else list(ids),
    )


def _check_session_fields(record: dict, fail) -> tuple:
    """session_id, turn and think_time of one record (each checked alone; see _check_sessions)."""
    session_id, turn, think = record.get("session_id"), record.get("turn"), record.get("think_time")
    if session_id is not None:
        if not (_is_int(session_id) or isinstance(session_id, str)):
            raise fail("session_id", f"must be an integer or a string, got {json.dumps(session_id)}")
        if (_is_int(session_id) and session_id < 0) or session_id == "":
            raise fail("session_id", f"must be >= 0 or a non-empty string, got {json.dumps(session_id)}")
        if turn is None:
            raise fail("turn", "missing (a record with a session_id is a turn of it: 0, 1, ...)")
    if turn is not None:
        if session_id is None:
            raise fail("turn", "given without a session_id")
        if not _is_int(turn) or turn < 0:
            raise fail("turn", f"must be an integer >= 0, got {json.dumps(turn)}")
    if think is not None:
        if not (_is_int(think) or isinstance(think, float)) or not 0 <= think < 1e9:
            raise fail("think_time", f"must be a number of seconds in [0, 1e9), got {json.dumps(think)}")
        if turn is None or turn == 0:
            raise fail("think_time", "is the wait after the previous turn: only turns >= 1 have one")
        think = float(think)
    return session_id, turn, think


def _check_sessions(requests: list[TraceRequest], path: str | None) -> None:
    """A session's turns come in file order as 0, 1, 2, ... (what a turn's prompt holds is
    pagesim.workload.sessions' business: see docs/traces.md)."""
    last: dict = {}  # session_id -> (index, turn) of its latest turn
    for i, rec in enumerate(requests):
        if rec.session_id is None:
            continue
        previous = last.get(rec.session_id)
        expected = 0 if previous is None else previous[1] + 1
        if rec.turn != expected:
            raise TraceError(path, f"is {rec.turn}, but session {rec.session_id!r}'s next turn is {expected}"
                             + ("" if previous is None else f" (its turn {expected - 1} is request {previous[0]})"),
                             index=i, field="turn")
        last[rec.session_id] = (i, rec.turn)


def _check_arrival_order(requests: list[TraceRequest], path: str | None) -> None:
    """Arrival times are all given or all absent, and never go back in time."""
    given = [r.arrival_time is not None for r in requests]
    if any(given) and not all(given):
        index = given.index(False)
        raise TraceError(path, "missing, but other requests have one (give all or none)", index=index, field="arrival_time")
    if all(given):
        for i in range(1, len(requests)):
            if requests[i].arrival_time < requests[i - 1].arrival_time:
                raise TraceError(
                    path,
                    f"{requests[i].arrival_time} is earlier than request {i - 1}'s {requests[i - 1].arrival_time}"
                    " (requests must be in arrival order)",
                    index=i,
                    field="arrival_time",
                )


def _check_metadata(metadata: Any, path: str | None) -> int | None:
    """The metadata is an object; returns its hash_block_tokens (None when absent)."""
    if not isinstance(metadata, dict):
        raise TraceError(path, f"'metadata' must be a JSON object, got {_json_type(metadata)}", field="metadata")
    block = metadata.get("hash_block_tokens")
    if block is not None and not (_is_int(block) and block > 0):
        raise TraceError(path, f"must be an integer > 0, got {json.dumps(block)}", field="metadata.hash_block_tokens")
    return block


def _check_trace(metadata: Any, requests: list[TraceRequest], path: str | None) -> None:
    _check_metadata(metadata, path)
    if not requests:
        raise TraceError(path, "'requests' is empty", field="requests")
    count = metadata.get("count")
    if count is not None and not _is_int(count):
        raise TraceError(path, f"must be an integer, got {json.dumps(count)}", field="metadata.count")
    if count is not None and count != len(requests):
        raise TraceError(path, f"metadata count is {count} but the file has {len(requests)} requests", field="metadata.count")
    _check_arrival_order(requests, path)
    _check_sessions(requests, path)


# ---------------------------------------------------------------------------------------------
# Load / save


class _Obj(dict):
    """A JSON object that remembers keys given twice (json keeps only the last silently)."""

    duplicate_keys: tuple[str, ...] = ()


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict:
    obj = _Obj(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        obj.duplicate_keys = tuple(k for k, _ in pairs if k in seen or seen.add(k))
    return obj


def _constant_error(found: tuple[tuple, str], where: str | None) -> TraceError:
    """NaN or Infinity (json accepts them; they are not JSON, nor a length or a time), or an integer
    of more digits than Python converts, named by its request and field (a path below the field:
    'prompt_token_ids[3]'), or its top-level key."""
    keys, problem = found
    index = keys[1] if len(keys) > 1 and keys[0] == "requests" and isinstance(keys[1], int) else None
    below = keys[2:] if index is not None else keys
    return TraceError(where, problem, index=index, field=json_path(below) or None)


def parse_trace(text: str, path: str | os.PathLike | None = None) -> Trace:
    """Parse and validate trace text; `path` is only used in error messages."""
    where = None if path is None else str(path)
    try:
        doc, long_int = loads_marking_long_ints(text, object_pairs_hook=_object_pairs, parse_constant=JsonConstant)
    except json.JSONDecodeError as exc:
        raise TraceError(where, f"invalid JSON: {exc.msg}", line=exc.lineno, column=exc.colno) from None
    except RecursionError:
        raise TraceError(where, f"invalid JSON: nested more than {MAX_JSON_DEPTH} levels deep") from None
    too_deep = json_depth_problem(doc)  # walked without recursion, before anything recursive reads it
    if too_deep:
        raise TraceError(where, too_deep)
    # walked only where one may be
    found = first_constant(doc) if long_int or "NaN" in text or "Infinity" in text else None
    if found:
        raise _constant_error(found, where)
    if not isinstance(doc, dict):
        raise TraceError(where, f"the top level must be a JSON object, got {type(doc).__name__}")
    if getattr(doc, "duplicate_keys", ()):
        raise TraceError(where, "top-level key appears more than once", field=doc.duplicate_keys[0])
    for key in doc:
        if key not in TOP_LEVEL_KEYS:
            raise TraceError(where, f"unknown top-level key (allowed: {', '.join(TOP_LEVEL_KEYS)})", field=key)
    for key in TOP_LEVEL_KEYS:
        if key not in doc:
            raise TraceError(where, "missing top-level key", field=key)
    if doc["format"] != FORMAT:
        raise TraceError(where, f"expected {FORMAT!r}, got {json.dumps(doc['format'])}", field="format")
    records = doc["requests"]
    if not isinstance(records, list):
        raise TraceError(where, f"'requests' must be a JSON array, got {_json_type(records)}", field="requests")
    metadata = _plain(doc["metadata"], where)
    block = _check_metadata(metadata, where)
    requests = [_check_request(rec, i, where, block) for i, rec in enumerate(records)]
    _check_trace(metadata, requests, where)
    return Trace(metadata=metadata, requests=requests)


def _plain(value: Any, path: str | None) -> Any:
    """Turn the duplicate-tracking dicts back into plain ones (so Trace compares equal)."""
    if isinstance(value, dict):
        if getattr(value, "duplicate_keys", ()):
            raise TraceError(path, f"key {value.duplicate_keys[0]!r} appears more than once", field="metadata")
        return {k: _plain(v, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, path) for v in value]
    return value


def find_trace(path: str | os.PathLike) -> Path:
    """`path` itself, or, where it does not exist and is written `traces/NAME.json`, the copy of
    that trace pagesim ships (PACKAGED_TRACES), if there is one."""
    path = Path(path)
    if not path.exists() and len(path.parts) == 2 and path.parts[0] == "traces":
        packaged = PACKAGED_TRACES / path.name
        if packaged.is_file():
            return packaged
    return path


def load_trace(path: str | os.PathLike) -> Trace:
    """Read and validate a trace file; raises TraceError on anything malformed. `traces/NAME.json`
    falls back to the shipped copy (find_trace) where the folder has none."""
    path = find_trace(path)
    try:
        regular_file(path, "trace file")  # a FIFO would block the read forever
    except InputValueError as exc:
        raise TraceError(path, str(exc).removeprefix(f"{path}: ")) from None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TraceError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return parse_trace(text, path)


def dumps_trace(trace: Trace) -> str:
    """The canonical text of a trace (what save_trace writes)."""
    block = _check_metadata(trace.metadata, None)
    requests = [_check_request(r.to_dict(), i, None, block) for i, r in enumerate(trace.requests)]
    _check_trace(trace.metadata, requests, None)
    meta = json.dumps(trace.metadata, indent=2, sort_keys=True, ensure_ascii=True, allow_nan=False)
    lines = [json.dumps(r.to_dict(), separators=(",", ":"), ensure_ascii=True, allow_nan=False) for r in requests]
    return (
        "{" + f'"format": {json.dumps(FORMAT)},\n'
        + f'"metadata": {meta},\n'
        + '"requests": [\n'
        + ",\n".join(lines)
        + "\n]}\n"
    )


def save_trace(trace: Trace, path: str | os.PathLike) -> None:
    """Validate and write a trace; the same trace always gives the same bytes."""
    try:
        text = dumps_trace(trace)
    except TraceError as exc:
        raise TraceError(path, exc.problem, index=exc.index, field=exc.field) from None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write beside the target then rename, so an interrupted save never leaves half a trace.
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
