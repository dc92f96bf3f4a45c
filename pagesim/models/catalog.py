"""The model catalog: names a --model flag accepts.

The paper-era entries are written out (their numbers are the ones the paper figures were made
with; tests/sim/test_model_config.py checks each against its config.json). The modern entries are
the published config.json fields of each model (the file cited beside it, on huggingface.co),
built through the same family code as a user's config.json.
"""

from __future__ import annotations

from pagesim.models.config import model_from_config
from pagesim.models.spec import ModelSpec


def _opt(name, layers, hidden, heads, ffn, num_params) -> ModelSpec:
    # OPT: MHA (kv heads = heads), head_dim = hidden / heads, vocab 50272, 2048 positions.
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=heads, head_dim=hidden // heads, ffn_size=ffn,
                     vocab_size=50272, num_params=num_params, max_model_len=2048,
                     architecture="opt")


PAPER_ERA: dict[str, ModelSpec] = {
    # facebook/opt-125m config.json: 12 layers, hidden 768, 12 heads, ffn_dim 3072.
    "opt-125m": _opt("opt-125m", 12, 768, 12, 3072, 125_239_296),
    # facebook/opt-13b config.json: 40 layers, hidden 5120, 40 heads, ffn_dim 20480.
    "opt-13b": _opt("opt-13b", 40, 5120, 40, 20480, 12_853_473_280),
    # facebook/opt-66b config.json: 64 layers, hidden 9216, 72 heads, ffn_dim 36864.
    "opt-66b": _opt("opt-66b", 64, 9216, 72, 36864, 65_719_701_504),
    # OPT paper (Zhang et al. 2022) Table 1: 96 layers, 96 heads, d_model 12288; ffn = 4 * d.
    "opt-175b": _opt("opt-175b", 96, 12288, 96, 49152, 174_604_468_224),
    # huggyllama/llama-13b config.json: 40 layers, hidden 5120, 40 heads, intermediate 13824,
    # vocab 32000, max_position_embeddings 2048, untied LM head.
    "llama-13b": ModelSpec("llama-13b", 40, 5120, 40, 40, 128, 13824, 32000,
                           13_015_864_320, 2048, architecture="llama"),
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads (MHA),
    # intermediate 11008, vocab 32000, max_position_embeddings 4096.
    "llama-2-7b": ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000,
                            6_738_415_616, 4096, architecture="llama"),
    # Qwen/Qwen2.5-72B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate
    # 29568, vocab 152064, max_position_embeddings 32768, QKV bias, untied LM head
    # (model card: 72.7B parameters). Qwen2 is llama-shaped (gated MLP, GQA, RMSNorm).
    "qwen2.5-72b": ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064,
                             72_706_203_648, 32768, architecture="llama"),
    # HuggingFaceTB/SmolLM2-135M config.json: 30 layers, hidden 576, 9 heads, 3 KV heads,
    # intermediate 1536, vocab 49152, max_position_embeddings 8192, tied embeddings.
    "smollm2-135m": ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152,
                              134_515_008, 8192, architecture="llama"),
}

_LLAMA3_ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192, "rope_type": "llama3"}

# name -> the fields of the published config.json that shape the model.
MODERN_CONFIGS: dict[str, dict] = {
    # meta-llama/Llama-3.1-8B config.json (model card: 8.03B)
    "llama-3.1-8b": {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
                     "max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE, "tie_word_embeddings": False},
    # meta-llama/Llama-3.1-70B config.json (model card: 70.6B)
    "llama-3.1-70b": {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 128256,
                      "max_position_embeddings": 131072, "rope_scaling": _LLAMA3_ROPE, "tie_word_embeddings": False},
    # meta-llama/Llama-2-70b-hf config.json
    "llama-2-70b": {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
                    "max_position_embeddings": 4096, "tie_word_embeddings": False},
    # codellama/CodeLlama-34b-Instruct-hf config.json
    "codellama-34b": {"model_type": "llama", "hidden_size": 8192, "intermediate_size": 22016, "num_hidden_layers": 48,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "vocab_size": 32000,
                      "max_position_embeddings": 16384, "tie_word_embeddings": False},
    # mistralai/Mistral-7B-v0.1 config.json: sliding window of 4096 in every layer
    "mistral-7b": {"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                   "max_position_embeddings": 32768, "sliding_window": 4096, "tie_word_embeddings": False},
    # mistralai/Mixtral-8x7B-v0.1 config.json (model card: 46.7B total, 12.9B active)
    "mixtral-8x7b": {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                     "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8,
                     "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 32768,
                     "sliding_window": None, "tie_word_embeddings": False},
    # Qwen/Qwen3-32B config.json (model card: 32.8B)
    "qwen3-32b": {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
                  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
                  "max_position_embeddings": 40960, "use_sliding_window": False, "tie_word_embeddings": False},
    # Qwen/Qwen3-30B-A3B config.json (model card: 30.5B total, 3.3B activated)
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
                      "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
                      "max_position_embeddings": 40960, "tie_word_embeddings": False},
    # deepseek-ai/DeepSeek-V3 config.json (model card: 671B total, 37B activated; FP8 weights)
    "deepseek-v3": {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
                    "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
                    "topk_method": "noaux_tc", "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
                    "max_position_embeddings": 163840, "num_nextn_predict_layers": 1, "tie_word_embeddings": False,
                    "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                                            "weight_block_size": [128, 128]}},
    # deepseek-ai/DeepSeek-V2-Lite config.json (model card: 15.7B total, 2.4B activated)
    "deepseek-v2-lite": {"model_type": "deepseek_v2", "hidden_size": 2048, "intermediate_size": 10944,
                         "moe_intermediate_size": 1408, "num_hidden_layers": 27, "num_attention_heads": 16,
                         "num_key_value_heads": 16, "n_shared_experts": 2, "n_routed_experts": 64,
                         "num_experts_per_tok": 6, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                         "topk_method": "greedy", "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                         "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 102400,
                         "max_position_embeddings": 163840, "tie_word_embeddings": False},
    # google/gemma-2-9b config.json (model card: 9.24B): every other layer a 4096-token window
    "gemma-2-9b": {"model_type": "gemma2", "hidden_size": 3584, "intermediate_size": 14336, "num_hidden_layers": 42,
                   "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "vocab_size": 256000,
                   "max_position_embeddings": 8192, "sliding_window": 4096},
    # google/gemma-3-27b-it config.json, its text_config (5 of 6 layers a 1024-token window) and
    # vision_config (the SigLIP tower of the 4B-27B models, as gemma-3-12b-it's)
    "gemma-3-27b": {"model_type": "gemma3", "text_config": {
        "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504, "num_hidden_layers": 62,
        "num_attention_heads": 32, "num_key_value_heads": 16, "head_dim": 128, "sliding_window": 1024,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 1152, "intermediate_size": 4304,
                          "num_hidden_layers": 27, "num_attention_heads": 16, "patch_size": 14, "image_size": 896,
                          "vision_use_head": False}},
    # microsoft/Phi-3-mini-4k-instruct config.json (model card: 3.8B); a 2047-token window
    "phi-3-mini": {"model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 32,
                   "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 32064,
                   "max_position_embeddings": 4096, "sliding_window": 2047, "tie_word_embeddings": False},
}

MODELS: dict[str, ModelSpec] = {
    **PAPER_ERA,
    **{name: model_from_config(config, name, f"catalog entry {name!r}") for name, config in MODERN_CONFIGS.items()},
}

MODEL_ALIASES: dict[str, str] = {
    "llama-2-7b-hf": "llama-2-7b",
    "llama2-7b": "llama-2-7b",
    "qwen2.5-72b-instruct": "qwen2.5-72b",
    "meta-llama-3.1-8b": "llama-3.1-8b",
    "llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-3.1-70b": "llama-3.1-70b",
    "llama-3.1-70b-instruct": "llama-3.1-70b",
    "llama-2-70b-hf": "llama-2-70b",
    "codellama-34b-instruct-hf": "codellama-34b",
    "codellama-34b-hf": "codellama-34b",
    "mistral-7b-v0.1": "mistral-7b",
    "mixtral-8x7b-v0.1": "mixtral-8x7b",
    "mixtral-8x7b-instruct-v0.1": "mixtral-8x7b",
    "qwen3-30b-a3b-instruct-2507": "qwen3-30b-a3b",
    "gemma-3-27b-it": "gemma-3-27b",
    "phi-3-mini-4k-instruct": "phi-3-mini",
}
