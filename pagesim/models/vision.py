"""The vision tower and multimodal projector of a multimodal checkpoint, counted from its
`vision_config`: vLLM loads them onto the GPU with the language model (unless
`--limit-mm-per-prompt` sets every modality to 0), so they take weight memory from the KV pool.

pagesim replays text: what these weights cost is memory, not step time (image tokens and the
encoder's FLOPs are not modelled). They are counted in `ModelSpec.num_vision_params` (part of
`num_params`, not of the active parameters) and stored in the serving dtype, unquantized (vLLM
builds Llama 4's vision model with `quant_config=None`). vLLM's default `--mm-encoder-tp-mode
weights` shards the tower's linear layers over TP like the language model's (docs/calibration.md,
"Vision towers").

- Gemma 3 (`gemma3`, transformers' SiglipVisionModel + Gemma3MultiModalProjector): a patch
  Conv2d with bias, a learned position per patch, `num_hidden_layers` pre-norm layers (q, k, v,
  out projections with biases, fc1 / fc2 with biases, two LayerNorms), the post LayerNorm; the
  projector is one weight (vision hidden x text hidden) and an RMSNorm of the vision width.
- Llama 4 (`llama4`, Llama4VisionModel + Llama4MultiModalProjector): an unfold + linear patch
  embedding without bias, a class token, a learned position per patch and the class token, pre /
  post LayerNorms, the same encoder layers (biases everywhere), the pixel-shuffle adapter MLP
  (fc1 intermediate_size -> projector_input_dim, fc2 -> projector_output_dim, biases when
  multi_modal_projector_bias), and the projector (vision_output_dim -> text hidden, no bias).
- Qwen2.5-VL (`qwen2_5_vl`, Qwen2_5_VisionTransformerPretrainedModel): a Conv3d patch embedding
  without bias (in_chans x temporal_patch_size x patch_size^2 -> hidden), `depth` blocks (two
  RMSNorms, a fused qkv and an output projection with biases, a gated SiLU MLP: gate, up, down with
  biases; window attention changes no shape), and the PatchMerger: an RMSNorm of the vision width,
  then an MLP over spatial_merge_size^2 merged patches (m -> m, m -> out_hidden_size, biases).
- Qwen3-VL (`qwen3_vl`, `qwen3_vl_moe`, Qwen3VLVisionModel): a Conv3d patch embedding with bias,
  `num_position_embeddings` learned positions, `depth` blocks shaped as the ViT layer above (two
  LayerNorms, fc1 / fc2 with biases), the merger (a LayerNorm of the vision width, the same MLP)
  and one more merger per `deepstack_visual_indexes` entry, whose LayerNorm is over the merged
  width m. The merger's output width must be the language model's hidden size.
- Mistral Small 3.1 / 3.2 (`mistral3`, PixtralVisionModel + Mistral3MultiModalProjector): a patch
  Conv2d without bias, an RMSNorm (ln_pre), `num_hidden_layers` blocks (two RMSNorms, q, k, v, o of
  hidden x hidden and a gated MLP: gate, up, down, no biases; 2D rotary positions, no weights, no
  post norm); the projector: an RMSNorm of the vision width, the patch merger (one linear, no bias,
  over spatial_merge_size^2 patches back to the vision width), linear_1 (vision -> text hidden) and
  linear_2 (text -> text hidden), biases when `multimodal_projector_bias`. `spatial_merge_size`,
  `multimodal_projector_bias` and `vision_feature_layer` sit at the top level of config.json.
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields


def encoder_layer_params(hidden: int, ffn: int) -> int:
    """One ViT layer: q, k, v, o (with biases), fc1 and fc2 (with biases), two LayerNorms."""
    return 4 * (hidden * hidden + hidden) + (hidden * ffn + ffn) + (ffn * hidden + hidden) + 2 * 2 * hidden


def _tower_shape(v: ConfigFields) -> tuple[int, int, int, int]:
    """(hidden, intermediate, patches per image, weights of the patch embedding's kernel)."""
    hidden, patch, image = v.int("hidden_size"), v.int("patch_size"), v.int("image_size")
    if image % patch:
        raise v.error("image_size", f"{image} is not a multiple of 'patch_size' {patch}")
    return hidden, v.int("intermediate_size"), (image // patch) ** 2, v.int("num_channels", 3) * patch * patch


def siglip_gemma3_params(v: ConfigFields, text_hidden: int, top: ConfigFields) -> int:
    if v.bool("vision_use_head", False):
        raise v.error("vision_use_head", "is true: a SigLIP pooling head is not modelled (Gemma 3 has none)")
    d, ffn, patches, kernel = _tower_shape(v)
    tower = kernel * d + d + patches * d + v.int("num_hidden_layers") * encoder_layer_params(d, ffn) + 2 * d
    return tower + d * text_hidden + d


def llama4_vision_params(v: ConfigFields, text_hidden: int, top: ConfigFields) -> int:
    d, ffn, patches, kernel = _tower_shape(v)
    embed = kernel * d + d + (patches + 1) * d + 2 * 2 * d
    p_in, p_out = v.int("projector_input_dim"), v.int("projector_output_dim")
    bias = v.bool("multi_modal_projector_bias", False)
    adapter = ffn * p_in + p_in * p_out + ((p_in + p_out) if bias else 0)
    layers = v.int("num_hidden_layers") * encoder_layer_params(d, ffn)
    return embed + layers + adapter + v.int("vision_output_dim") * text_hidden


def _merged(v: ConfigFields, text_hidden: int) -> tuple[int, int]:
    """(merged width: vision hidden x spatial_merge_size^2, the merger MLP's weights and biases)."""
    out = v.int("out_hidden_size", text_hidden)
    if out != text_hidden:
        raise v.error("out_hidden_size", f"is {out}, the language model's hidden_size is {text_hidden}")
    merged = v.int("hidden_size") * v.int("spatial_merge_size", 2) ** 2
    return merged, merged * merged + merged + merged * out + out


def _patch_kernel(v: ConfigFields) -> int:
    """Weights of the Conv3d patch embedding's kernel per output channel."""
    channels = v.int("in_channels", None) or v.int("in_chans", 3)
    return channels * v.int("temporal_patch_size", 2) * v.int("patch_size") ** 2


def qwen2_5_vl_params(v: ConfigFields, text_hidden: int, top: ConfigFields) -> int:
    d, ffn = v.int("hidden_size"), v.int("intermediate_size")
    block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * (d * ffn + ffn) + (ffn * d + d)
    _, merger = _merged(v, text_hidden)
    return _patch_kernel(v) * d + v.int("depth") * block + d + merger


def qwen3_vl_params(v: ConfigFields, text_hidden: int, top: ConfigFields) -> int:
    d, ffn, depth = v.int("hidden_size"), v.int("intermediate_size"), v.int("depth")
    if not isinstance(v.get("deepstack_visual_indexes"), list):
        raise v.error("deepstack_visual_indexes", "must be a list of block indices (missing or not a list)")
    deepstack = v.int_list("deepstack_visual_indexes")
    if any(not 0 <= i < depth for i in deepstack) or len(set(deepstack)) != len(deepstack):
        raise v.error("deepstack_visual_indexes", f"must list distinct blocks in 0..{depth - 1}, got {deepstack}")
    merged, merger = _merged(v, text_hidden)
    embed = _patch_kernel(v) * d + d + v.int("num_position_embeddings") * d
    return embed + depth * encoder_layer_params(d, ffn) + 2 * d + merger + len(deepstack) * (2 * merged + merger)


def pixtral_mistral3_params(v: ConfigFields, text_hidden: int, top: ConfigFields) -> int:
    layer = top.get("vision_feature_layer", -1)
    if layer != -1:  # vLLM builds the layers up to the one read, transformers all; a list widens linear_1
        raise top.error("vision_feature_layer", f"is {layer!r}: only the last layer (-1, as released) is modelled")
    if v.get("model_type", "pixtral") != "pixtral":
        raise v.error("model_type", f"is {v.get('model_type')!r}: a mistral3 vision tower is 'pixtral'")
    d, ffn, heads = v.int("hidden_size"), v.int("intermediate_size"), v.int("num_attention_heads")
    if d % heads:
        raise v.error("hidden_size", f"{d} is not a multiple of 'num_attention_heads' {heads}")
    patch = v.int("num_channels", 3) * v.int("patch_size") ** 2 * d
    block = 2 * d + 4 * d * d + 3 * d * ffn
    merge = top.int("spatial_merge_size", 2)
    bias = 2 * text_hidden if top.bool("multimodal_projector_bias", False) else 0
    projector = d + d * merge ** 2 * d + d * text_hidden + text_hidden * text_hidden + bias
    return patch + d + v.int("num_hidden_layers") * block + projector


TOWERS = {"gemma3": siglip_gemma3_params, "llama4": llama4_vision_params, "qwen2_5_vl": qwen2_5_vl_params,
          "qwen3_vl": qwen3_vl_params, "qwen3_vl_moe": qwen3_vl_params, "mistral3": pixtral_mistral3_params}


def vision_params(config: dict, where: str, text_hidden: int) -> int:
    """Parameters of the vision tower and projector a config.json's `vision_config` describes
    (0 without one, or for a family whose tower is not counted)."""
    count = TOWERS.get(config.get("model_type"))
    vision = config.get("vision_config")
    if count is None or vision is None:
        return 0
    if not isinstance(vision, dict):
        raise ConfigFields(config, where).error("vision_config", "must be an object")
    return count(ConfigFields(vision, f"{where} (vision_config)"), text_hidden, ConfigFields(config, where))
