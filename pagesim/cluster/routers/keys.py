"""A prompt's chained block keys, as a router records and matches them: the same chained keys
the paged KV manager's prefix cache uses (pagesim.core.paged.block_hashes), over the prompt's
token ids, or over a text prompt's characters where no tokenizer is at hand (SGLang's router
matches raw text the same way). A key covers its block and, through its parent, every token
before it, so two prompts share their first k keys exactly when they share their first k full
blocks."""

from __future__ import annotations

from typing import Hashable, Sequence

from pagesim.core.paged import block_hashes, fast_block_key

DEFAULT_BLOCK_SIZE = 16  # vLLM's default KV block size, and llm-d's recommended prefix block size


def prefix_keys(prompt: Sequence[int] | str, block_size: int = DEFAULT_BLOCK_SIZE,
                key=fast_block_key) -> tuple[Hashable, ...]:
    """The keys of the prompt's full blocks (a trailing partial block has none). fast_block_key
    hashes tuples of ints, which Python hashes the same in every process, so a router and a
    simulator compute the same keys; collisions cost a routing decision, never a wrong answer."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    tokens = [ord(c) for c in prompt] if isinstance(prompt, str) else list(prompt)
    return tuple(block_hashes(tokens, block_size, len(tokens) // block_size, key))
