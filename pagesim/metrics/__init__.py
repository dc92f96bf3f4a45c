"""One metrics schema for both drivers (simulator and executor).

A run produces per-request records, per-step records and a summary. Both drivers call
`MetricsRecorder.record_step` after every iteration and then `record_request` for each request
that left (finished or rejected), so a simulated run and a real run are compared by the same
code. `summarize_requests` builds the request half of the summary from records alone, so an
HTTP client measuring a server writes the same schema. docs/metrics.md maps every field to
vLLM's `bench serve` and Vidur's request_metrics.csv.
"""

from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pagesim.core import SchedulerOutput, SequenceGroup
from pagesim.metrics import files, recording
from pagesim.metrics.files import STEPS_CHOICES, read_requests_csv, read_steps_csv
from pagesim.metrics.intervals import mean_interval, nonnegative_interval, t_quantile_975
from pagesim.metrics.itl import CHUNK as STRETCH
from pagesim.metrics.itl import (GapCounts, SpanTally, TokenGaps, exact_weighted_sum, sum_in_order, weighted_percentiles,
                                 weighted_percentiles_of, weighted_vllm_stats)
from pagesim.metrics.records import (HELD_FIELDS, REQUEST_FIELDS, STEP_FIELDS, WASTE_FIELDS, RequestRecord,
                                     StepRecord)
from pagesim.metrics.request_columns import RequestColumns
from pagesim.metrics.step_log import StepLog

if TYPE_CHECKING:  # (numpy is imported where a summary needs it: `import pagesim.metrics` stays light)
    import numpy as np

__all__ = ["HELD_FIELDS", "REQUEST_FIELDS", "STEP_FIELDS", "STEPS_CHOICES", "WASTE_FIELDS", "MetricsRecorder",
           "RequestColumns", "RequestRecord", "StepLog", "StepRecord", "mean_interval", "nonnegative_interval", "percentile", "read_requests_csv",
           "read_steps_csv", "summarize_requests", "summarize_steps", "t_quantile_975", "exact_weighted_sum",
           "weighted_percentiles"]


@dataclass
class MetricsRecorder:
    num_kv_blocks: int
    warmup_s: float = 0.0  # requests arriving earlier are left out of latency statistics
    requests: list[RequestRecord] = field(default_factory=list)
    step_log: StepLog = None  # every step (see `steps`)
    waste: list[tuple] = field(default_factory=list)  # rows of WASTE_FIELDS, sampled
    # Prefix-cache lookups so far (full prompt blocks looked up / found), read from the KV
    # manager's running counters at every recorded step; 0 / 0 without prefix caching.
    prefix_blocks_queried: int = 0
    prefix_blocks_hit: int = 0
    # output-token times of requests in flight, by request id (moved into the record on leaving):
    # [tokens so far] + RequestRecord.token_spans, by request id
    token_spans: dict[int, list[int]] = field(default_factory=dict, repr=False)
    keep_steps: bool = True  # False: no per-step records (no steps.csv), only the summary's totals
    origin: float = 0.0  # the run's time zero (pagesim.workload.requests.time_origin): warmup_s counts from it

    # keep_steps=False: the records keep no token spans (an API caller's token_times); their
    # gaps go into this tally as they leave, in memory that grows with steps, not requests
    span_tally: SpanTally | GapCounts | None = field(default=None, repr=False)  # (GapCounts: packed)

    def __post_init__(self):
        if self.step_log is None:
            self.step_log = StepLog(self.num_kv_blocks, self.keep_steps)
        if not self.keep_steps and self.span_tally is None:
            self.span_tally = SpanTally(self.step_log.time, self.warmup_s, self.origin)

    @property
    def steps(self) -> list[StepRecord]:
        """Every step's record, in time order (built on demand from the step log)."""
        return list(self.step_log.records())

    @property
    def num_steps(self) -> int:
        return len(self.step_log)

    def record_request(self, group: SequenceGroup) -> RequestRecord:
        """Call after the request's last step was recorded (its last token time is in it)."""
        spans = self.token_spans.pop(group.request_id, None)
        tally = self.span_tally
        if tally is None:
            # (packed: a request kept to the end of a long run holds its spans in 4 bytes an entry,
            # not a list of boxed step indices, 36 bytes an entry; a replay stays far below 2**31 steps)
            record = RequestRecord.from_group(group, array("i", spans[1:]) if spans else None, self.step_log.time)
        else:
            record = RequestRecord.from_group(group, None, self.step_log.time)
            if spans and is_measured(record, self.warmup_s, self.origin):
                del spans[0]  # (the token count: the rest are the spans)
                tally.add(spans)
        self.requests.append(record)
        return record

    def record_step(self, out: SchedulerOutput, now: float, duration: float, scheduler) -> None:
        """Call after scheduler.update() and before recording the requests it finished."""
        recording.record_step(self.step_log, self.token_spans, out, now, duration, scheduler)
        kv = scheduler.kv
        self.prefix_blocks_queried = getattr(kv, "prefix_queries", 0)
        self.prefix_blocks_hit = getattr(kv, "prefix_hits", 0)

    def record_decode_run(self, ends: list[float], durations: list[float], num_seqs: int, kv_blocks_used: list[int],
                          num_swapped: int, before: tuple[int, int], after: tuple[int, int],
                          shared: tuple[int, int] = (0, 0), request_ids: list[int] | None = None, run=None) -> None:
        """Plain decode steps taken in one run (see Scheduler.advance_decode): the records
        record_step() would have written for them. before / after: (running requests, waiting
        requests) during the run and after its last step. shared: logical minus used blocks
        during the run and after its last step; the blocks a run appends are private (a run
        never copies or forks), so the difference holds until the last step's frees.
        request_ids: the running requests, each given one token at every step's end (up to the
        step it finished in). run: the DecodeRun, where it went on past finishes (its finishes
        say how the batch shrank, which nothing else changes then: nobody waits or is swapped)."""
        recording.record_decode_run(self.step_log, self.token_spans, ends, durations, num_seqs, kv_blocks_used,
                                    num_swapped, before, after, shared, request_ids or [], run)

    def record_waste(self, now: float, scheduler) -> None:
        w = scheduler.kv.waste(scheduler.running)
        self.waste.append((now, w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation, w.free))

    def pack(self, gaps=None) -> None:
        """Keep the records as columns (RequestColumns: ~80 bytes a request, not ~360) and the token
        gaps of the measured ones counted (span_tally: GapCounts; a log that keeps no steps then
        lets its step times go): what the summary and requests.csv need, without the records'
        token times. Call once the run has ended (no record or step is added after). gaps: what
        to keep of a SpanTally instead of its GapCounts (a function of it: a replica replayed apart
        writes them to a file, pagesim.cluster.spill.SpilledGaps)."""
        tally = self.span_tally
        if tally is None:
            tally = SpanTally(self.step_log.time, self.warmup_s, self.origin)
            for r in self.requests:
                if r.token_spans and is_measured(r, self.warmup_s, self.origin):
                    tally.add(r.token_spans)
        if isinstance(tally, SpanTally):  # (its gaps as distinct values with counts: no step times needed)
            self.span_tally = tally.gap_counts() if gaps is None else gaps(tally)
        if not self.keep_steps:
            self.step_log.forget_times()
        self.requests = RequestColumns.of(self.requests)

    # -- summary ---------------------------------------------------------------------------
    def summary(self, **extra) -> dict:
        summary = summarize_requests(self.requests, self.warmup_s, self.origin,
                                     [self.span_tally] if self.span_tally is not None else [])
        summary.update(summarize_steps([self]))
        summary.update(extra)
        return summary

    # -- files -----------------------------------------------------------------------------
    def write(self, out_dir: str | Path, summary: dict, steps: bool | str = True) -> None:
        """steps: "all" (or True), "sampled" (see pagesim.metrics.files) or "none" (or False: no
        steps.csv; a run measured over HTTP sees no steps)."""
        steps = {True: "all", False: "none"}.get(steps, steps)
        if steps not in STEPS_CHOICES:
            raise ValueError(f"steps: one of {', '.join(STEPS_CHOICES)}, got {steps!r}")
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        files.write_requests_csv(out / "requests.csv", self.requests)
        if steps != "none":
            files.write_steps_csv(out / "steps.csv", self.step_log, steps)
        if self.waste:
            files.write_rows_csv(out / "waste.csv", WASTE_FIELDS, self.waste)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def summarize_steps(recorders: list[MetricsRecorder]) -> dict:
    """The per-step half of summary.json over one driver's steps, or pooled over several (a
    cluster's replicas: every step of every replica counts once, and utilization is weighted by
    each replica's step time)."""
    logs = [r.step_log for r in recorders]
    num_steps = sum(len(log) for log in logs)
    step_time = sum(log.duration_sum for log in logs)
    # memory saving: time integrals over steps (each step's state weighted by its duration)
    # of blocks saved by sharing and of blocks needed without it
    logical_time = sum(log.logical_time for log in logs)
    saved_time = logical_time - sum(log.used_time for log in logs)
    logical, used = sum(log.logical_sum for log in logs), sum(log.used_sum for log in logs)
    queried = sum(r.prefix_blocks_queried for r in recorders)
    hit = sum(r.prefix_blocks_hit for r in recorders)

    def held(name: str) -> int:
        return sum(log.held_sum(name) for log in logs)

    return {
        "num_steps": num_steps,
        "mean_batched_requests": held("num_running_requests") / num_steps if num_steps else None,
        "mean_kv_utilization": (sum(log.utilization_time for log in logs) / step_time) if step_time else 0.0,
        # dividing by the pool size keeps the order, so the peak is the peak of blocks used
        "peak_kv_utilization": max((log.peak_used / r.num_kv_blocks if r.num_kv_blocks and len(log) else 0.0
                                    for r, log in zip(recorders, logs)), default=0.0),
        "num_preemptions": held("num_preempted"),
        "num_swapped_blocks": held("blocks_swapped_in") + held("blocks_swapped_out"),
        "num_copied_blocks": held("blocks_copied"),
        "memory_saving": saved_time / logical_time if logical_time else 0.0,
        # the same ratio with every step weighted alike: equal for two drivers that run the
        # same schedule, whatever their step times
        "memory_saving_per_step": (logical - used) / logical if logical else 0.0,
        "prefix_hit_rate": hit / queried if queried else None,
        "prefix_blocks_queried": queried,
    }


def is_measured(record: RequestRecord, warmup_s: float, origin: float) -> bool:
    """Whether the latency statistics cover a request: finished, and arrived warmup_s or more
    after origin (the run's time zero)."""
    return record.status == "finished" and record.arrival_time - origin >= warmup_s


def summarize_requests(requests: list[RequestRecord], warmup_s: float = 0.0, origin: float = 0.0,
                       span_tallies: list[SpanTally] = ()) -> dict:
    """The per-request half of summary.json, from request records alone (a simulated run, a real
    one, or an HTTP client's measurements). Throughputs count every finished request over the
    span from the first arrival to the last finish, output tokens those of all its sequences (its
    n samples, as vLLM counts them; `longest_output_*` count one, the longest, per request); latency statistics cover the finished
    requests that arrived warmup_s or more after origin (the run's time zero). Keys in seconds (`ttft_p99`) are pagesim's own; the
    `*_ms` keys and the token totals follow vLLM's `bench serve` (see docs/metrics.md).
    span_tallies: the token spans of drivers whose records keep none (MetricsRecorder.span_tally),
    folded by the same warm-up."""
    for tally in span_tallies:
        if (tally.warmup_s, tally.origin) != (warmup_s, origin):
            raise ValueError(f"a span tally measured from warm-up {tally.warmup_s} s after {tally.origin} "
                             f"cannot join a summary measured from {warmup_s} s after {origin}")
    import numpy as np

    # (from columns: 8 bytes a value where records cost ~360; the same floats, each computed as
    # the record's property computes it, in the records' order; a stretch of rows at a time, so
    # that only the latencies below grow with the rows: a long cluster run has millions, and
    # its records may be merged from files as they are read, RequestColumns.column_chunks)
    columns = RequestColumns.of(requests)
    num_finished = num_measured = input_tokens = output_tokens = longest_tokens = saved = 0
    start, last_finish, reasons = math.inf, -math.inf, {}
    # (each list as long as the rows, filled as they come: pages never written cost nothing)
    ttfts, tpots, e2els, normalized_latencies = (_Filled(len(columns)) for _ in range(4))
    measured_rows = []  # (records given: which are measured, for their own token spans)
    for part in columns.column_chunks():
        finished = part.column("status") == _code(part, "status", "finished")
        num_finished += int(finished.sum())
        arrival = part.column("arrival_time")
        measured = finished & (arrival - origin >= warmup_s)
        if len(arrival):
            start = min(start, float(arrival.min()))
        if finished.any():
            last_finish = max(last_finish, float(part.column("finish_time")[finished].max()))
        input_tokens += int(part.column("prompt_len")[finished].sum(dtype=np.int64))
        # every sample's tokens, as vLLM counts completion tokens; and one sample (the longest) per request
        output_tokens += int(part.column("total_output_len")[finished].sum(dtype=np.int64))
        longest_tokens += int(part.column("output_len")[finished].sum(dtype=np.int64))
        saved += int(part.column("cached_prompt_tokens").sum(dtype=np.int64))
        _count_reasons(part, reasons)
        if requests is not columns:
            measured_rows += measured.tolist()
        # the measured requests' latencies, those that are not None (NaN), packed
        rows = np.flatnonzero(measured)
        num_measured += len(rows)
        seen = part.take(rows)
        arrival, first_token, finish = (seen.column(name) for name in ("arrival_time", "first_token_time", "finish_time"))
        output_len = seen.column("output_len")
        ended = ~np.isnan(finish)
        ttfts.add((first_token - arrival)[~np.isnan(first_token)])
        with np.errstate(divide="ignore", invalid="ignore"):  # (the requests each is None for are left out)
            # None for one-token outputs, which vLLM leaves out too
            tpots.add(((finish - first_token) / (output_len - 1))[ended & (output_len >= 2)])
            normalized_latencies.add(((finish - arrival) / output_len)[ended & (output_len != 0)])
        e2els.add((finish - arrival)[ended])
    ttfts, tpots, e2els, normalized_latencies = (v.values() for v in (ttfts, tpots, e2els, normalized_latencies))
    start = 0.0 if start == math.inf else start
    duration = (last_finish if num_finished else start) - start

    def per_second(count):
        return count / duration if duration > 0 else 0.0

    # (a chunk at a time: a long run pools millions of gaps; records given: their own token spans)
    spanned = () if requests is columns else [r for r, m in zip(requests, measured_rows) if m]
    itls = TokenGaps(spanned, span_tallies)
    normalized = _stats("normalized_latency", normalized_latencies)
    # the paper's metric keeps the name every reader (figures, plan, compare) uses
    normalized["mean_normalized_latency"] = normalized.pop("normalized_latency_mean")
    return {
        "num_requests": len(columns),
        "num_finished": num_finished,
        "num_rejected": len(columns) - num_finished,
        "num_measured": num_measured,
        "warmup_s": warmup_s,
        "duration_s": duration,
        "request_throughput": per_second(num_finished),
        "output_token_throughput": per_second(output_tokens),
        "total_token_throughput": per_second(input_tokens + output_tokens),
        **_stats("ttft", ttfts),
        **_stats("tpot", tpots),
        **_stats("e2e", e2els),
        **normalized,
        # vLLM `bench serve` names and units
        "completed": num_finished,
        "failed": len(columns) - num_finished,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "output_throughput": per_second(output_tokens),
        "longest_output_tokens": longest_tokens,
        "longest_output_throughput": per_second(longest_tokens),
        **_vllm_stats("ttft", ttfts),
        **_vllm_stats("tpot", tpots),
        **_weighted_vllm_stats("itl", itls),
        **_vllm_stats("e2el", e2els),
        "prefill_tokens_saved": saved,
        "reject_reasons": reasons,
    }


def served_span(requests: list[RequestRecord], finished: list[RequestRecord]) -> float:
    """The span throughputs are counted over: from the first arrival to the last finish (of
    `finished`, the finished ones among `requests`)."""
    start = min((r.arrival_time for r in requests), default=0.0)
    return max((r.finish_time for r in finished), default=start) - start


def reject_reasons(requests: list[RequestRecord] | RequestColumns) -> dict:
    """How many of the requests were rejected for each reason."""
    return _count_reasons(RequestColumns.of(requests), {})


def _count_reasons(columns: RequestColumns, counts: dict) -> dict:
    """counts (reason: rejected requests) with those of `columns` added, in the order they come."""
    import numpy as np

    rejected = columns.take(np.flatnonzero(columns.column("status") == _code(columns, "status", "rejected")))
    for reason in rejected.texts("reject_reason"):
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def _code(columns: RequestColumns, name: str, value: str) -> int:
    """A text field's code for `value` in columns (-1, which no row has, where none has it)."""
    table = columns.tables[name]
    return table.index(value) if value in table else -1


class _Filled:
    """Floats added a stretch at a time into an array as long as they may grow: no copy as they
    grow, and only the pages written count in memory."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.data, self.size = np.empty(size), 0

    def add(self, values: np.ndarray) -> None:
        self.data[self.size:self.size + len(values)] = values
        self.size += len(values)

    def values(self) -> np.ndarray:
        return self.data[:self.size]


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    return _sorted_percentile(sorted(values), q)


def _sorted_percentile(values: list[float], q: float) -> float:
    """percentile() of values already sorted (or with at least the two places it reads,
    _percentile_places, holding what sorting would put there)."""
    lo, hi = _percentile_places(len(values), q)
    pos = (len(values) - 1) * q / 100
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _percentile_places(count: int, q: float) -> tuple[int, int]:
    """The two places of `count` sorted values that their q-th percentile interpolates between."""
    lo = math.floor((count - 1) * q / 100)
    return lo, min(lo + 1, count - 1)


def _packed(values) -> array:
    """The values that are not None, in order, as array('d')."""
    return array("d", (v for v in values if v is not None))


def _stats(name: str, values) -> dict:
    """values: floats (an array of them, or a sequence with None for those left out)."""
    import numpy as np

    if not isinstance(values, np.ndarray):
        values = array("d", values) if isinstance(values, array) else _packed(values)
        values = np.frombuffer(values) if values else np.zeros(0)
    if not len(values):
        return {f"{name}_mean": None, f"{name}_p50": None, f"{name}_p90": None, f"{name}_p99": None}
    # (the three percentiles read six order statistics, which np.partition puts in place in one
    # O(n) pass, ~7 times faster than sorting a million: sorted() puts the same numbers there,
    # equal floats being the same number, but for 0.0 and -0.0, whose order no interpolation
    # below can tell (x + (y - x) * f is +0.0 where it is zero, whichever zero x and y are).
    # The mean sums the floats in the records' order, left to right; the percentiles'
    # arithmetic on numpy's doubles is Python's)
    places = sorted({place for q in (50, 90, 99) for place in _percentile_places(len(values), q)})
    ordered = np.partition(values, places)
    return {f"{name}_mean": sum_in_order(values) / len(values), f"{name}_p50": float(_sorted_percentile(ordered, 50)),
            f"{name}_p90": float(_sorted_percentile(ordered, 90)), f"{name}_p99": float(_sorted_percentile(ordered, 99))}


def _pooled_inter_token_latencies(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """Every request's token-to-token gaps pooled, as distinct gaps with weights (see TokenGaps)."""
    return TokenGaps(records).arrays()


def _weighted_vllm_stats(name: str, gaps: TokenGaps) -> dict:
    """_vllm_stats of the gaps each repeated weight times (see weighted_vllm_stats)."""
    return weighted_vllm_stats(name, gaps.chunks) or _vllm_stats(name, [])


def _vllm_stats(name: str, seconds) -> dict:
    """mean / median / std (population, numpy's default) / p99 in milliseconds, named as vLLM's
    bench serve names them (`mean_ttft_ms`) and computed as it computes them (numpy); None where
    there is no value."""
    import numpy as np

    if isinstance(seconds, array):
        seconds = np.frombuffer(seconds) if len(seconds) else np.zeros(0)
    elif not isinstance(seconds, np.ndarray):
        seconds = np.array([v for v in seconds if v is not None], dtype=float)
    if not seconds.size:
        return {f"{stat}_{name}_ms": None for stat in ("mean", "median", "std", "p99")}
    # every statistic scales with the unit: convert the four results, not a copy of the values
    mean, std = float(seconds.mean()) * 1000.0, float(seconds.std()) * 1000.0
    # (numpy's percentile, to the bit: np.percentile itself imports numpy.ma, 11 ms of a replay; a
    # stretch at a time, each value weighing 1: the order statistics' temporaries stay a stretch's size)
    ones = np.ones(min(seconds.size, STRETCH), dtype=np.int64)
    median, p99 = weighted_percentiles_of(
        lambda: ((seconds[i:i + STRETCH], ones[:min(STRETCH, seconds.size - i)]) for i in range(0, seconds.size, STRETCH)),
        [50, 99], seconds.size)
    return {f"mean_{name}_ms": mean, f"median_{name}_ms": median * 1000.0, f"std_{name}_ms": std,
            f"p99_{name}_ms": p99 * 1000.0}
