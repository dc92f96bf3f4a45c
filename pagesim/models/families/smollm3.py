"""SmolLM3 (HuggingFaceTB/SmolLM3-3B, `smollm3`): Llama's shape (GQA, gated MLP, tied embeddings).
Its NoPE layers (`no_rope_layers`: every fourth layer without rotary) change positions, not
shapes. Sliding-window layers only where `use_sliding_window` (or `layer_types`) says so."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, heads, kv_heads, head_dim = heads_ = attention_heads(f)
    check_rope_scaling(f)
    slides = f.bool("use_sliding_window", False)
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.max_len(),
                                     lambda i: slides)
    bias = (heads * head_dim + 2 * kv_heads * head_dim + h) if f.bool("attention_bias", False) else 0
    bias += (2 * f.int("intermediate_size") + h) if f.bool("mlp_bias", False) else 0
    return llama_shaped(f, name, quant, extras=Extras(layer_bias=bias, tied_embeddings=f.bool("tie_word_embeddings", True)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding, heads=heads_)
