"""Engine profiles: how a serving engine runs the GPU's kernels, turning kernel time into step time.

The calibrated operator terms (pagesim.sim.cost.calibrated) say how long each kernel takes on a
GPU, as measured in eager mode by the 2023-24 engines the measurements came from. A current
engine runs the same kernels differently, and a profile says how:

- CUDA graphs. vLLM v1 captures graphs for batch sizes [1, 2, 4, 8, 16, ..., 248] (steps of 8)
  and then steps of 16 up to ``min(2 * max_num_seqs, 512)``. A decode-only step of S sequences
  runs a *full* graph padded to the next captured size (every kernel, attention included, pays
  ``graph_kernel_s`` instead of its measured eager launch floor). A mixed or prefill step of T
  tokens up to the largest size runs *piecewise* graphs padded to the next size: attention
  stays eager (its measured floors), the rest is graphed. Larger steps run eagerly.
- GPU time. The kernels' busy time (the calibrated terms less their floors) times
  ``gpu_time_scale``: newer kernels (FlashAttention 3, current cuBLAS) against the measured ones
  (not the fused-MoE expert GEMMs, whose priced time was checked against that kernel's own timing);
  decode attention's (its KV reads and per-sequence work) times ``attention_time_scale``, apart,
  since the paged decode kernels changed more than the GEMMs and weigh most in MHA models.
- All-reduce. Custom all-reduce (vLLM's one-shot/two-shot kernels over NVLink) for messages up to
  ``custom_allreduce_max_bytes``: a latency + the ring volume 2 (tp - 1) / tp x bytes over the
  interconnect's per-direction bandwidth; NCCL (the measured line) above that size. vLLM runs
  the custom kernels only on full NVLink or on 2 GPUs with P2P (GPUSpec.custom_allreduce); a
  PCIe group without P2P uses NCCL for every message, priced on the GPU's link
  (calibrated.ring_all_reduce_line). The latency
  is ``allreduce_latency_s`` for 2 GPUs, and grows with the group as the GPU's measured
  all-reduce floors do (x1.84 for 4 H100s, x1.72 for 8).
- CPU. Async scheduling and output processing overlap most host work with the GPU; what is left
  exposed is ``cpu_step_s`` + ``cpu_per_seq_s`` x scheduled sequences per step.
- Async output (``output_delay_steps`` = 1): the host turns step n's tokens into output while
  the GPU runs step n+1, so a token reaches the client when the next step ends (the simulator
  moves each request's first-token and finish times to the end of the step that follows).
- Host time per request (``request_host_s``): HTTP, tokenization, detokenization of the first
  token, the client's own stack; it delays a request's entry into the engine, so it shows in
  TTFT and end-to-end latency (the simulator applies it at arrival).

The five step-time parameters enter linearly: step = sum_k theta_k * feature_k(step) + a fixed part
(eager floors, all-reduce bandwidth terms, block moves). ``features`` gives that split, which is
what `pagesim calibrate engine` fits (pagesim.engine_fit).

The ``paper`` profile is the engine the calibrated measurements describe (eager, measured CPU
and NCCL terms): it is the calibrated cost model itself, unchanged, and the paper's figures run it.
Profiles are JSON files in pagesim/sim/data/engines/ (format ``pagesim-engine/1``), each with
its provenance; `pagesim calibrate engine` writes new ones.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import asdict, dataclass, field, fields
from importlib import resources
from pathlib import Path

from pagesim.sim.cost.base import BatchShape, CostModel
from pagesim.sim.run_times import linear_context_durations, windowed_context_durations
from pagesim.sim.cost.calibrated import CalibratedCostModel, Calibration
from pagesim.sim.cost.names import DEFAULT_ENGINE, ENGINE_NAMES, PAPER_ENGINE  # noqa: F401 (re-exported)

ENGINE_FORMAT = "pagesim-engine/1"
FEATURES = ("gpu_time_scale", "attention_time_scale", "graph_kernel_s", "allreduce_latency_s", "cpu_step_s",
            "cpu_per_seq_s")
# vLLM's custom all-reduce takes messages up to this size (its default max_size, 8 MiB); NCCL above.
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20


class EngineProfileError(ValueError):
    """A profile file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class EngineParams:
    """The fitted parameters (see the module docstring for each)."""

    gpu_time_scale: float = 1.0
    attention_time_scale: float = 1.0
    graph_kernel_s: float = 2e-6
    allreduce_latency_s: float = 8e-6
    cpu_step_s: float = 5e-4
    cpu_per_seq_s: float = 0.0
    request_host_s: float = 0.0

    def step_vector(self) -> tuple[float, ...]:
        return tuple(getattr(self, name) for name in FEATURES)


@dataclass(frozen=True)
class EngineProfile:
    name: str
    description: str = ""
    cuda_graphs: bool = True
    max_graph_size: int = 512  # the capture limit, also min(2 * max_num_seqs, this)
    custom_allreduce_max_bytes: int = CUSTOM_ALLREDUCE_MAX_BYTES
    params: EngineParams = field(default_factory=EngineParams)
    measured_eager: bool = False  # the paper engine: the calibrated model as measured
    # Async scheduling: the host turns step n's tokens into output while the GPU runs step n+1,
    # so a token reaches the client when the next step ends (1), or at its own step's end (0).
    output_delay_steps: int = 1
    provenance: dict = field(default_factory=dict)

    def capture_sizes(self, max_num_seqs: int) -> list[int]:
        """vLLM v1's default CUDA-graph batch sizes for this max_num_seqs."""
        largest = min(2 * max_num_seqs, self.max_graph_size)
        sizes = [1, 2, 4] + list(range(8, 256, 8)) + list(range(256, largest + 1, 16))
        return [s for s in sizes if s <= largest]

    def to_json(self) -> dict:
        return {"format": ENGINE_FORMAT, "name": self.name, "description": self.description,
                "cuda_graphs": self.cuda_graphs, "max_graph_size": self.max_graph_size,
                "custom_allreduce_max_bytes": self.custom_allreduce_max_bytes,
                "measured_eager": self.measured_eager, "output_delay_steps": self.output_delay_steps,
                "params": asdict(self.params),
                "provenance": self.provenance}

    @classmethod
    def from_json(cls, data, where: str) -> "EngineProfile":
        if not isinstance(data, dict):
            raise EngineProfileError(f"{where}: expected a JSON object")
        if data.get("format") != ENGINE_FORMAT:
            raise EngineProfileError(f"{where}: field 'format' is {data.get('format')!r}, expected {ENGINE_FORMAT!r}")
        name = data.get("name")
        if not isinstance(name, str) or not name:
            raise EngineProfileError(f"{where}: field 'name' must be a non-empty string")
        raw = data.get("params", {})
        if not isinstance(raw, dict):
            raise EngineProfileError(f"{where}: field 'params' must be an object")
        known = {f.name for f in fields(EngineParams)}
        values = {}
        for key, value in raw.items():
            if key not in known:
                raise EngineProfileError(f"{where}: field 'params.{key}' is unknown; known: {', '.join(sorted(known))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not 0 <= value < 10:
                raise EngineProfileError(f"{where}: field 'params.{key}' must be a finite number in [0, 10), "
                                         f"got {value!r}")
            values[key] = float(value)
        delay = data.get("output_delay_steps", 1)
        if delay not in (0, 1) or isinstance(delay, bool):
            raise EngineProfileError(f"{where}: field 'output_delay_steps' must be 0 or 1, got {delay!r}")
        for key, kind in (("cuda_graphs", bool), ("measured_eager", bool), ("max_graph_size", int),
                          ("custom_allreduce_max_bytes", int)):
            if key in data and (not isinstance(data[key], kind) or (kind is int and (isinstance(data[key], bool)
                                                                                      or data[key] < 1))):
                raise EngineProfileError(f"{where}: field {key!r} must be {'true or false' if kind is bool else 'a positive integer'}")
        return cls(name=name, description=str(data.get("description", "")), cuda_graphs=data.get("cuda_graphs", True),
                   max_graph_size=data.get("max_graph_size", 512),
                   custom_allreduce_max_bytes=data.get("custom_allreduce_max_bytes", CUSTOM_ALLREDUCE_MAX_BYTES),
                   params=EngineParams(**values), measured_eager=data.get("measured_eager", False),
                   output_delay_steps=delay,
                   provenance=data.get("provenance", {}) if isinstance(data.get("provenance", {}), dict) else {})


def load_engine_profile(name_or_path: str | Path | EngineProfile) -> EngineProfile:
    """A shipped profile by name (``vllm-0.15``, ``vllm-0.19``, ``paper``) or a profile file."""
    if isinstance(name_or_path, EngineProfile):
        return name_or_path
    text_name = str(name_or_path)
    if text_name in ENGINE_NAMES:
        where = f"pagesim/sim/data/engines/{text_name}.json"
        text = resources.files("pagesim.sim").joinpath("data", "engines", f"{text_name}.json").read_text()
    else:
        path = Path(text_name)
        if not text_name.endswith(".json"):
            raise EngineProfileError(f"unknown engine {text_name!r}; choose from {', '.join(ENGINE_NAMES)} "
                                     "or give a profile file (.json)")
        if not path.is_file():
            raise EngineProfileError(f"{path}: no such engine profile file")
        where, text = str(path), path.read_text()
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise EngineProfileError(f"{where}: not JSON ({e})") from None
    return EngineProfile.from_json(data, where)


# ----------------------------------------------------------------------------- step time

@dataclass(frozen=True, slots=True)
class StepFeatures:
    """One step's time split: step = sum(theta_k * linear[k]) + fixed."""

    linear: tuple[float, ...]  # busy seconds (GEMMs etc., decode attention), graphed kernels, custom all-reduces, 1, seqs
    fixed: float               # eager launch floors, all-reduce bandwidth and NCCL terms, EP exchange, fused-MoE expert GEMMs, block moves


class EngineCostModel(CostModel):
    """Step time of a (model, GPU, TP) under an engine profile; the kernel terms are the
    calibrated model's (see the module docstring for how the profile recombines them)."""

    name = "calibrated"  # the calibrated kernel terms, run by an engine (describe() names it)

    def __init__(self, model, gpu, tp: int = 1, engine: EngineProfile | str = DEFAULT_ENGINE,
                 calibration: Calibration | None = None, max_num_seqs: int = 256, ep: int = 1) -> None:
        self.kernels = kern = CalibratedCostModel(model, gpu, tp, calibration, ep=ep)
        self.ep = ep
        self.model, self.gpu, self.tp = kern.model, kern.gpu, tp
        self.engine = load_engine_profile(engine)
        if self.engine.measured_eager:
            raise ValueError(f"engine {self.engine.name!r} is the measured eager engine: use the calibrated cost model")
        self.theta = self.engine.params.step_vector()
        self.request_host_s = self.engine.params.request_host_s
        self.output_delay_steps = self.engine.output_delay_steps
        self.capture = self.engine.capture_sizes(max_num_seqs) if self.engine.cuda_graphs else []
        self.max_graph = self.capture[-1] if self.capture else 0
        m = self.model
        self.layers = m.num_mixer_kernels  # attention and recurrent kernels (two in a parallel-mixer layer)
        self.blocks = m.num_tp_all_reduces  # one TP all-reduce a block (and a parallel mixer's second)
        # attention, per step: floors (one kernel per layer) and busy parts, from the calibrated factors
        self._dec_floor = kern._dec_floor
        self._pre_floor = kern._pre_floor
        self._dec_busy_per_seq = kern._dec_per_seq
        self._dec_busy_per_ctx = kern._dec_per_ctx
        self._pre_busy_per_pair = kern._pre_per_pair
        self._pre_busy_per_token = kern._pre_per_token
        # sliding-window layers (pagesim.models): their share of the context and pair terms, bounded
        # by the window per sequence (CalibratedCostModel.iteration_time's rule)
        self._window = kern._window
        self._dec_busy_per_window_ctx = kern._dec_per_window_ctx
        self._pre_busy_per_window_pair = kern._pre_per_window_pair
        self._ar_bytes_per_token = m.hidden_size * m.dtype_bytes
        self._ar_s_per_byte = (2 * (tp - 1) / tp / kern.gpu.collective_bandwidth) if tp > 1 else 0.0
        # vLLM's rule (GPUSpec.custom_allreduce): full NVLink, or 2 GPUs with P2P; else NCCL throughout
        self._custom_allreduce = kern.gpu.custom_allreduce(tp)
        # allreduce_latency_s is a 2-GPU all-reduce's; a larger group's latency grows as the measured
        # all-reduce floors of the GPU's calibration do (DGX H100: x1.84 for 4 GPUs, x1.72 for 8)
        floors = kern.calibration.all_reduce
        self._ar_group_factor = (kern.calibration.all_reduce_seconds(tp, 0) / floors[min(floors)].floor_s
                                 if tp > 1 and floors and floors[min(floors)].floor_s > 0 else 1.0)
        self._cache: dict[tuple[int, bool], tuple[float, float, float, float]] = {}
        self._seq_cache: dict[int, tuple[float, float]] = {}
        self._moves = kern._block_moves
        # linear-attention layers' recurrent kernel (CalibratedCostModel): decode with the attention
        # busy time (the same GPU-time scale), prefill with the other busy time
        self._state = kern._state
        self._state_dec_per_seq = kern._state_dec_per_seq
        self._state_pre_per_token, self._state_pre_per_seq = kern._state_pre_per_token, kern._state_pre_per_seq
        self._per_ctx = self.theta[1] * self._dec_busy_per_ctx  # the one term a decode run changes
        self._per_window_ctx = self.theta[1] * self._dec_busy_per_window_ctx

    # -- parts -----------------------------------------------------------------------------
    def padded(self, shape: BatchShape) -> tuple[int, str]:
        """Tokens the step's GEMMs run over and its graph mode: full, piecewise or eager."""
        tokens = shape.num_prefill_tokens + shape.num_decode_seqs
        if self.max_graph and tokens <= self.max_graph:
            size = self.capture[bisect.bisect_left(self.capture, tokens)]
            return size, ("full" if not shape.num_prefill_tokens else "piecewise")
        return tokens, "eager"

    def _token_part(self, tokens: int, graphed: bool) -> tuple[float, float, float, float]:
        """(busy seconds, graphed kernels, fixed seconds, custom all-reduce calls) of the GEMMs,
        elementwise kernels and all-reduces of every layer over `tokens` rows."""
        key = (tokens, graphed)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        kern = self.kernels
        busy, floors, count, unscaled = kern.token_kernel_split(tokens)
        fixed = unscaled + (0.0 if graphed else floors)  # EP exchange, fused-MoE experts: no gpu_time_scale
        kernels = count if graphed else 0
        ar_calls = 0.0
        if self.tp > 1:
            count, width = self.model.mixer_all_reduces  # Mamba v1's x_proj, a lightning norm: one more a layer
            for calls, nbytes in ((self.blocks, tokens * self._ar_bytes_per_token),
                                  (count, tokens * width * self.model.dtype_bytes)):
                if not calls:
                    continue
                if self._custom_allreduce and nbytes <= self.engine.custom_allreduce_max_bytes:
                    ar_calls += calls * self._ar_group_factor
                    fixed += calls * nbytes * self._ar_s_per_byte
                else:  # NCCL, as measured
                    fixed += calls * kern.calibration.all_reduce_seconds(self.tp, nbytes)
        self._cache[key] = hit = (busy, float(kernels), fixed, ar_calls)
        return hit

    def _seq_part(self, seqs: int) -> tuple[float, float]:
        """(busy, fixed) of the LM head over the sampled rows (run outside the graphs)."""
        hit = self._seq_cache.get(seqs)
        if hit is None:
            busy, floor = self.kernels.lm_head_split(seqs)
            self._seq_cache[seqs] = hit = (busy, floor)
        return hit

    def _base_features(self, shape: BatchShape) -> StepFeatures:
        """The step's features without its decode context read (added last, see iteration_time)."""
        tokens, mode = self.padded(shape)
        n_dec, n_pre = shape.num_decode_seqs, shape.num_prefill_tokens
        seqs = shape.num_prefill_seqs + n_dec
        busy, kernels, fixed, ar_calls = self._token_part(tokens, mode != "eager") if tokens else (0.0, 0.0, 0.0, 0.0)
        lm_busy, lm_fixed = self._seq_part(seqs) if seqs else (0.0, 0.0)
        busy += lm_busy
        fixed += lm_fixed
        attn = 0.0
        if n_dec or n_pre:
            # one attention kernel per layer for the whole batch (v1's varlen attention)
            if mode == "full":
                kernels += self.layers
            else:
                fixed += self._pre_floor if n_pre else self._dec_floor
            attn += n_dec * self._dec_busy_per_seq
            busy += shape.prefill_attn_pairs * self._pre_busy_per_pair + n_pre * self._pre_busy_per_token
            if self._window and n_pre:
                busy += min(shape.prefill_attn_pairs, n_pre * self._window) * self._pre_busy_per_window_pair
            if self._state:
                attn += n_dec * self._state_dec_per_seq
                busy += n_pre * self._state_pre_per_token + shape.num_prefill_seqs * self._state_pre_per_seq
        if shape.num_swap_blocks or shape.num_copy_blocks:
            fixed += self._moves(shape)
        return StepFeatures((busy, attn, kernels, ar_calls, 1.0 if seqs else 0.0, float(seqs)), fixed)

    def features(self, shape: BatchShape) -> StepFeatures:
        """The step's time split into the fitted parameters' features and a fixed part."""
        f = self._base_features(shape)
        ctx_busy = shape.decode_context_tokens * self._dec_busy_per_ctx
        if self._window:
            ctx_busy += min(shape.decode_context_tokens, shape.num_decode_seqs * self._window) * self._dec_busy_per_window_ctx
        return StepFeatures((f.linear[0], f.linear[1] + ctx_busy) + f.linear[2:], f.fixed)

    # -- CostModel -------------------------------------------------------------------------
    def iteration_time(self, shape: BatchShape) -> float:
        f = self._base_features(shape)
        t = f.fixed
        for theta, x in zip(self.theta, f.linear):
            t += theta * x
        # the decode context read last, so that decode runs give the same floats (base + ctx * per_ctx)
        if self._window:  # run_times.windowed_context_durations: the same two terms, in this order
            t += shape.decode_context_tokens * self._per_ctx
            ctx, cap = shape.decode_context_tokens, shape.num_decode_seqs * self._window
            return t + (ctx if ctx < cap else cap) * self._per_window_ctx
        return t + shape.decode_context_tokens * self._per_ctx

    def decode_run_durations(self, num_seqs: int, context_tokens: int, num_steps: int, block_size: int = 16) -> list[float]:
        base = self.plain_decode_base(num_seqs, block_size)
        if self._window:
            return windowed_context_durations(base, self._per_ctx, self._per_window_ctx, self._window, num_seqs,
                                              context_tokens, num_steps)
        return linear_context_durations(base, self._per_ctx, num_seqs, context_tokens, num_steps)

    def describe(self) -> dict:
        ep = {"ep": self.ep} if self.ep > 1 else {}
        return {"name": self.name, "engine": self.engine.name, "model": self.model.name, "gpu": self.gpu.name,
                "tp": self.tp, **ep, "params": asdict(self.engine.params),
                "calibration_source": self.kernels.calibration.source or {"fitted": self.kernels.calibration.gpu}}
