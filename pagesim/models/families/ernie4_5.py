"""ERNIE 4.5 dense (baidu/ERNIE-4.5-0.3B-PT, -Base-PT, `ernie4_5`): llama-shaped GQA without
biases, `head_dim` 128 where absent (transformers' Ernie4_5Config default: wider than hidden /
heads in the 0.3B), tied embeddings by default. vLLM serves it as Llama (ernie45.py), which
builds no projection biases, so `use_bias` is refused, as for ERNIE 4.5 MoE."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, WeightQuant

ERNIE4_5_DEFAULTS = {"head_dim": 128}


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    f = ConfigFields({**ERNIE4_5_DEFAULTS, **{k: v for k, v in f.config.items() if v is not None}}, f.where,
                     f.model_type)
    heads = attention_heads(f)
    check_rope_scaling(f)
    if f.bool("use_bias", False):
        raise f.error("use_bias", "is true: ERNIE's projection biases are not modelled (vLLM builds none)")
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", True)),
                        ffn_size=f.int("intermediate_size"), heads=heads)
