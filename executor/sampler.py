"""Turning logits into tokens: greedy, or temperature with top-k / top-p, from seeded generators.

The engine gives every sampled sequence its own generator: sample i of a request with n
samples is drawn from a generator seeded seed + i (beam search draws nothing: executor/beam.py).

Whatever finite parameters a request brings, sampling gives a token: a temperature below
SAMPLING_EPS is greedy (as vLLM does; dividing by 1e-320 overflows every logit to inf), scaling
is done in float64 (logits / 1e-5 still fit), and top-p always keeps the most likely token (a
top_p of 1e-320 is 0 in float32 and would drop them all). Non-finite parameters or logits raise
ValueError: a caller's bug or a broken model, never a silent token."""

from __future__ import annotations

import math
import random

import torch

from pagesim.core import SamplingParams


SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a temperature below it samples greedily


def check_sampling(params: SamplingParams) -> None:
    """The values sample() can work with: finite, temperature >= 0, top_p in (0, 1], top_k >= 0."""
    if not math.isfinite(params.temperature) or params.temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0, got {params.temperature}")
    if not math.isfinite(params.top_p) or not 0 < params.top_p <= 1:
        raise ValueError(f"top_p must be a finite number in (0, 1], got {params.top_p}")
    if params.top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: off), got {params.top_k}")


def is_greedy(params: SamplingParams) -> bool:
    return params.temperature < SAMPLING_EPS


def filter_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature, then top-k, then top-p (nucleus) on one row of logits, in float64."""
    logits = logits.double() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # drop a token when the tokens ranked above it already reach top_p
        drop = (torch.cumsum(probs, dim=-1) - probs) >= params.top_p
        drop[0] = False  # the most likely token always stays
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, num: int = 1) -> tuple[list[int], list[float]]:
    """num tokens (with replacement) from one row of logits, and their log-probabilities under the
    model's unfiltered distribution."""
    check_sampling(params)
    logits = logits.float().cpu()  # sampling is per row and cheap; the generators live on the CPU
    if torch.isnan(logits).any() or torch.isposinf(logits).any():
        raise ValueError("the model produced NaN or +inf logits")
    logprobs = torch.log_softmax(logits, dim=-1)
    if is_greedy(params):
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
