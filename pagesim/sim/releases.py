"""Waiting on a feed's next release, on a SimPy clock: one piece of code for the single replay's
arrivals process and the cluster's router process."""

from __future__ import annotations

import math

import simpy

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
                    yield self._woken | env.timeout(released + host_s - env.now)
                    continue
            elif released + host_s > env.now:
                # exactly then (then due: no second look at the clock), so the clock reads the same
                # whatever waited before (a replica's own arrivals, or a router's for many replicas)
                yield env.timeout(delay_to(env.now, released + host_s))
            return True
        return False

    def on_finished(self, request, now: float, outcome) -> None:
        """Tell the feed of an end, and wake the waiter if that released a request."""
        self.feed.on_finished(request, now, outcome)
        woken = self._woken
        if woken is not None and not woken.triggered and self.feed.next_time() < math.inf:
            woken.succeed()


def delay_to(now: float, target: float) -> float:
    """A delay d with now + d == target exactly in floating point where one exists: a run of steps
    then ends at the very instant successive per-step timeouts would have reached, and a request
    enters at its own time whatever the clock read before. Callers that need exactness check: with now = 0.2576791932492309 and target = 0.955369406414677 every delay rounds past
    the target (ties to even), and none exists."""
    delay = target - now
    while now + delay < target:
        delay = math.nextafter(delay, math.inf)
    while now + delay > target:
        delay = math.nextafter(delay, -math.inf)
    return delay
