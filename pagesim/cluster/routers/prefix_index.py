"""What a prefix-aware router believes each replica has cached: for each replica, the block keys
of the prompts it routed there, in least-recently-routed order and bounded in size (the
approximate index of the gateway-api-inference-extension / llm-d prefix-cache scorer: a per-
server LRU of block hashes, 31,250 entries by default). It learns only from its own routing, so
it is approximate: it does not see a server evict a block, or a restart."""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable, Sequence


class PrefixIndex:
    def __init__(self, capacity_blocks: int):
        self.capacity_blocks = capacity_blocks
        self._blocks: dict[int, OrderedDict[Hashable, None]] = {}

    def matched(self, index: int, keys: Sequence[Hashable]) -> int:
        """How many leading keys replica `index` is believed to hold (a chained key missing
        ends the match: the blocks after it cannot be used without it)."""
        held = self._blocks.get(index)
        if not held:
            return 0
        count = 0
        for key in keys:
            if key not in held:
                break
            count += 1
        return count

    def size(self, index: int) -> int:
        """Blocks believed cached on replica `index`."""
        return len(self._blocks.get(index, ()))

    def add(self, index: int, keys: Sequence[Hashable]) -> None:
        """The keys were routed to replica `index`: they become its most recent; the least
        recent beyond capacity are forgotten."""
        held = self._blocks.setdefault(index, OrderedDict())
        for key in keys:
            held[key] = None
            held.move_to_end(key)
        while len(held) > self.capacity_blocks:
            held.popitem(last=False)
