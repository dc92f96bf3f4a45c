"""Prefix caching in the executor: a hit skips the cached blocks' compute and gives the same
tokens as a cold run (the reference: greedy decoding with the transformers model itself)."""

import random

import pytest
import torch

from executor.engine import EngineConfig, LLMEngine
from pagesim.core import SamplingParams

MAX_NEW = 8
BS = 8


@pytest.fixture(scope="module", params=["opt-tiny", "llama-tiny"])
def model(request, tiny_hf):
    return tiny_hf(request.param)


@torch.no_grad()
def hf_greedy(hf, prompt):
    """Plain greedy decoding with the transformers model, full forward every token (EOS is an
    ordinary token here, as with ignore_eos)."""
    ids = list(prompt)
    for _ in range(MAX_NEW):
        ids.append(int(hf(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def test_hit_skips_the_shared_blocks_and_keeps_the_tokens(model):
    hf, lm = model
    rng = random.Random(3)
    prefix = [rng.randint(3, 127) for _ in range(3 * BS + 5)]
    prompts = [prefix + [rng.randint(3, 127) for _ in range(rng.randint(1, 9))] for _ in range(3)]
    engine = LLMEngine(lm, EngineConfig(block_size=BS, num_gpu_blocks=64, max_num_seqs=8, prefix_caching=True))
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True)
    computed = []  # prompt tokens computed for each request, counted from the scheduler's output
    for prompt in prompts:  # one after the other: each later request finds the prefix cached
        group = engine.add_request(prompt, params)
        tokens = 0
        now = 0.0
        while engine.has_unfinished():
            stats = engine.step(now)
            tokens += stats.out.num_prefill_tokens
            now += 1.0
        computed.append(tokens)
        assert group.finished_seqs[0].output_token_ids == hf_greedy(hf, prompt)
    shared_blocks = len(prefix) // BS  # whole blocks of the common prefix
    assert computed[0] == len(prompts[0])
    for prompt, tokens in zip(prompts[1:], computed[1:]):
        assert tokens == len(prompt) - shared_blocks * BS
    assert engine.scheduler.kv.prefix_hits == 2 * shared_blocks
