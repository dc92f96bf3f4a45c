"""GLM-4-0414 (THUDM / zai-org GLM-4-9B-0414, GLM-4-32B-0414 and their Z1 reasoning twins,
`glm4`): dense GQA with q, k and v biases (`attention_bias`; o_proj has none), a gated MLP (one
fused gate_up_proj: the same weights), and four RMSNorms a layer: the usual input and
post-attention norms plus one after self-attention and one after the MLP (sandwich norms).
Where a field is absent transformers' Glm4Config default applies (`head_dim` 128,
`attention_bias` true), as vLLM reads the config through it. `partial_rotary_factor` (rotary on
half of each head) changes no shape."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.qwen2 import qkv_bias
from pagesim.models.spec import ModelSpec, WeightQuant

GLM4_DEFAULTS = {"head_dim": 128, "attention_bias": True}


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    f = ConfigFields({**GLM4_DEFAULTS, **{k: v for k, v in f.config.items() if v is not None}}, f.where, f.model_type)
    heads = attention_heads(f)
    check_rope_scaling(f)
    extras = Extras(norms_per_layer=4, layer_bias=qkv_bias(heads) if f.bool("attention_bias", True) else 0,
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), heads=heads)
