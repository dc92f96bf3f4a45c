"""Random: each request to an accepting replica drawn uniformly, from a seeded generator (the
same seed and the same requests give the same choices)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, accepting, check_number, register


@register
@dataclass
class RandomRouter(Router):
    name = "random"
    reads_load = False
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        check_number(self.name, "seed", self.seed, lo=-2**63, integer=True)
        self._rng = random.Random(self.seed)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        ready = accepting(replicas)
        return ready[self._rng.randrange(len(ready))].index
