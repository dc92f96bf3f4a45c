"""Feeds whose releases depend on the run (pagesim.workload.feeds): the replay asks them when the
next request comes and tells them of every end. A chain feed (request k+1 sent a fixed think time
after request k ended) is checked against its timeline worked out by hand, with and without the
decode fast path, and the plain feed against the trace's own arrival times."""

from __future__ import annotations

import math

import pytest

from pagesim.core import Request
from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig, shared_workload
from pagesim.workload.trace import Trace, TraceRequest

STEP = 0.01


class ChainFeed:
    """Request k+1 is released `think` seconds after request k ends (a one-client closed loop)."""

    static = False

    def __init__(self, requests: list[Request], think: float) -> None:
        self.requests, self.think = requests, think
        self.released = 0
        self.due = requests[0].arrival_time  # release time of the next, or inf while one is out

    def next_time(self) -> float:
        return self.due if self.released < len(self.requests) else math.inf

    def pop(self) -> Request:
        request = self.requests[self.released]
        request.arrival_time = self.due
        self.released += 1
        self.due = math.inf
        return request

    @property
    def exhausted(self) -> bool:
        return self.released >= len(self.requests)

    def on_finished(self, request: Request, now: float, outcome=None) -> None:
        self.due = now + self.think

    def reject_reason(self, request: Request) -> None:
        return None


def _trace(n: int) -> Trace:
    return Trace({}, [TraceRequest(prompt_len=10, output_len=5, arrival_time=0.0) for _ in range(n)])


@pytest.mark.parametrize("fast", [True, False])
def test_chain_feed_timeline_by_hand(fast):
    # Each request: a prefill step (first token) and 4 decode steps = 5 steps of 0.01 s. Request 0
    # is sent at 0 and ends at 0.05; request 1 is sent at 0.05 + 0.5 = 0.55 and ends at 0.60; ...
    cfg = ReplayConfig(rate=None, num_requests=3)
    workload = shared_workload(cfg, _trace(3))
    sim = Replay(cfg, _trace(3), cost_model=ConstantCostModel(STEP), fast_forward=fast,
                 feed=ChainFeed(workload[0], think=0.5), requests=workload)
    result = sim.run()
    records = sorted(result.metrics.requests, key=lambda r: r.request_id)
    assert [r.status for r in records] == ["finished"] * 3
    for k, record in enumerate(records):
        sent = k * (5 * STEP + 0.5)
        assert record.arrival_time == pytest.approx(sent)
        assert record.first_token_time == pytest.approx(sent + STEP)
        assert record.finish_time == pytest.approx(sent + 5 * STEP)


def test_chain_feed_wakes_an_idle_engine_at_once_with_no_think_time():
    cfg = ReplayConfig(rate=None, num_requests=4)
    workload = shared_workload(cfg, _trace(4))
    sim = Replay(cfg, _trace(4), cost_model=ConstantCostModel(STEP), feed=ChainFeed(workload[0], think=0.0),
                 requests=workload)
    records = sorted(sim.run().metrics.requests, key=lambda r: r.request_id)
    assert [r.finish_time for r in records] == pytest.approx([0.05, 0.10, 0.15, 0.20])


def test_plain_feed_releases_at_the_traces_times():
    trace = Trace({}, [TraceRequest(prompt_len=10, output_len=2, arrival_time=t) for t in (0.0, 0.3, 0.31)])
    result = Replay(ReplayConfig(rate=None, num_requests=3), trace, cost_model=ConstantCostModel(STEP)).run()
    records = sorted(result.metrics.requests, key=lambda r: r.request_id)
    assert [r.arrival_time for r in records] == [0.0, 0.3, 0.31]
    assert [r.first_token_time for r in records] == pytest.approx([0.01, 0.31, 0.32])
