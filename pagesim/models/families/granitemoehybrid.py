"""IBM Granite 4.0-H (`granitemoehybrid`): `layer_types` of "mamba" (a Mamba2 mixer,
pagesim.models.mamba2: `mamba_n_heads`, `mamba_d_head` ("auto": mamba_expand x hidden / heads),
`mamba_d_state`, `mamba_n_groups`, `mamba_d_conv`, `mamba_chunk_size`, `mamba_conv_bias`) and
"attention" (GQA, no positional encoding by default). Every layer has the shared MLP
(`shared_intermediate_size`, gated, no gate on its output) and, with `num_local_experts` > 0,
routed experts of `intermediate_size` (router hidden -> E, no bias); with none the layer's MLP
is the shared one alone (the dense Granite-4.0-H-1B)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.mamba2 import Mamba2Spec
from pagesim.models.spec import ModelSpec, MoESpec, WeightQuant

# the released configs' kinds; transformers 5 writes (and only builds from) linear_/full_attention
MAMBA, ATTENTION = ("mamba", "linear_attention"), ("attention", "full_attention")


def mamba_layers(f: ConfigFields) -> int:
    layers = f.int("num_hidden_layers")
    types = f.str_list("layer_types")
    if types is None:
        raise f.error("layer_types", "is missing (transformers then makes every layer a Mamba layer: not modelled)")
    if len(types) != layers:
        raise f.error("layer_types", f"lists {len(types)} layers, 'num_hidden_layers' is {layers}")
    unknown = set(types) - set(MAMBA) - set(ATTENTION)
    if unknown:
        raise f.error("layer_types", f"has unknown kinds {sorted(unknown)}")
    mamba = sum(t in MAMBA for t in types)
    if mamba == layers:
        raise f.error("layer_types", "has no attention layer (a state-only model is not modelled)")
    return mamba


def mamba2(f: ConfigFields, hidden: int) -> Mamba2Spec:
    heads = f.int("mamba_n_heads", 128)
    head_dim = f.get("mamba_d_head", "auto")
    if head_dim == "auto":
        head_dim = f.int("mamba_expand", 2) * hidden // heads
    elif isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0:
        raise f.error("mamba_d_head", f"must be a positive integer or 'auto', got {head_dim!r}")
    if f.bool("mamba_proj_bias", False):
        raise f.error("mamba_proj_bias", "is true: biases on the Mamba projections are not modelled")
    return Mamba2Spec(mamba_layers(f), heads, head_dim, f.int("mamba_d_state", 256), f.int("mamba_n_groups", 1),
                      f.int("mamba_d_conv", 4), f.int("mamba_chunk_size", 256), f.bool("mamba_conv_bias", True))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    h, n_heads, kv_heads, head_dim = heads
    mamba = mamba2(f, h)
    attention_layers = f.int("num_hidden_layers") - mamba.num_layers
    shared, experts = f.int("shared_intermediate_size", 1024), f.count("num_local_experts", 8)
    moe = None
    if experts:
        top_k = f.int("num_experts_per_tok", 2)
        if top_k > experts:
            raise f.error("num_experts_per_tok", f"{top_k} is more than 'num_local_experts' {experts}")
        moe = MoESpec(experts, top_k, f.int("intermediate_size"), f.int("num_hidden_layers"), num_shared_experts=1,
                      shared_expert_ffn_size=shared)
    # q, k, v, o biases on the attention layers; the Mamba mixers' conv, A_log, D, dt_bias and norm
    attn_bias = (n_heads + 2 * kv_heads) * head_dim + h if f.bool("attention_bias", False) else 0
    other = attention_layers * attn_bias + mamba.num_layers * mamba.other_params
    return llama_shaped(f, name, quant, extras=Extras(model_other=other,
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=shared, moe=moe, heads=heads, linear_attn=mamba)
