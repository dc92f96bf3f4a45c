"""Qwen3-Next (`qwen3_next`): hybrid layers, `layer_types` (else every `full_attention_interval`-th
layer full attention, the rest linear attention): Gated DeltaNet layers (`linear_num_key_heads`,
`linear_num_value_heads`, `linear_key_head_dim`, `linear_value_head_dim`, `linear_conv_kernel_dim`;
a constant-size state per sequence) and gated full attention (q_proj twice as wide: the output
gate; per-head q/k RMSNorms). The MLP is Qwen2-MoE's: routed experts of `moe_intermediate_size`
plus one sigmoid-gated shared expert, dense on `mlp_only_layers`. The MTP layer is not counted
(vLLM loads it only for speculative decoding)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.qwen2_moe import routed_experts, sparse_layers
from pagesim.models.spec import LinearAttnSpec, ModelSpec, WeightQuant

LINEAR, FULL = "linear_attention", "full_attention"


def linear_layers(f: ConfigFields) -> int:
    layers = f.int("num_hidden_layers")
    types = f.str_list("layer_types")
    if types is None:
        interval = f.int("full_attention_interval", 4)
        types = [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]
    if len(types) != layers:
        raise f.error("layer_types", f"lists {len(types)} layers, 'num_hidden_layers' is {layers}")
    unknown = set(types) - {LINEAR, FULL}
    if unknown:
        raise f.error("layer_types", f"has unknown kinds {sorted(unknown)}")
    if FULL not in types:
        raise f.error("layer_types", "has no full-attention layer (a state-only model is not modelled)")
    return types.count(LINEAR)


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    head_dim = heads[3]
    la = LinearAttnSpec(linear_layers(f), f.int("linear_num_key_heads"), f.int("linear_num_value_heads"),
                        f.int("linear_key_head_dim"), f.int("linear_value_head_dim"), f.int("linear_conv_kernel_dim"))
    attention_layers = f.int("num_hidden_layers") - la.num_layers
    moe = routed_experts(f, sparse_layers(f), f.count("shared_expert_intermediate_size"))
    # q/k norms on the attention layers, the DeltaNet's conv/A_log/dt_bias/norm on the others
    other = attention_layers * 2 * head_dim + la.num_layers * la.other_params
    return llama_shaped(f, name, quant, extras=Extras(model_other=other,
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), moe=moe, heads=heads, linear_attn=la,
                        attn_output_gate=True)
