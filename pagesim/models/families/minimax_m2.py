"""MiniMax-M2 / M2.1 (MiniMaxAI, `minimax_m2`): GQA softmax attention on every layer
(`attn_type_list` all 1; lightning-attention layers, 0, are refused: vLLM's minimax_m2.py has none;
MiniMax-Text-01 / M1 are pagesim.models.families.minimax, whose field checks this family shares), and on
every layer a MoE of `num_local_experts` routed experts of `intermediate_size` (top
`num_experts_per_tok`), no shared expert (`shared_intermediate_size` 0), a sigmoid router with a
per-expert score-correction bias (`use_routing_bias`).

q and k are RMSNormed where `use_qk_norm`: `qk_norm_type` "per_layer" over the whole projection
(heads x head_dim and KV heads x head_dim weights, as OLMo 2), "per_head" over each head
(head_dim weights each). Partial rotary (`rotary_dim` of each head, 64 of 128) changes positions,
not shapes. The multi-token-prediction modules (`num_mtp_modules`, `use_mtp`) are not counted:
vLLM skips them for plain serving. The released checkpoint is FP8 (128 x 128 blocks; router and
LM head in bf16), which `quantization_config` says.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.minimax import LIGHTNING, attention_kinds, check_rotary_dim, minimax_moe
from pagesim.models.spec import ModelSpec, WeightQuant

QK_NORM_TYPES = ("per_layer", "per_head")


def qk_norm_params(f: ConfigFields, heads: tuple[int, int, int, int]) -> int:
    """Weights of one layer's q and k norms (0 without them)."""
    _, n, kv, d = heads
    if not f.bool("use_qk_norm", True):
        return 0
    kind = f.get("qk_norm_type", "per_layer")
    if kind not in QK_NORM_TYPES:
        raise f.error("qk_norm_type", f"is {kind!r}; known: {', '.join(QK_NORM_TYPES)}")
    return (n + kv) * d if kind == "per_layer" else 2 * d


def check_attention_layers(f: ConfigFields, layers: int) -> None:
    field, kinds = attention_kinds(f, layers)
    if LIGHTNING in kinds:
        raise f.error(field, "has lightning-attention layers (0): MiniMax-M2 has softmax attention only (vLLM's "
                      "minimax_m2.py); MiniMax-Text-01 / M1 configs are the `minimax` family")


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    check_attention_layers(f, f.int("num_hidden_layers"))
    check_rotary_dim(f, heads[3])
    moe = minimax_moe(f)
    extras = Extras(layer_other=qk_norm_params(f, heads),
                    moe_layer_other=moe.num_experts if f.bool("use_routing_bias", True) else 0,
                    tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), moe=moe,
                        qk_norm=extras.layer_other > 0, heads=heads)
