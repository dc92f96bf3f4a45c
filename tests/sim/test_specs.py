"""Catalog and KV-pool sizing, checked against the paper's Table 1 (the independent reference)."""

import pytest

from pagesim.sim.specs import (
    GPUS, MODELS, GiB, GB, KVCapacity, ModelSpec, RUNTIME_RESERVED_BYTES, get_gpu, get_model,
    kv_bytes_per_token_per_gpu, kv_cache_capacity, profile_activation_bytes, swap_space_blocks,
)

# Paper Table 1: (model, gpu, tp, params GB, KV GB, max KV slots). The paper's KV "GB" are GiB:
# 15.7K slots * 800 KiB = 12.0 GiB, 9.7K * 2.25 MiB = 21.3 GiB, 60.1K * 4.5 MiB = 264 GiB.
TABLE1 = [
    ("opt-13b", "a100-40gb", 1, 26, 12, 15_700),
    ("opt-66b", "a100-40gb", 4, 132, 21, 9_700),   # "4 x A100, 160 GB": the 40 GB part
    ("opt-175b", "a100-80gb", 8, 346, 264, 60_100),
]


@pytest.mark.parametrize("name,gpu,tp,params_gb,kv_gib,slots", TABLE1)
def test_table1_within_5_percent(name, gpu, tp, params_gb, kv_gib, slots):
    cap = kv_cache_capacity(name, gpu, tp)  # all defaults: the same constants for every row
    print(f"\n{name} on {tp} x {gpu}: {cap.token_slots} slots (paper {slots}), "
          f"KV {cap.pool_bytes_total / GiB:.1f} GiB (paper {kv_gib}), "
          f"weights {cap.weight_bytes_per_gpu * tp / GB:.0f} GB (paper {params_gb}), "
          f"activations {cap.activation_bytes_per_gpu / GiB:.2f} GiB/GPU")
    assert cap.token_slots == pytest.approx(slots, rel=0.05)
    assert cap.pool_bytes_total / GiB == pytest.approx(kv_gib, rel=0.05)
    assert get_model(name).weight_bytes / GB == pytest.approx(params_gb, rel=0.02)


def test_kv_bytes_per_token_exact():
    assert get_model("opt-13b").kv_bytes_per_token == 819_200       # paper: 800 KB
    assert get_model("qwen2.5-72b").kv_bytes_per_token == 327_680
    # Paper: "a 2048-token request up to 1.6 GB" (1.68e9 B = 1.56 GiB).
    assert 2048 * get_model("opt-13b").kv_bytes_per_token / 1e9 == pytest.approx(1.6, rel=0.05)


def _count_params(m: ModelSpec, tied: bool, qkv_bias: bool = False) -> int:
    """Independent parameter count from the config fields (norm weights and biases included)."""
    h, f = m.hidden_size, m.ffn_size
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    if m.architecture == "opt":
        layer = (h * (q + 2 * kv) + (q + 2 * kv)) + (q * h + h) + (h * f + f) + (f * h + h) + 4 * h
        return m.num_layers * layer + m.vocab_size * h + (m.max_model_len + 2) * h + 2 * h
    layer = h * (q + 2 * kv) + q * h + 3 * h * f + 2 * h + ((q + 2 * kv) if qkv_bias else 0)
    return m.num_layers * layer + m.vocab_size * h * (1 if tied else 2) + h


@pytest.mark.parametrize("name,tied,bias,published", [
    ("opt-125m", True, False, 125e6),
    ("opt-13b", True, False, 13e9),
    ("opt-66b", True, False, 66e9),
    ("opt-175b", True, False, 175e9),
    ("llama-13b", False, False, 13.0e9),
    ("llama-2-7b", False, False, 6.74e9),
    ("qwen2.5-72b", False, True, 72.7e9),     # model card
    ("smollm2-135m", True, False, 135e6),
])
def test_num_params(name, tied, bias, published):
    m = get_model(name)
    assert m.num_params == _count_params(m, tied, bias)
    assert m.num_params == pytest.approx(published, rel=0.02)


def test_lookup_aliases_and_errors():
    assert get_model("facebook/opt-13b") is MODELS["opt-13b"]
    assert get_model("Qwen/Qwen2.5-72B") is MODELS["qwen2.5-72b"]
    assert get_model("meta-llama/Llama-2-7b-hf") is MODELS["llama-2-7b"]
    assert get_gpu("H200") is GPUS["h200-141gb"]
    assert get_gpu("a100_40gb") is GPUS["a100-40gb"]
    assert get_model(MODELS["opt-13b"]) is MODELS["opt-13b"]
    with pytest.raises(KeyError, match="opt-13b"):
        get_model("gpt-5")
    with pytest.raises(KeyError, match="h100-80gb"):
        get_gpu("tpu-v5")


def test_catalog_required_entries():
    for m in ("opt-13b", "opt-66b", "opt-175b", "llama-13b", "llama-2-7b", "qwen2.5-72b"):
        assert m in MODELS
    for g in ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb"):
        assert g in GPUS
    assert get_model("llama-13b").mlp_matrices == 3 and get_model("opt-13b").mlp_matrices == 2


def test_model_validation():
    with pytest.raises(ValueError):
        ModelSpec("bad", 2, 8, 3, 2, 4, 16, 10, 100, 16)      # 3 heads over 2 KV heads
    with pytest.raises(ValueError):
        ModelSpec("bad", 2, 8, 2, 2, 4, 16, 10, 100, 16, architecture="gpt")


def test_blocks_and_swap():
    cap = kv_cache_capacity("opt-13b", "a100-40gb")
    assert cap.num_blocks(16) == cap.pool_bytes_per_gpu // (16 * 819_200)
    assert cap.num_blocks(16) * 16 <= cap.token_slots < (cap.num_blocks(16) + 1) * 16
    # vLLM default: 4 GiB of CPU swap per GPU; an OPT-13B block of 16 tokens is 12.5 MiB.
    assert swap_space_blocks(4, "opt-13b", tp=1, block_size=16) == 327
    assert cap.num_swap_blocks(16, 4) == 327
    # TP splits KV heads, so each GPU's block is smaller and more fit in its swap space.
    assert swap_space_blocks(4, "opt-66b", tp=4, block_size=16) == (4 * GiB) // (16 * 589_824)


def test_tp_head_splitting():
    qwen = get_model("qwen2.5-72b")
    assert kv_bytes_per_token_per_gpu(qwen, 8) == 327_680 // 8
    # 16 GPUs, 8 KV heads: heads are replicated, each GPU still holds one head's K/V.
    assert kv_bytes_per_token_per_gpu(qwen, 16) == 327_680 // 8
    with pytest.raises(ValueError):
        kv_bytes_per_token_per_gpu(qwen, 3)


def test_capacity_errors_and_monotonicity():
    with pytest.raises(ValueError, match="no KV pool"):
        kv_cache_capacity("opt-175b", "a100-40gb", 1)
    a = kv_cache_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=0.90)
    b = kv_cache_capacity("opt-13b", "a100-40gb", gpu_memory_utilization=0.95)
    assert a.token_slots < b.token_slots
    big_batch = kv_cache_capacity("opt-13b", "a100-40gb", max_num_batched_tokens=8192)
    assert big_batch.token_slots < b.token_slots
    assert kv_cache_capacity("opt-13b", "a100-80gb").token_slots > b.token_slots
    assert isinstance(b, KVCapacity) and b.pool_bytes_total == b.pool_bytes_per_gpu


def test_activation_estimate_is_small_next_to_the_reserve():
    # The activation term is derived, not fitted; it should be a few hundred MiB per GPU for the
    # Table 1 setups, while the fitted runtime reserve is the larger constant.
    for name, _, tp, *_ in TABLE1:
        act = profile_activation_bytes(get_model(name), tp)
        assert 0.1 * GiB < act < 0.5 * GiB
    assert RUNTIME_RESERVED_BYTES < 2.5 * GiB


@pytest.mark.parametrize("reserve_gib", [1.6, 1.75, 2.0])
def test_table1_not_a_knife_edge(reserve_gib):
    # The fitted reserve has slack: a band of values keeps all three rows within 5%.
    for name, gpu, tp, _, _, slots in TABLE1:
        cap = kv_cache_capacity(name, gpu, tp, reserved_bytes=int(reserve_gib * GiB))
        assert cap.token_slots == pytest.approx(slots, rel=0.05)
