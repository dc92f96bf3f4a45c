"""StarCoder2 (bigcode/starcoder2-3b, -7b, -15b, `starcoder2`): GQA with rotary, an ungated MLP
(c_fc -> GELU -> c_proj, two matrices), LayerNorms with a weight and a bias (two a layer and the
final one), biases on q, k, v, o, c_fc and c_proj where `use_bias` (default true), `head_dim` =
hidden / heads (vLLM's starcoder2.py derives it). Embeddings tied unless `tie_word_embeddings`
is false (the 15B).

`sliding_window` (4,096 in the released configs, over 16,384 positions) applies to every layer:
vLLM's Starcoder2Attention passes no per-layer window, so its Attention takes the model-level one
(cache_config.sliding_window, from the config), as for Mistral v0.1."""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.cohere2 import heads_of_hidden
from pagesim.models.families.common import Extras, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.families.mistral import every_layer_slides
from pagesim.models.spec import ModelSpec, WeightQuant


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = heads_of_hidden(f)
    h, n, kv, d = heads
    check_rope_scaling(f)
    ffn = f.int("intermediate_size")
    bias = (n * d + 2 * kv * d + h + ffn + h) if f.bool("use_bias", True) else 0  # q, k, v, o; c_fc, c_proj
    window, sliding = every_layer_slides(f)
    extras = Extras(norms_per_layer=4,  # two LayerNorms, weight and bias each
                    layer_bias=bias, model_other=h,  # the final LayerNorm's bias
                    tied_embeddings=f.bool("tie_word_embeddings", True))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=ffn, window=window, num_sliding=sliding,
                        heads=heads, ungated_mlp=True)
