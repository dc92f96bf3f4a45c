"""StagedFeed (pagesim.workload.sessions): a sweep's stages one after another, traced by hand."""

import math

import pytest

from pagesim.core import Request, SamplingParams
from pagesim.workload.feeds import Outcome
from pagesim.workload.sessions import StagedFeed


def requests(ids, times):
    return [Request(i, 10, SamplingParams(max_tokens=2), t) for i, t in zip(ids, times)]


def test_stages_follow_each_other_closed_then_open():
    # stage 0: 2 clients, 3 requests; stage 1: recorded gaps 0.5 and 1.0 s (times 50, 50.5, 51.5)
    feed = StagedFeed([(requests([0, 1, 2], [0, 0, 0]), 2), (requests([3, 4, 5], [50, 50.5, 51.5]), None)], start=0.0)
    assert feed.next_time() == 0.0 and not feed.static
    a, b = feed.pop(), feed.pop()
    assert (a.request_id, b.request_id) == (0, 1) and feed.next_time() == math.inf  # 2 clients: both busy
    feed.on_finished(a, 3.0, Outcome(output_len=2))
    assert feed.next_time() == 3.0  # request 0's client sends the next one at once
    c = feed.pop()
    assert c.request_id == 2 and feed.stage == 0
    feed.on_finished(b, 4.0, Outcome(output_len=2))
    assert feed.next_time() == math.inf and feed.stage == 0  # request 2 still runs: stage 1 waits
    feed.on_finished(c, 7.0, Outcome(failure="rejected: too long"))  # a failure ends it too
    assert feed.stage == 1 and not feed.exhausted
    times = []
    while feed.next_time() < math.inf:
        times.append(feed.next_time())
        feed.pop()
    assert times == pytest.approx([7.0, 7.5, 8.5])  # the recorded gaps, from stage 0's last end
    assert feed.exhausted


def test_an_empty_stage_is_skipped_and_no_stage_is_refused():
    feed = StagedFeed([([], 4), (requests([0], [9.0]), 1)], start=2.0)
    assert feed.next_time() == 2.0 and feed.pop().request_id == 0 and feed.exhausted
    with pytest.raises(ValueError, match="a stage with requests"):
        StagedFeed([([], None)], start=0.0)
