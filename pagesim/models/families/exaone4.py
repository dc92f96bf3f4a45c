"""EXAONE 4.0 (LGAI-EXAONE/EXAONE-4.0-32B, -1.2B, `exaone4`): llama-shaped GQA without biases,
the two RMSNorms of a layer after attention and after the MLP (post-norm, as OLMo 2), a per-head
RMSNorm of q and of k (head_dim weights each). Hybrid attention: `layer_types` where given; else
`sliding_window_pattern`, either a period (layer i slides unless (i + 1) % period == 0, the
transformers rule) or a string of L (local, sliding) and G (global) repeated over the layers
(the released "LLLG": three of every four slide). No `sliding_window` (the 1.2B): every layer
global. `rope_scaling` (llama3) moves positions only."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.cohere2 import every_nth_global
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import ModelSpec, WeightQuant


def local_global_pattern(f: ConfigFields):
    """`sliding_window_pattern` as a rule `layer -> slides`."""
    pattern = f.get("sliding_window_pattern", 4)
    if isinstance(pattern, str):
        if not pattern or set(pattern) - {"L", "G"}:
            raise f.error("sliding_window_pattern", f"must be a period or a string of L and G, got {pattern!r}")
        return lambda i: pattern[i % len(pattern)] == "L"
    return every_nth_global(f.int("sliding_window_pattern", 4))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    check_rope_scaling(f)
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.int("max_position_embeddings"),
                                     local_global_pattern(f))
    extras = Extras(layer_other=2 * heads[3], tied_embeddings=f.bool("tie_word_embeddings", False))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), window=window,
                        num_sliding=sliding, qk_norm=True, heads=heads)
