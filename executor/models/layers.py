"""Pieces both model families share."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# HF's hidden_act / activation_function names for the activations these families use.
ACTIVATIONS = {
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


def activation(name: str):
    if name not in ACTIVATIONS:
        raise NotImplementedError(f"activation {name!r} is not supported")
    return ACTIVATIONS[name]


class RMSNorm(nn.Module):
    init_value = 1.0  # the weight of a freshly initialised model (random_init)

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # The mean square in fp16/bf16 loses too much; compute in fp32 as the reference does.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class MergedLinear(nn.Linear):
    """Several projections of the same input as one matmul (q/k/v, gate/up): one kernel launch
    instead of several. Checkpoints store them separately, so the loader fills each shard's rows
    through load_shard."""

    def __init__(self, in_features: int, shards: dict[str, int], bias: bool):
        self.shards, offset = {}, 0
        for name, size in shards.items():
            self.shards[name] = (offset, size)
            offset += size
        super().__init__(in_features, offset, bias=bias)

    def load_shard(self, shard: str, param_name: str, tensor: torch.Tensor) -> None:
        offset, size = self.shards[shard]
        param = getattr(self, param_name)
        if tensor.shape[0] != size or tensor.shape[1:] != param.shape[1:]:
            raise ValueError(f"shard {shard}.{param_name}: expected {size} rows, got {tuple(tensor.shape)}")
        param.data[offset : offset + size].copy_(tensor)

    def split(self, out: torch.Tensor) -> list[torch.Tensor]:
        return list(out.split([size for _, size in self.shards.values()], dim=-1))


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up as one matmul: LLaMA's MLP, one MoE expert's
    shape, DeepSeek's shared experts."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str, bias: bool = False):
        super().__init__()
        self.gate_up_proj = MergedLinear(hidden_size, {"gate": intermediate_size, "up": intermediate_size}, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act = activation(hidden_act)

    def forward(self, x):
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))
        return self.down_proj(self.act(gate) * up)
