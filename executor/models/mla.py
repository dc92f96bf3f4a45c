"""Multi-head latent attention (DeepSeek-V2) over a paged latent cache.

Per token and layer the cache holds one latent vector of kv_lora_rank + qk_rope_head_dim values:
the normalised KV compression c and the RoPE'd key part k_pe that all heads share. Keys and
values are never materialised per head. With kv_b_proj split into W_UK [H, nope, L] and
W_UV [H, v, L] (L = kv_lora_rank):

  score_h(t, s) = q_nope_h(t) . (W_UK_h c(s)) + q_pe_h(t) . k_pe(s)
                = [W_UK_h^T q_nope_h(t), q_pe_h(t)] . [c(s), k_pe(s)]
  out_h(t)      = W_UV_h sum_s p_h(t, s) c(s)

so attention is multi-query attention (one KV head) of head size L + R over the latent cache,
with the queries absorbed through W_UK and the output expanded through W_UV afterwards: the same
paged kernels as every other model (decode and prefill, Triton or torch), reading the cache
tensor as both K and V. The softmax scale stays that of the original head size,
(qk_nope + qk_rope)^-0.5, times YaRN's mscale squared where the config says. The kernels return
L + R dims per head of which the last R (the k_pe part of the "value") are dropped: an MLA
kernel reading V as the first L dims would save that R / (L + R) of the value work (64 / 576 =
11 % for DeepSeek-V2).
"""

from __future__ import annotations

import torch
from torch import nn

from executor.attention import AttentionMetadata, PagedAttention
from executor.models.layers import RMSNorm
from executor.models.rope import apply_rope_interleaved, yarn_softmax_scale


class MLAAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.nope_dim, self.rope_dim = config.qk_nope_head_dim, config.qk_rope_head_dim
        self.v_dim, self.latent_dim = config.v_head_dim, config.kv_lora_rank
        qk_dim = self.nope_dim + self.rope_dim
        bias = getattr(config, "attention_bias", False)
        hidden, heads = config.hidden_size, self.num_heads
        self.q_lora_rank = getattr(config, "q_lora_rank", None)
        if self.q_lora_rank is None:
            self.q_proj = nn.Linear(hidden, heads * qk_dim, bias=False)
        else:  # low-rank query: down-projection, norm, up-projection
            self.q_a_proj = nn.Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, 1e-6)  # transformers: the class default, not rms_norm_eps
            self.q_b_proj = nn.Linear(self.q_lora_rank, heads * qk_dim, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden, self.latent_dim + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.latent_dim, 1e-6)
        self.kv_b_proj = nn.Linear(self.latent_dim, heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = nn.Linear(heads * self.v_dim, hidden, bias=bias)
        self.attn = PagedAttention(heads, 1, self.latent_dim + self.rope_dim, qk_dim**-0.5 * yarn_softmax_scale(config))

    def forward(self, rope, x, kv_cache, md: AttentionMetadata):
        num_tokens, heads = x.shape[0], self.num_heads
        if self.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(num_tokens, heads, -1).split([self.nope_dim, self.rope_dim], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.latent_dim, self.rope_dim], dim=-1)
        k_pe = apply_rope_interleaved(k_pe[:, None, :], *rope)  # one key part all heads share
        latent = torch.cat([self.kv_a_layernorm(c)[:, None, :], k_pe], dim=-1)  # [T, 1, L + R]
        w_uk, w_uv = self.kv_b_proj.weight.view(heads, self.nope_dim + self.v_dim, self.latent_dim).split(
            [self.nope_dim, self.v_dim], dim=1)
        q_latent = torch.einsum("thn,hnl->thl", q_nope, w_uk)
        query = torch.cat([q_latent, apply_rope_interleaved(q_pe, *rope)], dim=-1)
        out = self.attn(query, latent, latent, kv_cache, md).view(num_tokens, heads, -1)[..., :self.latent_dim]
        return self.o_proj(torch.einsum("thl,hvl->thv", out, w_uv).reshape(num_tokens, heads * self.v_dim))
