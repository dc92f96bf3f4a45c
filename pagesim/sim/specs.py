"""Model and GPU catalog, and KV-pool sizing as the paper (vLLM, SOSP'23) sizes it.

Model numbers come from each model's Hugging Face ``config.json`` (OPT-175B, which has no public
HF checkpoint, from Table 1 of the OPT paper, Zhang et al. 2022). ``num_params`` is the exact count
implied by those shapes (embeddings + layers + norms); tests cross-check it against a count made
independently from the same fields and against the published totals.

GPU numbers come from NVIDIA's datasheets (SXM parts): memory as the nominal capacity in GiB
(HBM stacks are binary-sized; ``nvidia-smi`` reports 40960 MiB for an A100-40GB), FP16 dense
tensor-core peak (without sparsity), NVLink and PCIe bandwidth per direction (the datasheets quote
the bidirectional sum).

KV pool per GPU (paper Section 6 / its artifact, vLLM's ``profile_num_available_blocks``)::

    pool = gpu_memory_utilization * memory - weights / tp - peak activations - runtime reserve

where peak activations are those of a profiling forward pass over ``max_num_batched_tokens``
tokens (see ``profile_activation_bytes``) and the runtime reserve is the memory a serving process
holds that is neither weights, activations nor KV (``RUNTIME_RESERVED_BYTES``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pagesim.core.errors import CannotServe
# The paper's max batched tokens; also the size of vLLM's profiling forward pass.
from pagesim.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from pagesim.inputs import InputValueError, read_json

GiB = 1 << 30
GB = 10**9
TB = 10**12

# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------

ARCHITECTURES = ("opt", "llama")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer, as far as memory and FLOP counting needs it.

    ``architecture`` "opt": MLP of 2 matrices (fc1, fc2), learned positions, tied LM head.
    ``architecture`` "llama": gated MLP of 3 matrices (gate, up, down), GQA allowed.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    num_params: int
    max_model_len: int
    dtype_bytes: int = 2
    architecture: str = "opt"

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{self.name}: architecture must be one of {ARCHITECTURES}")
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_size", "vocab_size", "num_params", "max_model_len", "dtype_bytes"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")

    # -- shapes ----------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection (num_heads * head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of one of the K or V projections (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.architecture == "llama"

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    # -- memory ----------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers (whole model, all TP shards together)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return self.kv_bytes_per_token // self.num_layers

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    # -- FLOP counting -----------------------------------------------------------------------
    @property
    def linear_params_per_layer(self) -> int:
        """Weights of one layer's matmuls (QKV, output projection, MLP); norms and biases excluded."""
        attn = self.hidden_size * (self.q_size + 2 * self.kv_size) + self.q_size * self.hidden_size
        mlp = self.mlp_matrices * self.hidden_size * self.ffn_size
        return attn + mlp

    @property
    def linear_params(self) -> int:
        """Matmul weights of all layers; each token costs 2 FLOPs per weight."""
        return self.num_layers * self.linear_params_per_layer

    @property
    def lm_head_params(self) -> int:
        """The vocabulary projection (tied to the embedding in OPT, but still read for logits)."""
        return self.vocab_size * self.hidden_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers: QK^T and PV, 2 FLOPs per MAC each."""
        return 4 * self.q_size * self.num_layers


def _opt(name, layers, hidden, heads, ffn, num_params) -> ModelSpec:
    # OPT: MHA (kv heads = heads), head_dim = hidden / heads, vocab 50272, 2048 positions.
    return ModelSpec(name=name, num_layers=layers, hidden_size=hidden, num_heads=heads,
                     num_kv_heads=heads, head_dim=hidden // heads, ffn_size=ffn,
                     vocab_size=50272, num_params=num_params, max_model_len=2048,
                     architecture="opt")


MODELS: dict[str, ModelSpec] = {
    # facebook/opt-125m config.json: 12 layers, hidden 768, 12 heads, ffn_dim 3072.
    "opt-125m": _opt("opt-125m", 12, 768, 12, 3072, 125_239_296),
    # facebook/opt-13b config.json: 40 layers, hidden 5120, 40 heads, ffn_dim 20480.
    "opt-13b": _opt("opt-13b", 40, 5120, 40, 20480, 12_853_473_280),
    # facebook/opt-66b config.json: 64 layers, hidden 9216, 72 heads, ffn_dim 36864.
    "opt-66b": _opt("opt-66b", 64, 9216, 72, 36864, 65_719_701_504),
    # OPT paper (Zhang et al. 2022) Table 1: 96 layers, 96 heads, d_model 12288; ffn = 4 * d.
    "opt-175b": _opt("opt-175b", 96, 12288, 96, 49152, 174_604_468_224),
    # huggyllama/llama-13b config.json: 40 layers, hidden 5120, 40 heads, intermediate 13824,
    # vocab 32000, max_position_embeddings 2048, untied LM head.
    "llama-13b": ModelSpec("llama-13b", 40, 5120, 40, 40, 128, 13824, 32000,
                           13_015_864_320, 2048, architecture="llama"),
    # meta-llama/Llama-2-7b-hf config.json: 32 layers, hidden 4096, 32 heads (MHA),
    # intermediate 11008, vocab 32000, max_position_embeddings 4096.
    "llama-2-7b": ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000,
                            6_738_415_616, 4096, architecture="llama"),
    # Qwen/Qwen2.5-72B config.json: 80 layers, hidden 8192, 64 heads, 8 KV heads, intermediate
    # 29568, vocab 152064, max_position_embeddings 32768, QKV bias, untied LM head
    # (model card: 72.7B parameters). Qwen2 is llama-shaped (gated MLP, GQA, RMSNorm).
    "qwen2.5-72b": ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064,
                             72_706_203_648, 32768, architecture="llama"),
    # HuggingFaceTB/SmolLM2-135M config.json: 30 layers, hidden 576, 9 heads, 3 KV heads,
    # intermediate 1536, vocab 49152, max_position_embeddings 8192, tied embeddings.
    "smollm2-135m": ModelSpec("smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152,
                              134_515_008, 8192, architecture="llama"),
}

MODEL_ALIASES: dict[str, str] = {
    "llama-2-7b-hf": "llama-2-7b",
    "llama2-7b": "llama-2-7b",
    "qwen2.5-72b-instruct": "qwen2.5-72b",
}

# --------------------------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator. Bandwidths in bytes/s, compute in FLOP/s.

    ``interconnect_bandwidth`` and ``pcie_bandwidth`` are per direction, per GPU.
    """

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    fp16_flops: float
    interconnect_bandwidth: float
    pcie_bandwidth: float

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB


GPUS: dict[str, GPUSpec] = {
    # NVIDIA A100 datasheet (SXM4 40GB): HBM2 40GB, 1,555 GB/s; FP16 tensor 312 TFLOPS dense;
    # NVLink 600 GB/s (bidirectional) -> 300 per direction; PCIe Gen4 64 GB/s -> 32 per direction.
    "a100-40gb": GPUSpec("a100-40gb", 40 * GiB, 1555 * GB, 312 * TB, 300 * GB, 32 * GB),
    # NVIDIA A100 datasheet (SXM4 80GB): HBM2e 80GB, 2,039 GB/s; otherwise as above.
    "a100-80gb": GPUSpec("a100-80gb", 80 * GiB, 2039 * GB, 312 * TB, 300 * GB, 32 * GB),
    # NVIDIA H100 datasheet (SXM5): HBM3 80GB, 3.35 TB/s; FP16 tensor 1,979 TFLOPS with
    # sparsity -> 989.5 dense; NVLink 900 GB/s -> 450 per direction; PCIe Gen5 128 -> 64.
    "h100-80gb": GPUSpec("h100-80gb", 80 * GiB, 3350 * GB, 989.5 * TB, 450 * GB, 64 * GB),
    # NVIDIA H200 datasheet (SXM): HBM3e 141GB, 4.8 TB/s; compute and links as H100 SXM.
    # (nvidia-smi reports 143771 MiB = 140.4 GiB, so the 141 is GiB less a driver reserve.)
    "h200-141gb": GPUSpec("h200-141gb", 141 * GiB, 4800 * GB, 989.5 * TB, 450 * GB, 64 * GB),
    # NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s; FP16 tensor 299.4 TFLOPS with sparsity ->
    # 149.7 dense; NVLink bridge 112.5 GB/s (bidirectional, pairs) -> 56.25; PCIe Gen4 64 -> 32.
    "a40-48gb": GPUSpec("a40-48gb", 48 * GiB, 696 * GB, 149.7 * TB, 56.25 * GB, 32 * GB),
}

GPU_ALIASES: dict[str, str] = {
    "a100-40g": "a100-40gb",
    "a100-80g": "a100-80gb",
    "h100": "h100-80gb",
    "h100-80g": "h100-80gb",
    "h200": "h200-141gb",
    "h200-141g": "h200-141gb",
    "a40": "a40-48gb",
    "a40-48g": "a40-48gb",
}


def _normalize(name: str) -> str:
    # Accept HF repo ids ("facebook/opt-13b"), any case, and underscores.
    return name.strip().rsplit("/", 1)[-1].lower().replace("_", "-")


def _lookup(kind: str, name: str, table: dict, aliases: dict[str, str]):
    key = _normalize(name)
    key = aliases.get(key, key)
    try:
        return table[key]
    except KeyError:
        known = ", ".join(sorted(table)) + "; aliases: " + ", ".join(sorted(aliases))
        raise KeyError(f"unknown {kind} {name!r}; known: {known}") from None


def get_model(name: str | Path | ModelSpec) -> ModelSpec:
    """The one model resolver every command uses: a catalog id (``opt-13b``,
    ``facebook/opt-13b``, ...), a path to a Hugging Face ``config.json`` (or to the directory
    holding one), or a ModelSpec, which passes through."""
    if isinstance(name, ModelSpec):
        return name
    if is_config_path(name):
        return load_model_config(name)
    return _lookup("model", str(name), MODELS, MODEL_ALIASES)


def is_config_path(name: str | Path) -> bool:
    """Whether a --model value names a config.json (or its directory) rather than a catalog id."""
    text = str(name)
    return text.endswith(".json") or (os.sep in text and Path(text).is_dir())


# --------------------------------------------------------------------------------------------
# Models from a Hugging Face config.json
# --------------------------------------------------------------------------------------------

LLAMA_FAMILY = ("llama", "mistral", "qwen2")  # gated MLP, rotary, GQA, RMSNorm
SERVING_DTYPE_BYTES = 2  # fp16/bf16 serving, as the paper; a config's torch_dtype is not used


class ModelConfigError(ValueError):
    """A config.json that cannot be turned into a ModelSpec; the message names the file and field."""


def load_model_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (LLaMA family or OPT)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:  # a regular file (a FIFO would block), valid JSON, not nested past what a walk over it survives
        config = read_json(p, "config file")
    except InputValueError as e:
        raise ModelConfigError(str(e)) from None
    if not isinstance(config, dict):
        raise ModelConfigError(f"{p}: expected a JSON object at the top level")
    name = str(config.get("_name_or_path") or p.parent.name or p.stem).rstrip("/").rsplit("/", 1)[-1].lower()
    return model_from_config(config, name, str(p))


def model_from_config(config: dict, name: str, where: str = "config.json") -> ModelSpec:
    """ModelSpec from the fields of a config.json; num_params is the exact count its shapes imply
    (embeddings, every layer's weights and biases, norms; an untied LM head counted apart)."""

    def field_(key: str, default=None, kind=int):
        value = config.get(key, default)
        if value is None:
            raise ModelConfigError(f"{where}: missing field {key!r}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ModelConfigError(f"{where}: field {key!r} must be a positive integer, got {value!r}")
        if kind is bool and not isinstance(value, bool):
            raise ModelConfigError(f"{where}: field {key!r} must be true or false, got {value!r}")
        return value

    model_type = config.get("model_type")
    h = field_("hidden_size")
    layers = field_("num_hidden_layers")
    heads = field_("num_attention_heads")
    vocab = field_("vocab_size")
    max_len = field_("max_position_embeddings")
    if h % heads:
        raise ModelConfigError(f"{where}: field 'hidden_size' {h} is not a multiple of 'num_attention_heads' {heads}")
    if model_type == "opt":
        ffn = field_("ffn_dim")
        if field_("word_embed_proj_dim", h) != h:
            raise ModelConfigError(f"{where}: field 'word_embed_proj_dim' differs from 'hidden_size' (OPT-350m's "
                                   "projections are not supported)")
        head_dim = h // heads
        qkv = 3 * h
        layer = (h * qkv + qkv) + (h * h + h) + (h * ffn + ffn) + (ffn * h + h) + 4 * h  # biases, 2 LayerNorms
        final_norm = 2 * h if field_("do_layer_norm_before", True, bool) else 0
        # learned positions carry 2 extra rows (OPT's offset); the LM head is tied to the embedding
        params = layers * layer + vocab * h + (max_len + 2) * h + final_norm
        return ModelSpec(name, layers, h, heads, heads, head_dim, ffn, vocab, params, max_len,
                         SERVING_DTYPE_BYTES, architecture="opt")
    if model_type in LLAMA_FAMILY:
        kv_heads = field_("num_key_value_heads", heads)
        head_dim = field_("head_dim", h // heads)
        ffn = field_("intermediate_size")
        q, kv = heads * head_dim, kv_heads * head_dim
        if heads % kv_heads:
            raise ModelConfigError(f"{where}: field 'num_attention_heads' {heads} is not a multiple of "
                                   f"'num_key_value_heads' {kv_heads}")
        # Qwen2 always has QKV biases; llama's attention_bias adds them and the output bias
        attn_bias = model_type == "qwen2" or field_("attention_bias", False, bool)
        bias = ((q + 2 * kv) + (h if model_type != "qwen2" else 0)) if attn_bias else 0
        bias += (2 * ffn + h) if field_("mlp_bias", False, bool) else 0
        layer = h * (q + 2 * kv) + q * h + 3 * h * ffn + 2 * h + bias  # 2 RMSNorms
        tied = field_("tie_word_embeddings", False, bool)
        params = layers * layer + vocab * h * (1 if tied else 2) + h
        return ModelSpec(name, layers, h, heads, kv_heads, head_dim, ffn, vocab, params, max_len,
                         SERVING_DTYPE_BYTES, architecture="llama")
    raise ModelConfigError(f"{where}: field 'model_type' is {model_type!r}; supported: opt, {', '.join(LLAMA_FAMILY)}")


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """A catalog GPU by id (``a100-40gb``, ``h200``, ...); a GPUSpec passes through."""
    if isinstance(name, GPUSpec):
        return name
    return _lookup("GPU", name, GPUS, GPU_ALIASES)


# --------------------------------------------------------------------------------------------
# KV pool sizing
# --------------------------------------------------------------------------------------------

# Fraction of GPU memory the engine may use. DESIGN.md section 9 / the paper's artifact use 0.95
# (vLLM's public v0.1 default was 0.90; with 0.90 OPT-175B lands ~6% under the paper's 60.1K).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.95
# vLLM's default max_num_seqs; the profiling pass splits its tokens over this many sequences,
# and each one produces a row of logits.
DEFAULT_MAX_NUM_SEQS = 256
# vLLM's default swap space: CPU memory per GPU for swapped-out KV blocks.
DEFAULT_SWAP_GIB = 4.0

# Hidden-state tensors of width `hidden` alive at a layer's peak: the residual, the normed input
# and the layer output being built (the caching allocator holds all three at once).
RESIDUAL_STREAM_TENSORS = 3
# The sampler keeps logits in fp32 twice over at its peak (probabilities and log-probabilities),
# besides the fp16 logits of the LM head matmul.
LOGITS_FP32_COPIES = 2
# Memory per GPU that is neither weights, activations nor KV: CUDA context and kernel images,
# cuBLAS workspaces, NCCL buffers, the driver's reserve below the nominal capacity (an A100-40GB
# reports 39.6 of its 40 GiB to CUDA) and allocator rounding. Each piece is a few hundred MiB;
# the total was chosen so that the paper's three Table 1 setups land near the paper with this one
# constant (OPT-13B, OPT-66B, OPT-175B: see tests/sim/test_specs.py). It is the only fitted number.
RUNTIME_RESERVED_BYTES = int(1.75 * GiB)


def profile_activation_bytes(model: ModelSpec, tp: int = 1,
                             max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                             max_num_seqs: int = DEFAULT_MAX_NUM_SEQS) -> int:
    """Peak activation memory per GPU of vLLM's profiling forward pass.

    ``max_num_batched_tokens`` tokens split over ``min(max_num_seqs, tokens)`` sequences, no KV
    cache. The peak is the residual stream plus the largest of: the attention block (QKV output
    and attention output, heads split over TP), the MLP block (intermediate activations, split
    over TP) and the sampler (full-vocab logits of the last token of each sequence; vLLM gathers
    the TP shards so every GPU holds all of them). Prompt attention is memory-efficient
    (xformers / flash), so there is no tokens^2 score matrix.
    """
    t = max_num_batched_tokens
    d = model.dtype_bytes
    seqs = min(max_num_seqs, t)
    residual = RESIDUAL_STREAM_TENSORS * t * model.hidden_size * d
    attn = t * (model.q_size + 2 * model.kv_size + model.q_size) // tp * d
    # OPT: fc1 output and its activation; llama: gate, up and act(gate) * up.
    mlp = t * model.mlp_matrices * model.ffn_size // tp * d
    logits = seqs * model.vocab_size * (d + 4 * LOGITS_FP32_COPIES)
    return residual + max(attn, mlp, logits)


@dataclass(frozen=True, slots=True)
class KVCapacity:
    """How much KV cache a (model, GPU, TP) setup holds. Byte counts are per GPU unless `_total`."""

    model: str
    gpu: str
    tp: int
    bytes_per_token: int            # whole model (all TP shards) per token
    usable_bytes_per_gpu: int       # gpu_memory_utilization * memory
    weight_bytes_per_gpu: int
    activation_bytes_per_gpu: int
    reserved_bytes_per_gpu: int
    pool_bytes_per_gpu: int
    pool_bytes_total: int = field(init=False)
    token_slots: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pool_bytes_total", self.pool_bytes_per_gpu * self.tp)
        object.__setattr__(self, "token_slots",
                           self.pool_bytes_per_gpu * self.tp // self.bytes_per_token)

    @property
    def bytes_per_token_per_gpu(self) -> float:
        return self.bytes_per_token / self.tp

    def block_bytes_per_gpu(self, block_size: int) -> int:
        return block_bytes_per_gpu(self.bytes_per_token, self.tp, block_size)

    def num_blocks(self, block_size: int = 16) -> int:
        """Device KV blocks of `block_size` tokens (each GPU holds its heads' share of every block)."""
        return self.pool_bytes_per_gpu // self.block_bytes_per_gpu(block_size)

    def num_swap_blocks(self, block_size: int = 16, swap_gib: float = DEFAULT_SWAP_GIB) -> int:
        return int(swap_gib * GiB) // self.block_bytes_per_gpu(block_size)

    def summary(self) -> dict:
        return {
            "model": self.model, "gpu": self.gpu, "tp": self.tp,
            "usable_gib_total": self.usable_bytes_per_gpu * self.tp / GiB,
            "weights_gb_total": self.weight_bytes_per_gpu * self.tp / GB,
            "kv_gib_total": self.pool_bytes_total / GiB,
            "token_slots": self.token_slots,
        }


def kv_bytes_per_token_per_gpu(model: ModelSpec, tp: int = 1) -> int:
    """One token's K and V (all layers) on one GPU of a TP group.

    KV heads split over TP; with more GPUs than KV heads vLLM replicates heads, so each GPU still
    stores one head's K/V.
    """
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise CannotServe(f"{model.name}: {model.num_kv_heads} KV heads cannot be split over tp={tp}")
    return model.kv_bytes_per_token // min(tp, model.num_kv_heads)


def block_bytes_per_gpu(kv_bytes_per_token: int, tp: int, block_size: int) -> int:
    """Bytes of one KV block (all layers, K and V) on one GPU of a TP group."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if kv_bytes_per_token * block_size % tp:
        raise CannotServe(f"KV heads do not split evenly over tp={tp}")
    return kv_bytes_per_token * block_size // tp


def kv_cache_capacity(model: ModelSpec | str, gpu: GPUSpec | str, tp: int = 1,
                      gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                      max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS,
                      max_num_seqs: int = DEFAULT_MAX_NUM_SEQS,
                      reserved_bytes: int = RUNTIME_RESERVED_BYTES) -> KVCapacity:
    """Size the KV pool as the paper does (see module docstring). Raises if the model does not fit."""
    model, gpu = get_model(model), get_gpu(gpu)
    if tp <= 0:
        raise ValueError("tp must be positive")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    usable = int(gpu_memory_utilization * gpu.memory_bytes)
    weights = -(-model.weight_bytes // tp)  # vLLM shards every matmul and the vocab over TP
    activations = profile_activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    pool = usable - weights - activations - reserved_bytes
    if pool <= 0:
        raise CannotServe(
            f"{model.name} on {tp} x {gpu.name} leaves no KV pool: usable {usable / GiB:.1f} GiB, "
            f"weights {weights / GiB:.1f}, activations {activations / GiB:.2f}, "
            f"reserved {reserved_bytes / GiB:.2f} GiB per GPU (split the model over more GPUs with --tp, or pick a "
            f"larger --gpu)")
    bytes_per_token = kv_bytes_per_token_per_gpu(model, tp) * tp
    return KVCapacity(model=model.name, gpu=gpu.name, tp=tp, bytes_per_token=bytes_per_token,
                      usable_bytes_per_gpu=usable, weight_bytes_per_gpu=weights,
                      activation_bytes_per_gpu=activations, reserved_bytes_per_gpu=reserved_bytes,
                      pool_bytes_per_gpu=pool)


def swap_space_blocks(swap_gib: float, model: ModelSpec | str, tp: int = 1,
                      block_size: int = 16) -> int:
    """Host (swap) blocks: vLLM's swap space is `swap_gib` of CPU memory per GPU."""
    model = get_model(model)
    per_gpu_token = kv_bytes_per_token_per_gpu(model, tp)
    return int(swap_gib * GiB) // block_bytes_per_gpu(per_gpu_token * tp, tp, block_size)
