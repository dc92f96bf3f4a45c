"""Progress in logs (issue 27 item 6): where stderr is not a terminal, long work prints a line at
least every LOG_INTERVAL_S with done/total and an ETA; the CLI's progress bar and the figure
runner use the one helper, pagesim.progress.LogProgress."""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

from typer.testing import CliRunner

import pagesim.progress as progress
from pagesim.progress import LogProgress, duration_text, eta_text

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^slow: (\d+)/10 items, \d+ s elapsed, eta (\?|\d+ s)$")


class TimedStream(io.StringIO):
    """A log file (not a terminal) that notes when each line came."""

    def __init__(self):
        super().__init__()
        self.times: list[float] = []

    def write(self, text):
        self.times.append(time.monotonic())
        return super().write(text)

    def isatty(self):
        return False


def test_eta_and_durations_by_hand():
    assert eta_text(10.0, 2, 10) == "eta 40 s"  # 5 s an item, 8 to go
    assert eta_text(10.0, 0, 10) == "eta ?" and eta_text(10.0, 3, None) == "eta ?"
    assert eta_text(30.0, 10, 10) == "eta 0 s"
    assert duration_text(59.4) == "59 s" and duration_text(125) == "2 min 05 s" and duration_text(3725) == "1 h 02 min"


def test_a_line_with_a_fake_clock():
    now = [100.0]
    log = LogProgress("slow", "items", 10, io.StringIO(), clock=lambda: now[0], detail=lambda: "fig12")
    log.started = 100.0
    log.update(4)
    now[0] = 120.0  # 4 items in 20 s: 6 more take 30 s
    assert log.line() == "slow: 4/10 items, 20 s elapsed, eta 30 s (fig12)"
    log.update(5, total=20)
    assert log.line().startswith("slow: 5/20 items, 20 s elapsed, eta 1 min 00 s")


def test_a_slow_loop_writes_a_line_every_interval_to_a_non_tty_stream():
    stream = TimedStream()
    interval = 0.2
    with LogProgress("slow", "items", 10, stream, interval_s=interval) as log:
        started = time.monotonic()
        for i in range(10):
            time.sleep(0.15)  # one slow item: 1.5 s in all, about 7 intervals
            log.update(i + 1)
        ended = time.monotonic()
    lines = stream.getvalue().splitlines()
    beats, last = lines[:-1], lines[-1]
    assert len(beats) >= 3, lines  # (7 expected; the bound leaves room for a loaded machine)
    assert all(LINE.match(line) for line in beats), beats
    assert [int(LINE.match(line).group(1)) for line in beats] == sorted(int(LINE.match(line).group(1)) for line in beats)
    assert re.match(r"^slow: 10/10 items in \d+ s$", last), last
    # no silent stretch much longer than the interval between the start and the end
    marks = [started, *stream.times[:-1], ended]
    assert max(b - a for a, b in zip(marks, marks[1:])) < interval * 4, marks


def test_short_work_writes_nothing():
    stream = io.StringIO()
    with LogProgress("quick", "items", 3, stream, interval_s=5.0) as log:
        log.update(3)
    assert stream.getvalue() == ""


def test_replay_prints_progress_lines_when_stderr_is_a_log(monkeypatch):
    """`pagesim replay` under a non-terminal stderr (CliRunner's): lines with done/total, no bar."""
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.05)
    result = CliRunner().invoke(app_(), ["replay", str(ROOT / "traces" / "sharegpt.json"), "--num-requests", "3000",
                                         "--rate", "5"])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("replay: ")]
    assert lines and all(re.match(r"^replay: \d+/3000 requests, \d+ s elapsed, eta (\?|.+)$", line) or
                         re.match(r"^replay: 3000/3000 requests in \d+ s$", line) for line in lines), lines
    assert "\x1b[" not in result.stderr  # no terminal escapes in a log


def app_():
    from pagesim.cli import app

    return app
