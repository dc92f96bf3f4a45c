"""Results are written atomically: an interrupt while writing leaves the previous run's complete
results (byte for byte), or, if it strikes while the finished files are moved into place, a
folder marked INCOMPLETE; never an unmarked mix. An unwritable --out fails before the run."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagesim.metrics.files
import pagesim.results
from pagesim.cli import app
from pagesim.results import INCOMPLETE, results_folder

ROOT = Path(__file__).resolve().parents[2]
ALPACA = str(ROOT / "traces" / "alpaca.json")


def replay(out: Path, seed: int):
    return CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "40", "--seed", str(seed), "--out", str(out)])


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_interrupt_while_writing_keeps_the_previous_results(tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert replay(out, seed=0).exit_code == 0
    before = snapshot(out)
    assert set(before) == {"requests.csv", "steps.csv", "summary.json"}

    files = pagesim.metrics.files
    real_requests, real_steps = files.write_requests_csv, files.write_steps_csv
    calls = []

    def requests_written(path, *args):
        calls.append(path.name)
        real_requests(path, *args)

    def interrupted(path, *args):  # requests.csv is complete by now; Ctrl-C halfway through steps.csv
        calls.append(path.name)
        with open(path, "w") as f:
            f.write("time,num_")
        raise KeyboardInterrupt

    monkeypatch.setattr(files, "write_requests_csv", requests_written)
    monkeypatch.setattr(files, "write_steps_csv", interrupted)
    result = replay(out, seed=1)
    assert calls == ["requests.csv", "steps.csv"]
    assert result.exit_code == 130
    assert snapshot(out) == before  # not a byte of the new run reached the target
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # and the staging folder is gone

    monkeypatch.setattr(files, "write_requests_csv", real_requests)
    monkeypatch.setattr(files, "write_steps_csv", real_steps)
    assert replay(out, seed=1).exit_code == 0
    after = snapshot(out)
    assert set(after) == set(before) and after["requests.csv"] != before["requests.csv"]


def test_interrupt_while_moving_into_place_marks_the_folder_incomplete(tmp_path, monkeypatch):
    out = tmp_path / "run"
    out.mkdir()
    (out / "mine.txt").write_text("not pagesim's")  # a file the run does not write stays
    real = pagesim.results.os.replace
    moved = []

    def replace(src, dst):
        if moved:
            raise KeyboardInterrupt
        moved.append(dst)
        real(src, dst)

    monkeypatch.setattr(pagesim.results.os, "replace", replace)
    with pytest.raises(KeyboardInterrupt):
        with results_folder(out) as staging:
            for name in ("a.csv", "b.csv"):
                (staging / name).write_text(name)
    assert sorted(p.name for p in out.iterdir()) == [INCOMPLETE, "a.csv", "mine.txt"]
    assert "was killed" in (out / INCOMPLETE).read_text()

    monkeypatch.setattr(pagesim.results.os, "replace", real)
    with results_folder(out) as staging:
        for name in ("a.csv", "b.csv"):
            (staging / name).write_text(name + " again")
    assert snapshot(out) == {"a.csv": b"a.csv again", "b.csv": b"b.csv again", "mine.txt": b"not pagesim's"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_keep_on_error_keeps_long_measured_results_beside_the_target(tmp_path):
    out = tmp_path / "fidelity"
    with pytest.raises(ValueError) as failure:
        with results_folder(out, keep_on_error=True) as staging:
            (staging / "run1").mkdir()
            (staging / "run1" / "steps.csv").write_text("measured for half an hour")
            raise ValueError("pooling failed")
    assert not out.exists()  # the target is untouched, as without keep_on_error
    (kept,) = [p for p in tmp_path.iterdir() if p.name.startswith(".fidelity.failed-")]
    assert (kept / "run1" / "steps.csv").read_text() == "measured for half an hour"
    assert f"the partial results are kept in {kept}" in failure.value.__notes__
    with pytest.raises(ValueError):  # nothing written: nothing kept
        with results_folder(tmp_path / "empty", keep_on_error=True):
            raise ValueError("failed at once")
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]


def test_unwritable_out_fails_before_the_run(tmp_path, monkeypatch):
    from pagesim.sim import engine

    monkeypatch.setattr(engine.Replay, "run", lambda self: pytest.fail("the run started"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    for out in (blocker, blocker / "sub"):
        result = CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "5", "--out", str(out)])
        assert result.exit_code == 2 and "'--out'" in result.output
