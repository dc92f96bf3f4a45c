"""The decode runs a replay takes, kept for a test to look at (the engine's advance_decode wrapped)."""

from __future__ import annotations

from pagesim.sim import engine as engine_module


def runs_taken(monkeypatch) -> list:
    """A list that every DecodeRun the simulator takes from now on (in this test) is appended to."""
    runs = []
    advance = engine_module.advance_decode

    def kept(*args, **kwargs):
        runs.append(advance(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(engine_module, "advance_decode", kept)
    return runs
