"""The one rule for numbers and input files, used by the CLI's flags and by every loader.

Numbers. A float that pagesim accepts, from a flag or from a field of a file, is finite, inside
its range, and either 0 (where 0 is allowed) or at least `tiny` away from it: the simulator keeps
time in float seconds, so a rate of 1e-300 req/s puts arrivals where the clock can no longer add
a step's milliseconds, and a denormal gamma shape turns every arrival time into NaN. Each quantity
has one named rule below (RATE, SECONDS, ...); the CLI builds its flag parsers from the same
objects (pagesim.cli.checks), so a flag and a file field meaning the same thing are checked alike.
Integers that size memory or hardware (tensor-parallel degree, requests, blocks) are bounded too.

Files. An input file must be a regular file (a FIFO or a device would block the read forever),
and a JSON input is refused past MAX_JSON_DEPTH levels of nesting (Python's parser and every
recursive walk over the document would end in a RecursionError): `read_json` does both.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from dataclasses import dataclass
from itertools import chain, compress, repeat
from pathlib import Path
from typing import Any, Iterator

MIN_MAGNITUDE = 1e-9  # a non-zero float closer to 0 than this is refused unless its rule says otherwise
MAX_MAGNITUDE = 1e12  # the bound of a float that has no narrower range of its own
MAX_SIM_SECONDS = 1e9  # about 32 years: a float clock there still resolves 1e-7 s
MAX_TRACE_SECONDS = 1e11  # a trace may be stamped in Unix time (1.7e9 s today); the drivers count from its start
MAX_TP = 1024  # GPUs in one tensor-parallel group, at most: the largest NVLink domains (NVL576) are below it
MAX_REQUESTS = 1_000_000  # a bigger run is a typo or an unbounded --duration, not a simulation anyone waits for
MAX_SAMPLES = 1024  # parallel samples or beam width of one request
MAX_BLOCKS = 16_000_000  # KV blocks in a pool (the simulator's MAX_POOL_BLOCKS)
MAX_JSON_DEPTH = 64  # nesting levels of a JSON input; pagesim's own files use at most 6


class InputValueError(ValueError):
    """A number or file that breaks its rule, said in one line naming it."""


@dataclass(frozen=True)
class NumberRule:
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    tiny: float = MIN_MAGNITUDE  # floats only: a non-zero |x| below this is refused
    why: str = ""  # said after the range when a value breaks it

    def describe(self) -> str:
        kind = "an integer" if self.integer else "a finite number"
        lo, hi = self.lo, self.hi
        if not self.integer and hi is None:
            hi = MAX_MAGNITUDE
        if not self.integer and lo is None:
            lo = -MAX_MAGNITUDE
        f = (lambda v: f"{v:,}") if self.integer else (lambda v: f"{v:g}")
        if lo is not None and hi is not None:
            text = f"{kind} in {'(' if self.lo_open else '['}{f(lo)}, {f(hi)}{')' if self.hi_open else ']'}"
        elif lo is not None:
            text = f"{kind} {'>' if self.lo_open else '>='} {f(lo)}"
        elif hi is not None:
            text = f"{kind} {'<' if self.hi_open else '<='} {f(hi)}"
        else:
            text = kind
        if not self.integer and self.tiny > 0 and (self.lo is None or self.lo < self.tiny):
            text += f", 0 or at least {self.tiny:g} in size" if self._zero_ok() else f", at least {self.tiny:g} in size"
        return text + (f" ({self.why})" if self.why else "")

    def _zero_ok(self) -> bool:
        return (self.lo is None or self.lo < 0 or (self.lo == 0 and not self.lo_open)) and \
            (self.hi is None or self.hi > 0 or (self.hi == 0 and not self.hi_open))

    def problem(self, x: Any) -> str | None:
        """Why x breaks the rule (one clause, "must be ..., got ..."), or None."""
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (self.integer and not isinstance(x, int)):
            return f"must be {self.describe()}, got {_shown(x)}"
        if not self._ok(x):
            return f"must be {self.describe()}, got {_shown(x)}"
        return None

    def _ok(self, x: int | float) -> bool:
        if not self.integer:
            try:
                x = float(x)  # an integer of 10^309 digits is not a float
            except OverflowError:
                return False
            if not math.isfinite(x) or abs(x) > MAX_MAGNITUDE or (x != 0 and abs(x) < self.tiny):
                return False
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        if self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi):
            return False
        return True

    def check(self, x: Any, name: str):
        """x as this rule's type (float or int), or InputValueError naming `name`."""
        problem = self.problem(x)
        if problem:
            raise InputValueError(f"{name} {problem}")
        return int(x) if self.integer else float(x)


def _shown(x: Any) -> str:
    text = repr(x) if not isinstance(x, int) or isinstance(x, bool) else str(x) if abs(x) < 10**30 else f"an integer of {len(str(abs(x)))} digits"
    return text if len(text) <= 60 else text[:57] + "..."


# -- the named quantities (flags and file fields use these) ------------------------------------

ANY = NumberRule()
NON_NEGATIVE = NumberRule(lo=0)
POSITIVE = NumberRule(lo=0, lo_open=True)
FRACTION = NumberRule(lo=0, hi=1, hi_open=True)  # [0, 1)
RATE = NumberRule(lo=0, lo_open=True, hi=1e6, tiny=1e-4,
                  why="req/s; below 1e-4 the arrivals spread past what the simulated clock resolves")
RATE_OR_TRACE = NumberRule(lo=0, hi=1e6, tiny=1e-4,
                           why="req/s, 0 for the trace's own times; below 1e-4 the arrivals spread past what the "
                               "simulated clock resolves")
BURSTINESS = NumberRule(lo=0, lo_open=True, hi=1e3, tiny=1e-3, why="the gamma shape; 1 is Poisson")
SECONDS = NumberRule(lo=0, hi=MAX_SIM_SECONDS, tiny=0, why="seconds")
POSITIVE_SECONDS = NumberRule(lo=0, lo_open=True, hi=MAX_SIM_SECONDS, why="seconds")
TRACE_SECONDS = NumberRule(lo=0, hi=MAX_TRACE_SECONDS, tiny=0, why="seconds")
STEP_SECONDS = NumberRule(lo=0, lo_open=True, hi=3600, tiny=1e-9,
                          why="seconds per step: a step of 0 never advances the simulated clock")
SWAP_GIB = NumberRule(lo=0, hi=1024, tiny=0, why="GiB of host memory per GPU")
SCALE = NumberRule(lo=0, lo_open=True, hi=1e3, tiny=1e-3)
PRICE = NumberRule(lo=0, lo_open=True, hi=1e6, tiny=1e-6, why="$ per GPU-hour")

# a request's token counts and sample widths, as summaries keep them (4-byte integers:
# pagesim.metrics.request_columns); a file that holds more gets one line naming the field
MAX_TOKEN_COUNT = 2**31 - 1


def too_large(value: int, maximum: int = MAX_TOKEN_COUNT) -> str:
    """The problem with an integer above maximum (a huge one named by its length, not written out)."""
    digits = len(str(value))
    return (f"must be at most {maximum:,}, got {value:,}" if digits <= 30
            else f"must be at most {maximum:,}, got an integer of {digits:,} digits")


COUNT = NumberRule(lo=0, integer=True)
POSITIVE_INT = NumberRule(lo=1, integer=True)
SEED = NumberRule(lo=0, hi=2**63 - 1, integer=True)
TP = NumberRule(lo=1, hi=MAX_TP, integer=True, why=f"GPUs; a tensor-parallel group has at most {MAX_TP}")
NUM_REQUESTS = NumberRule(lo=1, hi=MAX_REQUESTS, integer=True)
SAMPLES = NumberRule(lo=1, hi=MAX_SAMPLES, integer=True)
BLOCKS = NumberRule(lo=0, hi=MAX_BLOCKS, integer=True)
BLOCK_SIZE = NumberRule(lo=1, hi=100_000_000, integer=True, why="tokens")
TOKENS = NumberRule(lo=1, hi=100_000_000, integer=True, why="tokens")
SEQS = NumberRule(lo=0, hi=1_000_000, integer=True)
WORKERS = NumberRule(lo=0, hi=1024, integer=True, why="0: one per CPU")
JOBS = NumberRule(lo=1, hi=1024, integer=True)


def check_fields(obj: Any, rules: dict[str, NumberRule], name=lambda field: field) -> None:
    """Each named attribute of obj that is not None obeys its rule (InputValueError otherwise)."""
    for field_name, rule in rules.items():
        value = getattr(obj, field_name)
        if value is not None:
            rule.check(value, name(field_name))


# -- files ------------------------------------------------------------------------------------------


def regular_file(path: str | os.PathLike, what: str = "file") -> Path:
    """path, if it names a readable regular file (following symlinks); InputValueError otherwise.
    Checked with stat, never by opening: opening a FIFO blocks until someone writes to it."""
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputValueError(f"{path}: no such {what}") from None
    except OSError as e:
        raise InputValueError(f"{path}: cannot read the {what} ({(e.strerror or str(e)).lower()})") from None
    if stat.S_ISDIR(mode):
        raise InputValueError(f"{path}: is a folder, expected a {what}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise InputValueError(f"{path}: is {kind}, not a regular file (expected a {what})")
    if not os.access(path, os.R_OK):
        raise InputValueError(f"{path}: cannot read the {what} (permission denied)")
    return path


def _children(dicts: list, lists: list) -> Iterator[Any]:
    """Every value of the dicts and every element of the lists, as one iterator."""
    return chain(chain.from_iterable(map(dict.values, dicts)), chain.from_iterable(lists))


def _instances(dicts: list, lists: list, kind: type) -> list:
    """The children (as _children) that are a `kind`, picked out at C speed."""
    return list(compress(_children(dicts, lists), map(isinstance, _children(dicts, lists), repeat(kind))))


def json_depth_problem(doc: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
    """Where a parsed JSON document nests deeper than `limit`. Walked level by level without
    recursion, each level at C speed, never a Python step per value: a trace holds 10k records
    on one level and may hold 2M token ids on the next."""
    dicts = [doc] if isinstance(doc, dict) else []  # the containers at this depth
    lists = [doc] if isinstance(doc, list) else []
    depth = 1
    while dicts or lists:
        if depth > limit:
            return f"nested more than {limit} levels deep"
        kinds = set(map(type, _children(dicts, lists)))
        dicts, lists = (_instances(dicts, lists, dict) if any(issubclass(k, dict) for k in kinds) else [],
                        _instances(dicts, lists, list) if any(issubclass(k, list) for k in kinds) else [])
        depth += 1
    return None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


class JsonConstant:
    """What json.loads(parse_constant=JsonConstant) reads for NaN, Infinity or -Infinity (not JSON,
    and no number pagesim takes), and json.loads(parse_int=JsonConstant.integer) for an integer of
    more digits than Python converts (sys.get_int_max_str_digits(), 4,300 by default), so a loader
    can say where it stands (first_constant) instead of json's message without a place."""

    __slots__ = ("problem",)

    def __init__(self, name: str, problem: str | None = None):
        self.problem = problem or f"{name} is not a JSON number"

    @classmethod
    def integer(cls, text: str) -> "int | JsonConstant":
        """A parse_int hook: the integer, or where int() refuses it, a JsonConstant saying why."""
        try:
            return int(text)
        except ValueError:
            digits = len(text.lstrip("-"))
            return cls(text, f"an integer of {digits:,} digits, more than the {sys.get_int_max_str_digits():,} "
                             "Python reads as a number")


def loads_marking_long_ints(text: str, **hooks) -> tuple[Any, bool]:
    """(json.loads(text, **hooks), False); where an integer has more digits than Python converts
    (json's ValueError then names no place), the text read again with each such integer a
    JsonConstant for first_constant to find: (that document, True). JSONDecodeError passes."""
    try:
        return json.loads(text, **hooks), False
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        return json.loads(text, parse_int=JsonConstant.integer, **hooks), True


def json_path(keys: tuple) -> str:
    """Keys and indices as a field's name: ('hash_ids', 3) -> 'hash_ids[3]', ('a', 'b') -> 'a.b'."""
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")


def first_constant(doc: Any) -> tuple[tuple, str] | None:
    """The keys and indices leading to doc's first JsonConstant, and its problem (None: doc has
    none). Walked without recursion (a document is MAX_JSON_DEPTH deep at most: see
    json_depth_problem)."""
    stack: list[tuple[tuple, Any]] = [((), doc)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, JsonConstant):
            return path, value.problem
        if isinstance(value, (dict, list)):
            items = value.items() if isinstance(value, dict) else enumerate(value)
            stack.extend(reversed([(path + (key,), child) for key, child in items]))
    return None


def parse_json(text: str, where: str, **hooks) -> Any:
    """json.loads that refuses NaN/Infinity and deep nesting, with one line naming `where`."""
    try:
        doc = json.loads(text, parse_constant=_reject_constant, **hooks)
    except json.JSONDecodeError as e:
        raise InputValueError(f"{where}: not JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise InputValueError(f"{where}: nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as e:  # NaN / Infinity
        raise InputValueError(f"{where}: not JSON ({e})") from None
    problem = json_depth_problem(doc)
    if problem:
        raise InputValueError(f"{where}: {problem}")
    return doc


def read_json(path: str | os.PathLike, what: str = "JSON file", **hooks) -> Any:
    """A JSON input file, checked as `regular_file` and `parse_json` check."""
    path = regular_file(path, what)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except OSError as e:
        raise InputValueError(f"{path}: cannot read the {what} ({(e.strerror or str(e)).lower()})") from None
    return parse_json(text, str(path), **hooks)
