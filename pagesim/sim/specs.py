"""GPU catalog, and KV-pool sizing as the paper (vLLM, SOSP'23) sizes it. The model catalog and
ModelSpec live in pagesim.models; their names are re-exported here for existing callers.

GPU numbers come from NVIDIA's datasheets (SXM parts where there are several): memory as the nominal capacity in GiB
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

from dataclasses import dataclass, field

from pagesim.core.errors import CannotServe
# The paper's max batched tokens; also the size of vLLM's profiling forward pass.
from pagesim.core.config import DEFAULT_MAX_NUM_BATCHED_TOKENS
from pagesim.models import (ARCHITECTURES, LLAMA_FAMILY, MODEL_ALIASES, MODELS, SERVING_DTYPE_BYTES,  # noqa: F401
                            ModelConfigError, ModelSpec, get_model, is_config_path, load_model_config, lookup,
                            model_from_config, normalize_name, with_kv_cache_dtype)

GiB = 1 << 30
GB = 10**9
TB = 10**12


# --------------------------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Interconnect:
    """How the GPUs of one tensor- or expert-parallel group reach each other: what prices the
    all-reduce and the expert-parallel exchange.

    ``kind``: ``nvlink`` (every pair of GPUs linked, as on SXM boards) or ``pcie``. ``p2p``:
    the GPUs can map each other's memory; vLLM's custom all-reduce needs it, and without full
    NVLink it runs only for 2 GPUs (vllm/distributed/device_communicators/custom_all_reduce.py:
    "not supported on more than two PCIe-only GPUs", then a P2P test). ``bandwidth`` (bytes/s per
    direction) and ``latency_s`` are what one collective between two GPUs achieves, where they
    are documented apart from the datasheet link (0: the GPU's interconnect_bandwidth and the
    engine's fitted NVLink latency)."""

    kind: str = "nvlink"
    p2p: bool = True
    bandwidth: float = 0.0
    latency_s: float = 0.0


NVLINK = Interconnect()
# Host-staged PCIe (no P2P: NCCL moves every message through host memory). LLMServingSim's
# cluster description of the RTX PRO 6000 machine the shared vLLM 0.19 runs were measured on
# (casys-kaist/LLMServingSim 5daddb2, bench/examples/RTXPRO6000/*/config.json: link_bw 16 GB/s,
# link_latency 20,000 ns): a quarter of PCIe Gen5 x16's 64 GB/s per direction.
PCIE_HOST_STAGED = Interconnect("pcie", p2p=False, bandwidth=16 * 10**9, latency_s=20e-6)


@dataclass(frozen=True, slots=True)
class GPUSpec:
    """One accelerator. Bandwidths in bytes/s, compute in FLOP/s (dense, without sparsity).

    ``interconnect_bandwidth`` and ``pcie_bandwidth`` are per direction, per GPU; a GPU without
    NVLink has its PCIe bandwidth as interconnect. ``fp8_flops``: FP8 tensor-core peak, 0 where
    the GPU has no FP8 tensor cores (Ampere): FP8 weights then compute at the FP16 rate.
    ``fp4_flops``: FP4 (NVFP4) tensor-core peak, 0 where the GPU has none (everything before
    Blackwell): NVFP4 weights then run weight-only, as vLLM's Marlin FP4 fallback does.
    """

    name: str
    memory_bytes: int
    hbm_bandwidth: float
    fp16_flops: float
    interconnect_bandwidth: float
    pcie_bandwidth: float
    fp8_flops: float = 0.0
    link: Interconnect = NVLINK
    fp4_flops: float = 0.0

    @property
    def collective_bandwidth(self) -> float:
        """Bytes/s per direction one collective between two GPUs of a group achieves."""
        return self.link.bandwidth or self.interconnect_bandwidth

    def custom_allreduce(self, tp: int) -> bool:
        """Whether vLLM's custom all-reduce runs on a group of `tp` of these GPUs: full NVLink,
        or exactly 2 GPUs with P2P (Interconnect); otherwise every all-reduce is NCCL's."""
        return self.link.kind == "nvlink" or (tp == 2 and self.link.p2p)

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GiB

    @property
    def has_fp8(self) -> bool:
        return self.fp8_flops > 0

    @property
    def has_fp4(self) -> bool:
        return self.fp4_flops > 0


GPUS: dict[str, GPUSpec] = {
    # NVIDIA A100 datasheet (SXM4 40GB): HBM2 40GB, 1,555 GB/s; FP16 tensor 312 TFLOPS dense;
    # NVLink 600 GB/s (bidirectional) -> 300 per direction; PCIe Gen4 64 GB/s -> 32 per direction.
    # No FP8 tensor cores (Ampere).
    "a100-40gb": GPUSpec("a100-40gb", 40 * GiB, 1555 * GB, 312 * TB, 300 * GB, 32 * GB),
    # NVIDIA A100 datasheet (SXM4 80GB): HBM2e 80GB, 2,039 GB/s; otherwise as above.
    "a100-80gb": GPUSpec("a100-80gb", 80 * GiB, 2039 * GB, 312 * TB, 300 * GB, 32 * GB),
    # NVIDIA H100 datasheet (SXM5): HBM3 80GB, 3.35 TB/s; FP16 tensor 1,979 TFLOPS with
    # sparsity -> 989.5 dense; FP8 3,958 with sparsity -> 1,979 dense; NVLink 900 GB/s -> 450 per
    # direction; PCIe Gen5 128 -> 64.
    "h100-80gb": GPUSpec("h100-80gb", 80 * GiB, 3350 * GB, 989.5 * TB, 450 * GB, 64 * GB, 1979 * TB),
    # NVIDIA H200 datasheet (SXM): HBM3e 141GB, 4.8 TB/s; compute and links as H100 SXM.
    # (nvidia-smi reports 143771 MiB = 140.4 GiB, so the 141 is GiB less a driver reserve.)
    "h200-141gb": GPUSpec("h200-141gb", 141 * GiB, 4800 * GB, 989.5 * TB, 450 * GB, 64 * GB, 1979 * TB),
    # NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s; FP16 tensor 299.4 TFLOPS with sparsity ->
    # 149.7 dense; NVLink bridge 112.5 GB/s (bidirectional, pairs) -> 56.25; PCIe Gen4 64 -> 32.
    "a40-48gb": GPUSpec("a40-48gb", 48 * GiB, 696 * GB, 149.7 * TB, 56.25 * GB, 32 * GB),
    # NVIDIA L40S datasheet: 48 GB GDDR6 with ECC, 864 GB/s; BF16/FP16 tensor 362.05 TFLOPS
    # dense (733 with sparsity); FP8 733 dense (1,466 with sparsity); no NVLink, PCIe Gen4 x16
    # 64 GB/s bidirectional -> 32 per direction, which is also its GPU-to-GPU link.
    # Peer-to-peer over PCIe is supported on L40S (a data-center part); no collective figure of
    # its own is documented, so the PCIe link at the host-staged latency below.
    "l40s-48gb": GPUSpec("l40s-48gb", 48 * GiB, 864 * GB, 362.05 * TB, 32 * GB, 32 * GB, 733 * TB,
                         Interconnect("pcie", p2p=True, latency_s=PCIE_HOST_STAGED.latency_s)),
    # NVIDIA RTX PRO 6000 Blackwell Server Edition datasheet: 96 GB GDDR7 with ECC, 1,597 GB/s
    # (the Workstation Edition clocks its memory to 1,792 GB/s; the shared real runs' own
    # description, LLMServingSim's RTXPRO6000 config, gives 1,597); FP4 tensor 4 PFLOPS with
    # sparsity, so 2,015.2 TFLOPS dense (the 4,030.4 sparse that third-party spec databases
    # tabulate from NVIDIA's RTX Blackwell architecture whitepaper, halved). Dense FP16/BF16 (FP32
    # accumulate) 503.8 and FP8 1,007.6 TFLOPS are a quarter and a half of that FP4 dense rate, from
    # the same tables: less certain than the memory figures. No NVLink; PCIe Gen5 x16 128 GB/s
    # bidirectional -> 64 per direction. Collectives: host-staged (PCIE_HOST_STAGED, the measured
    # machine's own description).
    "rtx-pro-6000-96gb": GPUSpec("rtx-pro-6000-96gb", 96 * GiB, 1597 * GB, 503.8 * TB, 64 * GB, 64 * GB, 1007.6 * TB,
                                 PCIE_HOST_STAGED, fp4_flops=2015.2 * TB),
    # NVIDIA Ada GPU architecture whitepaper, appendix (GeForce RTX 4090): 24 GB GDDR6X,
    # 1,008 GB/s; FP16/BF16 tensor with FP32 accumulate (what bf16 GEMMs use) 165.2 TFLOPS dense
    # (GeForce runs FP32 accumulation at half the FP16-accumulate 330.3); FP8 with FP32
    # accumulate 330.3 dense. No NVLink; PCIe Gen4 x16 -> 32 GB/s per direction. GeForce drivers
    # disable peer-to-peer, so collectives are host-staged (PCIE_HOST_STAGED).
    "rtx-4090-24gb": GPUSpec("rtx-4090-24gb", 24 * GiB, 1008 * GB, 165.2 * TB, 32 * GB, 32 * GB, 330.3 * TB,
                             PCIE_HOST_STAGED),
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
    "l40s": "l40s-48gb",
    "rtx-pro-6000": "rtx-pro-6000-96gb",
    "rtxpro6000": "rtx-pro-6000-96gb",
    "rtx-pro-6000-blackwell": "rtx-pro-6000-96gb",
    "rtx-4090": "rtx-4090-24gb",
    "rtx4090": "rtx-4090-24gb",
}


def get_gpu(name: str | GPUSpec) -> GPUSpec:
    """A catalog GPU by id (``a100-40gb``, ``h200``, ...); a GPUSpec passes through."""
    if isinstance(name, GPUSpec):
        return name
    return lookup("GPU", name, GPUS, GPU_ALIASES)


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
    if model.moe is not None:
        # vLLM's fused MoE keeps, per routed (token, expert) pair, the gate+up output (up alone
        # where ungated), the activation and the down output (its intermediate caches 1-3),
        # experts split over TP; a latent MoE's down output is latent-wide
        k, ffe = model.moe.experts_per_token, model.moe.expert_ffn_size
        mlp = max(mlp, t * k * (model.expert_matrices * ffe // tp + model.expert_hidden_size) * d)
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
    """One token's cache (all layers) on one GPU of a TP group (ModelSpec.kv_bytes_per_token_per_gpu:
    KV heads split over TP, replicated past one per GPU; MLA's latent kept whole on every rank)."""
    return model.kv_bytes_per_token_per_gpu(tp)


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
                      reserved_bytes: int = RUNTIME_RESERVED_BYTES, ep: int = 1) -> KVCapacity:
    """Size the KV pool as the paper does (see module docstring). Raises if the model does not fit.
    `ep` > 1: a MoE's routed experts split over ep GPUs (ModelSpec.weight_bytes_per_gpu)."""
    model, gpu = get_model(model), get_gpu(gpu)
    if tp <= 0:
        raise ValueError("tp must be positive")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError("gpu_memory_utilization must be in (0, 1]")
    usable = int(gpu_memory_utilization * gpu.memory_bytes)
    weights = model.weight_bytes_per_gpu(tp, ep)
    activations = profile_activation_bytes(model, tp, max_num_batched_tokens, max_num_seqs)
    pool = usable - weights - activations - reserved_bytes
    if pool <= 0:
        # the step's token budget defaults to the max length: a long-context model (Mistral-Nemo's
        # 1,024,000) can fit its weights and still not its activations
        small_step = profile_activation_bytes(model, tp, DEFAULT_MAX_NUM_BATCHED_TOKENS, max_num_seqs)
        step_too_big = (max_num_batched_tokens > DEFAULT_MAX_NUM_BATCHED_TOKENS
                        and usable - weights - small_step - reserved_bytes > 0)
        fix = (f"the activations are sized for a step of {max_num_batched_tokens:,} tokens: lower --max-model-len, "
               "or chunk prompts: --chunked-prefill (vLLM v1, --policy vllm-v1, always does)" if step_too_big
               else "split the model over more GPUs with --tp, or pick a larger --gpu")
        raise CannotServe(
            f"{model.name} on {tp} x {gpu.name} leaves no KV pool: usable {usable / GiB:.1f} GiB, "
            f"weights {weights / GiB:.1f}, activations {activations / GiB:.2f}, "
            f"reserved {reserved_bytes / GiB:.2f} GiB per GPU ({fix})")
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
