"""requests.csv, steps.csv and waste.csv: written straight from the records and the packed step
log, and read back.

The bytes are those of a csv.DictWriter over one dict per row with floats as repr() (what
pagesim wrote before it wrote this way; tests/metrics/test_files.py holds it to that), but no
dict or record is built per row: requests.csv is made a column at a time, and steps.csv, which
has a row per engine step (490k for 10k chunked-prefill requests), is joined from the packed
step log a stretch of steps at a time, from a template per row of held values (see _StepLines).
The floats' texts, most of the cost, come from orjson where it writes what repr() writes
(pagesim.metrics.float_text).

`--steps` chooses how much of steps.csv a run writes (STEPS_CHOICES):
- all: every step (the default);
- sampled: the first step to end in each second of simulated time (a real step's row each, the
  same columns; about one row per simulated second whatever the step rate);
- none: no steps.csv (and the replay keeps no per-step records at all).
"""

from __future__ import annotations

import csv
import math
from bisect import bisect_left
from dataclasses import fields
from itertools import chain, islice
from operator import attrgetter
from pathlib import Path

from pagesim.metrics.float_text import float_row_texts, value_texts
from pagesim.metrics.records import HELD_FIELDS, REQUEST_FIELDS, SESSION_FIELDS, STEP_FIELDS, RequestRecord, StepRecord
from pagesim.metrics.step_log import StepLog, unpack_held

STEPS_CHOICES = ("all", "sampled", "none")
CHUNK_STEPS = 1 << 12  # lines made per write (of steps.csv, ~350 kB: its pieces stay in cache; of requests.csv)
MEMO_ENTRIES = 1 << 16  # rows of held values steps.csv's writer keeps ids and texts of at most (a few MB)

# the fields requests.csv keeps (the others are derived from them), and their types when read
_STORED = {"request_id": int, "status": str, "reject_reason": str, "arrival_time": float, "first_scheduled_time": float,
           "first_token_time": float, "finish_time": float, "prompt_len": int, "output_len": int, "num_seqs": int,
           "num_preemptions": int, "num_swaps": int, "cached_prompt_tokens": int,
           "total_output_len": int, "session_id": lambda text: text, "turn": int}


def write_requests_csv(path: Path, requests: list[RequestRecord]) -> None:
    """One row per record, REQUEST_FIELDS in order; None is an empty field, a float its repr
    (what csv.writer writes: str() of each value). Rows are made CHUNK_STEPS at a time, a column's
    texts at once (float_text.value_texts) and zipped into lines: csv.writer tests every
    character of every field for one that needs quotes (a third of the file's cost). Where a text
    field of a stretch could need quotes or holds "None", csv.writer writes the stretch."""
    with open(path, "w", newline="") as f:
        f.write(",".join(REQUEST_FIELDS) + "\n")
        records = iter(requests)
        while chunk := list(islice(records, CHUNK_STEPS)):
            columns = [list(map(field, chunk)) for field in _REQUEST_COLUMNS]
            if all(map(_plain_text, set(chain.from_iterable(columns[i] for i in _TEXT_COLUMNS)))):
                f.write("\n".join(map(",".join, zip(*map(value_texts, columns)))) + "\n")
            else:
                csv.writer(f, lineterminator="\n").writerows(zip(*columns))


_REQUEST_COLUMNS = [attrgetter(name) for name in REQUEST_FIELDS]
# requests.csv's fields that hold text (status, reject_reason, session_id), by position
_TEXT_COLUMNS = [REQUEST_FIELDS.index(f.name) for f in fields(RequestRecord)
                 if f.name in REQUEST_FIELDS and "str" in str(f.type)]


def _plain_text(value) -> bool:
    """Whether str(value) joins as csv.writer writes it, and leaves None's text recognizable."""
    if value is None:
        return True
    return type(value) is str and "None" not in value and not any(c in value for c in ',"\r\n')


def write_rows_csv(path: Path, columns, rows) -> None:
    """Rows of plain values (numbers, strings, None), in column order."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)


def write_steps_csv(path: Path, log: StepLog, which: str = "all") -> None:
    """steps.csv from the step log: every step, or the sampled ones (see the module's doc)."""
    if which not in ("all", "sampled"):
        raise ValueError(f"steps to write: one of 'all' or 'sampled', got {which!r}")
    with open(path, "w", newline="") as f:
        f.write(",".join(STEP_FIELDS) + "\n")
        if which == "sampled":
            write_rows = csv.writer(f, lineterminator="\n").writerows
            write_rows(map(log.row, sampled_steps(log.time)))
            return
        lines = _StepLines(log)
        for first in range(0, len(log), CHUNK_STEPS):
            f.write(lines.text(first, min(first + CHUNK_STEPS, len(log))))


class _StepLines:
    """steps.csv's lines, a stretch of steps at a time: "time,duration" (float_row_texts: both
    reprs at once, most of the cost), the middle and last pieces of the step's row of held values
    (rows recur: 4,006 distinct of 47,159 in a 10k chunked-prefill replay, so each row gets an id
    and its pieces are made once) and "used,logical,utilization," (made once per block count).
    The pieces are gathered by numpy from the lines' row ids and block counts (_Texts), put in
    place by slice assignment, and the stretch is joined once."""

    def __init__(self, log: StepLog):
        self.log = log
        total = log.total_blocks
        self.row_ids: dict[bytes, int] = {}  # a row of held values (its bytes) -> its id
        self.rows: list[bytes] = []  # by id
        self.middles = _Texts(lambda row_id: _MIDDLE % unpack_held(self.rows[row_id])[:6])
        self.lasts = _Texts(lambda row_id: _LAST % unpack_held(self.rows[row_id])[6:])

        def utilization(used: int) -> str:
            return f"{used / total if total else 0.0!r},"

        self.utilization = _Texts(utilization)
        self.blocks = _Texts(lambda used: f"{used},{used},{utilization(used)}")  # (logical = used: no sharing)
        self.counts = _Texts(lambda count: f"{count},")

    def text(self, first: int, stop: int) -> str:
        import numpy  # (here: `import pagesim.metrics` stays light)

        log, row_ids = self.log, self.row_ids
        if len(row_ids) >= MEMO_ENTRIES:  # (bounded memory; between stretches: ids stay valid through one)
            row_ids.clear(), self.rows.clear(), self.middles.forget(), self.lasts.forget()
        held, counts = log.held_runs(first, stop)
        known = len(row_ids)
        ids = [row_ids.setdefault(row, len(row_ids)) for row in held]
        self.rows += islice(row_ids, known, None)
        line_ids = numpy.repeat(numpy.array(ids, numpy.intp), counts)
        used = numpy.frombuffer(log.kv_blocks_used, numpy.intc)[first:stop]
        logical = numpy.frombuffer(log.kv_blocks_logical, numpy.intc)[first:stop] if log.shares_blocks else used
        parts = [""] * (4 * (stop - first))
        parts[0::4] = float_row_texts([log.time[first:stop], log.duration[first:stop]])
        parts[1::4] = self.middles.of(line_ids)
        if logical is used or numpy.array_equal(logical, used):
            parts[2::4] = self.blocks.of(used)
        else:
            parts[2::4] = map("".join, zip(self.counts.of(used), self.counts.of(logical), self.utilization.of(used)))
        parts[3::4] = self.lasts.of(line_ids)
        return "".join(parts)


class _Texts:
    """Texts by a non-negative integer (a held row's id, a block count), each made by `make` the
    first time a stretch needs it and kept in a numpy object array that grows to the largest
    integer seen (a block count's: at most the pool's size), so that a stretch's texts are
    gathered by numpy from its lines' integers, not looked up one by one."""

    def __init__(self, make):
        import numpy

        self.make = make
        self.texts = numpy.empty(0, object)
        self.made = numpy.zeros(0, bool)

    def of(self, indices) -> list[str]:
        """The texts of indices (a numpy integer array), in order."""
        import numpy

        if not len(indices):
            return []
        top = int(indices.max()) + 1
        if top > len(self.texts):  # (grown by doubling: a few copies over a run)
            grown = max(top, 2 * len(self.texts))
            self.texts = numpy.concatenate([self.texts, numpy.empty(grown - len(self.texts), object)])
            self.made = numpy.concatenate([self.made, numpy.zeros(grown - len(self.made), bool)])
        new = indices[~self.made[indices]]
        if len(new):
            for index in numpy.unique(new).tolist():
                self.texts[index] = self.make(index)
            self.made[new] = True
        return self.texts[indices].tolist()

    def forget(self) -> None:
        """Make every text again when next needed (its integers now stand for other things)."""
        self.made[:] = False


# a line: "time,duration", then a held row's first six fields (the middle), the blocks
# ("used,logical,utilization,") and the row's last four fields
_MIDDLE = ",%d,%d,%d,%d,%d,%d,"
_LAST = "%d,%d,%d,%d\n"
assert STEP_FIELDS[:2] == ("time", "duration") and STEP_FIELDS[2:8] == HELD_FIELDS[:6] and \
    STEP_FIELDS[8:11] == ("kv_blocks_used", "kv_blocks_logical", "kv_utilization") and STEP_FIELDS[11:] == HELD_FIELDS[6:]


def sampled_steps(times) -> list[int]:
    """Indices of the first step to end in each second of simulated time that has one."""
    if not len(times):
        return []
    picked = []
    second = math.floor(times[0])
    last = times[-1]
    while second <= last:
        i = bisect_left(times, second)  # the first step ending at or after this second
        picked.append(i)
        second = math.floor(times[i]) + 1  # (skips seconds in which no step ends)
    return picked


def read_requests_csv(path: str | Path) -> list[RequestRecord]:
    """requests.csv back into records (without output-token times, which it does not hold)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        before_sessions = tuple(f for f in REQUEST_FIELDS if f not in SESSION_FIELDS)
        if tuple(reader.fieldnames or ()) != before_sessions:  # (a file written before sessions has none)
            _check_columns(path, reader.fieldnames, REQUEST_FIELDS)
        stored = {name: kind for name, kind in _STORED.items() if name in reader.fieldnames}
        return [RequestRecord(**{name: _parse(path, i, name, row[name], kind) for name, kind in stored.items()})
                for i, row in enumerate(reader)]


def read_steps_csv(path: str | Path) -> list[StepRecord]:
    """steps.csv back into records."""
    kinds = {name: float if name in ("time", "duration", "kv_utilization") else int for name in STEP_FIELDS}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        _check_columns(path, reader.fieldnames, STEP_FIELDS)
        return [StepRecord(**{name: _parse(path, i, name, row[name], kinds[name]) for name in STEP_FIELDS})
                for i, row in enumerate(reader)]


def _check_columns(path, found, expected) -> None:
    if tuple(found or ()) != tuple(expected):
        raise ValueError(f"{path}: columns {list(found or ())} are not pagesim's {list(expected)}")


def _parse(path, index: int, name: str, text: str, kind):
    if text == "" and kind is not str:
        return None
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{path}: row {index}: field {name}: {text!r} is not {kind.__name__}") from None
