"""Sharing in the executor: parallel sampling with per-sample seeds (copy-on-write must not let
one sample's tokens leak into another's), and beam search against transformers' generate()."""

import random

import pytest
import torch

from executor.engine import EngineConfig, LLMEngine
from executor.models.loader import from_hf_model
from executor.sampler import make_generator, sample
from pagesim.core import SamplingParams

MAX_NEW = 10


@pytest.fixture(scope="module", params=["opt-tiny", "llama-tiny"])  # llama-tiny: GQA
def pair(request, tiny_hf):
    hf, lm = tiny_hf(request.param)
    rng = random.Random(2)
    # lengths off block boundaries (block size 8): the prompt's last block is shared partly filled
    prompts = [[rng.randint(3, 127) for _ in range(n)] for n in (5, 13, 21, 30)]
    return hf, lm, prompts


def assert_pool_empty(engine):
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_device_blocks
    if hasattr(kv, "device"):
        assert all(r == 0 for r in kv.device.refcount) and all(r == 0 for r in kv.host.refcount)


def count_copies(engine):
    """Wrap the cache's block copy to count copy-on-write copies."""
    copies = []
    original = engine.cache.copy

    def copy(pairs):
        copies.extend(pairs)
        original(pairs)

    engine.cache.copy = copy
    return copies


# -- parallel sampling ---------------------------------------------------------------------------

SAMPLING = SamplingParams(n=4, max_tokens=MAX_NEW, temperature=0.9, top_k=40, top_p=0.95, seed=11, ignore_eos=True)


def alone(lm, prompts, params):
    """Every sample i of every prompt as its own n = 1 request with seed + i (no block shared with
    anything: separate requests, prefix caching off), one engine per prompt."""
    outputs = []
    for p in prompts:
        engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=64, max_num_seqs=4))
        singles = [SamplingParams(max_tokens=params.max_tokens, temperature=params.temperature, top_k=params.top_k,
                                  top_p=params.top_p, seed=params.seed + i, ignore_eos=True) for i in range(params.n)]
        outputs.append([r.outputs[0] for r in engine.generate([p] * params.n, singles)])
    return outputs


def hf_sampled(hf, prompt, params, seed):
    """The independent reference for one sample: transformers' logits, our sampler, a generator
    seeded seed, no cache reuse at all (the whole sequence is re-run each step)."""
    gen = make_generator(seed)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(params.max_tokens):
            logits = hf(torch.tensor([ids])).logits[0, -1]
            ids.append(sample(logits, params, gen)[0][0])
    return ids[len(prompt):]


def test_each_sample_equals_its_seed_run_alone(pair):
    hf, lm, prompts = pair
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=128, max_num_seqs=32))
    copies = count_copies(engine)
    grouped = [r.outputs for r in engine.generate(prompts, SAMPLING)]
    assert grouped == alone(lm, prompts, SAMPLING)
    # each prompt's partly filled last block was copied on the first divergent write: 3 copies
    # per prompt (the fourth writer finds the block no longer shared)
    assert len(copies) == 3 * len(prompts)
    assert all(len(set(map(tuple, outs))) > 1 for outs in grouped)  # the samples really differ
    assert_pool_empty(engine)
    # sample 2 of the second prompt against transformers' own logits
    assert grouped[1][2] == hf_sampled(hf, prompts[1], SAMPLING, SAMPLING.seed + 2)


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_samples_unchanged_under_preemption(pair, mode):
    _, lm, prompts = pair
    # 14 blocks of 8: the longest group alone needs 4 + 4 * 2 = 12 blocks at its end, all four do not fit
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=14, num_cpu_blocks=64, max_num_seqs=32,
                                        preemption=mode))
    results = engine.generate(prompts, SAMPLING)
    assert engine.scheduler.num_preemptions > 0
    if mode == "auto":  # multi-sequence groups are swapped, not recomputed
        assert engine.scheduler.num_swapped_blocks > 0
        assert all(r.group.num_swaps == r.group.num_preemptions for r in results)
    assert [r.outputs for r in results] == alone(lm, prompts, SAMPLING)
    assert_pool_empty(engine)


# -- beam search ---------------------------------------------------------------------------------


def hf_beams(hf, prompt, width, length_penalty=1.0, early_stopping=False):
    out = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                      max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, length_penalty=length_penalty,
                      early_stopping=early_stopping, pad_token_id=0, return_dict_in_generate=True, output_logits=True)
    return [s[len(prompt):].tolist() for s in out.sequences], out.beam_indices.tolist()


def beam_params(width):
    return SamplingParams(beam_width=width, max_tokens=MAX_NEW, ignore_eos=True)


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("policy", ["paged", "orca-max"])
def test_beam_search_equals_transformers(pair, width, policy):
    hf, lm, prompts = pair
    engine = LLMEngine(lm, EngineConfig(policy=policy, block_size=8, num_gpu_blocks=256, max_num_seqs=32))
    results = engine.generate(prompts, beam_params(width))
    for prompt, result in zip(prompts, results):
        expected, beam_indices = hf_beams(hf, prompt, width)
        assert result.outputs == expected  # all beams, best first
        # the recorded ancestry, followed back from each final beam, is transformers' beam_indices
        for final_rank, hf_parents in enumerate(beam_indices):
            rank, chain = final_rank, []
            for step in reversed(result.beam_parent_ranks):
                rank = step[rank]
                chain.append(rank)
            assert [0] + chain[::-1] == hf_parents
    assert_pool_empty(engine)


@pytest.mark.parametrize("length_penalty,early_stopping", [(0.0, "never"), (2.0, True), (-1.0, False)])
def test_length_penalty_and_early_stopping_do_not_matter_at_fixed_length(pair, length_penalty, early_stopping):
    hf, lm, prompts = pair
    results = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=32)).generate(prompts, beam_params(4))
    assert [r.outputs for r in results] == [hf_beams(hf, p, 4, length_penalty, early_stopping)[0] for p in prompts]


def test_eos_is_never_a_beam_candidate(pair):
    """With EOS set to the token the model likes best after the first prompt, transformers'
    min_new_tokens keeps it out of every beam; so must ignore_eos."""
    hf, _, prompts = pair
    with torch.no_grad():
        favourite = int(hf(torch.tensor([prompts[0]])).logits[0, -1].argmax())
    lm = from_hf_model(hf)
    lm.eos_token_id = favourite
    saved = hf.generation_config.eos_token_id
    hf.generation_config.eos_token_id = favourite
    try:
        expected = [hf_beams(hf, p, 4)[0] for p in prompts]
    finally:
        hf.generation_config.eos_token_id = saved
    results = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=32)).generate(prompts, beam_params(4))
    assert [r.outputs for r in results] == expected
    assert not any(favourite in out for r in results for out in r.outputs)


def test_beam_search_shares_blocks(pair):
    _, lm, prompts = pair
    roomy = LLMEngine(lm, EngineConfig(block_size=4, num_gpu_blocks=512, max_num_seqs=32))
    copies = count_copies(roomy)
    peak_shared = 0
    for p in prompts:
        roomy.add_request(p, beam_params(4))
    while roomy.has_unfinished():
        roomy.step(0.0)
        kv = roomy.scheduler.kv
        peak_shared = max(peak_shared, sum(r > 1 for r in kv.device.refcount))
    assert peak_shared > 0 and copies  # beams shared prompt blocks and copied the written one
    assert_pool_empty(roomy)


@pytest.mark.parametrize("mode", ["auto", "recompute"])
def test_beams_unchanged_under_preemption(pair, mode):
    """A pool too small for all four beam groups at once: the newest groups are preempted whole
    (swapped under auto) and come back to the same beams."""
    hf, lm, prompts = pair
    tight = LLMEngine(lm, EngineConfig(block_size=4, num_gpu_blocks=40, num_cpu_blocks=128, max_num_seqs=32,
                                       preemption=mode))
    results = tight.generate(prompts, beam_params(4))
    assert tight.scheduler.num_preemptions > 0
    assert (tight.scheduler.num_swapped_blocks > 0) == (mode == "auto")
    assert [r.outputs for r in results] == [hf_beams(hf, p, 4)[0] for p in prompts]
    assert_pool_empty(tight)


def test_beam_search_without_ignore_eos_is_refused(pair):
    _, lm, prompts = pair
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=64))
    with pytest.raises(ValueError, match="ignore_eos=True only"):
        engine.add_request(prompts[0], SamplingParams(beam_width=2, max_tokens=4))
    assert not engine.has_unfinished()
