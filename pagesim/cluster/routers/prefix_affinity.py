"""Prefix affinity, scored as llm-d's inference scheduler scores endpoints (the gateway-api-
inference-extension's prefix-cache, queue and kv-cache-utilization scorers, summed with weights,
highest total picked): for each accepting replica r,

    score(r) = prefix_weight * matched(r) / blocks      matched: leading blocks of the prompt r is
             + load_weight   * (max - load(r)) / (max - min)      believed to hold (PrefixIndex)
             + kv_weight     * (1 - kv_usage(r))

with blocks = the prompt's full blocks (at most max_blocks_to_match), the load term 1 on every
replica when all loads are equal, and the prefix term 0 for a prompt with no full block. Ties go
to the replica believed to hold the fewest blocks (SGLang's router sends unmatched prompts to the
smallest tree: new prefixes spread out), then to the lowest index. The routed prompt's blocks are
recorded as the chosen replica's.

Defaults: llm-d's weights (prefix 3, queue 2, kv-cache-utilization 2, in its default scheduling
profile) and index size (31,250 blocks per server, 256 blocks matched at most). llm-d's queue
scorer reads the server's waiting queue; the default load here is the router's own outstanding
count, which is never stale (load="waiting" gives llm-d's)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import (ReplicaLoad, RoutedRequest, Router, accepting, check_load, check_number,
                                          register)
from pagesim.cluster.routers.prefix_index import PrefixIndex


@register
@dataclass
class PrefixAffinity(Router):
    name = "prefix-affinity"
    prefix_weight: float = 3.0
    load_weight: float = 2.0
    kv_weight: float = 2.0
    load: str = "outstanding"
    capacity_blocks: int = 31_250
    max_blocks_to_match: int = 256
    _index: PrefixIndex = field(init=False, repr=False)

    def __post_init__(self):
        for name in ("prefix_weight", "load_weight", "kv_weight"):
            check_number(self.name, name, getattr(self, name))
        for name in ("capacity_blocks", "max_blocks_to_match"):
            check_number(self.name, name, getattr(self, name), lo=1, integer=True)
        self._load = check_load(self.name, self.load)
        self._index = PrefixIndex(self.capacity_blocks)

    def scores(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad]) -> dict[int, float]:
        """Each accepting replica's score (index -> score), as choose() ranks them."""
        ready = accepting(replicas)
        keys = request.prefix_keys[:self.max_blocks_to_match]
        loads = [self._load(r) for r in ready]
        low, high = min(loads), max(loads)
        out = {}
        for replica, load in zip(ready, loads):
            prefix = self._index.matched(replica.index, keys) / len(keys) if keys else 0.0
            balance = (high - load) / (high - low) if high > low else 1.0
            out[replica.index] = (self.prefix_weight * prefix + self.load_weight * balance
                                  + self.kv_weight * (1.0 - replica.kv_usage))
        return out

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        scores = self.scores(request, replicas)
        return min(scores, key=lambda i: (-scores[i], self._index.size(i), i))

    def on_routed(self, request: RoutedRequest, index: int, now: float) -> None:
        self._index.add(index, request.prefix_keys[:self.max_blocks_to_match])
