"""Mamba v1 (selective SSM, Gu and Dao, "Mamba: Linear-Time Sequence Modeling with Selective State
Spaces", 2023) mixer layers with a constant-size state per sequence: AI21's Jamba. Held in
ModelSpec.linear_attn beside LinearAttnSpec (Gated DeltaNet) and Mamba2Spec, with the same
interface (num_layers, state_bytes_per_layer, conv_dim_per_gpu, value_dim, linear_params,
other_params, gemm_widths; pagesim/sim/cost/linear_attn.py has the kernels).

A layer (transformers' JambaMambaMixer; vLLM's MambaMixer, vllm/model_executor/layers/mamba/
mamba_mixer.py), inner width I = mamba_expand x hidden, state size N, dt rank R:
in_proj (hidden -> x and the gate z, 2 I; column-parallel), a depthwise causal conv1d over x (I
channels of d_conv taps, with a bias where mamba_conv_bias), x_proj (I -> dt, B, C: R + 2 N, no
bias; ROW-parallel in vLLM, so its output is all-reduced over TP in every Mamba layer), RMSNorms
of dt (R), B and C (N each), dt_proj (R -> I, with bias; column-parallel), A_log (I x N), D (I),
out_proj (I -> hidden, row-parallel). No gated norm: y x silu(z) runs inside the scan kernel.

The state per layer is vLLM's MambaStateShapeCalculator.mamba1_state_shape: a conv state of
(d_conv - 1) x I / TP and an SSM state of I / TP x N (I split over TP), both in the model dtype
by default (MambaStateDtypeCalculator.mamba1_state_dtype: mamba_cache_dtype and
mamba_ssm_cache_dtype "auto"; no Jamba hook raises them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mamba1Spec:
    num_layers: int
    intermediate: int      # I = mamba_expand x hidden
    state_size: int        # N = mamba_d_state
    dt_rank: int           # R = mamba_dt_rank
    conv_kernel: int       # mamba_d_conv
    conv_bias: bool = True
    state_dtype_bytes: int = 2  # vLLM's mamba cache dtypes "auto": the model dtype

    @property
    def value_dim(self) -> int:
        """Width of the scan's output (out_proj's input)."""
        return self.intermediate

    @property
    def conv_dim(self) -> int:
        return self.intermediate

    @property
    def ssm_params_width(self) -> int:
        """x_proj's output a token: dt, B and C (R + 2 N), all-reduced over TP (x_proj is row-parallel)."""
        return self.dt_rank + 2 * self.state_size

    @property
    def inner_all_reduce_width(self) -> int:
        """Elements a token of the all-reduce a layer adds to its blocks' at TP > 1: x_proj's output."""
        return self.ssm_params_width

    def conv_dim_per_gpu(self, tp: int) -> int:
        return self.intermediate // tp

    def linear_params(self, hidden: int) -> int:
        """Matmul weights of one layer: in_proj, x_proj, dt_proj, out_proj."""
        i = self.intermediate
        return hidden * 2 * i + i * self.ssm_params_width + self.dt_rank * i + i * hidden

    @property
    def other_params(self) -> int:
        """One layer's non-matmul parameters: conv1d (and its bias), dt_proj's bias, A_log, D, the
        dt, B and C RMSNorms."""
        i = self.intermediate
        return i * (self.conv_kernel + (1 if self.conv_bias else 0)) + i + i * self.state_size + i \
            + self.dt_rank + 2 * self.state_size

    def gemm_widths(self, hidden: int, tp: int) -> list[tuple[str, int, int]]:
        """(op, k, n) of one layer's GEMMs on one GPU of tp."""
        i = self.intermediate // tp
        return [("mamba_in_proj", hidden, 2 * i), ("mamba_x_proj", i, self.ssm_params_width),
                ("mamba_dt_proj", self.dt_rank, i), ("mamba_out_proj", i, hidden)]

    def elementwise_bytes(self, tp: int, tokens: float, dtype_bytes: int) -> tuple[float, ...]:
        """Bytes of a layer's elementwise kernels for `tokens` tokens on one GPU: the causal conv1d
        (I / TP channels read and written; its conv state is in the state's bytes) and the dt, B and
        C RMSNorms (each reads and writes its R or N columns of x_proj's output, replicated)."""
        d = dtype_bytes
        return (2.0 * tokens * self.conv_dim_per_gpu(tp) * d, 2.0 * tokens * self.dt_rank * d,
                2.0 * tokens * self.state_size * d, 2.0 * tokens * self.state_size * d)

    def state_bytes_per_layer(self, tp: int = 1) -> int:
        """One sequence's conv + SSM state in one layer, on one GPU of tp."""
        i = self.intermediate // tp
        return ((self.conv_kernel - 1) * i + i * self.state_size) * self.state_dtype_bytes
