"""GLM-4.5 / GLM-4.5-Air / GLM-4.6 (zai-org, `glm4_moe`): GQA attention with q, k and v biases
(`attention_bias`; o_proj has none), per-head q/k RMSNorms where `use_qk_norm`, and DeepSeek-V3's
MoE layout: the first `first_k_dense_replace` layers dense (`intermediate_size`), every later one
`n_routed_experts` routed experts (top `num_experts_per_tok`) and `n_shared_experts` shared
experts, all of `moe_intermediate_size`, a sigmoid router with a per-expert score-correction bias.

`partial_rotary_factor` (rotary on half of each head) changes no shape. The multi-token-prediction
layer (`num_nextn_predict_layers`, stored as layer `num_hidden_layers` of the checkpoint with its
own embedding and LM head copies) is not counted: vLLM loads it only for speculative decoding
(`--speculative-config` with method `glm4_moe_mtp` / MTP), not for plain serving. The checkpoint's
total (HF page: 358 B for GLM-4.5, 110 B for Air) includes it; the model card's 355 B / 106 B
are rounded marketing figures between the two counts.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    h, heads, kv_heads, head_dim = attention_heads(f)
    layers = f.int("num_hidden_layers")
    experts, top_k = f.int("n_routed_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'n_routed_experts' {experts}")
    first_dense = f.count("first_k_dense_replace")
    if first_dense >= layers:
        raise f.error("first_k_dense_replace", f"{first_dense} leaves no MoE layer of {layers}")
    expert_ffn, shared = f.int("moe_intermediate_size"), f.count("n_shared_experts")
    moe = MoESpec(experts, top_k, expert_ffn, layers - first_dense, num_shared_experts=shared,
                  shared_expert_ffn_size=shared * expert_ffn)
    qk_norm = f.bool("use_qk_norm", False)
    bias = (heads * head_dim + 2 * kv_heads * head_dim) if f.bool("attention_bias", False) else 0
    extras = Extras(layer_bias=bias, layer_other=2 * head_dim if qk_norm else 0,
                    moe_layer_other=experts,  # the router's e_score_correction_bias
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), moe=moe,
                        qk_norm=qk_norm, heads=(h, heads, kv_heads, head_dim))
