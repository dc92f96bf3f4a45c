"""Writing results so that a target always holds one run's complete results or the previous ones.

Every command that writes a results folder (replay, run, compare, plan, bench) writes it through
`results_folder`: the files go into a hidden staging folder beside the target
(`.NAME.writing-XXXX`), and only once all of them are complete are they moved into the target,
each by one rename. The moves happen
- under an exclusive lock on the target folder (flock), so two runs writing one `--out` at once
  take turns: the later one's files replace the earlier one's, never a mix of the two;
- with SIGINT, SIGTERM and SIGHUP held back (they are delivered once the moves are done), so an
  interrupt cannot stop them half way.
While they are moved (milliseconds) the target holds a file named INCOMPLETE, removed last: it
stays only where the process died outright (kill -9, power loss). A run killed before the moves
leaves at most a staging folder whose name says what it is.

pagesim never deletes what is not its own: files in the target that the run does not write are
left alone, and where the target holds a folder under the name of a results file (or a file under
the name of a results sub-folder, or a sub-folder with things pagesim did not write) the run
refuses with ResultsError before moving anything, its results kept beside the target.

A single results file (a trace, a profile) goes through `results_file`: written beside, then renamed.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

INCOMPLETE = "INCOMPLETE"
OWN_FOLDER = ".pagesim-results"  # marks a results sub-folder (plots/) as pagesim's, so a rerun may replace it
# what a results sub-folder written before OWN_FOLDER existed may hold and still count as pagesim's
_OWN_SUFFIXES = (".png", ".svg", ".csv", ".json", ".md", ".html", ".txt")
_HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))

# Test seam: called with each destination right after it was renamed into place (the concurrent-
# writer and interrupt tests pause a run there; see tests/cli/test_results_safety.py).
after_rename: Callable[[Path], None] | None = None


class ResultsError(Exception):
    """Results cannot be moved into the target without deleting something that is not pagesim's."""


@contextmanager
def results_folder(target: str | os.PathLike, keep_on_error: bool = False) -> Iterator[Path]:
    """Yields a staging folder to write into; on a normal exit its contents replace the
    same-named entries of `target` (created if needed). On an exception nothing in `target`
    changes and the staging folder is removed, or, with keep_on_error (for results that took
    long to measure), left beside it as `.<name>.failed-...`, named in a note on the exception.
    A ResultsError (the target holds a user's file where a result goes) always keeps them."""
    target = Path(target).absolute()  # "--out ." names the current folder: stage beside it
    if target.is_symlink() and not target.exists():
        raise ResultsError(f"{target}: is a symbolic link to {os.readlink(target)}, which does not exist")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.writing-", dir=target.parent))
    try:
        yield staging
        target.mkdir(parents=True, exist_ok=True)
        with _locked(target):
            _check_replaceable(staging, target)
            with _signals_held():
                _move_into(staging, target)
    except BaseException as e:
        if (keep_on_error or isinstance(e, ResultsError)) and staging.exists() and any(staging.iterdir()):
            kept = staging.with_name(staging.name.replace(".writing-", ".failed-"))
            staging.rename(kept)
            if isinstance(e, ResultsError):
                e.args = (f"{e.args[0]}; this run's results are kept in {kept}",)
            else:
                e.add_note(f"the partial results are kept in {kept}")
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on the folder itself (no lock file left behind); waits for another
    writer to finish its moves. Where flock is missing (Windows) the moves are unlocked."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextmanager
def _signals_held() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP held back in this thread while the block runs, delivered after it.
    Only the main thread can hold them for the process (the kernel hands a signal to a thread that
    does not block it, and Python runs its handlers in the main thread)."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _is_own_folder(path: Path) -> bool:
    if (path / OWN_FOLDER).exists():
        return True
    entries = list(path.iterdir())
    return all(e.is_file() and not e.is_symlink() and e.suffix in _OWN_SUFFIXES for e in entries)


def _check_replaceable(staging: Path, target: Path) -> None:
    """ResultsError naming the first entry of target that a move would delete but pagesim did not write."""
    for entry in sorted(staging.iterdir()):
        dest = target / entry.name
        if entry.is_dir():
            if dest.is_symlink() or (dest.exists() and not dest.is_dir()):
                raise ResultsError(f"{dest}: is a file, not pagesim's results folder {entry.name}/: move it away "
                                   "or choose another --out")
            if dest.is_dir() and not _is_own_folder(dest):
                raise ResultsError(f"{dest}/: holds files pagesim did not write: move them away or choose another --out")
        elif dest.is_dir() and not dest.is_symlink():
            raise ResultsError(f"{dest}: is a folder where pagesim writes the file {entry.name}: move it away or "
                               "choose another --out")


def _move_into(staging: Path, target: Path) -> None:
    marker = target / INCOMPLETE
    marker.write_text("pagesim was moving new results into this folder and was killed: the files here "
                      "mix two runs. Run the command again.\n")
    for entry in sorted(staging.iterdir()):
        dest = target / entry.name
        if entry.is_dir():
            (entry / OWN_FOLDER).touch()
            if dest.is_dir():
                shutil.rmtree(dest)  # a sub-folder of results (checked to be pagesim's) is replaced whole
        os.replace(entry, dest)
        if after_rename is not None:
            after_rename(dest)
    marker.unlink()


def check_writes(target: Path, names: tuple[str, ...]) -> str | None:
    """Why results named `names` could not go into the folder target (one of them is a folder
    there), or None: a command calls this while parsing, before its run."""
    for name in names:
        if (target / name).is_dir() and not (target / name).is_symlink():
            return f"{target / name} is a folder where pagesim writes the file {name}"
    return None


@contextmanager
def results_file(target: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary path beside `target`; renamed onto `target` on a normal exit only."""
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.writing-", dir=target.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
