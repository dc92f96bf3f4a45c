"""Block keys of token-id prompts kept between requests, so that a prompt seen before is not
hashed again: a replay cycles its trace (10,000 requests from ShareGPT chat's 3,022 records: 70 %
of the prompt blocks are a record's again), and a conversation's next turn starts with the last
turn's prompt.

A prompt is known by the list it was submitted as (Sequence.prompt_ids, never mutated): a repeat
costs one dict lookup, with no token copied or compared (the list is the request's own, kept
alive while its keys are: see KEPT_BYTES). A new prompt whose first block is a kept prompt's reuses the keys of the blocks
both hold. What follows a kept prompt when its sequence finishes (its last partial block and the
outputs) is kept with its token ids, compared on reuse: outputs are not part of the request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

from pagesim.core.block_keys import block_spans, chain_keys, shared_blocks

# The memory the kept keys may take, and hold alive: each key ~40 bytes (an int and a reference), a
# kept output token 8 (a reference), a kept prompt's token 36 (a reference and its int, as a JSON
# reader or a tokenizer makes them: a server's requests' prompts live on only because they are
# kept); past it everything kept is dropped. ShareGPT chat's 3,022 records (2.0 M prompt tokens,
# alive anyway as the trace's) count ~88 MB.
KEPT_BYTES = 96 << 20
KEY_BYTES, TOKEN_BYTES, PROMPT_TOKEN_BYTES = 40, 8, 36


@dataclass(slots=True)
class KeptPrompt:
    ids: list[int]  # the prompt as submitted (kept alive, so that its id() stays its own)
    keys: list  # of its first len(keys) full blocks
    tail_parent: Hashable = None  # the chain after the prompt kept last: its first block's parent,
    tail_start: int = -1  # where it starts in the sequence's token ids,
    tail_tokens: tuple = ()  # its token ids,
    tail_keys: list | None = None  # and their keys


class KeptKeys:
    """Chained keys of token-id prompts (and of the blocks after them) for one cache."""

    def __init__(self, block_size: int, key: Callable[[Hashable, tuple[int, ...]], Hashable]):
        self.block_size = block_size
        self.key = key
        self._prompts: dict[int, KeptPrompt] = {}  # id(prompt ids) -> its keys
        self._heads: dict[Hashable, int] = {}  # a prompt's first key -> id() of the prompt kept last with that first block
        self._bytes = 0  # what _prompts holds, roughly

    def _make_room(self, num_bytes: int) -> None:
        if self._bytes + num_bytes > KEPT_BYTES:
            self._prompts.clear()
            self._heads.clear()
            self._bytes = 0
        self._bytes += num_bytes

    def prompt_keys(self, ids: list[int], num_blocks: int) -> list:
        """The keys of the first num_blocks full blocks of the prompt ids (never mutated)."""
        kept = self._prompts.get(id(ids))
        if kept is not None and len(kept.keys) == num_blocks:
            return kept.keys
        if not num_blocks:
            return []
        bs = self.block_size
        spans = block_spans(ids, bs, num_blocks)
        first = self.key(0, next(spans))
        known = self._prompts.get(self._heads.get(first, -1))  # (-1: no id())
        same = shared_blocks(known.ids, ids, bs, min(len(known.keys), num_blocks)) if known is not None else 0
        if same and known is not None:
            rest = block_spans(ids[same * bs:], bs, num_blocks - same)
            keys = known.keys[:same] + chain_keys(known.keys[same - 1], rest, self.key)
        else:
            keys = [first] + chain_keys(first, spans, self.key)
        self._make_room(KEY_BYTES * num_blocks + PROMPT_TOKEN_BYTES * len(ids))
        self._prompts[id(ids)] = KeptPrompt(ids, keys)
        self._heads[first] = id(ids)
        return keys

    def tail_keys(self, ids: list[int], parent: Hashable, token_ids: list[int], start: int, num_blocks: int) -> list:
        """The keys of the num_blocks full blocks of token_ids from start on, the first one's parent
        given, in a sequence whose prompt is ids: the same as the last ones asked for after that
        prompt when the parent and tokens are."""
        tokens = tuple(token_ids[start:start + num_blocks * self.block_size])
        kept = self._prompts.get(id(ids))
        if kept is not None and kept.tail_start == start and kept.tail_parent == parent and kept.tail_tokens == tokens \
                and kept.tail_keys is not None:  # (set with tail_start)
            return kept.tail_keys
        keys = chain_keys(parent, block_spans(tokens, self.block_size, num_blocks), self.key)
        if kept is not None:  # (a prompt dropped since it was keyed is not kept again)
            if kept.tail_keys is not None:  # (replaced)
                self._bytes -= KEY_BYTES * len(kept.tail_keys) + TOKEN_BYTES * len(kept.tail_tokens)
            self._make_room(KEY_BYTES * num_blocks + TOKEN_BYTES * len(tokens))
            if self._prompts.get(id(ids)) is kept:  # (unless making that room dropped it)
                kept.tail_parent, kept.tail_start, kept.tail_tokens, kept.tail_keys = parent, start, tokens, keys
        return keys
