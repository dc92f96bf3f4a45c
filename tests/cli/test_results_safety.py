"""A results folder holds one run's complete results or the previous ones, whoever else writes it
and whatever signal arrives (issue 26, "Results on disk"); pagesim never deletes what is not its own.

The concurrent-writer and signal cases are gated, not timed: a run is held inside its moves by
pagesim.results.after_rename until the test lets it go."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

import pagesim.results
from pagesim.cli import app
from pagesim.results import INCOMPLETE, ResultsError, results_folder

ROOT = Path(__file__).resolve().parents[2]
ALPACA = str(ROOT / "traces" / "alpaca.json")
NAMES = ("requests.csv", "steps.csv", "summary.json")


def write_run(target: Path, label: str) -> None:
    with results_folder(target) as staging:
        for name in NAMES:
            (staging / name).write_text(f"{label} {name}")
        (staging / "plots").mkdir()
        (staging / "plots" / "a.png").write_text(label)


def contents(target: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.is_file()}


def test_two_writers_take_turns_and_never_mix(tmp_path, monkeypatch):
    """Writer A is held after its first rename; the target is locked meanwhile, writer B waits for
    it, and B's moves come after all of A's: the target ends as B's complete results."""
    target = tmp_path / "out"
    write_run(target, "old")
    renames: list[tuple[str, str]] = []
    a_inside, release_a, b_waiting = threading.Event(), threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def gate(dest: Path) -> None:
        who = threading.current_thread().name
        renames.append((who, dest.name))
        if who == "A" and len(renames) == 1:
            a_inside.set()
            assert release_a.wait(30)

    real_locked = pagesim.results._locked

    def locked(folder):
        if threading.current_thread().name == "B":
            b_waiting.set()  # B has staged everything and now asks for the lock A holds
        return real_locked(folder)

    monkeypatch.setattr(pagesim.results, "after_rename", gate)
    monkeypatch.setattr(pagesim.results, "_locked", locked)

    def run(label):
        try:
            write_run(target, label)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    a = threading.Thread(target=run, args=("A",), name="A")
    a.start()
    assert a_inside.wait(30)
    # A is half way through its moves: the target is locked (a probe cannot take the lock) and marked
    fd = os.open(target, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
    assert (target / INCOMPLETE).exists()
    b = threading.Thread(target=run, args=("B",), name="B")
    b.start()
    assert b_waiting.wait(30)
    assert [who for who, _ in renames] == ["A"]  # B has moved nothing while A holds the target
    release_a.set()
    a.join(30)
    b.join(30)
    assert not errors, errors
    whos = [who for who, _ in renames]
    assert whos == ["A"] * 4 + ["B"] * 4  # plots/ and three files each, one writer after the other
    assert contents(target) == {name: f"B {name}" for name in NAMES}
    assert (target / "plots" / "a.png").read_text() == "B"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no staging folder left


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_during_the_moves_waits_until_they_are_done(tmp_path, signame):
    """A signal that arrives while the results are moved into place is held until the last
    rename: the process then ends by it, and the target holds the new results, complete and
    unmarked (the INCOMPLETE marker is only for a kill -9)."""
    target, ready, go = tmp_path / "out", tmp_path / "ready", tmp_path / "go"
    write_run(target, "old")
    script = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        import pagesim.results as results
        from tests.cli.test_results_safety import write_run

        # a suite started in the background (or under nohup) hands its children SIGINT (SIGHUP)
        # ignored, and Python then installs no handler: give the signal its usual disposition
        signal.signal(signal.{signame}, signal.default_int_handler if {signame!r} == "SIGINT" else signal.SIG_DFL)

        def hold(dest):
            if not Path({str(ready)!r}).exists():
                Path({str(ready)!r}).write_text(str(os.getpid()))
                for _ in range(3000):  # the parent signals us, then creates `go`
                    if Path({str(go)!r}).exists():
                        return
                    time.sleep(0.01)
                raise SystemExit("never released")

        results.after_rename = hold
        write_run(Path({str(target)!r}), "new")
        print("the signal was lost")
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(3000):
            if ready.exists() or child.poll() is not None:
                break
            threading.Event().wait(0.01)
        assert ready.exists(), child.communicate()
        child.send_signal(getattr(signal, signame))
        go.write_text("")
        out, err = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
    assert "the signal was lost" not in out
    assert child.returncode != 0  # it did end by the signal, after the moves
    assert contents(target) == {name: f"new {name}" for name in NAMES}  # complete, and no INCOMPLETE


def test_a_users_folder_under_a_results_name_is_never_deleted(tmp_path):
    out = tmp_path / "D"
    (out / "steps.csv").mkdir(parents=True)
    (out / "steps.csv" / "precious.txt").write_text("mine")
    result = CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "5", "--out", str(out)])
    assert result.exit_code == 2
    assert "is a folder where pagesim writes the file steps.csv" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert (out / "steps.csv" / "precious.txt").read_text() == "mine"

    # the same at the moment of the moves (a command that cannot tell its file names up front):
    # nothing moved, the user's entries intact, this run's results kept beside the target
    (out / "plots").mkdir()
    (out / "plots" / "notes.docx").write_text("mine too")
    with pytest.raises(ResultsError, match="holds files pagesim did not write") as refused:
        with results_folder(out) as staging:
            (staging / "summary.json").write_text("{}")
            (staging / "plots").mkdir()
    assert sorted(p.name for p in out.iterdir()) == ["plots", "steps.csv"]
    assert (out / "plots" / "notes.docx").read_text() == "mine too"
    kept = next(p for p in tmp_path.iterdir() if p.name.startswith(".D.failed-"))
    assert str(kept) in str(refused.value) and (kept / "summary.json").exists()

    # a results sub-folder pagesim wrote is replaced whole by the next run
    target = tmp_path / "plan"
    write_run(target, "one")
    (target / "plots" / "stale.png").write_text("from a wider grid")
    write_run(target, "two")
    assert sorted(p.name for p in (target / "plots").iterdir()) == [pagesim.results.OWN_FOLDER, "a.png"]


def test_out_paths_checked_at_parse_time_and_printed_verbatim(tmp_path, monkeypatch):
    from pagesim.sim import engine

    dangling = tmp_path / "gone"
    dangling.symlink_to(tmp_path / "nowhere")
    real_run = engine.Replay.run
    monkeypatch.setattr(engine.Replay, "run", lambda self: pytest.fail("the run started"))
    result = CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "5", "--out", str(dangling)])
    assert result.exit_code == 2 and "which does not exist" in result.output

    monkeypatch.setattr(engine.Replay, "run", real_run)
    marked = tmp_path / "a[/bold]b"  # rich markup in a path: printed as it is, not interpreted
    result = CliRunner().invoke(app, ["replay", ALPACA, "--num-requests", "5", "--out", str(marked)])
    assert result.exit_code == 0, result.output
    assert str(marked) in result.output and "error" not in result.output
    assert sorted(p.name for p in marked.iterdir()) == sorted(NAMES)
