"""Phi-3.5-MoE (microsoft/Phi-3.5-MoE-instruct, `phimoe`): Mixtral's layout (every layer a top-k of
`num_local_experts` experts of `intermediate_size`) with biases on q, k, v and o
(`attention_bias`), LayerNorms (weight and bias) instead of RMSNorms, and an LM head bias
(`lm_head_bias`). Its `sliding_window` (131,072) equals its positions: full attention."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.mistral import every_layer_slides
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, heads, kv_heads, head_dim = attention_heads(f)
    experts, top_k = f.int("num_local_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'num_local_experts' {experts}")
    check_rope_scaling(f)
    ffn = f.int("intermediate_size")
    window, sliding = every_layer_slides(f)
    moe = MoESpec(experts, top_k, ffn, f.int("num_hidden_layers"))
    bias = (heads * head_dim + 2 * kv_heads * head_dim + h) if f.bool("attention_bias", False) else 0
    # two LayerNorms a layer, each a weight and a bias; the final LayerNorm's bias and the LM head's
    extras = Extras(norms_per_layer=4, layer_bias=bias, tied_embeddings=f.bool("tie_word_embeddings", False),
                    model_other=h + (f.int("vocab_size") if f.bool("lm_head_bias", False) else 0))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=ffn, moe=moe, window=window, num_sliding=sliding,
                        heads=(h, heads, kv_heads, head_dim))
