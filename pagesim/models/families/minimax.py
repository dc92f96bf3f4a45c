"""MiniMax-Text-01 / MiniMax-M1 (MiniMaxAI; `minimax` in transformers' HF format, `minimax_m1` in
MiniMax's own config.json; vLLM serves both with minimax_text_01.py): every layer a token mixer,
lightning attention (kind 0) or GQA softmax attention (kind 1) as `attn_type_list` lists them
(the HF format: `layer_types` "linear_attention" / "full_attention"; neither: all softmax, as
vLLM), and a MoE (`block_sparse_moe`) of `num_local_experts` experts of `intermediate_size`, top
`num_experts_per_tok`, a softmax router, no shared expert. MiniMax-Text-01 and M1: 80 layers, a
softmax layer every 8th.

Lightning layers: pagesim.models.lightning (the softmax layers' `num_attention_heads` of
`head_dim`; a state of heads / TP x head_dim x head_dim per sequence in the model dtype). Softmax
layers: GQA with partial rotary (`rotary_dim` of each head, 64 of 128: positions, not shapes), no
q/k norm, no bias. Fields that change no shape: `postnorm`, the DeepNorm residual scales
(`layernorm_*_alpha` / `_beta`; HF: `*_alpha_factor` / `*_beta_factor`), `rope_theta`,
`block_size` (vLLM's lightning kernel blocks by 256 whatever it says).

Refused, one line naming the field: a kind list of the wrong length or with kinds other than 0
and 1, no softmax layer (a state-only model), a shared expert (`shared_intermediate_size` > 0:
vLLM's gated shared MLP is not modelled), `num_local_experts` a per-layer list or 1 (vLLM builds a
dense MLP then), `rotary_dim` above `head_dim`.

Left out: vLLM keeps the router and the LM head in float32 (`lm_head.float()`: 4.9 GB for
MiniMax's 200,064 x 6,144 head, not 2.5), counted here in the serving dtype; `sliding_window`
(vLLM's MiniMaxText01Attention does not pass it to its Attention); prefix caching, off for models
with state layers (pagesim.core.hybrid_kv).

Sources: transformers 5.25's MiniMaxConfig and modeling_minimax.py (the shapes, counted against its
modules in tests/models/test_model_params.py); vLLM's models/minimax_text_01.py,
layers/mamba/linear_attn.py and layers/mamba/mamba_utils.py (the layer kinds as it reads them, the
TP split, the state's shape and dtype)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.olmoe import every_layer_moe
from pagesim.models.lightning import LightningAttnSpec
from pagesim.models.spec import ModelSpec, MoESpec, WeightQuant

LIGHTNING, SOFTMAX = 0, 1
HF_KINDS = {"linear_attention": LIGHTNING, "full_attention": SOFTMAX}  # transformers' layer_types


def attention_kinds(f: ConfigFields, layers: int) -> tuple[str, list[int]]:
    """(the field read, each layer's kind: 0 lightning, 1 softmax), as vLLM's MiniMaxText01Model
    reads them: `attn_type_list`, else `layer_types`, else softmax everywhere."""
    if f.get("attn_type_list") is None and f.has("layer_types"):
        types = f.str_list("layer_types")
        if len(types) != layers:
            raise f.error("layer_types", f"lists {len(types)} layers, 'num_hidden_layers' is {layers}")
        unknown = set(types) - set(HF_KINDS)
        if unknown:
            raise f.error("layer_types", f"has unknown kinds {sorted(unknown)}")
        return "layer_types", [HF_KINDS[t] for t in types]
    kinds = f.get("attn_type_list", [SOFTMAX] * layers)
    if not isinstance(kinds, list) or len(kinds) != layers:
        raise f.error("attn_type_list", f"must list one kind for each of the {layers} layers, got {kinds!r}")
    if any(isinstance(k, bool) or k not in (LIGHTNING, SOFTMAX) for k in kinds):
        raise f.error("attn_type_list", f"has kinds other than {LIGHTNING} (lightning attention) and {SOFTMAX} "
                      f"(softmax attention): {sorted(set(map(repr, kinds)))}")
    return "attn_type_list", kinds


def minimax_moe(f: ConfigFields) -> MoESpec:
    """Every layer's `num_local_experts` routed experts, no shared expert (MiniMax-Text-01, M1, M2)."""
    if f.count("shared_intermediate_size"):
        raise f.error("shared_intermediate_size", "is not 0: a MiniMax shared expert is not modelled")
    moe = every_layer_moe(f, "num_local_experts")
    if moe.num_experts == 1:
        raise f.error("num_local_experts", "is 1: vLLM builds a dense MLP then, which is not modelled")
    return moe


def check_rotary_dim(f: ConfigFields, head_dim: int) -> None:
    rotary = f.int("rotary_dim", head_dim)
    if rotary > head_dim:
        raise f.error("rotary_dim", f"{rotary} is more than 'head_dim' {head_dim}")


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    _, n_heads, _, head_dim = heads
    layers = f.int("num_hidden_layers")
    field, kinds = attention_kinds(f, layers)
    lightning = kinds.count(LIGHTNING)
    if lightning == layers:
        raise f.error(field, "has no softmax attention layer (a state-only model is not modelled)")
    check_rotary_dim(f, head_dim)
    la = LightningAttnSpec(lightning, n_heads, head_dim) if lightning else None
    extras = Extras(model_other=la.num_layers * la.other_params if la else 0,  # the lightning layers' norms
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), moe=minimax_moe(f),
                        heads=heads, linear_attn=la)
