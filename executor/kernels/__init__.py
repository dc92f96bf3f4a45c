"""Kernel entry points. Callers use these names only; each call picks the implementation:

  - the Triton kernels (executor.kernels.triton_ops) for CUDA tensors;
  - the vectorized torch kernels (executor.kernels.torch_ops) otherwise: the CPU execution path.

PAGESIM_KERNELS overrides the choice per call: "triton" forces Triton (with TRITON_INTERPRET=1 it
runs on CPU tensors, which is how the tests exercise it), "torch" forces torch_ops (on any
device), "reference" forces the plain per-sequence references in executor.kernels.reference (the
tests' oracle). Without triton installed, "auto" and "triton" fall back to torch_ops, silently.
Triton is imported lazily, on the first call that needs it, so this import stays cheap.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from executor.kernels import reference, torch_ops

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
    return choice


def backend(device=None) -> str:
    """'triton', 'torch' or 'reference': what a call on tensors of `device` would use (default:
    CUDA if torch sees one, else CPU)."""
    choice = _choice()
    if choice in ("reference", "torch"):
        return choice
    if not _have_triton():
        return "torch"
    if choice == "triton":
        return "triton"
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "triton" if str(device).startswith("cuda") else "torch"


_MODULES = {"torch": torch_ops, "reference": reference}


def _ops_for(device):
    name = backend(device)
    return _triton_ops() if name == "triton" else _MODULES[name]


def _impl(tensor):
    return _ops_for(tensor.device)


def paged_attention_decode(query, key_cache, value_cache, block_tables, context_lens, scale: float,
                           sliding_window: int | None = None, softcap: float | None = None):
    return _impl(query).paged_attention_decode(
        query, key_cache, value_cache, block_tables, context_lens, scale, sliding_window, softcap)


def paged_prefill_attention(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale: float,
                            sliding_window: int | None = None, softcap: float | None = None):
    return _impl(query).paged_prefill_attention(
        query, key_cache, value_cache, block_tables, query_start_loc, context_lens, scale, sliding_window, softcap)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    _impl(key_cache).reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)


def copy_blocks(key_caches, value_caches, block_mapping) -> None:
    if len(key_caches) == 0:
        return
    _impl(key_caches[0]).copy_blocks(key_caches, value_caches, block_mapping)


def swap_blocks(src_cache, dst_cache, block_mapping) -> None:
    # Across devices, the CUDA side decides: the Triton module's swap uses async DMA copies.
    device = dst_cache.device if dst_cache.is_cuda else src_cache.device
    _ops_for(device).swap_blocks(src_cache, dst_cache, block_mapping)


for _fn in (paged_attention_decode, paged_prefill_attention, reshape_and_cache, copy_blocks, swap_blocks):
    _fn.__doc__ = getattr(reference, _fn.__name__).__doc__
