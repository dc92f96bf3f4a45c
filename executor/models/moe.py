"""Mixture-of-experts MLP (Mixtral, Qwen3-MoE, DeepSeek-V2): a linear router picks top-k experts
per token, each expert a SiLU-gated MLP; DeepSeek adds always-on shared experts, group-limited
routing and a scaling of the routed weights. A plain torch path (a loop over the experts the batch touches,
each a pair of matmuls on its tokens), not a fused kernel: clear and exact against transformers;
a fused-MoE Triton kernel (vLLM's fused_moe: tokens sorted by expert, one grouped GEMM) would
replace `FusedExperts.forward` without touching the routing.

Expert weights are stored fused per layer as transformers 5 holds them in memory:
gate_up_proj [E, 2 * I, H] (gate rows first) and down_proj [E, H, I]. Checkpoints store one
tensor per expert and projection (Mixtral's w1/w3/w2, Qwen's gate_proj/up_proj/down_proj); the
loader fills each expert's rows through load_shard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from torch import nn

from executor.models.layers import GatedMLP, activation

# A per-expert checkpoint tensor: <prefix>.experts.<e>.<projection>.weight
EXPERT_TENSOR = re.compile(r"^(?P<module>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>w1|w2|w3|gate_proj|up_proj|down_proj)\.weight$")
# checkpoint projection -> (our parameter, part)
EXPERT_PARTS = {
    "w1": ("gate_up_proj", "gate"), "gate_proj": ("gate_up_proj", "gate"),
    "w3": ("gate_up_proj", "up"), "up_proj": ("gate_up_proj", "up"),
    "w2": ("down_proj", "down"), "down_proj": ("down_proj", "down"),
}


@dataclass(frozen=True)
class MoEConfig:
    num_experts: int
    top_k: int
    intermediate_size: int  # of one expert
    renormalize: bool  # divide the top-k probabilities by their sum (Mixtral always; Qwen: norm_topk_prob)
    weights_in_model_dtype: bool  # Qwen casts the routing weights to the model dtype before scaling; Mixtral keeps fp32
    hidden_act: str = "silu"
    router_fp32: bool = False  # DeepSeek: router logits from fp32 inputs and weights
    routed_scaling: float = 1.0  # DeepSeek's routed_scaling_factor, applied to the top-k weights
    num_groups: int | None = None  # DeepSeek group_limited_greedy: experts in n_group groups,
    topk_groups: int | None = None  # tokens routed within the topk_group groups of best expert
    shared_intermediate_size: int = 0  # DeepSeek's shared experts, as one gated MLP (0 = none)


class FusedExperts(nn.Module):
    def __init__(self, hidden_size: int, moe: MoEConfig):
        super().__init__()
        self.num_experts, self.intermediate_size = moe.num_experts, moe.intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(moe.num_experts, 2 * moe.intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(moe.num_experts, hidden_size, moe.intermediate_size))
        self.act = activation(moe.hidden_act)

    def required_shards(self, param_name: str) -> set:
        parts = ("gate", "up") if param_name == "gate_up_proj" else ("down",)
        return {(e, part) for e in range(self.num_experts) for part in parts}

    def load_shard(self, shard: tuple[int, str], param_name: str, tensor: torch.Tensor) -> None:
        expert, part = shard
        if expert >= self.num_experts:
            raise ValueError(f"expert {expert} of {self.num_experts}")
        param = getattr(self, param_name)[expert]
        rows = {"gate": slice(0, self.intermediate_size), "up": slice(self.intermediate_size, None),
                "down": slice(None)}[part]
        if param[rows].shape != tensor.shape:
            raise ValueError(f"expert {expert} {part}: expected {tuple(param[rows].shape)}, got {tuple(tensor.shape)}")
        param.data[rows].copy_(tensor)

    def forward(self, x, expert_ids, weights):
        """x [T, H]; expert_ids, weights [T, top_k] -> sum over k of weight * expert(x)."""
        out = torch.zeros_like(x)
        for expert in expert_ids.unique().tolist():
            tokens, slot = torch.where(expert_ids == expert)
            gate, up = (x[tokens] @ self.gate_up_proj[expert].T).chunk(2, dim=-1)
            y = (self.act(gate) * up) @ self.down_proj[expert].T
            out.index_add_(0, tokens, (y * weights[tokens, slot, None]).to(out.dtype))
        return out


class SparseMoeBlock(nn.Module):
    """Router (HF name `gate`) and experts. The router's softmax runs in fp32 over all experts,
    then top-k (ties broken as torch.topk does, like transformers)."""

    def __init__(self, hidden_size: int, moe: MoEConfig):
        super().__init__()
        self.moe = moe
        self.gate = nn.Linear(hidden_size, moe.num_experts, bias=False)
        self.experts = FusedExperts(hidden_size, moe)
        if moe.shared_intermediate_size:
            self.shared_experts = GatedMLP(hidden_size, moe.shared_intermediate_size, moe.hidden_act)

    def route(self, x):
        """[T, H] -> (expert ids [T, top_k], weights [T, top_k])."""
        moe = self.moe
        if moe.router_fp32:
            logits = nn.functional.linear(x.float(), self.gate.weight.float())
        else:
            logits = self.gate(x)
        probs = torch.softmax(logits.float(), dim=-1)
        if moe.num_groups:  # keep the experts of the topk_groups groups whose best expert scores highest
            groups = probs.view(-1, moe.num_groups, moe.num_experts // moe.num_groups)
            best = torch.topk(groups.amax(-1), moe.topk_groups, dim=-1).indices
            keep = torch.zeros_like(groups[..., 0], dtype=torch.bool).scatter_(1, best, True)
            probs = groups.masked_fill(~keep[..., None], 0.0).view_as(probs)
        weights, expert_ids = torch.topk(probs, moe.top_k, dim=-1)
        if moe.renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights * moe.routed_scaling
        if moe.weights_in_model_dtype:
            weights = weights.to(x.dtype)
        return expert_ids, weights

    def forward(self, x):
        out = self.experts(x, *self.route(x))
        if self.moe.shared_intermediate_size:
            out = out + self.shared_experts(x)
        return out
