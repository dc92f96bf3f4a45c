"""OLMoE (allenai/OLMoE-1B-7B, `olmoe`) and GraniteMoE (ibm-granite/granite-3.x-*-a*m,
`granitemoe`): every layer a top-`num_experts_per_tok` MoE of experts of `intermediate_size`, no
shared expert, no dense layer.

OLMoE: `num_experts`; q and k RMSNorms over the whole projection (heads x head_dim, and KV heads x
head_dim), not per head; `clip_qkv` clamps values, no shape. GraniteMoE: `num_local_experts`;
tied embeddings; its `embedding_multiplier`, `attention_multiplier`, `residual_multiplier` and
`logits_scaling` scale activations and change no shape."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def every_layer_moe(f: ConfigFields, experts_key: str) -> MoESpec:
    experts, top_k = f.int(experts_key), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than {experts_key!r} {experts}")
    return MoESpec(experts, top_k, f.int("intermediate_size"), f.int("num_hidden_layers"))


def attention_bias(f: ConfigFields, heads: tuple[int, int, int, int]) -> int:
    h, n, kv, d = heads
    return (n * d + 2 * kv * d + h) if f.bool("attention_bias", False) else 0  # q, k, v and o


def build_olmoe(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    _, n, kv, d = heads
    check_rope_scaling(f)
    extras = Extras(layer_bias=attention_bias(f, heads), layer_other=n * d + kv * d,
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"),
                        moe=every_layer_moe(f, "num_experts"), qk_norm=True, heads=heads)


def build_granitemoe(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    check_rope_scaling(f)
    extras = Extras(layer_bias=attention_bias(f, heads), tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"),
                        moe=every_layer_moe(f, "num_local_experts"), heads=heads)
