"""GET /metrics: the server's state and counters in Prometheus' text format, under vLLM's metric
names where vLLM has one (vllm:num_requests_running, vllm:kv_cache_usage_perc, ...), so
dashboards and scrapers built for vLLM read ours. Written by hand: a few gauges, counters and
histograms do not need a client library."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from pagesim.core import SequenceGroup

# vLLM's buckets for these histograms (seconds)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0, 2560.0)
TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
               960.0, 1920.0, 7680.0)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self):
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for i, upper in enumerate(self.buckets):
            if value <= upper:
                self.counts[i] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        out = [f'{name}_bucket{{{labels},le="{upper}"}} {n}' for upper, n in zip(self.buckets, self.counts)]
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{{{labels}}} {self.total!r}")
        out.append(f"{name}_count{{{labels}}} {self.count}")
        return out


@dataclass
class ServerStats:
    """Updated by the engine thread, read by /metrics (a lock keeps a scrape consistent)."""

    model_name: str
    num_kv_blocks: int
    running: int = 0
    waiting: int = 0
    swapped: int = 0
    kv_blocks_used: int = 0
    preemptions: int = 0
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    # prefix cache, in tokens: of the full prompt blocks looked up at admission, and of those found
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    finished: dict[str, int] = field(default_factory=dict)  # finish reason -> requests
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))
    tpot: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS))
    e2e: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def on_arrival(self, prompt_tokens: int) -> None:
        with self.lock:
            self.prompt_tokens += prompt_tokens

    def on_tokens(self, count: int) -> None:
        with self.lock:
            self.generation_tokens += count

    def on_step(self, scheduler) -> None:
        with self.lock:
            self.steps += 1
            self._read(scheduler)

    def on_finish(self, group: SequenceGroup, reason: str | None) -> None:
        with self.lock:
            reason = reason or "abort"
            self.finished[reason] = self.finished.get(reason, 0) + 1
            if group.first_token_time is not None:
                self.ttft.observe(group.first_token_time - group.arrival_time)
                out_len = group.output_len
                if out_len > 1:
                    self.tpot.observe((group.finish_time - group.first_token_time) / (out_len - 1))
            if group.finish_time is not None:
                self.e2e.observe(group.finish_time - group.arrival_time)

    def refresh(self, scheduler) -> None:
        """Re-read the queues and the pool (after an abort, which no step follows when idle)."""
        with self.lock:
            self._read(scheduler)

    def _read(self, scheduler) -> None:
        self.running = len(scheduler.running)
        self.waiting = len(scheduler.waiting)
        self.swapped = len(scheduler.swapped)
        self.kv_blocks_used = scheduler.kv.num_used_blocks
        self.preemptions = scheduler.num_preemptions
        kv = scheduler.kv
        block = getattr(kv, "block_size", 0)
        self.prefix_cache_queries = getattr(kv, "prefix_queries", 0) * block
        self.prefix_cache_hits = getattr(kv, "prefix_hits", 0) * block

    def render(self) -> str:
        labels = f'model_name="{self.model_name}"'
        with self.lock:
            usage = self.kv_blocks_used / self.num_kv_blocks if self.num_kv_blocks else 0.0
            gauges = [
                ("vllm:num_requests_running", "Requests in the running batch (holding KV blocks).", self.running),
                ("vllm:num_requests_waiting", "Requests waiting to be admitted (or re-admitted after a recompute).",
                 self.waiting),
                ("vllm:num_requests_swapped", "Requests swapped out to host memory.", self.swapped),
                ("vllm:kv_cache_usage_perc", "Fraction of the KV blocks in use (1 = full).", usage),
                ("vllm:gpu_cache_usage_perc", "Fraction of the KV blocks in use (vLLM's older name).", usage),
                ("pagesim:kv_blocks_used", "KV blocks in use (cached-but-free prefix blocks count as free).",
                 self.kv_blocks_used),
                ("pagesim:kv_blocks_total", "KV blocks in the device pool.", self.num_kv_blocks),
            ]
            counters = [
                ("vllm:num_preemptions_total", "Preemptions (recompute or swap) so far.", self.preemptions),
                ("pagesim:engine_steps_total", "Engine iterations (schedule, forward, update) so far.", self.steps),
                ("vllm:prompt_tokens_total", "Prompt tokens of admitted requests.", self.prompt_tokens),
                ("vllm:generation_tokens_total", "Tokens generated (all samples).", self.generation_tokens),
                ("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache (its full blocks, "
                 "the last prompt token's block left out).", self.prefix_cache_queries),
                ("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", self.prefix_cache_hits),
            ]
            lines = []
            for name, help_text, value in gauges:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name}{{{labels}}} {value}"]
            for name, help_text, value in counters:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name}{{{labels}}} {value}"]
            lines += ["# HELP vllm:request_success_total Finished requests by finish reason.",
                      "# TYPE vllm:request_success_total counter"]
            for reason, count in sorted(self.finished.items()):
                lines.append(f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {count}')
            for name, help_text, hist in (
                ("vllm:time_to_first_token_seconds", "Time to first token.", self.ttft),
                ("vllm:time_per_output_token_seconds", "Time per output token after the first, per request.", self.tpot),
                ("vllm:e2e_request_latency_seconds", "End-to-end request latency.", self.e2e),
            ):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *hist.lines(name, labels)]
        return "\n".join(lines) + "\n"
