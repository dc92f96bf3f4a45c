"""The shapes a replay visits, from an executor step log, reduced to a grid a profile can measure.

The log (`step_shapes.csv`, written by `pagesim compare` for each executor run, write_step_shapes): a header of the BatchShape
field names in dataclass order followed by `seconds`, then one row per executor step.
`visited_grid` buckets the prefill-only steps by (prompts, tokens per prompt) and the decode-only
steps by (batch, context per sequence) on geometric ladders, and keeps the most visited cells,
plus the largest, until their estimated measuring time reaches a budget. (Mixed steps and block
moves are measured by the profiler's own grid.) Standard library only.
"""

from __future__ import annotations

import csv
import math
import statistics
from collections import Counter
from dataclasses import astuple, fields
from pathlib import Path
from typing import Iterable, NamedTuple

from pagesim.core.step import BatchShape
from pagesim.inputs import InputValueError, regular_file

SHAPE_COLUMNS = tuple(f.name for f in fields(BatchShape))
COLUMNS = SHAPE_COLUMNS + ("seconds",)


class StepShapesError(ValueError):
    """A step-shape file that cannot be used; the message names the file, row and field."""


class LoggedStep(NamedTuple):
    shape: BatchShape
    seconds: float


def write_step_shapes(path: str | Path, steps: Iterable[tuple[BatchShape, float]]) -> None:
    """One row per executor step: its BatchShape fields (dataclass order) and its measured seconds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for shape, seconds in steps:
            w.writerow((*astuple(shape), repr(float(seconds))))


def read_step_shapes(path: str | Path) -> list[LoggedStep]:
    try:
        regular_file(path, "step log")  # a FIFO would block the read forever
        f = open(path, newline="")
    except InputValueError as e:
        raise StepShapesError(f"{path}: cannot read ({str(e).removeprefix(f'{path}: ')})") from None
    except OSError as e:
        raise StepShapesError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != COLUMNS:
            raise StepShapesError(f"{path}: row 1 (header): expected the columns {','.join(COLUMNS)}, "
                                  f"got {','.join(header or []) or 'an empty file'}")
        steps = []
        for row_number, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(COLUMNS):
                raise StepShapesError(f"{path}: row {row_number}: expected {len(COLUMNS)} fields, got {len(row)}")
            values = {}
            for name, text in zip(SHAPE_COLUMNS, row):
                try:
                    values[name] = int(text)
                except ValueError:
                    values[name] = -1
                if values[name] < 0:
                    raise StepShapesError(f"{path}: row {row_number}, field {name}: expected a non-negative integer, "
                                          f"got {text!r}")
            try:
                seconds = float(row[-1])
            except ValueError:
                seconds = math.nan
            if not math.isfinite(seconds) or seconds < 0:
                raise StepShapesError(f"{path}: row {row_number}, field seconds: expected a non-negative number, "
                                      f"got {row[-1]!r}")
            steps.append(LoggedStep(BatchShape(**values), seconds))
    return steps


def ladder_value(x: float, ratio: float, start: int = 1) -> int:
    """x rounded to the nearest rung (in log scale) of start * ratio**k, as an integer >= start."""
    if x <= start:
        return start
    return max(start, round(start * ratio ** round(math.log(x / start, ratio))))


SEQS_RATIO = 2.0 ** 0.5  # batch rungs 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, ...
LENGTH_RATIO = 2.0 ** 0.5  # token rungs 1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, ...


def _cell(step: LoggedStep) -> tuple[str, int, int] | None:
    s = step.shape
    if s.num_prefill_seqs and not s.num_decode_seqs:
        return ("prefill", ladder_value(s.num_prefill_seqs, SEQS_RATIO),
                ladder_value(s.num_prefill_tokens / s.num_prefill_seqs, LENGTH_RATIO))
    if s.num_decode_seqs and not s.num_prefill_seqs:
        # a decode cell's context is measured from a prompt of context - 1 tokens: at least 2
        return ("decode", ladder_value(s.num_decode_seqs, SEQS_RATIO),
                max(2, ladder_value(s.decode_context_tokens / s.num_decode_seqs, LENGTH_RATIO)))
    return None


def visited_grid(steps: list[LoggedStep], budget_s: float = 120.0, reps: int = 3,
                 max_prompt_tokens: int | None = None) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(prefill cells (seqs, tokens), decode cells (batch, context)) from logged steps: the most
    visited cells, and the largest of each kind, while the estimated time to measure them fits
    budget_s. A cell's estimate is reps + 2 times its median logged step (prefill), and twice that
    for decode (its prompts are prefilled first). max_prompt_tokens drops cells longer than it."""
    by_cell: dict[tuple[str, int, int], list[float]] = {}
    for step in steps:
        cell = _cell(step)
        if cell is not None and (max_prompt_tokens is None or cell[2] <= max_prompt_tokens):
            by_cell.setdefault(cell, []).append(step.seconds)
    visits = Counter({cell: len(times) for cell, times in by_cell.items()})
    largest = [max((c for c in by_cell if c[0] == kind), key=lambda c: (c[1] * c[2], c), default=None)
               for kind in ("prefill", "decode")]
    ordered = [c for c in largest if c is not None] + [c for c, _ in visits.most_common() if c not in largest]
    chosen, spent = [], 0.0
    for cell in ordered:
        cost = (reps + 2) * statistics.median(by_cell[cell]) * (2 if cell[0] == "decode" else 1)
        if spent + cost > budget_s and chosen:
            continue
        chosen.append(cell)
        spent += cost
    return ([(a, b) for kind, a, b in chosen if kind == "prefill"], [(a, b) for kind, a, b in chosen if kind == "decode"])
