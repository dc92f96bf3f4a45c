"""What `pagesim bench` sends as each request's prompt.

By default the token ids themselves (OpenAI's completions API takes a list of ids; vLLM and
`pagesim serve` accept them): the trace's own ids where it has them, else the same seeded ids
`pagesim run` feeds the executor in-process, so both paths compute the same tokens. With a
tokenizer, text instead: decoded from those ids and adjusted until it encodes to exactly
prompt_len tokens (the server's count comes back in `usage` and is what gets recorded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pagesim.core import Request
from pagesim.workload.requests import synthetic_prompt


@dataclass
class PromptMaker:
    vocab_size: int
    seed: int
    tokenizer: Any = None  # an HF tokenizer: send text; None: send token ids

    def prompt(self, request: Request) -> list[int] | str:
        ids = request.prompt_token_ids or synthetic_prompt(request, self.vocab_size, self.seed)
        if self.tokenizer is None:
            return ids
        return text_of_length(self.tokenizer, ids, request.prompt_len)


def text_of_length(tokenizer, ids: list[int], length: int, tries: int = 8) -> str:
    """Text that the tokenizer encodes (with its special tokens) to `length` tokens. Decoding
    and re-encoding can merge or split tokens, so the ids are cut or extended and tried again."""
    special = len(tokenizer.encode("", add_special_tokens=True))
    target = max(1, length - special)
    # special ids (a tokenized prompt's BOS) decode to nothing: they would only use up the budget
    specials = set(tokenizer.all_special_ids)
    ids = [t for t in ids if t not in specials][:target]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    for _ in range(tries):
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == target:
            return text
        # too long: cut; too short: pad with the prompt's own first ids
        encoded = encoded[:target] + ids[:max(0, target - len(encoded))]
        text = tokenizer.decode(encoded, skip_special_tokens=True)
    return text  # close: the server's usage.prompt_tokens records what it really was
