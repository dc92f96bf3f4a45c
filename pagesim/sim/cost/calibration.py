"""The calibrated cost model's coefficients (pagesim.sim.cost.calibrated says how they are fitted and
used): the GEMM curve, the elementwise, attention, all-reduce and CPU lines of one GPU, and how a
layer's operators are priced with them. A Calibration is what a calibration JSON file holds."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pagesim.sim.cost.layer_ops import ELEMENTWISE_OPERATORS, Gemm, LayerShape

CALIBRATION_FORMAT = "pagesim-calibration/1"
# Operators of one layer, in the measurement files' names; `add` is one residual add.
GEMM_OPERATORS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
LAYER_OPERATORS = GEMM_OPERATORS + ELEMENTWISE_OPERATORS
STEP_OPERATORS = ("emb",)  # once per step, not per layer
# Kernel kind of each elementwise operator (the two norms share one fit).
ELEMENTWISE_KIND = {"input_layernorm": "norm", "post_attention_layernorm": "norm", "attn_rope": "rope",
                    "mlp_act": "act", "add": "add", "emb": "emb"}
ROUTING_KIND = "add"  # the elementwise line that prices a MoE layer's routing kernels
# Rows of the token tile of vLLM's weight-only low-bit GEMMs (Marlin's 16-row blocks; Frantar et al.,
# "MARLIN: Mixed-Precision Auto-Regressive Parallel Inference on Large Language Models", 2024: close
# to the ideal 4x over FP16 for batches up to 16-32, i.e. the weight read, not padded compute)
WEIGHT_ONLY_TILE = 16
# Measured GPUs and what the others are scaled from.
MEASURED_GPUS = ("a100-80gb", "h100-80gb", "a40-48gb")


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
        return self.floor_s + self._busy((k * n + m * (k + n)) * dtype_bytes, _rows(m, self.tile), k, n)

    def grouped_seconds(self, g: Gemm, dtype_bytes: int, flop_scale: float, fp4_cores: bool = False) -> float:
        """`g.count` GEMMs of one shape in one launch (a fused MoE kernel): one floor, each
        matrix's smooth maximum of its own memory and compute (over g.padded_m rows where the
        kernel pads, layer_ops.expected_padded_rows). Weights of g.weight_bytes; the compute at
        `flop_scale` times the FP16 time (FP8 tensor cores: fp16 / fp8 FLOP/s; FP4 ones, with
        `fp4_cores`: fp16 / fp4). Low-bit weights with 16-bit activations: weight-only."""
        if g.m <= 0 or g.count <= 0:
            return 0.0
        if g.weight_bytes < dtype_bytes and not (g.fp8 or fp4_cores):
            return self.floor_s + g.count * self._weight_only_seconds(g, dtype_bytes)
        # rows computed: the measured curve's M granularity (its tile), or more where a fused MoE
        # kernel pads each expert's rows to its own blocks (the larger of two lower bounds)
        busy = self._busy(g.k * g.n * g.weight_bytes + g.m * (g.k + g.n) * dtype_bytes,
                          _rows(g.m, self.tile, g.padded_m), g.k, g.n, flop_scale)
        return self.floor_s + g.count * busy

    def _weight_only_seconds(self, g: Gemm, dtype_bytes: int) -> float:
        """One matrix of a weight-only low-bit GEMM (4-bit AWQ / GPTQ / W4A16, MXFP4: fewer bytes a
        weight than the activations', computed in 16 bits), less the floor. vLLM runs these with
        mixed-input kernels (Marlin; Machete on Hopper) that tile tokens by 16 rows, so a small
        batch is bound by the weight read: the fp16 curve's time for the shape, as measured,
        scaled by the bytes moved (the MARLIN paper's near-4x at batches up to 16-32), or the
        16-bit compute over rows in 16-row tiles (or a fused MoE's padding), whichever is longer.
        (Not the curve's own smooth maximum at a 16-row tile: its byte term, fitted beside 64 /
        128-row compute, alone would read faster than the GPU's memory.)"""
        moved = g.k * g.n * g.weight_bytes + g.m * (g.k + g.n) * dtype_bytes
        fp16_moved = (g.k * g.n + g.m * (g.k + g.n)) * dtype_bytes
        fp16 = self._busy(fp16_moved, _rows(g.m, self.tile, g.padded_m), g.k, g.n)
        return max(fp16 * moved / fp16_moved, 2 * _rows(g.m, WEIGHT_ONLY_TILE, g.padded_m) * g.k * g.n * self.s_per_flop)

    def _busy(self, nbytes: float, rows: float, k: int, n: int, flop_scale: float = 1.0) -> float:
        """One matrix's time less the floor: the smooth maximum of moving nbytes and computing
        rows x k x n (at flop_scale times the FP16 time)."""
        mem = nbytes * self.s_per_byte
        comp = 2 * rows * k * n * self.s_per_flop * flop_scale
        p = self.sharpness
        return (mem ** p + comp ** p) ** (1.0 / p)


def _rows(m: float, tile: int, padded: float = 0.0) -> float:
    """Rows a kernel computes for m: m rounded up to whole tiles, or a fused MoE's padding where more."""
    return max(-(-m // tile) * tile, padded)


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

    def gemm_seconds(self, g: Gemm, dtype_bytes: int, fp8_flop_scale: float, fp4_flop_scale: float = 0.0) -> float:
        """One entry of a layer's GEMM list: an ordinary fp16 GEMM through the fitted curve as
        measured; any other (experts, quantized weights, FP8) through `grouped_seconds`. A W4A4
        NVFP4 GEMM runs on FP4 tensor cores at `fp4_flop_scale` (fp16 / fp4 FLOP/s) where the GPU
        has them (> 0), and weight-only otherwise (vLLM's Marlin FP4 fallback)."""
        if g.count == 1 and g.weight_bytes == dtype_bytes and not g.fp8:
            return self.gemm.seconds(g.m, g.k, g.n, dtype_bytes)
        if g.fp4 and fp4_flop_scale > 0:
            return self.gemm.grouped_seconds(g, dtype_bytes, fp4_flop_scale, fp4_cores=True)
        return self.gemm.grouped_seconds(g, dtype_bytes, fp8_flop_scale if g.fp8 else 1.0)

    def routing_seconds(self, nbytes: float) -> float:
        """One of a MoE layer's routing kernels (top-k softmax, align, sum) moving `nbytes`: the
        residual add's line, the elementwise kernel nearest in kind (a few small reads and a write)."""
        return self.elementwise[ROUTING_KIND].seconds(nbytes)

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
