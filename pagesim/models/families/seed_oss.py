"""ByteDance Seed-OSS (ByteDance-Seed/Seed-OSS-36B-Base, -Instruct, `seed_oss`): dense and
llama-shaped (GQA of 80 query heads over 8 KV heads of 128, wider than the 5120 hidden size),
biases on q, k and v (`attention_bias`, default true) and on o only where `attention_out_bias`,
MLP biases where `mlp_bias`, untied embeddings. Where a field is absent transformers'
SeedOssConfig default applies (`head_dim` 128, `attention_bias` true)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.qwen2 import qkv_bias
from pagesim.models.spec import ModelSpec, WeightQuant

SEED_OSS_DEFAULTS = {"head_dim": 128, "attention_bias": True}


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    f = ConfigFields({**SEED_OSS_DEFAULTS, **{k: v for k, v in f.config.items() if v is not None}}, f.where)
    heads = attention_heads(f)
    check_rope_scaling(f)
    h, ffn = heads[0], f.int("intermediate_size")
    bias = qkv_bias(heads) if f.bool("attention_bias", True) else 0
    bias += h if f.bool("attention_out_bias", False) else 0
    bias += (2 * ffn + h) if f.bool("mlp_bias", False) else 0
    return llama_shaped(f, name, quant, extras=Extras(layer_bias=bias, tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=ffn, heads=heads)
