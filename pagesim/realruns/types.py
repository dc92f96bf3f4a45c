"""One type for every recorded real run, whatever wrote it: the workload it served (arrivals,
lengths, prompt sharing), the server's settings where recorded, and the measured latencies.

Times are seconds from the run's first arrival. A RealRun's requests are in arrival order, so
`to_trace()` gives a trace whose request i is `run.requests[i]` (a replay's request_id i is the
run's `requests[i].index`). docs/validate.md ("Formats") says what each reader fills in.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field, fields

from pagesim.workload.trace import Trace, TraceRequest


@dataclass(slots=True)
class RealRequest:
    index: int  # the run's own request id / position (request_id in outputs)
    arrival_s: float  # when the client sent it, seconds from the run's first arrival
    prompt_len: int
    output_len: int  # output tokens as the run recorded them (may be a client's miscount)
    generated_len: int  # tokens the server is taken to have generated: what the replay generates
    ok: bool = True  # False: the run recorded an error (kept in the trace, left out of the measured metrics)
    error: str = ""  # why it failed, as recorded (or inferred, said so)
    ttft_s: float | None = None  # measured from arrival_s
    e2e_s: float | None = None
    stage: int = 0
    max_tokens: int | None = None  # the request's max_tokens when known
    prompt_token_ids: list[int] | None = None  # when known or rebuilt (shared lists where prompts repeat)
    prefix_group: int | str | None = None
    shared_prefix_len: int | None = None
    queued_s: float | None = None  # when the engine queued it (same origin as arrival_s), where recorded
    itl_gaps_s: list[float] | None = None  # measured gaps between output tokens, where recorded
    # a failed request: when it ended (its client gave up, or the server failed it), seconds after
    # arrival, where recorded; it stopped loading the server then (a replay that can cancel would)
    abandoned_after_s: float | None = None

    @property
    def itl_s(self) -> float | None:
        """Mean gap between output tokens: (E2E - TTFT) / (generated - 1); None for one token."""
        if not self.ok or self.ttft_s is None or self.e2e_s is None or self.generated_len < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.generated_len - 1)

    @property
    def finish_s(self) -> float | None:
        return None if self.e2e_s is None else self.arrival_s + self.e2e_s


@dataclass
class ServerConfig:
    """The server's settings, named as vLLM names them; None wherever the run did not record one
    (`pagesim validate` then uses its defaults and says so)."""

    engine: str = "vllm"
    engine_version: str | None = None
    model: str | None = None  # as the run names it (a Hugging Face id)
    model_config: str | None = None  # path of its config.json, when one was found beside the run
    gpu: str | None = None  # as the run names it
    tensor_parallel_size: int | None = None
    data_parallel_size: int | None = None
    enable_expert_parallel: bool | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    num_gpu_blocks: int | None = None  # the KV pool the server reported (e.g. kv_blocks_total_gpu)
    block_size: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    cuda_graphs: bool | None = None  # not enforce_eager
    async_scheduling: bool | None = None

    def recorded(self) -> dict:
        """The settings the run recorded (not None)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class Stage:
    """One load stage: requests sent at one rate (or concurrency)."""

    index: int
    start_s: float  # its first arrival
    end_s: float  # the end of its sending: start + configured duration, else its last arrival
    num_requests: int
    rate: float | None = None  # req/s, configured (else measured: count / span)
    concurrency: int | None = None  # requests kept in flight (closed-loop clients)
    # the concurrency is clients sending back to back (guidellm's concurrent profile, pagesim bench
    # --concurrency), not a cap on open-loop arrivals (vllm bench serve --max-concurrency)
    closed_loop: bool = False


@dataclass
class RealRun:
    name: str
    source_format: str  # "inference-perf", "llmservingsim", "distserve", "vllm-bench", "guidellm", "pagesim-bench"
    path: str
    server: ServerConfig
    requests: list[RealRequest]
    stages: list[Stage]
    assumptions: list[str] = field(default_factory=list)  # every guess the reader made, for a user

    def __post_init__(self) -> None:
        arrivals = [r.arrival_s for r in self.requests]
        if any(b < a for a, b in zip(arrivals, arrivals[1:])):
            raise ValueError(f"{self.path}: requests must be in arrival order")
        for r in self.requests:  # a reader fills in what a replay needs, or fails naming the record
            if r.prompt_len < 1 or r.generated_len < 1:
                raise ValueError(f"{self.path}: request {r.index}: a replay needs prompt_len and generated_len >= 1, "
                                 f"got {r.prompt_len} and {r.generated_len}")

    @property
    def ok_requests(self) -> list[RealRequest]:
        return [r for r in self.requests if r.ok]

    @property
    def num_failed(self) -> int:
        return sum(not r.ok for r in self.requests)

    def held_spans(self) -> list[tuple[float, float]]:
        """When the real server held each request: sent until finished or given up (a failed
        request with no recorded end is held to the end of the run)."""
        spans = []
        for r in self.requests:
            end = r.finish_s if r.ok else (None if r.abandoned_after_s is None else r.arrival_s + r.abandoned_after_s)
            spans.append((r.arrival_s, math.inf if end is None else end))
        return spans

    def held_at(self, at_s: float) -> int:
        """Requests the real server held at a moment."""
        return self.held_counts([at_s])[0]

    def held_counts(self, moments) -> list[int]:
        """Requests the real server held at each moment: sent by then (sent <= t) less those gone
        by then (end <= t); every span ends no earlier than it starts."""
        spans = self.held_spans()
        sent, ended = sorted(s for s, _ in spans), sorted(e for _, e in spans)
        return [bisect.bisect_right(sent, t) - bisect.bisect_right(ended, t) for t in moments]

    def peak_held(self) -> tuple[int, float]:
        """The most requests the real server held at once, and when it first held that many."""
        spans = self.held_spans()
        events = sorted([(sent, 1) for sent, _ in spans] + [(end, -1) for _, end in spans])
        held = peak = 0
        when = 0.0
        for at, step in events:  # (an end sorts before a send at the same moment: the request has left)
            held += step
            if held > peak:
                peak, when = held, at
        return peak, when

    def to_trace(self) -> Trace:
        """The workload as a trace the simulator replays: the same arrival times and lengths
        (each request generates generated_len tokens, as with ignore_eos), token ids where the
        prompt sharing is known (so prefix caching sees the real reuse), failed requests
        included (they loaded the server)."""
        records = [TraceRequest(prompt_len=r.prompt_len, output_len=r.generated_len, arrival_time=r.arrival_s,
                                prefix_group=r.prefix_group, shared_prefix_len=r.shared_prefix_len,
                                prompt_token_ids=r.prompt_token_ids) for r in self.requests]
        metadata = {"source": f"real run {self.name} ({self.source_format})", "path": self.path,
                    "count": len(records), "ignore_eos": True, "assumptions": list(self.assumptions),
                    "server": self.server.recorded()}
        return Trace(metadata=metadata, requests=records)

    def summary(self) -> dict:
        """Measured statistics over the successful requests (pagesim.realruns.measured)."""
        from pagesim.realruns.measured import measured_summary

        return measured_summary(self.requests)

    def stage_summaries(self) -> list[dict]:
        from pagesim.realruns.measured import measured_summary

        return [dict(measured_summary([r for r in self.requests if r.stage == s.index]), stage=s.index)
                for s in self.stages]
