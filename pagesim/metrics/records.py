"""The records both drivers write: one RequestRecord per request that left (requests.csv's
rows), one StepRecord per engine step (steps.csv's rows), and their column orders."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Sequence

from pagesim.core import SequenceGroup

# Column order of requests.csv and steps.csv (other tools read them).
REQUEST_FIELDS = ("request_id", "status", "reject_reason", "arrival_time", "first_scheduled_time", "first_token_time",
                  "finish_time", "prompt_len", "output_len", "num_seqs", "num_preemptions", "num_swaps",
                  "cached_prompt_tokens", "total_output_len", "ttft", "tpot", "e2e_latency", "normalized_latency",
                  "session_id", "turn")
SESSION_FIELDS = ("session_id", "turn")  # absent from files written before sessions (still read)


@dataclass(slots=True)  # (a long replay keeps one per request)
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
    # tokens of all output sequences (a request's n samples or returned beams together; what vLLM
    # counts as its completion tokens); None: one sequence, output_len
    total_output_len: int | None = None
    # when each output token became available (one per step that grew the longest sequence):
    # step_times[a:b] for each span (a, b) in token_spans, flattened [a0, b0, a1, b1, ...]. A
    # driver's step times are shared by all its requests, and a request that gets a token at
    # every step from its first to its last holds one span, so memory does not grow with tokens.
    # A list, or a packed array('i') (what MetricsRecorder keeps). Not in requests.csv.
    token_spans: Sequence[int] = field(default_factory=list, repr=False)
    step_times: Sequence[float] = field(default=(), repr=False)
    session_id: str | None = None  # the session it is a turn of (None: none) and which turn (0-based)
    turn: int | None = None

    def __post_init__(self):
        if self.total_output_len is None:
            if self.num_seqs > 1 and self.status == "finished":
                raise ValueError(f"request {self.request_id}: total_output_len is needed for {self.num_seqs} sequences")
            self.total_output_len = self.output_len

    @property
    def token_times(self) -> list[float]:
        times, spans = self.step_times, self.token_spans
        return [t for i in range(0, len(spans), 2) for t in times[spans[i]:spans[i + 1]]]

    @classmethod
    def spans_of(cls, times: list[float]) -> dict:
        """token_spans / step_times keywords for a request whose token times were measured one by one."""
        return {"token_spans": [0, len(times)] if times else [], "step_times": list(times)}

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
    def inter_token_latencies(self) -> list[float]:
        """Gaps between successive output tokens (vLLM's per-request `itl` list)."""
        times = self.token_times
        return [b - a for a, b in zip(times, times[1:])]

    @property
    def normalized_latency(self) -> float | None:
        """End-to-end latency per output token: the paper's main latency metric."""
        if self.finish_time is None or self.output_len == 0:
            return None
        return self.e2e_latency / self.output_len

    def row(self) -> dict:
        return {name: getattr(self, name) for name in REQUEST_FIELDS}

    @classmethod
    def from_group(cls, group: SequenceGroup, token_spans: Sequence[int] | None = None,
                   step_times: Sequence[float] = ()) -> "RequestRecord":
        # (group.output_len, the longest, and the total from one pass; one sequence's count is
        # both, one int object kept, not two)
        outputs = [s.num_output_tokens for s in group.finished_seqs]
        longest = max(outputs, default=0)
        return cls(
            request_id=group.request_id,
            status="rejected" if group.reject_reason else "finished",
            reject_reason=group.reject_reason or "",
            arrival_time=group.arrival_time,
            first_scheduled_time=group.first_scheduled_time,
            first_token_time=group.first_token_time,
            finish_time=group.finish_time,
            prompt_len=group.prompt_len,
            output_len=longest,
            num_seqs=group.max_num_seqs,
            num_preemptions=group.num_preemptions,
            num_swaps=group.num_swaps,
            cached_prompt_tokens=group.num_cached_prompt_tokens,
            total_output_len=longest if len(outputs) == 1 else sum(outputs),
            token_spans=token_spans or (),  # (one shared empty tuple, not a list per record)
            step_times=step_times,
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


# The StepRecord fields that stay the same through a run of decode steps (all but time, duration,
# blocks used and logical, and the utilization, which is blocks used over the pool).
HELD_FIELDS = ("num_running_requests", "num_scheduled_seqs", "num_prefill_tokens", "num_decode_seqs", "num_waiting",
               "num_swapped", "num_preempted", "blocks_swapped_in", "blocks_swapped_out", "blocks_copied")

