"""Lightning attention (MiniMax-Text-01 / MiniMax-M1: Qin et al., "Lightning Attention-2", 2024;
MiniMax, "MiniMax-01: Scaling Foundation Models with Lightning Attention", arXiv 2501.08313):
linear-attention layers with a constant-size state per sequence. Held in ModelSpec.linear_attn
beside LinearAttnSpec (Gated DeltaNet), Mamba2Spec and Mamba1Spec, with the same interface
(num_layers, state_bytes_per_layer, linear_params, other_params, gemm_widths,
inner_all_reduce_width, elementwise_bytes; pagesim/sim/cost/linear_attn.py has the kernel).

A layer (transformers' MiniMaxLightningAttention; vLLM's MiniMaxText01LinearAttention,
vllm/model_executor/layers/mamba/linear_attn.py) has H heads of d = head_dim, the softmax layers'
`num_attention_heads` and `head_dim` (W = H d): qkv_proj (hidden -> 3 W) and output_gate
(hidden -> W), column-parallel; out_proj (W -> hidden), row-parallel; an RMSNorm of width W, split
over TP, whose variance vLLM all-reduces over the TP group (one fp32 a token: one more all-reduce
a layer at TP > 1). No conv, no bias; the per-head decay (slope rate) is a buffer, not a weight.

The state per layer is vLLM's MambaStateShapeCalculator.linear_attention_state_shape: H / TP
heads of d x d (the running sum of k^T v), in the model dtype
(MambaStateDtypeCalculator.linear_attention_state_dtype: mamba_cache_dtype "auto"; an fp32 state
is refused there)."""

from __future__ import annotations

from dataclasses import dataclass

FP32 = 4  # vLLM runs the layer's q, k, v, its output and the norm in float32


@dataclass(frozen=True, slots=True)
class LightningAttnSpec:
    num_layers: int
    num_heads: int
    head_dim: int
    state_dtype_bytes: int = 2  # the model dtype (mamba_cache_dtype "auto")

    @property
    def inner_dim(self) -> int:
        """W = heads x head_dim: q, k, v and the gate each, and the norm's width."""
        return self.num_heads * self.head_dim

    @property
    def inner_all_reduce_width(self) -> int:
        """Elements a token of the all-reduce a layer adds at TP > 1: the norm's variance, one fp32
        (ModelSpec.mixer_all_reduces prices it at the model dtype: latency-bound either way)."""
        return 1

    def linear_params(self, hidden: int) -> int:
        """Matmul weights of one layer: qkv_proj, output_gate, out_proj."""
        return hidden * 3 * self.inner_dim + hidden * self.inner_dim + self.inner_dim * hidden

    @property
    def other_params(self) -> int:
        """One layer's non-matmul parameters: the norm's weight."""
        return self.inner_dim

    def gemm_widths(self, hidden: int, tp: int) -> list[tuple[str, int, int]]:
        """(op, k, n) of one layer's GEMMs on one GPU of tp."""
        w = self.inner_dim // tp
        return [("la_qkv_proj", hidden, 3 * w), ("la_output_gate", hidden, w), ("la_out_proj", w, hidden)]

    def elementwise_bytes(self, tp: int, tokens: float, dtype_bytes: int) -> tuple[float, ...]:
        """Bytes of a layer's elementwise kernels for `tokens` tokens on one GPU (vLLM runs them
        eagerly: the layer is a custom op outside torch.compile): qkv cast to fp32, its SiLU, the
        copies of q, k, v to heads-first, the norm (variance pass; normalize and weight passes),
        the gate's sigmoid, its product with the norm's output, the cast back."""
        w, a = tokens * self.inner_dim / tp, dtype_bytes
        return (3 * w * (a + FP32), 3 * w * 2 * FP32, 3 * w * 2 * FP32,
                w * FP32 + 2 * w * 2 * FP32, 2 * w * a, w * (a + 2 * FP32), w * (FP32 + a))

    def state_bytes_per_layer(self, tp: int = 1) -> int:
        """One sequence's state in one layer, on one GPU of tp: H / TP heads of d x d."""
        return self.num_heads // tp * self.head_dim * self.head_dim * self.state_dtype_bytes
