"""Prefix caching keeps a finished sequence's generated blocks (issue 29): a request whose prompt
extends an earlier request's prompt and output (a session's next turn) hits those blocks.

Reference: brute force over token tuples. Requests run one at a time through the scheduler with a
pool far larger than they need (nothing is evicted), so the cache holds every full block any
finished sequence computed: the prefix prompt[:k * block_size] of each finished sequence for
k <= (its tokens - 1) // block_size (its last token's K/V is never computed). A new prompt then hits
its longest such prefix, leaving its last token to compute.
"""

from __future__ import annotations

import random

import pytest

from pagesim.core import Request, SamplingParams, StepResult

from .driver import make_scheduler

BS = 4


def run_alone(sched, request: Request, rng: random.Random, now: float) -> tuple[int, list[int]]:
    """Run one request to its end with random output tokens: (cached prompt tokens, all its tokens)."""
    group = sched.add_request(request)
    assert group.reject_reason is None
    while sched.has_unfinished:
        out = sched.schedule(now)
        now += 1.0
        finished = sched.update(out, StepResult(default_token=rng.randrange(3)), now)
    assert finished == [group]
    return group.num_cached_prompt_tokens, group.finished_seqs[0].token_ids


def next_prompt(rng: random.Random, history: list[list[int]]) -> list[int]:
    """A fresh prompt, or an earlier sequence (prompt and output) or a cut of it, plus new tokens
    (a tiny vocabulary, so unrelated prompts share blocks by chance too)."""
    base = []
    if history and rng.random() < 0.7:
        earlier = rng.choice(history)
        base = earlier[:rng.randrange(len(earlier) + 1)] if rng.random() < 0.3 else list(earlier)
    return base + [rng.randrange(3) for _ in range(rng.randrange(1, 9))]


def longest_hit(prompt: list[int], prefixes: set[tuple[int, ...]]) -> int:
    """Tokens of the longest cached run of whole blocks at the prompt's start, its last token left out."""
    hit = 0
    for k in range(1, (len(prompt) - 1) // BS + 1):
        if tuple(prompt[:k * BS]) not in prefixes:
            break
        hit = k * BS
    return hit


@pytest.mark.parametrize("seed", range(6))
def test_hits_equal_brute_force_over_prompts_and_outputs(seed):
    rng = random.Random(seed)
    sched = make_scheduler("paged", num_blocks=4096, block_size=BS, max_model_len=100_000, max_num_seqs=4,
                           max_tokens=100_000, caching=True)
    cached_prefixes: set[tuple[int, ...]] = set()
    prompt_prefixes: set[tuple[int, ...]] = set()  # what caching prompt blocks alone would hold
    history: list[list[int]] = []
    from_outputs = 0  # requests that hit more than prompt blocks alone would give
    for i in range(60):
        prompt = next_prompt(rng, history)
        if len(prompt) > 400:
            prompt = prompt[-400:]
        request = Request(i, len(prompt), SamplingParams(max_tokens=rng.randrange(1, 12), ignore_eos=True), 0.0, prompt)
        expected = longest_hit(prompt, cached_prefixes)
        hit, tokens = run_alone(sched, request, rng, float(i * 1000))
        assert hit == expected, f"request {i}"
        from_outputs += expected > longest_hit(prompt, prompt_prefixes)
        cached_prefixes.update(tuple(tokens[:k * BS]) for k in range(1, (len(tokens) - 1) // BS + 1))
        prompt_prefixes.update(tuple(prompt[:k * BS]) for k in range(1, (len(prompt) - 1) // BS + 1))
        history.append(tokens)
    assert sched.kv.device.num_evictions == 0
    assert from_outputs > 0  # the workload does reach generated blocks


def test_a_turn_that_extends_prompt_and_output_hits_all_but_its_last_block():
    # prompt 10 tokens + 9 generated = 19 tokens, 18 computed: blocks 0-3 (16 tokens) are full.
    # The next turn (those 19 tokens + 5 new) hits all 4 blocks; without generated blocks cached
    # only the prompt's first two ((10 - 1) // 4 = 2) would be.
    sched = make_scheduler("paged", num_blocks=256, block_size=BS, max_model_len=1000, caching=True)
    rng = random.Random(1)
    first = list(range(10))
    _, tokens = run_alone(sched, Request(0, 10, SamplingParams(max_tokens=9, ignore_eos=True), 0.0, first), rng, 0.0)
    assert len(tokens) == 19
    second = tokens + [7, 7, 7, 7, 7]
    hit, _ = run_alone(sched, Request(1, len(second), SamplingParams(max_tokens=2, ignore_eos=True), 0.0, second),
                       rng, 100.0)
    assert hit == 16


def test_without_prefix_caching_nothing_is_cached():
    sched = make_scheduler("paged", num_blocks=256, block_size=BS, max_model_len=1000, caching=False)
    rng = random.Random(2)
    _, tokens = run_alone(sched, Request(0, 10, SamplingParams(max_tokens=9, ignore_eos=True), 0.0, list(range(10))),
                          rng, 0.0)
    assert not sched.kv.device.cached
    hit, _ = run_alone(sched, Request(1, 24, SamplingParams(max_tokens=2, ignore_eos=True), 0.0, tokens + [1] * 5),
                       rng, 100.0)
    assert hit == 0
