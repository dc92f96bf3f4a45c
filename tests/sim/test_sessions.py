"""Sessions and closed-loop load in the simulator (pagesim.workload.sessions), against timelines
worked out by hand with a constant cost model (every step takes STEP seconds), and closed-loop
invariants checked on the records alone."""

from __future__ import annotations

import random

import pytest

from pagesim.sim.cost import ConstantCostModel
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, TraceRequest, dumps_trace, parse_trace

STEP = 0.01


def ids(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def two_sessions() -> Trace:
    """A: turn 0 at 0 (10 + 3 tokens), turn 1 0.5 s after it ends (13 + 4 new, output 2).
    B: turn 0 at 0.015 (5 + 2 tokens), turn 1 with no think time: the recorded gap, 1.0 - 0.015.
    Recorded replies are ids 900.. (the simulator's own output replaces them)."""
    a0 = ids(100, 10)
    b0 = ids(200, 5)
    a1 = a0 + ids(900, 3) + ids(300, 4)
    b1 = b0 + ids(950, 2) + ids(400, 3)
    return Trace({}, [
        TraceRequest(10, 3, arrival_time=0.0, session_id="A", turn=0, prompt_token_ids=a0),
        TraceRequest(5, 2, arrival_time=0.015, session_id="B", turn=0, prompt_token_ids=b0),
        TraceRequest(17, 2, arrival_time=0.2, session_id="A", turn=1, think_time=0.5, prompt_token_ids=a1),
        TraceRequest(10, 1, arrival_time=1.0, session_id="B", turn=1, prompt_token_ids=b1),
    ])


def run(trace: Trace, fast: bool = True, **options):
    cfg = ReplayConfig(**{"rate": None, "num_requests": len(trace), "block_size": 4, **options})
    sim = Replay(cfg, trace, cost_model=ConstantCostModel(STEP), fast_forward=fast)
    return {r.request_id: r for r in sim.run().metrics.requests}


@pytest.mark.parametrize("fast", [True, False])
def test_release_order_and_timing_by_hand(fast):
    # Steps of 0.01 s; a waiting prompt runs in a step of its own (prefills first, as vLLM v0):
    # [0, .01] A0 prefill (first token) | [.01, .02] A0 decode | B0 arrives at .015
    # [.02, .03] B0 prefill | [.03, .04] A0 + B0 decode: A0 has 3 tokens, B0 2: both end at .04
    # A1 sent at .04 + .5 = .54: prefill [.54, .55], decode [.55, .56]
    # B1 sent at .04 + (1.0 - .015) = 1.025: prefill [1.025, 1.035], its only token
    records = run(two_sessions(), fast)
    expected = {0: (0.0, 0.01, 0.04), 1: (0.015, 0.03, 0.04), 2: (0.54, 0.55, 0.56), 3: (1.025, 1.035, 1.035)}
    for rid, (sent, first, end) in expected.items():
        r = records[rid]
        assert r.status == "finished"
        assert (r.arrival_time, r.first_token_time, r.finish_time) == pytest.approx((sent, first, end)), rid
    assert [(records[i].session_id, records[i].turn) for i in range(4)] == [("A", 0), ("B", 0), ("A", 1), ("B", 1)]
    # the sent prompt: the turn's prompt, its own output, the new tokens (the record's lengths here)
    assert [records[i].prompt_len for i in range(4)] == [10, 5, 17, 10]


def test_later_turns_hit_the_previous_turns_prompt_and_output():
    # block size 4. A0 holds 13 tokens, 12 computed: 3 full blocks cached (2 of its prompt at
    # prefill, the third, which holds its generated tokens, when it ends). A1 (17 tokens) may hit
    # (17 - 1) // 4 = 4 blocks and finds those 3: 12 tokens. B0: 7 tokens, 6 computed, 1 block;
    # B1 (10 tokens) finds it: 4. Without prefix caching: none.
    cached = run(two_sessions(), prefix_caching=True)
    assert [cached[i].cached_prompt_tokens for i in range(4)] == [0, 0, 12, 4]
    assert [r.cached_prompt_tokens for r in run(two_sessions()).values()] == [0, 0, 0, 0]


def test_a_failed_turn_ends_its_session_with_a_reason():
    # max_model_len 20: C's turn 1 (14 + 7 new = 21 tokens, output 1) can never run; turn 2 is
    # turned away with that reason the moment turn 1 is rejected; session D is unaffected.
    trace = Trace({}, [
        TraceRequest(10, 4, arrival_time=0.0, session_id="C", turn=0),
        TraceRequest(5, 2, arrival_time=0.0, session_id="D", turn=0),
        TraceRequest(21, 1, arrival_time=0.5, session_id="C", turn=1, think_time=0.1),
        TraceRequest(23, 1, arrival_time=0.6, session_id="C", turn=2, think_time=0.1),
    ])
    records = run(trace, max_model_len=20)
    assert [records[i].status for i in range(4)] == ["finished", "finished", "rejected", "rejected"]
    assert "exceeds max_model_len 20" in records[2].reject_reason
    assert records[3].reject_reason.startswith("session C ended: turn 1 (request 2) failed: prompt 21")
    assert records[3].arrival_time == records[2].arrival_time == pytest.approx(records[0].finish_time + 0.1)


def random_trace(n: int, seed: int) -> Trace:
    rng = random.Random(seed)
    return Trace({}, [TraceRequest(rng.randrange(1, 200), rng.randrange(1, 60), arrival_time=0.0) for _ in range(n)])


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_closed_loop_never_exceeds_n_and_never_idles_a_client(concurrency):
    records = list(run(random_trace(40, concurrency), concurrency=concurrency, block_size=16).values())
    assert len(records) == 40 and all(r.status == "finished" for r in records)
    events = sorted([(r.arrival_time, 1) for r in records] + [(r.finish_time, -1) for r in records],
                    key=lambda e: (e[0], e[1]))  # at a tie, the end first: its client sends the next
    in_flight = 0
    for _, change in events:
        in_flight += change
        assert in_flight <= concurrency
    # no idle client: the first N are sent at time zero, every later one the instant one ended
    arrivals = sorted(r.arrival_time for r in records)
    finishes = sorted(r.finish_time for r in records)
    assert arrivals[:concurrency] == [0.0] * concurrency
    assert arrivals[concurrency:] == finishes[:40 - concurrency]


def test_closed_loop_over_sessions_keeps_n_sessions_going():
    # 4 sessions of 3 turns, 2 clients: a client runs a session's turns (with their think times)
    # and takes the next session when its last turn ends
    requests = []
    for s in range(4):
        prompt = 8
        for k in range(3):
            requests.append(TraceRequest(prompt, 4, session_id=s, turn=k, think_time=0.05 if k else None))
            prompt += 4 + 8
    trace = parse_trace(dumps_trace(Trace({}, requests)))
    records = sorted(run(trace, concurrency=2, rate=1.0).values(), key=lambda r: r.arrival_time)
    by_session = {}
    for r in records:
        by_session.setdefault(r.session_id, []).append(r)
    spans = sorted((rs[0].arrival_time, rs[-1].finish_time) for rs in by_session.values())
    assert spans[0][0] == spans[1][0] == 0.0  # two sessions start at once
    # each later session starts when an earlier one ended
    ends = sorted(end for _, end in spans)
    assert [start for start, _ in spans[2:]] == ends[:2]
    for rs in by_session.values():
        assert [r.turn for r in rs] == [0, 1, 2]
        for before, after in zip(rs, rs[1:]):
            assert after.arrival_time == pytest.approx(before.finish_time + 0.05)


def test_session_reuse_reports_later_turns_with_and_without_the_cache():
    from pagesim.sim.session_reuse import session_reuse

    # two_sessions on OPT-13B's roofline costs (a cached prompt token is not computed): the later
    # turns' 27 prompt tokens, of which the cache serves 12 + 4 (test above), so 16 / 27
    off, on = session_reuse(two_sessions(), model="opt-13b", gpu="a100-40gb", cost_model="roofline", rate=None,
                            block_size=4)
    assert (off.prefix_caching, on.prefix_caching) == (False, True)
    assert off.later_turns.count == on.later_turns.count == 2 and on.first_turns.count == 2
    assert off.later_turns_cached_share == 0.0 and on.later_turns_cached_share == pytest.approx(16 / 27)
    assert off.prefix_hit_rate is None and on.prefix_hit_rate > 0
    assert on.later_turns.ttft_mean < off.later_turns.ttft_mean
    assert on.first_turns.ttft_mean == pytest.approx(off.first_turns.ttft_mean)  # nothing to reuse yet
    small = session_reuse(two_sessions(), [64], cost_model="roofline", rate=None, block_size=4)[1]
    assert small.num_gpu_blocks == 64
