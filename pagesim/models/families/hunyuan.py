"""Tencent Hunyuan: `hunyuan_v1_dense` (Hunyuan-0.5B/1.8B/4B/7B-Instruct) and `hunyuan_v1_moe`
(Hunyuan-A13B-Instruct, 80 B total / 13 B active), as vLLM's hunyuan_v1.py builds them.

Llama-shaped GQA attention (`head_dim`, else `attention_head_dim`, else hidden / heads), per-head q
and k RMSNorms where `use_qk_norm` (vLLM builds none without it; transformers' modules always
have them), biases where `attention_bias` (or `bias`), and the dense MLP's where `mlp_bias`.
The MoE model has a MoE on every layer: `num_experts` routed experts of `moe_intermediate_size`
(top `moe_topk`; vLLM falls back to `intermediate_size`) behind an unbiased softmax router, and,
where `use_mixed_mlp_moe`, a shared MLP of `intermediate_size` x `num_shared_expert`. The per-layer
lists the released configs write (`moe_topk`, `moe_intermediate_size`, `num_shared_expert`) must
be uniform. `rope_scaling` "dynamic" with an NTK `alpha` (factor 1) moves positions, not shapes.

Refused, one line each: cross-layer attention (`use_cla`: every `cla_share_factor`-th layer
computes K and V, the others reuse them: vLLM's HunYuanCrossAttention; the released configs say
false), MLA (`use_mla`), `moe_layer_num_skipped` (vLLM ignores it), a list of `num_experts`,
per-layer lists that differ, an activation other than SiLU (vLLM's only one).
"""

from __future__ import annotations

from dataclasses import replace

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def per_layer(f: ConfigFields, key: str, layers: int, default: int | None = None) -> int:
    """A field written as one integer or as one (equal) integer per layer (required without a default)."""
    value = f.get(key)
    if not isinstance(value, list):
        return f.int(key) if default is None else f.int(key, default)
    if len(value) != layers or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in value):
        raise f.error(key, f"must be a positive integer or {layers} of them (one per layer), got {value!r}")
    if len(set(value)) > 1:
        raise f.error(key, f"differs between layers ({sorted(set(value))}): only one value for all layers is modelled")
    return value[0]


def _common(f: ConfigFields) -> tuple[ConfigFields, Extras]:
    """The checks and the attention of both models: (fields with head_dim resolved, extras)."""
    for key, what in (("use_cla", "cross-layer attention (CLA)"), ("use_mla", "multi-head latent attention")):
        if f.bool(key, False):
            raise f.error(key, f"is true: Hunyuan's {what} is not modelled (the released configs say false)")
    if f.get("hidden_act", "silu") != "silu":
        raise f.error("hidden_act", f"is {f.get('hidden_act')!r}: vLLM's Hunyuan supports only 'silu'")
    check_rope_scaling(f)
    if not f.has("head_dim") and f.has("attention_head_dim"):  # the released configs' name (vLLM reads both)
        f = ConfigFields({**f.config, "head_dim": f.int("attention_head_dim")}, f.where, f.model_type)
    h, n, kv, d = attention_heads(f)
    bias = f.bool("attention_bias", False) or f.bool("bias", False)
    return f, Extras(layer_bias=(n * d + 2 * kv * d + h) if bias else 0,  # q, k, v and o
                     layer_other=2 * d if f.bool("use_qk_norm", False) else 0,
                     tied_embeddings=f.bool("tie_word_embeddings", False))


def build_dense(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    f, extras = _common(f)
    ffn = per_layer(f, "intermediate_size", f.int("num_hidden_layers"))
    if f.bool("mlp_bias", False):  # gate and up (merged), down
        extras = replace(extras, layer_bias=extras.layer_bias + 2 * ffn + f.int("hidden_size"))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=ffn, qk_norm=extras.layer_other > 0)


def build_moe(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    if isinstance(f.get("num_experts"), list):
        raise f.error("num_experts", "is a list: one expert count for all layers is modelled (vLLM's fused MoE reads one)")
    if f.int("num_experts", 1) == 1:  # vLLM's _is_moe: a dense MLP
        return build_dense(f, name, quant)
    if f.count("moe_layer_num_skipped"):
        raise f.error("moe_layer_num_skipped", "is not 0: dense first layers are not modelled (vLLM ignores the field)")
    f, extras = _common(f)
    layers, experts, ffn = f.int("num_hidden_layers"), f.int("num_experts"), f.int("intermediate_size")
    top_k = per_layer(f, "moe_topk", layers, 1)
    if top_k > experts:
        raise f.error("moe_topk", f"{top_k} is more than 'num_experts' {experts}")
    shared = per_layer(f, "num_shared_expert", layers, 1) if f.bool("use_mixed_mlp_moe", True) else 0
    moe = MoESpec(experts, top_k, per_layer(f, "moe_intermediate_size", layers, ffn), layers,
                  num_shared_experts=shared, shared_expert_ffn_size=shared * ffn)
    return llama_shaped(f, name, quant, extras=extras, ffn_size=ffn, moe=moe, qk_norm=extras.layer_other > 0)
