"""Model families written for the paged KV cache, keyed by HF model_type."""

from executor.models.families import FAMILIES as LLAMA_STYLE
from executor.models.gemma2 import Gemma2ForCausalLM
from executor.models.llama import LlamaForCausalLM
from executor.models.opt import OPTForCausalLM

MODELS = {"opt": OPTForCausalLM, **{name: LlamaForCausalLM for name in LLAMA_STYLE}, "gemma2": Gemma2ForCausalLM}


def model_class(config):
    if config.model_type not in MODELS:
        raise NotImplementedError(f"model_type {config.model_type!r} is not supported ({', '.join(MODELS)})")
    return MODELS[config.model_type]
