"""vLLM's paged KV cache: fixed-size blocks, per-sequence block tables, reference counts,
copy-on-write, swapping whole groups to a host pool, and optional automatic prefix caching.

A block holds `block_size` consecutive tokens of one sequence. Blocks are shared by reference
count: forks share all of the parent's blocks, and prefix-cache hits share full prompt blocks
across requests. A sequence only ever writes into the last block of its table; if that block is
shared, it is copied first (copy-on-write).
"""

from __future__ import annotations

from itertools import compress
from operator import not_
from typing import Hashable

from mypy_extensions import mypyc_attr

from pagesim.core.block_keys import (BLOCK_KEYS, block_hashes, block_spans, chain_keys,  # noqa: F401 (re-exported)
                                     fast_block_key, sha256_block_key, shared_blocks)
from pagesim.core.block_pool import BlockPool, FreeBlockQueue, gather  # noqa: F401 (FreeBlockQueue: re-exported)
from pagesim.core.hashed_prompt import HashChainKeys
from pagesim.core.kept_keys import KeptKeys
from pagesim.core.kv_groups import KVLayout
from pagesim.core.kv_manager import KVCacheManager, WasteBreakdown
from pagesim.core.native import Number
from pagesim.core.request import Sequence, SequenceGroup, SequenceStatus


def token_span(seq: Sequence, start: int, end: int) -> tuple[int, ...]:
    """The token ids at positions [start, end) of seq: a hashed prompt's canonical ids (made
    only for this span), then the outputs; or a slice of its ids."""
    if seq.hashed_prompt is None:
        return tuple(seq.token_ids[start:end])
    p = seq.prompt_len
    head = [seq.hashed_prompt.token_id(i) for i in range(start, min(end, p))]
    return tuple(head + seq.token_ids[max(start, p) - p:max(end, p) - p])


def offer_to_cache(pool: BlockPool, table: list[int], keys: list, retry: list[int] | None, start: int,
                   end: int) -> list[int]:
    """Register table[i] under keys[i] for the indices in retry, then start..end-1 (index order, as
    re-registering every block would); returns those left unregistered because another block
    holds their key. A block that holds a key keeps it while a table holds it, so it is never
    offered again; a freed sliding-window entry (NULL_BLOCK, the only negative one) is dropped."""
    block_hash, cached = pool.block_hash, pool.cached
    # (BlockPool.register inlined, one setdefault a block: a long prefix-caching run offers millions,
    # and this loop costs ~480 instructions a block against ~700 for checking the batch at C speed
    # first (NULL_BLOCK, gather, setdefault by map, compare, store), callgrind)
    left = []
    for i in retry or ():
        block = table[i]
        if block >= 0 and block_hash[block] is None:
            key = keys[i]
            if cached.setdefault(key, block) == block:  # (a block is in the cache under at most one key)
                block_hash[block] = key
            else:
                left.append(i)
    held = []
    for block, key in zip(table[start:end], keys[start:end]):
        if block >= 0 and block_hash[block] is None:
            if cached.setdefault(key, block) == block:
                block_hash[block] = key
            else:
                held.append(block)
    if held:  # (rare) their indices: a table holds a block once
        left += [table.index(block, start, end) for block in held]
    return left


@mypyc_attr(allow_interpreted_subclasses=True)  # (compiled: scripts/compile.py; HybridKVManager extends it)
class PagedKVManager(KVCacheManager):
    supports_swap = True
    rooms_follow_appends = True  # (len(block_table) * block_size - num_computed_tokens)

    def __init__(self, num_device_blocks: int, block_size: int = 16, num_host_blocks: int = 0,
                 enable_prefix_caching: bool = False, watermark: Number = 0.01, block_key=fast_block_key,
                 kv_groups=None):
        super().__init__()
        # KV cache groups (pagesim.core.kv_groups): one full or MLA group is this manager's
        # layout, a block holding every layer; anything else needs one table per group.
        self.layout = None if kv_groups is None else KVLayout.of(kv_groups)
        if self.layout is not None and not self.layout.is_plain and type(self) is PagedKVManager:
            raise ValueError("several KV groups or a sliding window need HybridKVManager "
                             "(pagesim.core.hybrid_kv; make_kv_manager picks it)")
        self.block_key = block_key  # how a full prompt block is keyed in the prefix cache
        self._hashed_keys = HashChainKeys(block_size, block_key)  # (prompts known by block hash ids)
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.device = BlockPool(num_device_blocks, enable_caching=enable_prefix_caching)
        self.host = BlockPool(num_host_blocks)
        self.enable_prefix_caching = enable_prefix_caching
        self.tracks_computed = enable_prefix_caching
        # Admission keeps this many blocks free, so a newly admitted group does not force a
        # preemption at its first decode step (vLLM's default is 1% of the pool).
        self.watermark_blocks = int(watermark * num_device_blocks)
        self._prompt_hashes: dict[int, list] = {}  # seq_id -> chained hashes of full prompt blocks
        self._kept_keys = KeptKeys(block_size, block_key)  # (prompts known by token ids)
        # Prefix caching registers each full prompt block once, at the step that fills it:
        # seq_id -> prompt blocks offered to the cache so far, and -> the indices among them
        # still unregistered because another block held their hash (retried every step, as
        # that block may be evicted meanwhile).
        self._offered: dict[int, int] = {}
        self._unregistered: dict[int, list[int]] = {}
        self._settled: set[int] = set()  # seq_ids with every prompt block offered and none to retry
        self._last_lookup: tuple = (None, [])  # (seq_id, cache size, evictions) -> its hits
        self.prefix_queries = 0  # prompt blocks looked up
        self.prefix_hits = 0  # prompt blocks found

    # -- admission -------------------------------------------------------------------------
    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def never_fits(self, group: SequenceGroup, max_model_len: int) -> str | None:
        # At its largest the group holds each sequence's full length; only whole prompt blocks
        # are certain to stay shared between its sequences, and after a recompute only if
        # re-admission shares them again.
        request, num_seqs = group.request, group.max_num_seqs
        final_len = min(request.prompt_len + request.sampling.max_tokens, max_model_len)
        shared = request.prompt_len // self.block_size if num_seqs > 1 and self.share_on_readmission else 0
        # the last token is never computed, so it never takes a slot
        need = shared + num_seqs * (self._blocks_for(final_len - 1) - shared)
        usable = self.num_device_blocks - self.watermark_blocks
        if need > usable:
            return f"needs {need} KV blocks at its longest, the pool has {usable} usable"
        return None

    def _hashes(self, seq: Sequence) -> list:
        hashes = self._prompt_hashes.get(seq.seq_id)
        if hashes is None:
            # Only full prompt blocks are cached, and a hit always leaves the last prompt token
            # to compute, since its logits are needed.
            num_full = (seq.prompt_len - 1) // self.block_size
            if seq.hashed_prompt is not None:  # keyed from the hash ids, never materialised
                hashes = self._hashed_keys.keys(seq.hashed_prompt, num_full)
            elif seq.token_ids:
                hashes = self._prompt_keys(seq, num_full)  # (block_hashes, shared)
            else:
                hashes = []
            self._prompt_hashes[seq.seq_id] = hashes
        return hashes

    def _chain(self, parent: Hashable, token_ids: list[int], start: int, num_blocks: int) -> list:
        """chain_keys of the num_blocks blocks of token_ids from start, the first one's parent given."""
        return chain_keys(parent, block_spans(token_ids[start:], self.block_size, num_blocks), self.block_key)

    # Token-id prompts' keys are kept for the prompt as submitted (pagesim.core.kept_keys), which a
    # cycled trace submits again, and whose next turns start the same; ids given otherwise have
    # nothing to know them again by.
    def _prompt_keys(self, seq: Sequence, num_blocks: int) -> list:
        if seq.prompt_ids is None:
            return self._chain(0, seq.token_ids, 0, num_blocks)
        return self._kept_keys.prompt_keys(seq.prompt_ids, num_blocks)

    def _tail_keys(self, seq: Sequence, parent: Hashable, start: int, num_blocks: int) -> list:
        """The keys of seq's num_blocks blocks from token start on (past its prompt's keys)."""
        if seq.prompt_ids is None:
            return self._chain(parent, seq.token_ids, start, num_blocks)
        return self._kept_keys.tail_keys(seq.prompt_ids, parent, seq.token_ids, start, num_blocks)

    def _cached_blocks(self, seq: Sequence) -> list[int]:
        if not self.enable_prefix_caching or seq.num_computed_tokens or not seq.prompt_is_known:
            return []
        cached = self.device.cached
        # Admission asks up to three times in a row (hits, can_admit, admit). The cache only
        # grows by registering and shrinks by evicting (which counts), so an unchanged size and
        # eviction count mean unchanged contents, and the last answer stands.
        state = (seq.seq_id, len(cached), self.device.num_evictions)
        if self._last_lookup[0] == state:
            return self._last_lookup[1]
        hits: list = []
        for key in self._hashes(seq):  # (up to the first miss: a compiled loop, no call a key)
            block: object = cached.get(key)
            if block is None:
                break
            hits.append(block)
        self._last_lookup = (state, hits)
        return hits

    def match_prefix(self, seq: Sequence) -> int:
        return len(self._cached_blocks(seq)) * self.block_size

    def _siblings_share(self, group: SequenceGroup) -> int:
        """Whole prompt blocks that the later sequences of a re-admitted group (one that was
        forked, then preempted by recompute) take from its first sequence instead of computing
        them again; 0 for a single sequence. The first sequence computes them in the same step,
        and attention reads the cache after the step's new K/V is written."""
        if len(group.seqs) < 2 or not self.share_on_readmission:
            return 0
        return group.prompt_len // self.block_size

    def admission_hits(self, group: SequenceGroup) -> list[int]:
        shared = self._siblings_share(group) * self.block_size
        first = self.match_prefix(group.seqs[0])
        return [first] + [shared or self.match_prefix(seq) for seq in group.seqs[1:]]

    def can_admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> bool:
        shared = self._siblings_share(group)
        need = 0
        revived: set[int] = set()  # cached blocks taken out of the free queue, however many sequences hit them
        for i, (seq, n) in enumerate(zip(group.seqs, num_new_tokens)):
            if i and shared:
                need += self._blocks_for(shared * self.block_size + n) - shared
                continue
            hits = self._cached_blocks(seq)
            need += self._blocks_for(len(hits) * self.block_size + n) - len(hits)
            if hits:  # (the free ones, found at C speed: a sequence's hit blocks are distinct)
                counts = gather(self.device.refcount, hits)
                if len(group.seqs) == 1:
                    return self.device.num_free - need - counts.count(0) >= self.watermark_blocks
                revived.update(compress(hits, map(not_, counts)))
        return self.device.num_free - need - len(revived) >= self.watermark_blocks

    def surely_admits(self, group: SequenceGroup) -> bool:
        # one sequence of T tokens: a hit of h blocks leaves at most blocks_for(T) - h blocks to
        # allocate and revives at most h, so can_admit needs at most blocks_for(T) free
        return len(group.seqs) == 1 and \
            self.device.num_free - self._blocks_for(group.seqs[0].num_tokens) >= self.watermark_blocks

    def admit(self, group: SequenceGroup, num_new_tokens: list[int]) -> None:
        shared = self._siblings_share(group)
        for i, (seq, n) in enumerate(zip(group.seqs, num_new_tokens)):
            if i and shared:
                hits = group.seqs[0].block_table[:shared]
            else:
                hits = self._cached_blocks(seq)
                self._admitted_hits(seq, len(hits))
            if hits:  # (most admissions hit nothing)
                self.device.incref_n(hits)
            seq.block_table = list(hits)
            seq.num_computed_tokens = len(hits) * self.block_size
            self.allocate_slots(seq, n)

    def _admitted_hits(self, seq: Sequence, num_hit_blocks: int) -> None:
        """Count an admitted sequence's prefix lookup, and record its hit blocks as offered: held
        hit blocks keep their keys, so offering them to the cache again would do nothing."""
        if not (self.enable_prefix_caching and seq.prompt_is_known):
            return
        num_keys = len(self._hashes(seq))
        self.prefix_queries += num_keys
        self.prefix_hits += num_hit_blocks
        if num_hit_blocks:
            self._offered[seq.seq_id] = num_hit_blocks
            if num_hit_blocks == num_keys:
                self._settled.add(seq.seq_id)

    # -- running ---------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.device.free_queue.size  # (BlockPool.num_free without its call: asked several times a run)

    @property
    def num_used_blocks(self) -> int:
        return self.num_device_blocks - self.device.free_queue.size  # (the base's, two property calls fewer)

    @property
    def num_logical_blocks(self) -> int:
        # block-table entries of device-resident sequences; a block shared by k tables counts k times
        return self.device.num_refs

    def blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        table = seq.block_table
        capacity = len(table) * self.block_size
        end = seq.num_computed_tokens + num_new_tokens
        need = -(-(end - capacity) // self.block_size) if end > capacity else 0
        if seq.num_computed_tokens < capacity and self.device.refcount[table[-1]] > 1:
            need += 1  # the partly filled last block is shared: copy before writing
        return need

    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> None:
        table = seq.block_table
        if seq.num_computed_tokens < len(table) * self.block_size:
            last = table[-1]
            if self.device.refcount[last] > 1:
                copy = self.device.allocate()
                self.device.decref(last)
                table[-1] = copy
                self.pending_copies.append((last, copy))
        missing = self._blocks_for(seq.num_computed_tokens + num_new_tokens) - len(table)
        if missing > 0:
            table.extend(self.device.allocate_n(missing))

    def steps_until_new_block(self, seq: Sequence) -> int:
        return len(seq.block_table) * self.block_size - seq.num_computed_tokens

    def steps_until_new_blocks(self, seqs: list[Sequence]) -> list[int]:
        bs = self.block_size
        return [len(seq.block_table) * bs - seq.num_computed_tokens for seq in seqs]

    def append_block(self, seq: Sequence) -> None:
        seq.block_table.append(self.device.allocate())

    def append_blocks(self, seqs: list[Sequence]) -> None:
        # allocate_n hands out the blocks n calls to allocate() would, in the same order
        for seq, block in zip(seqs, self.device.allocate_n(len(seqs))):
            seq.block_table.append(block)

    def on_computed(self, seq: Sequence) -> None:
        if not self.enable_prefix_caching or seq.seq_id in self._settled or not seq.prompt_is_known:
            return
        seq_id = seq.seq_id
        hashes = self._hashes(seq)
        full = min(seq.num_computed_tokens // self.block_size, len(hashes))
        offered = self._offered.get(seq_id, 0)
        retry = self._unregistered.get(seq_id)
        if full <= offered and not retry:
            if not hashes:  # (a prompt without a full block: nothing ever to offer, no call to come back for)
                self._settled.add(seq_id)
            return  # (most steps: decode, or a prefill chunk that filled no prompt block)
        left = offer_to_cache(self.device, seq.block_table, hashes, retry, offered, full)
        if full > offered:
            self._offered[seq_id] = full
        if left:
            self._unregistered[seq_id] = left
        else:
            if retry:
                del self._unregistered[seq_id]
            if full == len(hashes):
                self._settled.add(seq_id)

    def on_decode_run(self, seqs: list[Sequence], num_steps: int, last_step: bool = True) -> None:
        if self.enable_prefix_caching:
            settled = self._settled
            for seq in seqs:
                if seq.seq_id not in settled:  # (most: decoding sequences have offered every prompt block)
                    self.on_computed(seq)

    def _forget_registration(self, seq_id: int) -> None:
        self._offered.pop(seq_id, None)
        self._unregistered.pop(seq_id, None)
        self._settled.discard(seq_id)

    def block_tables(self, seq: Sequence) -> list[list[int]]:
        """seq's block table of each table group of the layout (here one: seq.block_table)."""
        return [seq.block_table]

    def fork(self, parent: Sequence, child: Sequence) -> None:
        self.device.incref_n(parent.block_table)
        child.block_table = list(parent.block_table)
        if parent.seq_id in self._prompt_hashes:
            self._prompt_hashes[child.seq_id] = self._prompt_hashes[parent.seq_id]
        if parent.seq_id in self._offered:  # the same blocks, registered as far
            self._offered[child.seq_id] = self._offered[parent.seq_id]
            if parent.seq_id in self._unregistered:
                self._unregistered[child.seq_id] = list(self._unregistered[parent.seq_id])
        if parent.seq_id in self._settled:
            self._settled.add(child.seq_id)

    def free(self, seq: Sequence) -> None:
        pool = self.host if seq.status is SequenceStatus.SWAPPED else self.device
        if seq.status is SequenceStatus.FINISHED and self.enable_prefix_caching and seq.prompt_is_known:
            self._cache_generated(seq)
        # Tail blocks go back first, so they are evicted before the prefix they extend. (A table
        # never holds a block twice: hits are distinct cached blocks, the rest fresh allocations.)
        pool.release(seq.block_table[::-1], distinct=True)
        seq.block_table = []
        seq.num_computed_tokens = 0
        self._prompt_hashes.pop(seq.seq_id, None)
        self._forget_registration(seq.seq_id)

    def _cache_generated(self, seq: Sequence) -> None:
        """A finished sequence's full blocks past its cached prompt blocks (the prompt's last block
        and the generated tokens, whose K/V is computed) join the prefix cache, as vLLM v1 caches
        every full block: a session's next turn, whose prompt is this prompt plus this output,
        then hits them. vLLM registers each block as it fills; here they become hits when the
        sequence finishes, which differs only for a request arriving while this one decodes."""
        prompt_keys = self._hashes(seq)
        first, bs = len(prompt_keys), self.block_size
        full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        if full <= first:
            return
        keys = []  # of the blocks from first to full
        if seq.hashed_prompt is not None:  # blocks wholly inside a hashed prompt keep its numbered keys
            # (the prompt keys are the first of those; only a prompt whose last block is full has one more)
            num_hashed = min(full, seq.prompt_len // bs)
            if num_hashed > first:
                keys = self._hashed_keys.keys(seq.hashed_prompt, num_hashed)[first:]
        parent = keys[-1] if keys else (prompt_keys[-1] if prompt_keys else 0)
        start = (first + len(keys)) * bs
        # blocks past a hashed prompt are slices of the outputs, those of any other prompt slices of its ids
        off = seq.prompt_len if seq.hashed_prompt is not None else 0
        while start < min(off, full * bs):  # the block a hashed prompt ends in (one: the next starts past it)
            parent = self.block_key(parent, token_span(seq, start, start + bs))
            keys.append(parent)
            start += bs
        if start < full * bs:
            # (kept after token-id prompts, which load generators replay with their outputs; not after
            # hashed prompts: production traces, whose prompt and output rarely recur whole)
            if off:
                keys += self._chain(parent, seq.token_ids, start - off, full - start // bs)
            else:
                keys += self._tail_keys(seq, parent, start, full - start // bs)
        offer_to_cache(self.device, seq.block_table[first:full], keys, None, 0, full - first)

    # -- swapping --------------------------------------------------------------------------
    # (methods, not static methods: HybridKVManager overrides them, and a compiled class calls
    # its own static methods directly, whatever the instance's class)
    def _unique_blocks(self, group: SequenceGroup) -> int:
        return len({b for seq in group.seqs for b in seq.block_table})

    def can_swap_out(self, group: SequenceGroup) -> bool:
        return self._unique_blocks(group) <= self.host.num_free

    def can_swap_in(self, group: SequenceGroup) -> bool:
        # one extra block per sequence for the token it appends right after coming back
        need = self._unique_blocks(group) + len(group.seqs)
        return self.device.num_free - need >= self.watermark_blocks

    def swap_out(self, group: SequenceGroup) -> list[tuple[int, int]]:
        return self._move(group, src=self.device, dst=self.host)

    def swap_in(self, group: SequenceGroup) -> list[tuple[int, int]]:
        for seq in group.seqs:  # new device blocks, none registered yet
            self._forget_registration(seq.seq_id)
        return self._move(group, src=self.host, dst=self.device)

    def _move(self, group: SequenceGroup, src: BlockPool, dst: BlockPool) -> list[tuple[int, int]]:
        """Move the group's blocks to the other pool, keeping sharing inside the group."""
        # dict.fromkeys keeps first appearances in order: the order one-by-one allocation took
        unique = list(dict.fromkeys(b for seq in group.seqs for b in seq.block_table))
        mapping = dict(zip(unique, dst.allocate_n(len(unique))))
        seen: set[int] = set()
        for seq in group.seqs:
            for block in seq.block_table:
                if block in seen:  # a block shared inside the group: one more reference
                    dst.incref(mapping[block])
                seen.add(block)
                src.decref(block)
            seq.block_table = [mapping[b] for b in seq.block_table]
        return list(mapping.items())

    # -- accounting ------------------------------------------------------------------------
    def waste(self, running: list[SequenceGroup]) -> WasteBreakdown:
        filled: dict[int, int] = {}  # device block -> tokens it holds (a shared block counts once)
        bs = self.block_size
        for group in running:
            for seq in group.seqs:
                computed = seq.num_computed_tokens
                for i, block in enumerate(seq.block_table):
                    tokens = min(bs, max(0, computed - i * bs))
                    if tokens > filled.get(block, -1):
                        filled[block] = tokens
        used = self.num_device_blocks - self.device.num_free
        token_states = sum(filled.values())
        # Paged allocation reserves nothing ahead: between steps every allocated slot holds a
        # computed token except the unfilled tail of each last block (internal fragmentation).
        return WasteBreakdown(
            token_states=token_states,
            reserved=0,
            internal_fragmentation=used * bs - token_states,
            external_fragmentation=0,
            free=self.device.num_free * bs,
        )
