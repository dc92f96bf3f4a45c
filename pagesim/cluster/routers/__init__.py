"""Routers: one small module each, one interface (pagesim.cluster.routers.base.Router).

    base.py               RoutedRequest, ReplicaLoad, Router, the registry (make_router)
    board.py              LoadBoard: the replicas' loads as a router sees them (staleness, outstanding)
    keys.py               prefix_keys: a prompt's chained block keys
    prefix_index.py       PrefixIndex: what each replica is believed to have cached (bounded LRU)
    round_robin.py, random_choice.py, least_loaded.py (least-outstanding, least-kv), power_of_two.py,
    prefix_affinity.py (llm-d's weighted scorers), cache_aware.py (SGLang's thresholds),
    dp_balance.py (vLLM's data-parallel balancer: least waiting * 4 + running),
    session_affinity.py
"""

from pagesim.cluster.routers.base import ROUTERS, ReplicaLoad, RoutedRequest, Router, make_router, register
from pagesim.cluster.routers import (cache_aware, dp_balance, least_loaded, power_of_two, prefix_affinity,  # noqa: F401
                                     random_choice, round_robin, session_affinity)  # (each registers itself)
from pagesim.cluster.routers.board import Gauges, LoadBoard
from pagesim.cluster.routers.keys import prefix_keys

__all__ = ["ROUTERS", "Gauges", "LoadBoard", "ReplicaLoad", "RoutedRequest", "Router", "make_router", "prefix_keys",
           "register"]
