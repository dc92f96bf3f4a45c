"""Gemma 1, Gemma 2 and Gemma 3.

Gemma 1 (google/gemma-2b, gemma-7b, `gemma`): llama-shaped with tied embeddings, head_dim 256
(7B: 16 x 256 = 4096 over a hidden size of 3072), two RMSNorms a layer, full attention; the GeGLU
MLP has the gated MLP's three matrices.

Gemma 2 and Gemma 3: llama-shaped with four RMSNorms per layer (before and after attention and
MLP), tied embeddings, and interleaved sliding-window and global layers.

Gemma 2: layer i slides when i is even (HF Gemma2DecoderLayer: `not bool(layer_idx % 2)`).
Gemma 3: layer i slides unless (i + 1) % sliding_window_pattern == 0 (5 local : 1 global), with
per-head q/k RMSNorms. Gemma 3's multimodal configs nest these fields under `text_config` (read
by pagesim.models.config); their SigLIP vision tower and projector (`vision_config`) are counted
by pagesim.models.vision. Where a Gemma 3 text config omits a
field, transformers' Gemma3TextConfig default applies (listed in GEMMA3_TEXT_DEFAULTS).
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped, sliding_layers
from pagesim.models.spec import ModelSpec, WeightQuant

# transformers' Gemma3TextConfig defaults (configuration_gemma3.py) for fields the released
# multimodal checkpoints leave out of text_config.
GEMMA3_TEXT_DEFAULTS = {"vocab_size": 262_208, "max_position_embeddings": 131_072, "head_dim": 256,
                        "sliding_window": 4096, "sliding_window_pattern": 6, "num_attention_heads": 8,
                        "num_key_value_heads": 4}


def build_gemma(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", True)),
                        ffn_size=f.int("intermediate_size"), heads=attention_heads(f))


def build_gemma2(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    heads = attention_heads(f)
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.max_len(),
                                     lambda i: i % 2 == 0, window_optional=False)
    return llama_shaped(f, name, quant, extras=Extras(norms_per_layer=4, tied_embeddings=f.bool("tie_word_embeddings", True)),
                        ffn_size=f.int("intermediate_size"), window=window, num_sliding=sliding, heads=heads)


def build_gemma3(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    given = {k: v for k, v in f.config.items() if v is not None}
    f = ConfigFields({**GEMMA3_TEXT_DEFAULTS, **given}, f.where, f.model_type)
    heads = attention_heads(f)
    pattern = f.int("sliding_window_pattern")
    window, sliding = sliding_layers(f, f.int("num_hidden_layers"), f.max_len(),
                                     lambda i: (i + 1) % pattern != 0, window_optional=False)
    extras = Extras(norms_per_layer=4, layer_other=2 * heads[3], tied_embeddings=f.bool("tie_word_embeddings", True))
    return llama_shaped(f, name, quant, extras=extras, ffn_size=f.int("intermediate_size"), window=window,
                        num_sliding=sliding, qk_norm=True, heads=heads)
