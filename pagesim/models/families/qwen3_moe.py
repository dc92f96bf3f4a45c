"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3 attention, Qwen2-MoE's sparse-layer rule,
routed experts only (no shared expert)."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import attention_heads, llama_shaped
from pagesim.models.families.qwen2 import qwen_sliding
from pagesim.models.families.qwen2_moe import routed_experts, sparse_layers
from pagesim.models.families.qwen3 import qwen3_extras
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    window, sliding = qwen_sliding(f)
    return llama_shaped(f, name, quant, extras=qwen3_extras(f, heads), ffn_size=f.int("intermediate_size"),
                        moe=routed_experts(f, sparse_layers(f)), window=window, num_sliding=sliding, qk_norm=True,
                        heads=heads)
