"""NVIDIA Nemotron-H (`nemotron_h`: Nemotron-H-4B/8B/47B/56B, Nemotron-Nano-9B/12B-v2) and Nemotron 3
(Nano-30B-A3B). Each layer is ONE block, a norm then one of (`hybrid_override_pattern`, a character
a layer; transformers 5 writes the list `layers_block_type` instead):

- 'M': a Mamba2 mixer (pagesim.models.mamba2: `mamba_num_heads` of `mamba_head_dim`, the inner
  width is their product, not `expand` x hidden; `n_groups` groups of `ssm_state_size`,
  `conv_kernel`, `chunk_size`, `use_conv_bias`; the gated norm is per group, its weight still I);
- '*': GQA attention without positional encoding (`head_dim`, or `attention_head_dim` in the
  first releases); no biases whatever `attention_bias` says (transformers builds q, k, v, o with
  bias=False);
- '-': an MLP alone, up -> `mlp_hidden_act` (relu2: squared ReLU) -> down, no gate (`mlp_bias`);
- 'E' (Nemotron 3): a MoE alone (pagesim.models.families.nemotron_moe): `n_routed_experts` routed
  experts of `moe_intermediate_size`, top `num_experts_per_tok`, ungated relu2 like the '-' MLP;
  shared experts of `n_shared_experts` x `moe_shared_expert_intermediate_size`; a sigmoid router
  with a score-correction bias. Latent MoE (`moe_latent_size`, Nemotron 3 Super / Ultra): the routed
  experts in that width between two replicated projections (hidden -> latent -> hidden). `mlp_bias`
  with 'E' layers is refused.

Untied LM head by default, a final norm. vLLM keeps the Mamba SSM state in float32 unless the
config's `mamba_ssm_cache_dtype` says otherwise (NemotronHForCausalLMConfig: "Only float32 is
known to have no accuracy issues by default", vllm-project/vllm PR 39032; before it the fallback
was float16, PR 29978, and the model cards asked for --mamba-ssm-cache-dtype float32); the conv
state in the model dtype."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.nemotron_moe import moe_layers
from pagesim.models.mamba2 import Mamba2Spec
from pagesim.models.spec import ModelSpec, WeightQuant

MAMBA, ATTENTION, MLP, MOE = "M", "*", "-", "E"
# transformers 5's layers_block_type (and the older spellings its remap reads) as pattern characters
BLOCK_TYPES = {"linear_attention": MAMBA, "mamba": MAMBA, "full_attention": ATTENTION, "attention": ATTENTION,
               "mlp": MLP, "moe": MOE}
SSM_CACHE_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
DEFAULT_SSM_CACHE_DTYPE = "float32"


def layer_pattern(f: ConfigFields) -> tuple[str, str]:
    """(the pattern, the field it came from), checked against num_hidden_layers and its alphabet."""
    key = "hybrid_override_pattern"
    pattern = f.get(key)
    if pattern is None:
        key, types = "layers_block_type", f.str_list("layers_block_type")
        if types is None:
            raise f.error("hybrid_override_pattern",
                          "is missing (one character a layer: M Mamba2, * attention, - MLP, E MoE)")
        unknown = set(types) - set(BLOCK_TYPES)
        if unknown:
            raise f.error(key, f"has unknown layer kinds {sorted(unknown)}")
        pattern = "".join(BLOCK_TYPES[t] for t in types)
    if not isinstance(pattern, str) or not pattern:
        raise f.error(key, f"must be a non-empty string, got {pattern!r}")
    unknown = set(pattern) - {MAMBA, ATTENTION, MLP, MOE}
    if unknown:
        raise f.error(key, f"has unknown layer characters {sorted(unknown)} (M Mamba2, * attention, - MLP, E MoE)")
    layers = f.int("num_hidden_layers", len(pattern))
    if len(pattern) != layers:
        raise f.error(key, f"has {len(pattern)} layers, 'num_hidden_layers' is {layers}")
    if ATTENTION not in pattern:
        raise f.error(key, "has no attention layer (a state-only model is not modelled)")
    if MLP not in pattern and MOE not in pattern:
        raise f.error(key, "has no MLP or MoE layer")
    return pattern, key


def mamba2(f: ConfigFields, layers: int) -> Mamba2Spec | None:
    if not layers:
        return None
    if f.bool("use_bias", False) or f.bool("mamba_proj_bias", False):
        raise f.error("use_bias", "is true: biases on the Mamba projections are not modelled")
    dtype = f.get("mamba_ssm_cache_dtype", DEFAULT_SSM_CACHE_DTYPE)
    if dtype not in SSM_CACHE_DTYPE_BYTES:
        raise f.error("mamba_ssm_cache_dtype", f"must be one of {', '.join(SSM_CACHE_DTYPE_BYTES)}, got {dtype!r}")
    return Mamba2Spec(layers, f.int("mamba_num_heads", 128), f.int("mamba_head_dim", 64), f.int("ssm_state_size", 128),
                      f.int("n_groups", 8), f.int("conv_kernel", 4), f.int("chunk_size", 128),
                      f.bool("use_conv_bias", True), ssm_state_dtype_bytes=SSM_CACHE_DTYPE_BYTES[dtype])


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    pattern, _ = layer_pattern(f)
    # the first releases name the head size attention_head_dim; num_hidden_layers may be left to the pattern
    fields = ConfigFields({**f.config, "num_hidden_layers": len(pattern),
                           "head_dim": f.get("head_dim", f.get("attention_head_dim"))}, f.where)
    heads = attention_heads(fields)
    h = heads[0]
    moe = moe_layers(fields, pattern.count(MOE))
    # a model of MoE layers only (Nemotron 3 Nano) has no use for intermediate_size
    ffn = fields.int("intermediate_size") if MLP in pattern else fields.int("intermediate_size", moe.expert_ffn_size)
    mamba = mamba2(fields, pattern.count(MAMBA))
    # the MLPs' up and down biases; the Mamba mixers' conv, A_log, D, dt_bias, norm
    mlp_bias = ffn + h if fields.bool("mlp_bias", False) else 0
    other = pattern.count(MLP) * mlp_bias + (mamba.num_layers * mamba.other_params if mamba else 0)
    return llama_shaped(fields, name, quant, extras=Extras(norms_per_layer=1, model_other=other,
                                                           # the router's e_score_correction_bias
                                                           moe_layer_other=moe.num_experts if moe else 0,
                                                           tied_embeddings=fields.bool("tie_word_embeddings", False)),
                        ffn_size=ffn, heads=heads, linear_attn=mamba, moe=moe,
                        mlp_only_layers=pattern.count(MLP) + pattern.count(MOE), ungated_mlp=True)
