"""Llama 4 (meta-llama/Llama-4-Scout-17B-16E, Llama-4-Maverick-17B-128E): the language model of
`Llama4ForConditionalGeneration`, whose config nests it under `text_config` (model_type
llama4_text; read by pagesim.models.config, as Gemma 3's). The vision encoder and projector
(`vision_config`, 0.87 B parameters in both released models) are counted by
pagesim.models.vision: vLLM loads them, so they take weight memory; image requests are not modelled.

Attention: GQA of `num_attention_heads` / `num_key_value_heads` heads of `head_dim`, no biases.
Layers that use RoPE (`no_rope_layers[i] == 1`; by default all but every 4th) attend within
chunks of `attention_chunk_size` tokens; the NoPE layers attend to the whole sequence. Their q/k
norm (`use_qk_norm`) is an L2 norm without weights: no parameters.

MLP: layer i is a MoE when it is in `moe_layers` (default: (i + 1) % interleave_moe_layer_step
== 0, vLLM's rule; Scout: every layer, Maverick: every other): one shared expert and
`num_local_experts` routed experts, top `num_experts_per_tok` (1), all of `intermediate_size`,
with a router (hidden -> experts, no bias). The other layers have a dense MLP of
`intermediate_size_mlp`.

Chunked local attention, approximated: a token at position p of a chunked layer attends to the
tokens of its own chunk, [C floor(p / C), p] for chunk size C, and vLLM (ChunkedLocalAttentionSpec)
frees the blocks of earlier chunks. pagesim models those layers as sliding-window layers of window
C. Exact while a sequence is at most C tokens long (both keep every token: the whole of a
ShareGPT-like trace at C = 8192); past that the window keeps C tokens where the chunk keeps
(p mod C) + 1, between 1 and C, C / 2 on average: the peak KV a sequence can hold in those layers
(what admission and preemption guard against) is the same, the KV held and read mid-chunk is
overestimated by up to C tokens a layer, so long-context runs are priced slightly pessimistically.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families.common import Extras, attention_heads, llama_shaped
from pagesim.models.families.llama import check_rope_scaling
from pagesim.models.spec import MoESpec, ModelSpec, WeightQuant

NOPE_LAYER_INTERVAL = 4  # transformers' Llama4TextConfig default: every 4th layer is NoPE


def moe_layers(f: ConfigFields, layers: int) -> int:
    """The number of MoE layers: `moe_layers` where the config lists them, else vLLM's rule."""
    listed = f.int_list("moe_layers") if f.has("moe_layers") else None
    if listed is not None:
        if any(not 0 <= i < layers for i in listed):
            raise f.error("moe_layers", f"lists a layer outside 0..{layers - 1}")
        count = len(set(listed))
    else:
        step = f.int("interleave_moe_layer_step", 1)
        count = sum(1 for i in range(layers) if (i + 1) % step == 0)
    if not count:
        raise f.error("interleave_moe_layer_step", "leaves no MoE layer: not a MoE model")
    return count


def chunked_layers(f: ConfigFields, layers: int, max_len: int) -> tuple[int | None, int]:
    """(chunk size, number of chunked-attention layers): the RoPE layers, when the config sets a
    chunk shorter than the longest sequence."""
    rope = f.int_list("no_rope_layers") if f.has("no_rope_layers") else None
    if rope is None:
        interval = f.int("no_rope_layer_interval", NOPE_LAYER_INTERVAL)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(rope) != layers or set(rope) - {0, 1}:
        raise f.error("no_rope_layers", f"must list 0 or 1 for each of the {layers} layers")
    chunk = f.int("attention_chunk_size", None)
    if chunk is None or chunk >= max_len or not sum(rope):
        return None, 0
    return chunk, sum(rope)


def build(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
    check_rope_scaling(f)
    if f.bool("attention_bias", False):
        raise f.error("attention_bias", "is true: Llama 4 attention with biases is not modelled")
    heads = attention_heads(f)
    layers = f.int("num_hidden_layers")
    experts, top_k = f.int("num_local_experts"), f.int("num_experts_per_tok")
    if top_k > experts:
        raise f.error("num_experts_per_tok", f"{top_k} is more than 'num_local_experts' {experts}")
    expert_ffn = f.int("intermediate_size")
    moe = MoESpec(experts, top_k, expert_ffn, moe_layers(f, layers), num_shared_experts=1,
                  shared_expert_ffn_size=expert_ffn)
    window, chunked = chunked_layers(f, layers, f.max_len())
    return llama_shaped(f, name, quant, extras=Extras(tied_embeddings=f.bool("tie_word_embeddings", False)),
                        ffn_size=f.int("intermediate_size_mlp"), moe=moe, window=window, num_sliding=chunked,
                        heads=heads)
