"""The least-loaded routers: least outstanding requests (the router's own count of requests sent
and not ended, always current: what vLLM production-stack's and SGLang's routers balance on),
and least KV cache usage (the servers' reported vllm:kv_cache_usage_perc, as stale as the board
keeps it; llm-d's kv-cache-utilization scorer alone). Ties go to the fewest outstanding, then to
the lowest index, so the choice is deterministic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router, least, register


@register
@dataclass
class LeastOutstanding(Router):
    name = "least-outstanding"

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        return least(replicas, lambda r: r.outstanding)


@register
@dataclass
class LeastKVUsage(Router):
    name = "least-kv"

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        # stale usage alone would send a burst to one replica until the next refresh: the
        # router's own current count breaks the tie between equal readings
        return least(replicas, lambda r: (r.kv_usage, r.outstanding))
