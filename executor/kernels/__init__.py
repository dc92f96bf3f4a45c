"""Kernel entry points. Callers use these names only; each call picks the implementation:

  - the Triton kernels (executor.kernels.triton_ops) for CUDA tensors;
  - the plain torch reference (executor.kernels.reference) otherwise: the CPU execution path.

PAGESIM_KERNELS overrides the choice per call: "triton" forces Triton (with TRITON_INTERPRET=1 it
runs on CPU tensors, which is how the tests exercise it), "reference" (or "torch") forces the
reference. Without triton installed everything falls back to the reference, silently.
Triton is imported lazily, on the first call that needs it, so this import stays cheap.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from executor.kernels import reference

_BACKENDS = ("auto", "triton", "reference", "torch")
_triton_module = None


@functools.cache
def _have_triton() -> bool:
    return importlib.util.find_spec("triton") is not None


def _triton_ops():
    """executor.kernels.triton_ops, or None when triton is not installed."""
    global _triton_module
    if _triton_module is None:
        if not _have_triton():
            return None
        # Not guarded: an error inside our own kernels must not turn into a silent fallback.
        from executor.kernels import triton_ops

        _triton_module = triton_ops
    return _triton_module


def _choice() -> str:
    choice = os.environ.get("PAGESIM_KERNELS", "auto").strip().lower() or "auto"
    if choice not in _BACKENDS:
        raise ValueError(f"PAGESIM_KERNELS={choice!r}: expected one of {_BACKENDS}")
    return "reference" if choice == "torch" else choice


def backend(device=None) -> str:
    """'triton' or 'reference': what a call on tensors of `device` would use (default: CUDA if
    torch sees one, else CPU)."""
    choice = _choice()
    if choice == "reference" or not _have_triton():
        return "reference"
    if choice == "triton":
        return "triton"
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "triton" if str(device).startswith("cuda") else "reference"


def _impl(tensor):
    ops = _triton_ops() if backend(tensor.device) == "triton" else None
    return ops if ops is not None else reference


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float):
    return _impl(query).paged_attention_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale)


def paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale: float):
    return _impl(query).paged_prefill_attention(
        query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    _impl(key_cache).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    if len(key_caches) == 0:
        return
    _impl(key_caches[0]).copy_blocks(key_caches, value_caches, block_mapping)


def swap_blocks(src_cache, dst_cache, block_mapping) -> None:
    # Across devices, the CUDA side decides: the Triton module's swap uses async DMA copies.
    device = dst_cache.device if dst_cache.is_cuda else src_cache.device
    ops = _triton_ops() if backend(device) == "triton" else None
    (ops or reference).swap_blocks(src_cache, dst_cache, block_mapping)


for _fn in (paged_attention_decode, paged_prefill_attention, reshape_and_cache, copy_blocks, swap_blocks):
    _fn.__doc__ = getattr(reference, _fn.__name__).__doc__
