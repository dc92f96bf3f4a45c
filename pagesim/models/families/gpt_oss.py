"""gpt-oss (openai/gpt-oss-20b, gpt-oss-120b): a MoE of routed experts only, GQA attention with
biases and attention sinks, alternating sliding-window and full-attention layers, MXFP4 experts.

Attention: `num_attention_heads` query heads and `num_key_value_heads` KV heads of `head_dim`
(64 x 64 = 4096 wide, more than hidden 2880), with biases on q, k, v and o (`attention_bias`).
Each layer also has a learned sink per query head (`self_attn.sinks`, one scalar a head, an extra
logit in the softmax's denominator): counted as parameters (64 a layer), negligible in compute and
memory, so the cost model does not price it. `layer_types` says which layers slide (the released
configs alternate, sliding first) over a `sliding_window` of 128 tokens.

MLP: every layer a MoE of `num_local_experts` experts of `intermediate_size`, top
`num_experts_per_tok` (older configs: `experts_per_token`); the router (hidden -> experts) has a
bias, and every expert has biases on its fused gate_up (2 x intermediate) and down (hidden)
projections (counted per expert: all in the total, top-k in the active count). The clamped SwiGLU
(`swiglu_limit`) costs what SiLU-and-mul does.

Quantization: the released checkpoints store the experts' weights as MXFP4 (pagesim.models.quant:
4.25 bits a weight); everything else is bf16 (`modules_to_not_convert`). Embedding and LM head
are untied.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    check_rope_scaling(f)
    h, heads, kv_heads, head_dim = attention_heads(f)
    layers = f.int("num_hidden_layers")
    experts = f.int("num_local_experts")
    key = "num_experts_per_tok" if f.has("num_experts_per_tok") else "experts_per_token"
    top_k = f.int(key)
    if top_k > experts:
        raise f.error(key, f"{top_k} is more than 'num_local_experts' {experts}")
    ffn = f.int("intermediate_size")
    # no layer_types (a hand-written config): transformers' GptOssConfig default, even layers slide
    window, sliding = sliding_layers(f, layers, f.max_len(), lambda i: i % 2 == 0,
                                     window_optional=False)
    bias = (heads * head_dim + 2 * kv_heads * head_dim + h) if f.bool("attention_bias", True) else 0
    extras = Extras(layer_bias=bias, layer_other=heads,  # the sinks: one scalar per query head
                    moe_layer_other=experts,             # the router's bias
                    expert_bias=2 * ffn + h,             # gate_up_proj_bias, down_proj_bias
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=ffn, moe=MoESpec(experts, top_k, ffn, layers),
                        window=window, num_sliding=sliding, heads=(h, heads, kv_heads, head_dim))
