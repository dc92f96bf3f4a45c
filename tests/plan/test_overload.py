"""A run whose queue grows says so (pagesim.plan.overload): against D/D/1 queues whose number in
the system is known by hand, and on replays far above and below a replica's capacity."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.metrics import RequestRecord
from pagesim.plan.overload import overload_note


def dd1(service_s: float, count: int = 2000, gap_s: float = 1.0) -> list[RequestRecord]:
    """One server, arrivals every gap_s, each request served service_s in arrival order: with
    service_s > gap_s the number in the system grows by 1 / gap_s - 1 / service_s per second."""
    records, free_at = [], 0.0
    for i in range(count):
        arrival = i * gap_s
        start = max(arrival, free_at)
        free_at = start + service_s
        records.append(RequestRecord(request_id=i, status="finished", reject_reason="", arrival_time=arrival,
                                     first_scheduled_time=start, first_token_time=start, finish_time=free_at,
                                     prompt_len=10, output_len=10, num_seqs=1, num_preemptions=0, num_swaps=0,
                                     cached_prompt_tokens=0))
    return records


def test_a_queue_growing_by_a_fifth_of_a_request_a_second_is_overloaded():
    note = overload_note(dd1(1.25), {"request_throughput": 0.8, "config": {"rate": 1.0}})
    assert note is not None and note.startswith("overloaded")
    # the slope is 1 - 1 / 1.25 = 0.2 requests/s; the note gives it to 3 digits
    assert "grew by 0.2/s" in note
    assert "1 req/s arriving" in note and "completing 0.8 req/s" in note
    assert "grows as long as the run lasts" in note  # arrivals at a constant rate: the queue keeps growing


def test_with_the_traces_own_times_the_note_states_only_what_was_measured():
    # (a load that itself rises also grows the queue: no claim about longer runs)
    note = overload_note(dd1(1.25), {"config": {"rate": None}})
    assert note.endswith("arrivals outran completions over that window")


def test_a_server_that_keeps_up_gets_no_note():
    assert overload_note(dd1(0.8), {"request_throughput": 1.0}) is None
    # exactly at capacity L stays at one request: flat
    assert overload_note(dd1(1.0), {}) is None


def test_a_run_too_short_to_judge_gets_no_note():
    # 2,000 requests, but each stays 500 s: the window (1,600 s) spans fewer than 8 service times
    records = dd1(1.25)
    slow = [replace(r, first_scheduled_time=r.arrival_time, finish_time=r.arrival_time + 500.0) for r in records]
    assert overload_note(slow, {}) is None
    assert overload_note(dd1(1.25, count=500), {}) is None  # fewer measured requests than the planner needs
    assert overload_note([], {}) is None


@pytest.mark.parametrize("rate, overloaded", [(20.0, True), (1.0, False)])
def test_replay_says_when_its_queue_grew(rate, overloaded):
    # opt-13b on one A100-40GB completes about 3 req/s of ShareGPT
    result = CliRunner().invoke(app, ["replay", "traces/sharegpt.json", "--rate", str(rate), "--num-requests", "3000",
                                      "--json"])
    assert result.exit_code == 0, result.output
    notes = json.loads(result.output)["notes"]
    assert any(n.startswith("overloaded") for n in notes) == overloaded, notes
