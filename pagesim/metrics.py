"""One metrics schema for both drivers (simulator and executor).

A run produces per-request records, per-step records and a summary. Both drivers call
`MetricsRecorder.record_step` after every iteration and `record_request` when a request leaves
(finished or rejected), so a simulated run and a real run are compared by the same code.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from pagesim.core import SchedulerOutput, SequenceGroup

# Column order of requests.csv and steps.csv (other tools read them).
REQUEST_FIELDS = ("request_id", "status", "reject_reason", "arrival_time", "first_scheduled_time", "first_token_time",
                  "finish_time", "prompt_len", "output_len", "num_seqs", "num_preemptions", "num_swaps",
                  "cached_prompt_tokens", "ttft", "tpot", "e2e_latency", "normalized_latency")


@dataclass
class RequestRecord:
    request_id: int
    status: str  # "finished" | "rejected"
    reject_reason: str
    arrival_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    finish_time: float | None
    prompt_len: int
    output_len: int  # tokens of the longest output sequence
    num_seqs: int
    num_preemptions: int
    num_swaps: int
    cached_prompt_tokens: int

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

    @property
    def e2e_latency(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.arrival_time

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first."""
        if self.finish_time is None or self.output_len < 2:
            return None
        return (self.finish_time - self.first_token_time) / (self.output_len - 1)

    @property
    def normalized_latency(self) -> float | None:
        """End-to-end latency per output token: the paper's main latency metric."""
        if self.finish_time is None or self.output_len == 0:
            return None
        return self.e2e_latency / self.output_len

    def row(self) -> dict:
        return {name: getattr(self, name) for name in REQUEST_FIELDS}

    @classmethod
    def from_group(cls, group: SequenceGroup) -> "RequestRecord":
        return cls(
            request_id=group.request_id,
            status="rejected" if group.reject_reason else "finished",
            reject_reason=group.reject_reason or "",
            arrival_time=group.arrival_time,
            first_scheduled_time=group.first_scheduled_time,
            first_token_time=group.first_token_time,
            finish_time=group.finish_time,
            prompt_len=group.prompt_len,
            output_len=group.output_len,
            num_seqs=group.max_num_seqs,
            num_preemptions=group.num_preemptions,
            num_swaps=group.num_swaps,
            cached_prompt_tokens=group.num_cached_prompt_tokens,
        )


@dataclass(slots=True)
class StepRecord:
    time: float  # when the step ended
    duration: float
    num_running_requests: int  # groups holding KV state after scheduling (the paper's "batched requests")
    num_scheduled_seqs: int
    num_prefill_tokens: int
    num_decode_seqs: int
    num_waiting: int
    num_swapped: int
    kv_blocks_used: int
    kv_blocks_logical: int  # blocks the live sequences would hold without sharing (>= kv_blocks_used)
    kv_utilization: float
    num_preempted: int
    blocks_swapped_in: int
    blocks_swapped_out: int
    blocks_copied: int


STEP_FIELDS = tuple(f.name for f in fields(StepRecord))
WASTE_FIELDS = ("time", "token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")


@dataclass
class MetricsRecorder:
    num_kv_blocks: int
    warmup_s: float = 0.0  # requests arriving earlier are left out of latency statistics
    requests: list[RequestRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    waste: list[tuple] = field(default_factory=list)  # rows of WASTE_FIELDS, sampled
    # Prefix-cache lookups so far (full prompt blocks looked up / found), read from the KV
    # manager's running counters at every recorded step; 0 / 0 without prefix caching.
    prefix_blocks_queried: int = 0
    prefix_blocks_hit: int = 0

    def record_request(self, group: SequenceGroup) -> None:
        self.requests.append(RequestRecord.from_group(group))

    def record_step(self, out: SchedulerOutput, now: float, duration: float, scheduler) -> None:
        kv = scheduler.kv
        used = kv.num_used_blocks
        self.prefix_blocks_queried = getattr(kv, "prefix_queries", 0)
        self.prefix_blocks_hit = getattr(kv, "prefix_hits", 0)
        self.steps.append(StepRecord(
            time=now, duration=duration, num_running_requests=len(scheduler.running),
            num_scheduled_seqs=len(out.seqs), num_prefill_tokens=out.num_prefill_tokens,
            num_decode_seqs=out.num_decode_seqs, num_waiting=len(scheduler.waiting), num_swapped=len(scheduler.swapped),
            kv_blocks_used=used, kv_blocks_logical=kv.num_logical_blocks,
            kv_utilization=used / self.num_kv_blocks if self.num_kv_blocks else 0.0,
            num_preempted=len(out.preempted), blocks_swapped_in=len(out.blocks_to_swap_in),
            blocks_swapped_out=len(out.blocks_to_swap_out), blocks_copied=len(out.blocks_to_copy),
        ))

    def record_decode_run(self, ends: list[float], durations: list[float], num_seqs: int, kv_blocks_used: list[int],
                          num_swapped: int, before: tuple[int, int], after: tuple[int, int],
                          shared: tuple[int, int] = (0, 0)) -> None:
        """Plain decode steps taken in one run (see Scheduler.advance_decode): the records
        record_step() would have written for them. before / after: (running requests, waiting
        requests) during the run and after its last step. shared: logical minus used blocks
        during the run and after its last step; the blocks a run appends are private (a run
        never copies or forks), so the difference holds until the last step's frees."""
        last = len(ends) - 1
        total = self.num_kv_blocks
        append = self.steps.append
        running, waiting = before
        gap = shared[0]
        for j in range(last):
            used = kv_blocks_used[j]
            append(StepRecord(ends[j], durations[j], running, num_seqs, 0, num_seqs, waiting, num_swapped,
                              used, used + gap, used / total if total else 0.0, 0, 0, 0, 0))
        running, waiting = after
        used = kv_blocks_used[last]
        append(StepRecord(ends[last], durations[last], running, num_seqs, 0, num_seqs, waiting, num_swapped,
                          used, used + shared[1], used / total if total else 0.0, 0, 0, 0, 0))

    def record_waste(self, now: float, scheduler) -> None:
        w = scheduler.kv.waste(scheduler.running)
        self.waste.append((now, w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation, w.free))

    # -- summary ---------------------------------------------------------------------------
    def summary(self, **extra) -> dict:
        finished = [r for r in self.requests if r.status == "finished"]
        measured = [r for r in finished if r.arrival_time >= self.warmup_s]
        start = min((r.arrival_time for r in self.requests), default=0.0)
        end = max((r.finish_time for r in finished), default=start)
        duration = end - start
        out_tokens = sum(r.output_len for r in finished)
        total_tokens = sum(r.prompt_len + r.output_len for r in finished)
        steps = self.steps
        step_time = sum(s.duration for s in steps)
        # memory saving: time integrals over steps (each step's state weighted by its duration)
        # of blocks saved by sharing and of blocks needed without it
        logical_time = sum(s.kv_blocks_logical * s.duration for s in steps)
        saved_time = logical_time - sum(s.kv_blocks_used * s.duration for s in steps)
        queried = self.prefix_blocks_queried
        summary = {
            "num_requests": len(self.requests),
            "num_finished": len(finished),
            "num_rejected": len(self.requests) - len(finished),
            "num_measured": len(measured),
            "warmup_s": self.warmup_s,
            "duration_s": duration,
            "request_throughput": len(finished) / duration if duration > 0 else 0.0,
            "output_token_throughput": out_tokens / duration if duration > 0 else 0.0,
            "total_token_throughput": total_tokens / duration if duration > 0 else 0.0,
            "mean_normalized_latency": _mean([r.normalized_latency for r in measured]),
            **_stats("ttft", [r.ttft for r in measured]),
            **_stats("tpot", [r.tpot for r in measured]),
            **_stats("e2e", [r.e2e_latency for r in measured]),
            **_stats("normalized_latency", [r.normalized_latency for r in measured]),
            "num_steps": len(steps),
            "mean_batched_requests": _mean([s.num_running_requests for s in steps]),
            "mean_kv_utilization": (sum(s.kv_utilization * s.duration for s in steps) / step_time) if step_time else 0.0,
            "peak_kv_utilization": max((s.kv_utilization for s in steps), default=0.0),
            "num_preemptions": sum(s.num_preempted for s in steps),
            "num_swapped_blocks": sum(s.blocks_swapped_in + s.blocks_swapped_out for s in steps),
            "num_copied_blocks": sum(s.blocks_copied for s in steps),
            "memory_saving": saved_time / logical_time if logical_time else 0.0,
            # the same ratio with every step weighted alike: equal for two drivers that run the
            # same schedule, whatever their step times
            "memory_saving_per_step": _saving_per_step(steps),
            "prefix_hit_rate": self.prefix_blocks_hit / queried if queried else None,
            "prefix_blocks_queried": queried,
            "prefill_tokens_saved": sum(r.cached_prompt_tokens for r in self.requests),
            "reject_reasons": _count(r.reject_reason for r in self.requests if r.status == "rejected"),
        }
        summary.update(extra)
        return summary

    # -- files -----------------------------------------------------------------------------
    def write(self, out_dir: str | Path, summary: dict, steps: bool = True) -> None:
        """steps=False: no steps.csv (a run measured over HTTP sees no steps)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        _write_csv(out / "requests.csv", REQUEST_FIELDS, (r.row() for r in self.requests))
        if steps:
            _write_csv(out / "steps.csv", STEP_FIELDS, (asdict(s) for s in self.steps))
        if self.waste:
            _write_csv(out / "waste.csv", WASTE_FIELDS, (dict(zip(WASTE_FIELDS, w)) for w in self.waste))
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _write_csv(path: Path, columns, rows) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else (repr(v) if isinstance(v, float) else v)) for k, v in row.items()})


def _saving_per_step(steps) -> float:
    logical = sum(s.kv_blocks_logical for s in steps)
    return (logical - sum(s.kv_blocks_used for s in steps)) / logical if logical else 0.0


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), without numpy."""
    values = sorted(values)
    pos = (len(values) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def _stats(name: str, values) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {f"{name}_mean": None, f"{name}_p50": None, f"{name}_p90": None, f"{name}_p99": None}
    return {f"{name}_mean": sum(values) / len(values), f"{name}_p50": percentile(values, 50),
            f"{name}_p90": percentile(values, 90), f"{name}_p99": percentile(values, 99)}


def _count(items) -> dict:
    counts: dict[str, int] = {}
    for item in items:
        counts[item] = counts.get(item, 0) + 1
    return counts
