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

Speed: the simulator calls `iteration_time` ~1e5 times. The token-count part (all GEMMs and
elementwise kernels of all layers, the all-reduce) and the sequence-count part (LM head, CPU) are
cached per integer count, attention is linear in the BatchShape's sums, so a call is two dict
lookups and a few multiply-adds.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from importlib import resources

from pagesim.sim.cost.base import BatchShape, CostModel, linear_context_durations
from pagesim.sim.cost.roofline import RooflineCostModel
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu, get_model, kv_bytes_per_token_per_gpu

CALIBRATION_FORMAT = "pagesim-calibration/1"
# Operators of one layer, in the measurement files' names; `add` is one residual add.
GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPERATORS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
LAYER_OPERATORS = GEMM_OPERATORS + ELEMENTWISE_OPERATORS
STEP_OPERATORS = ("emb",)  # once per step, not per layer
# Kernel kind of each elementwise operator (the two norms share one fit).
ELEMENTWISE_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
                    "mlp_act": "act", "add": "add", "emb": "emb"}
RESIDUAL_ADDS_PER_LAYER = 2  # after attention and after the MLP
# Measured GPUs and what the others are scaled from.
MEASURED_GPUS = ("a100-80gb", "h100-80gb", "a40-48gb")


@dataclass(frozen=True)
class LayerShape:
    """What the operator terms need: a model's layer, split over `tp` GPUs, and whether it has a
    rotary kernel (the llama family; OPT has learned positions)."""

    model: ModelSpec
    tp: int = 1
    rotary: bool = True

    @classmethod
    def of(cls, model: ModelSpec, tp: int) -> "LayerShape":
        return cls(model, tp, rotary=model.architecture == "llama")

    @property
    def hidden_size(self) -> int:
        return self.model.hidden_size

    @property
    def ffn_size(self) -> int:
        return self.model.ffn_size

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
        """(K, N) of a layer GEMM on one GPU."""
        h = self.hidden_size
        if op == "attn_pre_proj":
            return h, self.q_per_gpu + 2 * self.kv_per_gpu
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


# ----------------------------------------------------------------------------- coefficients

@dataclass(frozen=True)
class GemmCurve:
    floor_s: float
    s_per_byte: float
    s_per_flop: float
    sharpness: float  # p of the smooth maximum
    tile: int = 64

    def seconds(self, m: int, k: int, n: int, dtype_bytes: int = 2) -> float:
        if m <= 0:
            return 0.0
        mem = (k * n + m * (k + n)) * dtype_bytes * self.s_per_byte
        comp = 2 * (-(-m // self.tile) * self.tile) * k * n * self.s_per_flop
        p = self.sharpness
        return self.floor_s + (mem ** p + comp ** p) ** (1.0 / p)


@dataclass(frozen=True)
class Line:
    """floor + slope * x (x in bytes, sequences, ...)."""

    floor_s: float
    slope: float

    def seconds(self, x: float) -> float:
        return self.floor_s + self.slope * x


@dataclass(frozen=True)
class AttentionTerms:
    decode_floor_s: float
    decode_s_per_seq: float
    decode_s_per_kv_byte: float
    prefill_floor_s: float
    prefill_s_per_flop: float
    prefill_s_per_token_byte: float

    def decode_seconds(self, seqs: int, kv_bytes_read: float) -> float:
        return self.decode_floor_s + self.decode_s_per_seq * seqs + self.decode_s_per_kv_byte * kv_bytes_read

    def prefill_seconds(self, flops: float, new_token_bytes: float) -> float:
        return self.prefill_floor_s + self.prefill_s_per_flop * flops + self.prefill_s_per_token_byte * new_token_bytes


@dataclass(frozen=True)
class CpuTerms:
    floor_s: float
    s_per_seq: float
    tp_floor_s: float  # extra per step when TP > 1 (workers to drive)

    def seconds(self, seqs: int, tp: int) -> float:
        return self.floor_s + self.s_per_seq * seqs + (self.tp_floor_s if tp > 1 else 0.0)


@dataclass(frozen=True)
class Calibration:
    """Fitted coefficients of one GPU (see the module docstring for each term)."""

    gpu: str
    gemm: GemmCurve
    elementwise: dict[str, Line]          # kernel kind -> line over bytes
    attention: AttentionTerms
    all_reduce: dict[int, Line]           # group size -> line over bytes per GPU
    cpu: CpuTerms
    source: dict = field(default_factory=dict)  # what it was fitted or scaled from

    def operator_seconds(self, op: str, shape: LayerShape, tokens: int) -> float:
        """Predicted median seconds of one operator of one layer (or `emb`, once per step)."""
        if op in GEMM_OPERATORS:
            k, n = shape.gemm_dims(op)
            return self.gemm.seconds(tokens, k, n, shape.dtype_bytes)
        if op == "attn_rope" and not shape.rotary:
            return 0.0
        return self.elementwise[ELEMENTWISE_KIND[op]].seconds(shape.elementwise_bytes(op, tokens))

    def operator_floor(self, op: str, shape: LayerShape) -> float:
        """The launch-and-tail floor inside operator_seconds (what a CUDA graph takes away), and
        0 for an operator the shape does not run."""
        if op in GEMM_OPERATORS:
            return self.gemm.floor_s
        if op == "attn_rope" and not shape.rotary:
            return 0.0
        return self.elementwise[ELEMENTWISE_KIND[op]].floor_s

    def all_reduce_seconds(self, workers: int, nbytes: float) -> float:
        if workers <= 1:
            return 0.0
        sizes = sorted(self.all_reduce)
        # an unmeasured group size takes the next larger measured one (NCCL rings get slower with size)
        size = next((s for s in sizes if s >= workers), sizes[-1])
        return self.all_reduce[size].seconds(nbytes)

    def to_json(self) -> dict:
        return {"format": CALIBRATION_FORMAT, "gpu": self.gpu, "gemm": asdict(self.gemm),
                "elementwise": {k: asdict(v) for k, v in self.elementwise.items()},
                "attention": asdict(self.attention),
                "all_reduce": {str(k): asdict(v) for k, v in sorted(self.all_reduce.items())},
                "cpu": asdict(self.cpu), "source": self.source}

    @classmethod
    def from_json(cls, data: dict, where: str = "calibration") -> "Calibration":
        if data.get("format") != CALIBRATION_FORMAT:
            raise ValueError(f"{where}: field 'format' is {data.get('format')!r}, expected {CALIBRATION_FORMAT!r}")
        try:
            return cls(gpu=data["gpu"], gemm=GemmCurve(**data["gemm"]),
                       elementwise={k: Line(**v) for k, v in data["elementwise"].items()},
                       attention=AttentionTerms(**data["attention"]),
                       all_reduce={int(k): Line(**v) for k, v in data["all_reduce"].items()},
                       cpu=CpuTerms(**data["cpu"]), source=data.get("source", {}))
        except (KeyError, TypeError) as e:
            raise ValueError(f"{where}: malformed calibration ({e})") from None


def scale_calibration(cal: Calibration, measured: GPUSpec, target: GPUSpec) -> Calibration:
    """The rule for GPUs without measurements (module docstring): per-byte terms by HBM
    bandwidth, per-FLOP terms by FP16 FLOP/s, all-reduce per-byte by interconnect bandwidth."""
    bw = measured.hbm_bandwidth / target.hbm_bandwidth
    fl = measured.fp16_flops / target.fp16_flops
    ic = measured.interconnect_bandwidth / target.interconnect_bandwidth
    a = cal.attention
    return Calibration(
        gpu=target.name,
        gemm=replace(cal.gemm, s_per_byte=cal.gemm.s_per_byte * bw, s_per_flop=cal.gemm.s_per_flop * fl),
        elementwise={k: Line(v.floor_s, v.slope * bw) for k, v in cal.elementwise.items()},
        attention=replace(a, decode_s_per_kv_byte=a.decode_s_per_kv_byte * bw,
                          prefill_s_per_flop=a.prefill_s_per_flop * fl,
                          prefill_s_per_token_byte=a.prefill_s_per_token_byte * bw),
        all_reduce={k: Line(v.floor_s, v.slope * ic) for k, v in cal.all_reduce.items()},
        cpu=cal.cpu,
        source={"scaled_from": cal.gpu, "hbm_bandwidth_ratio": bw, "fp16_flops_ratio": fl,
                "interconnect_ratio": ic})


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
                 calibration: Calibration | None = None) -> None:
        model, gpu = get_model(model), get_gpu(gpu)
        if tp <= 0:
            raise ValueError("tp must be positive")
        self.model, self.gpu, self.tp = model, gpu, tp
        self.calibration = cal = calibration or shipped_calibration(gpu)
        self.shape = shape = LayerShape.of(model, tp)
        d = model.dtype_bytes
        layers = model.num_layers
        a = cal.attention
        kv_token_layer = kv_bytes_per_token_per_gpu(model, tp) // layers  # this GPU's K+V of one token
        flops_pair_layer = 4 * shape.q_per_gpu
        self._dec_floor = layers * a.decode_floor_s
        self._dec_per_seq = layers * a.decode_s_per_seq
        self._dec_per_ctx = layers * a.decode_s_per_kv_byte * kv_token_layer
        self._pre_floor = layers * a.prefill_floor_s
        self._pre_per_pair = layers * a.prefill_s_per_flop * flops_pair_layer
        self._pre_per_token = layers * a.prefill_s_per_token_byte * shape.attention_token_bytes
        self._allreduce_bytes_per_token = model.hidden_size * d
        self._token_cache: dict[int, float] = {}
        self._seq_cache: dict[int, float] = {}
        # swap and copy-on-write moves are not measured: the roofline's terms
        self._block_moves = RooflineCostModel(model, gpu, tp).block_move_time

    def tokens_seconds(self, tokens: int) -> float:
        """GEMMs and elementwise kernels of every layer, the embedding and TP all-reduces."""
        cal, s = self.calibration, self.shape
        layer = sum(cal.operator_seconds(op, s, tokens) for op in LAYER_OPERATORS)
        layer += (RESIDUAL_ADDS_PER_LAYER - 1) * cal.operator_seconds("add", s, tokens)
        allreduce = 2 * cal.all_reduce_seconds(self.tp, tokens * self._allreduce_bytes_per_token)
        return self.model.num_layers * (layer + allreduce) + cal.operator_seconds("emb", s, tokens)

    def seqs_seconds(self, seqs: int) -> float:
        """LM head over the sampled rows (vocabulary split over TP) and host-side work."""
        lm = self.calibration.gemm.seconds(seqs, self.model.hidden_size, self.model.vocab_size // self.tp,
                                           self.model.dtype_bytes)
        return lm + self.calibration.cpu.seconds(seqs, self.tp)

    def token_kernel_split(self, tokens: int) -> tuple[float, float, int]:
        """tokens_seconds less its all-reduces, split for engine profiles: (busy seconds, launch
        floors, number of kernels) of every layer's GEMMs and elementwise kernels and the embedding."""
        cal, s = self.calibration, self.shape
        ops = list(LAYER_OPERATORS) + ["add"] * (RESIDUAL_ADDS_PER_LAYER - 1)
        busy = floors = 0.0
        kernels = 0
        for op in ops:
            floor = cal.operator_floor(op, s)
            if op == "attn_rope" and not s.rotary:
                continue
            busy += cal.operator_seconds(op, s, tokens) - floor
            floors += floor
            kernels += 1
        layers = self.model.num_layers
        emb_floor = cal.operator_floor("emb", s)
        return (layers * busy + cal.operator_seconds("emb", s, tokens) - emb_floor, layers * floors + emb_floor,
                layers * kernels + 1)

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
        if shape.num_swap_blocks or shape.num_copy_blocks:
            t += self._block_moves(shape)
        if n_dec:
            t += self._dec_floor + n_dec * self._dec_per_seq
            return t + shape.decode_context_tokens * self._dec_per_ctx
        return t

    def decode_attention_seconds(self, num_seqs: int, context_tokens: int) -> float:
        """Decode attention of all layers for `num_seqs` sequences holding `context_tokens` in all
        (for reports; iteration_time adds the same three terms inline)."""
        return self._dec_floor + num_seqs * self._dec_per_seq + context_tokens * self._dec_per_ctx

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        # the base is iteration_time's sum before its last term, so every float equals it
        base = self.iteration_time(BatchShape(num_decode_seqs=num_seqs, block_size=block_size))
        return linear_context_durations(base, self._dec_per_ctx, num_seqs, context_tokens, num_steps)

    def describe(self) -> dict:
        return {"name": self.name, "model": self.model.name, "gpu": self.gpu.name, "tp": self.tp,
                "calibration_source": self.calibration.source or {"fitted": self.calibration.gpu}}
