"""OPT (facebook/opt-*): MHA with biases, LayerNorms (weight and bias), a 2-matrix MLP, learned
positions with OPT's offset of 2 rows, LM head tied to the embedding."""

from __future__ import annotations

from pagesim.models.config import SERVING_DTYPE_BYTES, ConfigFields
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, layers, heads = f.int("hidden_size"), f.int("num_hidden_layers"), f.int("num_attention_heads")
    vocab, max_len, ffn = f.int("vocab_size"), f.int("max_position_embeddings"), f.int("ffn_dim")
    if h % heads:
        raise f.error("hidden_size", f"{h} is not a multiple of 'num_attention_heads' {heads}")
    if f.int("word_embed_proj_dim", h) != h:
        raise f.error("word_embed_proj_dim", "differs from 'hidden_size' (OPT-350m's projections are not supported)")
    qkv = 3 * h
    layer = (h * qkv + qkv) + (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 4 * h  # biases, 2 LayerNorms
    final_norm = 2 * h if f.bool("do_layer_norm_before", True) else 0
    params = layers * layer + vocab * h + (max_len + 2) * h + final_norm  # the learned positions' table
    return ModelSpec(name, layers, h, heads, heads, h // heads, ffn, vocab, params, f.max_len(), SERVING_DTYPE_BYTES,
                     architecture="opt", quant=quant)
