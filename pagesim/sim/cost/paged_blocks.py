"""What the block size costs paged decode attention: the block-table gather and the partial last block.

Source: the vLLM paper (Kwon et al., SOSP 2023, arXiv 2309.06180), Fig. 18(a) and section 7.1: on
an A100, vLLM's paged-attention kernel at block size 16 runs 20-26 % slower than FasterTransformer's
contiguous kernel over the same K/V (batch 8 and 32, contexts 64-256), which the paper puts down to
accessing the block table, extra branches and variable sequence lengths. That is the only number the
paper gives for the kernel itself (its block-size sweep, Fig. 18(b), is end to end), and the only
one this module is fitted to.

Model, per layer, one decoding sequence of L context tokens at block size b:

    t = t_tok * (b * ceil(L / b)) + t_blk * ceil(L / b)

- t_tok: reading one token slot's K and V; the kernel loads every slot of the blocks it visits
  and masks the tail, so the partial last block costs its b - (L mod b) empty slots too;
- t_blk = k * t_tok: one block's gather (its block-table entry and a new run of loads). It is
  paid per block per KV head per sequence, as t_tok is per slot per KV head, so the ratio k (in
  slot-reads) does not depend on the model's head counts.

With L uniform modulo b, the mean of b * ceil(L / b) is L + (b - 1) / 2, so the mean step is

    t(b) = t_tok * (1 + k / b) * (L + (b - 1) / 2).

Fit (one parameter): the paper's contexts are multiples of 16, so at b = 16 the paged kernel does
t_tok * (1 + k / 16) * L against the contiguous t_tok * L: k = 16 * overhead = 16 * 0.23 (the
band's middle) = 3.68 slot-reads per block. Assumed: the whole overhead is per block (an upper
bound on the gather; the paper names no split between per-block and per-token causes).

The cost models' decode terms are priced at block 16 (the calibrated model's measurements were
taken at block 16; the roofline's kv_read_efficiency is the paper's block-16 kernel), so they hold
t_tok * (1 + k / 16) per context token and the block-16 partial block per sequence already. At
another block size this module gives (``decode_terms``) the per-context-token cost scaled by
(1 + k / b) / (1 + k / 16) and the change of the partial-block reads per sequence,
t_tok * ((1 + k / b) (b - 1) / 2 - (1 + k / 16) * 15 / 2); at block 16 nothing changes.

Where it applies (``block_term``): A100 GPUs (the paper's), in the calibrated and roofline
models. Not on other GPUs (no measurement says how their kernels trade blocks against slots) and
not for the current-vLLM engine profiles (their FlashAttention / FlashInfer backends are not the
paper's kernel, and vLLM 0.15's runs all use block 16): there block size acts on KV memory and
swap/copy traffic only, and the reports say so.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.sim.specs import GPUSpec

REFERENCE_BLOCK = 16             # the block size the cost models' decode terms are priced at
PAPER_OVERHEAD_AT_16 = 0.23      # Fig. 18(a): 20-26 % over the contiguous kernel, its middle
PAPER_GPUS = frozenset({"a100-40gb", "a100-80gb"})  # where the paper measured its kernel
SOURCE = ("vLLM paper (Kwon et al., SOSP 2023) Fig. 18(a) and section 7.1: the paged kernel at block 16 is "
          "20-26% slower than FasterTransformer's contiguous one on an A100")


@dataclass(frozen=True)
class PagedBlockTerm:
    """The block-table gather and partial-last-block reads of paged decode attention."""

    gather_slots_per_block: float = REFERENCE_BLOCK * PAPER_OVERHEAD_AT_16  # k: a block's gather, in slot-reads
    reference_block: int = REFERENCE_BLOCK

    def slot_factor(self, block_size: int) -> float:
        """Cost of one context slot at `block_size`, relative to one at the reference block."""
        k = self.gather_slots_per_block
        return (1 + k / block_size) / (1 + k / self.reference_block)

    def partial_block_slots(self, block_size: int) -> float:
        """Mean extra reads per sequence (in reference-block slot costs) of the partial last block
        at `block_size` over those at the reference block: (1 + k/b)(b - 1)/2 over (1 + k/16) 15/2."""
        return (self.slot_factor(block_size) * (block_size - 1) - (self.reference_block - 1)) / 2

    def decode_terms(self, per_seq: float, per_ctx: float, per_window_ctx: float,
                     block_size: int) -> tuple[float, float, float]:
        """A cost model's decode attention (seconds per sequence, per context token of the full
        layers, per context token of the sliding layers), priced at the reference block, at
        `block_size`: the per-token terms scaled by slot_factor, the partial block's change added
        per sequence (over all layers: every layer reads its last block)."""
        f = self.slot_factor(block_size)
        return (per_seq + self.partial_block_slots(block_size) * (per_ctx + per_window_ctx),
                per_ctx * f, per_window_ctx * f)


PAPER_BLOCK_TERM = PagedBlockTerm()


def block_term(gpu: GPUSpec) -> PagedBlockTerm | None:
    """The block term where its source applies (the paper's A100s), else None: block size not modelled
    in the step time."""
    return PAPER_BLOCK_TERM if gpu.name in PAPER_GPUS else None


def not_modelled_reason(gpu_name: str, cost_model: str = "calibrated", engine_profile: str | None = None) -> str | None:
    """Why block size is not in the step time of this GPU under this cost model (and, for the
    calibrated model, this current-vLLM engine profile; None: the paper-era engine), or None where
    it is (the calibrated model under the paper-era engine, and the roofline, on the paper's A100s)."""
    if cost_model not in ("calibrated", "roofline"):
        return f"the {cost_model} cost model has no block-size term"
    if engine_profile and cost_model == "calibrated":
        return (f"engine profile {engine_profile}: its attention backends are not the paper's kernel and no "
                "measurement prices their blocks")
    if gpu_name not in PAPER_GPUS:
        return "the one kernel measurement by block size (the paper's Fig. 18a) is of an A100"
    return None
