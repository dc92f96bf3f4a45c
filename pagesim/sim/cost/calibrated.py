"""The `calibrated` cost model: operator-level terms fitted to real GPU timings.

Ground truth: Vidur's per-operator measurements on A100-80GB, H100-80GB and A40
(../shared/data/gpu_profiles, MIT). `pagesim calibrate fit` (pagesim/sim/cost/fit.py) fits the terms
below per GPU and writes them to pagesim/sim/data/calibrated/<gpu>.json; this module only reads
those numbers (standard library), so an installed pagesim needs no data directory.

Terms, all per GPU of a tensor-parallel group (TP splits heads, the MLP and the vocabulary):

- GEMM, M tokens x K in -> N out (qkv, output projection, MLP up/gate+up, down, LM head):
      t = floor + ((bytes * s_per_byte)^p + (flops * s_per_flop)^p)^(1/p)
  bytes = 2 (K N + M K + M N) (weights and activations, fp16), flops = 2 ceil(M / tile) tile K N.
  The p-norm is a smooth maximum: p = 1 adds the memory and compute times, large p is the hard
  roofline corner; the fitted p (1.25-1.75) is the gradual transition real GEMMs show between
  ~64 and ~512 tokens. The tile (64 or 128 rows, fitted) is the M-granularity of the tensor-core
  kernels: a step of 65 tokens costs the compute of 128.
  One curve per GPU, fitted across all operators, models and TP degrees.
- Elementwise kernels (the two norms, rotary, activation, residual add, embedding lookup):
      t = floor + s_per_byte * bytes moved (read + write)
  one (floor, slope) per kernel kind. The floor is the launch-and-tail latency that makes these
  kernels cost ~25 us per layer even at one token.
- Attention, from the A100 FlashAttention file (one Llama-2-70B-like shape at TP 2), per layer:
      decode  t = floor + s_per_seq * seqs + s_per_byte * KV bytes read
      prefill t = floor + s_per_flop * causal-pair FLOPs + s_per_byte * new-token bytes
  (new-token bytes: each new token's Q read and O written, this GPU's query heads; the file's
  KV-cache write, attn_input_reshape, measures 0 throughout, so K and V writes carry no cost)
  Transfer rule: the bytes and FLOPs are this model's own (its query and KV heads per GPU, its
  head size), so the terms carry over to any shape; to another GPU the per-byte terms
  scale by HBM bandwidth (A100-80GB's / the GPU's), the per-FLOP term by FP16 FLOP/s, and the
  floors and per-sequence terms are kept.
- TP all-reduce (2 per layer, of tokens x hidden fp16): t = floor + s_per_byte * bytes, one line per
  group size, from the DGX A100 / DGX H100 NCCL files.
- CPU per step: t = floor + s_per_seq * sequences (+ a TP floor), from the A100 vLLM overhead file
  (the host does this work, so every GPU gets the same terms).

GPUs without measurements get the nearest measured GPU's coefficients scaled through the specs
(`scale_calibration`): s_per_byte terms by its HBM bandwidth ratio, s_per_flop terms by its FP16
FLOP/s ratio, all-reduce s_per_byte by its interconnect ratio; floors, p, tile and CPU terms
kept. Nearest = smallest distance in (log FP16 FLOP/s, log HBM bandwidth): A100-40GB comes from
A100-80GB, H200 from H100-80GB, and so does any GPUSpec a user defines.

Swap and copy-on-write block moves are not in the measurements: they use the roofline's terms.
The attention file is of block 16 only; on A100s decode attention at other block sizes adds the
block-table gather and partial-last-block term of pagesim/sim/cost/paged_blocks.py (fitted to the
paper's Fig. 18(a)); elsewhere block size does not enter the step time.

Modern models (MoE and expert parallelism, MLA, sliding-window layers, quantized and FP8 weights)
use the same terms on the GEMMs pagesim/sim/cost/layer_ops.py lists per group of equal layers,
with attention's bytes and FLOPs of their own kind (docs/calibration.md, "Modern models").

Speed: the simulator calls `iteration_time` ~1e5 times. The token-count part (all GEMMs and
elementwise kernels of all layers, the all-reduce) and the sequence-count part (LM head, CPU) are
cached per integer count, attention is linear in the BatchShape's sums, so a call is two dict
lookups and a few multiply-adds.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from importlib import resources

from pagesim.sim.cost.linear_attn import state_work
from pagesim.sim.cost.base import BatchShape, CostModel
from pagesim.sim.run_times import linear_context_durations, windowed_context_durations
from pagesim.sim.cost.layer_ops import FUSED_MOE_OPS, LayerShape, check_parallelism, layer_groups
from pagesim.sim.cost.paged_blocks import block_term
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.cost.sparse_attn import sparse_attn_work
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model, kv_bytes_per_token_per_gpu

from pagesim.sim.cost.calibration import MEASURED_GPUS, ROUTING_KIND, Calibration, Line


def ring_all_reduce_line(gpu: GPUSpec, workers: int) -> Line:
    """NCCL's ring all-reduce over a PCIe link (alpha-beta model, Patarasuk and Yuan 2009): a
    reduce-scatter and an all-gather of workers - 1 steps each, every step one link latency, and
    2 (n - 1) / n of the message through each GPU's link."""
    link = gpu.link
    return Line(2 * (workers - 1) * link.latency_s, 2 * (workers - 1) / workers / gpu.collective_bandwidth)


def scale_calibration(cal: Calibration, measured: GPUSpec, target: GPUSpec) -> Calibration:
    """The rule for GPUs without measurements (module docstring): per-byte terms by HBM
    bandwidth, per-FLOP terms by FP16 FLOP/s, all-reduce per-byte by interconnect bandwidth;
    over PCIe (the measured lines are NVLink's) the all-reduce is ring_all_reduce_line."""
    bw = measured.hbm_bandwidth / target.hbm_bandwidth
    fl = measured.fp16_flops / target.fp16_flops
    ic = measured.interconnect_bandwidth / target.interconnect_bandwidth
    if target.link.kind == "pcie":
        all_reduce = {k: ring_all_reduce_line(target, k) for k in cal.all_reduce}
    else:
        all_reduce = {k: Line(v.floor_s, v.slope * ic) for k, v in cal.all_reduce.items()}
    a = cal.attention
    return Calibration(
        gpu=target.name,
        gemm=replace(cal.gemm, s_per_byte=cal.gemm.s_per_byte * bw, s_per_flop=cal.gemm.s_per_flop * fl),
        elementwise={k: Line(v.floor_s, v.slope * bw) for k, v in cal.elementwise.items()},
        attention=replace(a, decode_s_per_kv_byte=a.decode_s_per_kv_byte * bw,
                          prefill_s_per_flop=a.prefill_s_per_flop * fl,
                          prefill_s_per_token_byte=a.prefill_s_per_token_byte * bw),
        all_reduce=all_reduce,
        cpu=cal.cpu,
        source={"scaled_from": cal.gpu, "hbm_bandwidth_ratio": bw, "fp16_flops_ratio": fl,
                "interconnect_ratio": ic, "all_reduce": f"{target.link.kind} ring" if target.link.kind == "pcie"
                else "measured NVLink lines, per-byte by interconnect_ratio"})


def nearest_measured_gpu(gpu: GPUSpec | str) -> GPUSpec:
    """The measured GPU closest in (log FP16 FLOP/s, log HBM bandwidth); itself if measured."""
    gpu = get_gpu(gpu)
    if gpu.name in MEASURED_GPUS:
        return gpu

    def distance(m: GPUSpec) -> float:
        return (math.log(m.fp16_flops / gpu.fp16_flops) ** 2 + math.log(m.hbm_bandwidth / gpu.hbm_bandwidth) ** 2)

    return min((get_gpu(n) for n in MEASURED_GPUS), key=distance)


def shipped_calibration(gpu: GPUSpec | str) -> Calibration:
    """The shipped coefficients of a GPU, scaled through the specs from the nearest measured one
    where it has none."""
    gpu = get_gpu(gpu)
    base = nearest_measured_gpu(gpu)
    where = f"pagesim/sim/data/calibrated/{base.name}.json"
    text = resources.files("pagesim.sim").joinpath("data", "calibrated", f"{base.name}.json").read_text()
    cal = Calibration.from_json(json.loads(text), where)
    return cal if base.name == gpu.name else scale_calibration(cal, base, gpu)


# ----------------------------------------------------------------------------- the model

class CalibratedCostModel(CostModel):
    """Step time = sum of fitted operator terms for this (model, GPU, TP); see the module docstring."""

    name = "calibrated"

    def __init__(self, model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1,
                 calibration: Calibration | None = None, ep: int = 1) -> None:
        model, gpu = get_model(model), get_gpu(gpu)
        if tp <= 0:
            raise ValueError("tp must be positive")
        check_parallelism(model, tp, ep)
        self.model, self.gpu, self.tp, self.ep = model, gpu, tp, ep
        self.calibration = cal = calibration or shipped_calibration(gpu)
        self.shape = shape = LayerShape.of(model, tp)
        d = model.dtype_bytes
        layers = model.num_attention_layers  # (linear-attention layers: the state terms below)
        a = cal.attention
        # W8A8 FP8 GEMMs: the fitted FP16 compute term times fp16 / fp8 FLOP/s of this GPU
        self._fp8_flop_scale = gpu.fp16_flops / gpu.fp8_flops if gpu.has_fp8 else 1.0
        # W4A4 NVFP4 GEMMs likewise at fp16 / fp4 FLOP/s; 0 without FP4 tensor cores (weight-only)
        self._fp4_flop_scale = gpu.fp16_flops / gpu.fp4_flops if gpu.has_fp4 else 0.0
        kv_token_layer = kv_bytes_per_token_per_gpu(model, tp) // layers  # this GPU's K+V (or latent) of one token
        # FLOPs of one (query, key) pair in one layer on this GPU, prefill (MHA with the model's
        # q/k and v head sizes) and decode (MLA: in the latent space)
        flops_pair_layer = 4 * shape.q_per_gpu if model.mla is None else model.attention_flops_per_pair // layers // tp
        # full-attention (and MLA) layers read every context token; sliding layers at most the
        # window per sequence, so their share is kept apart (iteration_time bounds it)
        full, sliding = layers - model.num_sliding_layers, model.num_sliding_layers
        self._window = model.sliding_window or 0
        ctx_layer = a.decode_s_per_kv_byte * kv_token_layer
        if model.mla is not None:  # the latent read or the heads' FLOPs over it, whichever is longer
            ctx_layer = max(ctx_layer, a.prefill_s_per_flop * (model.mla_decode_flops_per_pair // layers // tp))
        # one kernel a mixer layer, attention or linear attention's recurrent kernel (both in a parallel-mixer layer)
        self._dec_floor = model.num_mixer_kernels * a.decode_floor_s
        self._dec_per_seq = layers * a.decode_s_per_seq
        self._dec_per_ctx = (layers * a.decode_s_per_kv_byte * kv_token_layer if model.mla is None and not sliding
                             else full * ctx_layer)
        self._dec_per_window_ctx = sliding * ctx_layer
        # decode attention away from block 16 (pagesim/sim/cost/paged_blocks.py), where its source applies
        self._block_term = block_term(gpu)
        self._dec_by_block: dict[int, tuple[float, float, float]] = {}
        self._pre_floor = model.num_mixer_kernels * a.prefill_floor_s
        self._pre_per_pair = full * a.prefill_s_per_flop * flops_pair_layer
        self._pre_per_window_pair = sliding * a.prefill_s_per_flop * flops_pair_layer
        self._pre_per_token = layers * a.prefill_s_per_token_byte * shape.attention_token_bytes
        if sparse := sparse_attn_work(model, tp):  # DeepSeek-V3.2: the top-k tokens are the windowed terms
            self._window, (self._dec_per_ctx, self._dec_per_window_ctx, self._pre_per_pair, self._pre_per_window_pair) \
                = sparse.topk, sparse.terms(a.decode_s_per_kv_byte, a.prefill_s_per_flop, self._fp8_flop_scale)
        self._allreduce_bytes_per_token = model.hidden_size * d
        # linear-attention layers' recurrent kernel (pagesim/sim/cost/linear_attn.py), not measured:
        # priced through the attention kernels' fitted slopes, the measured kernels most alike (a
        # head-parallel kernel streaming per-sequence cache from HBM; tensor-core chunks in prefill):
        # every byte at the decode KV read's seconds a byte (a bandwidth: 2.6 TB/s on the H100; the
        # prefill per-token byte term also carries the attention kernel's other per-token work),
        # prefill's FLOPs at prefill attention's seconds a FLOP, added as that line adds its terms
        # (docs/calibration.md, "Linear attention")
        work = state_work(model, tp)
        self._state = work is not None
        self._state_dec_per_seq = a.decode_s_per_kv_byte * work.decode_bytes_per_seq if work else 0.0
        self._state_pre_per_token = (a.prefill_s_per_flop * work.prefill_flops_per_token
                                     + a.decode_s_per_kv_byte * work.prefill_bytes_per_token) if work else 0.0
        self._state_pre_per_seq = a.decode_s_per_kv_byte * work.prefill_bytes_per_seq if work else 0.0
        self._token_cache: dict[int, float] = {}
        self._seq_cache: dict[int, float] = {}
        # swap and copy-on-write moves are not measured: the roofline's terms
        self._block_moves = RooflineCostModel(model, gpu, tp).block_move_time

    def layer_seconds(self, tokens: int) -> list[tuple[int, float]]:
        """(layers, seconds of one of them) per group of equal layers (layer_ops.layer_groups):
        GEMMs, elementwise kernels and the TP all-reduces (and a MoE layer's EP exchange)."""
        cal, d = self.calibration, self.model.dtype_bytes
        allreduce = cal.all_reduce_seconds(self.tp, tokens * self._allreduce_bytes_per_token)
        out = []
        for group in layer_groups(self.model, tokens, self.tp, self.ep):
            s = group.shape
            ops, adds = s.elementwise_operators
            layer = sum([cal.gemm_seconds(g, d, self._fp8_flop_scale, self._fp4_flop_scale) for g in group.gemms]
                        + [cal.operator_seconds(op, s, tokens) for op in ops])
            layer += adds * cal.operator_seconds("add", s, tokens)
            layer += sum(cal.routing_seconds(b) for b in group.routing_bytes + group.mixer_bytes)
            seconds = layer + s.all_reduces * allreduce  # one all-reduce a block (a parallel mixer: two)
            seconds += sum(cal.all_reduce_seconds(self.tp, b) for b in group.mixer_all_reduce_bytes)  # Mamba v1, lightning
            if group.ep_exchange_bytes:  # expert parallelism: all-gather + reduce-scatter over the ranks
                seconds += cal.all_reduce_seconds(group.ep_ranks, group.ep_exchange_bytes)
            out.append((group.num_layers, seconds))
        return out

    def tokens_seconds(self, tokens: int) -> float:
        """GEMMs and elementwise kernels of every layer, the embedding and TP all-reduces."""
        total = 0.0
        for layers, seconds in self.layer_seconds(tokens):
            total += layers * seconds
        return total + self.calibration.operator_seconds("emb", self.shape, tokens)

    def seqs_seconds(self, seqs: int) -> float:
        """LM head over the sampled rows (vocabulary split over TP) and host-side work."""
        lm = self.calibration.gemm.seconds(seqs, self.model.hidden_size, self.model.vocab_size // self.tp,
                                           self.model.dtype_bytes)
        return lm + self.calibration.cpu.seconds(seqs, self.tp)

    def token_kernel_split(self, tokens: int) -> tuple[float, float, int, float]:
        """tokens_seconds less its TP all-reduces, split for engine profiles: (busy seconds, launch
        floors, number of kernels) of every layer's GEMMs (a fused MoE projection is one kernel)
        and elementwise kernels and the embedding, and the seconds no engine GPU-time scale applies
        to: the MoE layers' EP exchange (link time) and the fused-MoE expert GEMMs' busy time. The
        scale corrects the dense measurements to an engine's cuBLAS and attention kernels; the
        expert GEMMs are vLLM's Triton kernel, whose priced time was checked against that kernel's
        own H100 timing (docs/calibration.md, MoE section), so it is taken as it is."""
        cal, d = self.calibration, self.model.dtype_bytes
        total_busy = total_floors = unscaled = 0.0
        total_kernels = 0
        for group in layer_groups(self.model, tokens, self.tp, self.ep):
            s = group.shape
            busy = floors = experts = 0.0
            kernels = 0
            for g in group.gemms:
                floor = cal.gemm.floor_s
                seconds = cal.gemm_seconds(g, d, self._fp8_flop_scale, self._fp4_flop_scale) - floor
                if g.op in FUSED_MOE_OPS:
                    experts += seconds
                else:
                    busy += seconds
                floors += floor
                kernels += 1
            ops, adds = s.elementwise_operators
            for op in ops + ("add",) * adds:
                floor = cal.operator_floor(op, s)
                if op == "attn_rope" and not s.rotary:
                    continue
                busy += cal.operator_seconds(op, s, tokens) - floor
                floors += floor
                kernels += 1
            # a MoE layer's routing kernels (layer_ops.moe_routing_bytes), a linear-attention layer's
            # conv and gated norm: elementwise kernels on the residual add's line
            for nbytes in group.routing_bytes + group.mixer_bytes:
                line = cal.elementwise[ROUTING_KIND]
                busy += line.slope * nbytes
                floors += line.floor_s
                kernels += 1
            if group.ep_exchange_bytes:
                unscaled += group.num_layers * cal.all_reduce_seconds(group.ep_ranks, group.ep_exchange_bytes)
            unscaled += group.num_layers * experts
            total_busy += group.num_layers * busy
            total_floors += group.num_layers * floors
            total_kernels += group.num_layers * kernels
        s = self.shape
        emb_floor = cal.operator_floor("emb", s)
        return (total_busy + cal.operator_seconds("emb", s, tokens) - emb_floor, total_floors + emb_floor,
                total_kernels + 1, unscaled)

    def lm_head_split(self, seqs: int) -> tuple[float, float]:
        """(busy seconds, launch floor) of the LM head over `seqs` sampled rows."""
        t = self.calibration.gemm.seconds(seqs, self.model.hidden_size, self.model.vocab_size // self.tp,
                                          self.model.dtype_bytes)
        return t - self.calibration.gemm.floor_s, self.calibration.gemm.floor_s

    def iteration_time(self, shape: BatchShape) -> float:
        # Hot path: two cached lookups, then linear attention terms; the decode context read last
        # (decode_run_times adds only that term to a fixed base).
        n_dec = shape.num_decode_seqs
        tokens = shape.num_prefill_tokens + n_dec
        seqs = shape.num_prefill_seqs + n_dec
        t = self._token_cache.get(tokens)
        if t is None:
            t = self._token_cache[tokens] = self.tokens_seconds(tokens) if tokens else 0.0
        s = self._seq_cache.get(seqs)
        if s is None:
            s = self._seq_cache[seqs] = self.seqs_seconds(seqs)
        t += s
        if shape.num_prefill_tokens:
            t += (self._pre_floor + shape.prefill_attn_pairs * self._pre_per_pair
                  + shape.num_prefill_tokens * self._pre_per_token)
            if self._window:  # sliding layers: each new token attends to at most the window
                t += min(shape.prefill_attn_pairs, shape.num_prefill_tokens * self._window) * self._pre_per_window_pair
        if self._state:  # linear attention's recurrent kernel (not paged: no block term)
            t += (shape.num_prefill_tokens * self._state_pre_per_token + shape.num_prefill_seqs * self._state_pre_per_seq
                  + n_dec * self._state_dec_per_seq)
        if shape.num_swap_blocks or shape.num_copy_blocks:
            t += self._block_moves(shape)
        if n_dec:
            if shape.block_size == 16 or self._block_term is None:
                per_seq, per_ctx, per_window_ctx = self._dec_per_seq, self._dec_per_ctx, self._dec_per_window_ctx
            else:
                per_seq, per_ctx, per_window_ctx = self.decode_terms(shape.block_size)
            t += self._dec_floor + n_dec * per_seq
            if self._window:  # run_times.windowed_context_durations: the same two terms, in this order
                t += shape.decode_context_tokens * per_ctx
                ctx, cap = shape.decode_context_tokens, n_dec * self._window
                return t + (ctx if ctx < cap else cap) * per_window_ctx
            return t + shape.decode_context_tokens * per_ctx
        return t

    def decode_terms(self, block_size: int) -> tuple[float, float, float]:
        """Decode attention's (seconds per sequence, per context token, per sliding-layer context
        token) at `block_size`: the measured block-16 terms, with the block term where it applies."""
        terms = self._dec_by_block.get(block_size)
        if terms is None:
            terms = (self._dec_per_seq, self._dec_per_ctx, self._dec_per_window_ctx)
            if self._block_term is not None and block_size != 16:
                terms = self._block_term.decode_terms(*terms, block_size)
            self._dec_by_block[block_size] = terms
        return terms

    def decode_attention_seconds(self, num_seqs: int, context_tokens: int, block_size: int = 16) -> float:
        """Decode attention of all layers for `num_seqs` sequences holding `context_tokens` in all
        (for reports; iteration_time adds the same terms inline)."""
        per_seq, per_ctx, per_window_ctx = self.decode_terms(block_size)
        t = self._dec_floor + num_seqs * per_seq + context_tokens * per_ctx
        return t + min(context_tokens, num_seqs * self._window) * per_window_ctx if self._window else t

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        # the base is iteration_time's sum before its context terms, so every float equals it
        base = self.plain_decode_base(num_seqs, block_size)
        _, per_ctx, per_window_ctx = self.decode_terms(block_size)
        if self._window:
            return windowed_context_durations(base, per_ctx, per_window_ctx, self._window, num_seqs,
                                              context_tokens, num_steps)
        return linear_context_durations(base, per_ctx, num_seqs, context_tokens, num_steps)

    def describe(self) -> dict:
        ep = {"ep": self.ep} if self.ep > 1 else {}
        return {"name": self.name, "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp, **ep,
                "calibration_source": self.calibration.source or {"fitted": self.calibration.gpu}}
