"""Cohere Command R7B and Command A (CohereLabs, `cohere2`): one LayerNorm a layer (a weight, no
bias) feeding attention and the MLP side by side (the parallel block: both outputs added to the
residual; vLLM all-reduces each, as in a sequential layer), GQA with `head_dim` = hidden /
heads (transformers' Cohere2Config and vLLM both derive it, whatever the file says), q/k/v/o
biases where `attention_bias`, tied embeddings. Sliding-window layers interleave with global
ones: `layer_types` where given, else layer i slides unless (i + 1) % `sliding_window_pattern`
(default 4) == 0, three of every four. The global layers use no rotary (NoPE): no shape.
`logit_scale` scales the logits only."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.families.olmoe import attention_bias
from pagesim.models.spec import ModelSpec, WeightQuant


def every_nth_global(period: int):
    """Layer i slides unless it is the last of each `period` (Gemma 3, Cohere 2, EXAONE 4)."""
    return lambda i: (i + 1) % period != 0


def heads_of_hidden(f: ConfigFields) -> tuple[int, int, int, int]:
    """(hidden, heads, KV heads, hidden / heads): the head size vLLM derives for Cohere and
    StarCoder2, whatever `head_dim` the file gives."""
    return attention_heads(ConfigFields({**f.config, "head_dim": None}, f.where))


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = heads_of_hidden(f)
    if f.bool("use_qk_norm", False):
        raise f.error("use_qk_norm", "is true: Cohere 2 has no q/k norms (transformers' Cohere2 builds none)")
    pattern = f.int("sliding_window_pattern", 4)
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.int("max_position_embeddings"),
                                     every_nth_global(pattern))
    extras = Extras(norms_per_layer=1, layer_bias=attention_bias(f, heads),
                    tied_embeddings=f.bool("tie_word_embeddings", True))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), window=window,
                        num_sliding=sliding, heads=heads)
