"""The KV cache: per-layer K and V block pools on the device plus a host pool for swapping.

Block ids are the block manager's: device block b of every layer is the same logical block, so
one (src, dst) mapping moves or copies a block in all layers at once.

layer_slots (KV cache groups, executor.kv_layout): layer i uses cache tensor layer_slots[i].
Layers of different block tables share a tensor (a pool block belongs to one table at a time),
so a hybrid model keeps layers_per_block tensors, not one per layer; moves and copies then touch
each tensor once.

kv_shared (MLA's latent cache): each layer has one tensor that the kernels read as both K and V,
so key_caches[i] is value_caches[i] and the pools take half the bytes.
"""

from __future__ import annotations

import torch

from executor import kernels
from executor.kv_layout import cache_layer_tensors


def _mapping(pairs, device) -> torch.Tensor:
    """(src, dst) pairs as a list, a dict {src: dst} or a tensor -> [n, 2] int64 on device."""
    if isinstance(pairs, dict):
        pairs = list(pairs.items())
    if isinstance(pairs, torch.Tensor):
        return pairs.to(device=device, dtype=torch.int64).reshape(-1, 2)
    return torch.tensor(list(pairs), dtype=torch.int64, device=device).reshape(-1, 2)


class CacheEngine:
    def __init__(self, num_layers, num_kv_heads, head_dim, block_size, num_gpu_blocks, num_cpu_blocks, dtype, device,
                 kv_shared: bool = False, layer_slots: list[int] | None = None):
        self.num_layers, self.block_size = num_layers, block_size
        self.layer_slots = list(range(num_layers)) if layer_slots is None else list(layer_slots)
        if len(self.layer_slots) != num_layers:
            raise ValueError(f"layer_slots names {len(self.layer_slots)} layers, the model has {num_layers}")
        num_tensors = max(self.layer_slots, default=-1) + 1
        self.num_gpu_blocks, self.num_cpu_blocks = num_gpu_blocks, num_cpu_blocks
        self.dtype, self.device, self.kv_shared = dtype, torch.device(device), kv_shared
        shape = (block_size, num_kv_heads, head_dim)
        # Zeros rather than empty: a kernel that reads a padded block-table entry must not see NaNs.
        self.key_caches = [torch.zeros(num_gpu_blocks, *shape, dtype=dtype, device=self.device) for _ in range(num_tensors)]
        # Pinned host memory makes device<->host copies DMA transfers; only meaningful with CUDA.
        pin = self.device.type == "cuda"
        self.cpu_key_caches = [torch.zeros(num_cpu_blocks, *shape, dtype=dtype, pin_memory=pin) for _ in range(num_tensors)]
        if kv_shared:
            self.value_caches, self.cpu_value_caches = self.key_caches, self.cpu_key_caches
        else:
            self.value_caches = [torch.zeros(num_gpu_blocks, *shape, dtype=dtype, device=self.device)
                                 for _ in range(num_tensors)]
            self.cpu_value_caches = [torch.zeros(num_cpu_blocks, *shape, dtype=dtype, pin_memory=pin)
                                     for _ in range(num_tensors)]

    @staticmethod
    def pool_bytes(num_layers, num_kv_heads, head_dim, block_size, num_blocks, dtype, kv_shared: bool = False) -> int:
        """Bytes of one pool (K and V, every layer) of num_blocks blocks: what __init__ allocates.
        num_layers: the layer tensors (a hybrid layout's layers_per_block, see executor.kv_layout)."""
        tensors = 1 if kv_shared else 2
        return tensors * num_layers * num_blocks * block_size * num_kv_heads * head_dim * torch.finfo(dtype).bits // 8

    @property
    def kv_caches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """What the models take: one (key_cache, value_cache) per layer."""
        return [(self.key_caches[s], self.value_caches[s]) for s in self.layer_slots]

    def swap_in(self, mapping) -> None:
        """Host -> device: mapping of (cpu_block, gpu_block)."""
        self._swap(self.cpu_key_caches, self.key_caches, mapping)
        if not self.kv_shared:
            self._swap(self.cpu_value_caches, self.value_caches, mapping)

    def swap_out(self, mapping) -> None:
        """Device -> host: mapping of (gpu_block, cpu_block)."""
        self._swap(self.key_caches, self.cpu_key_caches, mapping)
        if not self.kv_shared:
            self._swap(self.value_caches, self.cpu_value_caches, mapping)

    def copy(self, mapping) -> None:
        """Copy-on-write inside the device pool: mapping of (src_block, dst_block)."""
        m = _mapping(mapping, self.device)
        if len(m):
            kernels.copy_blocks(self.key_caches, self.value_caches, m)

    @staticmethod
    def _swap(src_caches, dst_caches, mapping) -> None:
        m = _mapping(mapping, "cpu")
        if len(m):
            for src, dst in zip(src_caches, dst_caches):
                kernels.swap_blocks(src, dst, m)

    @staticmethod
    def bytes_per_block(num_layers, num_kv_heads, head_dim, block_size, dtype, kv_shared: bool = False) -> int:
        """K and V of one block in every layer."""
        itemsize = torch.empty((), dtype=dtype).element_size()
        return (1 if kv_shared else 2) * num_layers * block_size * num_kv_heads * head_dim * itemsize


def model_pool_bytes(lm, block_size: int, num_blocks: int, paged: bool = True) -> int:
    """Bytes of a pool of num_blocks blocks for the loaded model lm, as LLMEngine allocates it:
    its KV layout's layer tensors (executor.kv_layout: a sliding-window or hybrid model keeps
    fewer than one per layer) of K and V, or of the one latent vector of MLA (kv_shared)."""
    tensors = cache_layer_tensors(lm.kv_groups, lm.layer_groups, paged)
    return CacheEngine.pool_bytes(tensors, lm.num_kv_heads, lm.head_dim, block_size, num_blocks, lm.dtype,
                                  kv_shared=lm.kv_shared)


def num_gpu_blocks(block_bytes: int, device, fraction: float = 0.9, num_blocks: int | None = None,
                   budget_bytes: int | None = None, reserve_bytes: int = 0) -> int:
    """How many device blocks fit.

    An explicit num_blocks wins. On CUDA, call after the weights are loaded: the cache may grow
    until the process uses `fraction` of the device's memory, less reserve_bytes kept for
    activations (vLLM's gpu_memory_utilization). On CPU there is no device memory to measure, so
    a byte budget is required and the cache gets `fraction` of it.
    """
    if num_blocks is not None:
        return int(num_blocks)
    device = torch.device(device)
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        available = free - (1.0 - fraction) * total - reserve_bytes
    elif budget_bytes is not None:
        available = fraction * budget_bytes - reserve_bytes
    else:
        raise ValueError("on CPU give num_blocks or budget_bytes: there is no device memory to measure")
    blocks = int(available // block_bytes)
    if blocks <= 0:
        raise ValueError(f"no room for a KV block of {block_bytes} bytes ({available / 2**20:.0f} MiB available)")
    return blocks
