"""Progress of long work written to a log: when stderr is not a terminal (a CI job, `2> log`,
nohup), a rich bar draws nothing, so long commands print a line at least every LOG_INTERVAL_S
seconds instead, with done/total, the elapsed time and an ETA. `pagesim.cli.checks.progress_bar`
chooses between the bar and this; the figure runner uses it directly. Pure Python (no rich): the
figure scripts' workers may use it too."""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, TextIO

LOG_INTERVAL_S = 10.0  # issue 27: "a line at least every 10 s"


class CountOnly:
    """A progress callback that only counts what is done (a bar, a log line): it reads no state of
    the work it follows, so a replay may call it late, at the end of a decode run that went on
    past finishes (pagesim.sim.engine.Replay._may_absorb_finishes), without changing anything."""

    __slots__ = ("update",)
    counts_only = True

    def __init__(self, update: Callable) -> None:
        self.update = update

    def __call__(self, *args) -> None:
        self.update(*args)


def eta_text(elapsed_s: float, done: int, total: int | None) -> str:
    """'eta 1 min 20 s' from the rate so far; '?' before the first item or without a total."""
    if not total or done <= 0:
        return "eta ?"
    return "eta " + duration_text(max(0.0, elapsed_s * (total - done) / done))


def duration_text(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds // 60 % 60:02d} min"


class LogProgress:
    """Prints `label: done/total unit, elapsed, eta` to `stream` every `interval_s` from a
    background thread (so a silent stretch, one slow item, still gets its line), and a last
    line when the work ends if it took longer than one interval. `detail()` may add a few words
    (which figures are running). Use as a context manager; update(done, total=None) as work ends."""

    def __init__(self, label: str, unit: str, total: int | None, stream: TextIO | None = None,
                 interval_s: float | None = None, detail: Callable[[], str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.label, self.unit, self.total = label, unit, total
        self.stream = stream if stream is not None else sys.stderr
        self.interval_s = LOG_INTERVAL_S if interval_s is None else interval_s
        self.detail, self.clock = detail, clock
        self.done = 0
        self.lines_written = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def update(self, done: int, total: int | None = None) -> None:
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total

    def line(self) -> str:
        with self._lock:
            done, total = self.done, self.total
        elapsed = self.clock() - self.started
        count = f"{done}/{total}" if total else f"{done}"
        words = f"{self.label}: {count} {self.unit}, {duration_text(elapsed)} elapsed, {eta_text(elapsed, done, total)}"
        extra = self.detail() if self.detail else ""
        return words + (f" ({extra})" if extra else "")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed log must not end the work it reports on
            self._stop.set()
        self.lines_written += 1

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._write(self.line())

    def __enter__(self) -> LogProgress:
        self.started = self.clock()
        self._thread = threading.Thread(target=self._beat, name=f"progress-{self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.clock() - self.started >= self.interval_s:  # a long run: say where it ended
            elapsed = duration_text(self.clock() - self.started)
            with self._lock:
                count = f"{self.done}/{self.total}" if self.total else f"{self.done}"
            self._write(f"{self.label}: {count} {self.unit} in {elapsed}" + (" (stopped)" if exc[0] else ""))
        return False
