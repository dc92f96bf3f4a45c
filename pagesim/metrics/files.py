"""requests.csv, steps.csv and waste.csv: written straight from the records and the packed step
log, and read back.

The bytes are those of a csv.DictWriter over one dict per row with floats as repr() (what
pagesim wrote before it wrote this way; tests/metrics/test_files.py holds it to that), but no
dict or record is built per row: requests.csv goes through csv.writer over tuples, and steps.csv,
which has a row per engine step (394k for 10k chunked-prefill requests), is formatted a stretch
of steps at a time, the ten held columns joined once per stretch (see StepLog.segments).

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
from itertools import chain, islice, repeat
from operator import attrgetter
from pathlib import Path

from pagesim.metrics.records import REQUEST_FIELDS, SESSION_FIELDS, STEP_FIELDS, RequestRecord, StepRecord
from pagesim.metrics.step_log import StepLog

STEPS_CHOICES = ("all", "sampled", "none")
CHUNK_ROWS = 1 << 13  # steps.csv lines joined per write: memory stays flat however many steps

# the fields requests.csv keeps (the others are derived from them), and their types when read
_STORED = {"request_id": int, "status": str, "reject_reason": str, "arrival_time": float, "first_scheduled_time": float,
           "first_token_time": float, "finish_time": float, "prompt_len": int, "output_len": int, "num_seqs": int,
           "num_preemptions": int, "num_swaps": int, "cached_prompt_tokens": int,
           "total_output_len": int, "session_id": lambda text: text, "turn": int}


def write_requests_csv(path: Path, requests: list[RequestRecord]) -> None:
    """One row per record, REQUEST_FIELDS in order; None is an empty field, a float its repr
    (csv.writer writes str() of a float, which is its repr)."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(REQUEST_FIELDS)
        writer.writerows(map(attrgetter(*REQUEST_FIELDS), requests))


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
        lines = _step_lines(log)
        while chunk := list(islice(lines, CHUNK_ROWS)):
            chunk.append("")  # (the last line's newline)
            f.write("\n".join(chunk))


def _step_lines(log: StepLog):
    """Every step's line, without its newline. A stretch of steps shares its ten held values,
    joined once into the two strings around kv_blocks_used .. kv_utilization; each block count's
    utilization is formatted once. (Formatting each distinct duration once, through a dict, was
    tried: 1.3x slower, hashing the floats costs more than repr.)"""
    fmt = float.__repr__
    total = log.total_blocks
    util_text = {used: fmt(used / total if total else 0.0) for used in set(log.kv_blocks_used)}
    durations = map(fmt, log.duration)
    times = map(fmt, log.time)
    used, logical = map(str, log.kv_blocks_used), map(str, log.kv_blocks_logical)
    util = map(util_text.__getitem__, log.kv_blocks_used)

    def stretches():  # (built as they are written: memory stays flat)
        for first, stop, held in log.segments():
            n = stop - first
            yield map(",".join, zip(islice(times, n), islice(durations, n), repeat(",".join(map(str, held[:6])), n),
                                    islice(used, n), islice(logical, n), islice(util, n),
                                    repeat(",".join(map(str, held[6:])), n)))

    return chain.from_iterable(stretches())


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
