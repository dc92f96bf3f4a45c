"""The memory-saving metric and prefix caching under pressure, against brute force.

Random workloads (parallel sampling, beam search with random ancestry, shared prompt prefixes)
run through the real scheduler and paged manager on a small pool, so that groups are preempted,
swapped and cached blocks evicted. After every step the blocks the live sequences would hold
without sharing (every block-table entry of a device-resident sequence) and the blocks they
really hold (distinct ids) are recomputed from the block tables and compared with what the
manager's running counters report, and with what MetricsRecorder writes and summarizes.
"""

from __future__ import annotations

import random

import pytest

from pagesim.core import PagedKVManager, Request, Sample, SamplingParams, StepResult
from pagesim.metrics import MetricsRecorder, StepRecord
from pagesim.sim.beam_model import first_samples, step_samples

from .driver import FakeEngine, make_scheduler, random_requests


def brute_force_blocks(sched) -> tuple[int, int]:
    """(logical, physical) device blocks of the running sequences, from their block tables."""
    tables = [seq.block_table for group in sched.running for seq in group.seqs]
    return sum(len(t) for t in tables), len({b for t in tables for b in t})


class SharingEngine(FakeEngine):
    """FakeEngine plus beam groups: a random parent-rank vector per step, distinct random token
    ids per beam (so a missing copy-on-write shows up in the K/V read-back)."""

    def __init__(self, sched, rng: random.Random):
        super().__init__(sched, check_memory=True)
        self.rng = rng
        self.metrics = MetricsRecorder(sched.kv.num_device_blocks)
        self.brute = []  # (logical, physical) after every step

    def result(self, out) -> StepResult:
        plain = super().result(out)
        samples = dict(plain.samples)
        pos = 0
        for group in out.groups:
            seqs = group.seqs
            due = [s for s, n in zip(seqs, out.num_new_tokens[pos:pos + len(seqs)]) if s.num_computed_tokens + n == s.num_tokens]
            pos += len(seqs)
            k = group.sampling.beam_width
            if k == 1 or not due:
                continue
            if len(seqs) == 1 and due[0].num_output_tokens == 0:
                drawn = first_samples(due[0], k, 0)
            elif len(due) == len(seqs) == k:
                drawn = step_samples(due, tuple(self.rng.randrange(k) for _ in range(k)), 0)
            else:
                drawn = [Sample(s.seq_id, 0, -1.0) for s in due]
            samples[group.request_id] = [Sample(s.parent_seq_id, self.rng.randrange(1000, 2000), s.logprob) for s in drawn]
        return StepResult(samples=samples)

    def step(self):
        sched = self.sched
        finished = super().step()
        logical, physical = brute_force_blocks(sched)
        assert sched.kv.num_logical_blocks == logical
        assert sched.kv.num_used_blocks == physical  # cached-but-free blocks are not in use
        self.metrics.record_step(self.last_out, self.now, 1.0, sched)
        # the step just recorded, read alone (metrics.steps rebuilds every record: quadratic over
        # a run); the test below compares all of metrics.steps with these counts once at the end
        rec = StepRecord(*self.metrics.step_log.row(self.metrics.num_steps - 1))
        assert (rec.kv_blocks_logical, rec.kv_blocks_used) == (logical, physical)
        self.brute.append((logical, physical))
        return finished


def beam_requests(rng: random.Random, count: int, start: int, vocab: int = 50) -> list[Request]:
    reqs = []
    for i in range(count):
        plen = rng.randint(1, 40)
        reqs.append(Request(start + i, plen, SamplingParams(beam_width=rng.choice([2, 3, 4]), max_tokens=rng.randint(2, 24)),
                            prompt_token_ids=[rng.randrange(vocab) for _ in range(plen)]))
    return reqs


@pytest.mark.parametrize("mode", ["recompute", "swap", "auto"])
@pytest.mark.parametrize("caching", [False, True])
def test_logical_and_used_blocks_match_block_tables(mode, caching):
    rng = random.Random(f"{mode}{caching}")
    sched = make_scheduler("paged", mode, num_blocks=48, caching=caching)
    eng = SharingEngine(sched, rng)
    reqs = random_requests(rng, 120, multi=0.3, prefixes=3 if caching else 0)
    beams = beam_requests(rng, 40, start=len(reqs))
    mixed = reqs + beams
    rng.shuffle(mixed)
    eng.run(mixed, rng)
    kv = sched.kv
    # the workload really shared blocks, and really ran short of them
    assert any(logical > physical for logical, physical in eng.brute)
    assert sched.num_preemptions > 0
    beam_done = [g for g in eng.groups if g.sampling.beam_width > 1 and not g.reject_reason]
    assert beam_done and all(len(g.finished_seqs) == g.sampling.beam_width for g in beam_done)
    assert [(r.kv_blocks_logical, r.kv_blocks_used) for r in eng.metrics.steps] == eng.brute
    # everything returns: no reference left once every group finished
    assert kv.device.num_refs == 0 and kv.num_logical_blocks == 0 and kv.num_used_blocks == 0
    assert not any(kv.device.refcount) and kv.host.num_refs == 0
    # the summary's saving is the time integral of the brute-force counts (every step lasts 1)
    logical = sum(lg for lg, _ in eng.brute)
    saved = sum(lg - ph for lg, ph in eng.brute)
    assert eng.metrics.summary()["memory_saving"] == pytest.approx(saved / logical)


@pytest.mark.spies_on_core  # (replaces BlockPool.allocate)
def test_prefix_cache_eviction_under_pressure_never_frees_a_referenced_block():
    """Shared prefixes on a pool too small to keep them: cached blocks are evicted all the time.
    FakeEngine checks after every step that refcounts equal the block-table references and the
    free queue is exactly the unreferenced blocks; here, also, at every allocation, that the
    block handed out (possibly evicting cached contents) is referenced by no live sequence."""
    rng = random.Random(7)
    sched = make_scheduler("paged", "recompute", num_blocks=40, caching=True)
    kv: PagedKVManager = sched.kv
    allocate = kv.device.allocate

    def checked_allocate():
        block = allocate()
        holders = [s.seq_id for g in sched.running + sched.swapped for s in g.seqs if block in s.block_table
                   and s.status.value == "running"]
        assert not holders, f"block {block} handed out while sequences {holders} reference it"
        return block

    kv.device.allocate = checked_allocate
    eng = FakeEngine(sched, check_memory=True)
    eng.run(random_requests(rng, 300, multi=0.1, prefixes=4), rng)
    eng.check_finished()
    eng.check_pool_empty()
    assert kv.device.num_evictions > 20, kv.device.num_evictions
    assert kv.prefix_hits > 20, kv.prefix_hits
    assert sched.num_preemptions > 0


def test_prefix_hit_rate_and_tokens_saved_in_summary():
    """Two requests with one prompt, the second after the first finished: the second finds every
    full prompt block but the last token's in the cache, and skips computing them."""
    bs, plen = 4, 23
    sched = make_scheduler("paged", "recompute", num_blocks=40, block_size=bs, caching=True)
    metrics = MetricsRecorder(sched.kv.num_device_blocks)
    ids = list(range(100, 100 + plen))
    prefill = []
    for rid in (0, 1):
        sched.add_request(Request(rid, plen, SamplingParams(max_tokens=3), prompt_token_ids=ids))
        while sched.has_unfinished:
            out = sched.schedule(0.0)
            prefill.append(out.num_prefill_tokens)
            for group in sched.update(out, StepResult(default_token=5), 0.0):
                metrics.record_request(group)
            metrics.record_step(out, 0.0, 1.0, sched)
    cached = (plen - 1) // bs * bs  # whole blocks, leaving the last prompt token to compute
    s = metrics.summary()
    assert [p for p in prefill if p] == [plen, plen - cached]
    assert s["prefill_tokens_saved"] == cached
    assert s["prefix_hit_rate"] == pytest.approx(((plen - 1) // bs) / (2 * ((plen - 1) // bs)))


def test_reservation_managers_report_no_saving():
    """Orca's forks copy the parent's reservation: a group of n holds n ranges, nothing shared."""
    sched = make_scheduler("oracle", "recompute", num_blocks=64)
    sched.add_request(Request(0, 10, SamplingParams(n=3, max_tokens=5)))
    out = sched.schedule(0.0)
    sched.update(out, StepResult(default_token=1), 0.0)
    assert len(sched.running[0].seqs) == 3 and sched.kv.num_used_blocks > 0
    assert sched.kv.num_logical_blocks == sched.kv.num_used_blocks
