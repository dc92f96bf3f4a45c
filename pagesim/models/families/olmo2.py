"""OLMo 2 (allenai/OLMo-2-1124-7B, -13B, `olmo2`): llama-shaped, but the two RMSNorms of a layer
come after attention and after the MLP (post-norm; no input norm, the same count), and q and k
are RMSNormed over the whole projection (heads x head_dim and KV heads x head_dim weights), not
per head."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, WeightQuant


def post_norm_extras(f: ConfigFields, heads: tuple[int, int, int, int]) -> Extras:
    """OLMo 2 and 3: q/k/v/o biases where `attention_bias`, q and k norms over the whole projections."""
    h, n, kv, d = heads
    bias = (n * d + 2 * kv * d + h) if f.bool("attention_bias", False) else 0
    return Extras(layer_bias=bias, layer_other=(n + kv) * d, tied_embeddings=f.bool("tie_word_embeddings", False))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    check_rope_scaling(f)
    return llama_shaped(f, name, quant, extras=post_norm_extras(f, heads), ffn_size=f.int("intermediate_size"),
                        qk_norm=True, heads=heads)
