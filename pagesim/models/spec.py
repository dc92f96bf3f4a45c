"""ModelSpec: a decoder-only transformer as far as memory and FLOP counting needs it.

The dense fields (layers, hidden, heads, KV heads, head size, MLP width, vocabulary, parameters,
max length, dtype, architecture) keep the meaning they always had; what modern models add is
optional and off by default, so a dense spec counts exactly as before:

- ``moe``: a mixture-of-experts MLP on ``moe.num_moe_layers`` of the layers (the others keep the
  dense ``ffn_size`` MLP): ``num_experts`` routed experts of width ``expert_ffn_size``, each token
  goes to ``experts_per_token`` of them, plus ``num_shared_experts`` always-on experts of total
  width ``shared_expert_ffn_size``. A latent MoE (``moe.latent_size``, Nemotron 3 Super) runs the
  routed experts in that narrower width between two always-on projections (hidden -> latent,
  latent -> hidden); the router and the shared experts keep the hidden width.
- ``mla``: multi-head latent attention (DeepSeek-V2/V3) on every layer: queries through an
  optional low-rank ``q_lora_rank``, keys and values through a latent of ``kv_lora_rank`` plus a
  shared rotary key of ``qk_rope_head_dim``; the cache keeps only that latent and rotary key
  (DeepSeek-V3.2: and the sparse-attention indexer's key, ``mla.indexer``).
- ``sliding_window`` / ``num_sliding_layers``: that many layers attend to the last W tokens only
  (Mistral v0.1: all; Gemma 2: every other; Gemma 3: five of six).
- ``qk_norm``: per-head RMSNorm of q and k (Qwen3, Gemma 3).
- ``quant``: weight-only, W8A8 or W4A4 quantization of the decoder's linear layers (fp8, int4
  AWQ/GPTQ, NVFP4), or of the routed experts only (``experts_only``: gpt-oss's MXFP4).
- ``kv_dtype_bytes``: the KV cache's element size (``--kv-cache-dtype fp8``: 1).
- ``num_vision_params``: a multimodal checkpoint's vision tower and projector (pagesim.models.vision),
  within ``num_params`` and the weight bytes (serving dtype, never quantized), not active per token.
- ``num_mlp_only_layers``: layers that are one block each (Nemotron-H): that many an MLP alone
  (dense, or MoE on ``moe.num_moe_layers`` of them), every other layer a token mixer alone
  (attention or linear attention), without an MLP. 0: every layer a mixer and an MLP.
- ``ungated_mlp``: every MLP is up -> activation -> down, two matrices (Nemotron-H's squared ReLU):
  the dense ones, and the routed and shared experts of a MoE (Nemotron 3).
- ``num_parallel_mixer_layers``: layers whose token mixer is attention AND linear attention side by
  side on the same input, their outputs summed (Falcon-H1: every layer). Each such layer counts
  among the attention layers and among ``linear_attn.num_layers``; it keeps paged KV and a state.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pagesim.core.errors import CannotServe
from pagesim.core.kv_groups import KVGroupSpec
from pagesim.models.lightning import LightningAttnSpec
from pagesim.models.mamba1 import Mamba1Spec
from pagesim.models.mamba2 import Mamba2Spec
from pagesim.models.parts import LinearAttnSpec, MLASpec, MoESpec, WeightQuant  # noqa: F401 (re-exported)

ARCHITECTURES = ("opt", "llama")
KV_CACHE_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer (see the module docstring for the optional parts).

    ``architecture`` "opt": MLP of 2 matrices (fc1, fc2), learned positions, tied LM head.
    ``architecture`` "llama": gated MLP of 3 matrices (gate, up, down), rotary, GQA allowed; every
    modern family (Mistral, Qwen, DeepSeek, Gemma, Phi-3) is llama-shaped in these terms.
    ``num_params`` is the exact total; ``num_active_params`` those one token runs through (None:
    all of them, a dense model).
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
    max_model_len: int  # the longest sequence, as vLLM derives it from config.json (pagesim.models.max_len)
    dtype_bytes: int = 2
    architecture: str = "opt"
    moe: MoESpec | None = None
    mla: MLASpec | None = None
    sliding_window: int | None = None
    num_sliding_layers: int = 0
    qk_norm: bool = False
    quant: WeightQuant | None = None
    kv_dtype_bytes: int | None = None  # None: dtype_bytes
    num_active_params: int | None = None
    linear_attn: LinearAttnSpec | Mamba2Spec | Mamba1Spec | LightningAttnSpec | None = None  # per-sequence state, no KV
    attn_output_gate: bool = False  # q_proj also gives a sigmoid gate on the attention output (Qwen3-Next)
    num_vision_params: int = 0  # vision tower + projector (pagesim.models.vision): in num_params, never active
    num_mlp_only_layers: int = 0  # one-block layers (Nemotron-H): this many MLPs alone, the rest mixers alone
    ungated_mlp: bool = False  # llama-shaped, but MLPs (experts too) of up and down only (relu2)
    num_parallel_mixer_layers: int = 0  # layers with attention and linear attention in parallel (Falcon-H1)

    def __post_init__(self) -> None:
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"{self.name}: architecture must be one of {ARCHITECTURES}")
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "ffn_size", "vocab_size", "num_params", "max_model_len", "dtype_bytes"):
            if getattr(self, f) <= 0:
                raise ValueError(f"{self.name}: {f} must be positive")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: num_heads must be a multiple of num_kv_heads")
        if (self.sliding_window is None) != (self.num_sliding_layers == 0):
            raise ValueError(f"{self.name}: sliding_window and num_sliding_layers go together")
        if not 0 <= self.num_sliding_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_sliding_layers must be in 0..num_layers")
        if self.mla is not None and self.num_sliding_layers:
            raise ValueError(f"{self.name}: MLA with sliding-window layers is not modelled")
        if not 0 <= self.num_mlp_only_layers < self.num_layers:
            raise ValueError(f"{self.name}: num_mlp_only_layers must be in 0..num_layers - 1")
        if self.moe is not None and not 0 < self.moe.num_moe_layers <= self.num_mlp_layers:
            raise ValueError(f"{self.name}: moe.num_moe_layers must be in 1..num_mlp_layers")
        if not 0 <= self.num_parallel_mixer_layers <= (self.linear_attn.num_layers if self.linear_attn else 0):
            raise ValueError(f"{self.name}: num_parallel_mixer_layers must be in 0..linear_attn.num_layers")
        if self.linear_attn is not None and self.num_attention_layers < 1:
            raise ValueError(f"{self.name}: linear-attention layers must leave at least one attention layer")
        if self.moe is not None and self.moe.latent_size and self.linear_attn is not None \
                and self.linear_attn.inner_all_reduce_width:
            raise ValueError(f"{self.name}: a latent MoE beside linear attention with inner all-reduces is not modelled")
        if self.quant is not None and self.quant.experts_only and self.moe is None:
            raise ValueError(f"{self.name}: {self.quant.method} quantizes MoE experts only; the model has none")

    # -- shapes ----------------------------------------------------------------------------
    @property
    def q_size(self) -> int:
        """Width of the query projection (num_heads * head_dim; MLA: its q/k head size)."""
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of one of the K or V projections (num_kv_heads * head_dim)."""
        return self.num_kv_heads * self.head_dim

    @property
    def v_head_dim(self) -> int:
        return self.mla.v_head_dim if self.mla else self.head_dim

    @property
    def gated_mlp(self) -> bool:
        return self.architecture == "llama" and not self.ungated_mlp

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    @property
    def expert_matrices(self) -> int:
        """Matrices of one (routed or shared) expert: gate, up, down; up and down where ungated."""
        return 2 if self.ungated_mlp else 3

    @property
    def num_mixer_layers(self) -> int:
        """Layers with a token mixer, attention or linear attention (all but one-block MLP layers)."""
        return self.num_layers - self.num_mlp_only_layers

    @property
    def num_mlp_layers(self) -> int:
        """Layers with an MLP, dense or MoE (all of them unless the layers are one block each)."""
        return self.num_mlp_only_layers or self.num_layers

    @property
    def num_blocks(self) -> int:
        """Residual blocks (a norm, a mixer or an MLP ending in a row-parallel projection: one TP
        all-reduce, a residual add): two a layer, one a layer where layers are one block each."""
        return self.num_mixer_layers + self.num_mlp_layers

    @property
    def num_tp_all_reduces(self) -> int:
        """TP all-reduces a forward pass: one a block, and one more a parallel-mixer layer (its
        attention and its linear attention end in a row-parallel projection each)."""
        return self.num_blocks + self.num_parallel_mixer_layers

    @property
    def mixer_all_reduces(self) -> tuple[int, int]:
        """(TP all-reduces a forward pass, elements a token each) inside the layers, besides the
        blocks' num_tp_all_reduces of the hidden size: Mamba v1's x_proj output (vLLM builds x_proj
        row-parallel: one a Mamba layer, Jamba); lightning attention's norm variance (one a layer,
        MiniMax-Text-01); a latent MoE's routed output, which vLLM sums over TP in the latent width
        before its latent -> hidden projection, the shared experts' output apart (MoERunner.
        _maybe_reduce_routed_output_before_transform: one more a MoE layer, Nemotron 3 Super).
        (0, 0) for every other model."""
        if self.moe is not None and self.moe.latent_size:
            return self.moe.num_moe_layers, self.moe.latent_size
        width = self.linear_attn.inner_all_reduce_width if self.linear_attn else 0
        return (self.linear_attn.num_layers, width) if width else (0, 0)

    @property
    def num_attention_layers(self) -> int:
        """Layers with (full or sliding) attention; the other mixers are linear-attention layers
        (parallel-mixer layers have both)."""
        linear = self.linear_attn.num_layers if self.linear_attn else 0
        return self.num_mixer_layers - linear + self.num_parallel_mixer_layers

    @property
    def num_mixer_kernels(self) -> int:
        """Attention and recurrent kernels a forward pass runs: one a mixer layer, two a parallel-mixer layer."""
        return self.num_mixer_layers + self.num_parallel_mixer_layers

    @property
    def num_dense_layers(self) -> int:
        """Layers with the dense ffn_size MLP (all MLP layers unless MoE)."""
        return self.num_mlp_layers - (self.moe.num_moe_layers if self.moe else 0)

    @property
    def params_total(self) -> int:
        return self.num_params

    @property
    def params_active(self) -> int:
        """Parameters one text token runs through (embedding row and LM head included, as model
        cards count; not the vision tower)."""
        return self.num_params - self.num_vision_params if self.num_active_params is None else self.num_active_params

    # -- KV cache --------------------------------------------------------------------------
    @property
    def kv_element_bytes(self) -> int:
        return self.kv_dtype_bytes or self.dtype_bytes

    @property
    def kv_groups(self) -> tuple[KVGroupSpec, ...]:
        """Layers by attention kind, as the core's KV cache groups take them."""
        if self.mla is not None:
            return (KVGroupSpec("mla", self.num_layers),)
        groups = []
        if self.num_attention_layers > self.num_sliding_layers:
            groups.append(KVGroupSpec("full", self.num_attention_layers - self.num_sliding_layers))
        if self.num_sliding_layers:
            groups.append(KVGroupSpec("sliding", self.num_sliding_layers, self.sliding_window))
        if self.linear_attn:
            groups.append(KVGroupSpec("state", self.linear_attn.num_layers))
        return tuple(groups)

    def state_bytes_per_sequence(self, tp: int = 1) -> int:
        """A sequence's linear-attention state over all such layers, on one GPU of tp (0: none)."""
        return self.linear_attn.num_layers * self.linear_attn.state_bytes_per_layer(tp) if self.linear_attn else 0

    def kv_bytes_per_token_per_layer_of(self, kind: str) -> int:
        """One token's cache in one layer of `kind`: K and V of the KV heads (full, sliding), or
        MLA's latent and rotary key. Whole model, all TP shards together. A state layer keeps no
        per-token cache (state_bytes_per_sequence)."""
        if kind == "state":
            return 0
        if kind == "mla":
            if self.mla is None:
                raise ValueError(f"{self.name} has no MLA layers")
            return self.mla.cache_bytes(self.kv_element_bytes)
        return 2 * self.num_kv_heads * self.head_dim * self.kv_element_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """One token's cache over all layers (whole model, all TP shards together). A token in a
        sliding-window layer takes the same bytes while it is inside the window."""
        return sum(g.num_layers * self.kv_bytes_per_token_per_layer_of(g.kind) for g in self.kv_groups)

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        return self.kv_bytes_per_token // self.num_layers

    @property
    def kv_bytes_per_token_full_layers(self) -> int:
        """What a token costs once its sequence is longer than every sliding window: the layers
        that keep every token (full attention and MLA)."""
        return sum(g.num_layers * self.kv_bytes_per_token_per_layer_of(g.kind)
                   for g in self.kv_groups if g.kind != "sliding")

    def kv_bytes_per_token_per_gpu(self, tp: int = 1) -> int:
        """One token's cache (all layers) on one GPU of a TP group. KV heads split over TP (with
        more GPUs than KV heads vLLM replicates heads, so each GPU keeps one); MLA's latent is one
        vector shared by all heads, so vLLM keeps all of it on every TP rank."""
        if self.num_heads % tp:  # vLLM refuses these too (ModelConfig.verify_with_parallel_config)
            raise CannotServe(f"{self.name}: {self.num_heads} attention heads cannot be split over tp={tp}")
        if self.mla is not None:
            return self.kv_bytes_per_token
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise CannotServe(f"{self.name}: {self.num_kv_heads} KV heads cannot be split over tp={tp}")
        return self.kv_bytes_per_token // min(tp, self.num_kv_heads)

    # -- weights ---------------------------------------------------------------------------
    @property
    def attention_linear_params_per_layer(self) -> int:
        """Matmul weights of one layer's attention (projections in and out)."""
        h = self.hidden_size
        if self.mla is not None:
            m, heads = self.mla, self.num_heads
            q = (h * m.q_lora_rank + m.q_lora_rank * heads * m.qk_head_dim) if m.q_lora_rank else h * heads * m.qk_head_dim
            kv = h * m.latent_size + m.kv_lora_rank * heads * (m.qk_nope_head_dim + m.v_head_dim)
            indexer = m.indexer.linear_params(h, m.q_lora_rank) if m.indexer else 0  # DeepSeek-V3.2
            return q + kv + heads * m.v_head_dim * h + indexer
        gate = h * self.q_size if self.attn_output_gate else 0
        return h * (self.q_size + 2 * self.kv_size) + self.q_size * h + gate

    @property
    def dense_mlp_params(self) -> int:
        return self.mlp_matrices * self.hidden_size * self.ffn_size

    @property
    def expert_hidden_size(self) -> int:
        """The width a routed expert reads and writes: the MoE's latent width, else the hidden size."""
        return (self.moe.latent_size or self.hidden_size) if self.moe else self.hidden_size

    @property
    def expert_params(self) -> int:
        """One routed expert's weights (an MLP of expert_ffn_size on expert_hidden_size, gated unless ungated_mlp)."""
        return self.expert_matrices * self.expert_hidden_size * self.moe.expert_ffn_size if self.moe else 0

    @property
    def moe_latent_params(self) -> int:
        """A latent MoE layer's two projections, hidden -> latent and back (0 without)."""
        return 2 * self.hidden_size * self.moe.latent_size if self.moe else 0

    @property
    def moe_always_on_params(self) -> int:
        """Weights every token of a MoE layer runs through besides its routed experts: the router
        (h -> E), the shared experts and their gate, a latent MoE's two projections."""
        if not self.moe:
            return 0
        m, h = self.moe, self.hidden_size
        shared = self.expert_matrices * h * m.shared_expert_ffn_size
        return h * m.num_experts + shared + (h if m.shared_expert_gate else 0) + self.moe_latent_params

    @property
    def linear_params_per_layer(self) -> int:
        """Weights of one dense layer's matmuls (QKV, output projection, MLP); norms and biases excluded."""
        return self.attention_linear_params_per_layer + self.dense_mlp_params

    @property
    def mixer_linear_params(self) -> int:
        """Matmul weights of every layer's token mixer: attention, or linear attention's projections."""
        la = self.linear_attn
        linear = la.num_layers * la.linear_params(self.hidden_size) if la else 0
        return self.num_attention_layers * self.attention_linear_params_per_layer + linear

    @property
    def linear_params(self) -> int:
        """Matmul weights one token runs through over all layers (routed experts: its top-k);
        each token costs 2 FLOPs per weight."""
        dense = self.mixer_linear_params + self.num_dense_layers * self.dense_mlp_params
        if not self.moe:
            return dense
        return dense + self.moe.num_moe_layers * (self.moe_always_on_params
                                                  + self.moe.experts_per_token * self.expert_params)

    @property
    def linear_params_total(self) -> int:
        """Every matmul weight of the decoder layers (all experts)."""
        dense = self.mixer_linear_params + self.num_dense_layers * self.dense_mlp_params
        if not self.moe:
            return dense
        return dense + self.moe.num_moe_layers * (self.moe_always_on_params + self.moe.num_experts * self.expert_params)

    @property
    def quantized_params(self) -> int:
        """Weights a quantization_config quantizes: the decoder's linear layers except the
        router (vLLM builds the MoE gate unquantized), or only the routed experts' matmul weights
        (`experts_only`); embeddings, LM head, norms and biases stay in the serving dtype."""
        if self.quant is None:
            return 0
        q = self.quant
        if q.experts_only:
            return self.moe.num_moe_layers * self.moe.num_experts * self.expert_params
        router = self.moe.num_moe_layers * self.hidden_size * self.moe.num_experts if self.moe else 0
        if self.mla is not None and self.mla.indexer is not None:  # vLLM builds weights_proj unquantized
            router += self.num_layers * self.hidden_size * self.mla.indexer.num_heads
        kept = (self.mixer_linear_params if q.kept_mixer_layers else 0) + q.kept_mlp_layers * self.dense_mlp_params
        if q.kept_shared_layers and self.moe:
            kept += self.moe.num_moe_layers * (self.moe_always_on_params - self.hidden_size * self.moe.num_experts)
        return self.linear_params_total - router - kept

    @property
    def weight_bytes(self) -> int:
        if self.quant is None:
            return self.num_params * self.dtype_bytes
        q = self.quantized_params
        return (self.num_params - q) * self.dtype_bytes + round(q * self.quant.bytes_per_weight)

    @property
    def routed_expert_weight_bytes(self) -> int:
        """Bytes of all routed experts (what expert parallelism splits over GPUs)."""
        if self.moe is None:
            return 0
        return round(self.moe.num_moe_layers * self.moe.num_experts * self.expert_params
                     * self.expert_weight_element_bytes)

    def weight_bytes_per_gpu(self, tp: int = 1, ep: int = 1) -> int:
        """Weights on one GPU: vLLM shards every matmul and the vocabulary over TP; with expert
        parallelism the routed experts are split whole over the ep GPUs instead."""
        if ep == 1:
            return -(-self.weight_bytes // tp)
        experts = self.routed_expert_weight_bytes
        return -(-(self.weight_bytes - experts) // tp) + -(-experts // ep)

    def part_weights(self, part: str) -> tuple[float, bool, bool]:
        """(bytes per weight, W8A8 FP8 GEMM, W4A4 FP4 GEMM) of one part of the layers: "mixer"
        (attention or linear attention projections), "mlp" (dense MLPs: the mean over the layers,
        where some keep theirs in the serving dtype, so their bytes add up exactly), "shared"
        (shared experts)."""
        q = self.quant
        if q is None or q.experts_only:
            return float(self.dtype_bytes), False, False
        if (part == "mixer" and q.kept_mixer_layers) or (part == "shared" and q.kept_shared_layers):
            return float(self.dtype_bytes), False, False
        if part == "mlp" and q.kept_mlp_layers:
            n = self.num_dense_layers
            return ((n - q.kept_mlp_layers) * q.bytes_per_weight + q.kept_mlp_layers * self.dtype_bytes) / n, \
                q.fp8_compute, q.fp4_compute
        return q.bytes_per_weight, q.fp8_compute, q.fp4_compute

    @property
    def expert_weight_element_bytes(self) -> float:
        """Bytes per weight of the routed experts (MXFP4: 4 bits + an 8-bit scale per 32 = 0.53125)."""
        return self.quant.bytes_per_weight if self.quant else self.dtype_bytes

    # -- FLOP counting -----------------------------------------------------------------------
    @property
    def lm_head_params(self) -> int:
        """The vocabulary projection (tied to the embedding in OPT, but still read for logits)."""
        return self.vocab_size * self.hidden_size

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, key) pair over all layers, QK^T and PV, 2 FLOPs per MAC each, as
        a dense attention computes them (MLA prefill: q/k heads of qk_head_dim, v of v_head_dim);
        linear-attention layers have no pairs (pagesim.sim.cost.linear_attn)."""
        return 2 * self.num_heads * (self.head_dim + self.v_head_dim) * self.num_attention_layers

    @property
    def mla_decode_flops_per_pair(self) -> int:
        """MLA decode in the latent space (vLLM absorbs the up-projections into q and the output):
        per head, q.k over latent + rotary key, then p.v over the latent; all layers."""
        if self.mla is None:
            return self.attention_flops_per_pair
        m = self.mla
        return 2 * self.num_heads * (m.latent_size + m.kv_lora_rank) * self.num_layers


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str | None) -> ModelSpec:
    """The spec with vLLM's --kv-cache-dtype applied ("auto": the checkpoint's, i.e. the model's
    dtype, or fp8 where a ModelOpt checkpoint's kv_cache_quant_algo says so; "fp8": 1 byte)."""
    key = (kv_cache_dtype or "auto").lower()
    if key not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    size = KV_CACHE_DTYPES[key]
    return model if size is None or size == model.kv_element_bytes else replace(model, kv_dtype_bytes=size)
