"""What reusing a session's own KV buys: TTFT of later turns (turn >= 1) with prefix caching off and
on (at one or more pool sizes), beside first turns', and how much of the later turns' prompts the
cache served. For reports/real_traces.md: `session_reuse(trace, ...)`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

from pagesim.metrics import percentile
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace


@dataclass
class TurnStats:
    count: int
    ttft_mean: float | None
    ttft_p50: float | None
    ttft_p99: float | None

    @classmethod
    def of(cls, ttfts: list[float]) -> "TurnStats":
        values = sorted(ttfts)
        if not values:
            return cls(0, None, None, None)
        return cls(len(values), sum(values) / len(values), percentile(values, 50), percentile(values, 99))


@dataclass
class ReuseRun:
    prefix_caching: bool
    num_gpu_blocks: int  # the pool the run had
    first_turns: TurnStats  # turn 0 (and requests of no session)
    later_turns: TurnStats  # turns >= 1
    prefix_hit_rate: float | None  # prompt blocks found / looked up, over all requests (None: caching off)
    later_turns_cached_share: float  # of the later turns' prompt tokens, the share the cache served
    num_rejected: int

    def to_dict(self) -> dict:
        return asdict(self)


def session_reuse(trace: Trace, cache_blocks: Sequence[int | None] = (None,), **options) -> list[ReuseRun]:
    """One replay with prefix caching off, then one with it on per pool size in cache_blocks (None:
    the pool the model and GPU leave; a number: --num-gpu-blocks, which may exceed the GPU's memory
    for a what-if). options: ReplayConfig fields (model, gpu, rate, ...); num_requests defaults to
    the trace's length (no cycling). Only finished requests count in the TTFT statistics."""
    options.setdefault("num_requests", len(trace))
    # the same steps with caching off and on (vLLM v0 chunks a long-context model only without
    # caching: default_chunked_prefill), so the two differ by the cache alone
    options.setdefault("chunked_prefill", False)
    runs = [_run(trace, ReplayConfig(**options, prefix_caching=False))]
    for blocks in cache_blocks:
        extra = {} if blocks is None else {"num_gpu_blocks": blocks}
        runs.append(_run(trace, ReplayConfig(**{**options, **extra}, prefix_caching=True)))
    return runs


def _run(trace: Trace, cfg: ReplayConfig) -> ReuseRun:
    sim = Replay(cfg, trace, keep_steps=False)
    result = sim.run()
    first, later = [], []
    later_prompt = later_cached = 0
    for r in result.metrics.requests:
        is_later = r.turn is not None and r.turn > 0
        if r.status == "finished":
            (later if is_later else first).append(r.ttft)
        if is_later:
            later_prompt += r.prompt_len
            later_cached += r.cached_prompt_tokens
    return ReuseRun(cfg.prefix_caching, sim.pool.num_device_blocks, TurnStats.of(first), TurnStats.of(later),
                    result.summary.get("prefix_hit_rate"), later_cached / later_prompt if later_prompt else 0.0,
                    result.summary["num_rejected"])
