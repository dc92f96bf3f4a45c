"""The executor CLI's memory check sizes the KV pool as the engine allocates it (issue 24): a
hybrid model's tables share layer tensors and MLA keeps one latent tensor per layer, so the
check no longer counts every layer's K and V. Hand-computed sizes, then the engine's real tensors."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from executor.cache_engine import model_pool_bytes  # noqa: E402
from executor.engine import EngineConfig, LLMEngine  # noqa: E402
from executor.models import loader  # noqa: E402
from pagesim.cli import executor_model  # noqa: E402
from pagesim.cli.checks import InputError  # noqa: E402
from tests.executor.test_modern_models import make_config  # noqa: E402

BS, BLOCKS, FP32 = 4, 10, 4
# Tiny configs (tests/executor/test_modern_models.py): 2 KV heads of 16 dims, float32.
# variant -> (layer tensors when paged, layer tensors of the reservation baselines, K and V apart)
HAND = {
    "mistral-tiny": (2, 2, 2),  # one sliding table of both layers: a tensor per layer either way
    "gemma2-tiny": (1, 2, 2),  # a sliding and a full table of one layer each share one tensor
    "qwen3-six-layers": (2, 6, 2),  # 2 full + 4 sliding layers: three tables of two layers
}


def lm_of(variant):
    return loader.from_config(make_config(variant))


@pytest.mark.parametrize("variant", list(HAND))
def test_hybrid_pool_bytes_by_hand(variant):
    paged, every_layer, kv = HAND[variant]
    per_tensor = BLOCKS * BS * 2 * 16 * FP32  # blocks x tokens x KV heads x head dim x bytes
    lm = lm_of(variant)
    assert lm.dtype == torch.float32 and (lm.num_kv_heads, lm.head_dim) == (2, 16)
    assert model_pool_bytes(lm, BS, BLOCKS, paged=True) == kv * paged * per_tensor
    assert model_pool_bytes(lm, BS, BLOCKS, paged=False) == kv * every_layer * per_tensor


def test_mla_pool_is_one_latent_tensor_per_layer():
    # deepseek-v2-tiny: kv_lora_rank 32 + qk_rope_head_dim 8 = 40 values per token and layer, 2 layers,
    # one tensor (the kernels read it as K and V): half of what K and V apart would take
    lm = lm_of("deepseek-v2-tiny")
    assert model_pool_bytes(lm, BS, BLOCKS) == 2 * BLOCKS * BS * 40 * FP32 == 12_800


@pytest.mark.parametrize("variant,policy", [("gemma2-tiny", "paged"), ("gemma2-tiny", "orca-max"),
                                            ("qwen3-six-layers", "paged"), ("deepseek-v2-tiny", "paged")])
def test_pool_bytes_are_what_the_engine_allocates(variant, policy):
    lm = lm_of(variant)
    engine = LLMEngine(lm, EngineConfig(policy=policy, block_size=BS, num_gpu_blocks=BLOCKS, num_cpu_blocks=1))
    tensors = {id(t): t for t in engine.cache.key_caches + engine.cache.value_caches}
    allocated = sum(t.numel() * t.element_size() for t in tensors.values())
    assert allocated == model_pool_bytes(lm, BS, BLOCKS, paged=policy == "paged")


def test_check_passes_a_hybrid_pool_that_only_fits_as_the_engine_lays_it_out(monkeypatch):
    """Host memory free for exactly the paged gemma2-tiny pool (CPU: both pools in host memory):
    paged fits, the every-layer sizing of the reservation baselines does not."""
    lm = lm_of("gemma2-tiny")
    assert lm.device.type == "cpu"
    free = model_pool_bytes(lm, BS, BLOCKS + 1, paged=True)
    monkeypatch.setattr(executor_model.os, "sysconf", lambda name: free if name == "SC_AVPHYS_PAGES" else 1)
    executor_model.check_cache_fits(lm, BS, BLOCKS, 1, paged=True)
    with pytest.raises(InputError, match=r"--num-gpu-blocks \+ --num-cpu-blocks: 11 blocks of 4 tokens"):
        executor_model.check_cache_fits(lm, BS, BLOCKS, 1, paged=False)
