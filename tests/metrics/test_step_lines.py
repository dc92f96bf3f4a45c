"""steps.csv's lines are made a stretch of steps at a time from memoized templates and pieces
(pagesim.metrics.files._StepLines). Whatever the stretch length and however often the memos
are emptied, the bytes must be those of csv.DictWriter over the log's own StepRecords, floats as
repr(): including stretches that cut a decode run, steps with and without shared blocks, a zero
and a negative-zero duration (equal as dict keys: no memo may merge them), and a log with no pool."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import pytest

from pagesim.metrics import STEP_FIELDS, StepLog
from pagesim.metrics import files
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, load_trace

ROOT = Path(__file__).resolve().parents[2]


def _reference(path: Path, log: StepLog) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=STEP_FIELDS, lineterminator="\n")
        writer.writeheader()
        for record in log.records():
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in dataclasses.asdict(record).items()})


def _hand_log(total_blocks: int) -> StepLog:
    """Prefill steps, decode runs (one long enough to span several stretches), sharing that
    starts and stops, durations that recur, 0.0 and -0.0."""
    log = StepLog(total_blocks)
    t = 0.0
    for i in range(5):
        t += 0.25
        log.add_step(t, 0.25, 3 + i, 3 + i + (i % 2), (1, 1, 40 + i, 0, 2, 0, 0, 0, 0, 0))
    log.add_step(t, 0.0, 8, 8, (1, 1, 0, 1, 2, 0, 0, 0, 0, 0))
    log.add_step(t, -0.0, 8, 8, (1, 1, 0, 1, 2, 0, 0, 0, 0, 0))
    ends = [t + 0.125 * (k + 1) for k in range(23)]
    log.add_run(ends, [0.125, 0.1, 0.3] * 7 + [0.125, 0.1], [8 + k // 4 for k in range(23)], (2, 1),
                (2, 2, 0, 2, 1, 0, 0, 0, 0, 0), (1, 2, 0, 2, 0, 0, 0, 0, 0, 0))
    t = ends[-1]
    log.add_step(t + 0.5, 0.5, 10, 10, (1, 1, 0, 1, 0, 0, 1, 0, 4, 1))
    log.add_run([t + 1.0, t + 1.1], [0.5, 0.1], [10, 10], (0, 0), (1, 1, 0, 1, 0, 0, 0, 0, 0, 0),
                (0, 1, 0, 1, 0, 0, 0, 0, 0, 0))
    return log


@pytest.mark.parametrize("chunk", [1, 2, 7, 1 << 14])
@pytest.mark.parametrize("memo_entries", [1, 3, 1 << 17])
@pytest.mark.parametrize("total_blocks", [32, 0])
def test_hand_built_log_any_stretch_and_memo_size(chunk, memo_entries, total_blocks, tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CHUNK_STEPS", chunk)
    monkeypatch.setattr(files, "MEMO_ENTRIES", memo_entries)
    log = _hand_log(total_blocks)
    files.write_steps_csv(tmp_path / "steps.csv", log)
    _reference(tmp_path / "reference.csv", log)
    written = (tmp_path / "steps.csv").read_bytes()
    assert written == (tmp_path / "reference.csv").read_bytes()
    lines = written.decode().splitlines()
    assert len(lines) == 1 + len(log) == 1 + 5 + 2 + 23 + 1 + 2
    # the zero durations keep their signs; shared blocks show (logical 5 for 4 used at step 1)
    assert [line.split(",")[1] for line in lines[6:8]] == ["0.0", "-0.0"]
    assert lines[2].split(",")[8:10] == ["4", "5"]


@pytest.mark.parametrize("chunk", [3, 1000])
def test_a_replay_with_shared_blocks_in_short_stretches(chunk, tmp_path, monkeypatch):
    """Parallel samples (logical > used in some stretches, equal in others) and swapping."""
    trace = load_trace(ROOT / "traces" / "sharegpt.json")
    trace = Trace(dict(trace.metadata), [r for r in trace.requests if r.prompt_len + r.output_len <= 1024][:200])
    cfg = ReplayConfig(num_requests=40, rate=3.0, seed=5, n=3, num_gpu_blocks=260, preemption="swap")
    log = Replay(cfg, trace).run().metrics.step_log
    assert any(u != g for u, g in zip(log.kv_blocks_used, log.kv_blocks_logical))
    monkeypatch.setattr(files, "CHUNK_STEPS", chunk)
    monkeypatch.setattr(files, "MEMO_ENTRIES", 50)
    files.write_steps_csv(tmp_path / "steps.csv", log)
    _reference(tmp_path / "reference.csv", log)
    assert (tmp_path / "steps.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()


@pytest.mark.parametrize("first_sharing", ["step", "run", "last step of a run", "never"])
def test_blocks_without_sharing_kept_from_the_first_step_that_shares(first_sharing, tmp_path):
    """kv_blocks_logical is stored only from the first step whose logical count differs from the
    blocks used (before it, it is the used column): the values and the file are the same as if
    every step's count had been stored, whichever kind of step shares first."""
    log = StepLog(64)
    logical = []  # what each step's count is, by hand
    held = (1, 1, 0, 1, 0, 0, 0, 0, 0, 0)
    for i in range(3):
        extra = 1 if first_sharing == "step" and i == 2 else 0
        log.add_step(0.5 * (i + 1), 0.5, 4 + i, 4 + i + extra, held)
        logical.append(4 + i + extra)
    shared = {"run": (2, 1), "last step of a run": (0, 3)}.get(first_sharing, (0, 0))
    log.add_run([2.0, 2.5, 3.0], [0.5, 0.5, 0.5], [7, 8, 8], shared, held, held)
    logical += [7 + shared[0], 8 + shared[0], 8 + shared[1]]
    log.add_step(3.5, 0.5, 9, 9, held)
    log.add_run([4.0, 4.5], [0.5, 0.5], [9, 10], (0, 0), held, held)
    logical += [9, 9, 10]
    assert list(log.kv_blocks_logical) == logical
    assert [r.kv_blocks_logical for r in log.records()] == logical
    assert log.shares_blocks == (first_sharing != "never")
    files.write_steps_csv(tmp_path / "steps.csv", log)
    _reference(tmp_path / "reference.csv", log)
    assert (tmp_path / "steps.csv").read_bytes() == (tmp_path / "reference.csv").read_bytes()
    assert [line.split(",")[9] for line in (tmp_path / "steps.csv").read_text().splitlines()[1:]] == \
        [str(n) for n in logical]
