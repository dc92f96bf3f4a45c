"""Session affinity: every turn of a session goes to the replica its first turn went to, where
its history's KV is cached (vLLM production-stack's session router, by a session key). A request
without a session, a session's first turn, and a turn whose replica is not accepting go to the
`fallback` router (least outstanding by default); in the last case the session moves to the
replica the fallback picks. At most max_sessions sessions are remembered (the least recently
routed is forgotten first)."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Hashable, Sequence

from pagesim.cluster.routers.base import (ROUTERS, ReplicaLoad, RoutedRequest, Router, accepting, check_number,
                                          make_router, register)


@register
@dataclass
class SessionAffinity(Router):
    name = "session-affinity"
    fallback: str = "least-outstanding"
    max_sessions: int = 100_000
    _fallback: Router = field(init=False, repr=False)
    _sessions: OrderedDict[Hashable, int] = field(init=False, repr=False)

    def __post_init__(self):
        if self.fallback == self.name or self.fallback not in ROUTERS:
            raise ValueError(f"router {self.name!r}: fallback must be another router "
                             f"({', '.join(sorted(set(ROUTERS) - {self.name}))}), got {self.fallback!r}")
        check_number(self.name, "max_sessions", self.max_sessions, lo=1, integer=True)
        self._fallback = make_router(self.fallback)
        self._sessions = OrderedDict()

    def choose(self, request: RoutedRequest, replicas: Sequence[ReplicaLoad], now: float) -> int:
        pinned = self._sessions.get(request.session_id) if request.session_id is not None else None
        if pinned is not None and any(r.index == pinned for r in accepting(replicas)):
            return pinned
        return self._fallback.choose(request, replicas, now)

    def on_routed(self, request: RoutedRequest, index: int, now: float) -> None:
        self._fallback.on_routed(request, index, now)
        if request.session_id is not None:
            self._sessions[request.session_id] = index
            self._sessions.move_to_end(request.session_id)
            if len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)

    def on_finished(self, request_id: int, index: int, now: float) -> None:
        self._fallback.on_finished(request_id, index, now)
