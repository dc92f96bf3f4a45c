"""A ModelSpec from a Hugging Face config.json: read the file, pick the family by `model_type`,
and let the family's module (pagesim/models/families/) turn the fields into a spec.

Every error is one line naming the file and the field (ModelConfigError)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from pagesim.inputs import InputValueError, read_json
from pagesim.models.max_len import RopeScalingError, derived_max_len
from pagesim.models.spec import ModelSpec

SERVING_DTYPE_BYTES = 2  # fp16/bf16 serving, as the paper; a config's torch_dtype is not used
HF_QUANT_CONFIG = "hf_quant_config.json"  # ModelOpt's quantization file beside config.json
_MISSING = object()


class ModelConfigError(ValueError):
    """A config.json that cannot be turned into a ModelSpec; the message names the file and field."""


class ConfigFields:
    """Typed reads of a config.json's fields, each failing with the file and the field."""

    def __init__(self, config: dict, where: str, model_type: str | None = None) -> None:
        self.config, self.where, self.model_type = config, where, model_type

    def error(self, key: str, problem: str) -> ModelConfigError:
        return ModelConfigError(f"{self.where}: field {key!r} {problem}")

    def has(self, key: str) -> bool:
        return self.config.get(key) is not None

    def get(self, key: str, default=None):
        value = self.config.get(key)
        return default if value is None else value

    def int(self, key: str, default=_MISSING) -> int:
        """A positive integer; `default` where the field is absent or null."""
        value = self.config.get(key)
        if value is None:
            if default is _MISSING:
                raise ModelConfigError(f"{self.where}: missing field {key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.error(key, f"must be a positive integer, got {value!r}")
        return value

    def count(self, key: str, default: int = 0) -> int:
        """A non-negative integer (0 allowed: no shared experts, no dense layers)."""
        value = self.config.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(key, f"must be a non-negative integer, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(key, f"must be true or false, got {value!r}")
        return value

    def max_len(self) -> int:
        """The longest sequence the model serves: max_position_embeddings as vLLM scales it by
        rope_scaling (pagesim.models.max_len)."""
        try:
            return derived_max_len(self.int("max_position_embeddings"), self.get("rope_scaling"), self.model_type)
        except RopeScalingError as e:
            raise self.error("rope_scaling", e.problem) from None

    def int_list(self, key: str) -> list[int]:
        value = self.config.get(key) or []
        if not isinstance(value, list) or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
            raise self.error(key, f"must be a list of layer indices, got {value!r}")
        return value

    def str_list(self, key: str) -> list[str] | None:
        value = self.config.get(key)
        if value is None:
            return None
        if not isinstance(value, list) or any(not isinstance(v, str) for v in value):
            raise self.error(key, f"must be a list of strings, got {value!r}")
        return value


def load_model_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (or the directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:  # a regular file (a FIFO would block), valid JSON, not nested past what a walk over it survives
        config = read_json(p, "config file")
    except InputValueError as e:
        raise ModelConfigError(str(e)) from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{p}: expected a JSON object at the top level")
    where = str(p)
    quant_file = p.parent / HF_QUANT_CONFIG
    if p.name == "config.json" and config.get("quantization_config") is None and quant_file.exists():
        # ModelOpt before 0.31 wrote its quantization beside config.json; vLLM reads it as the
        # quantization_config (transformers_utils/config.py)
        try:
            config = {**config, "quantization_config": read_json(quant_file, "quantization file")}
        except InputValueError as e:
            raise ModelConfigError(str(e)) from None
        where = f"{p} (quantization_config from {quant_file})"
    # a config.json is named by its folder (the HF repo's name); any other file by its own name
    folder = p.parent.name if p.name == "config.json" else ""
    name = str(config.get("_name_or_path") or folder or p.stem).rstrip("/").rsplit("/", 1)[-1].lower()
    return model_from_config(config, name, where)


def model_from_config(config: dict, name: str, where: str = "config.json") -> ModelSpec:
    """ModelSpec from the fields of a config.json; num_params is the exact count its shapes imply
    (embeddings, every layer's weights and biases, norms; an untied LM head counted apart; the
    vision tower and projector of a multimodal config, pagesim.models.vision)."""
    from pagesim.models.families import FAMILIES
    from pagesim.models.quant import kv_cache_bytes, weight_quant
    from pagesim.models.vision import vision_params

    text = config.get("text_config")
    # Gemma 3 (and other multimodal configs) nest the language model's fields under text_config;
    # the quantization_config stays at the top level, and so may tie_word_embeddings: the composite
    # model ties as its own config says (transformers 5; Qwen3-VL's text configs default to true
    # where the released checkpoints say false at the top level), text_config's where it is silent.
    if isinstance(text, dict):
        tie = config.get("tie_word_embeddings", text.get("tie_word_embeddings"))
        text = {**text, "quantization_config": config.get("quantization_config"), "tie_word_embeddings": tie}
    fields = ConfigFields(text if isinstance(text, dict) else config, where, config.get("model_type"))
    model_type = fields.model_type
    build = FAMILIES.get(model_type)
    if build is None:
        raise ModelConfigError(f"{where}: field 'model_type' is {model_type!r}; supported: {', '.join(sorted(FAMILIES))}")
    spec = build(fields, name, weight_quant(fields))
    if kv := kv_cache_bytes(fields):  # a ModelOpt checkpoint's FP8 KV cache (--kv-cache-dtype auto)
        spec = replace(spec, kv_dtype_bytes=kv)
    vision = vision_params(config, where, spec.hidden_size)  # the tower vLLM loads beside the language model
    return replace(spec, num_params=spec.num_params + vision, num_vision_params=vision) if vision else spec
