"""WasteBreakdown (the paper's Fig. 2) of both managers: it always adds up to the pool, and matches
the breakdown computed by hand from the block tables and the reservation arithmetic."""

from __future__ import annotations

import random

import pytest

from pagesim.core import PagedKVManager, Request, ReservationKVManager, Sample, SamplingParams, Scheduler, SchedulerConfig, StepResult

from .driver import FakeEngine, make_scheduler, random_requests


def pow2_at_least(n):
    p = 1
    while p < n:
        p *= 2
    return p


def cdiv(a, b):
    return -(-a // b)


def _drive(sched, reqs, rng, check):
    eng = FakeEngine(sched, check_memory=False)
    pending = list(reqs)
    while pending or sched.has_unfinished:
        for _ in range(min(rng.randint(0, 2), len(pending))):
            eng.add(pending.pop(0))
        eng.step()
        w = sched.kv.waste(sched.running)
        assert w.total == sched.kv.num_device_blocks * sched.kv.block_size, w
        check(sched, w)
    return eng


@pytest.mark.parametrize("mode,chunked", [("recompute", False), ("swap", True), ("auto", False)])
def test_paged_waste_random_states_single_sequence(mode, chunked):
    sched = make_scheduler("paged", mode, chunked, num_blocks=48)
    bs = sched.kv.block_size

    def check(sched, w):
        seqs = [s for g in sched.running for s in g.seqs]
        computed = sum(s.num_computed_tokens for s in seqs)
        assert w.token_states == computed
        assert w.internal_fragmentation == sum(len(s.block_table) * bs - s.num_computed_tokens for s in seqs)
        assert w.internal_fragmentation < bs * max(1, len(seqs))
        assert w.free == sched.kv.num_free_blocks * bs
        assert w.reserved == 0 and w.external_fragmentation == 0

    rng = random.Random(4)
    _drive(sched, random_requests(rng, 150, multi=0.0), rng, check)


@pytest.mark.parametrize("caching", [False, True])
def test_paged_waste_random_states_with_sharing(caching):
    # forks and prefix hits share blocks: a shared slot counts once
    sched = make_scheduler("paged", "swap", False, num_blocks=48, num_host=400, caching=caching)
    bs = sched.kv.block_size

    def check(sched, w):
        slots = {(s.block_table[p // bs], p % bs) for g in sched.running for s in g.seqs for p in range(s.num_computed_tokens)}
        assert w.token_states == len(slots)
        assert w.free == sched.kv.num_free_blocks * bs
        assert w.internal_fragmentation == sched.kv.num_used_blocks * bs - len(slots)

    rng = random.Random(6)
    _drive(sched, random_requests(rng, 150, multi=0.3, prefixes=2 if caching else 0), rng, check)


@pytest.mark.parametrize("allocator", ["buddy", "first-fit"])
@pytest.mark.parametrize("estimate", ["max", "pow2", "oracle"])
def test_reservation_waste_random_states(estimate, allocator):
    max_len, bs = 128, 4
    sched = make_scheduler(estimate, "recompute", False, num_blocks=96, allocator=allocator, max_model_len=max_len)

    def check(sched, w):
        token = reserved = internal = external = used = 0
        for g in sched.running:
            out = g.sampling.max_tokens
            guess = {"max": max_len, "pow2": pow2_at_least(out), "oracle": out}[estimate]
            requested = cdiv(min(g.prompt_len + guess, max_len), bs)
            chunk = pow2_at_least(requested) if allocator == "buddy" else requested
            final = min(g.prompt_len + out, max_len)
            ranges = g.sampling.n  # every sample's range is taken at admission
            used += ranges * chunk
            token += sum(s.num_computed_tokens for s in g.seqs)
            reserved += ranges * final - sum(s.num_computed_tokens for s in g.seqs)
            internal += ranges * (requested * bs - final)
            external += ranges * (chunk - requested) * bs
        assert (w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation) == (token, reserved, internal, external)
        assert w.free == (sched.kv.num_device_blocks - used) * bs

    rng = random.Random(8)
    _drive(sched, random_requests(rng, 120, multi=0.2), rng, check)


# The paper's arithmetic, by hand: prompt 100, max_tokens 300, block 16, max length 2048, a pool
# of 256 blocks (4096 slots). After the prefill step 100 tokens are computed, 300 are to come.
#   max:    min(100 + 2048, 2048) = 2048 tokens = 128 blocks; buddy 128.  internal 2048 - 400
#   pow2:   100 + 512 = 612 tokens = 39 blocks (624 slots); buddy 64.      internal 224, external 25 x 16
#   oracle: 400 tokens = 25 blocks; buddy 32.                              external 7 x 16
HAND = [
    # estimate, allocator, (token_states, reserved, internal, external, free)
    ("max", "buddy", (100, 300, 1648, 0, (256 - 128) * 16)),
    ("max", "first-fit", (100, 300, 1648, 0, (256 - 128) * 16)),
    ("pow2", "buddy", (100, 300, 224, 400, (256 - 64) * 16)),
    ("pow2", "first-fit", (100, 300, 224, 0, (256 - 39) * 16)),
    ("oracle", "buddy", (100, 300, 0, 112, (256 - 32) * 16)),
    ("oracle", "first-fit", (100, 300, 0, 0, (256 - 25) * 16)),
]


def _reservation_sched(estimate, allocator, num_blocks=256):
    kv = ReservationKVManager(num_blocks, 16, estimate=estimate, max_model_len=2048, allocator=allocator)
    return Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2560, max_model_len=2048), kv)


@pytest.mark.parametrize("estimate,allocator,expected", HAND)
def test_reservation_waste_by_hand(estimate, allocator, expected):
    sched = _reservation_sched(estimate, allocator)
    g = sched.add_request(Request(0, 100, SamplingParams(max_tokens=300)))
    out = sched.schedule(0.0)
    sched.update(out, StepResult(default_token=1), 0.0)
    w = sched.kv.waste(sched.running)
    assert (w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation, w.free) == expected
    for k in range(1, 6):  # each decode step moves one slot from reserved to token states
        out = sched.schedule(float(k))
        sched.update(out, StepResult(default_token=1), float(k))
        w = sched.kv.waste(sched.running)
        assert (w.token_states, w.reserved) == (100 + k, 300 - k)
        assert (w.internal_fragmentation, w.external_fragmentation, w.free) == expected[2:]
    assert len(g.seqs[0].block_table) == {"max": 128, "pow2": 39, "oracle": 25}[estimate]


def test_reservation_waste_by_hand_capped_and_parallel():
    # pow2 near the length cap: min(1900 + 128, 2048) = 2028 tokens = 127 blocks (2032 slots),
    # buddy 128; the sequence ends at 2000 tokens: internal 32, external 16.
    sched = _reservation_sched("pow2", "buddy")
    sched.add_request(Request(0, 1900, SamplingParams(max_tokens=100)))
    out = sched.schedule(0.0)
    sched.update(out, StepResult(default_token=1), 0.0)
    w = sched.kv.waste(sched.running)
    assert (w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation) == (1900, 100, 32, 16)
    # oracle, n = 2: two ranges of 25 blocks (buddy 32) from admission, the child copies the prompt
    sched = _reservation_sched("oracle", "buddy")
    g = sched.add_request(Request(1, 100, SamplingParams(n=2, max_tokens=300)))
    out = sched.schedule(0.0)
    sid = g.seqs[0].seq_id
    sched.update(out, StepResult(samples={1: [Sample(sid, 5), Sample(sid, 6)]}), 0.0)
    assert len(g.seqs) == 2
    w = sched.kv.waste(sched.running)
    assert (w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation, w.free) == (
        200, 600, 0, 2 * 112, (256 - 64) * 16)


def test_paged_waste_by_hand():
    kv = PagedKVManager(64, 16)
    sched = Scheduler(SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=2560, max_model_len=2048), kv)
    sched.add_request(Request(0, 100, SamplingParams(max_tokens=300)))
    sched.add_request(Request(1, 32, SamplingParams(max_tokens=300)))
    out = sched.schedule(0.0)
    sched.update(out, StepResult(default_token=1), 0.0)
    w = kv.waste(sched.running)
    # 100 tokens in 7 blocks (12 slots unused), 32 tokens in 2 full blocks
    assert (w.token_states, w.reserved, w.internal_fragmentation, w.external_fragmentation, w.free) == (
        132, 0, 12, 0, (64 - 9) * 16)
