"""The prefix reuse pagesim measures on Mooncake's conversation trace with a cache that never
evicts, against the reuse computed directly from the hash ids: a set of the hash-id chains
(a block and every block before it) seen so far, request by request in arrival order.

The two differ only where a request is admitted while the earlier request that brought its
prefix is still computing it (the blocks are registered when computed, not when seen); the
test checks that every shortfall is such a case, and that the total stays within 1 point."""

from __future__ import annotations

from pathlib import Path

from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.workload.trace import Trace, load_trace

TRACE = Path(__file__).resolve().parents[2] / "traces" / "mooncake_conversation.json"
NUM = 1500  # the first 1500 requests (about 7 minutes of the hour): 18 M prompt tokens
BLOCK = 16


def reference_reuse(requests, block_tokens: int) -> list[tuple[int, list[int]]]:
    """Per request: prompt tokens whose whole prefix appeared in an earlier request, and for
    each of those hashed blocks the index of the first earlier request that had its chain."""
    first_seen: dict[tuple[int, ...], int] = {}
    out = []
    for i, r in enumerate(requests):
        reused, sources = 0, []
        chain: tuple[int, ...] = ()
        for k, h in enumerate(r.hash_ids):
            chain += (h,)
            if len(sources) == k and chain in first_seen:
                reused = min(r.prompt_len, (k + 1) * block_tokens)
                sources.append(first_seen[chain])
            else:
                first_seen.setdefault(chain, i)
        out.append((reused, sources))
    return out


def test_unbounded_cache_reuse_matches_the_hash_ids():
    full = load_trace(TRACE)
    trace = Trace(dict(full.metadata, count=NUM), full.requests[:NUM])
    cfg = ReplayConfig(model="llama-3.1-8b", gpu="h100-80gb", rate=None, num_requests=None, prefix_caching=True,
                       num_gpu_blocks=1_600_000, block_size=BLOCK)
    replay = Replay(cfg, trace, keep_steps=False)
    result = replay.run()
    assert replay.scheduler.kv.device.num_evictions == 0  # the cache really is unbounded here
    records = sorted(result.metrics.requests, key=lambda r: r.request_id)
    assert [r.prompt_len for r in records] == [r.prompt_len for r in trace.requests]

    reference = reference_reuse(trace.requests, full.metadata["hash_block_tokens"])
    total = sum(r.prompt_len for r in trace.requests)
    ref_ratio = sum(reused for reused, _ in reference) / total
    sim_ratio = sum(r.cached_prompt_tokens for r in records) / total
    assert result.summary["prefill_tokens_saved"] == sum(r.cached_prompt_tokens for r in records)
    assert ref_ratio > 0.2  # the trace shares a lot: the comparison is about something
    assert abs(sim_ratio - ref_ratio) < 0.01, (sim_ratio, ref_ratio)

    shortfalls = 0
    block_tokens = full.metadata["hash_block_tokens"]
    for rec, (reused, sources) in zip(records, reference):
        # whole cache blocks only, and the last prompt token is always computed
        allowed = min(reused, (rec.prompt_len - 1) // BLOCK * BLOCK)
        assert rec.cached_prompt_tokens <= allowed, rec.request_id  # never more than the hash ids allow
        if rec.cached_prompt_tokens < allowed:
            shortfalls += 1
            # the first hashed block missed was brought by a request that had not computed it
            # (its prefill not finished) when this one was admitted
            source = sources[rec.cached_prompt_tokens // block_tokens]
            assert records[source].first_token_time > rec.first_scheduled_time, (rec.request_id, source)
    assert 0 < shortfalls < NUM * 0.05  # the in-flight case occurs, and rarely
