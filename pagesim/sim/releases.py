"""Waiting on a feed's next release, on a SimPy clock: one piece of code for the single replay's
arrivals process and the cluster's router process."""

from __future__ import annotations

import math
from heapq import heappush

import simpy
from simpy.events import NORMAL

from pagesim.workload.feeds import Feed


class Releases:
    """wait() returns once the feed's next request is due (after the host time per request), or
    False once the feed is exhausted. A dynamic feed (sessions, closed loop) may release a request
    sooner than the one waited for, when an end releases it: whoever tells the feed of ends calls
    on_finished() here, which wakes the waiter."""

    def __init__(self, feed: Feed, host_s: float) -> None:
        self.feed, self.host_s = feed, host_s
        self._woken: simpy.Event | None = None

    def wait(self, env: simpy.Environment):
        feed, host_s = self.feed, self.host_s
        while not feed.exhausted:
            released = feed.next_time()
            if not feed.static:
                self._woken = env.event()
                if released == math.inf:
                    yield self._woken
                    continue
                if released + host_s > env.now:
                    yield self._woken | event_at(env, released + host_s)
                    continue
            elif released + host_s > env.now:
                yield event_at(env, released + host_s)  # (then due: no second look at the clock)
            return True
        return False

    def on_finished(self, request, now: float, outcome) -> None:
        """Tell the feed of an end, and wake the waiter if that released a request."""
        self.feed.on_finished(request, now, outcome)
        woken = self._woken
        if woken is not None and not woken.triggered and self.feed.next_time() < math.inf:
            woken.succeed()


def event_at(env: simpy.Environment, t: float) -> simpy.Event:
    """An event that fires at exactly t (now, if t has passed). A timeout fires at now + delay,
    which floating point cannot always make equal to t (see pagesim.sim.run_times.delay_to), so two
    clocks reaching t by different paths (a replica's own arrivals, a router's releases for many
    replicas) would read differently by an ulp. This event is put on the environment's queue at t
    itself, as Environment.schedule puts a timeout at now + delay (simpy 4's queue entries:
    time, priority, id, event; tests/sim/test_releases.py checks it)."""
    event = simpy.Event(env)
    event._ok, event._value = True, None  # (triggered, as a timeout is from the start)
    heappush(env._queue, (max(t, env.now), NORMAL, next(env._eid), event))
    return event
