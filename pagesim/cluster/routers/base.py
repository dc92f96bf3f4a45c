"""The one interface every router implements, and what it may look at.

A router sees what a real one in front of real servers can see: per replica, the load the
server reports (waiting and running requests, KV cache usage: vLLM's /metrics gauges), possibly a
little stale, and its own count of requests it sent there that have not ended yet (always
current: the router proxies them). It also remembers what it routed (prefixes, sessions) through
on_routed / on_finished. It never reads a replica's scheduler or block tables directly, so a
decision made in the simulator is one a real router could make.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Hashable, Sequence


@dataclass(frozen=True, slots=True)
class RoutedRequest:
    """What a router knows of a request when it routes it."""

    request_id: int
    prompt_len: int
    # chained keys of the prompt's full blocks (pagesim.core.paged.block_hashes over the token ids,
    # or over the prompt's text where only text is known); empty when the prompt is lengths only
    prefix_keys: tuple[Hashable, ...] = ()
    session_id: Hashable | None = None


@dataclass(slots=True)
class ReplicaLoad:
    """One replica as the router sees it. The cluster (simulated) or the proxy (real) fills it."""

    index: int
    waiting: int = 0  # requests queued, not running (vllm:num_requests_waiting)
    running: int = 0  # requests running (vllm:num_requests_running)
    kv_usage: float = 0.0  # share of the KV cache in use, 0..1 (vllm:kv_cache_usage_perc)
    outstanding: int = 0  # sent there by this router and not ended yet (the router's own count)
    accepting: bool = True  # healthy, and of the role the request needs (prefill / decode / both)
    info_time: float = 0.0  # when waiting/running/kv_usage were read (they may be stale)


@dataclass
class Router:
    """Base class: choose() picks an index into the replicas it is given (only accepting ones
    may be picked); the hooks let a router remember what it routed."""

    name: ClassVar[str] = ""
    params: dict[str, Any] = field(default_factory=dict, repr=False)

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        raise NotImplementedError

    def on_routed(self, request: RoutedRequest, index: int, now: float) -> None:
        """The request was sent to replica `index`."""

    def on_finished(self, request_id: int, index: int, now: float) -> None:
        """A request routed to replica `index` ended (finished, failed or aborted)."""


ROUTERS: dict[str, type[Router]] = {}


def register(cls: type[Router]) -> type[Router]:
    """Class decorator: make a router available by its name (--router NAME, cluster files)."""
    if not cls.name or cls.name in ROUTERS:
        raise ValueError(f"router name {cls.name!r} missing or taken")
    ROUTERS[cls.name] = cls
    return cls


def make_router(name: str, **params: Any) -> Router:
    """A router by name, with its parameters (each router's dataclass fields)."""
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; one of: {', '.join(sorted(ROUTERS))}") from None
    return cls(**params)


def accepting(replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    """The replicas a request may go to; a router called with none is a caller's bug."""
    ready = [r for r in replicas if r.accepting]
    if not ready:
        raise RuntimeError("no replica is accepting requests")
    return ready
