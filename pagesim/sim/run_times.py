"""When the steps of a decode run end: durations from the cost model, end times accumulated one
duration at a time exactly as successive per-step timeouts would give them, and the one delay
that brings the clock to a run's end; and the durations themselves for the cost models whose
plain decode step is linear in its context (a list a run: compiled, scripts/compile.py)."""

from __future__ import annotations

import math

from pagesim.core.decode_runs import DecodePlan
from pagesim.core.native import Number


def run_times(cost, block_size: int, plan: DecodePlan, now: Number, until: Number,
              pace: Number) -> tuple[list, list, Number]:
    """Durations and end times of the plan's steps up to the one that ends at or after until
    (or to its last step), and the last duration computed (the pace the next run starts from:
    0 where none was). They are computed in chunks, since until usually cuts a run far short
    of its plan."""
    durations: list = []
    ends: list = []
    # (a plan that goes past finishes decodes fewer sequences after each: stretch by stretch)
    stretches = plan.stretches or ((plan.num_steps, plan.num_seqs, plan.context_tokens),)
    start = 0  # steps before the stretch
    for stop, num_seqs, context in stretches:
        while len(ends) < stop:
            # Durations grow along a run (its context does), and slowly from run to run: at the
            # last one's pace, this many more steps reach until at the most (any chunk gives
            # the same floats; this one mostly ends the run without a second)
            chunk = stop if until == math.inf else 16 if pace <= 0 else max(16, int((until - now) / pace) + 2)
            count = min(chunk, stop - len(ends))
            part: list = cost.decode_run_durations(num_seqs, context + (len(ends) - start) * num_seqs, count,
                                                   block_size)
            pace = part[-1]
            # each step's end, one duration added at a time (as successive timeouts add them), up
            # to the first at or after until (durations are positive: ends increase)
            part_ends: list = []
            end = now
            for duration in part:
                end = end + duration
                part_ends.append(end)
                if end >= until:
                    break
            cut = len(part_ends)
            if end >= until:
                if not ends:  # (most runs: cut inside the first chunk)
                    return part[:cut], part_ends, pace
                durations += part[:cut]
                ends += part_ends
                return durations, ends, pace
            durations += part
            ends += part_ends
            now = end
        start = stop
    return durations, ends, pace


def delay_to(now: Number, target: Number) -> Number:
    """A delay d with now + d == target exactly in floating point where one exists, so that a run
    of steps ends at the very instant successive per-step timeouts would have reached. Callers
    check: with now = 0.2576791932492309 and target = 0.955369406414677 every delay rounds past
    the target (ties to even), and none exists."""
    delay = target - now
    while now + delay < target:
        delay = math.nextafter(delay, math.inf)
    while now + delay > target:
        delay = math.nextafter(delay, -math.inf)
    return delay


def linear_context_durations(base: float, per_ctx: float, num_seqs: int, context_tokens: int, num_steps: int) -> list[float]:
    """Decode run durations for a model whose plain decode step is `base + context_tokens * per_ctx`
    (`decode_run_durations` of the roofline, calibrated and profiled models). The model's
    iteration_time must add that context term last, to the same base, so the floats are equal."""
    durations: list[float] = []
    context = context_tokens
    for _ in range(num_steps):  # (native ints: a range with a step would iterate generically, compiled)
        durations.append(base + context * per_ctx)
        context += num_seqs
    return durations


def windowed_context_durations(base: float, per_ctx: float, per_window_ctx: float, window: int, num_seqs: int,
                               context_tokens: int, num_steps: int) -> list[float]:
    """Decode run durations of a model with sliding-window layers: besides the full layers' term
    (context x per_ctx), those layers read at most `window` tokens per sequence, bounded here by
    min(context, num_seqs x window) (the step shape carries only the sum; exact when every
    sequence is past the window or none is). iteration_time must add the two terms last, in this
    order, to the same base."""
    cap = num_seqs * window
    durations: list[float] = []
    context = context_tokens
    for _ in range(num_steps):
        durations.append(base + context * per_ctx + (context if context < cap else cap) * per_window_ctx)
        context += num_seqs
    return durations
