"""Model descriptions: ModelSpec, one module per family turning a Hugging Face config.json into a
spec (families/), parameter counts, KV bytes per token per attention kind, and the catalog.

    get_model("mixtral-8x7b")             # a catalog name (or an HF repo id, any case)
    get_model("path/to/config.json")       # any supported family's config.json
"""

from __future__ import annotations

import os
from pathlib import Path

from pagesim.models.catalog import MODEL_ALIASES, MODELS
from pagesim.models.config import SERVING_DTYPE_BYTES, ModelConfigError, load_model_config, model_from_config
from pagesim.models.families import FAMILIES
from pagesim.models.spec import (ARCHITECTURES, KV_CACHE_DTYPES, MLASpec, ModelSpec, MoESpec, WeightQuant,
                                 with_kv_cache_dtype)

LLAMA_FAMILY = tuple(sorted(t for t in FAMILIES if t != "opt"))  # every llama-shaped model_type


def normalize_name(name: str) -> str:
    """Accept HF repo ids ("facebook/opt-13b"), any case, and underscores."""
    return name.strip().rsplit("/", 1)[-1].lower().replace("_", "-")


def lookup(kind: str, name: str, table: dict, aliases: dict[str, str]):
    key = normalize_name(name)
    key = aliases.get(key, key)
    try:
        return table[key]
    except KeyError:
        known = ", ".join(sorted(table)) + "; aliases: " + ", ".join(sorted(aliases))
        raise KeyError(f"unknown {kind} {name!r}; known: {known}") from None


def is_config_path(name: str | Path) -> bool:
    """Whether a --model value names a config.json (or its directory) rather than a catalog id."""
    text = str(name)
    return text.endswith(".json") or (os.sep in text and Path(text).is_dir())


def get_model(name: str | Path | ModelSpec) -> ModelSpec:
    """The one model resolver every command uses: a catalog id (``opt-13b``,
    ``facebook/opt-13b``, ...), a path to a Hugging Face ``config.json`` (or to the directory
    holding one), or a ModelSpec, which passes through."""
    if isinstance(name, ModelSpec):
        return name
    if is_config_path(name):
        return load_model_config(name)
    return lookup("model", str(name), MODELS, MODEL_ALIASES)


__all__ = ["ARCHITECTURES", "FAMILIES", "KV_CACHE_DTYPES", "LLAMA_FAMILY", "MLASpec", "MODELS", "MODEL_ALIASES",
           "ModelConfigError", "ModelSpec", "MoESpec", "SERVING_DTYPE_BYTES", "WeightQuant", "get_model",
           "is_config_path", "load_model_config", "lookup", "model_from_config", "normalize_name",
           "with_kv_cache_dtype"]
