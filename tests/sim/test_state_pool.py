"""Pool sizing of a model with linear-attention (state) layers, as vLLM v1 sizes it: Qwen3-Next-80B-A3B
(12 full-attention layers, 36 Gated DeltaNet layers) on h100-80gb at TP 4, by hand.

vLLM (HybridAttentionMambaModelConfig.verify_and_update_config / the platform's hybrid block-size
alignment, mamba_cache_mode "none"): the attention block size is raised until one attention page
(block_size tokens of one layer on one GPU) holds one layer's state page, in multiples of the
kernel grain (16 for FlashAttention, or the user's larger block size); the state page is padded to
the attention page; the pool's bytes are cut into pages of layers_per_block layers that every
group's table shares (kv_cache_utils.get_kv_cache_config_from_groups)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pagesim.core import KVLayout
from pagesim.core.errors import CannotServe
from pagesim.models import load_model_config
from pagesim.sim.pool import size_pool, state_block_size
from pagesim.sim.replay_config import ReplayConfig

CONFIG = Path(__file__).parents[1] / "models" / "data" / "Qwen3-Next-80B-A3B-Instruct.json"
GiB = 2**30


def test_raised_block_size_by_hand():
    spec = load_model_config(CONFIG)
    # TP 1: attention page of one token in one layer = 2 (K, V) x 2 KV heads x 256 x 2 bytes = 2,048;
    # state page = (3 x 8,192 conv + 32 x 128 x 128 recurrent) x 2 bytes = 1,097,728;
    # 16 x ceil(1,097,728 / (16 x 2,048)) = 16 x ceil(33.5) = 16 x 34 = 544
    assert state_block_size(16, spec, 1) == 16 * -(-1_097_728 // (16 * 2_048)) == 544
    # TP 4: the 2 KV heads are replicated to 1 per GPU: 2 x 1 x 256 x 2 = 1,024 bytes; state
    # (3 x 8,192 / 4 + 32 / 4 x 128 x 128) x 2 = (6,144 + 131,072) x 2 = 274,432;
    # 16 x ceil(274,432 / 16,384) = 16 x ceil(16.75) = 16 x 17 = 272
    assert spec.linear_attn.state_bytes_per_layer(4) == 274_432
    assert state_block_size(16, spec, 4) == 16 * 17 == 272
    # TP 2: 1 KV head a GPU (1,024 bytes), state (3 x 4,096 + 16 x 16,384) x 2 = 548,864: 16 x 34 = 544
    assert state_block_size(16, spec, 2) == 544
    # a larger --block-size is the grain (vLLM: max(kernel block, user block size)): 32 x ceil(274,432 / 32,768) = 288
    assert state_block_size(32, spec, 4) == 32 * 9 == 288
    assert state_block_size(1024, spec, 4) == 1024  # already more than a state page: kept
    # a model without state layers keeps its block size
    assert state_block_size(16, load_model_config(Path(__file__).parents[1] / "models" / "data" / "gemma-3-12b-it.json"),
                            1) == 16


def test_pool_in_blocks_and_sequences_on_h100_tp4_by_hand():
    spec = load_model_config(CONFIG)
    # no chunked prefill: the step's budget (and vLLM's profiling pass) is the max length, 262,144 tokens
    cfg = ReplayConfig(model=str(CONFIG), gpu="h100-80gb", tp=4, max_num_batched_tokens=262_144)
    sized = size_pool(cfg, spec)
    assert sized.block_size == 272 and any("block size 272 (not 16)" in n for n in sized.notes)
    # memory per GPU: 0.95 x 80 GiB usable, less the weights, the profiling pass's activations and the reserve
    usable = int(0.95 * 80 * GiB)
    weights = spec.weight_bytes_per_gpu(4)
    assert weights == 39_837_195_648  # 79.67 B parameters x 2 bytes / 4
    # activations: residual stream 3 x 262,144 x 2,048 x 2 = 3,221,225,472, plus the fused MoE's
    # caches (the largest branch) 262,144 x 10 experts x (3 x 512 / 4 + 2,048) x 2 = 12,750,684,160
    activations = 3 * 262_144 * 2_048 * 2 + 262_144 * 10 * (3 * 512 // 4 + 2_048) * 2
    assert sized.capacity.activation_bytes_per_gpu == activations == 15_971_909_632
    pool = usable - weights - activations - int(1.75 * GiB)
    assert sized.capacity.pool_bytes_per_gpu == pool == 23_916_225_152
    # one page: 272 tokens x 1,024 bytes = 278,528 bytes (a state page, 274,432, padded to it);
    # a pool block holds one page of each of layers_per_block = 12 layers: 3,342,336 bytes
    layout = KVLayout.of(spec.kv_groups)
    assert layout.layers_per_block == 12 and layout.num_tables == 4
    block_bytes = 272 * 12 * 1_024
    assert block_bytes == 3_342_336
    assert sized.num_blocks == pool // block_bytes == 7_155
    assert sized.host_blocks == int(4 * GiB) // block_bytes == 1_285
    # sequences: ceil(L / 272) attention blocks + 3 state blocks (one per 12-layer state table)
    assert layout.sequences_that_fit(7_155, 2_048, 272) == 7_155 // (8 + 3) == 650
    assert layout.sequences_that_fit(7_155, 1, 272) == 7_155 // (1 + 3) == 1_788
    assert layout.sequences_that_fit(7_155, 262_144, 272) == 7_155 // (964 + 3) == 7


def test_a_given_pool_and_a_non_paged_policy():
    spec = load_model_config(CONFIG)
    sized = size_pool(ReplayConfig(model=str(CONFIG), gpu="h100-80gb", tp=4, max_num_batched_tokens=2_048,
                                   num_gpu_blocks=100), spec)
    assert sized.num_blocks == 100 and sized.block_size == 272
    with pytest.raises(CannotServe, match="linear-attention state"):
        size_pool(ReplayConfig(model=str(CONFIG), gpu="h100-80gb", tp=4, max_num_batched_tokens=2_048,
                               policy="orca-max"), spec)
