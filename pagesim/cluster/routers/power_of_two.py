"""Power of two choices (Mitzenmacher, "The Power of Two Choices in Randomized Load Balancing",
2001): draw two distinct accepting replicas from a seeded generator and send the request to the
less loaded of the two (the first drawn on a tie); with one accepting replica, that one. `load`
names what is compared: outstanding (the router's own count, default), waiting, queue
(waiting + running) or kv (KV cache usage)."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import (ReplicaLoad, RoutedRequest, Router, accepting, check_load, check_number,
                                          register)


@register
@dataclass
class PowerOfTwo(Router):
    name = "power-of-two"
    seed: int = 0
    load: str = "outstanding"
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self):
        check_number(self.name, "seed", self.seed, lo=-2**63, integer=True)
        self._load = check_load(self.name, self.load)
        self._rng = random.Random(self.seed)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        ready = accepting(replicas)
        if len(ready) == 1:
            return ready[0].index
        first, second = (ready[i] for i in self._rng.sample(range(len(ready)), 2))
        return second.index if self._load(second) < self._load(first) else first.index
