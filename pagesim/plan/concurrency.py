"""Capacity under closed-loop load: how many clients (each sending its next request, or session,
the moment its last one ended) one replica serves within the SLOs, and what it then delivers.

Closed loop cannot overload a replica the way a rate can (the queue never holds more than the
clients), so a client count is judged on the SLOs alone: the highest count whose measured requests
meet every SLO is the replica's capacity in clients, found by doubling from 1 and then bisecting
(the SLO values grow with the count: more clients, more batching and queueing). Requests are
measured after the first `warmup_fraction` of them in arrival order (every client starts at once:
the first requests meet an empty engine and then a burst of prompts).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesim.plan.slo import SLO, latency_lists, slo_values
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace


@dataclass
class ConcurrencyPoint:
    concurrency: int
    meets_slos: bool
    values: dict[str, float | None]  # each SLO's measured value
    request_throughput: float
    output_token_throughput: float
    num_rejected: int


@dataclass
class ConcurrencyCapacity:
    concurrency: int | None  # the most clients within the SLOs (None: not even one)
    at_capacity: ConcurrencyPoint | None
    points: list[ConcurrencyPoint]  # every count evaluated, in search order
    capped: bool  # within the SLOs even at max_concurrency

    def replicas_for(self, clients: int) -> int | None:
        """Replicas for `clients` concurrent clients spread evenly (None: no count meets the SLOs)."""
        return None if not self.concurrency else -(-clients // self.concurrency)


def evaluate_concurrency(trace: Trace, cfg: ReplayConfig, concurrency: int, slos: list[SLO],
                         warmup_fraction: float = 0.2) -> ConcurrencyPoint:
    result = Replay(replace(cfg, concurrency=concurrency, warmup_s=0.0), trace, keep_steps=False).run()
    records = sorted(result.metrics.requests, key=lambda r: (r.arrival_time, r.request_id))
    measured = records[int(warmup_fraction * len(records)):]
    values = slo_values(latency_lists(measured), slos)
    s = result.summary
    meets = s["num_rejected"] == 0 and all(slo.holds(values[slo.name]) for slo in slos)
    return ConcurrencyPoint(concurrency, meets, values, s["request_throughput"], s["output_token_throughput"],
                            s["num_rejected"])


def max_concurrency(trace: Trace, cfg: ReplayConfig, slos: list[SLO], max_clients: int = 4096,
                    warmup_fraction: float = 0.2) -> ConcurrencyCapacity:
    """The highest client count within the SLOs (see the module's doc): doubling, then bisection
    between the last count that met them and the first that did not."""
    points: dict[int, ConcurrencyPoint] = {}

    def meets(n: int) -> bool:
        if n not in points:
            points[n] = evaluate_concurrency(trace, cfg, n, slos, warmup_fraction)
        return points[n].meets_slos

    if not meets(1):
        return ConcurrencyCapacity(None, None, list(points.values()), False)
    good = 1
    while good < max_clients and meets(min(2 * good, max_clients)):
        good = min(2 * good, max_clients)
    if good == max_clients:
        return ConcurrencyCapacity(good, points[good], list(points.values()), True)
    bad = min(2 * good, max_clients)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if meets(mid) else (good, mid)
    return ConcurrencyCapacity(good, points[good], list(points.values()), False)
