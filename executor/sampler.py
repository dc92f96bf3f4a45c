"""Turning logits into tokens: greedy, or temperature with top-k / top-p, from seeded generators.

The engine gives every sampled sequence its own generator: sample i of a request with n
samples is drawn from a generator seeded seed + i (beam search draws nothing: executor/beam.py)."""

from __future__ import annotations

import random

import torch

from pagesim.core import SamplingParams


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row of logits (fp32)."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, num: int = 1) -> tuple[list[int], list[float]]:
    """num tokens (with replacement) from one row of logits, and their log-probabilities under the
    model's unfiltered distribution."""
    logits = logits.float().cpu()  # sampling is per row and cheap; the generators live on the CPU
    logprobs = torch.log_softmax(logits, dim=-1)
    if params.temperature == 0.0:
        token = int(torch.argmax(logits))
        return [token] * num, [float(logprobs[token])] * num
    probs = torch.softmax(filter_logits(logits, params), dim=-1)
    tokens = torch.multinomial(probs, num, replacement=True, generator=generator).tolist()
    return tokens, [float(logprobs[t]) for t in tokens]


def random_seed() -> int:
    """A fresh seed from the OS (torch.seed() would also reseed torch's global generator)."""
    return random.SystemRandom().getrandbits(62)


def make_generator(seed: int | None) -> torch.Generator:
    gen = torch.Generator()
    gen.manual_seed(seed if seed is not None else random_seed())
    return gen
