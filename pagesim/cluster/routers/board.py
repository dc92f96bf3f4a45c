"""The router's view of the replicas, kept as a real router keeps it: the servers' gauges
(waiting, running, KV usage) read at most every staleness_s seconds, its own outstanding count
always current. The simulated cluster and `pagesim route` both route through a LoadBoard, so a
router sees the same kind of state in both.

Two ways to feed it: pull (the simulator: view(now, read) reads every replica when the last
reading is staleness_s old or more, so a reading's age is below staleness_s, and 0 makes every
view fresh) or push (the real proxy: a scraper calls report() for each backend as its answer
comes). route() and finished() keep the outstanding counts and call the router's hooks, in one
place for both drivers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from pagesim.cluster.routers.base import ReplicaLoad, RoutedRequest, Router


@dataclass(frozen=True, slots=True)
class Gauges:
    """What a server reports about itself (vLLM's /metrics gauges)."""

    waiting: int = 0
    running: int = 0
    kv_usage: float = 0.0


class LoadBoard:
    def __init__(self, replicas: int, staleness_s: float = 0.0):
        if not 0 <= staleness_s < float("inf"):
            raise ValueError(f"staleness_s must be a finite number >= 0, got {staleness_s}")
        self.staleness_s = staleness_s
        self.loads = [ReplicaLoad(index=i) for i in range(replicas)]
        self._read_at: float | None = None  # when the last pull read every replica

    def add_replica(self) -> int:
        """One more replica (autoscaling); its index. It reports zeros until it is read."""
        self.loads.append(ReplicaLoad(index=len(self.loads)))
        return len(self.loads) - 1

    def set_accepting(self, index: int, accepting: bool) -> None:
        self.loads[index].accepting = accepting

    def report(self, index: int, gauges: Gauges, now: float) -> None:
        """Replica `index` reported these gauges at `now` (a scrape answered)."""
        load = self.loads[index]
        load.waiting, load.running, load.kv_usage, load.info_time = gauges.waiting, gauges.running, gauges.kv_usage, now

    def refresh(self, now: float, read: Callable[[int], Gauges]) -> None:
        """Read every replica now."""
        for load in self.loads:
            self.report(load.index, read(load.index), now)
        self._read_at = now

    def view(self, now: float, read: Callable[[int], Gauges] | None = None) -> list[ReplicaLoad]:
        """The loads as the router may see them at `now` (refreshed first through `read` when the
        last reading is staleness_s old). The list is the board's own: read it, do not change it."""
        if read is not None and (self._read_at is None or now - self._read_at >= self.staleness_s):
            self.refresh(now, read)
        return self.loads

    def route(self, router: Router, request: RoutedRequest, now: float, read: Callable[[int], Gauges] | None = None,
              among: Sequence[int] | None = None) -> int:
        """Ask the router (among the given replica indices, default all), count the request as
        outstanding on the chosen replica and tell the router; returns the chosen index."""
        loads = self.view(now, read)
        index = router.choose(request, loads if among is None else [loads[i] for i in among], now)
        self.loads[index].outstanding += 1
        router.on_routed(request, index, now)
        return index

    def finished(self, router: Router, request_id: int, index: int, now: float) -> None:
        """A request routed to `index` ended (finished, failed or aborted)."""
        load = self.loads[index]
        if load.outstanding <= 0:
            raise RuntimeError(f"replica {index}: a request ended that was not outstanding there")
        load.outstanding -= 1
        router.on_finished(request_id, index, now)
