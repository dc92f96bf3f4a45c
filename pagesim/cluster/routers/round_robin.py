"""Round-robin: each request to the next accepting replica in turn (a replica that is not
accepting is skipped, and the turn moves past it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, accepting, register


@register
@dataclass
class RoundRobin(Router):
    name = "round-robin"
    _next: int = 0

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        ready = {r.index for r in accepting(replicas)}
        count = len(replicas)
        for step in range(count):
            index = (self._next + step) % count
            if replicas[index].index in ready:
                self._next = index + 1
                return replicas[index].index
        raise AssertionError("unreachable: accepting() found one")
