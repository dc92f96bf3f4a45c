"""Qwen's vision-language models: the language model is an existing family's, built by its own
builder; the vision tower and merger (`vision_config`) are counted by pagesim.models.vision.

- `qwen2_5_vl` (Qwen2.5-VL-3B/7B/32B/72B-Instruct): a Qwen2 language model whose fields sit at the
  top level of config.json as released (transformers 5 writes them under `text_config`, which
  pagesim.models.config reads as well): families/qwen2.py.
- `qwen3_vl` (Qwen3-VL-2B/4B/8B/32B): a Qwen3 language model under `text_config`: families/qwen3.py.
- `qwen3_vl_moe` (Qwen3-VL-30B-A3B, 235B-A22B): a Qwen3-MoE language model under `text_config`:
  families/qwen3_moe.py.

Positions are multimodal RoPE (mrope): `rope_scaling` (`rope_parameters` in transformers 5) with
`mrope_section`, the rotary half of each head split among time, height and width, and a rope type
of "mrope" (Qwen2.5-VL) or "default" (Qwen3-VL, `mrope_interleaved`). A text token has the same
position on all three axes, so for the text pagesim replays it is plain rotary: it changes no
shape and no cost. The sections must add up to half the head size (vLLM's MRotaryEmbedding).
"""

from __future__ import annotations

from pagesim.models.config import ConfigFields
from pagesim.models.families import qwen2, qwen3, qwen3_moe
from pagesim.models.families.common import attention_heads
from pagesim.models.families.llama import ROPE_TYPES
from pagesim.models.spec import ModelSpec, WeightQuant


def check_mrope(f: ConfigFields) -> None:
    """A rope config vLLM knows; an `mrope_section` must split half the head size."""
    key = "rope_scaling" if f.has("rope_scaling") else "rope_parameters"
    rope = f.get(key)
    if rope is None:
        return
    if not isinstance(rope, dict):
        raise f.error(key, f"must be an object, got {rope!r}")
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise f.error(key, f"has rope type {kind!r}; known: {', '.join(ROPE_TYPES)}")
    section = rope.get("mrope_section")
    if section is None:
        return
    if not isinstance(section, list) or not section or any(
            isinstance(s, bool) or not isinstance(s, int) or s <= 0 for s in section):
        raise f.error(key, f"has mrope_section {section!r}: expected a list of positive integers")
    half = attention_heads(f)[3] // 2
    if sum(section) != half:
        raise f.error(key, f"has mrope_section {section} adding up to {sum(section)}, not half the head size ({half})")


def _vl(build, text_types: tuple[str, ...]):
    def build_vl(f: ConfigFields, name: str, quant: WeightQuant | None) -> ModelSpec:
        text_type = f.get("model_type")
        if text_type is not None and text_type not in text_types:  # absent: the expected one
            raise f.error("model_type", f"of the language model is {text_type!r}; expected {' or '.join(text_types)}")
        check_mrope(f)
        return build(f, name, quant)

    return build_vl


build_qwen2_5_vl = _vl(qwen2.build, ("qwen2_5_vl", "qwen2_5_vl_text"))
build_qwen3_vl = _vl(qwen3.build, ("qwen3_vl_text",))
build_qwen3_vl_moe = _vl(qwen3_moe.build, ("qwen3_vl_moe_text",))
