"""Mixtral 8x7B / 8x22B: Mistral attention, every layer's MLP a top-k of `num_local_experts`
experts of `intermediate_size` (no shared experts)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.mistral import every_layer_slides
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    experts, top_k = f.int("num_local_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'num_local_experts' {experts}")
    ffn = f.int("intermediate_size")
    window, sliding = every_layer_slides(f)
    moe = MoESpec(experts, top_k, ffn, f.int("num_hidden_layers"))
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=ffn, moe=moe, window=window, num_sliding=sliding, heads=attention_heads(f))
