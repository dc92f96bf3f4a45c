"""HybridKVManager against a brute-force per-layer model of KV memory (the shadow-memory
machine of test_paged_stateful, with KV cache groups).

Every layer of the model gets its own slots: layer l of table group t writes its K/V into slot
(l's place in t) of the table's block, and the value written at position p is the token prefix
up to p. After every operation each layer must read back exactly the positions its attention
reads next (all of them for a full layer, the last W - 1 for a sliding one) through its table;
every block's refcount must equal the (sequence, table) entries naming it; a sliding table
must hold NULL exactly where a block lies wholly before the window, and a real block wherever
it does not; and can_admit / blocks_needed must equal what admit / allocate_slots take.
"""

from __future__ import annotations

import copy
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant, precondition, rule

from pagesim.core import NULL_BLOCK, HybridKVManager, KVGroupSpec, KVLayout, SequenceGroup, SequenceStatus

from .driver import DEV, HOST, copy_blocks
from .test_paged_stateful import IDX, PagedMachine, cdiv

GROUPS = st.sampled_from([
    (KVGroupSpec("sliding", 2, 3),),
    (KVGroupSpec("full", 1), KVGroupSpec("sliding", 2, 5)),
    (KVGroupSpec("full", 2), KVGroupSpec("sliding", 2, 1), KVGroupSpec("sliding", 1, 9)),
    (KVGroupSpec("mla", 1), KVGroupSpec("sliding", 3, 6)),
])


class HybridMachine(PagedMachine):
    @initialize(
        num_device=st.integers(16, 60), bs=st.sampled_from([1, 2, 4]), num_host=st.integers(0, 30),
        caching=st.booleans(), watermark=st.sampled_from([0.0, 0.0, 0.1]), groups=GROUPS,
        bases=st.lists(st.lists(st.integers(0, 2), min_size=64, max_size=64), min_size=2, max_size=3),
        chunked=st.booleans(),
    )
    def setup(self, num_device, bs, num_host, caching, watermark, groups, bases, chunked):
        PagedMachine.setup(self, num_device, bs, num_host, caching, watermark, bases, chunked)
        self.mgr = HybridKVManager(num_device, bs, num_host, enable_prefix_caching=caching, watermark=watermark,
                                   kv_groups=groups)
        self.mgr.share_on_readmission = not chunked
        layout = KVLayout.of(groups)
        self.windows = [t.sliding_window for t in layout.tables]
        # brute force: every model layer, its table and its slot in that table's blocks
        self.layers = [(t, j) for t, table in enumerate(layout.tables) for j in range(table.num_layers)]
        assert len(self.layers) == sum(g.num_layers for g in groups)
        assert all(j < layout.layers_per_block for _, j in self.layers)
        self.slots = bs * layout.layers_per_block  # offsets of a block in the shadow memory

    # -- helpers over every table ------------------------------------------------------------
    def _tables(self, seq):
        return self.mgr.block_tables(seq)

    def _needed(self, t, computed):
        """First position layer group t reads at the next token (0 for a full table)."""
        window = self.windows[t]
        return 0 if window is None else max(0, computed - window + 1)

    def _apply_copies(self):
        copies, self.mgr.pending_copies = self.mgr.pending_copies, []
        for src, dst in copies:
            assert self.mgr.device.refcount[dst] == 1 and self.mgr.device.refcount[src] >= 1
        copy_blocks(self.mem, copies, DEV, DEV, self.slots)

    def _move(self, mapping, src_pool, dst_pool):
        assert len({s for s, _ in mapping}) == len(mapping) == len({d for _, d in mapping})
        copy_blocks(self.mem, mapping, src_pool, dst_pool, self.slots)

    def _compute(self, seq, n):
        dev, bs = self.mgr.device, self.bs
        c = seq.num_computed_tokens
        for table in self._tables(seq):
            assert len(table) == cdiv(c + n, bs), (table, c, n)
        for p in range(c, c + n):
            for layer, (t, j) in enumerate(self.layers):
                b = self._tables(seq)[t][p // bs]
                assert b != NULL_BLOCK, f"position {p} is computed into a freed entry of table {t}"
                assert b not in dev.free_queue and dev.block_hash[b] is None
                if dev.refcount[b] > 1:  # only a write every sharer wants (re-admitted siblings)
                    for other in self._seqs(SequenceStatus.RUNNING):
                        if b in self._tables(other)[t]:
                            q = self._tables(other)[t].index(b) * bs + p % bs
                            assert self._val(other, q) == self._val(seq, p)
                self.mem[(DEV, b, j * bs + p % bs)] = self._val(seq, p)
        seq.num_computed_tokens = c + n
        self.mgr.on_computed(seq)

    def _clone_for_trial(self, group):
        clone = copy.copy(self.mgr)
        dev = clone.device = copy.copy(self.mgr.device)
        dev.refcount, dev.free_queue = list(dev.refcount), copy.copy(dev.free_queue)
        dev.block_hash, dev.cached = list(dev.block_hash), dict(dev.cached)
        clone._tables = {k: [list(t) for t in v] for k, v in self.mgr._tables.items()}
        for name in ("_prompt_hashes", "_keys", "_offered", "_unregistered"):
            setattr(clone, name, dict(getattr(self.mgr, name)))
        clone._settled = set(self.mgr._settled)
        clone.pending_copies = []
        seqs = []
        for s in group.seqs:
            c = s.copy_as(s.seq_id)
            seqs.append(c)
        return clone, SequenceGroup(group.request, seqs, group.arrival_order)

    # -- rules that name blocks ------------------------------------------------------------
    @precondition(lambda self: self._seqs(SequenceStatus.RUNNING))
    @rule(i=IDX)
    def swap_out(self, i):
        group = self._group_in(SequenceStatus.RUNNING, i)
        blocks = {b for s in group.seqs for t in self._tables(s) for b in t if b != NULL_BLOCK}
        assert self.mgr.can_swap_out(group) == (len(blocks) <= self.mgr.host.num_free)
        if not self.mgr.can_swap_out(group):
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
        blocks = {b for s in group.seqs for t in self._tables(s) for b in t if b != NULL_BLOCK}
        expected = self.mgr.num_free_blocks - len(blocks) - len(self.windows) * len(group.seqs) >= self.watermark_blocks
        assert self.mgr.can_swap_in(group) == expected
        if not expected:
            return
        mapping = self.mgr.swap_in(group)
        assert {h for h, _ in mapping} == blocks
        self._move(mapping, HOST, DEV)
        for seq in group.seqs:
            seq.status = SequenceStatus.RUNNING

    # -- invariants against the brute force ------------------------------------------------------
    @invariant()
    def pools_match_block_tables(self):
        if not hasattr(self, "mgr"):
            return
        for name, pool, status in ((DEV, self.mgr.device, SequenceStatus.RUNNING), (HOST, self.mgr.host, SequenceStatus.SWAPPED)):
            refs = Counter(b for s in self._seqs(status) for t in self._tables(s) for b in t if b != NULL_BLOCK)
            assert [pool.refcount[b] for b in range(pool.num_blocks)] == [refs[b] for b in range(pool.num_blocks)], name
            assert set(pool.free_queue) == {b for b in range(pool.num_blocks) if refs[b] == 0}, name
            assert pool.num_free == pool.num_blocks - len(refs)
        tables_of_blocks: dict[int, set] = {}
        for s in self._seqs():
            tables = self._tables(s)
            assert s.block_table is tables[0] or (not s.block_table and not tables[0])
            for t, table in enumerate(tables):
                assert len(table) == cdiv(s.num_computed_tokens, self.bs)
                first = self._needed(t, s.num_computed_tokens)
                for i, b in enumerate(table):  # NULL exactly where the block is wholly before the window
                    assert (b == NULL_BLOCK) == ((i + 1) * self.bs <= first), (t, i, table, s)
                    if b != NULL_BLOCK:
                        tables_of_blocks.setdefault((s.status, b), set()).add(t)
        assert all(len(ts) == 1 for ts in tables_of_blocks.values()), "a block in two tables"

    @invariant()
    def contents_read_back(self):
        if not hasattr(self, "mgr"):
            return
        for seq in self._seqs():
            pool = DEV if seq.status is SequenceStatus.RUNNING else HOST
            c = seq.num_computed_tokens
            for t, j in self.layers:
                table = self._tables(seq)[t]
                for p in range(self._needed(t, c), c):
                    got = self.mem.get((pool, table[p // self.bs], j * self.bs + p % self.bs))
                    assert got == self._val(seq, p), f"seq {seq.seq_id} table {t} layer slot {j} position {p}"

    @invariant()
    def prefix_cache_is_sound(self):
        if not hasattr(self, "mgr"):
            return
        dev = self.mgr.device
        assert len(dev.cached) == sum(h is not None for h in dev.block_hash)
        for key, b in dev.cached.items():
            assert dev.block_hash[b] == key
            t = key[0]
            for _, j in (layer for layer in self.layers if layer[0] == t):
                last = self.mem.get((DEV, b, j * self.bs + self.bs - 1))
                assert last is not None and len(last) % self.bs == 0
                assert self.seen_hash.setdefault((key, j), last) == last, "one key, two different prefixes"

    @invariant()
    def waste_adds_up(self):
        if not hasattr(self, "mgr"):
            return
        running = [g for g in self.groups if g.seqs[0].status is SequenceStatus.RUNNING]
        w = self.mgr.waste(running)
        assert w.total == self.num_device * self.bs
        parts = self.mgr.waste_by_table(running)
        assert sum(p.token_states for p in parts) == w.token_states
        assert sum(p.token_states + p.internal_fragmentation for p in parts) + w.free == w.total
        slots = {(b, p % self.bs) for g in running for s in g.seqs for table in self._tables(s)
                 for p in range(s.num_computed_tokens) if (b := table[p // self.bs]) != NULL_BLOCK}
        assert w.token_states == len(slots)


HybridMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestHybridKVManager = HybridMachine.TestCase
