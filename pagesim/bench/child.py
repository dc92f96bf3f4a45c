"""A `pagesim serve` or `pagesim route` subprocess on 127.0.0.1: started with --port 0, it says
where it listens on stderr; its stderr is read by a thread (a full pipe would block the child);
`wait_healthy` polls /health until a deadline; `stop` sends Ctrl-C (or another signal) and waits.
The tests' fixtures and the route check (pagesim.experiments.route_check) start their servers
with it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

LISTENING = re.compile(r"on (http://127\.0\.0\.1:\d+)/v1$")  # the line serve and route print once bound


class ChildFailed(RuntimeError):
    """The child exited, or did not answer /health in time; the message ends with its stderr."""


def cli_env(root: Path) -> dict:
    """This checkout first on the path, one torch thread (the machines have few cores)."""
    return dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")


@dataclass
class CliChild:
    proc: subprocess.Popen
    base: str = ""  # http://127.0.0.1:PORT, once the child said where it listens
    lines: list[str] = field(default_factory=list)  # its stderr so far
    listening: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, args: list[str], root: Path) -> "CliChild":
        """`python -m pagesim.cli ARGS` run from the checkout `root`."""
        proc = subprocess.Popen([sys.executable, "-m", "pagesim.cli", *args], cwd=root, env=cli_env(root),
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        return cls(proc)

    def __post_init__(self):
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            found = LISTENING.search(line.rstrip())
            if found and not self.base:
                self.base = found[1]
                self.listening.set()
        self.listening.set()

    @property
    def name(self) -> str:
        return f"pagesim {self.proc.args[3]}" if len(self.proc.args) > 3 else "pagesim"

    @property
    def stderr(self) -> str:
        return "".join(self.lines)

    def wait_healthy(self, deadline: float) -> None:
        """Return once /health answers 200; ChildFailed (the child stopped) if it exits first or the
        monotonic `deadline` passes."""
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise ChildFailed(f"{self.name} exited with {self.proc.returncode}: {self.stderr[-2000:]}")
            try:
                if self.base and httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ChildFailed(f"{self.name}: no answer on /health in time: {self.stderr[-2000:]}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0, sig: int = signal.SIGINT) -> tuple[int, str]:
        """SIGINT (Ctrl-C) or SIGTERM, as a user or a supervisor stops it; killed if it has not
        exited within `timeout`. Returns (exit status, stderr); once stopped, a second call returns
        the same."""
        if self.proc.returncode is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._reader.join(10)
                return -9, self.stderr
        self._reader.join(10)
        return self.proc.returncode, self.stderr
