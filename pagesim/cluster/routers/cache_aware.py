"""Cache-aware routing as SGLang's router (sgl-router, now sgl-model-gateway) does it, over block
keys instead of its character tree. Loads are the router's own outstanding counts. The fleet is
imbalanced when max - min > balance_abs_threshold and max > balance_rel_threshold * min; then the
request goes to the least loaded replica. Otherwise it goes to the replica holding the longest
believed-cached prefix (PrefixIndex) if that covers more than cache_threshold of the prompt's
full blocks, else to the replica believed to hold the fewest blocks (the most room for a new
prefix). Ties go to the lowest index. The routed prompt's blocks are recorded as the chosen
replica's. Defaults: sglang_router's RouterArgs (cache_threshold 0.3, balance_abs_threshold 64,
balance_rel_threshold 1.5)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, accepting, check_number, register
from pagesim.cluster.routers.prefix_index import PrefixIndex


@register
@dataclass
class CacheAware(Router):
    name = "cache-aware"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    capacity_blocks: int = 31_250
    _index: PrefixIndex = field(init=False, repr=False)

    def __post_init__(self):
        check_number(self.name, "cache_threshold", self.cache_threshold)
        check_number(self.name, "balance_abs_threshold", self.balance_abs_threshold, integer=True)
        check_number(self.name, "balance_rel_threshold", self.balance_rel_threshold)
        check_number(self.name, "capacity_blocks", self.capacity_blocks, lo=1, integer=True)
        self._index = PrefixIndex(self.capacity_blocks)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        ready = accepting(replicas)
        low = min(r.outstanding for r in ready)
        high = max(r.outstanding for r in ready)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            return min(ready, key=lambda r: (r.outstanding, r.index)).index
        keys = request.prefix_keys
        if keys:
            best = min(ready, key=lambda r: (-self._index.matched(r.index, keys), r.index))
            if self._index.matched(best.index, keys) / len(keys) > self.cache_threshold:
                return best.index
        return min(ready, key=lambda r: (self._index.size(r.index), r.index)).index

    def on_routed(self, request: RoutedRequest, index: int, now: float) -> None:
        self._index.add(index, request.prefix_keys)
