"""KV bytes per token by hand for each attention kind, MLA's latent not split over TP, FP8 KV,
and the KV groups the core receives."""

import pytest

from pagesim.core.kv_groups import KVGroupSpec
from pagesim.models import MODELS, get_model, with_kv_cache_dtype
from pagesim.sim.specs import GiB, kv_cache_capacity, kv_bytes_per_token_per_gpu


def test_deepseek_v3_latent_cache_by_hand():
    # issue 24: (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes (bf16)
    m = MODELS["deepseek-v3"]
    assert m.kv_bytes_per_token == (512 + 64) * 61 * 2 == 70_272
    assert m.kv_groups == (KVGroupSpec("mla", 61),)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_mla_latent_is_replicated_on_every_tp_rank(tp):
    # vLLM keeps the whole latent on each rank (one vector shared by all heads), so a GPU holds
    # all 70,272 bytes of a token whatever the TP degree; the pool in tokens is pool / 70,272
    m = MODELS["deepseek-v3"]
    assert kv_bytes_per_token_per_gpu(m, tp) == 70_272
    cap = kv_cache_capacity("deepseek-v2-lite", "h100-80gb", tp)
    assert cap.token_slots == cap.pool_bytes_per_gpu // (576 * 27 * 2)
    assert cap.block_bytes_per_gpu(16) == 16 * 576 * 27 * 2


def test_full_attention_by_hand_and_split_over_tp():
    m = MODELS["llama-3.1-8b"]  # 32 layers, 8 KV heads of 128, bf16: K and V
    assert m.kv_bytes_per_token == 2 * 8 * 128 * 2 * 32 == 131_072
    assert kv_bytes_per_token_per_gpu(m, 2) == 131_072 // 2
    assert kv_bytes_per_token_per_gpu(m, 16) == 131_072 // 8  # past one KV head per GPU, heads replicate


def test_interleaved_sliding_and_global_layers_by_hand():
    g2 = MODELS["gemma-2-9b"]  # 42 layers, even ones slide over 4096 tokens; 8 KV heads of 256
    per_layer = 2 * 8 * 256 * 2
    assert g2.kv_groups == (KVGroupSpec("full", 21), KVGroupSpec("sliding", 21, 4096))
    assert g2.kv_bytes_per_token == 42 * per_layer
    assert g2.kv_bytes_per_token_full_layers == 21 * per_layer
    g3 = MODELS["gemma-3-27b"]  # 62 layers, layer i global when (i + 1) % 6 == 0: 10 of them
    assert g3.kv_groups == (KVGroupSpec("full", 10), KVGroupSpec("sliding", 52, 1024))
    assert g3.kv_bytes_per_token == 62 * 2 * 16 * 128 * 2
    mistral = MODELS["mistral-7b"]
    assert mistral.kv_groups == (KVGroupSpec("sliding", 32, 4096),)
    assert mistral.kv_bytes_per_token_full_layers == 0


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "opt-13b"])
def test_fp8_kv_cache_halves_kv_bytes(name):
    m = MODELS[name]
    fp8 = with_kv_cache_dtype(m, "fp8")
    assert fp8.kv_bytes_per_token * 2 == m.kv_bytes_per_token
    assert fp8.weight_bytes == m.weight_bytes and fp8.params_total == m.params_total
    assert with_kv_cache_dtype(m, "auto") is m


def test_fp8_kv_cache_doubles_the_pool_in_tokens():
    base = kv_cache_capacity("llama-3.1-8b", "h100-80gb")
    fp8 = kv_cache_capacity(with_kv_cache_dtype(get_model("llama-3.1-8b"), "fp8"), "h100-80gb")
    assert fp8.pool_bytes_per_gpu == base.pool_bytes_per_gpu
    assert fp8.token_slots == base.pool_bytes_per_gpu // (131_072 // 2)


def test_unknown_kv_cache_dtype_is_one_line():
    with pytest.raises(ValueError, match="kv-cache-dtype"):
        with_kv_cache_dtype(MODELS["opt-13b"], "int3")


def test_expert_parallelism_splits_only_the_routed_experts():
    m = MODELS["qwen3-30b-a3b"]
    experts = 48 * 128 * 3 * 2048 * 768 * 2  # every layer's 128 experts of 3 matrices, bf16
    assert m.routed_expert_weight_bytes == experts
    assert m.weight_bytes_per_gpu(1, 2) == m.weight_bytes - experts + experts // 2
    one, two = kv_cache_capacity(m, "rtx-pro-6000-96gb"), kv_cache_capacity(m, "rtx-pro-6000-96gb", ep=2)
    assert two.pool_bytes_per_gpu - one.pool_bytes_per_gpu == experts // 2
    assert 96 * GiB > two.weight_bytes_per_gpu


@pytest.mark.parametrize("run,model", [("20260218-135247-mixtral-8x7b-v0-1-tp2-reasoning", "mixtral-8x7b"),
                                       ("20260218-150304-codellama-34b-tp2-general", "codellama-34b")])
def test_pool_is_near_the_blocks_real_vllm_allocated(run, model):
    # vLLM 0.15.1 on 2 x H100-80GB at gpu_memory_utilization 0.9 logged its KV blocks (the BLIS
    # team's runs, ../shared/data/real_vllm/blis-h100-vllm0.15): the MoE's weights per GPU and
    # KV bytes per token must land the pool near it
    import gzip
    import json
    import os
    from pathlib import Path

    data = Path(os.environ.get("PAGESIM_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "data"))
    path = data / "real_vllm" / "blis-h100-vllm0.15" / "replay_data" / f"{run}.json.gz"
    if not path.exists():
        pytest.skip(f"needs {path} (set PAGESIM_DATA_DIR)")
    config = json.loads(gzip.open(path).read())["config"]
    cap = kv_cache_capacity(model, "h100-80gb", config["tensor_parallelism"], gpu_memory_utilization=0.9,
                            max_num_batched_tokens=config["max_num_batched_tokens"], max_num_seqs=config["max_num_seqs"])
    assert cap.num_blocks(config["block_size"]) == pytest.approx(config["kv_blocks_total_gpu"], rel=0.03)


def test_requests_at_once_as_vllm_counts_them():
    """`model inspect --gpu`'s max_concurrency: sequences of max_model_len tokens the pool holds.
    A plain model: its blocks of 16 over ceil(L / 16) each. Gemma 2: 21 global layers hold every
    block, 21 sliding ones (window 4,096) at most those that reach into the window."""
    from pagesim.cli.model import max_concurrency

    llama = get_model("llama-3.1-8b")
    cap = kv_cache_capacity(llama, "h100-80gb")
    got = max_concurrency(llama, cap, 1)
    assert got["block_size"] == 16 and got["num_blocks"] == cap.num_blocks(16)
    assert got["max_concurrency"] == cap.num_blocks(16) // (131072 // 16)

    gemma = get_model("gemma-2-9b")
    cap = kv_cache_capacity(gemma, "h100-80gb")
    got = max_concurrency(gemma, cap, 1)
    length = gemma.max_model_len  # 8,192
    # one full table and one sliding table of 21 layers each; the sliding table keeps the blocks of
    # the last 4,096 tokens (and the partly outside one): 8,192 / 16 - (8,192 - 4,096 + 1) // 16
    per_sequence = length // 16 + (length // 16 - (length - 4096 + 1) // 16)
    assert got["max_concurrency"] == got["num_blocks"] // per_sequence
