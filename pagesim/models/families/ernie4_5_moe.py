"""ERNIE 4.5 MoE (baidu/ERNIE-4.5-21B-A3B-PT, -300B-A47B-PT, `ernie4_5_moe`): llama-shaped GQA
attention; layer i's MLP is a MoE when `moe_layer_start_index` <= i <= `moe_layer_end_index`
(-1: the last layer) and (i + 1) % `moe_layer_interval` == 0 (HF Ernie4_5_MoeDecoderLayer's rule),
otherwise dense of `intermediate_size`. A MoE layer: `moe_num_experts` routed experts of
`moe_intermediate_size` (top `moe_k`), `moe_num_shared_experts` shared experts of the same width
(one MLP of shared x width), a router and its per-expert score-correction bias. Where a field is
absent transformers' Ernie4_5_MoeConfig default applies (start 1, end -1, interval 1, 2 shared
experts, tied embeddings); the expert count, top-k and expert width must be given. `use_bias`
(biases on every projection) is refused: no released checkpoint sets it. The MTP layer
(`num_nextn_predict_layers`) is not counted (speculative decoding only)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, MoESpec, WeightQuant


def moe_layers(f: ConfigFields) -> int:
    layers = f.int("num_hidden_layers")
    start, interval = f.count("moe_layer_start_index", 1), f.int("moe_layer_interval", 1)
    end = f.get("moe_layer_end_index", -1)
    if isinstance(end, bool) or not isinstance(end, int) or end < -1:
        raise f.error("moe_layer_end_index", f"must be a layer index or -1, got {end!r}")
    end = layers - 1 if end == -1 else end
    count = sum(1 for i in range(layers) if start <= i <= end and (i + 1) % interval == 0)
    if not count:
        raise f.error("moe_layer_start_index", f"{start} (to 'moe_layer_end_index' {end}, every "
                      f"'moe_layer_interval' {interval}) leaves no MoE layer of {layers}")
    return count


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    check_rope_scaling(f)
    if f.bool("use_bias", False):
        raise f.error("use_bias", "is true: ERNIE's projection biases are not modelled")
    experts, top_k = f.int("moe_num_experts"), f.int("moe_k")
    if top_k > experts:
        raise f.error("moe_k", f"{top_k} is more than 'moe_num_experts' {experts}")
    width, shared = f.int("moe_intermediate_size"), f.count("moe_num_shared_experts", 2)
    moe = MoESpec(experts, top_k, width, moe_layers(f), num_shared_experts=shared, shared_expert_ffn_size=shared * width)
    extras = Extras(moe_layer_other=experts,  # the router's e_score_correction_bias (moe_statics)
                    tied_embeddings=f.bool("tie_word_embeddings", True))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), moe=moe, heads=heads)
