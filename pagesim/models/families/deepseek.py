"""DeepSeek-V2 / V2-Lite / V3: multi-head latent attention and a MoE with shared experts.

Attention (MLA): q through `q_lora_rank` (q_a_proj, an RMSNorm, q_b_proj; V2-Lite: one q_proj),
keys and values through kv_a_proj_with_mqa (hidden -> kv_lora_rank + qk_rope_head_dim), an RMSNorm
and kv_b_proj (kv_lora_rank -> heads x (qk_nope_head_dim + v_head_dim)); o_proj from heads x
v_head_dim. MLP: the first `first_k_dense_replace` layers dense (`intermediate_size`), then every
`moe_layer_freq`-th layer a MoE of `n_routed_experts` (top `num_experts_per_tok`) and
`n_shared_experts` experts of `moe_intermediate_size`. V3's router also has a bias per expert
(e_score_correction_bias). V3's multi-token-prediction layer (`num_nextn_predict_layers`) is not
counted: vLLM loads it only for speculative decoding, and the published 671 B leave it out.
V3.2 (`deepseek_v32`) is V3 with DeepSeek Sparse Attention: a lightning indexer per layer
(`index_n_heads`, `index_head_dim`, `index_topk`; pagesim.models.parts.IndexerSpec) that picks the
`index_topk` cached tokens each query attends to.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, llama_shaped
from pagesim.models.spec import MLASpec, MoESpec, ModelSpec, WeightQuant
from pagesim.models.parts import IndexerSpec


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    if f.bool("attention_bias", False):
        raise f.error("attention_bias", "is true: MLA projections with biases are not modelled")
    h, heads = f.int("hidden_size"), f.int("num_attention_heads")
    q_lora = f.int("q_lora_rank", None)
    mla = MLASpec(q_lora, f.int("kv_lora_rank"), f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim"),
                  f.int("v_head_dim"), indexer(f, q_lora) if f.get("model_type") == "deepseek_v32" else None)
    layers = f.int("num_hidden_layers")
    experts, top_k = f.int("n_routed_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'n_routed_experts' {experts}")
    first_dense, freq = f.count("first_k_dense_replace"), f.int("moe_layer_freq", 1)
    moe_layers = sum(1 for i in range(layers) if i >= first_dense and i % freq == 0)
    if not moe_layers:
        raise f.error("first_k_dense_replace", f"{first_dense} leaves no MoE layer of {layers}")
    expert_ffn, shared = f.int("moe_intermediate_size"), f.count("n_shared_experts")
    moe = MoESpec(experts, top_k, expert_ffn, moe_layers, num_shared_experts=shared,
                  shared_expert_ffn_size=shared * expert_ffn)
    latent_norms = (q_lora or 0) + mla.kv_lora_rank  # q_a_layernorm, kv_a_layernorm
    latent_norms += mla.indexer.norm_params if mla.indexer else 0  # the indexer's k_norm
    router_bias = experts if f.get("topk_method") == "noaux_tc" else 0  # V3's e_score_correction_bias
    extras = Extras(layer_other=latent_norms, moe_layer_other=router_bias,
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    # the spec's heads: MLA computes attention as MHA with q/k heads of qk_head_dim
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), moe=moe, mla=mla,
                        heads=(h, heads, heads, mla.qk_head_dim))


def indexer(f: ConfigFields, q_lora: int | None) -> IndexerSpec:
    """V3.2's lightning indexer: its query comes from the MLA's q latent (wq_b), so it needs one."""
    if q_lora is None:
        raise f.error("q_lora_rank", "is missing: the sparse-attention indexer projects its queries from it")
    spec = IndexerSpec(f.int("index_n_heads"), f.int("index_head_dim"), f.int("index_topk"))
    if spec.head_dim % IndexerSpec.QUANT_BLOCK:
        raise f.error("index_head_dim", f"{spec.head_dim} is not a multiple of {IndexerSpec.QUANT_BLOCK} "
                      "(vLLM's fp8 indexer cache scales blocks of 128)")
    return spec
