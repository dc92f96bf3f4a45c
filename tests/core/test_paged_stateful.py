"""PagedKVManager against a shadow model with simulated physical KV memory.

The machine drives the manager through its public API the way the scheduler does (admit with
prefix hits, chunked prefill, decode appends, forks, copy-on-write, recompute preemption, swap
out/in of whole groups, free) and plays the executor: it applies copy-on-write and swap mappings
to a simulated memory and writes each computed token's "K/V" into the slot the block table names.
The value written at position p is the whole token prefix up to p (what a real K/V depends on),
so reading a sequence back through its block table proves that forks, copy-on-write, swap round
trips and prefix hits give every sequence exactly its own tokens.
"""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pagesim.core import OutOfBlocks, PagedKVManager, Request, SamplingParams, Sequence, SequenceGroup, SequenceStatus

from .driver import DEV, HOST, copy_blocks

IDX = st.integers(0, 10**6)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _clone(mgr: PagedKVManager, group: SequenceGroup):
    """A cheap deep copy of the manager's device state and of one group (deepcopy is slow)."""
    clone = copy.copy(mgr)
    dev = clone.device = copy.copy(mgr.device)
    dev.refcount = list(dev.refcount)
    dev.free_queue = copy.copy(dev.free_queue)
    dev.block_hash = list(dev.block_hash)
    dev.cached = dict(dev.cached)
    clone._prompt_hashes = dict(mgr._prompt_hashes)
    clone._offered, clone._unregistered, clone._settled = dict(mgr._offered), dict(mgr._unregistered), set(mgr._settled)
    clone.pending_copies = []
    seqs = []
    for s in group.seqs:
        c = s.copy_as(s.seq_id)
        c.block_table = list(s.block_table)
        seqs.append(c)
    return clone, SequenceGroup(group.request, seqs, group.arrival_order)


class PagedMachine(RuleBasedStateMachine):
    @initialize(
        num_device=st.integers(12, 40),
        bs=st.sampled_from([1, 2, 4, 16]),
        num_host=st.integers(0, 24),
        caching=st.booleans(),
        watermark=st.sampled_from([0.0, 0.0, 0.1]),
        bases=st.lists(st.lists(st.integers(0, 2), min_size=64, max_size=64), min_size=2, max_size=3),
        chunked=st.booleans(),
    )
    def setup(self, num_device, bs, num_host, caching, watermark, bases, chunked):
        self.bs = bs
        self.num_device = num_device
        self.num_host = num_host
        self.caching = caching
        self.mgr = PagedKVManager(num_device, bs, num_host, enable_prefix_caching=caching, watermark=watermark)
        self.watermark_blocks = int(watermark * num_device)
        # Like the scheduler: prompts are admitted in chunks only in chunked mode, and only then
        # must a re-admitted group's siblings not share the prompt blocks its first sequence is
        # still computing.
        self.chunked = chunked
        if hasattr(self.mgr, "share_on_readmission"):
            self.mgr.share_on_readmission = not chunked
        self.bases = bases
        self.mem: dict[tuple[str, int, int], tuple[int, ...]] = {}  # (pool, block, offset) -> token prefix
        self.groups: list[SequenceGroup] = []  # live groups, RUNNING or SWAPPED
        self.waiting: list[SequenceGroup] = []  # preempted by recompute: no blocks, to be readmitted
        self.shadow: dict[int, list[int]] = {}  # seq_id -> the tokens it holds
        self.seen_hash: dict[int, tuple[int, ...]] = {}  # cached hash -> the block contents once seen under it
        self.next_seq = 0
        self.next_req = 0
        self.forked = False

    # -- helpers ---------------------------------------------------------------------------
    def _seqs(self, status=None):
        return [s for g in self.groups for s in g.seqs if status is None or s.status is status]

    def _group_of(self, seq):
        return next(g for g in self.groups if seq in g.seqs)

    def _val(self, seq, p):
        return tuple(self.shadow[seq.seq_id][:p + 1])

    def _apply_copies(self):
        """Copy-on-write copies, performed before any write of the step."""
        copies, self.mgr.pending_copies = self.mgr.pending_copies, []
        dev = self.mgr.device
        for src, dst in copies:
            assert dev.refcount[dst] == 1, f"copy target {dst} has refcount {dev.refcount[dst]}"
            assert dev.refcount[src] >= 1, f"copy source {src} is no longer referenced"
            for off in range(self.bs):
                if (DEV, src, off) in self.mem:
                    self.mem[(DEV, dst, off)] = self.mem[(DEV, src, off)]
                else:
                    self.mem.pop((DEV, dst, off), None)

    def _group_in(self, status, i):
        """The i-th (mod their number) group whose sequences are in status."""
        groups = [g for g in self.groups if g.seqs[0].status is status]
        return groups[i % len(groups)]

    def _move(self, mapping, src_pool, dst_pool):
        srcs = [s for s, _ in mapping]
        dsts = [d for _, d in mapping]
        assert len(set(srcs)) == len(srcs) and len(set(dsts)) == len(dsts), mapping
        copy_blocks(self.mem, mapping, src_pool, dst_pool, self.bs)

    def _compute(self, seq, n):
        """The forward pass: write n tokens' K/V at their slots, then mark them computed."""
        dev = self.mgr.device
        c = seq.num_computed_tokens
        assert len(seq.block_table) == cdiv(c + n, self.bs), (seq, seq.block_table, n)
        for p in range(c, c + n):
            b = seq.block_table[p // self.bs]
            if dev.refcount[b] > 1:
                # Only a write every sharer wants is allowed into a shared block (a re-admitted
                # group's first sequence computing the prompt its siblings share); anything else
                # is a missing copy-on-write.
                for other in self._seqs(SequenceStatus.RUNNING):
                    if b in other.block_table:
                        q = other.block_table.index(b) * self.bs + p % self.bs
                        assert q < other.num_tokens and self._val(other, q) == self._val(seq, p), (
                            f"seq {seq.seq_id} writes position {p} into block {b} shared with seq {other.seq_id}")
            assert b not in dev.free_queue
            assert dev.block_hash[b] is None, f"write into block {b}, which the prefix cache holds"
            self.mem[(DEV, b, p % self.bs)] = self._val(seq, p)
        seq.num_computed_tokens = c + n
        self.mgr.on_computed(seq)

    def _clone_for_trial(self, group):
        return _clone(self.mgr, group)

    def _try_admit(self, group, chunk):
        mgr = self.mgr
        if hasattr(mgr, "admission_hits"):
            hits = mgr.admission_hits(group)
        else:
            hits = [mgr.match_prefix(s) for s in group.seqs]
        for i, (s, h) in enumerate(zip(group.seqs, hits)):
            assert h % self.bs == 0 and 0 <= h < s.num_tokens, (h, s.num_tokens)
            if i == 0:  # a hit always leaves the last prompt token to compute
                assert h < s.prompt_len and (self.caching or h == 0), (h, s.prompt_len)
            else:  # siblings may share the first sequence's whole prompt blocks
                assert h <= s.prompt_len
        counts = []
        for s, h in zip(group.seqs, hits):
            full = s.num_tokens - h
            counts.append(max(1, full * chunk // 4) if chunk and self.chunked else full)
        # What admit really takes, measured on a copy, must agree with can_admit exactly (also for
        # re-admitted groups whose sequences hit the same free cached blocks).
        trial_mgr, trial_group = self._clone_for_trial(group)
        free0 = mgr.num_free_blocks
        try:
            trial_mgr.admit(trial_group, counts)
            taken = free0 - trial_mgr.num_free_blocks
            ok = free0 - taken >= self.watermark_blocks
        except OutOfBlocks:  # ran out of free blocks (the core says so by name, nothing else)
            ok = False
        can = mgr.can_admit(group, counts)
        assert can == ok, (counts, hits, free0)
        if not can:
            return False
        mgr.admit(group, counts)
        for s, h, n in zip(group.seqs, hits, counts):
            assert s.num_computed_tokens == h, f"admission promised {h} tokens, admit took {s.num_computed_tokens}"
            s.status = SequenceStatus.RUNNING
        assert mgr.num_free_blocks == free0 - taken
        self._apply_copies()
        for s, n in zip(group.seqs, counts):
            self._compute(s, n)
        return True

    def _step(self, seq, n):
        """allocate_slots for n tokens (after checking blocks_needed), then compute them."""
        mgr = self.mgr
        need = mgr.blocks_needed(seq, n)
        free0 = mgr.num_free_blocks
        if need > free0:
            return False  # the scheduler would preempt here
        mgr.allocate_slots(seq, n)
        assert free0 - mgr.num_free_blocks == need, "blocks_needed disagrees with what allocate_slots took"
        self._apply_copies()
        self._compute(seq, n)
        return True

    def _new_seq(self, tokens, prompt_len):
        seq = Sequence(self.next_seq, prompt_len, tokens)
        self.shadow[seq.seq_id] = list(tokens)
        self.next_seq += 1
        return seq

    # -- rules -----------------------------------------------------------------------------
    @rule(base=IDX, length=IDX, tweak=st.integers(-1, 2), chunk=st.integers(0, 3))
    def admit(self, base, length, tweak, chunk):
        length = 1 + length % min(64, 3 * self.bs + 3)
        tokens = list(self.bases[base % len(self.bases)][:length])
        if tweak >= 0:
            tokens[-1] = tweak
        seq = self._new_seq(tokens, length)
        group = SequenceGroup(Request(self.next_req, length, SamplingParams(max_tokens=100), prompt_token_ids=tokens),
                              [seq], arrival_order=self.next_req)
        self.next_req += 1
        if self._try_admit(group, chunk):
            self.groups.append(group)
        else:
            del self.shadow[seq.seq_id]

    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX, k=st.integers(1, 40))
    def continue_prefill(self, i, k):
        """A chunked prefill (or a recompute) continues."""
        todo = [s for s in self._seqs(SequenceStatus.RUNNING) if s.num_uncomputed_tokens > 0]
        if todo:
            seq = todo[i % len(todo)]
            self._step(seq, min(k, seq.num_uncomputed_tokens))

    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX, tok=st.integers(0, 2))
    def decode(self, i, tok):
        due = [s for s in self._seqs(SequenceStatus.RUNNING) if s.num_uncomputed_tokens == 0]
        if due:
            seq = due[i % len(due)]
            seq.append_token(tok)
            self.shadow[seq.seq_id].append(tok)
            self._step(seq, 1)

    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX, tok=st.integers(0, 2), parent_tok=st.integers(-1, 2))
    def fork(self, i, tok, parent_tok):
        """Scheduler.update's fork: the child copies the parent's tokens, shares its blocks, then
        each appends its own sampled token."""
        due = [s for s in self._seqs(SequenceStatus.RUNNING) if s.num_uncomputed_tokens == 0]
        if not due:
            return
        parent = due[i % len(due)]
        child = parent.copy_as(self.next_seq)
        self.next_seq += 1
        self.shadow[child.seq_id] = list(self.shadow[parent.seq_id])
        self.mgr.fork(parent, child)
        self._group_of(parent).seqs.append(child)
        child.append_token(tok)
        self.shadow[child.seq_id].append(tok)
        if parent_tok >= 0:
            parent.append_token(parent_tok)
            self.shadow[parent.seq_id].append(parent_tok)
        self.forked = True

    @precondition(lambda self: self.groups)
    @rule(i=IDX)
    def free_seq(self, i):
        seqs = self._seqs()
        seq = seqs[i % len(seqs)]
        group = self._group_of(seq)
        if seq.status is SequenceStatus.RUNNING:
            seq.status = SequenceStatus.FINISHED
        self.mgr.free(seq)
        assert seq.block_table == []
        group.seqs.remove(seq)
        del self.shadow[seq.seq_id]
        if not group.seqs:
            self.mgr.release(group)
            self.groups.remove(group)

    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX)
    def preempt_recompute(self, i):
        group = self._group_in(SequenceStatus.RUNNING, i)
        for seq in group.seqs:
            self.mgr.free(seq)
            seq.status = SequenceStatus.WAITING
            assert seq.block_table == [] and seq.num_computed_tokens == 0
        self.mgr.release(group)
        self.groups.remove(group)
        self.waiting.append(group)

    @precondition(lambda self: self.waiting)
    @rule(i=IDX, chunk=st.integers(0, 3))
    def readmit(self, i, chunk):
        group = self.waiting[i % len(self.waiting)]
        if self._try_admit(group, chunk):
            self.waiting.remove(group)
            self.groups.append(group)

    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX)
    def swap_out(self, i):
        group = self._group_in(SequenceStatus.RUNNING, i)
        blocks = {b for s in group.seqs for b in s.block_table}
        expected = len(blocks) <= self.mgr.host.num_free
        assert self.mgr.can_swap_out(group) == expected
        if not expected:
            return
        mapping = self.mgr.swap_out(group)
        assert {d for d, _ in mapping} == blocks
        self._move(mapping, DEV, HOST)
        for seq in group.seqs:
            seq.status = SequenceStatus.SWAPPED

    @precondition(lambda self: self._seqs(SequenceStatus.SWAPPED))
    @rule(i=IDX)
    def swap_in(self, i):
        group = self._group_in(SequenceStatus.SWAPPED, i)
        blocks = {b for s in group.seqs for b in s.block_table}
        expected = self.mgr.num_free_blocks - len(blocks) - len(group.seqs) >= self.watermark_blocks
        assert self.mgr.can_swap_in(group) == expected
        if not expected:
            return
        mapping = self.mgr.swap_in(group)
        assert {h for h, _ in mapping} == blocks
        self._move(mapping, HOST, DEV)
        for seq in group.seqs:
            seq.status = SequenceStatus.RUNNING

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def pools_match_block_tables(self):
        if not hasattr(self, "mgr"):
            return
        for name, pool, status in ((DEV, self.mgr.device, SequenceStatus.RUNNING), (HOST, self.mgr.host, SequenceStatus.SWAPPED)):
            refs = Counter(b for s in self._seqs(status) for b in s.block_table)
            for s in self._seqs(status):
                assert len(set(s.block_table)) == len(s.block_table), f"{name} table repeats a block: {s.block_table}"
            assert all(0 <= b < pool.num_blocks for b in refs)
            assert [pool.refcount[b] for b in range(pool.num_blocks)] == [refs[b] for b in range(pool.num_blocks)], name
            free = set(pool.free_queue)
            assert len(free) == pool.num_free
            assert free == {b for b in range(pool.num_blocks) if refs[b] == 0}, f"{name}: free queue vs referenced blocks"
            assert pool.num_free + len(refs) == pool.num_blocks
        assert self.mgr.num_free_blocks == self.mgr.device.num_free
        assert self.mgr.num_used_blocks == self.num_device - self.mgr.device.num_free
        for g in self.waiting:
            assert all(s.block_table == [] and s.num_computed_tokens == 0 for s in g.seqs)

    @invariant()
    def contents_read_back(self):
        if not hasattr(self, "mgr"):
            return
        for seq in self._seqs():
            assert seq.token_ids == self.shadow[seq.seq_id]
            assert seq.num_tokens == len(seq.token_ids)
            assert len(seq.block_table) == cdiv(seq.num_computed_tokens, self.bs), seq
            pool = DEV if seq.status is SequenceStatus.RUNNING else HOST
            for p in range(seq.num_computed_tokens):
                got = self.mem.get((pool, seq.block_table[p // self.bs], p % self.bs))
                assert got == self._val(seq, p), f"seq {seq.seq_id} position {p} reads {got}, expected {self._val(seq, p)}"

    @invariant()
    def prefix_cache_is_sound(self):
        if not hasattr(self, "mgr"):
            return
        dev = self.mgr.device
        if not self.caching:
            assert not dev.cached
            return
        assert len(dev.cached) == sum(h is not None for h in dev.block_hash)
        for h, b in dev.cached.items():
            assert dev.block_hash[b] == h
            # a cached block is full, holds one consistent prefix, and a hash always names the same tokens
            last = self.mem.get((DEV, b, self.bs - 1))
            assert last is not None and len(last) % self.bs == 0
            for off in range(self.bs):
                assert self.mem.get((DEV, b, off)) == last[:len(last) - self.bs + off + 1]
            assert self.seen_hash.setdefault(h, last) == last, "one hash, two different prefixes"
            if dev.refcount[b] == 0:
                assert b in dev.free_queue

    @invariant()
    def waste_adds_up(self):
        if not hasattr(self, "mgr"):
            return
        running = [g for g in self.groups if g.seqs[0].status is SequenceStatus.RUNNING]
        w = self.mgr.waste(running)
        bs = self.bs
        assert w.total == self.num_device * bs
        slots = {(s.block_table[p // bs], p % bs) for g in running for s in g.seqs for p in range(s.num_computed_tokens)}
        assert w.token_states == len(slots)
        assert w.free == self.mgr.device.num_free * bs
        assert w.reserved == 0 and w.external_fragmentation == 0
        if not self.forked:
            assert w.internal_fragmentation < bs * max(1, len(self._seqs(SequenceStatus.RUNNING))) or w.internal_fragmentation == 0


PagedMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestPagedKVManager = PagedMachine.TestCase


def test_can_admit_counts_shared_hits_once():
    kv = PagedKVManager(12, 1, enable_prefix_caching=True, watermark=0.0)
    kv.share_on_readmission = False  # as under chunked prefill (where the scheduler turns it off)
    first = Sequence(0, 6, [0] * 6)
    kv.admit(SequenceGroup(Request(0, 6, SamplingParams(), prompt_token_ids=[0] * 6), [first], 0), [6])
    first.num_computed_tokens = 6
    kv.on_computed(first)
    kv.free(first)  # 5 full blocks stay cached, with refcount 0
    seqs = [Sequence(1, 6, [0] * 6), Sequence(2, 6, [0] * 6)]
    for s in seqs:
        s.append_token(0)  # a group preempted by recompute after its first output
    group = SequenceGroup(Request(1, 6, SamplingParams(n=2), prompt_token_ids=[0] * 6), seqs, 1)
    assert [kv.match_prefix(s) for s in seqs] == [5, 5]
    # admit would revive the 5 cached blocks once and add 2 blocks per sequence: 9 of 12
    assert kv.can_admit(group, [2, 2])
    kv.admit(group, [2, 2])
    assert kv.num_free_blocks == 3


def test_prefix_cache_evicts_least_recently_freed_and_tail_first():
    kv = PagedKVManager(8, 4, enable_prefix_caching=True, watermark=0.0)

    def run(rid, tokens):
        seq = Sequence(rid, len(tokens), tokens)
        group = SequenceGroup(Request(rid, len(tokens), SamplingParams(), prompt_token_ids=tokens), [seq], rid)
        n = len(tokens) - kv.match_prefix(seq)
        assert kv.can_admit(group, [n])
        kv.admit(group, [n])
        seq.num_computed_tokens = len(tokens)
        kv.on_computed(seq)
        return seq

    a = run(0, [1] * 13)  # 3 full cached blocks + 1
    b = run(1, [2] * 13)
    assert kv.num_free_blocks == 0
    kv.free(a)
    kv.free(b)  # a was freed first: its blocks go first, and within a, its tail first
    probe = Sequence(9, 13, [1] * 13)
    assert kv.match_prefix(probe) == 12
    c = run(2, [3] * 5)  # takes 2 blocks: a's unhashed tail block and a's third cached block
    assert kv.match_prefix(Sequence(10, 13, [1] * 13)) == 8
    assert kv.match_prefix(Sequence(11, 13, [2] * 13)) == 12
    kv.free(c)
    d = run(3, [4] * 9)  # 3 more: a's two remaining cached blocks, then b's unhashed tail block
    assert kv.match_prefix(Sequence(12, 13, [1] * 13)) == 0
    assert kv.match_prefix(Sequence(13, 13, [2] * 13)) == 12
    assert kv.device.num_evictions == 3
    kv.free(d)
