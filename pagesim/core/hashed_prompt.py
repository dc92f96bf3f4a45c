"""A prompt known only by the hash ids of its fixed-size blocks (Mooncake's traces).

Mooncake publishes, per request, one id per 512-token block of the prompt: equal ids mean equal
prefix KV. Materialising those prompts as token lists would take 144 M Python ints for the
conversation hour, so a HashedPrompt keeps only the ids and produces tokens on demand.

Its canonical token at position p (block k = p // B, offset j = p % B, B the hashed block size)
is `hash_ids[k] * B + j`: one id per (hash id, offset), so two prompts agree on a span of
positions exactly when their hash ids agree on the blocks covering it. A partial last block is
the first tokens of its hash id's block. These ids only serve the simulator's prefix cache,
which never looks them up in a vocabulary; `vocab_ids` gives real token ids for a model.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Hashable, Iterator

FIRST_VOCAB_ID = 4  # real ids avoid the first few (special tokens in most vocabularies)
# Numbered keys start here. They are ints, never bytes, so they cannot meet a sha256 key; a fast key
# (a Python hash(), any machine word) meets one with probability 2^-64 a pair, as two fast keys of
# different blocks meet each other, which fast keys accept. Below 2^63 they are machine words,
# which a range makes at C speed: half the instructions of adding to a larger base (~290 against
# ~570 a key, callgrind), and the Mooncake hour makes 9 M of them.
NUMBERED_KEYS_BASE = 1 << 62


@dataclass(frozen=True, slots=True)
class HashedPrompt:
    hash_ids: tuple[int, ...]
    length: int  # prompt tokens; the last block holds length - (len(hash_ids) - 1) * block_tokens
    block_tokens: int = 512

    def __post_init__(self):
        if self.length < 1 or self.block_tokens < 1:
            raise ValueError(f"HashedPrompt: length {self.length} and block_tokens {self.block_tokens} must be >= 1")
        blocks = -(-self.length // self.block_tokens)
        if len(self.hash_ids) != blocks:
            raise ValueError(f"HashedPrompt: {len(self.hash_ids)} hash ids for {self.length} tokens "
                             f"({blocks} blocks of {self.block_tokens})")
        if any(h < 0 for h in self.hash_ids):
            raise ValueError("HashedPrompt: hash ids must be >= 0")

    def __len__(self) -> int:
        return self.length

    def token_id(self, pos: int) -> int:
        if not 0 <= pos < self.length:
            raise IndexError(f"position {pos} outside a prompt of {self.length} tokens")
        block, offset = divmod(pos, self.block_tokens)
        return self.hash_ids[block] * self.block_tokens + offset

    def __iter__(self) -> Iterator[int]:
        bt = self.block_tokens
        for k, h in enumerate(self.hash_ids):
            base = h * bt
            yield from range(base, base + min(bt, self.length - k * bt))

    def to_list(self) -> list[int]:
        """Every canonical token id (what the block keys below are equivalent to hashing)."""
        return list(self)

    def truncated(self, length: int) -> HashedPrompt:
        """The first `length` tokens (a context cap keeps the start, where the sharing is)."""
        length = min(length, self.length)
        return HashedPrompt(self.hash_ids[:-(-length // self.block_tokens)], length, self.block_tokens)

    def block_keys(self, block_size: int, num_blocks: int, key: Callable[[Hashable, tuple[int, ...]], Hashable]) -> list:
        """Chained prefix-cache keys of the first num_blocks full blocks of block_size tokens.

        Instead of a block's token ids, `key` gets its description in canonical ids: a -1 (no
        token id is negative, so a description never equals a real block's ids), then for each
        hashed block the span overlaps, (hash id, first offset, end offset). For the same block
        index the spans' offsets are the same in every prompt, so two descriptions are equal
        exactly when the token ids are, and chaining (parent key, description) gives the same
        hits and misses as hashing the materialised ids, without making them.
        """
        bt = self.block_tokens
        ids = self.hash_ids
        keys = []
        parent: Hashable = 0
        if bt % block_size == 0:  # (the usual case: a block never straddles two hashed blocks)
            per = bt // block_size
            for i in range(num_blocks):
                start = (i % per) * block_size
                parent = key(parent, (-1, ids[i // per], start, start + block_size))
                keys.append(parent)
            return keys
        for i in range(num_blocks):
            pos, end = i * block_size, (i + 1) * block_size
            parts: list[int] = [-1]
            while pos < end:
                k, offset = divmod(pos, bt)
                stop = min(end - k * bt, bt)
                parts += (ids[k], offset, stop)
                pos = k * bt + stop
            parent = key(parent, tuple(parts))
            keys.append(parent)
        return keys

    def vocab_ids(self, vocab_size: int, seed: int = 0) -> list[int]:
        """Real token ids for a model with vocab_size tokens: each hash id's block is a seeded
        stream of ids in [FIRST_VOCAB_ID, vocab_size), the same in every prompt holding it, so
        the sharing is kept (a partial block is the start of its stream). Two different hash
        ids agree on the b tokens of a cache block at the same offset with probability
        (vocab_size - 4) ** -b (1e-81 for 16 tokens of a 128K vocabulary)."""
        if vocab_size <= FIRST_VOCAB_ID:
            raise ValueError(f"vocab_size must be > {FIRST_VOCAB_ID}, got {vocab_size}")
        out: list[int] = []
        bt = self.block_tokens
        for k, h in enumerate(self.hash_ids):
            rng = random.Random(f"pagesim-hash-block:{seed}:{h}")
            out += [rng.randrange(FIRST_VOCAB_ID, vocab_size) for _ in range(min(bt, self.length - k * bt))]
        return out


class HashChainKeys:
    """Prefix-cache keys of hashed prompts by numbering, for one cache.

    Each distinct chain of hash ids (a hashed block and every one before it) gets a number the
    first time it is seen; when the cache block size divides the hashed block, cache block j
    of a hashed block whose chain is number c gets key BASE + c * per + j (per = blocks per
    hashed block). Equal keys <=> equal chains <=> equal materialised ids, exactly (no hash can
    collide), and a prompt costs one dict lookup per hashed block instead of one key per cache
    block: the Mooncake hour at 16-token blocks is 9 M cache blocks, 290 K hashed ones.
    Other block sizes fall back to HashedPrompt.block_keys with the cache's own key function.
    """

    def __init__(self, block_size: int, key: Callable[[Hashable, tuple[int, ...]], Hashable]):
        self.block_size = block_size
        self.key = key
        self._chains: dict[tuple[int, int], int] = {}  # (chain number before, hash id) -> chain number

    def keys(self, prompt: HashedPrompt, num_blocks: int) -> list:
        bs, bt = self.block_size, prompt.block_tokens
        if bt % bs:
            return prompt.block_keys(bs, num_blocks, self.key)
        per = bt // bs
        chains, keys = self._chains, []
        chain = -1
        for h in prompt.hash_ids[:-(-num_blocks // per)]:
            number = chains.get((chain, h))
            if number is None:
                number = chains[(chain, h)] = len(chains)
            chain = number
            first = NUMBERED_KEYS_BASE + number * per
            keys += range(first, first + per)
        del keys[num_blocks:]
        return keys

