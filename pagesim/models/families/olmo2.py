"""OLMo 2 (allenai/OLMo-2-1124-7B, -13B, `olmo2`): llama-shaped, but the two RMSNorms of a layer
come after attention and after the MLP (post-norm; no input norm, the same count), and q and k
are RMSNormed over the whole projection (heads x head_dim and KV heads x head_dim weights), not
per head."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, heads, kv_heads, head_dim = heads_ = attention_heads(f)
    check_rope_scaling(f)
    bias = (heads * head_dim + 2 * kv_heads * head_dim + h) if f.bool("attention_bias", False) else 0
    extras = Extras(layer_bias=bias, layer_other=(heads + kv_heads) * head_dim,
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), qk_norm=True, heads=heads_)
