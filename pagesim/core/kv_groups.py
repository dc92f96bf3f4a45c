"""KV cache groups: layers that keep their KV the same way share one block table per sequence.

This module is the contract between a model's description (pagesim.models, which says which
layers use which attention kind) and the KV managers in the core (which keep one block table per
group over one shared pool, as vLLM v1's hybrid KV cache manager does).

Kinds:
- ``full``: every token's K and V stay for the whole sequence (standard attention).
- ``sliding``: only the last ``sliding_window`` tokens are attended to; blocks that fall wholly
  outside the window can be freed as the sequence grows.
- ``mla``: multi-head latent attention (DeepSeek-V2/V3): one compressed latent vector per token
  per layer instead of K and V per head; kept like ``full``.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_GROUP_KINDS = ("full", "sliding", "mla")


@dataclass(frozen=True, slots=True)
class KVGroupSpec:
    """One attention kind and how many layers use it."""

    kind: str
    num_layers: int
    sliding_window: int | None = None  # tokens; only for kind "sliding"

    def __post_init__(self) -> None:
        if self.kind not in KV_GROUP_KINDS:
            raise ValueError(f"KV group kind must be one of {KV_GROUP_KINDS}, got {self.kind!r}")
        if self.num_layers <= 0:
            raise ValueError(f"KV group of kind {self.kind!r}: num_layers must be positive, got {self.num_layers}")
        if (self.kind == "sliding") != (self.sliding_window is not None):
            raise ValueError("a KV group has a sliding_window exactly when its kind is 'sliding'")
        if self.sliding_window is not None and self.sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {self.sliding_window}")
