"""Qwen3 dense: Qwen2's shape without the qkv biases (`attention_bias`, default false, adds q, k,
v and o biases) and with a per-head RMSNorm of q and of k (head_dim weights each)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.qwen2 import qwen_sliding
from pagesim.models.spec import ModelSpec, WeightQuant


def qwen3_extras(f: ConfigFields, heads: tuple[int, int, int, int]) -> Extras:
    h, n, kv, d = heads
    bias = (n * d + 2 * kv * d + h) if f.bool("attention_bias", False) else 0
    return Extras(layer_bias=bias, layer_other=2 * d, tied_embeddings=f.bool("tie_word_embeddings", False))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    window, sliding = qwen_sliding(f)
    return llama_shaped(f, name, quant, extras=qwen3_extras(f, heads), ffn_size=f.int("intermediate_size"),
                        window=window, num_sliding=sliding, qk_norm=True, heads=heads)
