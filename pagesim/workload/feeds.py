"""Where a run's requests come from, and when each is released to the engine.

A feed hands requests to a driver in release order. The plain one (`RequestFeed`) releases a
trace's requests at their arrival times, all known in advance. Feeds whose releases depend on
the run (sessions: turn k+1 follows turn k's finish; closed loop: a client sends its next request
when its last one ends) learn of each end through `on_finished`, and may release more then.

The simulator asks a feed two things between steps: when the next release is (it bounds a run of
decode steps taken in one go), and whether any will ever come again (the run ends when none will
and everything submitted is done). A feed never releases a request earlier than the time it was
told of the finish that released it, so a driver that asks after every finish never misses one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from pagesim.core import Request


@dataclass(frozen=True)
class Outcome:
    """How a submitted request ended, as a feed that releases on ends needs to know it."""

    failure: str | None = None  # why it did not finish (rejected, aborted); None: finished
    output_len: int = 0  # tokens its first sequence generated
    output_token_ids: list[int] | None = None  # those tokens, where the driver keeps ids


class Feed(Protocol):
    # static: every release time is known before the run (no on_finished can change them)
    static: bool

    def next_time(self) -> float:
        """When the next request is released (math.inf: none is scheduled yet, or none is left)."""

    def pop(self) -> Request:
        """The next request (the one next_time() names), marked released."""

    @property
    def exhausted(self) -> bool:
        """No request will ever be released again."""

    def on_finished(self, request: Request, now: float, outcome: Outcome | None = None) -> None:
        """A submitted request ended at `now` (finished, rejected or aborted)."""

    def reject_reason(self, request: Request) -> str | None:
        """Why a released request is to be turned away unrun (None: submit it); asked once per pop."""


class RequestFeed:
    """A list of requests released at their own arrival times, in list order (sorted by time)."""

    static = True

    def __init__(self, requests: list[Request]) -> None:
        self._requests = requests
        self._next = 0

    def next_time(self) -> float:
        i = self._next
        return self._requests[i].arrival_time if i < len(self._requests) else math.inf

    def pop(self) -> Request:
        request = self._requests[self._next]
        self._next += 1
        return request

    def release_all(self) -> None:
        """Every request left counts as released, none built (a caller that takes their times and
        trace records from the Workload instead: pagesim.cluster.independent)."""
        self._next = len(self._requests)

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self._requests)

    def on_finished(self, request: Request, now: float, outcome: Outcome | None = None) -> None:
        pass

    def reject_reason(self, request: Request) -> str | None:
        return None
