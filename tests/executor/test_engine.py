"""The executor's engine, driven by the unchanged core, against transformers' own generate()."""

import json
import random

import pytest
import torch

from executor.engine import EngineConfig, LLMEngine
from pagesim.core import SamplingParams

MAX_NEW = 12


@pytest.fixture(scope="module", params=["opt-tiny", "llama-tiny"])
def pair(request, tiny_hf):
    hf, lm = tiny_hf(request.param)
    rng = random.Random(1)
    prompts = [[rng.randint(3, 127) for _ in range(rng.randint(2, 45))] for _ in range(8)]
    expected = []
    for p in prompts:
        out = hf.generate(torch.tensor([p]), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW, do_sample=False, pad_token_id=0)
        expected.append(out[0, len(p):].tolist())
    return lm, prompts, expected


def greedy(engine, prompts):
    results = engine.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0, ignore_eos=True))
    return [r.outputs[0] for r in results]


def assert_pool_empty(engine):
    kv = engine.scheduler.kv
    assert kv.num_free_blocks == kv.num_device_blocks
    if hasattr(kv, "device"):
        assert all(r == 0 for r in kv.device.refcount) and all(r == 0 for r in kv.host.refcount)


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_greedy_equals_transformers(pair, block_size):
    lm, prompts, expected = pair
    engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=4096 // block_size, max_num_seqs=8))
    assert greedy(engine, prompts) == expected
    assert engine.scheduler.num_preemptions == 0
    assert_pool_empty(engine)


@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("block_size", [8, 16])
def test_greedy_equals_transformers_under_preemption(pair, mode, block_size):
    lm, prompts, expected = pair
    # A pool of 192 token slots holds the longest request (57 tokens) but not all eight at once.
    engine = LLMEngine(lm, EngineConfig(block_size=block_size, num_gpu_blocks=192 // block_size, num_cpu_blocks=64,
                                        max_num_seqs=8, preemption=mode))
    assert greedy(engine, prompts) == expected
    assert engine.scheduler.num_preemptions > 0
    if mode == "swap":
        assert engine.scheduler.num_swapped_blocks > 0
    assert_pool_empty(engine)


@pytest.mark.parametrize("policy", ["orca-max", "orca-pow2", "orca-oracle", "static"])
def test_greedy_equals_transformers_under_reservation_policies(pair, policy):
    lm, prompts, expected = pair
    engine = LLMEngine(lm, EngineConfig(policy=policy, block_size=16, num_gpu_blocks=128, max_num_seqs=8))
    assert greedy(engine, prompts) == expected
    assert_pool_empty(engine)


def test_chunked_prefill_and_prefix_caching_keep_tokens(pair):
    lm, prompts, expected = pair
    # the same prompts twice: the second copies hit the prefix cache
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=16, chunked_prefill=True,
                                        max_num_batched_tokens=24, prefix_caching=True))
    assert greedy(engine, prompts + prompts) == expected + expected
    assert engine.scheduler.kv.prefix_hits > 0
    assert_pool_empty(engine)


def test_parallel_sampling_shares_the_prompt_and_frees_everything(pair):
    lm, prompts, _ = pair
    engine = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=32))
    params = SamplingParams(n=3, max_tokens=MAX_NEW, temperature=1.0, seed=7, ignore_eos=True)
    results = engine.generate(prompts[:4], params)
    for r in results:
        assert len(r.outputs) == 3 and all(len(o) == MAX_NEW for o in r.outputs)
    assert_pool_empty(engine)
    # seeded: the same request again gives the same samples
    again = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=32)).generate(prompts[:4], params)
    assert [r.outputs for r in again] == [r.outputs for r in results]


def test_pagesim_run_writes_the_replay_schema(tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "traces/alpaca.json", "--model", "random:llama-tiny", "--num-requests", "6",
                                      "--rate", "1000", "--max-model-len", "256", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["num_requests"] == 6 and summary["num_finished"] + summary["num_rejected"] == 6
    bad = CliRunner().invoke(app, ["run", "traces/alpaca.json", "--model", "random:llama-tiny", "--rate", "0"])
    assert bad.exit_code == 2 and "no arrival_time" in bad.output
    replay_dir = tmp_path / "replay"
    result = CliRunner().invoke(app, ["replay", "traces/alpaca.json", "--num-requests", "6", "--out", str(replay_dir), "--json"])
    assert result.exit_code == 0, result.output
    for name in ("requests.csv", "steps.csv"):
        assert (out / name).read_text().splitlines()[0] == (replay_dir / name).read_text().splitlines()[0]
    assert set(json.loads((replay_dir / "summary.json").read_text())) - set(summary) <= {"config", "cost_model", "max_model_len", "num_host_blocks"}


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_parallel_samples_survive_preemption(pair, mode):
    """n=2 groups preempted (by recompute: re-admitted with the siblings sharing the first
    sequence's prompt blocks; by swap) sample exactly what they sample undisturbed."""
    lm, prompts, _ = pair
    params = SamplingParams(n=2, max_tokens=MAX_NEW, temperature=1.0, seed=3, ignore_eos=True)
    calm = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=256, max_num_seqs=16)).generate(prompts, params)
    tight = LLMEngine(lm, EngineConfig(block_size=8, num_gpu_blocks=24, num_cpu_blocks=64, max_num_seqs=16, preemption=mode))
    squeezed = tight.generate(prompts, params)
    assert tight.scheduler.num_preemptions > 0
    assert [sorted(r.outputs) for r in squeezed] == [sorted(r.outputs) for r in calm]
    assert_pool_empty(tight)
