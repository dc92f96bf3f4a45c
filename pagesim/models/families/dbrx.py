"""DBRX (databricks/dbrx-base, dbrx-instruct, `dbrx`): the MPT-style names of a llama-shaped MoE.
Top level: `d_model`, `n_heads`, `n_layers`, `max_seq_len`, `vocab_size`; under `attn_config`:
`kv_n_heads` (GQA; 1 where absent, transformers' DbrxAttentionConfig default), `clip_qkv`
(clamps values, no shape); under `ffn_config`: `moe_num_experts` routed experts of
`ffn_hidden_size` (gated: w1, v1, w2), top `moe_top_k`, on every layer, no shared expert, no
dense layer. One fused Wqkv and out_proj without biases, head size d_model / n_heads, two
LayerNorms a layer without bias, untied embeddings (transformers refuses tied ones, and so does
pagesim). Errors name the nested field as `ffn_config.moe_num_experts`."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, llama_shaped
from pagesim.models.spec import ModelSpec, MoESpec, WeightQuant


def section(f: ConfigFields, key: str) -> ConfigFields:
    """A nested config (`attn_config`, `ffn_config`) whose fields are named `key.field` in errors."""
    inner = f.get(key)
    if not isinstance(inner, dict):
        raise f.error(key, "must be an object") if f.has(key) else f.error(key, "is missing")
    return ConfigFields({f"{key}.{k}": v for k, v in inner.items()}, f.where, f.model_type)


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    attn, ffn = section(f, "attn_config"), section(f, "ffn_config")
    h, heads, layers = f.int("d_model"), f.int("n_heads"), f.int("n_layers")
    kv_heads = attn.int("attn_config.kv_n_heads", 1)
    if h % heads:
        raise f.error("d_model", f"{h} is not a multiple of 'n_heads' {heads}")
    if heads % kv_heads:
        raise attn.error("attn_config.kv_n_heads", f"{kv_heads} does not divide 'n_heads' {heads}")
    experts, top_k = ffn.int("ffn_config.moe_num_experts"), ffn.int("ffn_config.moe_top_k")
    if top_k > experts:
        raise ffn.error("ffn_config.moe_top_k", f"{top_k} is more than 'ffn_config.moe_num_experts' {experts}")
    if f.bool("tie_word_embeddings", False):
        raise f.error("tie_word_embeddings", "is true: DBRX's LM head is its own (transformers refuses tied ones)")
    width = ffn.int("ffn_config.ffn_hidden_size")
    # the llama names llama_shaped reads, from DBRX's own (each checked above under its own name)
    named = ConfigFields({"num_hidden_layers": layers, "vocab_size": f.int("vocab_size"),
                          "max_position_embeddings": f.int("max_seq_len")}, f.where, f.model_type)
    return llama_shaped(named, name, quant, extras=Extras(), ffn_size=width,
                        moe=MoESpec(experts, top_k, width, layers), heads=(h, heads, kv_heads, h // heads))
