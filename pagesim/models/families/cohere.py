"""Cohere Command R and Command R+ (CohereForAI/c4ai-command-r-v01, c4ai-command-r-plus,
`cohere`): Command R 7B / Command A's predecessor without sliding windows. One LayerNorm a layer
(a weight, no bias) feeds attention and the MLP side by side (the parallel block; vLLM
all-reduces each, as in a sequential layer), `head_dim` = hidden / heads (vLLM's commandr.py
derives it), q/k/v/o biases where `attention_bias`, tied embeddings (transformers' CohereConfig
default). Where `use_qk_norm` (Command R+), q and k each get a LayerNorm weight per head
(heads x head_dim and KV heads x head_dim weights). `logit_scale` scales the logits only."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.cohere2 import heads_of_hidden
from pagesim.models.families.common import Extras, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.olmoe import attention_bias
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = heads_of_hidden(f)
    _, n, kv, d = heads
    check_rope_scaling(f)
    qk_norm = f.bool("use_qk_norm", False)
    extras = Extras(norms_per_layer=1, layer_bias=attention_bias(f, heads), layer_other=(n + kv) * d if qk_norm else 0,
                    tied_embeddings=f.bool("tie_word_embeddings", True))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), qk_norm=qk_norm,
                        heads=heads)
