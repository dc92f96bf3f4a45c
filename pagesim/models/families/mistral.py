"""Mistral 7B: llama-shaped without biases; v0.1 attends to a sliding window of 4096 tokens in
every layer (`sliding_window`), later versions have `sliding_window: null` (full attention)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.spec import ModelSpec, WeightQuant


def every_layer_slides(f: ConfigFields) -> tuple[int | None, int]:
    """Mistral, Mixtral and Phi-3: a window, where the config sets one, applies to every layer."""
    return sliding_layers(f, f.int("num_hidden_layers"), f.int("max_position_embeddings"), lambda i: True)


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    window, sliding = every_layer_slides(f)
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding,
                        heads=attention_heads(f))
