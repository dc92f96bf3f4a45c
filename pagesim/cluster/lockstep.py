"""Data-parallel ranks of a MoE model with expert parallelism, stepping together.

In vLLM's DP + EP deployment every rank runs its forward passes in lockstep: each MoE layer's
all-to-all (dispatch before the experts, combine after) joins all ranks, so a step lasts as long
as the slowest rank's, and a rank with nothing to do runs a dummy batch to take part. Here each
rank stays an unchanged replica (its own scheduler and KV cache) and its cost model is wrapped:
a rank's step lasts max(its own time, the own time of every other rank's step in progress when it
starts), each priced by the rank's own cost model on that rank's batch. ("Own": unstretched, so
one long step does not stretch every later one through the chain.) A rank that is idle adds
nothing: its dummy batch is a one-token step, no longer than any real one. The ranks step one at a
time (no fast-forwarded decode runs: another rank's step may start inside one and stretch it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pagesim.sim.cost.base import BatchShape, CostModel


@dataclass
class LockstepGroup:
    """The ranks' latest steps: (start, end, own duration) per rank."""

    num_ranks: int
    latest: list[tuple[float, float, float]] = field(init=False)

    def __post_init__(self) -> None:
        self.latest = [(0.0, 0.0, 0.0)] * self.num_ranks

    def step(self, rank: int, start: float, own: float) -> float:
        """Rank `rank` starts a step of its own duration `own` at `start`: how long it lasts."""
        duration = own
        for other, (s, e, other_own) in enumerate(self.latest):
            if other != rank and s <= start < e:
                duration = max(duration, other_own)
        self.latest[rank] = (start, start + duration, own)
        return duration


class LockstepCost(CostModel):
    """A rank's cost model inside a LockstepGroup (clock(): the simulation's time now)."""

    def __init__(self, inner: CostModel, group: LockstepGroup, rank: int, clock: Callable[[], float]) -> None:
        self.inner, self.group, self.rank, self.clock = inner, group, rank, clock
        self.name = inner.name
        self.request_host_s = inner.request_host_s
        self.output_delay_steps = inner.output_delay_steps

    def iteration_time(self, shape: BatchShape) -> float:
        return self.group.step(self.rank, self.clock(), self.inner.iteration_time(shape))

    def decode_run_durations(self, *args, **kwargs) -> list[float]:
        raise RuntimeError("a lockstep rank steps one at a time (its Replay runs with fast_forward=False)")

    def describe(self) -> dict:
        return {**self.inner.describe(), "lockstep_ranks": self.group.num_ranks}

    def __getattr__(self, name: str):  # what else the replay reads of its cost model (engine profile, ...)
        if name == "inner":  # (not set yet: a copy being built)
            raise AttributeError(name)
        return getattr(self.inner, name)
