"""What bench sends for a Mooncake request (known by its block hash ids): token ids in the
model's vocabulary that share exactly the blocks the hash ids share, the same on every run, and
cut with the prompt when a server's context is shorter."""

from __future__ import annotations

from pagesim.bench.context import clamped
from pagesim.bench.prompts import PromptMaker
from pagesim.workload.requests import build_requests
from pagesim.workload.trace import Trace, TraceRequest


def mooncake_like() -> Trace:
    return Trace({"hash_block_tokens": 512}, [
        TraceRequest(700, 5, arrival_time=0.0, hash_ids=[10, 11]),
        TraceRequest(1500, 5, arrival_time=1.0, hash_ids=[10, 11, 12]),
        TraceRequest(600, 5, arrival_time=2.0, hash_ids=[13, 11]),  # 11 again, but after another first block
    ])


def test_prompts_share_what_the_hash_ids_share():
    requests, _ = build_requests(mooncake_like(), rate=None)
    maker = PromptMaker(vocab_size=32_000, seed=3)
    a, b, c = (maker.prompt(r) for r in requests)
    assert (len(a), len(b), len(c)) == (700, 1500, 600)
    assert all(4 <= t < 32_000 for t in a + b + c)
    assert a == b[:700]  # block 10, then the first 188 tokens of block 11 (a partial block is its start)
    assert a[:512] != c[:512]  # different first blocks
    # the same hash id gives the same tokens wherever it stands; a prefix cache still misses
    # there, since the blocks before differ
    assert c[512:600] == b[512:600]
    assert PromptMaker(vocab_size=32_000, seed=3).prompt(requests[1]) == b  # the same on every run
    assert PromptMaker(vocab_size=32_000, seed=4).prompt(requests[1]) != b


def test_clamping_to_a_short_context_cuts_the_hashed_prompt():
    requests, _ = build_requests(mooncake_like(), rate=None)
    short = clamped(requests[1], max_model_len=1024)
    assert short.prompt_len == 1023 and short.hashed_prompt.hash_ids == (10, 11)
    maker = PromptMaker(vocab_size=32_000, seed=3)
    assert maker.prompt(short) == maker.prompt(requests[1])[:1023]
