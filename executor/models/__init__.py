"""Model families written for the paged KV cache, keyed by HF model_type."""

from executor.models.llama import LlamaForCausalLM
from executor.models.opt import OPTForCausalLM

MODELS = {"opt": OPTForCausalLM, "llama": LlamaForCausalLM}


def model_class(config):
    if config.model_type not in MODELS:
        raise NotImplementedError(f"model_type {config.model_type!r} is not supported ({', '.join(MODELS)})")
    return MODELS[config.model_type]
