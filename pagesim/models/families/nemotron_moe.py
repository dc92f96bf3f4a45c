"""Nemotron 3's MoE layers ('E' in a `nemotron_h` pattern, "moe" in `layers_block_type`), as vLLM
serves them (vllm/model_executor/models/nemotron_h.py, NemotronHMoE):

- the router: hidden -> `n_routed_experts` (vLLM's GateLinear, fp32 logits), a sigmoid over the
  logits plus a per-expert score-correction bias (`e_score_correction_bias`, in the checkpoint),
  grouped top-k (`n_group`, `topk_group`), `norm_topk_prob`, `routed_scaling_factor`: the last
  three change no shape;
- the routed experts, one fused MoE of `n_routed_experts` experts of `moe_intermediate_size`, each
  token to `num_experts_per_tok` of them; ungated: up -> relu2 -> down, two matrices an expert
  (vLLM: activation_without_mul(mlp_hidden_act));
- the shared experts: one ungated MLP of `moe_shared_expert_intermediate_size` x `n_shared_experts`
  (vLLM multiplies them; transformers 5 builds one of `moe_shared_expert_intermediate_size`
  whatever `n_shared_experts` says: the two agree for the released n_shared_experts = 1), split
  over TP like a dense MLP; none where n_shared_experts is 0;
- latent MoE (`moe_latent_size`, Nemotron 3 Super / Ultra): fc1_latent_proj (hidden -> latent)
  before the routed experts and fc2_latent_proj (latent -> hidden) after them, no biases (mlp_bias
  is refused below); the routed experts read and write the latent width (transformers'
  NemotronHExperts: up experts x ffn x latent, down experts x latent x ffn), the router and the
  shared experts still see the hidden states. vLLM builds both projections as ReplicatedLinear
  (whole on every TP rank) and passes them to the fused MoE as its routed input / output
  transforms, so the experts' EP dispatch moves latent vectors (MoESpec.latent_size).

Refused, one line each: `moe_latent_size` not a positive integer (null: no latent), and `mlp_bias`
with MoE layers (transformers gives the shared experts biases, vLLM does not). A latent wider than
the hidden size is read as given: neither transformers nor vLLM refuses it. The multi-token-prediction layers (`num_nextn_predict_layers`) are not
counted: vLLM loads them only for speculative decoding, as for DeepSeek-V3."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.parts import MoESpec


def moe_layers(f: ConfigFields, num_moe: int) -> MoESpec | None:
    """The MoE of a model's `num_moe` 'E' layers; None without."""
    if not num_moe:
        return None
    for key in ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size"):
        if not f.has(key):
            raise f.error(key, "is missing: the MoE layers ('E') need it")
    experts, top_k = f.int("n_routed_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'n_routed_experts' {experts}")
    groups = f.int("n_group", 1)
    if experts % groups:
        raise f.error("n_group", f"{groups} does not divide 'n_routed_experts' {experts}")
    if f.int("topk_group", 1) > groups:
        raise f.error("topk_group", f"{f.int('topk_group')} is more than 'n_group' {groups}")
    if f.bool("mlp_bias", False):
        raise f.error("mlp_bias", "is true with MoE layers: shared-expert biases are not modelled "
                      "(transformers builds them, vLLM does not)")
    shared = f.count("n_shared_experts", 1)
    shared_ffn = shared * f.int("moe_shared_expert_intermediate_size") if shared else 0
    return MoESpec(experts, top_k, f.int("moe_intermediate_size"), num_moe, num_shared_experts=shared,
                   shared_expert_ffn_size=shared_ffn, latent_size=f.int("moe_latent_size", 0))
