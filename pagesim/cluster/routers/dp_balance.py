"""vLLM's data-parallel load balancer: the front end of a DP deployment (`--data-parallel-size`)
sends each request to the rank with the least `waiting * 4 + running` (a queued request weighs four
running ones: it is what delays a first token), scanning from its own start index so that equal
scores spread, and counts the chosen rank one more waiting request until the next stats update
(the DP coordinator publishes the ranks' counts every 100 ms: `--staleness 0.1`).
Source: vllm-project/vllm, vllm/v1/engine/core_client.py, DPLBAsyncMPClient.get_core_engine_for_request
(read through the search tool; this is our own code). One front end: start index 0, count 1."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, accepting, register

WAITING_WEIGHT = 4


@register
@dataclass
class DPBalance(Router):
    name = "dp-balance"
    _added: dict[int, tuple[float, int]] = field(default_factory=dict, init=False, repr=False)  # index -> (info_time, n)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        best, best_score = None, None
        for r in accepting(replicas):  # (in order: strict < keeps the first of equal scores)
            score = (r.waiting + self._pending(r)) * WAITING_WEIGHT + r.running
            if best_score is None or score < best_score:
                best, best_score = r, score
        since, added = self._added.get(best.index, (best.info_time, 0))
        self._added[best.index] = (best.info_time, added + 1 if since == best.info_time else 1)
        return best.index

    def _pending(self, r: ReplicaLoad) -> int:
        """Requests sent to r since its counts were read (forgotten once they are read again)."""
        since, added = self._added.get(r.index, (None, 0))
        return added if since == r.info_time else 0
