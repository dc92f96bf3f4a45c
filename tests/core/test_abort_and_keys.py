"""Aborting a request (what a server does when its client goes away) and the prefix cache's
collision-resistant block key."""

from __future__ import annotations

import hashlib
import struct

import pytest

from pagesim.core import PoolConfig, SchedulerConfig, SequenceStatus, make_scheduler
from pagesim.core.paged import block_hashes, sha256_block_key
from .driver import FakeEngine
from .test_scheduler import paged_sched, req


@pytest.mark.parametrize("where", ["waiting", "running", "swapped", "recompute-waiting"])
def test_abort_frees_every_block_wherever_the_group_is(where):
    mode = "swap" if where == "swapped" else "recompute"
    sched = paged_sched(18, bs=4, num_host=18, mode=mode)
    eng = FakeEngine(sched, check_memory=True)
    r0 = eng.add(req(0, 4, 20))
    r1 = eng.add(req(1, 2, 20, n=3))
    if where == "waiting":
        target = r1
    elif where == "running":
        eng.step()
        target = r0
        assert r0.seqs[0].status is SequenceStatus.RUNNING and r0.seqs[0].block_table
    else:  # run until r1 (n=3, the newest) is preempted: swapped out, or back in the queue
        while not eng.preempt_modes:
            eng.step()
        target = r1
        assert (sched.swapped if where == "swapped" else sched.waiting)[0] is r1
    live = len(target.seqs)
    assert sched.abort(target, eng.now)
    assert target.is_finished and target.finish_time == eng.now
    assert [s.status for s in target.finished_seqs[-live:]] == [SequenceStatus.ABORTED] * live
    assert target not in sched.running + sched.swapped + list(sched.waiting)
    assert not sched.abort(target, eng.now), "a second abort finds nothing"
    eng.groups.remove(target)
    while sched.has_unfinished:  # the others still finish with the right tokens
        eng.step()
    eng.check_finished()
    eng.check_pool_empty()


def test_sha256_key_is_sha256_over_parent_and_token_ids():
    tokens = list(range(100, 112))
    keys = block_hashes(tokens, 4, 3, sha256_block_key)
    parent = b""
    for i in range(3):  # the documented construction, written out independently
        parent = hashlib.sha256(parent + struct.pack("<4q", *tokens[4 * i:4 * i + 4])).digest()
        assert keys[i] == parent
    assert block_hashes(tokens, 4, 1) == [hash((0, (100, 101, 102, 103)))]  # the simulator keeps the fast key


def test_sha256_keys_chain_the_prefix():
    a = block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4, 2, sha256_block_key)
    b = block_hashes([9, 2, 3, 4, 5, 6, 7, 8], 4, 2, sha256_block_key)
    assert a[1] != b[1], "the same block after a different prefix must not match"


def test_a_server_pool_hits_its_prefix_cache_with_sha256_keys():
    pool = PoolConfig(32, 0, 4, prefix_caching=True, prefix_key="sha256")
    sched = make_scheduler("paged", pool, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64))
    eng = FakeEngine(sched)
    shared = [7] * 12
    eng.add(req(0, 13, 3, tokens=shared + [1]))
    while sched.has_unfinished:
        eng.step()
    second = eng.add(req(1, 13, 3, tokens=shared + [2]))
    eng.step()
    assert second.num_cached_prompt_tokens == 12
    assert all(isinstance(k, bytes) and len(k) == 32 for k in sched.kv.device.cached)
    with pytest.raises(ValueError, match="prefix key"):
        make_scheduler("paged", PoolConfig(8, prefix_caching=True, prefix_key="md5"),
                       SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=64))
