"""The `roofline` cost model: each part of a step is max(FLOPs / achievable FLOP/s, bytes /
achievable bandwidth), with achievable fractions of the datasheet peaks that are estimates (see
``RooflineConstants``). The `calibrated` model replaces these estimates with fitted terms; the
roofline stays selectable (``--cost-model roofline``) and is the baseline its errors are set beside.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from pagesim.sim.cost.base import BatchShape, CostModel
from pagesim.sim.run_times import linear_context_durations, windowed_context_durations
from pagesim.sim.cost.layer_ops import check_parallelism
from pagesim.sim.cost.linear_attn import linear_attn_elementwise_bytes, state_work
from pagesim.sim.cost.paged_blocks import block_term
from pagesim.sim.cost.sparse_attn import sparse_attn_work
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model, kv_bytes_per_token_per_gpu


@dataclass(frozen=True, slots=True)
class RooflineConstants:
    """Achievable fractions of peak and fixed latencies. Estimates, each with its reason;
    a profiled cost model replaces all of them with measurements."""

    # cuBLAS FP16 GEMMs at prefill shapes (thousands of rows) reach ~80% of the tensor-core
    # peak on A100/H100; decode GEMMs are bandwidth-bound, so this only shapes prefill.
    matmul_efficiency: float = 0.8
    # Streaming reads (weights, activations) reach ~85-90% of HBM peak (STREAM-like copies on
    # A100 run at ~1.3-1.4 of 1.555 TB/s).
    hbm_efficiency: float = 0.85
    # Prompt attention kernels (xformers / FlashAttention) reach ~50% of peak FLOPs
    # (FlashAttention-2 paper: 50-73% forward on A100; the 2023 xformers kernels less).
    attention_compute_efficiency: float = 0.5
    # Paged decode attention reads KV at ~70% of HBM peak: the paper (Fig. 18a) measures its
    # kernel 20-26% slower than FasterTransformer's contiguous one, itself ~85-90% of peak.
    # That is at block 16; other block sizes follow pagesim/sim/cost/paged_blocks.py on A100s.
    kv_read_efficiency: float = 0.7
    # Elementwise work outside the matmuls (norms, residual adds, rotary/positions, activation
    # function, KV writes), as full passes over a token's vectors per layer: read+write of the
    # hidden state by 2 norms and 2 residual adds (8) plus read+write of the MLP intermediate
    # by the activation (2; +1 for the gated multiply).
    elementwise_hidden_passes: int = 8
    elementwise_ffn_passes: int = 2
    # NCCL ring all-reduce reaches ~75-80% of NVLink per-direction bandwidth (bus bandwidth of
    # ~230 of 300 GB/s on DGX A100).
    interconnect_efficiency: float = 0.77
    # Fixed latency of one small NCCL all-reduce over NVLink (~10-20 us for 2-8 GPUs).
    allreduce_latency_s: float = 15e-6
    # CPU time per step that does not overlap the GPU: scheduling, building input tensors,
    # kernel launches (vLLM v0.1 ran eagerly, no CUDA graphs, a few ms per step).
    step_overhead_s: float = 3e-3
    # CPU time per scheduled sequence: block tables, input lists, per-sequence sampling and
    # output handling in Python (vLLM v0.1: several ms for a batch of a few hundred).
    per_seq_overhead_s: float = 20e-6
    # One host<->device cudaMemcpyAsync: vLLM swaps each block of each layer, K and V apart,
    # as its own copy; each pays this fixed cost (API call + DMA setup). Makes small blocks
    # slow to swap (paper Fig. 19a).
    swap_copy_latency_s: float = 5e-6
    # Pinned host<->device copies reach ~80% of the PCIe link (~25 of 32 GB/s on Gen4 x16).
    pcie_efficiency: float = 0.8
    # One launch of the copy-on-write kernel (all layers, all pairs in one kernel).
    copy_kernel_latency_s: float = 10e-6


DEFAULT_ROOFLINE_CONSTANTS = RooflineConstants()


class RooflineCostModel(CostModel):
    """Roofline time of one step of a TP group: each part is max(FLOPs / achievable FLOP/s,
    bytes / achievable bandwidth), and the parts add up (they run one after another).

    Parts: linear layers over every token (weights read once per step); LM head over the
    sequences that sample; prompt attention (causal pairs) and decode attention (KV reads);
    elementwise traffic; TP all-reduce (2 per layer); CPU overhead; swap over PCIe (one copy per
    block, layer and K/V); copy-on-write copies in HBM.
    """

    name = "roofline"

    def __init__(self, model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1,
                 constants: RooflineConstants = DEFAULT_ROOFLINE_CONSTANTS, ep: int = 1) -> None:
        model, gpu = get_model(model), get_gpu(gpu)
        if tp <= 0:
            raise ValueError("tp must be positive")
        check_parallelism(model, tp, ep)
        self.model, self.gpu, self.tp, self.ep, self.constants = model, gpu, tp, ep, constants
        c = constants
        # a collective's latency: the link's own where documented (PCIe), else the NVLink constant
        self._collective_latency_s = max(c.allreduce_latency_s, gpu.link.latency_s)
        d = model.dtype_bytes
        flops = gpu.fp16_flops * c.matmul_efficiency
        attn_flops = gpu.fp16_flops * c.attention_compute_efficiency
        hbm = gpu.hbm_bandwidth * c.hbm_efficiency
        kv_bw = gpu.hbm_bandwidth * c.kv_read_efficiency
        kv_token = kv_bytes_per_token_per_gpu(model, tp)  # this GPU's share of one token's KV

        # Linear layers: compute grows with tokens, the weight read is paid once per step. W8A8
        # FP8 (W4A4 FP4) weights compute at the FP8 (FP4) rate where the GPU has one; quantized
        # weights are smaller.
        def rate(fp8: bool, fp4: bool) -> float:
            low = gpu.fp4_flops if fp4 and gpu.has_fp4 else gpu.fp8_flops if fp8 and gpu.has_fp8 else 0.0
            return low * c.matmul_efficiency if low else flops

        q = model.quant
        lin_flops = rate(bool(q and q.fp8_compute), bool(q and q.fp4_compute))
        # a MoE's routed experts are priced per step by the experts the step touches (_moe_terms);
        # the other linear layers part by part (a checkpoint may keep its attention unquantized)
        # a latent MoE's two projections are replicated over TP (vLLM's ReplicatedLinear): not split
        latent = model.moe.num_moe_layers * model.moe_latent_params if model.moe else 0
        always_on = model.moe.num_moe_layers * model.moe_always_on_params - latent if model.moe else 0
        parts = {}  # (bytes a weight, FP8 GEMM, FP4 GEMM) -> weights
        for part, params in (("mixer", model.mixer_linear_params),
                             ("mlp", model.num_dense_layers * model.dense_mlp_params), ("shared", always_on)):
            key = model.part_weights(part)
            parts[key] = parts.get(key, 0) + params
        self._linear_s_per_token = sum(2 * params / tp / rate(part_fp8, part_fp4)
                                       for (_, part_fp8, part_fp4), params in parts.items())
        self._linear_weight_s = sum(params * wb / tp / hbm for (wb, _, _), params in parts.items())
        if latent:
            wb, part_fp8, part_fp4 = model.part_weights("shared")
            self._linear_s_per_token += 2 * latent / rate(part_fp8, part_fp4)
            self._linear_weight_s += latent * wb / hbm
        self._moe_cache: dict[int, tuple[float, float, float]] | None = {} if model.moe else None
        self._lin_flops, self._hbm = lin_flops, hbm
        # LM head (vocab split over TP).
        self._lm_s_per_seq = 2 * model.lm_head_params / tp / flops
        self._lm_weight_s = model.lm_head_params * d / tp / hbm
        # Elementwise traffic per token (hidden is replicated over TP, the MLP is split).
        ffn_passes = c.elementwise_ffn_passes + (1 if model.gated_mlp else 0)
        # (layers, activation width) of each MLP kind: dense; MoE over each token's k experts and the shared ones
        mlps = [(model.num_dense_layers, model.ffn_size)]
        if model.moe is not None:
            mlps.append((model.moe.num_moe_layers,
                         model.moe.experts_per_token * model.moe.expert_ffn_size + model.moe.shared_expert_ffn_size))
        if model.num_mlp_only_layers:  # one-block layers: hidden passes a block, the activation an MLP layer
            elem_bytes = d * (model.num_blocks * c.elementwise_hidden_passes * model.hidden_size // 2
                              + sum(n * ffn_passes * width // tp for n, width in mlps))
        elif model.moe is None:
            elem_bytes = model.num_layers * d * (c.elementwise_hidden_passes * model.hidden_size
                                                 + ffn_passes * model.ffn_size // tp)
        else:
            elem_bytes = d * sum(n * (c.elementwise_hidden_passes * model.hidden_size + ffn_passes * width // tp)
                                 for n, width in mlps)
        if model.linear_attn is not None:  # a linear-attention layer's conv and gated norm
            elem_bytes += model.linear_attn.num_layers * sum(linear_attn_elementwise_bytes(model, tp, 1))
        self._elementwise_s_per_token = elem_bytes / hbm
        # Linear-attention layers' recurrent kernel (pagesim/sim/cost/linear_attn.py): decode reads
        # and writes each sequence's state once a layer (memory-bound: at the HBM efficiency of the
        # other streamed reads, weights and activations; the state is one dense tensor a sequence,
        # not gathered block by block as paged KV is); prefill's chunked kernel is linear in tokens,
        # its FLOPs at the attention kernels' rate, against its bytes
        work = state_work(model, tp)
        self._state = work is not None
        self._state_dec_s_per_seq = max(work.decode_bytes_per_seq / hbm, work.decode_flops_per_seq / attn_flops) \
            if work else 0.0
        self._state_pre_flop_s_per_token = work.prefill_flops_per_token / attn_flops if work else 0.0
        self._state_pre_byte_s_per_token = work.prefill_bytes_per_token / hbm if work else 0.0
        self._state_pre_byte_s_per_seq = work.prefill_bytes_per_seq / hbm if work else 0.0
        # Prompt attention: FLOPs per causal pair vs writing and reading each new token's KV once.
        self._prefill_attn_s_per_pair = model.attention_flops_per_pair / tp / attn_flops
        self._prefill_kv_s_per_token = 2 * kv_token / kv_bw
        # Decode attention: both FLOPs and KV bytes grow with context; the larger factor wins
        # (MLA decodes in the latent space: few bytes, many FLOPs per pair).
        self._decode_attn_s_per_ctx = max(kv_token / kv_bw,
                                          model.mla_decode_flops_per_pair / tp / attn_flops)
        # Sliding-window layers read at most the window per sequence: their share of the
        # per-context and per-pair terms is kept apart and bounded (run_times.windowed_context_durations).
        self._window = model.sliding_window or 0
        self._window_ctx_s = self._window_pair_s = 0.0
        if self._window:
            share = model.num_sliding_layers / model.num_layers
            self._window_ctx_s = self._decode_attn_s_per_ctx * share
            self._window_pair_s = self._prefill_attn_s_per_pair * share
            self._decode_attn_s_per_ctx -= self._window_ctx_s
            self._prefill_attn_s_per_pair -= self._window_pair_s
        if sparse := sparse_attn_work(model, tp):  # DeepSeek-V3.2: the top-k tokens are the windowed terms
            self._window, (self._decode_attn_s_per_ctx, self._window_ctx_s, self._prefill_attn_s_per_pair,
                           self._window_pair_s) = sparse.topk, sparse.terms(
                1 / kv_bw, 1 / attn_flops, gpu.fp16_flops / gpu.fp8_flops if gpu.has_fp8 else 1.0)
        # decode attention away from block 16 (pagesim/sim/cost/paged_blocks.py), where its source applies
        self._block_term = block_term(gpu)
        self._dec_by_block: dict[int, tuple[float, float, float]] = {}
        # TP all-reduce: 2 per layer over tokens * hidden, ring moves 2 (tp-1)/tp of the data.
        if tp > 1:
            ring = 2 * (tp - 1) / tp
            ic = gpu.collective_bandwidth * c.interconnect_efficiency
            self._allreduce_s_per_token = model.num_tp_all_reduces * ring * model.hidden_size * d / ic
            self._allreduce_fixed_s = model.num_tp_all_reduces * self._collective_latency_s
            count, width = model.mixer_all_reduces  # Mamba v1's x_proj, a lightning norm's variance: one a layer
            if count:
                self._allreduce_s_per_token += count * ring * width * d / ic
                self._allreduce_fixed_s += count * self._collective_latency_s
        else:
            self._allreduce_s_per_token = 0.0
            self._allreduce_fixed_s = 0.0
        self._step_s = c.step_overhead_s
        self._per_seq_s = c.per_seq_overhead_s
        # Swap: each block = 2 * layers copies of (block_size * kv_token / (2 * layers)) bytes.
        self._swap_copies_per_block = 2 * model.num_layers
        self._swap_latency_s = c.swap_copy_latency_s
        self._swap_s_per_token_copy = kv_token / (2 * model.num_layers) / (
            gpu.pcie_bandwidth * c.pcie_efficiency)
        # Copy-on-write: read + write a block of every layer inside HBM.
        self._cow_s_per_token = 2 * kv_token / hbm
        self._cow_launch_s = c.copy_kernel_latency_s

    def iteration_time(self, shape: BatchShape) -> float:
        # Hot path: plain float arithmetic, no function calls beyond attribute reads.
        n_dec = shape.num_decode_seqs
        n_pre = shape.num_prefill_seqs
        tokens = shape.num_prefill_tokens + n_dec
        seqs = n_pre + n_dec
        t = self._step_s + self._per_seq_s * seqs
        if tokens:
            t += self._linear_time(tokens)
            t += tokens * (self._elementwise_s_per_token + self._allreduce_s_per_token)
            t += self._allreduce_fixed_s
        if seqs:
            lm = seqs * self._lm_s_per_seq
            t += lm if lm > self._lm_weight_s else self._lm_weight_s
        if shape.num_prefill_tokens:
            a = shape.prefill_attn_pairs * self._prefill_attn_s_per_pair
            if self._window:
                a += min(shape.prefill_attn_pairs, shape.num_prefill_tokens * self._window) * self._window_pair_s
            b = shape.num_prefill_tokens * self._prefill_kv_s_per_token
            t += a if a > b else b
            if self._state:
                t += self._state_prefill(shape)
        if self._state and n_dec:  # (where _decode_base adds it)
            t += n_dec * self._state_dec_s_per_seq
        if n_dec:
            if shape.block_size == 16 or self._block_term is None:
                t += shape.decode_context_tokens * self._decode_attn_s_per_ctx
                if self._window:
                    t += min(shape.decode_context_tokens, n_dec * self._window) * self._window_ctx_s
            else:
                per_seq, per_ctx, per_window_ctx = self.decode_terms(shape.block_size)
                t += n_dec * per_seq  # before the context read: decode_run_durations' base
                t += shape.decode_context_tokens * per_ctx
                if self._window:
                    t += min(shape.decode_context_tokens, n_dec * self._window) * per_window_ctx
        if shape.num_swap_blocks or shape.num_copy_blocks:
            t += self.block_move_time(shape)
        return t

    def decode_terms(self, block_size: int) -> tuple[float, float, float]:
        """Decode attention's (seconds per sequence, per context token, per sliding-layer context
        token) at `block_size`: 0 and the block-16 terms, with the block term where it applies."""
        terms = self._dec_by_block.get(block_size)
        if terms is None:
            terms = (0.0, self._decode_attn_s_per_ctx, self._window_ctx_s)
            if self._block_term is not None and block_size != 16:
                terms = self._block_term.decode_terms(*terms, block_size)
            self._dec_by_block[block_size] = terms
        return terms

    def _linear_time(self, tokens: int) -> float:
        """max(compute, weight read) of every matmul of the layers for a step of `tokens`."""
        lin = tokens * self._linear_s_per_token
        weights = self._linear_weight_s
        if self._moe_cache is not None:
            terms = self._moe_cache.get(tokens)
            if terms is None:
                terms = self._moe_cache[tokens] = self._moe_terms(tokens)
            lin += terms[0]
            weights += terms[1]
            return (lin if lin > weights else weights) + terms[2]
        return lin if lin > weights else weights

    def _moe_terms(self, tokens: int) -> tuple[float, float, float]:
        """Routed experts of all MoE layers on one GPU: (compute, weight read, EP exchange) seconds
        (the rules in pagesim/sim/cost/layer_ops.py: touched experts, EP ranks)."""
        m, moe = self.model, self.model.moe
        ranks = self.ep // self.tp if self.ep > 1 else 1
        routed = tokens * ranks
        split = self.ep if self.ep > 1 else self.tp  # experts over EP, or each expert over TP
        compute = 2 * routed * moe.experts_per_token * m.expert_params / split / self._lin_flops
        weights = (moe.expected_experts_touched(routed) * m.expert_params * m.expert_weight_element_bytes
                   / split / self._hbm)
        exchange = 0.0
        if ranks > 1:  # all-gather before, reduce-scatter after: each moves (ranks-1)/ranks of the buffer
            ic = self.gpu.collective_bandwidth * self.constants.interconnect_efficiency
            buffer = routed * m.expert_hidden_size * m.dtype_bytes  # the latent width where latent
            exchange = 2 * (buffer * (ranks - 1) / ranks / ic + self._collective_latency_s)
        n = moe.num_moe_layers
        return n * compute, n * weights, n * exchange

    def block_move_time(self, shape: BatchShape) -> float:
        """Swap over PCIe and copy-on-write in HBM (also the calibrated model's, which has no
        measurements of them)."""
        t = 0.0
        if shape.num_swap_blocks:
            t += shape.num_swap_blocks * self._swap_copies_per_block * (
                self._swap_latency_s + shape.block_size * self._swap_s_per_token_copy)
        if shape.num_copy_blocks:
            t += self._cow_launch_s + shape.num_copy_blocks * shape.block_size * self._cow_s_per_token
        return t

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        # iteration_time's sum in its own order, with the one term that changes (the context
        # read) added last, so every float is the one iteration_time returns
        base = self._decode_base(num_seqs)
        if block_size == 16 or self._block_term is None:
            per_ctx, per_window_ctx = self._decode_attn_s_per_ctx, self._window_ctx_s
        else:  # iteration_time adds the partial blocks (per sequence) to the base first
            per_seq, per_ctx, per_window_ctx = self.decode_terms(block_size)
            base += num_seqs * per_seq
        if self._window:
            return windowed_context_durations(base, per_ctx, per_window_ctx, self._window, num_seqs, context_tokens,
                                              num_steps)
        return linear_context_durations(base, per_ctx, num_seqs, context_tokens, num_steps)

    def _decode_base(self, n_dec: int) -> float:
        t = self._step_s + self._per_seq_s * n_dec
        t += self._linear_time(n_dec)
        t += n_dec * (self._elementwise_s_per_token + self._allreduce_s_per_token)
        t += self._allreduce_fixed_s
        lm = n_dec * self._lm_s_per_seq
        t += lm if lm > self._lm_weight_s else self._lm_weight_s
        if self._state:
            t += n_dec * self._state_dec_s_per_seq
        return t

    def _state_prefill(self, shape: BatchShape) -> float:
        """The chunked gated delta rule over a step's prompt tokens: max(compute, bytes)."""
        compute = shape.num_prefill_tokens * self._state_pre_flop_s_per_token
        nbytes = (shape.num_prefill_tokens * self._state_pre_byte_s_per_token
                  + shape.num_prefill_seqs * self._state_pre_byte_s_per_seq)
        return compute if compute > nbytes else nbytes

    def state_seconds(self, shape: BatchShape) -> float:
        """The linear-attention layers' recurrent kernel in a step (0 without such layers)."""
        if not self._state:
            return 0.0
        return (self._state_prefill(shape) if shape.num_prefill_tokens else 0.0) \
            + shape.num_decode_seqs * self._state_dec_s_per_seq

    def breakdown(self, shape: BatchShape) -> dict[str, float]:
        """The same sum as `iteration_time`, part by part (slow path, for reports and tests)."""
        tokens, seqs = shape.num_tokens, shape.num_seqs
        parts = {
            "overhead": self._step_s + self._per_seq_s * seqs,
            "linear": self._linear_time(tokens) if tokens else 0.0,
            "elementwise": tokens * self._elementwise_s_per_token,
            "allreduce": (tokens * self._allreduce_s_per_token + self._allreduce_fixed_s)
            if tokens else 0.0,
            "lm_head": max(seqs * self._lm_s_per_seq, self._lm_weight_s) if seqs else 0.0,
            "prefill_attention": max(shape.prefill_attn_pairs * self._prefill_attn_s_per_pair
                                     + min(shape.prefill_attn_pairs, shape.num_prefill_tokens * self._window)
                                     * self._window_pair_s,
                                     shape.num_prefill_tokens * self._prefill_kv_s_per_token)
            if shape.num_prefill_tokens else 0.0,
            "decode_attention": self._decode_attention(shape) if shape.num_decode_seqs else 0.0,
            **({"linear_attention": self.state_seconds(shape)} if self._state else {}),
            "swap": shape.num_swap_blocks * self._swap_copies_per_block * (
                self._swap_latency_s + shape.block_size * self._swap_s_per_token_copy),
            "copy": (self._cow_launch_s + shape.num_copy_blocks * shape.block_size
                     * self._cow_s_per_token) if shape.num_copy_blocks else 0.0,
        }
        return parts

    def _decode_attention(self, shape: BatchShape) -> float:
        per_seq, per_ctx, per_window_ctx = self.decode_terms(shape.block_size)
        return (shape.num_decode_seqs * per_seq + shape.decode_context_tokens * per_ctx
                + min(shape.decode_context_tokens, shape.num_decode_seqs * self._window) * per_window_ctx)

    def swap_seconds_per_byte(self, block_size: int) -> float:
        """Swap time per KV byte moved at `block_size` (paper Fig. 19a: worse for small blocks)."""
        block_bytes = block_size * kv_bytes_per_token_per_gpu(self.model, self.tp)
        swap = self.breakdown(BatchShape(num_swap_blocks=1, block_size=block_size))["swap"]
        return swap / block_bytes

    def describe(self) -> dict:
        ep = {"ep": self.ep} if self.ep > 1 else {}
        return {"name": self.name, "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp, **ep,
                **asdict(self.constants)}
