"""Writing results so that an interrupted run never leaves a mix of old and new files.

Every command that writes a results folder (replay, run, compare, plan) writes it through
`results_folder`: the files go into a hidden staging folder beside the target
(`.NAME.writing-XXXX`), and only once all of them are complete are they moved into the target,
each by one rename. While they are moved (milliseconds), the target holds a file named
INCOMPLETE; it goes last. So an interrupt leaves either the complete previous results, or a
folder marked INCOMPLETE, and a run killed outright leaves at most a staging folder whose name
says what it is. Files in the target that the run does not write are left alone (an `--out`
pointing at a folder of other things never loses them).

A single results file (a profile) goes through `results_file`: written beside, then renamed.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

INCOMPLETE = "INCOMPLETE"


@contextmanager
def results_folder(target: str | os.PathLike, keep_on_error: bool = False) -> Iterator[Path]:
    """Yields a staging folder to write into; on a normal exit its contents replace the
    same-named entries of `target` (created if needed). On an exception nothing in `target`
    changes and the staging folder is removed, or, with keep_on_error (for results that took
    long to measure), left beside it as `.<name>.failed-...`, named in a note on the exception."""
    target = Path(target).absolute()  # "--out ." names the current folder: stage beside it
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.writing-", dir=target.parent))
    try:
        yield staging
        _move_into(staging, target)
    except BaseException as e:
        if keep_on_error and any(staging.iterdir()):
            kept = staging.with_name(staging.name.replace(".writing-", ".failed-"))
            staging.rename(kept)
            e.add_note(f"the partial results are kept in {kept}")
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _move_into(staging: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    marker = target / INCOMPLETE
    marker.write_text("pagesim was moving new results into this folder and was interrupted: the files here "
                      "mix two runs. Run the command again.\n")
    for entry in sorted(staging.iterdir()):
        dest = target / entry.name
        if dest.is_dir() and not dest.is_symlink():
            shutil.rmtree(dest)  # a sub-folder of results is replaced whole
        elif entry.is_dir() and (dest.exists() or dest.is_symlink()):
            dest.unlink()
        os.replace(entry, dest)
    marker.unlink()


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
