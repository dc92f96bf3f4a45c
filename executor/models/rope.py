"""Rotary position embeddings: the frequencies of a config's RoPE kind and the two ways of
applying them (LLaMA's half-split rotate_half, DeepSeek's interleaved pairs)."""

from __future__ import annotations

import math

import torch

# Kinds whose frequencies do not depend on the sequence length (dynamic NTK and longrope do).
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_theta(config) -> float:
    """transformers 5 keeps it in rope_parameters; older configs have config.rope_theta."""
    params = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in params:
        return float(params["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


def rope_kind(config) -> str:
    return (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")


def rope_frequencies(config, dim: int) -> tuple[torch.Tensor, float]:
    """(inv_freq [dim / 2] fp32, the factor cos and sin are scaled by) of the config's RoPE.
    The default from rope_theta; the scaled kinds (linear, Llama 3's llama3, YaRN) from
    transformers' own functions of rope_parameters, so a checkpoint runs with the frequencies its
    model was trained with."""
    kind = rope_kind(config)
    if kind == "default":
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim
        return 1.0 / (rope_theta(config) ** exponents), 1.0
    if kind not in STATIC_ROPE_TYPES:
        raise NotImplementedError(f"RoPE type {kind!r} is not supported ({', '.join(STATIC_ROPE_TYPES)})")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    with torch.device("cpu"):  # models are built on the meta device; the frequencies must be real
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    if inv_freq.shape[0] != dim // 2:
        raise NotImplementedError(f"RoPE {kind!r} gives {inv_freq.shape[0]} frequencies for {dim} rotated dims")
    return inv_freq.float(), float(scaling)


def yarn_softmax_scale(config) -> float:
    """DeepSeek's extra softmax scale under YaRN: mscale(factor, mscale_all_dim) squared."""
    params = getattr(config, "rope_parameters", None) or {}
    all_dim = params.get("mscale_all_dim", 0)
    if rope_kind(config) == "default" or not all_dim or params.get("factor", 1.0) <= 1:
        return 1.0
    return (0.1 * all_dim * math.log(params["factor"]) + 1.0) ** 2


class RotaryEmbedding:
    """cos and sin tables per position, in the half-split layout: frequency i at dims i and
    i + dim/2.

    Not a module: a module buffer would follow model.half() and lose the frequencies' precision.
    """

    def __init__(self, inv_freq: torch.Tensor, scaling: float = 1.0):
        self.inv_freq, self.scaling = inv_freq, scaling

    @classmethod
    def from_config(cls, config, dim: int) -> "RotaryEmbedding":
        return cls(*rope_frequencies(config, dim))

    def cos_sin(self, positions, dtype):
        """[T, 1, dim] each, computed once per forward and shared by every layer. Angles in
        fp32 from the positions: no max-length table to size, and exact."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return (emb.cos() * self.scaling).to(dtype), (emb.sin() * self.scaling).to(dtype)


def apply_rope(x, cos, sin):
    """LLaMA's RoPE: dimension i pairs with i + dim/2 (HF's rotate_half)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def apply_rope_interleaved(x, cos, sin):
    """DeepSeek's RoPE: dims (2i, 2i + 1) rotate together by frequency i (in fp32, as
    transformers' complex multiply). cos/sin are RotaryEmbedding's half-split tables."""
    half = x.shape[-1] // 2
    c, s = cos[..., :half].float(), sin[..., :half].float()
    pairs = x.float().unflatten(-1, (half, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)
