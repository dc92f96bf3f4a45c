"""AI21 Jamba (`jamba`: Jamba-v0.1, Jamba-1.5/1.6/1.7 Mini and Large). Every layer is a mixer and
an MLP, each after an RMSNorm. The mixer is GQA attention (no positional encoding, no biases)
where layer i % `attn_layer_period` == `attn_layer_offset`, a Mamba v1 mixer elsewhere
(pagesim.models.mamba1: inner width `mamba_expand` x hidden, `mamba_d_state`, `mamba_d_conv`,
`mamba_dt_rank` ("auto": ceil(hidden / 16)), `mamba_conv_bias`). The MLP is routed experts
(`num_experts` of `intermediate_size`, top `num_experts_per_tok`, a router hidden -> E without
bias, no shared expert) where i % `expert_layer_period` == `expert_layer_offset`, the gated SiLU
MLP of `intermediate_size` elsewhere. Untied LM head by default, a final norm.

vLLM's JambaForCausalLM builds the Mamba projections with `mamba_proj_bias` (in_proj, out_proj)
and everything else without biases; a config asking for them is refused. The Mamba state is in
the model dtype (mamba1_state_dtype, "auto"; no Jamba hook raises it)."""

from __future__ import annotations

import math

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.mamba1 import Mamba1Spec
from pagesim.models.spec import ModelSpec, MoESpec, WeightQuant


def every(f: ConfigFields, period_key: str, offset_key: str, period: int, offset: int, layers: int) -> int:
    """Layers i of `layers` with i % period == offset, the two fields checked as JambaConfig does."""
    p, o = f.int(period_key, period), f.count(offset_key, offset)
    if o >= p:
        raise f.error(offset_key, f"{o} must be smaller than '{period_key}' {p}")
    return sum(1 for i in range(layers) if i % p == o)


def mamba1(f: ConfigFields, hidden: int, layers: int) -> Mamba1Spec:
    if f.bool("mamba_proj_bias", False):
        raise f.error("mamba_proj_bias", "is true: biases on the Mamba projections are not modelled")
    rank = f.get("mamba_dt_rank", "auto")
    rank = math.ceil(hidden / 16) if rank == "auto" else f.int("mamba_dt_rank")
    return Mamba1Spec(layers, f.int("mamba_expand", 2) * hidden, f.int("mamba_d_state", 16), rank,
                      f.int("mamba_d_conv", 4), f.bool("mamba_conv_bias", True))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    if f.get("hidden_act", "silu") != "silu":
        raise f.error("hidden_act", f"must be 'silu' (the Mamba conv and the MLP), got {f.get('hidden_act')!r}")
    heads = attention_heads(f)
    layers = f.int("num_hidden_layers")
    attention = every(f, "attn_layer_period", "attn_layer_offset", 8, 4, layers)
    if not attention:
        raise f.error("attn_layer_offset", f"leaves no attention layer in {layers} (a state-only model is not modelled)")
    mamba = mamba1(f, heads[0], layers - attention)
    ffn = f.int("intermediate_size")
    moe = None
    experts = f.int("num_experts", f.int("num_local_experts", 16))
    moe_layers = every(f, "expert_layer_period", "expert_layer_offset", 2, 1, layers) if experts > 1 else 0
    if moe_layers:
        top_k = f.int("num_experts_per_tok", 2)
        if top_k > experts:
            raise f.error("num_experts_per_tok", f"{top_k} is more than 'num_experts' {experts}")
        moe = MoESpec(experts, top_k, ffn, moe_layers)
    # the Mamba mixers' conv (and bias), dt_proj bias, A_log, D and dt/B/C norms; two norms a layer
    return llama_shaped(f, name, quant, extras=Extras(model_other=mamba.num_layers * mamba.other_params,
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=ffn, moe=moe, heads=heads, linear_attn=mamba)
