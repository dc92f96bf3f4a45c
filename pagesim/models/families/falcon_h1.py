"""TII Falcon-H1 (`falcon_h1`: Falcon-H1-0.5B/1.5B/1.5B-Deep/3B/7B/34B). Every layer is a parallel
hybrid: one norm, then GQA attention (rotary, no biases) AND a Mamba2 mixer on the same input,
their outputs scaled and summed, a residual add; then a norm, the gated SiLU MLP
(`intermediate_size`) and an add. So every layer keeps paged KV and a Mamba2 state
(ModelSpec.num_parallel_mixer_layers: all of them).

The Mamba2 mixer (pagesim.models.mamba2): inner width `mamba_d_ssm` (absent or null:
`mamba_expand` x hidden), `mamba_n_heads` heads of `mamba_d_head` ("auto": the width over the
heads; otherwise their product must be the width), `mamba_n_groups` groups of `mamba_d_state`,
`mamba_d_conv`, `mamba_chunk_size`, `mamba_conv_bias`; the gated norm has a weight only with
`mamba_rms_norm` (else y x silu(z)). The muP multipliers (`embedding_multiplier`,
`attention_in_multiplier`, `attention_out_multiplier`, `key_multiplier`, `ssm_in_multiplier`,
`ssm_out_multiplier`, `ssm_multipliers`, `mlp_multipliers`, `lm_head_multiplier`) scale
activations and change no shape; the `mup_vector` is a buffer, not a parameter. vLLM's
FalconH1ForCausalLM builds qkv, o and the MLP without biases and the Mamba projections with
`mamba_proj_bias`; configs asking for biases (`attention_bias`, `mlp_bias`, `mamba_proj_bias`,
`projectors_bias`) are refused. The state is in the model dtype (vLLM's mamba cache dtypes
"auto"; no Falcon-H1 hook raises it)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.mamba2 import Mamba2Spec
from pagesim.models.spec import ModelSpec, WeightQuant

BIASES = ("attention_bias", "mlp_bias", "mamba_proj_bias", "projectors_bias")


def mamba2(f: ConfigFields, hidden: int, layers: int) -> Mamba2Spec:
    inner = f.int("mamba_d_ssm") if f.get("mamba_d_ssm") is not None else f.int("mamba_expand", 2) * hidden
    heads = f.int("mamba_n_heads", 128)
    head_dim = f.get("mamba_d_head", "auto")
    if head_dim == "auto":
        if inner % heads:
            raise f.error("mamba_n_heads", f"{heads} does not divide the Mamba width {inner} ('mamba_d_ssm')")
        head_dim = inner // heads
    else:
        head_dim = f.int("mamba_d_head")
        if head_dim * heads != inner:
            raise f.error("mamba_d_head", f"{head_dim} x 'mamba_n_heads' {heads} is not the Mamba width {inner} "
                          "('mamba_d_ssm')")
    groups = f.int("mamba_n_groups", 1)
    if heads % groups:
        raise f.error("mamba_n_groups", f"{groups} does not divide 'mamba_n_heads' {heads}")
    return Mamba2Spec(layers, heads, head_dim, f.int("mamba_d_state", 256), groups, f.int("mamba_d_conv", 4),
                      f.int("mamba_chunk_size", 256), f.bool("mamba_conv_bias", True),
                      norm_weight=f.bool("mamba_rms_norm", False))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    for key in BIASES:
        if f.bool(key, False):
            raise f.error(key, "is true: biases are not modelled (vLLM's FalconH1 builds these projections without)")
    if f.get("hidden_act", "silu") != "silu":
        raise f.error("hidden_act", f"must be 'silu' (vLLM's FalconH1MLP refuses others), got {f.get('hidden_act')!r}")
    heads = attention_heads(f)
    layers = f.int("num_hidden_layers")
    mamba = mamba2(f, heads[0], layers)
    # the Mamba mixers' conv (and bias), A_log, D, dt_bias and gated-norm weight; two norms a layer
    return llama_shaped(f, name, quant, extras=Extras(model_other=layers * mamba.other_params,
                                                      tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size"), heads=heads, linear_attn=mamba,
                        parallel_mixer_layers=layers)
