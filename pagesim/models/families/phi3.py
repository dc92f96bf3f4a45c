"""Phi-3 (mini, medium): llama-shaped without biases (fused qkv_proj and gate_up_proj hold the
same weights as separate ones); the config's `sliding_window` applies to every layer."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.mistral import every_layer_slides
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    check_rope_scaling(f)
    window, sliding = every_layer_slides(f)
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding,
                        heads=attention_heads(f))
