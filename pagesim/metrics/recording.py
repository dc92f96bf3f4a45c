"""What MetricsRecorder does at every step and decode run: the step log's rows and each running
request's token spans. These loops visit every running request at every step or run, so this
module is compiled with mypyc (scripts/compile.py); MetricsRecorder (pagesim.metrics) calls it.

A request's token spans, while it runs: [tokens so far, a0, b0, a1, b1, ...], steps a .. b - 1
having each given it one output token (RequestRecord.token_spans, less the count, once it leaves).
"""

from __future__ import annotations

from pagesim.core.decode_runs import DecodeRun
from pagesim.core.native import Number
from pagesim.core.request import SequenceGroup
from pagesim.core.scheduler import Scheduler
from pagesim.core.step import SchedulerOutput
from pagesim.metrics.step_log import StepLog


def record_step(log: StepLog, spans_of: dict[int, list[int]], out: SchedulerOutput, now: Number, duration: Number,
                scheduler: Scheduler) -> None:
    """One step taken (out), ended at now: the groups it gave a token to, and its row."""
    step = len(log)  # this step's index
    for group in out.groups:
        rid = group.request.request_id
        spans = spans_of.get(rid)
        seqs = group.seqs
        # (num_output_tokens, its live case inline: most groups are still running)
        produced = seqs[0].num_tokens - seqs[0].prompt_len if seqs else num_output_tokens(group)
        if spans is None:
            if produced:  # its first token
                spans_of[rid] = [1, step, step + 1]
        elif spans[0] < produced:  # the step gave this group a token
            spans[0] = spans[0] + 1
            if spans[-1] == step:
                spans[-1] = step + 1
            else:
                spans.append(step)
                spans.append(step + 1)
    kv = scheduler.kv
    log.add_step(now, duration, kv.num_used_blocks, kv.num_logical_blocks, (
        len(scheduler.running), len(out.seqs), out.num_prefill_tokens, out.num_decode_seqs, len(scheduler.waiting),
        len(scheduler.swapped), len(out.preempted), len(out.blocks_to_swap_in), len(out.blocks_to_swap_out),
        len(out.blocks_to_copy)))


def record_decode_run(log: StepLog, spans_of: dict[int, list[int]], ends: list, durations: list, num_seqs: int,
                      kv_blocks_used: list, num_swapped: int, before: tuple[int, int], after: tuple[int, int],
                      shared: tuple[int, int], request_ids: list, run: DecodeRun | None) -> None:
    """MetricsRecorder.record_decode_run (its docstring says what each argument is)."""
    running, waiting = before
    running_after, waiting_after = after
    shared_during, shared_after = shared
    first = start = len(log)
    finishes = run.finishes if run is not None else None
    if run is not None and finishes:
        for at, seqs, running_then, shared_then in finishes:  # (each stretch as a run of its own)
            stop = first + at
            log.add_run(ends[start - first:at], durations[start - first:at], kv_blocks_used[start - first:at],
                        (shared_during, shared_then), (running, seqs, 0, seqs, waiting, num_swapped, 0, 0, 0, 0),
                        (running_then, seqs, 0, seqs, waiting, num_swapped, 0, 0, 0, 0))
            start, running, shared_during = stop, running_then, shared_then
        num_seqs = run.num_seqs
    log.add_run(ends[start - first:], durations[start - first:], kv_blocks_used[start - first:],
                (shared_during, shared_after), (running, num_seqs, 0, num_seqs, waiting, num_swapped, 0, 0, 0, 0),
                (running_after, num_seqs, 0, num_seqs, waiting_after, num_swapped, 0, 0, 0, 0))
    stop = len(log)
    steps = stop - first
    for rid in request_ids:
        spans = spans_of.get(rid)
        if spans is None:
            spans_of[rid] = [steps, first, stop]
        elif spans[-1] == first:  # it got a token at the step before: its last span goes on
            spans[0] = spans[0] + steps
            spans[-1] = stop
        else:
            spans[0] = spans[0] + steps
            spans.append(first)
            spans.append(stop)
    if run is not None and finishes:  # (those that left in mid-run: their tokens end with the step they finished in)
        left_at = run.left_at
        assert left_at is not None
        for group, at in zip(run.finished, left_at):
            spans = spans_of[group.request.request_id]
            spans[0] = spans[0] - (steps - at)
            spans[-1] = first + at


def num_output_tokens(group: SequenceGroup) -> int:
    """Tokens the group's longest sequence has produced so far, finished or not. Live sequences
    grow in step and are never shorter than a finished one, so the first live one tells."""
    if group.seqs:
        return group.seqs[0].num_output_tokens
    return max([s.num_output_tokens for s in group.finished_seqs], default=0)
