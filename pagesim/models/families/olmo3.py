"""OLMo 3 (allenai/Olmo-3-1025-7B, Olmo-3-1125-32B and their Instruct / Think versions, `olmo3`):
OLMo 2's layer (post-attention and post-MLP RMSNorms, q and k normed over the whole projections)
with sliding-window layers: `layer_types` where given, else layer i slides unless
(i + 1) % 4 == 0 (transformers' Olmo3Config default), over `sliding_window` (default 4,096).
vLLM's olmo2.py gives the sliding layers that window and applies `rope_scaling` (YaRN) to the
full layers only; the served length is max_position_embeddings as vLLM derives it."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.cohere2 import every_nth_global
from pagesim.models.families.common import attention_heads, llama_shaped, sliding_layers
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.olmo2 import post_norm_extras
from pagesim.models.spec import ModelSpec, WeightQuant

OLMO3_DEFAULTS = {"sliding_window": 4096}


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    f = ConfigFields({**OLMO3_DEFAULTS, **{k: v for k, v in f.config.items() if v is not None}}, f.where, f.model_type)
    heads = attention_heads(f)
    check_rope_scaling(f)
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.max_len(), every_nth_global(4))
    return llama_shaped(f, name, quant, extras=post_norm_extras(f, heads), ffn_size=f.int("intermediate_size"),
                        window=window, num_sliding=sliding, qk_norm=True, heads=heads)
