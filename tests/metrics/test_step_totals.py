"""The summary's per-step statistics come from totals the step log keeps as steps arrive; here
they are recomputed from the StepRecords one step at a time (the definitions, in step order), and
a run that keeps no per-step records (keep_steps=False, as `replay --json` without `--out`) must
give the same summary to the bit."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import load_trace

ROOT = Path(__file__).resolve().parents[2]
SHAREGPT = load_trace(ROOT / "traces" / "sharegpt.json")
CHAT = load_trace(ROOT / "traces" / "sharegpt_chat.json")
BASE = ReplayConfig(num_requests=120, rate=4.0, seed=1)

CASES = {
    "swap": (dict(preemption="swap", num_gpu_blocks=150), SHAREGPT),
    "parallel-n2": (dict(n=2, num_gpu_blocks=300, num_requests=60), SHAREGPT),
    "prefix-caching": (dict(prefix_caching=True, num_gpu_blocks=200), CHAT),
    "orca-max": (dict(policy="orca-max", num_requests=60), SHAREGPT),
}


def _by_definition(steps, num_kv_blocks: int) -> dict:
    duration = logical_time = used_time = util_time = 0.0
    for s in steps:
        duration += s.duration
        logical_time += s.kv_blocks_logical * s.duration
        used_time += s.kv_blocks_used * s.duration
        util_time += s.kv_utilization * s.duration
    logical = sum(s.kv_blocks_logical for s in steps)
    return {
        "num_steps": len(steps),
        "mean_batched_requests": sum(s.num_running_requests for s in steps) / len(steps),
        "mean_kv_utilization": util_time / duration,
        "peak_kv_utilization": max(s.kv_blocks_used for s in steps) / num_kv_blocks,
        "num_preemptions": sum(s.num_preempted for s in steps),
        "num_swapped_blocks": sum(s.blocks_swapped_in + s.blocks_swapped_out for s in steps),
        "num_copied_blocks": sum(s.blocks_copied for s in steps),
        "memory_saving": (logical_time - used_time) / logical_time,
        "memory_saving_per_step": (logical - sum(s.kv_blocks_used for s in steps)) / logical,
    }


@pytest.mark.parametrize("name", list(CASES))
def test_step_totals_equal_the_definitions_and_need_no_step_records(name):
    changes, trace = CASES[name]
    cfg = dataclasses.replace(BASE, **changes)
    kept = Replay(cfg, trace).run()
    lean = Replay(cfg, trace, keep_steps=False).run()
    steps = kept.metrics.steps
    expected = _by_definition(steps, kept.summary["num_kv_blocks"])
    assert {key: kept.summary[key] for key in expected} == expected
    assert lean.summary == kept.summary
    # the lean run kept the step end times (output-token times point into them), nothing else
    assert list(lean.metrics.step_log.time) == [s.time for s in steps]
    assert len(lean.metrics.step_log.duration) == 0 and len(lean.metrics.step_log.held) == 0
    with pytest.raises(ValueError, match="keep_steps=False"):
        lean.metrics.steps


@pytest.mark.parametrize("seed", range(6))
def test_step_totals_in_stretches_equal_a_loop_over_the_steps(seed):
    # runs and single steps, blocks shared from some point on, read at random moments (a planner
    # reads as requests leave): against the definition, one step at a time, to the bit
    import random

    from pagesim.metrics.records import HELD_FIELDS
    from pagesim.metrics.step_log import StepLog, StepTotals

    rng = random.Random(seed)
    total_blocks = rng.choice([0, 7, 1000])
    totals = StepTotals(total_blocks)
    kept = StepLog(total_blocks, keep_steps=True)  # (its totals read its own columns)
    # the kept log's totals in several stretches (set on the object: a compiled class reads no
    # class attribute set later, scripts/compile.py)
    kept.weighted.SETTLE_STEPS = 300
    held = (0,) * len(HELD_FIELDS)
    duration = used_time = logical_time = util_time = 0.0
    shares_from = rng.randrange(0, 60)
    for k in range(120):
        n = rng.choice([1, 1, 2, 30, 200])
        durations = [rng.uniform(0.001, 0.1) * 10.0 ** rng.randint(-3, 3) for _ in range(n)]
        used = [rng.randrange(0, 1000) for _ in range(n)]
        logical = [u + rng.randrange(0, 5) for u in used] if k >= shares_from else used
        if n == 1 and rng.random() < 0.5:
            totals.add_one(durations[0], used[0], logical[0])
        else:
            totals.add(durations, used, logical)
        for d, u, lg in zip(durations, used, logical):
            kept.add_step(float(len(kept) + 1), d, u, lg, held)
            duration += d
            used_time += u * d
            logical_time += lg * d
            if total_blocks:
                util_time += u / total_blocks * d
        if rng.random() < 0.3 or k == 119:
            for t in (totals.settled(), kept):
                assert (t.duration_sum, t.used_time, t.logical_time, t.utilization_time) == \
                       (duration, used_time, logical_time, util_time)


def test_sum_in_order_adds_left_to_right_across_chunks():
    # against `total += v` one float at a time, over more values than one chunk, from a start
    import random

    import numpy as np

    from pagesim.metrics.itl import CHUNK, sum_in_order

    rng = random.Random(3)
    values = [rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 8) for _ in range(CHUNK + 1234)]
    total = 0.5
    for v in values:
        total += v
    assert sum_in_order(np.array(values), 0.5) == total
    assert sum_in_order(np.zeros(0), 0.25) == 0.25


def test_step_totals_of_single_steps_add_up_one_by_one():
    # a chunked replay adds most steps one by one: against `total += value`, to the bit
    from pagesim.metrics.step_log import StepTotals

    totals, duration, used_time, util_time = StepTotals(50), 0.0, 0.0, 0.0
    for k in range(1000):
        totals.add_one(0.01 * (k % 7 + 1), k % 50, k % 50)
        duration += 0.01 * (k % 7 + 1)
        used_time += (k % 50) * (0.01 * (k % 7 + 1))
        util_time += (k % 50) / 50 * (0.01 * (k % 7 + 1))
    settled = totals.settled()
    assert (settled.duration_sum, settled.used_time, settled.logical_time, settled.utilization_time) == \
        (duration, used_time, used_time, util_time)
