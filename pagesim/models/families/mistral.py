"""Mistral 7B: llama-shaped without biases; v0.1 attends to a sliding window of 4096 tokens in
every layer (`sliding_window`), later versions have `sliding_window: null` (full attention).

Mistral Small 3.1 / 3.2 (`mistral3`, Mistral3ForConditionalGeneration): a Mistral language model
under `text_config` (read by pagesim.models.config) and a Pixtral vision tower with its projector
(`vision_config`, 0.44 B of Mistral Small 3.1's 24.0 B), counted as weight memory by
pagesim.models.vision; image tokens are outside what pagesim models."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.spec import ModelSpec, WeightQuant


def every_layer_slides(f: ConfigFields) -> tuple[int | None, int]:
    """Mistral, Mixtral and Phi-3: a window, where the config sets one, applies to every layer."""
    return sliding_layers(f, f.int("num_hidden_layers"), f.max_len(), lambda i: True)


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    window, sliding = every_layer_slides(f)
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding,
                        heads=attention_heads(f))


def build_mistral3(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    text_type = f.get("model_type", "mistral")
    if text_type != "mistral":
        raise f.error("model_type", f"of text_config is {text_type!r}; a mistral3 config with a 'mistral' language model is modelled")
    return build(f, name, quant)
