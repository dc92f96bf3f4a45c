"""Prefix-cache block keys: a full block's key covers its tokens and, chained through its parent's
key, every token before it (vLLM's block hashes); the fast and the SHA-256 key functions, and
the chains of many blocks computed at C speed."""

from __future__ import annotations

import hashlib
from array import array
from itertools import accumulate
from typing import Callable, Hashable, Sequence, cast


def fast_block_key(parent: Hashable, tokens: tuple[int, ...]) -> int:
    """Python's hash of (parent key, tokens): fast, fine for a simulation, but collidable on
    purpose, so never for a server shared between users."""
    return hash((parent, tokens))


def sha256_block_key(parent: Hashable, tokens: tuple[int, ...]) -> bytes:
    """SHA-256 over the parent's key and the block's token ids (what vLLM moved to after its
    hash-collision advisory): a crafted prompt cannot reach another prompt's cached block."""
    # The parent is a digest (32 bytes), the root (0: nothing), or a hashed prompt's numbered key
    # (pagesim.core.hashed_prompt: an int below 2^63, as b"n" and 8 bytes, so that different
    # hashed prefixes give different keys); with 8 bytes an id, the input is unambiguous.
    if isinstance(parent, bytes):
        digest = hashlib.sha256(parent)
    else:
        digest = hashlib.sha256(b"n" + cast(int, parent).to_bytes(8, "little", signed=True) if parent else b"")
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


BLOCK_KEYS: dict[str, Callable[[Hashable, tuple[int, ...]], Hashable]] = {"fast": fast_block_key,
                                                                          "sha256": sha256_block_key}


def block_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int, key=fast_block_key) -> list:
    """Chained keys of the first num_blocks full blocks: a block's key covers its own
    tokens and, through its parent's key, every token before it."""
    return chain_keys(0, block_spans(token_ids, block_size, num_blocks), key)


def block_spans(token_ids: Sequence[int], block_size: int, num_blocks: int):
    """The token ids of the first num_blocks blocks, a tuple each (short ids: the last are partial
    or empty)."""
    end = num_blocks * block_size
    if end > len(token_ids):
        return (tuple(token_ids[i * block_size:(i + 1) * block_size]) for i in range(num_blocks))
    # (consecutive tuples, at C speed; ids of exactly those blocks are not copied again)
    return zip(*[iter(token_ids if end == len(token_ids) else token_ids[:end])] * block_size)


def shared_blocks(a: list, b: list, block_size: int, num_blocks: int | None = None) -> int:
    """The leading whole blocks (at most num_blocks) on which the ids a and b agree: list compares
    at C speed, first of the longest span both hold (a conversation's earlier turn is a prefix of
    its next: one compare), then a binary search over blocks."""
    lo = 0
    hi = mid = min(len(a) // block_size, len(b) // block_size, len(a) if num_blocks is None else num_blocks)
    while lo < hi:  # (blocks before lo agree, none after hi)
        if a[lo * block_size:mid * block_size] == b[lo * block_size:mid * block_size]:
            lo = mid
        else:
            hi = mid - 1
        mid = (lo + hi + 1) // 2
    return lo


def chain_keys(parent: Hashable, spans, key) -> list:
    """The chained keys of consecutive blocks given by their token tuples, the first one's parent given."""
    if key is fast_block_key:
        # hash((parent, tokens)) with no Python call per block: list.extend appends each key as
        # it comes, and zip reads the list being extended, so key i pairs with block i + 1.
        # (~1,000 instructions a 16-token block against ~1,600 for accumulate calling the function)
        keys = [parent]
        keys += map(hash, zip(keys, spans))
    else:
        keys = list(accumulate(spans, key, initial=parent))  # (key(parent, tokens) called from C, no loop here)
    del keys[0]
    return keys
