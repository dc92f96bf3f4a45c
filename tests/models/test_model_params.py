"""Parameter counts against the published ones (model cards, cited per case) and against
transformers' own modules built from the same config (an independent count of every tensor)."""

import pytest

from pagesim.models import MODELS, get_model, model_from_config

BILLION = 1e9

# (catalog or shared config, published total, published active, source). Totals must agree
# within 0.5 %. The active figures are published to two significant digits and the vendors count
# them differently, so they are checked to the published precision (half a unit of the last
# digit, and within 2 %) under each vendor's convention, named beside it.
PUBLISHED_TOTALS = [
    ("mixtral-8x7b", 46.7, "mistralai/Mixtral-8x7B-v0.1 model card / Mixtral paper (Jiang et al. 2024): 46.7B total"),
    ("qwen3-30b-a3b", 30.5, "Qwen/Qwen3-30B-A3B model card: 30.5B in total"),
    ("qwen3-32b", 32.8, "Qwen/Qwen3-32B model card: 32.8B"),
    ("deepseek-v3", 671, "deepseek-ai/DeepSeek-V3 model card: 671B total (685B with the MTP module)"),
    ("deepseek-v2-lite", 15.7, "deepseek-ai/DeepSeek-V2-Lite model card: 15.7B total"),
    ("llama-3.1-8b", 8.03, "meta-llama/Llama-3.1-8B model card (HF page): 8.03B params"),
    ("gemma-2-9b", 9.24, "google/gemma-2-9b (HF page): 9.24B params"),
    ("mistral-7b", 7.24, "mistralai/Mistral-7B-v0.1 (HF page): 7.24B params"),
]


@pytest.mark.parametrize("name,published,source", PUBLISHED_TOTALS)
def test_total_parameters_match_the_published_count(name, published, source):
    assert MODELS[name].params_total / BILLION == pytest.approx(published, rel=0.005), source


@pytest.mark.parametrize("name,published,digits,embedding_counted,rounding,source", [
    # Mistral counts every parameter a token uses, the embedding table included (12.88 -> 12.9).
    ("mixtral-8x7b", 12.9, 1, True, "round", "mistralai/Mixtral-8x7B-v0.1 model card: 12.9B active"),
    # Qwen counts the same way and cuts after the first decimal: its card's 30.5 total, 29.9
    # non-embedding and 3.3 activated are the exact 30.53, 29.91 and 3.353
    ("qwen3-30b-a3b", 3.3, 1, True, "truncate", "Qwen/Qwen3-30B-A3B model card: 3.3B activated"),
    # DeepSeek leaves the embedding table out (the LM head, a matmul every token runs, stays in)
    ("deepseek-v3", 37, 0, False, "round", "DeepSeek-V3 technical report (arXiv 2412.19437), abstract: 37B activated"),
    ("deepseek-v2-lite", 2.4, 1, False, "truncate", "DeepSeek-V2 paper (arXiv 2405.04434), appendix B: 2.4B activated"),
])
def test_active_parameters_match_the_published_figure(name, published, digits, embedding_counted, rounding, source):
    m = MODELS[name]
    active = (m.params_active - (0 if embedding_counted else m.vocab_size * m.hidden_size)) / BILLION
    shown = round(active, digits) if rounding == "round" else int(active * 10**digits) / 10**digits
    assert shown == published, f"{active:.3f}B; {source}"
    assert active == pytest.approx(published, rel=0.025), source


def test_shared_configs_give_the_catalog_counts(shared_config):
    # the real runs' config.json files (../shared/data/real_vllm/model_configs) and the catalog agree
    for directory, name in [("Mixtral-8x7B-v0.1", "mixtral-8x7b"), ("Qwen3-32B", "qwen3-32b"),
                            ("Qwen3-30B-A3B-Instruct-2507", "qwen3-30b-a3b"), ("Llama-3.1-8B", "llama-3.1-8b"),
                            ("Llama-2-70b-hf", "llama-2-70b"), ("CodeLlama-34b-Instruct-hf", "codellama-34b")]:
        spec = get_model(str(shared_config(directory)))
        catalog = MODELS[name]
        assert (spec.params_total, spec.params_active, spec.kv_bytes_per_token) == \
            (catalog.params_total, catalog.params_active, catalog.kv_bytes_per_token), name


# ----------------------------------------------------------------- against transformers' modules

TINY = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=512)
TINY_CONFIGS = {
    "llama": dict(TINY, attention_bias=True, mlp_bias=True),
    "llama-tied": dict(TINY, tie_word_embeddings=True),
    "llama4_text": dict(TINY, head_dim=16, intermediate_size_mlp=80, num_local_experts=4, interleave_moe_layer_step=2),
    "mistral": dict(TINY, sliding_window=128),
    "mixtral": dict(TINY, num_local_experts=4, num_experts_per_tok=2),
    "qwen2": dict(TINY),
    "qwen2_moe": dict(TINY, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      shared_expert_intermediate_size=48, decoder_sparse_step=2, mlp_only_layers=[3]),
    "qwen3": dict(TINY, head_dim=32),
    "qwen3_next": dict(TINY, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                       shared_expert_intermediate_size=48, linear_num_key_heads=2, linear_num_value_heads=4,
                       linear_key_head_dim=8, linear_value_head_dim=12, mlp_only_layers=[1]),
    "qwen3_moe": dict(TINY, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                      decoder_sparse_step=1, mlp_only_layers=[0]),
    "deepseek_v2": dict(TINY, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=2, first_k_dense_replace=1, moe_layer_freq=1, q_lora_rank=None,
                        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    "deepseek_v3": dict(TINY, num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_shared_experts=1, first_k_dense_replace=2, n_group=2, topk_group=1, q_lora_rank=48,
                        kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16),
    "gemma2": dict(TINY, head_dim=32, sliding_window=128),
    "gemma3_text": dict(TINY, head_dim=32, sliding_window=128),
    "gpt_oss": dict(TINY, head_dim=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=128),
    "phi3": dict(TINY, sliding_window=127, pad_token_id=0),
    "glm4_moe": dict(TINY, head_dim=32, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                     n_shared_experts=1, first_k_dense_replace=1, attention_bias=True, use_qk_norm=True),
    "glm4_moe-noqknorm": dict(TINY, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                              n_shared_experts=2, first_k_dense_replace=0, attention_bias=False),
    "phimoe": dict(TINY, num_local_experts=4, num_experts_per_tok=2, attention_bias=True, lm_head_bias=True),
    "olmoe": dict(TINY, num_experts=8, num_experts_per_tok=2),
    "granitemoe": dict(TINY, num_local_experts=4, num_experts_per_tok=2, tie_word_embeddings=True),
    "olmo2": dict(TINY),
    "gemma": dict(TINY, head_dim=32),
    "granite": dict(TINY, tie_word_embeddings=True, attention_bias=True),
    # Mamba2 mixers (2 groups, 4 heads of 32 = 2 x 64) beside attention, routed experts + shared MLP; and dense
    # (transformers 5 builds a Mamba layer only for "linear_attention"; the family reads both spellings)
    "granitemoehybrid": dict(TINY, layer_types=["linear_attention", "full_attention", "linear_attention",
                                                "linear_attention"], mamba_n_heads=4,
                             mamba_d_head=32, mamba_d_state=16, mamba_n_groups=2, mamba_d_conv=4, num_local_experts=4,
                             num_experts_per_tok=2, shared_intermediate_size=48, tie_word_embeddings=True),
    "granitemoehybrid-dense": dict(TINY, layer_types=["full_attention"] + ["linear_attention"] * 3, mamba_n_heads=8,
                                   mamba_d_head="auto", mamba_d_state=16, mamba_n_groups=1, num_local_experts=0,
                                   shared_intermediate_size=80, attention_bias=True),
    # one block a layer: Mamba2 (2 groups, 4 heads of 32), attention, relu2 MLP (no gate); biases on attention and MLP
    "nemotron_h": dict(TINY, head_dim=16, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp",
                                                             "linear_attention"], mamba_num_heads=4,
                       mamba_head_dim=32, ssm_state_size=16, n_groups=2, conv_kernel=4, attention_bias=True,
                       mlp_bias=True),
    # Nemotron 3: 'E' layers beside '-' ones: 8 ungated relu2 experts (up and down), top 2 of 2 groups, one
    # shared expert of 48, the router's score-correction bias (a buffer in transformers, in the checkpoint)
    "nemotron_h-moe": dict(TINY, head_dim=16, layers_block_type=["linear_attention", "moe", "full_attention", "mlp",
                                                                 "moe", "linear_attention", "moe"],
                           mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2, n_routed_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
                           n_shared_experts=1, n_group=2, topk_group=1),
    # Nemotron 3 Super's latent MoE in small: fc1_latent_proj (64 -> 24) before the 8 routed experts, which read
    # and write 24 wide (up 8 x 32 x 24, down 8 x 24 x 32), fc2_latent_proj (24 -> 64) after; router and shared
    # expert on the hidden 64
    "nemotron_h-latent": dict(TINY, head_dim=16, layers_block_type=["linear_attention", "moe", "full_attention",
                                                                    "moe", "linear_attention", "moe"],
                              mamba_num_heads=4, mamba_head_dim=32, ssm_state_size=16, n_groups=2, n_routed_experts=8,
                              num_experts_per_tok=2, moe_intermediate_size=32, moe_shared_expert_intermediate_size=48,
                              n_shared_experts=1, moe_latent_size=24),
    # Mamba v1 mixers (Jamba): attention on layers 1 and 3, routed experts on 0 and 2, dt_rank "auto" (ceil(64 / 16));
    # and with one expert (every MLP dense), no conv bias, an explicit dt_rank, tied embeddings
    "jamba": dict(TINY, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=0,
                  num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2),
    "jamba-dense": dict(TINY, attn_layer_period=4, attn_layer_offset=3, num_experts=1, mamba_d_state=8,
                        mamba_d_conv=3, mamba_expand=3, mamba_conv_bias=False, mamba_dt_rank=6,
                        tie_word_embeddings=True),
    # attention and a Mamba2 mixer in every layer (2 groups, 4 heads of 24 = mamba_d_ssm 96, not expand x hidden);
    # with mamba_rms_norm the gated norm has its weight; mamba_d_ssm null: expand x hidden, d_head "auto"
    "falcon_h1": dict(TINY, head_dim=16, mamba_d_ssm=96, mamba_n_heads=4, mamba_d_head=24, mamba_n_groups=2,
                      mamba_d_state=16, mamba_d_conv=4, mamba_rms_norm=False, ssm_multipliers=[1.0, 2.0, 3.0, 4.0, 5.0]),
    "falcon_h1-rmsnorm": dict(TINY, mamba_d_ssm=None, mamba_expand=2, mamba_n_heads=8, mamba_d_head="auto",
                              mamba_n_groups=1, mamba_d_state=16, mamba_rms_norm=True, tie_word_embeddings=True),
    "smollm3": dict(TINY, pad_token_id=0),
    # lightning attention (qkv_proj, output_gate, out_proj, a norm of 4 heads x 24, not hidden 64) on layers 0, 2, 3;
    # softmax GQA on layer 1; a MoE of 4 experts top 2 on every layer (MiniMax-Text-01 / M1 in the HF format)
    "minimax": dict(TINY, head_dim=24, layer_types=["linear_attention", "full_attention", "linear_attention",
                                                    "linear_attention"], num_local_experts=4, num_experts_per_tok=2),
    "opt": dict(hidden_size=64, ffn_dim=96, num_hidden_layers=3, num_attention_heads=4, vocab_size=256,
                max_position_embeddings=512, word_embed_proj_dim=64),
}


def hf_model(model_type, fields):
    transformers = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    config = transformers.AutoConfig.for_model(model_type, **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return config, model


def routed_expert_numel(model, top_k_of):
    """Matmul weights of every routed-expert module, and the parameters a token does not run
    through: the (E - k) / E share of each layer's routed experts (shared experts are separate modules)."""
    total = idle = 0
    for name, module in model.named_modules():
        # (GraniteMoE: block_sparse_moe; Llama 4: feed_forward; Nemotron 3: mixer; DBRX: ffn)
        if name.endswith((".mlp.experts", ".block_sparse_moe.experts", ".feed_forward.experts",
                          ".mixer.experts", ".ffn.experts")):
            n = sum(p.numel() for p in module.parameters())
            experts, k = top_k_of
            total += sum(p.numel() for key, p in module.named_parameters() if not key.endswith("bias"))  # matmuls
            idle += n * (experts - k) // experts  # gpt-oss's expert biases idle with their experts
    return total, idle


@pytest.mark.parametrize("key", sorted(TINY_CONFIGS))
def test_counts_equal_transformers_parameters(key):
    model_type = key.split("-")[0]
    config, model = hf_model(model_type, dict(TINY_CONFIGS[key]))
    fields = config.to_dict()
    fields.pop("quantization_config", None)
    spec = model_from_config(fields, key)
    hf_total = sum(p.numel() for p in model.parameters())  # tied weights once
    if model_type in ("glm4_moe", "nemotron_h"):  # the router's score-correction bias: a buffer, in the checkpoint
        hf_total += sum(b.numel() for n, b in model.named_buffers() if n.endswith("e_score_correction_bias"))
    assert spec.params_total == hf_total
    if spec.moe is not None:
        experts, k = spec.moe.num_experts, spec.moe.experts_per_token
        routed, idle = routed_expert_numel(model, (experts, k))
        assert routed == spec.moe.num_moe_layers * experts * spec.expert_params  # the layers that are sparse
        assert spec.params_active == hf_total - idle
    else:
        assert spec.params_active == hf_total
