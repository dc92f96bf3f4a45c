"""Mamba2 (SSD) mixer layers with a constant-size state per sequence (Granite 4.0-H's
GraniteMoeHybrid; Nemotron-H; Falcon-H1, beside attention in every layer). Held in ModelSpec.linear_attn beside
LinearAttnSpec (Gated DeltaNet): both give num_layers, state_bytes_per_layer, conv_dim_per_gpu,
value_dim (the gated norm's width), linear_params, other_params and gemm_widths, which the pool
sizing, the KV groups and the step cost read (pagesim/sim/cost/linear_attn.py has the kernels).

A layer: in_proj (hidden -> the gate z, x, B, C and dt: 2 I + 2 G N + H, I = H P), a depthwise
causal conv1d over x, B and C (conv_dim = I + 2 G N, with bias), A_log, D and dt_bias (H each), a
gated RMSNorm of width I, out_proj (I -> hidden). H heads of head dim P, G groups of state size N.

The state per layer is vLLM's MambaStateShapeCalculator.mamba2_state_shape
(vllm/model_executor/layers/mamba/mamba_utils.py): a conv state of (kernel - 1) x conv_dim / TP,
where G is first raised to TP when TP does not divide it (extra_groups_for_head_shards: the groups
are replicated so each shard of heads has its own), and an SSM state of H / TP x P x N. Both in
the model dtype by default (MambaStateDtypeCalculator._mamba_state_dtype: mamba_cache_dtype and
mamba_ssm_cache_dtype "auto"; --mamba-ssm-cache-dtype float32 would double the SSM part).
`ssm_state_dtype_bytes` is the SSM part's where it differs: Nemotron-H's is float32 unless its
config says otherwise (vLLM's NemotronHForCausalLMConfig hook, pagesim.models.families.nemotron_h)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Mamba2Spec:
    num_layers: int
    num_heads: int
    head_dim: int
    state_size: int
    n_groups: int
    conv_kernel: int
    chunk_size: int = 256     # the SSD scan's chunk (config mamba_chunk_size / chunk_size)
    conv_bias: bool = True
    state_dtype_bytes: int = 2  # vLLM's mamba cache dtypes "auto": the model dtype
    ssm_state_dtype_bytes: int | None = None  # the SSM state's (--mamba-ssm-cache-dtype); None: state_dtype_bytes
    norm_weight: bool = True  # the gated RMSNorm's weight (Falcon-H1's mamba_rms_norm false: y x silu(z), no weight)

    @property
    def ssm_dtype_bytes(self) -> int:
        return self.state_dtype_bytes if self.ssm_state_dtype_bytes is None else self.ssm_state_dtype_bytes

    @property
    def inner_all_reduce_width(self) -> int:
        """No TP all-reduce modelled inside the layer besides its block's (ModelSpec.mixer_all_reduces)."""
        return 0

    @property
    def intermediate(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        """Width of the gated RMSNorm (and of out_proj's input)."""
        return self.intermediate

    @property
    def conv_dim(self) -> int:
        return self.intermediate + 2 * self.n_groups * self.state_size

    def groups_per_gpu(self, tp: int) -> int:
        """Groups on one GPU of tp: G / TP, or 1 where vLLM replicates them (TP does not divide G)."""
        groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
        return groups // tp

    def conv_dim_per_gpu(self, tp: int) -> int:
        return self.intermediate // tp + 2 * self.groups_per_gpu(tp) * self.state_size

    def linear_params(self, hidden: int) -> int:
        """Matmul weights of one layer: in_proj, out_proj."""
        return hidden * (self.intermediate + self.conv_dim + self.num_heads) + self.intermediate * hidden

    @property
    def other_params(self) -> int:
        """One layer's non-matmul parameters: conv1d (and its bias), A_log, D, dt_bias, the gated norm."""
        return self.conv_dim * (self.conv_kernel + (1 if self.conv_bias else 0)) + 3 * self.num_heads \
            + (self.intermediate if self.norm_weight else 0)

    def gemm_widths(self, hidden: int, tp: int) -> list[tuple[str, int, int]]:
        """(op, k, n) of one layer's GEMMs on one GPU of tp."""
        in_proj = self.intermediate // tp + self.conv_dim_per_gpu(tp) + self.num_heads // tp
        return [("mamba_in_proj", hidden, in_proj), ("mamba_out_proj", self.intermediate // tp, hidden)]

    def state_bytes_per_layer(self, tp: int = 1) -> int:
        """One sequence's conv + SSM state in one layer, on one GPU of tp."""
        conv = (self.conv_kernel - 1) * self.conv_dim_per_gpu(tp)
        ssm = self.num_heads // tp * self.head_dim * self.state_size
        return conv * self.state_dtype_bytes + ssm * self.ssm_dtype_bytes
