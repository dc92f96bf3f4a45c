"""Qwen2 / Qwen2.5: llama-shaped with q, k and v biases (no output bias). A sliding window applies
only with `use_sliding_window`, to the layers from `max_window_layers` on (the released configs
set it false, so their `sliding_window` is inert)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.spec import ModelSpec, WeightQuant


def qwen_sliding(f: ConfigFields) -> tuple[int | None, int]:
    on, first = f.bool("use_sliding_window", False), f.count("max_window_layers", 0)
    return sliding_layers(f, f.int("num_hidden_layers"), f.max_len(),
                          lambda i: on and i >= first)


def qkv_bias(heads: tuple[int, int, int, int]) -> int:
    h, n, kv, d = heads
    return n * d + 2 * kv * d


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    window, sliding = qwen_sliding(f)
    return llama_shaped(f, name, quant, extras=Extras(layer_bias=qkv_bias(heads),
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding, heads=heads)
