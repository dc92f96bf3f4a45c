"""decode_runs.surely_admits, the cheap test a decode run asks first (is the head of the waiting
queue able to start?), is never wrong when it says yes: admission() then starts the group too.
Checked at every step of random workloads (prefix hits, forks, recompute and swap, chunked
prefill, paged and reservation managers, tight pools) against the full admission test, for
the step's own budget and for budgets that cap the prompt."""

from __future__ import annotations

import random

import pytest

from pagesim.core.decode_runs import surely_admits

from .driver import FakeEngine, make_scheduler, random_requests


@pytest.mark.parametrize("policy,caching", [("paged", True), ("paged", False), ("oracle", False)])
@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("seed", range(3))
def test_surely_admits_implies_admission(policy, chunked, caching, seed):
    sched = make_scheduler(policy, "auto" if policy == "paged" else "recompute", chunked, num_blocks=40,
                           caching=caching)
    eng = FakeEngine(sched)
    rng = random.Random(f"{policy}-{chunked}-{caching}-{seed}")
    pending = random_requests(rng, 150, multi=0.2, prefixes=3, max_model_len=128)
    said_yes = said_no = 0
    while pending or sched.has_unfinished:
        for _ in range(min(rng.randint(0, 3), len(pending))):
            eng.add(pending.pop(0))
        if sched.waiting:
            group, num_seqs = sched.waiting[0], sched.num_running_seqs
            for budget in (sched.config.max_num_batched_tokens - num_seqs, 1, rng.randint(0, 40)):
                surely = surely_admits(sched, group, budget, num_seqs)
                admits = sched._admission(group, budget, num_seqs) is not None
                assert admits or not surely, f"step {eng.steps}: surely_admits said yes, admission no"
                said_yes += surely
                said_no += not surely
        eng.step()
    eng.check_finished()
    if policy == "paged":
        assert said_yes > 0 and said_no > 0  # (both answers occur: the check is not vacuous)
    else:
        assert said_yes == 0  # (a reservation manager always asks can_admit)
