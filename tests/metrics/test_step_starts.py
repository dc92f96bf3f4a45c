"""StepStarts (pagesim.metrics.step_log) against the test it replaces: a step's end minus its
duration, compared with t + slack, from every step's kept duration."""

import random
from itertools import accumulate

import pytest

from pagesim.metrics.step_log import StepStarts

SLACK = 1e-12


def _steps(rng: random.Random, clock: float, num_runs: int):
    """Runs of steps as the simulator takes them: each run begins at the clock, or after an idle
    wait; its ends accumulate one duration at a time. Returns (runs of (ends, durations), number of
    idle waits)."""
    runs, idles = [], 0
    for _ in range(num_runs):
        if rng.random() < 0.2:
            clock += rng.choice([1e-13, 5e-13, 3e-12, rng.random()])  # some waits below the slack
            idles += 1
        durations = [rng.uniform(0.005, 0.2) for _ in range(rng.choice([1, 1, 2, 7, 40]))]
        ends = list(accumulate(durations, initial=clock))[1:]
        runs.append((ends, durations))
        clock = ends[-1]
    return runs, idles


@pytest.mark.parametrize("clock", [0.0, 37.5, 5e4, 3e6])
def test_begun_by_matches_end_minus_duration(clock):
    rng = random.Random(int(clock) + 1)
    runs, idles = _steps(rng, clock, 400)
    starts = StepStarts(SLACK)
    for ends, durations in runs:
        if len(ends) == 1 and rng.random() < 0.5:
            starts.add_one(ends[0], durations[0])
        else:
            starts.add(ends, durations)
    ends = [e for run, _ in runs for e in run]
    durations = [d for _, run in runs for d in run]
    checked = disagree = 0
    for k in range(1, len(ends)):
        # t: the previous step's end (a token's time), a hair later, or anywhere before this end
        for t in (ends[k - 1], ends[k - 1] + 1e-13, rng.uniform(ends[k - 1], ends[k])):
            expected = ends[k] - durations[k] <= t + SLACK
            assert starts.begun_by(k, t) == expected, (k, t)
            checked += 1
            disagree += not expected
    assert checked == 3 * (len(ends) - 1)
    assert starts.num_steps == len(ends)
    assert len(starts.late) <= idles + 1 + len(ends) // 50  # a few bytes per run, not per step
    assert disagree > 0  # some waits exceed the slack: the test sees both answers


def test_first_step_is_kept():
    starts = StepStarts(SLACK)
    starts.add([1.5, 2.0], [0.5, 0.5])
    assert starts.begun_by(0, 0.9) is False and starts.begun_by(0, 1.0) is True
    assert list(starts.late) == [0] and starts.begun_by(1, 1.5) is True
