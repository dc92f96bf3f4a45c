"""The periodic engine line vLLM users read in their server's log: token throughput since the last
line, the queues and the KV cache, every few seconds while there is work (an idle server is quiet
after the line that saw its last work)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from pagesim.serve.metrics import ServerStats

stats_log = logging.getLogger("pagesim.serve.stats")


@dataclass(frozen=True)
class StatsSnapshot:
    prompt_tokens: int
    generation_tokens: int
    running: int
    waiting: int
    swapped: int
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions: int
    finished: int

    @classmethod
    def of(cls, stats: ServerStats) -> StatsSnapshot:
        with stats.lock:
            return cls(stats.prompt_tokens, stats.generation_tokens, stats.running, stats.waiting, stats.swapped,
                       stats.kv_blocks_used, stats.num_kv_blocks, stats.preemptions, sum(stats.finished.values()))


def stats_line(before: StatsSnapshot, now: StatsSnapshot, seconds: float) -> str | None:
    """The line for an interval of `seconds`, or None when nothing happened and nothing waits."""
    busy = now.running or now.waiting or now.swapped
    if not busy and now == before:
        return None
    usage = 100.0 * now.kv_blocks_used / now.kv_blocks_total if now.kv_blocks_total else 0.0
    return (f"prompt throughput {(now.prompt_tokens - before.prompt_tokens) / seconds:.1f} tokens/s, "
            f"generation throughput {(now.generation_tokens - before.generation_tokens) / seconds:.1f} tokens/s, "
            f"running {now.running} reqs, waiting {now.waiting} reqs, swapped {now.swapped} reqs, "
            f"KV cache usage {usage:.1f}% ({now.kv_blocks_used}/{now.kv_blocks_total} blocks), "
            f"finished {now.finished - before.finished} reqs, preemptions {now.preemptions - before.preemptions}")


async def log_stats_every(stats: ServerStats, interval_s: float) -> None:
    """Runs until cancelled (the server's lifespan owns the task)."""
    loop = asyncio.get_running_loop()
    before, at = StatsSnapshot.of(stats), loop.time()
    while True:
        await asyncio.sleep(interval_s)
        now, now_at = StatsSnapshot.of(stats), loop.time()
        line = stats_line(before, now, now_at - at)
        if line is not None:
            stats_log.info(line)
        before, at = now, now_at
