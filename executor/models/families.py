"""What differs between the LLaMA-style decoder families, read from an HF config into one
DecoderSpec: biases, per-head q/k norm, each layer's sliding window and whether its MLP is a
mixture of experts. One decoder (executor.models.llama) runs them all.

  llama     RMSNorm, RoPE, GQA, SiLU-gated MLP
  mistral   + a sliding window on every layer (config.sliding_window, None = full)
  mixtral   mistral's attention, every MLP a top-k MoE (softmax, top-k, renormalised)
  qwen2     q/k/v biases (o_proj none); sliding windows per layer_types
  qwen3     per-head RMSNorm of q and k before RoPE; sliding windows per layer_types
  qwen3_moe qwen3's attention; MoE MLPs on the layers decoder_sparse_step / mlp_only_layers
            select, top-k weights renormalised when norm_topk_prob
  deepseek_v2  multi-head latent attention (executor.models.mla) with interleaved RoPE on its
            rope dims; MoE from layer first_k_dense_replace on, with shared experts, greedy or
            group-limited routing and routed_scaling_factor (as transformers 5, which never
            renormalises the top-k weights of this family)
  gemma2    (executor.models.gemma2) windows per layer_types (alternating), softmax scale
            query_pre_attn_scalar^-0.5, attention scores soft-capped at attn_logit_softcapping

A malformed config raises ConfigError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from executor.models.moe import MoEConfig
from executor.models.rope import STATIC_ROPE_TYPES, rope_kind
from pagesim.core.kv_groups import KVGroupSpec

FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "deepseek_v2", "gemma2")
# Fields a config.json must state: transformers would fill a missing one with a default (8
# experts for Mixtral), which makes a different model than the checkpoint's.
REQUIRED_FIELDS = {
    "mixtral": ("num_local_experts", "num_experts_per_tok"),
    "qwen3_moe": ("num_experts", "num_experts_per_tok", "moe_intermediate_size"),
    "deepseek_v2": ("n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                    "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"),
}


class ConfigError(ValueError):
    """A config field our models cannot run with; the message names the field."""


@dataclass(frozen=True)
class DecoderSpec:
    qkv_bias: bool
    o_bias: bool
    qk_norm: bool
    windows: tuple[int | None, ...]  # per layer: sliding window in tokens, None = full attention
    moe: MoEConfig | None  # the experts of the MoE layers
    moe_layers: frozenset[int]  # layers whose MLP is the MoE
    attention: str = "gqa"  # or "mla": multi-head latent attention over a latent cache
    attn_scale: float | None = None  # softmax scale; None = head_dim^-0.5
    attn_softcap: float | None = None  # scores become c tanh(s / c) (Gemma 2)


def _positive_int(config, name: str, required: bool = True):
    value = getattr(config, name, None)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"field {name!r} must be a positive integer, got {value!r}")
    return value


def layer_windows(config) -> tuple[int | None, ...]:
    """Each layer's window: config.layer_types where the family has it ('sliding_attention'
    layers get config.sliding_window), else config.sliding_window on every layer."""
    n = config.num_hidden_layers
    window = _positive_int(config, "sliding_window", required=False)
    if window is not None and window > config.max_position_embeddings:
        raise ConfigError(f"field 'sliding_window' is {window}, larger than max_position_embeddings "
                          f"{config.max_position_embeddings}")
    types = getattr(config, "layer_types", None)
    if types is None:
        return (window,) * n
    if len(types) != n:
        raise ConfigError(f"field 'layer_types' has {len(types)} entries for {n} layers")
    unknown = set(types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ConfigError(f"field 'layer_types': unsupported {sorted(unknown)}")
    if "sliding_attention" in types and window is None:
        raise ConfigError("field 'sliding_window' is missing for the 'sliding_attention' layers of layer_types")
    return tuple(window if t == "sliding_attention" else None for t in types)


def _moe(config, experts_field: str, renormalize: bool, in_model_dtype: bool, **extra) -> MoEConfig:
    num_experts = _positive_int(config, experts_field)
    top_k = _positive_int(config, "num_experts_per_tok")
    if top_k > num_experts:
        raise ConfigError(f"field 'num_experts_per_tok' is {top_k}, more than the {num_experts} experts ({experts_field})")
    inter_field = "moe_intermediate_size" if hasattr(config, "moe_intermediate_size") else "intermediate_size"
    return MoEConfig(num_experts, top_k, _positive_int(config, inter_field), renormalize, in_model_dtype,
                     getattr(config, "hidden_act", "silu"), **extra)


def _deepseek_moe(config) -> MoEConfig:
    method = getattr(config, "topk_method", "greedy") or "greedy"
    groups = {}
    if method == "group_limited_greedy":
        groups = dict(num_groups=_positive_int(config, "n_group"), topk_groups=_positive_int(config, "topk_group"))
        if config.n_routed_experts % groups["num_groups"] or groups["topk_groups"] > groups["num_groups"]:
            raise ConfigError(f"fields 'n_group' {config.n_group} / 'topk_group' {config.topk_group} do not divide "
                              f"{config.n_routed_experts} experts")
    elif method != "greedy":
        raise ConfigError(f"field 'topk_method' is {method!r}; supported: greedy, group_limited_greedy")
    shared = getattr(config, "n_shared_experts", None) or 0
    return _moe(config, "n_routed_experts", renormalize=False, in_model_dtype=False, router_fp32=True,
                routed_scaling=float(getattr(config, "routed_scaling_factor", 1.0) or 1.0),
                shared_intermediate_size=shared * _positive_int(config, "moe_intermediate_size"), **groups)


def decoder_spec(config) -> DecoderSpec:
    kind = config.model_type
    n = config.num_hidden_layers
    if rope_kind(config) not in STATIC_ROPE_TYPES:
        raise ConfigError(f"field 'rope_parameters': rope_type {rope_kind(config)!r} is not supported "
                          f"({', '.join(STATIC_ROPE_TYPES)})")
    bias = bool(getattr(config, "attention_bias", False))
    windows = layer_windows(config)
    if kind in ("llama", "mistral"):
        return DecoderSpec(bias, bias, False, windows, None, frozenset())
    if kind == "mixtral":
        moe = _moe(config, "num_local_experts", renormalize=True, in_model_dtype=False)
        return DecoderSpec(False, False, False, windows, moe, frozenset(range(n)))
    if kind == "qwen2":
        return DecoderSpec(True, False, False, windows, None, frozenset())
    if kind == "qwen3":
        return DecoderSpec(bias, bias, True, windows, None, frozenset())
    if kind == "qwen3_moe":
        moe = _moe(config, "num_experts", renormalize=bool(getattr(config, "norm_topk_prob", False)),
                   in_model_dtype=True)
        step = _positive_int(config, "decoder_sparse_step")
        dense = set(getattr(config, "mlp_only_layers", None) or [])
        layers = frozenset(i for i in range(n) if i not in dense and (i + 1) % step == 0)
        return DecoderSpec(bias, bias, True, windows, moe, layers)
    if kind == "deepseek_v2":
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            _positive_int(config, name)
        if config.qk_rope_head_dim % 2:
            raise ConfigError(f"field 'qk_rope_head_dim' must be even, got {config.qk_rope_head_dim}")
        _positive_int(config, "q_lora_rank", required=False)
        first_moe = getattr(config, "first_k_dense_replace", 0) or 0
        return DecoderSpec(bias, bias, False, windows, _deepseek_moe(config), frozenset(range(first_moe, n)), "mla")
    if kind == "gemma2":
        scalar = getattr(config, "query_pre_attn_scalar", None)
        if not isinstance(scalar, (int, float)) or scalar <= 0:
            raise ConfigError(f"field 'query_pre_attn_scalar' must be a positive number, got {scalar!r}")
        cap = getattr(config, "attn_logit_softcapping", None)
        if cap is not None and (not isinstance(cap, (int, float)) or cap <= 0):
            raise ConfigError(f"field 'attn_logit_softcapping' must be a positive number or null, got {cap!r}")
        return DecoderSpec(bias, bias, False, windows, None, frozenset(), attn_scale=float(scalar) ** -0.5,
                           attn_softcap=cap)
    raise ConfigError(f"field 'model_type' is {kind!r}; the LLaMA-style decoder runs {', '.join(FAMILIES)}")


def kv_groups(spec: DecoderSpec) -> tuple[list[KVGroupSpec], list[int]]:
    """The model's KV cache groups (layers that keep their KV alike share block tables: full
    attention, one per window size, MLA latent), in order of first appearance, and each layer's
    group index. The core's KV manager gives a sequence one block table per group in this order."""
    keys: list[tuple[str, int | None]] = []
    layer_groups = []
    for window in spec.windows:
        kind = "mla" if spec.attention == "mla" else "sliding" if window else "full"
        key = (kind, window if kind == "sliding" else None)
        if key not in keys:
            keys.append(key)
        layer_groups.append(keys.index(key))
    groups = [KVGroupSpec(kind, layer_groups.count(g), window) for g, (kind, window) in enumerate(keys)]
    return groups, layer_groups
