"""KV-cache writes and block copies in Triton, same contracts as the reference versions.

reshape_and_cache: one program per new token copies all its KV heads into its slot.
copy_blocks: one launch per layer over (pair, chunk), copying key and value blocks together.
swap_blocks: device <-> host moves are DMA copies, not kernels (see there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from executor.kernels import reference

COPY_CHUNK = 1024  # elements per copy_blocks program


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kcb, stride_kct, stride_kch,
    stride_vcb, stride_vct, stride_vch,
    NUM_KV_HEADS: tl.constexpr, H_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + tok).to(tl.int64)
    # An early return, not a scalar bool in the mask: the interpreter rejects the latter.
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    heads = tl.arange(0, H_PAD)
    dims = tl.arange(0, D_PAD)
    mask = (heads[:, None] < NUM_KV_HEADS) & (dims[None, :] < HEAD_DIM)
    src = heads[:, None] * stride_kh + dims[None, :]
    k = tl.load(key_ptr + tok * stride_kt + src, mask=mask)
    dst = block * stride_kcb + offset * stride_kct + heads[:, None] * stride_kch + dims[None, :]
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    src = heads[:, None] * stride_vh + dims[None, :]
    v = tl.load(value_ptr + tok * stride_vt + src, mask=mask)
    dst = block * stride_vcb + offset * stride_vct + heads[:, None] * stride_vch + dims[None, :]
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Same contract as reference.reshape_and_cache."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    key = key if key.stride(-1) == 1 else key.contiguous()
    value = value if value.stride(-1) == 1 else value.contiguous()
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1
    _reshape_and_cache_kernel[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping.contiguous(),
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        NUM_KV_HEADS=num_kv_heads, H_PAD=triton.next_power_of_2(num_kv_heads),
        HEAD_DIM=head_dim, D_PAD=triton.next_power_of_2(head_dim),
        BLOCK_SIZE=key_cache.shape[1],
    )


@triton.jit
def _copy_blocks_kernel(k_cache_ptr, v_cache_ptr, mapping_ptr, block_numel,
                        CHUNK: tl.constexpr):
    pair = tl.program_id(0)
    chunk = tl.program_id(1)
    src = tl.load(mapping_ptr + 2 * pair).to(tl.int64)
    dst = tl.load(mapping_ptr + 2 * pair + 1).to(tl.int64)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < block_numel
    k = tl.load(k_cache_ptr + src * block_numel + offs, mask=mask)
    tl.store(k_cache_ptr + dst * block_numel + offs, k, mask=mask)
    v = tl.load(v_cache_ptr + src * block_numel + offs, mask=mask)
    tl.store(v_cache_ptr + dst * block_numel + offs, v, mask=mask)


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    """Same contract as reference.copy_blocks. Pairs are assumed independent (no block is both a
    source and a destination), which copy-on-write guarantees: programs run in any order."""
    if len(block_mapping) == 0:
        return
    for k_cache, v_cache in zip(key_caches, value_caches):
        if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
            reference.copy_blocks([k_cache], [v_cache], block_mapping)
            continue
        mapping = block_mapping.to(device=k_cache.device, dtype=torch.int64).contiguous()
        block_numel = k_cache[0].numel()
        grid = (mapping.shape[0], triton.cdiv(block_numel, COPY_CHUNK))
        _copy_blocks_kernel[grid](k_cache, v_cache, mapping, block_numel, CHUNK=COPY_CHUNK)


def swap_blocks(src_cache, dst_cache, block_mapping) -> None:
    """Same contract as reference.swap_blocks. Across devices each block is one DMA copy,
    non_blocking when the host side is pinned, so swaps overlap with compute. Everything is
    ordered on the current CUDA stream; the CPU must synchronise that stream before it reads a
    host cache that a swap-out wrote."""
    if len(block_mapping) == 0:
        return
    if src_cache.device == dst_cache.device:
        reference.swap_blocks(src_cache, dst_cache, block_mapping)
        return
    host = dst_cache if dst_cache.device.type == "cpu" else src_cache
    non_blocking = host.is_pinned()
    for src, dst in block_mapping.tolist():
        dst_cache[dst].copy_(src_cache[src], non_blocking=non_blocking)
