"""The one interface every router implements, and what it may look at.

A router sees what a real one in front of real servers can see: per replica, the load the
server reports (waiting and running requests, KV cache usage: vLLM's /metrics gauges), possibly a
little stale (pagesim.cluster.routers.board.LoadBoard keeps them so), and its own count of
requests it sent there that have not ended yet (always current: the router proxies them). It also
remembers what it routed (prefixes, sessions) through on_routed / on_finished. It never reads a
replica's scheduler or block tables directly, so a decision made in the simulator is one a real
router could make.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Hashable, Sequence


@dataclass(slots=True)
class RoutedRequest:
    """What a router knows of a request when it routes it (routers read it, never change it; not
    frozen: a cluster routes millions, and a frozen dataclass is three times as slow to build, its
    fields set through object.__setattr__)."""

    request_id: int
    prompt_len: int
    # chained keys of the prompt's full blocks (pagesim.cluster.routers.keys.prefix_keys: token
    # ids, or a text prompt's characters); empty when the prompt is lengths only
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


# The loads a load-aware router can be told to compare (its `load` parameter): the router's own
# count is current; the server-reported ones are as stale as the board keeps them.
LOADS: dict[str, Callable[[ReplicaLoad], float]] = {
    "outstanding": lambda r: r.outstanding,
    "waiting": lambda r: r.waiting,
    "queue": lambda r: r.waiting + r.running,
    "kv": lambda r: r.kv_usage,
}


def check_load(router: str, load: str) -> Callable[[ReplicaLoad], float]:
    """The load function a router's `load` parameter names (ValueError naming it otherwise)."""
    if load not in LOADS:
        raise ValueError(f"router {router!r}: load must be one of {', '.join(LOADS)}, got {load!r}")
    return LOADS[load]


@dataclass
class Router:
    """Base class: choose() picks a replica among those it is given (only accepting ones may be
    picked) and returns that ReplicaLoad's `index`; the hooks let a router remember what it
    routed. A router's parameters are its public dataclass fields (make_router checks the names);
    its private state is in fields named with a leading underscore, set in __post_init__."""

    name: ClassVar[str] = ""
    # False: choose() reads none of the loads, only which replicas accept (round-robin, random): what
    # one replica does then never changes where another's requests go (pagesim.cluster.independent)
    reads_load: ClassVar[bool] = True

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        raise NotImplementedError

    def on_routed(self, request: RoutedRequest, index: int, now: float) -> None:
        """The request was sent to replica `index`."""

    def on_finished(self, request_id: int, index: int, now: float) -> None:
        """A request routed to replica `index` ended (finished, failed or aborted)."""

    @property
    def params(self) -> dict[str, Any]:
        """The parameters this router was made with (for reports and logs)."""
        return {f.name: getattr(self, f.name) for f in parameters(type(self))}


def parameters(cls: type[Router]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")]


ROUTERS: dict[str, type[Router]] = {}


def register(cls: type[Router]) -> type[Router]:
    """Class decorator: make a router available by its name (--router NAME, cluster files)."""
    if not cls.name or cls.name in ROUTERS:
        raise ValueError(f"router name {cls.name!r} missing or taken")
    ROUTERS[cls.name] = cls
    return cls


def make_router(name: str, **params: Any) -> Router:
    """A router by name, with its parameters (each router's public dataclass fields). ValueError
    names an unknown router, an unknown parameter or a bad value."""
    try:
        cls = ROUTERS[name]
    except KeyError:
        raise ValueError(f"unknown router {name!r}; one of: {', '.join(sorted(ROUTERS))}") from None
    known = {f.name for f in parameters(cls)}
    for key in params:
        if key not in known:
            raise ValueError(f"router {name!r} has no parameter {key!r}; its parameters: "
                             f"{', '.join(sorted(known)) or 'none'}")
    return cls(**params)


def accepting(replicas: Sequence[ReplicaLoad]) -> list[ReplicaLoad]:
    """The replicas a request may go to; a router called with none is a caller's bug."""
    ready = [r for r in replicas if r.accepting]
    if not ready:
        raise RuntimeError("no replica is accepting requests")
    return ready


def least(replicas: Sequence[ReplicaLoad], load: Callable[[ReplicaLoad], float]) -> int:
    """The index of the accepting replica with the least load; ties go to the lowest index."""
    return min(accepting(replicas), key=lambda r: (load(r), r.index)).index


def check_number(router: str, name: str, value: Any, lo: float = 0.0, integer: bool = False) -> None:
    """ValueError naming the router and parameter unless value is a finite number >= lo."""
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not lo <= value < float("inf"):
        what = "an integer" if integer else "a finite number"
        raise ValueError(f"router {router!r}: {name} must be {what} >= {lo:g}, got {value!r}")
