"""A model's maximum length as vLLM derives it from config.json, and vLLM's rule for a
--max-model-len above it.

vLLM (vllm/config/model.py) scales `max_position_embeddings` by `rope_scaling`'s `factor` (1 where
it has none) for every rope type except "su"/"longrope" and "llama3", whose
max_position_embeddings is already the long length; yarn scales its
`original_max_position_embeddings` where the config gives one. Gemma 3's max_position_embeddings
is already scaled, so its rope_scaling is not applied again. A Qwen3 config with yarn factor 4
over 32,768 original positions serves 131,072 tokens.

A --max-model-len above that length is refused, unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is 1 or
true: then vLLM warns and goes on, and so does pagesim (one "warning:" line on stderr).
"""

from __future__ import annotations

import os
import sys

UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3")  # max_position_embeddings is already the long length
ALLOW_LONG = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
_warned: set[str] = set()


class RopeScalingError(ValueError):
    """A rope_scaling whose length cannot be derived: `problem` completes "field 'rope_scaling' ..."."""

    def __init__(self, problem: str) -> None:
        super().__init__(f"field 'rope_scaling' {problem}")
        self.problem = problem


def rope_type(scaling: dict) -> str:
    """transformers' `rope_type`, or the older configs' `type` (DeepSeek-V3 writes "type": "yarn")."""
    return scaling.get("rope_type", scaling.get("type", "default"))


def derived_max_len(max_positions: int, rope_scaling, model_type: str | None = None) -> int:
    """The longest sequence vLLM lets the model serve (see the module's notes). rope_scaling: the
    config's `rope_scaling` (or transformers 5's `rope_parameters`; a mapping per layer kind is
    read as vLLM does, with one factor for all), or None."""
    if not rope_scaling or "gemma3" in (model_type or ""):
        return max_positions
    if not isinstance(rope_scaling, dict):
        raise RopeScalingError(f"must be a mapping, got {rope_scaling!r}")
    nested = all(isinstance(v, dict) for v in rope_scaling.values())  # transformers 5: {layer kind: parameters}
    length, factor = max_positions, 1.0
    for params in rope_scaling.values() if nested else [rope_scaling]:
        kind = rope_type(params)
        if kind in UNSCALED_ROPE_TYPES:
            continue
        factor = factor if params.get("factor") is None else params["factor"]  # (the default rope has none)
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or factor <= 0:
            raise RopeScalingError(f"has factor {factor!r}; it must be a positive number")
        original = params.get("original_max_position_embeddings") if kind == "yarn" else None
        if original is not None:
            if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
                raise RopeScalingError(f"has original_max_position_embeddings {original!r}; "
                                       "it must be a positive integer")
            length = original
    return int(length * factor)


def long_max_model_len_allowed() -> bool:
    """vLLM's reading of VLLM_ALLOW_LONG_MAX_MODEL_LEN: "1" or "true", any case and spacing."""
    return os.environ.get(ALLOW_LONG, "0").strip().lower() in ("1", "true")


def check_max_model_len(requested: int | None, limit: int, model: str) -> None:
    """Refuse a --max-model-len above the model's derived length, as vLLM does; with
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 warn once on stderr instead and go on."""
    if requested is None or requested <= limit:
        return
    problem = (f"--max-model-len {requested} is greater than {model}'s maximum length, {limit} tokens "
               "(max_position_embeddings with rope_scaling, as vLLM derives it)")
    if not long_max_model_len_allowed():
        raise ValueError(f"{problem}; set {ALLOW_LONG}=1 to allow it anyway")
    message = (f"warning: {problem}; allowed by {ALLOW_LONG}=1, but positions past {limit} may give wrong "
               "outputs on a real server")
    if message not in _warned:  # (vLLM's warning_once: a cluster's replicas check the same length)
        _warned.add(message)
        print(message, file=sys.stderr)
