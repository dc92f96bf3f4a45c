"""Rebuilding the prompts of inference-perf's `shared_prefix` data, which its recordings leave out.

The generator (kubernetes-sigs/inference-perf at e8e0aa99, the version the BLIS campaign
pinned) made num_groups x num_prompts_per_group prompts: each group a system prompt of
system_prompt_len random tokens, each prompt that system prompt then question_len random tokens
of its own. It shuffled the list once, and request j of a stage sent prompt j % len(list). The
recorded input lengths are the server's count of the decoded text (so they differ from the
profile's lengths), but equal prompts give equal lengths, which is what identifies them here:

- a slot's length is the most common recorded length among the successful requests of that slot;
- a request whose length is not its slot's but a neighbouring slot's (j +- 1..3) was sent out of
  order by the client's workers (two close arrivals swapped): it gets that slot's prompt;
- any other request gets a prompt of its own (its group's system prompt, then its own tokens).

Which slots share a system prompt cannot be told from the data (the shuffle was not seeded):
slot s is put in group s // num_prompts_per_group. The sharing it gets wrong only matters until
every prompt has been seen once (after that, each request repeats a whole cached prompt).
"""

from __future__ import annotations

import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np

NEIGHBOURS = (-1, 1, -2, 2, -3, 3)
FIRST_ID = 10  # token ids start above the special tokens of most vocabularies


@dataclass
class PromptRule:
    num_groups: int
    num_prompts_per_group: int
    system_prompt_len: int
    vocab_size: int

    @property
    def num_prompts(self) -> int:
        return self.num_groups * self.num_prompts_per_group


@dataclass
class Assignment:
    """What the rule gave each request of a stage: its prompt's token ids, group and length."""

    token_ids: list[list[int]]
    groups: list[int]
    lengths: list[int]
    num_neighbour: int  # matched a neighbouring slot (sent out of order)
    num_own: int  # matched no slot: a prompt of its own
    num_unrecorded: int  # no recorded length (failed requests): given their slot's


def slot_lengths(lengths: list[int], ok: list[bool], num_prompts: int) -> dict[int, int]:
    """Each slot's length: the most common recorded length of its successful requests."""
    counts: dict[int, Counter] = {slot: Counter() for slot in range(num_prompts)}
    for j, (length, good) in enumerate(zip(lengths, ok)):
        if good and length > 0:
            counts[j % num_prompts][length] += 1
    # most_common breaks ties by first seen: the earliest request's length
    return {slot: c.most_common(1)[0][0] for slot, c in counts.items() if c}


def _ids(name: str, count: int, vocab: int) -> list[int]:
    """count seeded token ids in [FIRST_ID, vocab), the same for the same name on every machine."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    return rng.integers(FIRST_ID, vocab, size=count).tolist()


class PromptBook:
    """The token ids of the rule's prompts, made once per (slot, length) and shared, so that equal
    prompts are the same list (a trace of 9,000 requests holds 100 prompts, not 9,000)."""

    def __init__(self, rule: PromptRule, seed: str):
        self.rule = rule
        self.seed = seed
        self._system: dict[int, list[int]] = {}
        self._prompts: dict[tuple, list[int]] = {}

    def system(self, group: int) -> list[int]:
        if group not in self._system:
            self._system[group] = _ids(f"{self.seed}:system:{group}", self.rule.system_prompt_len,
                                       self.rule.vocab_size)
        return self._system[group]

    def prompt(self, key: tuple, group: int, length: int) -> list[int]:
        """The prompt named key (a slot, or a request of its own) of `length` tokens."""
        ids = self._prompts.get((key, length))
        if ids is None:
            shared = min(self.rule.system_prompt_len, length - 1)
            ids = self.system(group)[:shared] + _ids(f"{self.seed}:prompt:{key}:{length}", length - shared,
                                                     self.rule.vocab_size)
            self._prompts[(key, length)] = ids
        return ids


def assign_prompts(book: PromptBook, lengths: list[int], ok: list[bool], slots: dict[int, int],
                   stage: int) -> Assignment:
    """The prompt of each request of one stage (requests in arrival order, j from 0)."""
    rule = book.rule
    n, per_group = rule.num_prompts, rule.num_prompts_per_group
    out = Assignment([], [], [], 0, 0, 0)
    for j, length in enumerate(lengths):
        slot = j % n
        if length <= 0:  # not recorded (a failed request): the rule's slot, its length
            out.num_unrecorded += 1
            length = slots.get(slot, 0)
            if length <= 0:
                length = rule.system_prompt_len + 1
                key = ("own", stage, j)
            else:
                key = slot
        elif slots.get(slot) == length:
            key = slot
        else:
            near = [(slot + d) % n for d in NEIGHBOURS if slots.get((slot + d) % n) == length]
            if near:
                slot = near[0]
                key = slot
                out.num_neighbour += 1
            else:
                key = ("own", stage, j)
                out.num_own += 1
        group = slot // per_group
        out.token_ids.append(book.prompt(key, group, length))
        out.groups.append(group)
        out.lengths.append(length)
    return out


def repeat_rate(lengths: list[int], ok: list[bool], period: int) -> tuple[int, int]:
    """(equal, pairs): successful requests j >= period whose recorded length equals request
    j - period's, also successful: the evidence for the j % period rule."""
    pairs = equal = 0
    for j in range(period, len(lengths)):
        if ok[j] and ok[j - period]:
            pairs += 1
            equal += lengths[j] == lengths[j - period]
    return equal, pairs
