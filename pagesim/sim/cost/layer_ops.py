"""The matrix products of a step, layer by layer, on one GPU: what the cost models price.

`layer_groups(model, tokens, tp, ep)` lists the model's layers in groups of equal shape (dense
layers; MoE layers) with each group's GEMMs for a step of `tokens` tokens. A dense model is one
group of the four GEMMs the measurement files name (attn_pre_proj, attn_post_proj, mlp_up_proj,
mlp_down_proj); the rules for the rest (docs/calibration.md, "Modern models"):

- MLA (DeepSeek): the attention GEMMs are q_a / q_b (or one q_proj), kv_a (hidden -> latent +
  rotary key, replicated over TP as vLLM's ReplicatedLinear), kv_b (latent -> heads x (nope + v)),
  and the output projection. In decode vLLM absorbs kv_b into the query and the output (W_UK,
  W_UV): the same weights and FLOPs per new token, so one list serves both. DeepSeek-V3.2's
  lightning indexer adds wq_b (q latent -> heads x head_dim), wk (hidden -> head_dim) and
  weights_proj (hidden -> heads, unquantized), all replicated over TP as vLLM builds them
  (ReplicatedLinear); its scoring and the sparse attention are pagesim/sim/cost/sparse_attn.py's.
- MoE layers: the router (hidden -> experts, replicated), the shared experts as a dense MLP split
  over TP, and the routed experts as one fused kernel (vLLM's fused_moe is one grouped-GEMM
  launch per projection, so one launch floor) over the experts the step touches. With B tokens
  routed top-k of E, the expected distinct experts touched is E (1 - (1 - k/E)^B)
  (MoESpec.expected_experts_touched) and each touched expert multiplies B k / touched rows.
  The kernel (vLLM's Triton fused_moe) sorts the routed rows by expert and pads each expert's
  group to a multiple of its BLOCK_SIZE_M (moe_align_block_size), so an expert with n rows
  computes ceil(n / BLOCK_SIZE_M) blocks: the compute is over E[ceil(n / BM)] BM rows per
  expert, n ~ Binomial(B, k / E) (expected_padded_rows); the weights are read once per touched
  expert (the M-blocks of one expert run next to each other and share them in L2).
- Expert parallelism (ep > 1, vLLM's --enable-expert-parallel with data-parallel attention): the
  E experts are split whole over ep GPUs; the ep / tp data-parallel ranks each bring a batch like
  this one (assumed symmetric), so an expert GEMM sees the tokens of all ranks, and each MoE
  layer exchanges hidden states by an all-gather before and a reduce-scatter after the experts
  (vLLM's default all2all backend, allgather_reducescatter).
- Latent MoE (Nemotron 3 Super): two GEMMs of their own, hidden -> latent and latent -> hidden,
  replicated over TP (vLLM's ReplicatedLinear: every rank runs all of it, on its own tokens);
  the routed experts work in the latent width (up k = latent, down n = latent), and what the
  routing kernels sum, the EP exchange and the extra TP all-reduce of the routed output
  (ModelSpec.mixer_all_reduces) move is latent-wide too (vLLM's fused MoE takes the projections
  as its routed input / output transforms, so the dispatch sees latent vectors).
- The routing kernels around the experts, one launch each per MoE layer (vLLM FusedMoE on CUDA):
  `topk_softmax` (router logits in fp32 -> top-k ids and weights), `moe_align_block_size` (the
  routed rows sorted by expert and padded to BLOCK_SIZE_M) and `moe_sum` (each token's k expert
  outputs summed); priced as elementwise kernels by the bytes they move (`moe_routing_bytes`).
- Weights of a quantized model's linear layers (not the router) take `ModelSpec.part_weights` of
  their part (a checkpoint may keep its attention unquantized, say), the routed experts
  `ModelSpec.expert_weight_element_bytes` (they differ where only the experts are
  quantized: gpt-oss's MXFP4, 0.53125 bytes a weight, the rest bf16); W8A8 FP8 GEMMs are flagged
  `fp8` (priced at the GPU's FP8 rate where it has one), W4A4 NVFP4 ones `fp4` (the FP4 rate where
  the GPU has one, weight-only elsewhere). MXFP4 experts compute at the bf16 rate
  (weight-only: vLLM's Hopper kernels dequantize the 4-bit blocks in the GEMM's prologue).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from pagesim.models import ModelSpec
from pagesim.sim.cost.linear_attn import linear_attn_elementwise_bytes

# The elementwise kernels of a layer of both blocks, as the measurement files name them, and its
# residual adds (after attention and after the MLP)
ELEMENTWISE_OPERATORS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
RESIDUAL_ADDS_PER_LAYER = 2

# BLOCK_SIZE_M of vLLM's fused_moe kernel by the tokens M entering it: (M up to, BLOCK_SIZE_M),
# 128 above. The tuned H100 configuration of Mixtral-8x7B at TP 2 (vLLM
# model_executor/layers/fused_moe/configs/E=8,N=7168,device_name=NVIDIA_H100_80GB_HBM3.json:
# 16 up to M = 32, 32 for 48-96, 64 for 128-512, 128 from 1024), the same growth vLLM's
# batch-aware defaults use where no tuned file exists (vllm-project/vllm PR 34846).
MOE_BLOCK_M = ((32, 16), (96, 32), (512, 64))
MOE_BLOCK_M_LARGE = 128
# The routed experts' two GEMMs: vLLM's Triton fused_moe kernel, one launch each (moe_gemms).
FUSED_MOE_OPS = ("moe_experts_up", "moe_experts_down")
# Above this many standard deviations from the mean a binomial tail is taken as 0 or 1.
TAIL_SIGMAS = 8.0


def moe_block_m(tokens: float) -> int:
    for limit, block in MOE_BLOCK_M:
        if tokens <= limit:
            return block
    return MOE_BLOCK_M_LARGE


def expected_padded_rows(trials: float, p: float, block: int) -> float:
    """block x E[ceil(n / block)] for n ~ Binomial(trials, p): the rows one expert's GEMM computes
    once its group is padded to whole blocks. E[ceil(n / b)] = sum over j >= 0 of P(n > j b):
    the j = 0 term is exact (1 - (1 - p)^trials, an expert touched at all); the others are the
    exact binomial tail while the mean is small, its normal approximation (continuity
    corrected) above, where the exact sum would cost O(trials) per step shape."""
    if trials <= 0 or p <= 0:
        return 0.0
    if p >= 1:  # every row to this expert (one expert, or top-k of k)
        return block * math.ceil(trials / block)
    n_trials = int(round(trials))
    mean, var = trials * p, trials * p * (1 - p)
    sd = math.sqrt(var)
    blocks = 1.0 - (1.0 - p) ** trials
    top = mean + TAIL_SIGMAS * sd + 1
    if top < 256:  # exact: the pmf from 0 up to past the tail
        pmf = (1.0 - p) ** n_trials
        cdf, n = pmf, 0
        j = 1
        while j * block < top:
            while n < j * block:  # advance the cdf to n = j * block
                pmf *= (n_trials - n) / (n + 1) * p / (1 - p)
                n += 1
                cdf += pmf
            blocks += max(0.0, 1.0 - cdf)
            j += 1
        return block * blocks
    j = 1
    while j * block < top:
        x = j * block
        z = (x + 0.5 - mean) / sd
        blocks += 1.0 if z < -TAIL_SIGMAS else 0.5 * math.erfc(z / math.sqrt(2))
        j += 1
    return block * blocks


@dataclass(frozen=True)
class LayerShape:
    """What the operator terms need: a model's layer, split over `tp` GPUs, and whether it has a
    rotary kernel (the llama family; OPT has learned positions). `mlp_width` overrides the MLP
    width the elementwise activation sees (a MoE layer: the experts a token runs through).
    `mixer` / `mlp`: which blocks the layer has (both, but one in a model whose layers are one
    block each: Nemotron-H); each block has its norm, residual add and TP all-reduce. `parallel_mixers`:
    the mixer block runs attention and linear attention side by side (Falcon-H1), one TP all-reduce
    each (both end in a row-parallel projection) before their outputs are summed."""

    model: ModelSpec
    tp: int = 1
    rotary: bool = True
    mlp_width: int | None = None
    mixer: bool = True
    mlp: bool = True
    parallel_mixers: bool = False

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> "LayerShape":
        return cls(model, tp, rotary=model.architecture == "llama")

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    @property
    def blocks(self) -> int:
        return int(self.mixer) + int(self.mlp)

    @property
    def all_reduces(self) -> int:
        return self.blocks + int(self.parallel_mixers)

    @property
    def elementwise_operators(self) -> tuple[tuple[str, ...], int]:
        """(the layer's elementwise kernels in the measurement files' order, further residual adds):
        both blocks run all five and a second add; a one-block layer its norm, its rotary kernel
        (an attention mixer) or activation (an MLP), and its add."""
        if self.mixer and self.mlp:
            return ELEMENTWISE_OPERATORS, RESIDUAL_ADDS_PER_LAYER - 1
        return ("input_layernorm", "attn_rope" if self.mixer else "mlp_act", "add"), 0

    @property
    def ffn_size(self) -> int:
        return self.model.ffn_size if self.mlp_width is None else self.mlp_width

    @property
    def gated_mlp(self) -> bool:
        return self.model.gated_mlp

    @property
    def dtype_bytes(self) -> int:
        return self.model.dtype_bytes

    @property
    def q_per_gpu(self) -> int:
        return self.model.q_size // self.tp

    @property
    def kv_per_gpu(self) -> int:
        # with more GPUs than KV heads, heads are replicated: each GPU keeps one
        return max(self.model.num_kv_heads // self.tp, 1) * self.model.head_dim

    @property
    def attention_token_bytes(self) -> int:
        """Bytes prompt attention moves per new token, besides its pairs: Q read and O written
        (this GPU's query heads)."""
        return 2 * self.q_per_gpu * self.dtype_bytes

    def gemm_dims(self, op: str) -> tuple[int, int]:
        """(K, N) of a dense layer's GEMM on one GPU."""
        h = self.hidden_size
        if op == "attn_pre_proj":  # (a gated attention's q_proj also gives the output gate: twice as wide)
            return h, (2 if self.model.attn_output_gate else 1) * self.q_per_gpu + 2 * self.kv_per_gpu
        if op == "attn_post_proj":
            return self.q_per_gpu, h
        if op == "mlp_up_proj":
            return h, (2 if self.gated_mlp else 1) * self.ffn_size // self.tp
        if op == "mlp_down_proj":
            return self.ffn_size // self.tp, h
        raise KeyError(op)

    def elementwise_bytes(self, op: str, tokens: int) -> int:
        """Bytes one elementwise operator reads and writes for `tokens` tokens on one GPU."""
        d, h = self.dtype_bytes, self.hidden_size
        if op in ("input_layernorm", "post_attention_layernorm", "emb"):
            return 2 * tokens * h * d                      # read + write the hidden state
        if op == "add":
            return 3 * tokens * h * d                      # two inputs, one output
        if op == "attn_rope":
            return 2 * tokens * (self.q_per_gpu + self.kv_per_gpu) * d if self.rotary else 0
        if op == "mlp_act":
            # gated: read gate and up, write act(gate) * up; plain: read and write
            return (3 if self.gated_mlp else 2) * tokens * self.ffn_size // self.tp * d
        raise KeyError(op)


@dataclass(frozen=True, slots=True)
class Gemm:
    """`count` products of (m x k) by (k x n) in one kernel launch, on one GPU."""

    op: str
    m: float                  # rows: tokens, or tokens per touched expert (an expectation)
    k: int
    n: int
    count: float = 1          # matrices (touched experts); 1 for an ordinary GEMM
    weight_bytes: float = 2   # bytes per weight element
    fp8: bool = False         # W8A8: FP8 tensor cores where the GPU has them
    fp4: bool = False         # W4A4 NVFP4: FP4 tensor cores where the GPU has them, else weight-only
    padded_m: float = 0.0     # rows computed per matrix, padding included (fused MoE); 0: m to the GEMM tile


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """`num_layers` layers of one shape: their GEMMs, the elementwise shape, and the bytes each
    GPU exchanges per layer for expert parallelism (0 without)."""

    num_layers: int
    gemms: tuple[Gemm, ...]
    shape: LayerShape
    ep_exchange_bytes: float = 0.0
    ep_ranks: int = 1
    routing_bytes: tuple[float, ...] = ()  # per routing kernel of a MoE layer (moe_routing_bytes)
    mixer_bytes: tuple[float, ...] = ()  # per elementwise kernel of a linear-attention layer (conv, gated norm)
    mixer_all_reduce_bytes: tuple[float, ...] = ()  # per TP all-reduce inside a layer (Mamba v1's x_proj, latent MoE), tp > 1


def check_parallelism(model: ModelSpec, tp: int, ep: int) -> None:
    if ep <= 0 or tp <= 0:
        raise ValueError("tp and ep must be positive")
    if ep == 1:
        return
    if model.moe is None:
        raise ValueError(f"{model.name}: ep={ep} needs a mixture-of-experts model")
    if ep % tp:
        raise ValueError(f"ep={ep} must be a multiple of tp={tp} (the data-parallel ranks are ep / tp)")
    if model.moe.num_experts % ep:
        raise ValueError(f"{model.name}: {model.moe.num_experts} experts do not split over ep={ep}")


def attention_gemms(model: ModelSpec, tokens: int, tp: int, shape: LayerShape) -> list[Gemm]:
    wb, fp8, fp4 = model.part_weights("mixer")
    if model.mla is None:
        return [Gemm(op, tokens, *shape.gemm_dims(op), weight_bytes=wb, fp8=fp8, fp4=fp4)
                for op in ("attn_pre_proj", "attn_post_proj")]
    m, h, heads = model.mla, model.hidden_size, model.num_heads // tp
    q = ([Gemm("mla_q_a", tokens, h, m.q_lora_rank, weight_bytes=wb, fp8=fp8, fp4=fp4),
          Gemm("mla_q_b", tokens, m.q_lora_rank, heads * m.qk_head_dim, weight_bytes=wb, fp8=fp8, fp4=fp4)]
         if m.q_lora_rank else [Gemm("mla_q", tokens, h, heads * m.qk_head_dim, weight_bytes=wb, fp8=fp8, fp4=fp4)])
    ix = m.indexer
    indexer = [Gemm("dsa_wq_b", tokens, m.q_lora_rank, ix.num_heads * ix.head_dim, weight_bytes=wb, fp8=fp8, fp4=fp4),
               Gemm("dsa_wk", tokens, h, ix.head_dim, weight_bytes=wb, fp8=fp8, fp4=fp4),
               Gemm("dsa_weights_proj", tokens, h, ix.num_heads, weight_bytes=model.dtype_bytes)] if ix else []
    return q + indexer + [Gemm("mla_kv_a", tokens, h, m.latent_size, weight_bytes=wb, fp8=fp8, fp4=fp4),
                          Gemm("mla_kv_b", tokens, m.kv_lora_rank, heads * (m.qk_nope_head_dim + m.v_head_dim),
                               weight_bytes=wb, fp8=fp8, fp4=fp4),
                          Gemm("attn_post_proj", tokens, heads * m.v_head_dim, h, weight_bytes=wb, fp8=fp8, fp4=fp4)]


def moe_gemms(model: ModelSpec, tokens: int, tp: int, ep: int) -> tuple[list[Gemm], float, int]:
    """A MoE layer's GEMMs, the bytes one GPU sends for the EP exchange, and the EP ranks."""
    moe, h, d, x = model.moe, model.hidden_size, model.dtype_bytes, model.expert_hidden_size
    wb, fp8, fp4 = model.part_weights("shared")
    ranks = ep // tp if ep > 1 else 1              # data-parallel ranks feeding the experts
    routed = tokens * ranks                        # tokens the experts see
    width = moe.expert_ffn_size if ep > 1 else moe.expert_ffn_size // tp  # EP keeps experts whole
    touched = moe.expected_experts_touched(routed) / ep    # this GPU's share
    rows = routed * moe.experts_per_token / ep / touched if touched else 0.0  # per touched expert
    # the kernel's M is the tokens it sees; each expert's rows padded to its BLOCK_SIZE_M
    share = moe.experts_per_token / moe.num_experts
    padded = (moe.num_experts / ep * expected_padded_rows(routed, share, moe_block_m(routed)) / touched
              if touched else 0.0)
    router_n = moe.num_experts + (1 if moe.shared_expert_gate else 0)
    gemms = [Gemm("moe_router", tokens, h, router_n, weight_bytes=d)]
    up_n = model.expert_matrices - 1  # the up projection's outputs a width: gate and up, or up alone (relu2)
    if moe.shared_expert_ffn_size:
        width_s = moe.shared_expert_ffn_size // tp
        gemms += [Gemm("moe_shared_up", tokens, h, up_n * width_s, weight_bytes=wb, fp8=fp8, fp4=fp4),
                  Gemm("moe_shared_down", tokens, width_s, h, weight_bytes=wb, fp8=fp8, fp4=fp4)]
    up, down = FUSED_MOE_OPS
    q = model.quant
    ewb, efp8, efp4 = model.expert_weight_element_bytes, bool(q and q.fp8_compute), bool(q and q.fp4_compute)
    latent_in, latent_out = ([Gemm("moe_latent_in", tokens, h, x, weight_bytes=wb, fp8=fp8, fp4=fp4)],
                             [Gemm("moe_latent_out", tokens, x, h, weight_bytes=wb, fp8=fp8, fp4=fp4)]) \
        if moe.latent_size else ([], [])
    gemms += latent_in + [
        Gemm(up, rows, x, up_n * width, count=touched, weight_bytes=ewb, fp8=efp8, fp4=efp4, padded_m=padded),
        Gemm(down, rows, width, x, count=touched, weight_bytes=ewb, fp8=efp8, fp4=efp4, padded_m=padded)] + latent_out
    exchange = routed * x * d if ranks > 1 else 0.0  # all-gathered (and reduce-scattered) expert inputs
    return gemms, exchange, ranks


def moe_routing_bytes(model: ModelSpec, tokens: int, tp: int, ep: int) -> tuple[float, float, float]:
    """Bytes read and written by a MoE layer's three routing kernels on one GPU: topk_softmax
    (fp32 logits of every expert in; k int32 ids and k fp32 weights out per token),
    moe_align_block_size (the k ids per routed token in; the sorted row ids out, padding
    included) and moe_sum (each token's k expert outputs in, one out: the latent width where latent)."""
    moe, h, d = model.moe, model.expert_hidden_size, model.dtype_bytes
    e, k = moe.num_experts, moe.experts_per_token
    routed = tokens * (ep // tp if ep > 1 else 1)
    block = moe_block_m(routed)
    topk = tokens * (4 * e + 8 * k)
    align = 4 * routed * k + 4 * (routed * k + e * (block - 1))  # ids in; sorted ids out, at most E (BM - 1) pads
    moe_sum = tokens * (k / ep + 1) * h * d  # this GPU's share of the k outputs, then the sum
    return float(topk), float(align), float(moe_sum)


def linear_attn_gemms(model: ModelSpec, tokens: int, tp: int) -> list[Gemm]:
    """A linear-attention layer's GEMMs, split over TP (the spec's gemm_widths): a Gated DeltaNet's
    in_proj_qkvz, in_proj_ba and out_proj (Qwen3-Next), or a Mamba2 mixer's in_proj and out_proj."""
    la, h = model.linear_attn, model.hidden_size
    wb, fp8, fp4 = model.part_weights("mixer")
    return [Gemm(op, tokens, k, n, weight_bytes=wb, fp8=fp8, fp4=fp4) for op, k, n in la.gemm_widths(h, tp)]


def mixer_all_reduce_bytes(model: ModelSpec, tokens: int, tp: int) -> tuple[float, ...]:
    """Bytes of each TP all-reduce inside one linear-attention layer for `tokens` tokens (Mamba v1's
    x_proj, row-parallel in vLLM; lightning attention's norm variance: ModelSpec.mixer_all_reduces); none
    at tp 1 or for other mixers."""
    count, width = model.mixer_all_reduces
    return (float(tokens * width * model.dtype_bytes),) if count and tp > 1 and not _latent(model) else ()


def moe_all_reduce_bytes(model: ModelSpec, tokens: int, tp: int) -> tuple[float, ...]:
    """Bytes of the TP all-reduce inside one latent MoE layer (its routed output, latent-wide:
    ModelSpec.mixer_all_reduces); none at tp 1 or without a latent."""
    count, width = model.mixer_all_reduces
    return (float(tokens * width * model.dtype_bytes),) if count and tp > 1 and _latent(model) else ()


def _latent(model: ModelSpec) -> bool:
    return model.moe is not None and model.moe.latent_size > 0


def layer_groups(model: ModelSpec, tokens: int, tp: int = 1, ep: int = 1) -> tuple[LayerGroup, ...]:
    """The model's layers in groups of one shape, with their GEMMs for a step of `tokens` tokens.
    A model with linear-attention layers splits each MLP kind's layers into attention and linear
    ones (in proportion where it has both dense and MoE layers: which is which is not kept), and
    parallel-mixer layers (Falcon-H1: attention and linear attention side by side) apart likewise.
    One-block layers (Nemotron-H) are attention, linear-attention, dense MLP and MoE layers apart."""
    base = LayerShape.of(model, tp)
    attention = attention_gemms(model, tokens, tp, base)
    kinds = mlp_kinds(model, tokens, tp, ep, base)
    if model.num_mlp_only_layers:
        return _one_block_groups(model, tokens, tp, base, attention, kinds)
    la = model.linear_attn
    parallel_left = model.num_parallel_mixer_layers
    linear_left = (la.num_layers if la else 0) - parallel_left
    groups = []
    for i, (n, mlp, shape, exchange, ranks, routing) in enumerate(kinds):
        last = i == len(kinds) - 1
        parallel = min(n, parallel_left if last else round(n * parallel_left / model.num_layers))
        parallel_left -= parallel
        linear = linear_left if last else round(n * linear_left / model.num_layers)
        linear = min(n - parallel, linear)
        linear_left -= linear
        inner = moe_all_reduce_bytes(model, tokens, tp) if routing else ()  # a latent MoE's routed output
        if n > linear + parallel:
            groups.append(LayerGroup(n - linear - parallel, tuple(attention + mlp), shape, exchange, ranks, routing,
                                     mixer_all_reduce_bytes=inner))
        if linear:  # no rotary kernel; the conv and the gated norm instead
            groups.append(LayerGroup(linear, tuple(linear_attn_gemms(model, tokens, tp) + mlp),
                                     LayerShape(model, tp, False, shape.mlp_width), exchange, ranks, routing,
                                     linear_attn_elementwise_bytes(model, tp, tokens),
                                     mixer_all_reduce_bytes(model, tokens, tp) + inner))
        if parallel:  # both mixers' GEMMs, the rotary kernel, the conv and the gated norm
            groups.append(LayerGroup(parallel, tuple(attention + linear_attn_gemms(model, tokens, tp) + mlp),
                                     LayerShape(model, tp, base.rotary, shape.mlp_width, parallel_mixers=True),
                                     exchange, ranks, routing, linear_attn_elementwise_bytes(model, tp, tokens),
                                     inner))
    return tuple(groups)


def mlp_kinds(model: ModelSpec, tokens: int, tp: int, ep: int, base: LayerShape) -> list[tuple]:
    """The model's MLP blocks by kind, (layers, GEMMs, shape, EP exchange, EP ranks, routing bytes):
    the dense MLP layers, then the MoE layers."""
    kinds = []
    if model.num_dense_layers:
        wb, fp8, fp4 = model.part_weights("mlp")
        mlp = [Gemm(op, tokens, *base.gemm_dims(op), weight_bytes=wb, fp8=fp8, fp4=fp4)
               for op in ("mlp_up_proj", "mlp_down_proj")]
        kinds.append((model.num_dense_layers, mlp, base, 0.0, 1, ()))
    if model.moe is not None:
        gemms, exchange, ranks = moe_gemms(model, tokens, tp, ep)
        moe = model.moe
        # the activation runs over each token's k experts (and the shared ones), split over TP
        shape = LayerShape(model, tp, base.rotary, mlp_width=moe.experts_per_token * moe.expert_ffn_size
                           + moe.shared_expert_ffn_size)
        kinds.append((moe.num_moe_layers, gemms, shape, exchange, ranks, moe_routing_bytes(model, tokens, tp, ep)))
    return kinds


def _one_block_groups(model: ModelSpec, tokens: int, tp: int, base: LayerShape, attention: list[Gemm],
                      kinds: list[tuple]) -> tuple[LayerGroup, ...]:
    """Layers of one block each: attention alone, a linear-attention mixer alone (its conv and
    gated norm), an MLP alone: dense (its up and down GEMMs: gate and up where the MLP is gated)
    or MoE (router, shared and routed experts, the routing kernels; Nemotron 3's 'E' layers)."""
    groups = [LayerGroup(model.num_attention_layers, tuple(attention), LayerShape(model, tp, base.rotary, mlp=False))]
    if model.linear_attn is not None:
        groups.append(LayerGroup(model.linear_attn.num_layers, tuple(linear_attn_gemms(model, tokens, tp)),
                                 LayerShape(model, tp, False, mlp=False), mixer_bytes=linear_attn_elementwise_bytes(
                                     model, tp, tokens)))
    for n, mlp, shape, exchange, ranks, routing in kinds:  # no rotary kernel, no mixer
        groups.append(LayerGroup(n, tuple(mlp), replace(shape, rotary=False, mixer=False), exchange, ranks, routing,
                                 mixer_all_reduce_bytes=moe_all_reduce_bytes(model, tokens, tp) if routing else ()))
    return tuple(groups)
