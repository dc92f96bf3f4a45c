"""A task for the plan workers in tests (a module they can import by name: test modules they cannot)."""

from __future__ import annotations

import time
from pathlib import Path


def rendezvous(task: tuple[str, str]) -> str:
    """("first", dir): answers at once; ("a" or "b", dir): waits until the other has started too."""
    name, directory = task
    if name == "first":
        return "first"
    Path(directory, name).touch()
    deadline = time.monotonic() + 60
    while not all(Path(directory, other).exists() for other in ("a", "b")):
        if time.monotonic() > deadline:
            return "alone"
        time.sleep(0.05)
    return "together"
