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

Mamba2 layers (pagesim.models.mamba2: Granite 4.0-H) take the same terms with their own kernel:
- Decode (vLLM's selective_state_update): each layer reads and writes the state once (conv state
  and the SSM state of H x P x N), h <- exp(dt A) h + dt x B^T and y = h C: 5 FLOPs a state element.
- Prefill (the SSD chunked scan: Dao and Gu, "Transformers are SSMs", ICML 2024, section 6; vLLM's
  vllm/model_executor/layers/mamba/ops/ssd_combined.py, chunks of Q = mamba_chunk_size tokens):
  per token, C B^T within the chunk per group (2 Q N), its masked product with x per head (2 Q P),
  the chunk state B^T x and the state's output C h per head (2 P N each): G 2QN + H (2QP + 4PN),
  the causal mask's idle half of the tiles counted (the kernels compute whole tiles). Bytes: x, y,
  B, C and dt a token, the chunk states (H P N, written and read) once every Q tokens, and each
  sequence's state read and written once.

Lightning attention layers (pagesim.models.lightning: MiniMax-Text-01 / M1), a roofline too:
- Decode (vLLM's _linear_attn_decode_kernel, vllm/model_executor/layers/lightning_attn.py): each
  layer reads and writes each sequence's state once (H / TP heads of d x d), and per state element
  computes k v^T (1), adds the decayed old state (2) and q S, multiply and sum (2): 5 FLOPs.
- Prefill (vLLM's lightning_attention, blocks of B = 256 tokens, sub-blocks of c = 32 in the
  diagonal kernel): per token and head, the diagonal blocks' q k^T and its product with v over the
  causal sub-blocks, (B + c) / 2 keys on average, 4 d a key; the block states k^T v and the
  off-diagonal q S, 2 d^2 each: 2 d (B + c) + 4 d^2 FLOPs. Bytes, all fp32 as vLLM casts them: q,
  k and v read twice (diagonal and block-state kernels), the output written once and read and
  written again (off-diagonal kernel); the block states (d x d fp32) written, read and written by
  the reduction, read by the off-diagonal kernel's 4 sub-blocks and copied out by the concatenation
  (9 passes every B tokens); each sequence's state read and written once (the clone of it before
  the kernel left out).

Mamba v1 layers (pagesim.models.mamba1: Jamba) likewise, a roofline where nothing is measured:
- Decode (vLLM's selective_state_update): each layer reads and writes the state once (the conv
  state and the SSM state of I x N), per state element dA = exp(dt A) (2), h <- dA h + (dt x) B
  (3) and y = h C (2): 7 FLOPs, the exp per element (A is I x N, not one a head as in Mamba2).
- Prefill (vLLM's selective_scan_fn, the selective scan of Gu and Dao, "Mamba", 2023, section 3.3):
  a scan along the tokens, the same 7 FLOPs a state element a token (CUDA cores, no tensor-core
  chunks): linear in tokens. Bytes: x, the gate z, dt (after dt_proj) and y (I / TP each), B and
  C (N each) a token; no chunk states go to HBM; each sequence's state read and written once.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.models import ModelSpec
from pagesim.models.lightning import FP32, LightningAttnSpec
from pagesim.models.mamba1 import Mamba1Spec
from pagesim.models.mamba2 import Mamba2Spec

CHUNK = 64  # tokens a chunk of the chunked gated delta rule (fla's chunk_size / BT)
DECODE_FLOPS_PER_STATE_ELEMENT = 7  # S <- g S (1), S^T k (2), S += k delta^T (2), S^T q (2)
MAMBA2_DECODE_FLOPS_PER_STATE_ELEMENT = 5  # h <- exp(dt A) h + (dt x) B^T (3), y = h C (2)
MAMBA1_FLOPS_PER_STATE_ELEMENT = 7  # dA = exp(dt A) (2), h <- dA h + (dt x) B (3), y = h C (2)
LIGHTNING_DECODE_FLOPS_PER_STATE_ELEMENT = 5  # k v^T (1), + ratio S (2), q S and its sum (2)
LIGHTNING_BLOCK, LIGHTNING_SUB_BLOCK = 256, 32  # vLLM lightning_attention's BLOCK and the diagonal kernel's CBLOCK
LIGHTNING_IO_PASSES = 9  # q, k, v twice each; the output written, then read and written (a head dim each, fp32)
LIGHTNING_BLOCK_STATE_PASSES = 9  # written; reduced (read, written); read by 4 sub-blocks; copied (read, written)


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
    n, state = la.num_layers, la.state_bytes_per_layer(tp)
    # per layer: decode FLOPs a sequence, prefill FLOPs a token, prefill bytes a token
    kernel = _mamba2 if isinstance(la, Mamba2Spec) else _mamba1 if isinstance(la, Mamba1Spec) \
        else _lightning if isinstance(la, LightningAttnSpec) else _gated_delta
    flops_dec, flops_pre, bytes_pre = kernel(la, tp, model.dtype_bytes)
    return StateWork(
        num_layers=n,
        decode_bytes_per_seq=float(n * 2 * state),
        decode_flops_per_seq=float(n * flops_dec),
        prefill_flops_per_token=float(n * flops_pre),
        prefill_bytes_per_token=float(n * bytes_pre),
        prefill_bytes_per_seq=float(n * 2 * state))


def _gated_delta(la, tp: int, act: int) -> tuple[int, int, float]:
    d = la.state_dtype_bytes
    heads, dk, dv = la.num_value_heads // tp, la.key_head_dim, la.value_head_dim
    io = (heads * (2 * dk + 2 * dv) + 2 * heads) * act  # q, k, v, o; g, beta
    chunk_states = 2 * heads * dk * dv * d / CHUNK
    return (heads * DECODE_FLOPS_PER_STATE_ELEMENT * dk * dv, heads * (6 * dk * dv + 2 * CHUNK * (3 * dk + 2 * dv)),
            io + chunk_states)


def _mamba2(la: Mamba2Spec, tp: int, act: int) -> tuple[int, int, float]:
    """A Mamba2 layer: decode is selective_state_update (h <- exp(dt A) h + dt x B^T: 3 FLOPs a
    state element; y = h C: 2), prefill the SSD chunked scan (module docstring)."""
    heads, p, ns, q, g = la.num_heads // tp, la.head_dim, la.state_size, la.chunk_size, la.groups_per_gpu(tp)
    prefill = g * 2 * q * ns + heads * (2 * q * p + 4 * p * ns)
    io = (2 * heads * p + 2 * g * ns + heads) * act  # x and y; B and C; dt
    chunk_states = 2 * heads * p * ns * la.ssm_dtype_bytes / q
    return heads * MAMBA2_DECODE_FLOPS_PER_STATE_ELEMENT * p * ns, prefill, io + chunk_states


def _mamba1(la: Mamba1Spec, tp: int, act: int) -> tuple[int, int, float]:
    """A Mamba v1 layer: decode is selective_state_update, prefill selective_scan_fn, 7 FLOPs a
    state element each (module docstring)."""
    inner = la.intermediate // tp
    flops = MAMBA1_FLOPS_PER_STATE_ELEMENT * inner * la.state_size
    return flops, flops, float((4 * inner + 2 * la.state_size) * act)  # x, z, dt, y; B, C


def _lightning(la: LightningAttnSpec, tp: int, act: int) -> tuple[int, int, float]:
    """A lightning attention layer: decode is _linear_attn_decode_kernel, prefill the blocked
    lightning_attention (module docstring)."""
    heads, d = la.num_heads // tp, la.head_dim
    prefill = heads * (2 * d * (LIGHTNING_BLOCK + LIGHTNING_SUB_BLOCK) + 4 * d * d)
    io = heads * LIGHTNING_IO_PASSES * d * FP32
    block_states = heads * LIGHTNING_BLOCK_STATE_PASSES * d * d * FP32 / LIGHTNING_BLOCK
    return heads * LIGHTNING_DECODE_FLOPS_PER_STATE_ELEMENT * d * d, prefill, io + block_states


def linear_attn_elementwise_bytes(model: ModelSpec, tp: int, tokens: float) -> tuple[float, ...]:
    """Bytes of one linear-attention layer's two elementwise kernels for `tokens` tokens on one
    GPU: the causal depthwise conv1d (q, k, v channels read and written; its conv state is in the
    state's bytes) and the gated RMSNorm (the output and the gate z read, the result written).
    A Mamba v1 layer: its conv and its dt, B and C RMSNorms (Mamba1Spec.elementwise_bytes); a
    lightning attention layer its casts, SiLU, copies, norm and gate (LightningAttnSpec.elementwise_bytes)."""
    la, d = model.linear_attn, model.dtype_bytes
    if isinstance(la, (Mamba1Spec, LightningAttnSpec)):
        return la.elementwise_bytes(tp, tokens, d)
    return (2.0 * tokens * la.conv_dim_per_gpu(tp) * d, 3.0 * tokens * la.value_dim // tp * d)
