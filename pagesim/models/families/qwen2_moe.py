"""Qwen1.5-MoE / Qwen2-MoE: Qwen2 attention; the MLP of a layer is sparse unless the layer is in
`mlp_only_layers` or off the `decoder_sparse_step` (layer i is sparse when (i + 1) % step == 0):
`num_experts` routed experts of `moe_intermediate_size`, top `num_experts_per_tok`, and one
shared expert of `shared_expert_intermediate_size` scaled by a sigmoid gate (hidden -> 1)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.qwen2 import qkv_bias, qwen_sliding
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def sparse_layers(f: ConfigFields) -> int:
    """Layers whose MLP is a MoE (HF Qwen2MoeDecoderLayer's / Qwen3MoeDecoderLayer's rule)."""
    layers, step = f.int("num_hidden_layers"), f.int("decoder_sparse_step", 1)
    dense = set(f.int_list("mlp_only_layers"))
    count = sum(1 for i in range(layers) if i not in dense and (i + 1) % step == 0)
    if not count:
        raise f.error("mlp_only_layers", "leaves no sparse layer (with 'decoder_sparse_step'): not a MoE model")
    return count


def routed_experts(f: ConfigFields, layers: int, shared_ffn: int = 0) -> MoESpec:
    # transformers 5 writes Qwen3-MoE's expert count as num_local_experts; the released configs num_experts
    key = "num_local_experts" if f.has("num_local_experts") and not f.has("num_experts") else "num_experts"
    experts, top_k = f.int(key), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than {key!r} {experts}")
    return MoESpec(experts, top_k, f.int("moe_intermediate_size"), layers, num_shared_experts=1 if shared_ffn else 0,
                   shared_expert_ffn_size=shared_ffn, shared_expert_gate=bool(shared_ffn))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    window, sliding = qwen_sliding(f)
    moe = routed_experts(f, sparse_layers(f), f.count("shared_expert_intermediate_size"))
    return llama_shaped(f, name, quant, extras=Extras(layer_bias=qkv_bias(heads),
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), moe=moe, window=window, num_sliding=sliding, heads=heads)
