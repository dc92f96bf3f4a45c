"""validate says when the real server held more requests than it could run (pagesim.validate.overload_notes)."""

from __future__ import annotations

from pagesim.realruns.types import RealRequest, RealRun, ServerConfig
from pagesim.validate import overload_notes


def run_of(spans):
    """One request per (arrival, e2e): all succeed, 11 tokens each."""
    requests = [RealRequest(index=i, arrival_s=a, prompt_len=10, output_len=11, generated_len=11, ttft_s=0.1, e2e_s=e)
                for i, (a, e) in enumerate(spans)]
    return RealRun(name="t", source_format="test", path="t.json", server=ServerConfig(), requests=requests, stages=[])


def test_more_requests_held_than_slots_is_noted_with_the_peak():
    # four requests overlap over [3, 4): 0 [0, 10), 1 [1, 5), 2 [2, 4), 3 [3, 6); then 4 alone
    run = run_of([(0, 10), (1, 4), (2, 2), (3, 3), (20, 1)])
    assert run.peak_held() == (4, 3)
    notes = overload_notes(run, slots=2)
    assert len(notes) == 1 and notes[0].startswith("the real server held up to 4 requests (at 3 s), 2 more than its 2")
    assert overload_notes(run, slots=4) == []  # held no more than it could run


def test_a_request_that_leaves_as_another_arrives_is_not_held_with_it():
    run = run_of([(0, 1), (1, 1), (2, 1)])
    assert run.peak_held() == (1, 0)
    assert overload_notes(run, slots=1) == []
