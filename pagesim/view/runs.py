"""Finding runs in folders and reading their result files for the page.

A run is a folder holding summary.json (what replay, run, bench and validate write with --out),
with requests.csv, steps.csv, waste.csv, steps_replica<K>.csv (a cluster's per-replica steps) and
validate.json where the command wrote them. compare --out writes one run per side
(SYSTEM/executor, SYSTEM/simulator, SYSTEM/served, SYSTEM/executor/runN): a folder without its own
summary.json stands for the runs below it.

The readers take the columns the page plots by name, so files of older or newer pagesim versions
(with more columns, such as a cluster's `replica`) read too; a missing column the page needs, a
cell that is not a number or a row of the wrong length is a ViewError naming the file, the row
(1 = the first row after the header) and the column.
"""

from __future__ import annotations

import csv
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_RUNS = 8  # runs on one page: more lines than this on one axis are unreadable
MAX_DEPTH = 3  # compare's deepest run folder: OUT/SYSTEM/executor/runN
REPLICA_STEPS = re.compile(r"steps_replica(\d+)\.csv")

REQUEST_COLUMNS = ("status", "arrival_time", "first_token_time", "finish_time", "prompt_len", "output_len")
REQUEST_OPTIONAL = ("tpot", "num_preemptions", "num_swaps", "replica", "decode_replica")
STEP_COLUMNS = ("time", "duration", "num_running_requests")
STEP_OPTIONAL = ("num_scheduled_seqs", "num_decode_seqs", "num_waiting", "num_swapped", "kv_utilization",
                 "num_preempted", "blocks_swapped_in", "blocks_swapped_out")
WASTE_COLUMNS = ("time", "token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


class ViewError(ValueError):
    """A result file the page cannot be made from; the message is one line naming the file."""


@dataclass
class Run:
    """One run's results: summary.json's dict and each CSV file as columns (name -> values,
    None for an empty cell; `status` as text, every other column as numbers)."""

    label: str
    path: Path
    summary: dict
    requests: dict[str, list] | None = None
    steps: dict[str, list] | None = None
    waste: dict[str, list] | None = None
    replica_steps: dict[int, dict[str, list]] = field(default_factory=dict)
    validate: dict | None = None

    @property
    def simulated(self) -> bool:
        """A replay's summary names its cost model; a measured run's (run, bench) does not."""
        return "cost_model" in self.summary

    @property
    def clock(self) -> str:
        return "simulated" if self.simulated else "measured"

    @property
    def origin(self) -> float:
        """Time zero of the plots over time: the first arrival (a real run's clock starts anywhere)."""
        if self.requests and self.requests["arrival_time"]:
            return min(self.requests["arrival_time"])
        if self.steps and self.steps["time"]:
            return self.steps["time"][0] - self.steps["duration"][0]
        return 0.0


def find_runs(paths: list[Path]) -> list[tuple[str, Path]]:
    """(label, folder) of every run the given paths name: a run folder, a file in one, or a folder
    whose sub-folders (up to MAX_DEPTH down) are runs, labelled by their path below it."""
    found = []
    for given in paths:
        if not given.exists():
            raise ViewError(f"{given}: no such file or folder")
        folder = given.parent if given.is_file() else given
        if (folder / "summary.json").is_file():
            found.append((folder.absolute().name or str(folder), folder))
            continue
        below = sorted(p.parent for p in folder.rglob("summary.json")
                       if len(p.relative_to(folder).parts) <= MAX_DEPTH + 1)
        if not below:
            raise ViewError(f"{given}: no summary.json here or in its sub-folders (replay, run, bench, compare and "
                            "validate write one with --out)")
        found += [(str(p.relative_to(folder)), p) for p in below]
    if len(found) > MAX_RUNS:
        raise ViewError(f"{len(found)} runs found ({', '.join(str(p) for _, p in found[:3])}, ...): one page overlays "
                        f"at most {MAX_RUNS}; name the run folders themselves")
    labels = [label for label, _ in found]
    if len(set(labels)) < len(labels):  # the same folder name twice: tell them apart by position
        found = [(f"{i + 1}: {label}", path) for i, (label, path) in enumerate(found)]
    return found


def load_run(label: str, folder: Path) -> Run:
    run = Run(label, folder, read_json(folder / "summary.json"))
    if not isinstance(run.summary, dict):
        raise ViewError(f"{folder / 'summary.json'}: must hold a JSON object, not {type(run.summary).__name__}")
    if (folder / "requests.csv").is_file():
        run.requests = read_columns(folder / "requests.csv", REQUEST_COLUMNS, REQUEST_OPTIONAL, text=("status",))
    if (folder / "steps.csv").is_file():
        run.steps = read_columns(folder / "steps.csv", STEP_COLUMNS, STEP_OPTIONAL)
    if (folder / "waste.csv").is_file():
        run.waste = read_columns(folder / "waste.csv", WASTE_COLUMNS, ())
    for path in sorted(folder.glob("steps_replica*.csv")):
        match = REPLICA_STEPS.fullmatch(path.name)
        if match:
            run.replica_steps[int(match.group(1))] = read_columns(path, STEP_COLUMNS, STEP_OPTIONAL)
    if (folder / "validate.json").is_file():
        run.validate = read_json(folder / "validate.json")
    return run


def read_json(path: Path):
    try:
        return json.loads(path.read_text(), parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ViewError(f"{path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ViewError(f"{path}: cannot be read ({e})") from None


def _no_constant(name: str):
    raise ViewError(f"{name} in a result file: pagesim writes no NaN or infinity")


def read_columns(path: Path, needed: tuple[str, ...], optional: tuple[str, ...], text: tuple[str, ...] = ()) -> dict:
    """The named columns of a CSV file: `needed` ones must be there, `optional` ones are read where
    they are; cells are numbers (or empty: None) except the `text` columns."""
    try:
        with open(path, newline="") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if header is None:
                raise ViewError(f"{path}: empty file (a CSV file starts with its header row)")
            missing = [name for name in needed if name not in header]
            if missing:
                raise ViewError(f"{path}: column {missing[0]} is missing (the header has {', '.join(header)})")
            wanted = [(name, header.index(name)) for name in needed + optional if name in header]
            columns = {name: [] for name, _ in wanted}
            for row_number, row in enumerate(reader, start=1):
                if len(row) != len(header):
                    raise ViewError(f"{path}: row {row_number}: {len(row)} cells where the header has {len(header)}")
                for name, at in wanted:
                    columns[name].append(row[at] if name in text else _number(path, row_number, name, row[at]))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ViewError(f"{path}: cannot be read ({e})") from None
    return columns


def _number(path: Path, row: int, column: str, cell: str) -> float | None:
    if cell == "":
        return None
    try:
        value = float(cell)
    except ValueError:
        raise ViewError(f"{path}: row {row}, column {column}: {cell!r} is not a number") from None
    if not math.isfinite(value):
        raise ViewError(f"{path}: row {row}, column {column}: {cell!r} is not a finite number")
    return value
