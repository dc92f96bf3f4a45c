"""Round-robin: each request to the next accepting replica in turn (a replica that is not
accepting is skipped, and the turn moves past it). The turn is a position in the list of
replicas the router is given, so a caller that gives it a different list (a role's replicas, a
grown fleet) keeps the rotation going over that list."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, accepting, register


@register
@dataclass
class RoundRobin(Router):
    name = "round-robin"
    reads_load = False
    _next: int = field(default=0, init=False, repr=False)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        count = len(replicas)
        for step in range(count):
            position = (self._next + step) % count
            if replicas[position].accepting:
                self._next = position + 1
                return replicas[position].index
        accepting(replicas)  # (none accepts: the caller's bug, named there)
        raise AssertionError("unreachable: accepting() raises when no replica accepts")
