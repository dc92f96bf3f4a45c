"""Child processes that end with their parent.

`pagesim plan` and `pagesim figures` start worker processes. Killed by SIGTERM or SIGHUP (a
closed terminal, `kill`, a job scheduler), a Python process dies at once by default, and its
children run on, orphaned. So while a command has children:
- `ending_on_signals()` turns SIGTERM and SIGHUP into SystemExit (status 128 + signal) in the
  main thread, so the command's `finally` blocks run and `stop` its children;
- each child calls `die_with_parent()` first: on Linux the kernel sends it SIGTERM when the
  parent dies however it dies (kill -9 included); elsewhere that is a no-op.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator

_ENDING = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))


@contextmanager
def ending_on_signals() -> Iterator[None]:
    """SIGTERM/SIGHUP raise SystemExit(128 + signal) while the block runs (main thread only;
    elsewhere the block runs unchanged)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def end(signum, frame):
        raise SystemExit(128 + signum)

    previous = {s: signal.signal(s, end) for s in _ENDING}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def die_with_parent() -> None:
    """Have the kernel send this process SIGTERM when its parent exits (Linux prctl
    PR_SET_PDEATHSIG); if the parent is already gone, exit now."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # orphaned before prctl took effect
        os._exit(128 + signal.SIGTERM)


def stop(processes: Iterable[subprocess.Popen], grace_s: float = 3.0, group: bool = False) -> None:
    """SIGTERM each process still running (its whole process group with group=True), then
    SIGKILL what is left after grace_s."""
    running = [p for p in processes if p.poll() is None]
    for p in running:
        _signal(p, signal.SIGTERM, group)
    for p in running:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal(p, signal.SIGKILL, group)
            p.wait()


def _signal(p: subprocess.Popen, signum: int, group: bool) -> None:
    try:
        if group and hasattr(os, "killpg"):
            os.killpg(p.pid, signum)
        else:
            p.send_signal(signum)
    except (ProcessLookupError, PermissionError):
        pass
