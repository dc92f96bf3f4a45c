"""Reading recorded files strictly: one error type, and field getters that name the file, the
record and the field of anything malformed (every reader uses these, so every format fails the
same way)."""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
import zlib
from pathlib import Path
from typing import Any

from pagesim.inputs import MAX_TOKEN_COUNT, too_large


class RealRunError(ValueError):
    """A recorded run that cannot be read: one line naming the file, the record and the field."""

    def __init__(self, path: str | os.PathLike | None, problem: str, *, record: int | str | None = None,
                 field: str | None = None) -> None:
        self.path = None if path is None else str(path)
        self.problem = problem
        self.record = record
        self.field = field
        where = [self.path or "<run>"]
        if record is not None:
            where.append(f"record {record}")
        if field is not None:
            where.append(f"field '{field}'")
        super().__init__(": ".join(where) + ": " + problem)


def _reject_constant(name: str) -> Any:
    # json accepts NaN and Infinity; no recorded time or count may be one
    raise ValueError(f"{name} is not valid JSON")


def read_text(path: Path) -> str:
    """A file's text, gunzipped when it is gzip (by content, not by name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RealRunError(path, f"cannot be read ({exc.strerror or exc})") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as exc:
            raise RealRunError(path, f"truncated or corrupt gzip ({exc})") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RealRunError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def parse_json(text: str, path: Path, record: int | str | None = None) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno}, column {exc.colno}" if record is None else f"column {exc.colno}"
        raise RealRunError(path, f"invalid JSON at {where}: {exc.msg} (truncated file?)", record=record) from None
    except ValueError as exc:  # NaN / Infinity
        raise RealRunError(path, f"invalid JSON: {exc}", record=record) from None
    except RecursionError:
        raise RealRunError(path, "invalid JSON: nested too deeply", record=record) from None


def read_json(path: Path) -> Any:
    return parse_json(read_text(path), path)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KINDS = {int: {int}, float: {int, float}, bool: {bool}}
_LARGEST = {int: MAX_TOKEN_COUNT, float: sys.float_info.max}  # (a float at most this is finite)


def plain_columns(records: list, names: tuple[str, ...], kinds: tuple[type, ...],
                  optional: tuple[str, ...] = ()) -> list[list] | None:
    """The named fields of every record as columns, when every record is an object whose fields
    are of their kinds (int; float for any number; bool), numbers finite and >= 0 (integers at
    most MAX_TOKEN_COUNT), and only the `optional` fields ever null: the fast path (checks at C
    speed) for a valid file. None otherwise: the caller then reads record by record with
    `Record`, whose checks name the record and the field that is wrong."""
    if not all(type(r) is dict for r in records):
        return None
    columns = []
    for name, kind in zip(names, kinds):
        column = [r.get(name) for r in records]
        allowed = _KINDS[kind] | ({type(None)} if name in optional else set())
        if not set(map(type, column)) <= allowed:
            return None
        if kind is not bool:
            numbers = [v for v in column if v is not None] if name in optional else column
            if numbers and not (min(numbers) >= 0 and max(numbers) <= _LARGEST[kind]):
                return None
        columns.append(column)
    return columns


class Record:
    """Typed access to one record (a dict) of a file, failing with the record's and field's name."""

    __slots__ = ("path", "record", "data", "text")

    def __init__(self, path: Path, record: int | str | None, data: Any, what: str = "a JSON object",
                 text: bool = False):
        """text=True: the values are CSV cells (text to convert); in JSON a quoted number is an error."""
        self.path = path
        self.record = record
        self.text = text
        if not isinstance(data, dict):
            raise RealRunError(path, f"must be {what}, got {type(data).__name__}", record=record)
        self.data = data

    def fail(self, name: str | None, problem: str) -> RealRunError:
        return RealRunError(self.path, problem, record=self.record, field=name)

    def has(self, name: str) -> bool:
        return self.data.get(name) is not None

    def _get(self, name: str, optional: bool) -> Any:
        value = self.data.get(name)
        if value is None and not optional:
            raise self.fail(name, "missing" if name not in self.data else "is null")
        return value

    def num(self, name: str, *, optional: bool = False, minimum: float | None = None,
            maximum: float | None = None) -> float | None:
        value = self._get(name, optional)
        if value is None:
            return None
        if self.text and isinstance(value, str):
            try:
                value = float(value) if value.strip() else None
            except ValueError:
                raise self.fail(name, f"must be a number, got {json.dumps(value)}") from None
            if value is None:
                if optional:
                    return None
                raise self.fail(name, "is empty")
        if not (_is_int(value) or isinstance(value, float)):
            raise self.fail(name, f"must be a number, got {json.dumps(value)}")
        if _is_int(value) and abs(value) > sys.float_info.max:  # (no float holds it: math.isfinite would raise)
            raise self.fail(name, f"must be finite, got an integer of {len(str(abs(value))):,} digits")
        if not math.isfinite(value):
            raise self.fail(name, f"must be finite, got {value}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be >= {minimum:g}, got {value}")
        if maximum is not None and value > maximum:
            raise self.fail(name, f"must be <= {maximum:g}, got {value}")
        return float(value)

    def int(self, name: str, *, optional: bool = False, minimum: int | None = None,
            maximum: int = MAX_TOKEN_COUNT) -> int | None:
        """maximum: by default the most a count may be (larger ones are no token count, and no
        4-byte column holds them)."""
        value = self._get(name, optional)
        if value is None:
            return None
        if self.text and isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise self.fail(name, f"must be an integer, got {json.dumps(value)}") from None
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not _is_int(value):
            raise self.fail(name, f"must be an integer, got {json.dumps(value)}")
        if minimum is not None and value < minimum:
            raise self.fail(name, f"must be >= {minimum}, got {value}")
        if value > maximum:
            raise self.fail(name, too_large(value, maximum))
        return value

    def bool(self, name: str, *, optional: bool = False) -> bool | None:
        value = self._get(name, optional)
        if value is None:
            return None
        if self.text and isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise self.fail(name, f"must be true or false, got {json.dumps(value)}")
        return value

    def str(self, name: str, *, optional: bool = False) -> str | None:
        value = self._get(name, optional)
        if value is None:
            return None
        if not isinstance(value, str):
            raise self.fail(name, f"must be a string, got {json.dumps(value)}")
        return value

    def list(self, name: str, *, optional: bool = False) -> list | None:
        value = self._get(name, optional)
        if value is None:
            return None
        if not isinstance(value, list):
            raise self.fail(name, f"must be a list, got {type(value).__name__}")
        return value

    def obj(self, name: str, *, optional: bool = False) -> "Record | None":
        value = self._get(name, optional)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.fail(name, f"must be an object, got {type(value).__name__}")
        return Record(self.path, self.record, value, text=self.text)


def find_model_config(start: Path, model: str | None) -> str | None:
    """A Hugging Face config.json for `model` (an id like "meta-llama/Llama-2-7b-hf") in a
    `model_configs/<name>/config.json` folder beside the run or up to four folders above it
    (the layout of ../shared/data/real_vllm); None when there is none."""
    if not model:
        return None
    name = model.rstrip("/").split("/")[-1]
    folder = start if start.is_dir() else start.parent
    for parent in [folder, *folder.parents][:5]:
        candidate = parent / "model_configs" / name / "config.json"
        if candidate.is_file():
            return str(candidate)
    return None
