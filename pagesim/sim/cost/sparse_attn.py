"""DeepSeek Sparse Attention (DeepSeek-V3.2's `mla.indexer`): what a step's attention does on one
GPU, and its price from a model's per-byte and per-FLOP rates (docs/calibration.md, "Modern models").

Each layer's lightning indexer scores every cached token for each query: it reads each context
token's indexer key (head_dim fp8 values and their fp32 scales, IndexerSpec.cache_bytes) and
computes q . k for each of its heads (2 x heads x head_dim FLOPs a (query, token) pair, in FP8;
replicated over TP, so every GPU does all of it). The sparse MLA then attends to the top
`index_topk` tokens only, in the latent space (vLLM's FlashMLA sparse kernels, prefill and decode
alike): per selected token its latent is read (ModelSpec.mla.cache_bytes less the indexer's key)
and this GPU's heads compute 2 x (latent + kv_lora_rank) FLOPs (ModelSpec.mla_decode_flops_per_pair).

A step's shape carries only sums, so the cap is the sliding window's bound (run_times.windowed_context_durations):
decode selects min(context, sequences x topk) tokens, prefill min(pairs, new tokens x topk) pairs;
the indexer's terms grow with the whole context and every pair. The cost models carry the
selected part as their windowed terms with the window topk.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.models import ModelSpec


@dataclass(frozen=True, slots=True)
class SparseAttnWork:
    """All layers' sparse-attention work on one GPU of tp, per context token or (query, key) pair."""

    topk: int
    indexer_bytes_per_ctx: float     # indexer keys read, per context token (decode)
    indexer_flops_per_pair: float    # FP8
    latent_bytes_per_selected: float  # latent read per selected token (decode)
    latent_flops_per_pair: float     # FP16/BF16, per selected (query, key) pair

    def terms(self, s_per_byte: float, s_per_flop: float, fp8_flop_scale: float) -> tuple[float, float, float, float]:
        """(decode seconds per context token, per selected context token, prefill seconds per pair,
        per selected pair) at the given seconds a byte and a (16-bit) FLOP; the indexer's FP8 FLOPs at
        fp8_flop_scale times that (fp16 / fp8 FLOP/s). A decode read pays the larger of its bytes
        and its FLOPs, as MLA decode does."""
        s_per_fp8_flop = s_per_flop * fp8_flop_scale
        return (max(self.indexer_bytes_per_ctx * s_per_byte, self.indexer_flops_per_pair * s_per_fp8_flop),
                max(self.latent_bytes_per_selected * s_per_byte, self.latent_flops_per_pair * s_per_flop),
                self.indexer_flops_per_pair * s_per_fp8_flop, self.latent_flops_per_pair * s_per_flop)


def sparse_attn_work(model: ModelSpec, tp: int) -> SparseAttnWork | None:
    """The work of model's sparse attention on one GPU of tp (None: dense attention)."""
    indexer = model.mla.indexer if model.mla is not None else None
    if indexer is None:
        return None
    layers = model.num_layers
    latent = model.kv_bytes_per_token_per_layer_of("mla") - indexer.cache_bytes
    return SparseAttnWork(indexer.topk, float(layers * indexer.cache_bytes), float(layers * indexer.flops_per_pair),
                          float(layers * latent), model.mla_decode_flops_per_pair / tp)
