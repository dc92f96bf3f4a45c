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


def siglip_gemma3_params(v: ConfigFields, text_hidden: int) -> int:
    if v.bool("vision_use_head", False):
        raise v.error("vision_use_head", "is true: a SigLIP pooling head is not modelled (Gemma 3 has none)")
    d, ffn, patches, kernel = _tower_shape(v)
    tower = kernel * d + d + patches * d + v.int("num_hidden_layers") * encoder_layer_params(d, ffn) + 2 * d
    return tower + d * text_hidden + d


def llama4_vision_params(v: ConfigFields, text_hidden: int) -> int:
    d, ffn, patches, kernel = _tower_shape(v)
    embed = kernel * d + d + (patches + 1) * d + 2 * 2 * d
    p_in, p_out = v.int("projector_input_dim"), v.int("projector_output_dim")
    bias = v.bool("multi_modal_projector_bias", False)
    adapter = ffn * p_in + p_in * p_out + ((p_in + p_out) if bias else 0)
    layers = v.int("num_hidden_layers") * encoder_layer_params(d, ffn)
    return embed + layers + adapter + v.int("vision_output_dim") * text_hidden


TOWERS = {"gemma3": siglip_gemma3_params, "llama4": llama4_vision_params}


def vision_params(config: dict, where: str, text_hidden: int) -> int:
    """Parameters of the vision tower and projector a config.json's `vision_config` describes
    (0 without one, or for a family whose tower is not counted)."""
    count = TOWERS.get(config.get("model_type"))
    vision = config.get("vision_config")
    if count is None or vision is None:
        return 0
    if not isinstance(vision, dict):
        raise ConfigFields(config, where).error("vision_config", "must be an object")
    return count(ConfigFields(vision, f"{where} (vision_config)"), text_hidden)
