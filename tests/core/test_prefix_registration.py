"""Prefix caching registers each full prompt block once (issue 30): the same hits, evictions,
block tables and cache contents as registering every full prompt block after every step.

The reference is the registration rule as it was, kept only here: on_computed offers every full
prompt block of the sequence to the cache again. Both managers are driven side by side through
the scheduler (random workloads with shared prefixes, forks, recompute and swap preemption,
chunked prefill; the fake engine's memory checks on the one under test) and through the
simulator on two real traces, and compared after every step.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pagesim.core import PagedKVManager
from pagesim.core.request import Request

from .driver import FakeEngine, make_scheduler, random_requests

REPO = Path(__file__).resolve().parents[2]


class ReregisterEverything(PagedKVManager):
    """The old rule: every full prompt block is offered again after every step."""

    def on_computed(self, seq):
        if not self.enable_prefix_caching or not seq.has_token_ids:
            return
        hashes = self._hashes(seq)
        full = min(seq.num_computed_tokens // self.block_size, len(hashes))
        for i in range(full):
            self.device.register(seq.block_table[i], hashes[i])


def kv_state(sched) -> dict:
    kv = sched.kv
    return {
        "tables": [(s.seq_id, s.status, tuple(s.block_table), s.num_computed_tokens)
                   for q in (sched.running, sched.swapped, sched.waiting) for g in q for s in g.seqs],
        "free_queue": list(kv.device.free_queue), "refcount": list(kv.device.refcount),
        "host_free_queue": list(kv.host.free_queue),
        "cached": dict(kv.device.cached), "block_hash": list(kv.device.block_hash),
        "evictions": kv.device.num_evictions, "hits": (kv.prefix_queries, kv.prefix_hits),
    }


CASES = [("recompute", False, 0.0), ("swap", False, 0.3), ("auto", True, 0.3), ("recompute", True, 0.0)]


def cycled(reqs: list[Request], distinct: int | None) -> list[Request]:
    """reqs, or the first `distinct` of them submitted again and again (the same prompt lists, as
    a replay cycling its trace submits them)."""
    if distinct is None:
        return reqs
    return [Request(i, r.prompt_len, r.sampling, prompt_token_ids=r.prompt_token_ids)
            for i, r in enumerate(reqs[i % distinct] for i in range(len(reqs)))]


def side_by_side(mode: str, chunked: bool, multi: float, seed: int, reference_class=ReregisterEverything,
                 distinct: int | None = None) -> int:
    """Run the manager and reference_class (a PagedKVManager keeping an older rule) in lock
    step, comparing after every step; returns how many retries (blocks whose hash another block
    held) were pending over the run. distinct: the requests are that many prompts cycled."""
    engines = []
    for reference in (False, True):
        sched = make_scheduler("paged", mode, chunked, num_blocks=48, caching=True)
        if reference:
            sched.kv.__class__ = reference_class
        engines.append(FakeEngine(sched, check_memory=not reference))
    rng = random.Random(f"{mode}-{chunked}-{multi}-{seed}")
    pending = cycled(random_requests(rng, 200, multi=multi, prefixes=3, max_model_len=128), distinct)
    copies = cycled(random_requests(random.Random(f"{mode}-{chunked}-{multi}-{seed}"), 200, multi=multi, prefixes=3,
                                    max_model_len=128), distinct)
    retried = 0
    while pending or engines[0].sched.has_unfinished:
        k = min(rng.randint(0, 3), len(pending))  # bursts: the same prefix computed twice in one step
        for _ in range(k):
            engines[0].add(pending.pop(0))
            engines[1].add(copies.pop(0))
        retried += sum(len(v) for v in engines[0].kv._unregistered.values())
        for eng in engines:
            eng.step()
        assert kv_state(engines[0].sched) == kv_state(engines[1].sched), f"step {engines[0].steps}"
    for eng in engines:
        eng.check_finished()
    engines[0].check_pool_empty()
    assert engines[0].kv.prefix_hits > 0 and engines[0].kv.device.num_evictions > 0
    return retried


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mode,chunked,multi", CASES)
def test_registering_once_matches_registering_everything(mode, chunked, multi, seed):
    side_by_side(mode, chunked, multi, seed)


def test_the_retry_path_is_exercised():
    # blocks whose hash another block held, waiting to be registered, occur in these workloads
    assert sum(side_by_side(m, c, n, 0) for m, c, n in CASES) > 0


@pytest.mark.parametrize("trace", ["sharegpt_chat.json", "translation_5shot.json"])
def test_replays_of_two_traces_match_the_old_rule(trace, monkeypatch):
    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.workload.trace import load_trace

    path = REPO / "traces" / trace
    cfg = ReplayConfig(prefix_caching=True, chunked_prefill=True, num_requests=400, rate=8.0, model="llama-2-7b",
                       gpu="a100-80gb", num_gpu_blocks=600)
    results = []
    for reference in (False, True):
        replay = Replay(cfg, load_trace(path))
        if reference:
            replay.scheduler.kv.__class__ = ReregisterEverything
        result = replay.run()
        kv = replay.scheduler.kv
        results.append((result.summary, kv.device.num_evictions, kv.prefix_hits, kv.prefix_queries,
                        list(result.metrics.requests), list(result.metrics.step_log.kv_blocks_used)))
    assert results[0] == results[1]
    assert results[0][1] > 0 and results[0][2] > 0, "the replay evicts and hits"
