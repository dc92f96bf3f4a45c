"""The parts a ModelSpec may have beyond its dense fields (pagesim.models.spec says what each
means there): a mixture-of-experts MLP, multi-head latent attention, quantized weights and
linear-attention layers."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MoESpec:
    """The routed (and shared) experts of a mixture-of-experts MLP."""

    num_experts: int
    experts_per_token: int
    expert_ffn_size: int
    num_moe_layers: int
    num_shared_experts: int = 0
    shared_expert_ffn_size: int = 0  # all shared experts together (DeepSeek: n_shared * expert width)
    shared_expert_gate: bool = False  # Qwen2-MoE scales the shared expert by a sigmoid gate (h -> 1)
    # Latent MoE (Nemotron 3 Super, `moe_latent_size`): the routed experts read and write this width,
    # between a hidden -> latent and a latent -> hidden projection; 0: none, experts of the hidden width
    latent_size: int = 0

    def __post_init__(self) -> None:
        if self.latent_size < 0:
            raise ValueError(f"latent_size must be 0 (none) or positive, got {self.latent_size}")
        if not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token must be in 1..num_experts ({self.num_experts}), "
                             f"got {self.experts_per_token}")

    def expected_experts_touched(self, tokens: float) -> float:
        """Expected distinct experts a batch of `tokens` tokens routes to, each token choosing
        `experts_per_token` of `num_experts` uniformly: E (1 - (1 - k/E)^B). Exact under uniform
        independent routing: an expert is missed by one token with probability 1 - k/E, by all
        B tokens with that to the B (linearity of expectation over the E experts)."""
        e, k = self.num_experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens) if tokens > 0 else 0.0


@dataclass(frozen=True, slots=True)
class IndexerSpec:
    """DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2: `index_n_heads`,
    `index_head_dim`, `index_topk`): per layer wq_b (q_lora_rank -> heads x head_dim), wk (hidden ->
    head_dim), k_norm (a LayerNorm: weight and bias), weights_proj (hidden -> heads), all replicated
    over TP; it scores every cached token with one key of head_dim and keeps the top `topk` for
    the sparse MLA. Its key cache (vLLM DeepseekV32IndexerCache): head_dim fp8 values and one
    fp32 scale per QUANT_BLOCK of them, per token per layer, whatever --kv-cache-dtype."""

    num_heads: int
    head_dim: int
    topk: int

    QUANT_BLOCK = 128  # vLLM Indexer.quant_block_size

    def linear_params(self, hidden: int, q_lora_rank: int) -> int:
        return q_lora_rank * self.num_heads * self.head_dim + hidden * self.head_dim + hidden * self.num_heads

    @property
    def norm_params(self) -> int:
        return 2 * self.head_dim  # k_norm: LayerNorm weight and bias

    @property
    def cache_bytes(self) -> int:
        return self.head_dim + self.head_dim // self.QUANT_BLOCK * 4

    @property
    def flops_per_pair(self) -> int:
        """q . k of every indexer head against one cached key (fp8), per layer."""
        return 2 * self.num_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention's ranks and head sizes (DeepSeek-V2/V3 config fields);
    `indexer`: DeepSeek-V3.2's sparse attention (None: dense MLA)."""

    q_lora_rank: int | None  # None: a plain q_proj (DeepSeek-V2-Lite)
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    indexer: IndexerSpec | None = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_size(self) -> int:
        """Elements cached per token per layer: the KV latent and the shared rotary key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def cache_bytes(self, element_bytes: int) -> int:
        """One token's cache in one layer. Dense MLA: the latent and rotary key at element_bytes.
        With the indexer (vLLM's FlashMLA sparse), an fp8 cache is vLLM's fp8_ds_mla: the latent in
        fp8 with one fp32 scale per 128 and the rotary key in bf16 (656 bytes for V3.2); plus the
        indexer's key cache."""
        if self.indexer is None:
            return self.latent_size * element_bytes
        latent = (self.kv_lora_rank + self.kv_lora_rank // 128 * 4 + 2 * self.qk_rope_head_dim if element_bytes == 1
                  else self.latent_size * element_bytes)
        return latent + self.indexer.cache_bytes


@dataclass(frozen=True, slots=True)
class WeightQuant:
    """How the decoder's linear weights are stored. `bytes_per_weight` includes the scales (and
    zero points) of group quantization; `fp8_compute`: activations are quantized too (W8A8), so
    the GEMMs can run at an FP8 tensor-core rate where the GPU has one. `experts_only`: only the
    routed experts' weights are quantized (vLLM's Mxfp4Config quantizes FusedMoE layers only);
    attention, dense MLPs, shared experts and the router stay in the serving dtype. A checkpoint
    that lists modules it left unquantized (`modules_to_not_convert`: Meta's FP8 releases) keeps
    the token mixers or the shared experts of every layer (`kept_mixer_layers`,
    `kept_shared_layers`: all or none) or the dense MLPs of some (`kept_mlp_layers`) in the serving
    dtype. `fp4_compute`: activations are quantized to 4-bit floats too (W4A4 NVFP4), so the GEMMs
    run at an FP4 tensor-core rate where the GPU has one and weight-only elsewhere (vLLM's Marlin
    FP4 fallback)."""

    method: str              # "fp8", "awq", "gptq", "compressed-tensors", "mxfp4", "fbgemm_fp8", "modelopt"
    bits: int
    group_size: int | None   # weights per scale (None: per tensor or per channel)
    bytes_per_weight: float
    fp8_compute: bool = False
    experts_only: bool = False
    kept_mixer_layers: int = 0
    kept_shared_layers: int = 0
    kept_mlp_layers: int = 0
    fp4_compute: bool = False


@dataclass(frozen=True, slots=True)
class LinearAttnSpec:
    """Linear-attention layers with a constant-size state per sequence (Qwen3-Next's Gated
    DeltaNet): in_proj_qkvz, in_proj_ba, a depthwise conv1d over q/k/v, A_log, dt_bias, a gated
    RMSNorm of the value head size, out_proj. The state per layer is vLLM's
    MambaStateShapeCalculator.gated_delta_net_state_shape: a conv state of (kernel - 1) x conv_dim
    and a recurrent state of value heads x key dim x value dim, both split over TP."""

    num_layers: int
    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    state_dtype_bytes: int = 2  # vLLM's mamba cache dtypes "auto": the model dtype

    @property
    def inner_all_reduce_width(self) -> int:
        """No TP all-reduce modelled inside the layer besides its block's (ModelSpec.mixer_all_reduces)."""
        return 0

    @property
    def key_dim(self) -> int:
        return self.num_key_heads * self.key_head_dim

    @property
    def value_dim(self) -> int:
        return self.num_value_heads * self.value_head_dim

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.value_dim

    def linear_params(self, hidden: int) -> int:
        """Matmul weights of one layer: in_proj_qkvz, in_proj_ba, out_proj."""
        return hidden * (2 * self.key_dim + 2 * self.value_dim) + hidden * 2 * self.num_value_heads \
            + self.value_dim * hidden

    @property
    def other_params(self) -> int:
        """One layer's non-matmul parameters: conv1d (no bias), A_log, dt_bias, the gated norm."""
        return self.conv_dim * self.conv_kernel + 2 * self.num_value_heads + self.value_head_dim

    def conv_dim_per_gpu(self, tp: int) -> int:
        return self.conv_dim // tp

    def gemm_widths(self, hidden: int, tp: int) -> list[tuple[str, int, int]]:
        """(op, k, n) of one layer's GEMMs on one GPU of tp: in_proj_qkvz (q, k, v and the gate z),
        in_proj_ba (beta and the decay's a, one each a value head), out_proj."""
        return [("la_in_proj_qkvz", hidden, (2 * self.key_dim + 2 * self.value_dim) // tp),
                ("la_in_proj_ba", hidden, 2 * self.num_value_heads // tp),
                ("la_out_proj", self.value_dim // tp, hidden)]

    def state_bytes_per_layer(self, tp: int = 1) -> int:
        """One sequence's conv + recurrent state in one layer, on one GPU of tp."""
        conv = (self.conv_kernel - 1) * self.conv_dim // tp
        recurrent = self.num_value_heads // tp * self.key_head_dim * self.value_head_dim
        return (conv + recurrent) * self.state_dtype_bytes
