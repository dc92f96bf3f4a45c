"""Where each layer of a model keeps its KV in the core's KV layout (pagesim.core.kv_groups).

The core cuts each attention kind's layers into block tables of layers_per_block layers; a pool
block handed to table t holds block_size tokens of t's layers. In the executor this means:
- layer i reads and writes the block table of its core table, table[i], so its sliding-window
  blocks can really be freed (HybridKVManager NULLs them) while the full tables keep theirs;
- layer i's cache tensor is the one of its place inside its table, slot[i]: tables never share
  a pool block, so the layers at the same place of different tables share one tensor of
  num_gpu_blocks blocks, as vLLM v1 shares a KV tensor between groups. The cache then holds
  layers_per_block layer tensors, the bytes the core's pool of equal blocks counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.core.kv_groups import KVGroupSpec, KVLayout


@dataclass(frozen=True)
class LayerPlacement:
    layout: KVLayout
    table: tuple[int, ...]  # per layer: index of its table in layout.tables
    slot: tuple[int, ...]  # per layer: its place among its table's layers (its cache tensor)

    @property
    def is_plain(self) -> bool:
        return self.layout.is_plain


def place_layers(kv_groups: list[KVGroupSpec], layer_groups: list[int]) -> LayerPlacement:
    """kv_groups: the model's groups (LoadedModel.kv_groups); layer_groups: each layer's group.
    A layer's rank among the layers of its kind and window picks its table and slot, as
    KVLayout.of numbers them (first_layer counts in that order)."""
    layout = KVLayout.of(kv_groups)
    per_block = layout.layers_per_block
    index = {(t.kind, t.sliding_window, t.first_layer): i for i, t in enumerate(layout.tables)}
    seen: dict[tuple[str, int | None], int] = {}
    tables, slots = [], []
    for group in layer_groups:
        spec = kv_groups[group]
        key = (spec.kind, spec.sliding_window)
        rank = seen.get(key, 0)
        seen[key] = rank + 1
        tables.append(index[(*key, rank - rank % per_block)])
        slots.append(rank % per_block)
    if layout.is_plain:  # one table of every layer: each layer its own tensor, as always
        slots = list(range(len(layer_groups)))
    return LayerPlacement(layout, tuple(tables), tuple(slots))


def cache_layer_tensors(kv_groups: list[KVGroupSpec], layer_groups: list[int], paged: bool = True) -> int:
    """Layer tensors the engine's CacheEngine keeps for this model: one per place in a table
    where the model runs on the hybrid manager (paged policies, a layout that is not plain), else
    one per layer (LLMEngine's rule: the reservation baselines keep every layer's KV)."""
    placement = place_layers(kv_groups, layer_groups)
    if placement.is_plain or not paged:
        return len(layer_groups)
    return max(placement.slot) + 1
