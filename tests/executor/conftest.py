"""Shared by the executor tests: a small random-weight transformers model and the executor's
model on the same weights."""

import pytest
import torch
from transformers import LlamaForCausalLM, OPTForCausalLM

from executor.models.loader import from_hf_model, tiny_config


@pytest.fixture(scope="session")
def tiny_hf():
    """tiny_hf(name) -> (transformers model, LoadedModel with its weights); name is opt-tiny or
    llama-tiny (GQA). Weights drawn after torch.manual_seed(0), so every test file sees the same."""

    def build(name: str):
        torch.manual_seed(0)
        cls = OPTForCausalLM if name == "opt-tiny" else LlamaForCausalLM
        hf = cls(tiny_config(name)).eval()
        return hf, from_hf_model(hf)

    return build
