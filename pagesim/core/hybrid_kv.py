"""KV cache groups over one pool (vLLM v1's hybrid KV cache manager): a sequence keeps one block
table per table group of its model's layout (pagesim.core.kv_groups.KVLayout), all over the same
device pool of equal blocks.

- Full and MLA tables keep a block for every token, as the plain paged manager does.
- A sliding-window table of window W frees, after every step, the blocks wholly before the next
  token's window (positions below num_computed - W + 1) and puts NULL_BLOCK in their place, so
  logical positions stay where they were. It holds at most ceil((W - 1) / B) + 1 blocks while
  decoding; a prefill step holds the whole chunk it writes.
- All token tables of a sequence have the same length, so a sequence opens a new block in every
  one at once, copies on write per table, swaps and forks all of them.
- A state table (linear attention / Mamba layers, kind ``state``) holds one block per sequence,
  taken with the sequence's first blocks and kept until it is freed or preempted; it is swapped
  and forked like the others. Its block is rewritten every step, so a forked child shares it only
  until its next step, which copies it (copy-on-write, as a shared partly filled block). Prefix
  caching is refused with state tables (a cached state is a whole prefix's, not a block's).
- Prefix caching keys a block by (table, chained hash): the same tokens are cached and evicted
  per table, in one LRU free queue. A hit is the longest prefix that every full table holds and,
  for each sliding window, whose last ceil((W - 1) / B) blocks every table of that window holds
  (the blocks before stay NULL); the lengths are intersected as vLLM's coordinator does.

seq.block_table is the sequence's first table (a full one where the model has any), so code that
reads one table (steps until a new block, a driver that only needs lengths) keeps working;
block_tables(seq) gives them all, in layout order.
"""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter

from pagesim.core.kv_groups import NULL_BLOCK, KVLayout
from pagesim.core.kv_manager import WasteBreakdown
from pagesim.core.paged import PagedKVManager, fast_block_key, offer_to_cache
from pagesim.core.block_pool import BlockPool
from pagesim.core.request import Sequence, SequenceGroup, SequenceStatus


_computed = attrgetter("num_computed_tokens")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HybridKVManager(PagedKVManager):
    def __init__(self, num_device_blocks: int, block_size: int = 16, num_host_blocks: int = 0,
                 enable_prefix_caching: bool = False, watermark: float = 0.01, block_key=fast_block_key,
                 kv_groups=()):
        super().__init__(num_device_blocks, block_size, num_host_blocks, enable_prefix_caching, watermark, block_key,
                         kv_groups=kv_groups)
        layout: KVLayout = self.layout
        # (flags set here, not as class attributes: PagedKVManager may be compiled, and its
        # compiled methods read the instance's values, never a subclass's class attributes)
        self.rooms_follow_appends = False  # (a sliding window's frees: ask steps_until_new_blocks every run)
        self.num_tables = layout.num_tables
        self.num_token_tables = layout.num_token_tables
        self._state = [t for t, g in enumerate(layout.tables) if g.is_state]
        self._grow = [t for t, g in enumerate(layout.tables) if not g.is_state]  # the token tables
        if self._state and enable_prefix_caching:
            raise ValueError("prefix caching is not modelled for models with linear-attention/state layers "
                             "(vLLM's Mamba prefix caching, mamba_cache_mode 'align'/'all', is experimental)")
        # (table index, window) of the sliding tables; the full-size tables by index
        self._sliding = [(t, g.sliding_window) for t, g in enumerate(layout.tables) if g.sliding_window is not None]
        self._full = [t for t, g in enumerate(layout.tables) if g.sliding_window is None and not g.is_state]
        windows: dict[int, list[int]] = {}
        for t, window in self._sliding:
            windows.setdefault(window, []).append(t)
        self._windows = list(windows.items())  # window -> its tables: a hit needs all of them
        self._min_window = min(windows, default=0)
        self.tracks_computed = enable_prefix_caching or bool(self._sliding)
        self.frees_while_decoding = bool(self._sliding)
        self._tables: dict[int, list[list[int]]] = {}  # seq_id -> its tables; [0] is seq.block_table
        self._keys: dict[int, list[list]] = {}  # seq_id -> per table, the cache keys of its full prompt blocks

    def block_tables(self, seq: Sequence) -> list[list[int]]:
        return self._tables.get(seq.seq_id) or [[] for _ in range(self.num_tables)]

    def _set_tables(self, seq: Sequence, tables: list[list[int]]) -> None:
        self._tables[seq.seq_id] = tables
        seq.block_table = tables[0]

    # -- admission -------------------------------------------------------------------------
    def never_fits(self, group: SequenceGroup, max_model_len: int) -> str | None:
        # At its longest each sequence has computed final_len - 1 tokens; a sliding table's peak
        # is bounded by its window plus the largest step (a whole recompute unless chunked).
        # Only the full tables' whole prompt blocks are counted as shared between sequences.
        length = min(group.prompt_len + group.sampling.max_tokens, max_model_len) - 1
        chunk = length if self.prefill_chunk is None else min(length, self.prefill_chunk)
        per_seq = sum(t.peak_blocks(length, chunk, self.block_size) for t in self.layout.tables)
        shared = 0
        if group.max_num_seqs > 1 and self.share_on_readmission:
            shared = len(self._full) * (group.prompt_len // self.block_size)
        need = shared + group.max_num_seqs * (per_seq - shared)
        usable = self.num_device_blocks - self.watermark_blocks
        if need > usable:
            return f"needs {need} KV blocks at its longest, the pool has {usable} usable"
        return None

    def _table_keys(self, seq: Sequence) -> list[list]:
        keys = self._keys.get(seq.seq_id)
        if keys is None:
            hashes = self._hashes(seq)
            keys = self._keys[seq.seq_id] = [[(t, h) for h in hashes] for t in range(self.num_tables)]
        return keys

    def _hit(self, seq: Sequence) -> list[list[int]]:
        """Per table, the cached blocks of seq's longest prefix hit (NULL_BLOCK before a window)."""
        if not self.enable_prefix_caching or seq.num_computed_tokens or not seq.prompt_is_known:
            return [[] for _ in range(self.num_tables)]
        keys, cached = self._table_keys(seq), self.device.cached
        length = len(keys[0])
        if self._full:
            n = 0
            while n < length and all(keys[t][n] in cached for t in self._full):
                n += 1
            length = n
        changed = True
        while changed:  # each window's hit within the others' (full hits hold for any shorter prefix)
            changed = False
            for window, tables in self._windows:
                hit = self._window_hit(keys, tables, window, length)
                if hit < length:
                    length, changed = hit, True
        hits = []
        for t, group in enumerate(self.layout.tables):
            if group.is_state:
                hits.append([])
                continue
            start = max(0, length - self._window_blocks(group.sliding_window)) if group.sliding_window else 0
            hits.append([NULL_BLOCK] * start + [cached[keys[t][i]] for i in range(start, length)])
        return hits

    def _window_blocks(self, window: int) -> int:
        """Cached blocks a window needs before a hit: the next token reads window - 1 earlier ones."""
        return _cdiv(window - 1, self.block_size)

    def _window_hit(self, keys: list[list], tables: list[int], window: int, limit: int) -> int:
        """The longest prefix of at most limit blocks after which these tables hold the blocks the
        window reads: scanned from the right, the first run of enough cached blocks, else the run
        that starts at block 0."""
        need = self._window_blocks(window)
        if need == 0:
            return limit
        cached = self.device.cached
        run = 0
        for i in range(limit - 1, -1, -1):
            if all(keys[t][i] in cached for t in tables):
                run += 1
                if run >= need:
                    return i + need
            else:
                run = 0
        return run

    def match_prefix(self, seq: Sequence) -> int:
        return len(self._hit(seq)[0]) * self.block_size

    def surely_admits(self, group: SequenceGroup) -> bool:
        return False  # (several tables: ask can_admit)

    def can_admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> bool:
        shared = self._siblings_share(group)
        bs, refcount = self.block_size, self.device.refcount
        need = 0
        revived = set()  # cached blocks taken out of the free queue, however many sequences hit them
        for i, (seq, n) in enumerate(zip(group.seqs, num_new_tokens)):
            need += len(self._state)  # (a state block of its own, even for a sibling)
            if i and shared:
                need += self.num_token_tables * (_cdiv(shared * bs + n, bs) - shared)
                continue
            hits = self._hit(seq)
            length = len(hits[0])
            need += self.num_token_tables * (_cdiv(length * bs + n, bs) - length)
            revived.update(b for table in hits for b in table if b >= 0 and refcount[b] == 0)
        return self.device.num_free - need - len(revived) >= self.watermark_blocks

    def admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> None:
        shared = self._siblings_share(group)
        for i, (seq, n) in enumerate(zip(group.seqs, num_new_tokens)):
            if i and shared:
                hits = [[] if g.is_state else table[:shared]
                        for g, table in zip(self.layout.tables, self._tables[group.seqs[0].seq_id])]
            else:
                hits = self._hit(seq)
                self._admitted_hits(seq, len(hits[0]))  # (every table's hit is as long, in blocks)
            self.device.incref_n([block for table in hits for block in table if block >= 0])
            self._set_tables(seq, [list(table) for table in hits])
            seq.num_computed_tokens = len(hits[0]) * self.block_size
            self.allocate_slots(seq, n)

    # -- running ---------------------------------------------------------------------------
    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        tables = self._tables[seq.seq_id]
        capacity = len(tables[0]) * self.block_size
        end = seq.num_computed_tokens + num_new_tokens
        need = self.num_token_tables * _cdiv(end - capacity, self.block_size) if end > capacity else 0
        refcount = self.device.refcount
        if seq.num_computed_tokens < capacity:  # a partly filled last block (never NULL) shared: copy it
            for t in self._grow:
                if refcount[tables[t][-1]] > 1:
                    need += 1
        for t in self._state:  # a state block is rewritten every step: shared (a fork), copy it
            if refcount[tables[t][0]] > 1:
                need += 1
        return need

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        tables = self._tables[seq.seq_id]
        dev = self.device
        partly_filled = seq.num_computed_tokens < len(tables[0]) * self.block_size
        for t, table in enumerate(tables):
            if (partly_filled or t in self._state) and table:
                last = table[-1]
                if dev.refcount[last] > 1:
                    copy = dev.allocate()
                    dev.decref(last)
                    table[-1] = copy
                    self.pending_copies.append((last, copy))
        missing = self._blocks_for(seq.num_computed_tokens + num_new_tokens) - len(tables[0])
        if missing > 0:
            blocks = dev.allocate_n(missing * self.num_token_tables)
            for i, t in enumerate(self._grow):
                tables[t].extend(blocks[i * missing:(i + 1) * missing])
        for t in self._state:  # the state, once per admission
            if not tables[t]:
                tables[t].append(dev.allocate())

    def append_block(self, seq: Sequence) -> None:
        self.append_blocks([seq])

    def append_blocks(self, seqs: list[Sequence]) -> None:
        # the order single steps take them in: sequence by sequence, each table in turn
        blocks = self.device.allocate_n(len(seqs) * self.num_token_tables)
        if self._state:
            grow, tables_of = self._grow, self._tables
            for table, block in zip([tables_of[seq.seq_id][t] for seq in seqs for t in grow], blocks):
                table.append(block)
            return
        if self.num_tables == 1:  # (a window in every layer: the one table is seq.block_table)
            for seq, block in zip(seqs, blocks):
                seq.block_table.append(block)
            return
        tables_of = self._tables
        for table, block in zip(chain.from_iterable([tables_of[seq.seq_id] for seq in seqs]), blocks):
            table.append(block)

    def on_computed(self, seq: Sequence) -> None:
        tables = self._tables[seq.seq_id]
        if self.enable_prefix_caching and seq.prompt_is_known:
            self._offer(seq, tables)  # first: a block that leaves the window stays cached
        freed = self._skip(tables, seq.num_computed_tokens)
        if freed:
            self.device.release(freed)

    def _offer(self, seq: Sequence, tables: list[list[int]]) -> None:
        """PagedKVManager.on_computed's registration, for each table."""
        seq_id = seq.seq_id
        if seq_id in self._settled:
            return
        keys = self._table_keys(seq)
        full = min(seq.num_computed_tokens // self.block_size, len(keys[0]))
        offered = self._offered.get(seq_id, 0)
        retry = self._unregistered.get(seq_id)
        if full <= offered and not retry:
            return
        # A sliding table's block whose key another block holds is not tried again (a
        # simplification: its window may free it before that block is evicted, which a decode
        # run taken at once could not time as single steps do).
        left = [offer_to_cache(self.device, table, keys[t], retry[t] if retry else None, offered, full)
                for t, table in enumerate(tables)]
        for t, _ in self._sliding:
            left[t] = []
        if full > offered:
            self._offered[seq_id] = full
        if any(left):
            self._unregistered[seq_id] = left
        else:
            if retry:
                del self._unregistered[seq_id]
            if full == len(keys[0]):
                self._settled.add(seq_id)

    def _skip(self, tables: list[list[int]], num_computed: int, freed: list[int] | None = None) -> list[int]:
        """NULL the blocks of each sliding table wholly before the window of the token at
        position num_computed; returns them, each table's from its tail (evicted first)."""
        freed = [] if freed is None else freed
        bs = self.block_size
        for t, window in self._sliding:
            table = tables[t]
            i = min(max(0, num_computed - window + 1) // bs, len(table)) - 1
            while i >= 0 and table[i] != NULL_BLOCK:  # the ones before were freed earlier
                freed.append(table[i])
                table[i] = NULL_BLOCK
                i -= 1
        return freed

    def steps_until_window_frees(self, seqs: list[Sequence]) -> float:
        # computed c, k blocks skipped: the next goes when c + s - W + 1 reaches (k + 1) * B
        bs, first = self.block_size, math.inf
        for seq in seqs:
            c = seq.num_computed_tokens
            for _, window in self._sliding:
                skipped = max(0, c - window + 1) // bs
                first = min(first, (skipped + 1) * bs + window - 1 - c)
        return first

    def windows_passed(self, seqs: list[Sequence]) -> bool:
        # past the first block of the smallest window (before that, no sliding table frees anything)
        if not seqs or not self._sliding:
            return False
        return max(map(_computed, seqs)) + 1 - self._min_window >= self.block_size

    def on_decode_run(self, seqs: list[Sequence], num_steps: int, last_step: bool = True) -> list[int] | None:
        # Registration first (no prompt block fills while decoding: only retries), then the
        # window's frees in the order single steps give them: step by step, sequence by
        # sequence, table by table (one block per table and step at most).
        if self.enable_prefix_caching:
            for seq in seqs:
                if seq.prompt_is_known:
                    self._offer(seq, self._tables[seq.seq_id])
        if not self._sliding:
            return None
        steps = num_steps if last_step else num_steps - 1
        # Each step frees at most one block per sliding table: block j of a window W goes at the
        # step (counted from 1) after which the token at c + step no longer reads it, when
        # c + step - W + 1 reaches (j + 1) * B. Only the blocks that go are visited.
        bs = self.block_size
        by_step: dict[int, list[int]] = {}
        tables_of, sliding = self._tables, self._sliding
        # a sequence frees nothing in the run while the smallest window still starts in its first block
        reach = steps + 1 - self._min_window - num_steps
        if not seqs or max(map(_computed, seqs)) + reach < bs:
            return None  # (the common case while sequences are shorter than the window: a loop in C)
        for seq in seqs:  # (sequence by sequence, table by table: the order within a step)
            computed = seq.num_computed_tokens
            if computed + reach < bs:
                continue
            start = computed - num_steps
            tables = tables_of[seq.seq_id]
            for t, window in sliding:
                table = tables[t]
                first = max(0, start - window + 1) // bs  # skipped before the run
                last = min(max(0, start + steps - window + 1) // bs, len(table))
                for j in range(first, last):
                    by_step.setdefault((j + 1) * bs + window - 1 - start, []).append((table, j))
        if not by_step:
            return None
        freed_per_step = [0] * steps
        dev = self.device
        for step in sorted(by_step):
            blocks = []
            for table, j in by_step[step]:
                blocks.append(table[j])
                table[j] = NULL_BLOCK
            before = dev.num_free
            dev.release(blocks)
            freed_per_step[step - 1] = dev.num_free - before
        return freed_per_step

    def fork(self, parent: Sequence, child: Sequence) -> None:
        tables = [list(table) for table in self._tables[parent.seq_id]]
        for table in tables:
            for block in table:
                if block >= 0:
                    self.device.incref(block)
        self._set_tables(child, tables)
        pid, cid = parent.seq_id, child.seq_id
        for state in (self._prompt_hashes, self._keys, self._offered):
            if pid in state:
                state[cid] = state[pid]  # (lists never changed in place)
        if pid in self._settled:
            self._settled.add(cid)
        if pid in self._unregistered:
            self._unregistered[cid] = [list(left) for left in self._unregistered[pid]]

    def free(self, seq: Sequence) -> None:
        pool = self.host if seq.status is SequenceStatus.SWAPPED else self.device
        tables = self._tables.pop(seq.seq_id, ())
        # each table's tail first, so it is evicted before the prefix it extends
        pool.release([b for table in tables for b in reversed(table) if b >= 0])
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._prompt_hashes.pop(seq.seq_id, None)
        self._keys.pop(seq.seq_id, None)
        self._forget_registration(seq.seq_id)

    # -- swapping --------------------------------------------------------------------------
    def _group_blocks(self, group: SequenceGroup) -> list[int]:
        """The group's blocks over all tables, each once, in the order one-by-one allocation took."""
        return list(dict.fromkeys(b for seq in group.seqs for table in self._tables[seq.seq_id]
                                  for b in table if b >= 0))

    def _unique_blocks(self, group: SequenceGroup) -> int:
        return len(self._group_blocks(group))

    def can_swap_in(self, group: SequenceGroup) -> bool:
        # one block per table and sequence for the token it appends right after coming back (a
        # state table: the copy of a state its forked siblings still share)
        need = self._unique_blocks(group) + self.num_tables * len(group.seqs)
        return self.device.num_free - need >= self.watermark_blocks

    def _move(self, group: SequenceGroup, src: BlockPool, dst: BlockPool) -> list[tuple[int, int]]:
        unique = self._group_blocks(group)
        mapping = dict(zip(unique, dst.allocate_n(len(unique))))
        mapping[NULL_BLOCK] = NULL_BLOCK
        seen: set[int] = set()
        for seq in group.seqs:
            for table in self._tables[seq.seq_id]:
                for block in table:
                    if block < 0:
                        continue
                    if block in seen:  # shared inside the group: one more reference
                        dst.incref(mapping[block])
                    seen.add(block)
                    src.decref(block)
                table[:] = [mapping[b] for b in table]  # in place: seq.block_table is tables[0]
        del mapping[NULL_BLOCK]
        return list(mapping.items())

    # -- accounting ------------------------------------------------------------------------
    def waste_by_table(self, running: list[SequenceGroup]) -> list[WasteBreakdown]:
        """Each table group's share of the device pool (its blocks' token states and unfilled
        slots; a block belongs to one table). With the free slots they add up to waste()."""
        bs = self.block_size
        filled: list[dict[int, int]] = [{} for _ in range(self.num_tables)]  # per table: block -> tokens
        for group in running:
            for seq in group.seqs:
                computed = seq.num_computed_tokens
                for t, table in enumerate(self._tables[seq.seq_id]):
                    mine = filled[t]
                    state = t in self._state  # (a state block is live state from admission on: counted full)
                    for i, block in enumerate(table):
                        if block >= 0:
                            tokens = bs if state else min(bs, max(0, computed - i * bs))
                            if tokens > mine.get(block, -1):
                                mine[block] = tokens
        return [WasteBreakdown(token_states=sum(mine.values()), reserved=0,
                               internal_fragmentation=len(mine) * bs - sum(mine.values()),
                               external_fragmentation=0, free=0) for mine in filled]

    def waste(self, running: list[SequenceGroup]) -> WasteBreakdown:
        parts = self.waste_by_table(running)
        token_states = sum(p.token_states for p in parts)
        used = self.num_device_blocks - self.device.num_free
        return WasteBreakdown(token_states=token_states, reserved=0,
                              internal_fragmentation=used * self.block_size - token_states,
                              external_fragmentation=0, free=self.device.num_free * self.block_size)
