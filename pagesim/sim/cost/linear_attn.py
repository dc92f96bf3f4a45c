"""The work of a model's linear-attention layers (Qwen3-Next's Gated DeltaNet) in one step on one
GPU, beside what layer_ops lists (their in/out projections are ordinary GEMMs there, the conv and
the gated norm elementwise kernels). What is here is the recurrent kernel over the state:

- Decode (vLLM's fused_recurrent_gated_delta_rule, one token a sequence): each layer reads and
  writes each sequence's whole state once (the recurrent state of value heads x d_k x d_v and the
  conv state, ModelSpec.linear_attn.state_bytes_per_layer), and per head computes S <- g S,
  S^T k, S += k (beta (v - S^T k))^T and S^T q: about 7 d_k d_v FLOPs, 7 FLOPs a state element
  read and written (4 bytes at bf16): memory-bound on every GPU of the catalog.
- Prefill (the chunked gated delta rule, Yang, Kautz and Hatamizadeh, "Gated Delta Networks",
  ICLR 2025, after Yang et al., "Parallelizing Linear Transformers with the Delta Rule over
  Sequence Length", NeurIPS 2024; vLLM's vllm/model_executor/layers/fla/ops/chunk.py, chunks of
  C = 64 tokens): per token and head, the intra-chunk products (k k^T, the WY factors
  w = A k and u = A v, q k^T and its product with the new values) take 2 C (3 d_k + 2 d_v)
  FLOPs and the inter-chunk ones (v_new = u - w S, S += k^T v_new, q S) 6 d_k d_v; the triangular
  solve (C^2 / 3 a token) is left out (under 1 %). Linear in tokens. Bytes: q and k (repeated to
  the value heads), v, the output, g and beta per token; the chunk states (written by
  chunk_fwd_h, read by chunk_fwd_o) once every C tokens; each sequence's state read and written once.

The heads are the value heads split over TP (vLLM repeats q and k to the value heads).
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.models import ModelSpec

CHUNK = 64  # tokens a chunk of the chunked gated delta rule (fla's chunk_size / BT)
DECODE_FLOPS_PER_STATE_ELEMENT = 7  # S <- g S (1), S^T k (2), S += k delta^T (2), S^T q (2)


@dataclass(frozen=True, slots=True)
class StateWork:
    """Work of all linear-attention layers of a step on one GPU, per sequence or token."""

    num_layers: int
    decode_bytes_per_seq: float      # state read + written, all layers
    decode_flops_per_seq: float
    prefill_flops_per_token: float
    prefill_bytes_per_token: float   # q, k, v, o, g, beta and the chunk states
    prefill_bytes_per_seq: float     # the state read before and written after the chunk


def state_work(model: ModelSpec, tp: int) -> StateWork | None:
    """The recurrent kernel's work of model's linear-attention layers on one GPU of tp (None: it has none)."""
    la = model.linear_attn
    if la is None:
        return None
    n, d = la.num_layers, la.state_dtype_bytes
    heads, dk, dv = la.num_value_heads // tp, la.key_head_dim, la.value_head_dim
    state = la.state_bytes_per_layer(tp)
    io = (heads * (2 * dk + 2 * dv) + 2 * heads) * model.dtype_bytes  # q, k, v, o; g, beta
    chunk_states = 2 * heads * dk * dv * d / CHUNK
    return StateWork(
        num_layers=n,
        decode_bytes_per_seq=float(n * 2 * state),
        decode_flops_per_seq=float(n * heads * DECODE_FLOPS_PER_STATE_ELEMENT * dk * dv),
        prefill_flops_per_token=float(n * heads * (6 * dk * dv + 2 * CHUNK * (3 * dk + 2 * dv))),
        prefill_bytes_per_token=float(n * (io + chunk_states)),
        prefill_bytes_per_seq=float(n * 2 * state))


def linear_attn_elementwise_bytes(model: ModelSpec, tp: int, tokens: float) -> tuple[float, float]:
    """Bytes of one linear-attention layer's two elementwise kernels for `tokens` tokens on one
    GPU: the causal depthwise conv1d (q, k, v channels read and written; its conv state is in the
    state's bytes) and the gated RMSNorm (the output and the gate z read, the result written)."""
    la, d = model.linear_attn, model.dtype_bytes
    return (2.0 * tokens * la.conv_dim // tp * d, 3.0 * tokens * la.value_dim // tp * d)
