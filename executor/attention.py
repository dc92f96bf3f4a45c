"""Attention over the paged KV cache: the per-step metadata and the layer that writes new K/V and
attends. The models call only this; the kernels behind it are chosen in `executor.kernels`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from executor import kernels


@dataclass
class AttentionMetadata:
    """Everything attention needs for one forward over a packed batch of new tokens.

    Sequence i owns the packed rows query_start_loc[i]:query_start_loc[i+1]; they are the last
    tokens of its context of context_lens[i] tokens (new ones included).
    """

    slot_mapping: torch.Tensor  # [num_tokens] int64: cache slot of each new token's K/V (-1 = skip)
    # [num_seqs, max_blocks] int32, padded with 0 past a sequence's end; an entry wholly before a
    # sliding-window layer's window may be NULL_BLOCK (-1, freed): the kernels never read it
    block_tables: torch.Tensor
    context_lens: torch.Tensor  # [num_seqs] int32: tokens in the cache after this step
    query_start_loc: torch.Tensor  # [num_seqs + 1] int32: packed query rows per sequence
    positions: torch.Tensor  # [num_tokens] int64
    decode_only: bool  # every sequence has exactly one new token -> the decode kernel
    # KV cache groups (hybrid models, vLLM v1's hybrid KV cache manager): the layers of group g
    # keep their own block tables over the shared pool; group_tables[g] is g's (slot_mapping,
    # block_tables), group 0's being the two fields above. None: one group, every layer uses those.
    group_tables: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    # True: group_tables follow the core's KVLayout.tables (the engine on a HybridKVManager) and a
    # layer reads its table's entry (PagedAttention.kv_table), not its group's
    by_table: bool = False

    def for_group(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot_mapping, block_tables) of the layers in KV cache group `group`."""
        if self.group_tables is None:
            return self.slot_mapping, self.block_tables
        return self.group_tables[group]

    def for_layer(self, attn: "PagedAttention") -> tuple[torch.Tensor, torch.Tensor]:
        """(slot_mapping, block_tables) this attention layer uses."""
        if not self.by_table:
            return self.for_group(attn.kv_group)
        if attn.kv_table is None:
            raise ValueError("metadata built per core block table, but this layer was given no table "
                             "(executor.kv_layout.place_layers)")
        return self.group_tables[attn.kv_table]

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    def last_token_indices(self) -> torch.Tensor:
        """The packed row of each sequence's last new token: the rows that sample."""
        return (self.query_start_loc[1:] - 1).long()

    @classmethod
    def build(cls, seqs, block_size: int, device="cpu") -> "AttentionMetadata":
        """seqs: (block_table, num_computed_tokens, num_new_tokens) per sequence. The new tokens sit
        at positions num_computed .. num_computed + num_new - 1; the block table must already
        cover them."""
        slots, positions, context_lens, starts = [], [], [], [0]
        for block_table, num_computed, num_new in seqs:
            end = num_computed + num_new
            if len(block_table) * block_size < end:
                raise ValueError(f"block table of {len(block_table)} blocks cannot hold {end} tokens")
            for pos in range(num_computed, end):
                block = block_table[pos // block_size]
                if block < 0:
                    raise ValueError(f"position {pos} falls in a freed block (NULL_BLOCK): a new token needs a "
                                     "real block")
                slots.append(block * block_size + pos % block_size)
                positions.append(pos)
            context_lens.append(end)
            starts.append(starts[-1] + num_new)
        max_blocks = max((len(bt) for bt, _, _ in seqs), default=0)
        # Pad with block 0, not -1: a kernel that loads a padded entry unmasked still reads a
        # valid block, and the contract says entries past a sequence's end are ignored.
        tables = [list(bt) + [0] * (max_blocks - len(bt)) for bt, _, _ in seqs]
        return cls(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
            block_tables=torch.tensor(tables, dtype=torch.int32, device=device).reshape(len(seqs), max_blocks),
            context_lens=torch.tensor(context_lens, dtype=torch.int32, device=device),
            query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            # a kernel choice, not the cost accounting's prefill-or-decode rule (SchedulerOutput.add
            # in pagesim.core.step): one query token per sequence suits the decode kernel, a last one-token
            # prefill chunk included
            decode_only=len(seqs) > 0 and all(n == 1 for _, _, n in seqs),
        )

    @classmethod
    def build_grouped(cls, seqs, block_size: int, device="cpu", by_table: bool = False) -> "AttentionMetadata":
        """seqs: (block tables, one per KV cache group in the model's kv_groups order,
        num_computed_tokens, num_new_tokens) per sequence. by_table: the tables are the core
        layout's (KVLayout.tables order; HybridKVManager.block_tables), each layer reading its
        kv_table's."""
        num_groups = len(seqs[0][0]) if seqs else 1
        per_group = [cls.build([(tables[g], done, new) for tables, done, new in seqs], block_size, device)
                     for g in range(num_groups)]
        md = per_group[0]
        md.group_tables = [(m.slot_mapping, m.block_tables) for m in per_group]
        md.by_table = by_table
        return md


class PagedAttention(nn.Module):
    """Writes this step's K/V into the layer's cache, then attends over each sequence's context.

    q [num_tokens, num_heads * head_dim], k/v [num_tokens, num_kv_heads * head_dim]; returns
    [num_tokens, num_heads * head_dim]. kv_cache is this layer's (key_cache, value_cache).
    sliding_window: the layer sees the last that many tokens (None = all); the kernels never read
    the blocks wholly before it, so a KV manager may free them (NULL_BLOCK in the table).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, scale: float,
                 sliding_window: int | None = None, kv_group: int = 0, softcap: float | None = None):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"{num_heads} query heads do not split into {num_kv_heads} KV groups")
        self.num_heads, self.num_kv_heads, self.head_dim, self.scale = num_heads, num_kv_heads, head_dim, scale
        self.sliding_window = sliding_window
        self.kv_group = kv_group  # which of the metadata's KV cache groups' tables this layer reads
        self.kv_table = None  # its table in the core's KV layout, set by the engine (executor.kv_layout)
        self.softcap = softcap  # Gemma 2's soft-capping of the scores

    def forward(self, q, k, v, kv_cache, md: AttentionMetadata) -> torch.Tensor:
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        key_cache, value_cache = kv_cache
        slot_mapping, block_tables = md.for_layer(self)
        # New tokens first, so attention reads every context token (its own included) from the
        # cache: one code path for prompts, chunks, prefix hits and recompute.
        kernels.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
        if md.decode_only:
            out = kernels.paged_attention_decode(q, key_cache, value_cache, block_tables, md.context_lens, self.scale,
                                                 self.sliding_window, self.softcap)
        else:
            out = kernels.paged_prefill_attention(q, key_cache, value_cache, block_tables, md.query_start_loc,
                                                  md.context_lens, self.scale, self.sliding_window, self.softcap)
        return out.reshape(-1, self.num_heads * self.head_dim)
