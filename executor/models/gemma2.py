"""Gemma 2 on the LLaMA-style decoder: what it changes.

- RMSNorm scales by (1 + weight), all in fp32 (its weights are stored around 0);
- four norms per layer: the attention and the MLP outputs are normalised again before their
  residual add ("sandwich" norms);
- the token embeddings are scaled by sqrt(hidden_size) (in the model's dtype);
- a GeLU-tanh gated MLP (hidden_activation);
- attention: layers alternate a sliding window and full attention (layer_types: two KV cache
  groups), the softmax scale is query_pre_attn_scalar^-0.5 and the scores are soft-capped at
  attn_logit_softcapping (c tanh(s / c), in the kernels);
- the logits are soft-capped at final_logit_softcapping.
"""

from __future__ import annotations

import torch
from torch import nn

from executor.models.families import DecoderSpec
from executor.models.layers import GatedMLP
from executor.models.llama import LlamaAttention, LlamaForCausalLM, LlamaModel


class GemmaRMSNorm(nn.Module):
    init_value = 0.0

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).to(x.dtype)


class Gemma2DecoderLayer(nn.Module):
    def __init__(self, config, spec: DecoderSpec, layer: int, num_heads, num_kv_heads, head_dim):
        super().__init__()
        self.self_attn = LlamaAttention(config, spec, layer, num_heads, num_kv_heads, head_dim)
        act = getattr(config, "hidden_activation", None) or config.hidden_act
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size, act)
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm, self.post_attention_layernorm = GemmaRMSNorm(hidden, eps), GemmaRMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = GemmaRMSNorm(hidden, eps)
        self.post_feedforward_layernorm = GemmaRMSNorm(hidden, eps)

    def forward(self, rope, x, kv_cache, md):
        x = x + self.post_attention_layernorm(self.self_attn(rope, self.input_layernorm(x), kv_cache, md))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class Gemma2Model(LlamaModel):
    layer_class, norm_class = Gemma2DecoderLayer, GemmaRMSNorm

    def embed(self, input_ids):
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(x.shape[-1] ** 0.5, dtype=x.dtype)


class Gemma2ForCausalLM(LlamaForCausalLM):
    model_class = Gemma2Model

    def __init__(self, config):
        super().__init__(config)
        self.final_softcap = getattr(config, "final_logit_softcapping", None)

    def compute_logits(self, hidden, indices=None):
        logits = super().compute_logits(hidden, indices)
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits
