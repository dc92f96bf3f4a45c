"""What every llama-shaped family shares: the attention shape, the sliding-window layout, the
MoE block, and the exact parameter count of the result.

A family module reads its own fields and calls `llama_shaped`; the count is then one rule for all
of them: the decoder's matmul weights (ModelSpec's own properties, so counts and FLOPs cannot
disagree) + biases + norms per layer + embedding, LM head (unless tied) and the final norm.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesim.models.config import SERVING_DTYPE_BYTES, ConfigFields, ModelConfigError
from pagesim.models.spec import MLASpec, MoESpec, ModelSpec, WeightQuant

SLIDING, FULL = "sliding_attention", "full_attention"


@dataclass(frozen=True)
class Extras:
    """Parameters outside the matmuls, per layer and once per model."""

    norms_per_layer: int = 2          # RMSNorms of width hidden (input, post-attention; Gemma: 4)
    layer_bias: int = 0               # attention and MLP biases of one layer
    layer_other: int = 0              # q/k norms, MLA's latent norms, ...
    moe_layer_other: int = 0          # per MoE layer besides weights (DeepSeek-V3's router bias)
    model_other: int = 0              # once per model besides embedding, head, final norm (Phi-3.5-MoE's biases)
    expert_bias: int = 0              # biases of one routed expert (gpt-oss): E of them in the total, k active
    tied_embeddings: bool = False


def attention_heads(f: ConfigFields) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head dim), checked against each other."""
    h, heads = f.int("hidden_size"), f.int("num_attention_heads")
    kv_heads = f.int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise f.error("num_key_value_heads", f"{kv_heads} does not divide 'num_attention_heads' {heads}")
    if not f.has("head_dim") and h % heads:
        raise f.error("hidden_size", f"{h} is not a multiple of 'num_attention_heads' {heads}")
    return h, heads, kv_heads, f.int("head_dim", h // heads)


def sliding_layers(f: ConfigFields, layers: int, max_len: int, default_pattern,
                   window_optional: bool = True) -> tuple[int | None, int]:
    """(window, number of sliding layers). `layer_types` (newer transformers) wins where present;
    otherwise `default_pattern(layer_index) -> bool` says which layers slide: given a window where
    it is optional (Mistral: no window, no sliding), always where the family has them (Gemma)."""
    types = f.str_list("layer_types")
    # transformers writes 0 (Qwen2-MoE) or null for "no window"
    window = f.int("sliding_window", None) if f.get("sliding_window", 0) != 0 else None
    if types is not None:
        if len(types) != layers:
            raise f.error("layer_types", f"lists {len(types)} layers, 'num_hidden_layers' is {layers}")
        unknown = set(types) - {SLIDING, FULL}
        if unknown:
            raise f.error("layer_types", f"has unknown kinds {sorted(unknown)}")
        count = types.count(SLIDING)
    else:
        count = sum(1 for i in range(layers) if default_pattern(i)) if window or not window_optional else 0
    if not count:
        return None, 0
    if window is None:
        raise ModelConfigError(f"{f.where}: missing field 'sliding_window' (layers of kind {SLIDING!r} need one)")
    if window >= max_len:  # never drops a token (Phi-3.5-mini: 262,144 over 131,072 positions): full attention
        return None, 0
    return window, count


def check_kept_layers(f: ConfigFields, quant, mixers: int, moe_layers: int, dense_layers: int) -> None:
    """A checkpoint's unquantized modules (WeightQuant.kept_*), as far as they are modelled: the
    token mixers or the shared experts of every layer or of none; dense MLPs of some layers."""
    for kept, total, what in ((quant.kept_mixer_layers, mixers, "attention"),
                              (quant.kept_shared_layers, moe_layers, "shared experts")):
        if kept and kept != total:
            raise f.error("quantization_config", f"its list of unquantized modules keeps the {what} of {kept} "
                          f"of {total} layers unquantized: only all or none is modelled")
    if quant.kept_mlp_layers > dense_layers:
        raise f.error("quantization_config", f"its list of unquantized modules keeps the dense MLPs of "
                      f"{quant.kept_mlp_layers} layers unquantized; the model has {dense_layers}")


def llama_shaped(f: ConfigFields, name: str, quant: WeightQuant | None, *, extras: Extras,
                 ffn_size: int, moe: MoESpec | None = None, mla: MLASpec | None = None,
                 window: int | None = None, num_sliding: int = 0, qk_norm: bool = False,
                 heads: tuple[int, int, int, int] | None = None, linear_attn=None,
                 attn_output_gate: bool = False, mlp_only_layers: int = 0, ungated_mlp: bool = False,
                 parallel_mixer_layers: int = 0) -> ModelSpec:
    """The spec of a llama-shaped model, with num_params (and, for MoE, num_active_params)
    counted from its shapes and `extras`."""
    h, n_heads, kv_heads, head_dim = heads or attention_heads(f)
    if quant is not None and quant.experts_only and moe is None:
        raise f.error("quantization_config", f"is {quant.method}, which quantizes MoE experts only: this model has none")
    layers, vocab, max_len = f.int("num_hidden_layers"), f.int("vocab_size"), f.max_len()
    if quant is not None:
        moe_layers = moe.num_moe_layers if moe else 0
        check_kept_layers(f, quant, layers - mlp_only_layers, moe_layers, (mlp_only_layers or layers) - moe_layers)
    spec = ModelSpec(name, layers, h, n_heads, kv_heads, head_dim, ffn_size, vocab, 1, max_len,
                     SERVING_DTYPE_BYTES, architecture="llama", moe=moe, mla=mla, sliding_window=window,
                     num_sliding_layers=num_sliding, qk_norm=qk_norm, quant=quant, linear_attn=linear_attn,
                     attn_output_gate=attn_output_gate, num_mlp_only_layers=mlp_only_layers,
                     ungated_mlp=ungated_mlp, num_parallel_mixer_layers=parallel_mixer_layers)
    per_layer = extras.norms_per_layer * h + extras.layer_bias + extras.layer_other
    moe_other = spec.moe.num_moe_layers * extras.moe_layer_other if moe else 0
    outside = layers * per_layer + moe_other + vocab * h * (1 if extras.tied_embeddings else 2) + h + extras.model_other
    bias = moe.num_moe_layers * extras.expert_bias if moe else 0  # one routed expert's biases, all MoE layers
    total = spec.linear_params_total + outside + (bias * moe.num_experts if moe else 0)
    active = spec.linear_params + outside + bias * moe.experts_per_token if moe else None
    return replace(spec, num_params=total, num_active_params=active)
