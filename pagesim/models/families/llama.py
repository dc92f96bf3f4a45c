"""Llama 1/2/3.x (meta-llama/*, CodeLlama, SmolLM2) and IBM Granite 3.x dense (`granite`: its
embedding, attention, residual and logits multipliers scale activations, not shapes): GQA, gated MLP,
optional biases; Llama 3.x `rope_scaling`
changes positions, not shapes; the small Llama 3.2s tie their embeddings."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.spec import ModelSpec, WeightQuant

ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3", "su", "mrope")


def check_rope_scaling(f: ConfigFields) -> None:
    """rope_scaling only moves positions; it must still be one vLLM knows."""
    scaling = f.get("rope_scaling")
    if scaling is None:
        return
    kind = scaling.get("rope_type", scaling.get("type")) if isinstance(scaling, dict) else None
    if kind not in ROPE_TYPES:
        raise f.error("rope_scaling", f"has rope type {kind!r}; known: {', '.join(ROPE_TYPES)}")


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, heads, kv_heads, head_dim = attention_heads(f)
    ffn = f.int("intermediate_size")
    check_rope_scaling(f)
    # attention_bias: q, k, v and o projections; mlp_bias: gate, up and down
    bias = (heads * head_dim + 2 * kv_heads * head_dim + h) if f.bool("attention_bias", False) else 0
    bias += (2 * ffn + h) if f.bool("mlp_bias", False) else 0
    return llama_shaped(f, name, quant, extras=Extras(layer_bias=bias, tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=ffn, heads=(h, heads, kv_heads, head_dim))
