"""LLaMA-style decoder (LLaMA 1/2/3, SmolLM2, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE,
DeepSeek-V2): RMSNorm, RoPE, grouped-query or multi-head latent attention, a SiLU-gated MLP or a
mixture of experts. What differs per family (biases, q/k norm, sliding windows, MoE layers, MLA)
comes from executor.models.families.DecoderSpec. Parameter names follow HF's with q/k/v and
gate/up merged."""

from __future__ import annotations

from torch import nn

from executor.attention import AttentionMetadata, PagedAttention
from executor.models.families import DecoderSpec, decoder_spec, kv_groups
from executor.models.layers import GatedMLP, MergedLinear, RMSNorm
from executor.models.mla import MLAAttention
from executor.models.moe import SparseMoeBlock
from executor.models.rope import RotaryEmbedding, apply_rope


class LlamaAttention(nn.Module):
    def __init__(self, config, spec: DecoderSpec, layer: int, num_heads, num_kv_heads, head_dim):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        qkv = {"q": num_heads * head_dim, "k": num_kv_heads * head_dim, "v": num_kv_heads * head_dim}
        self.qkv_proj = MergedLinear(config.hidden_size, qkv, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(num_heads * head_dim, config.hidden_size, bias=spec.o_bias)
        if spec.qk_norm:  # Qwen3: RMSNorm over each head's dims, before RoPE
            self.q_norm = RMSNorm(head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(head_dim, config.rms_norm_eps)
        self.qk_norm = spec.qk_norm
        scale = spec.attn_scale or head_dim**-0.5
        self.attn = PagedAttention(num_heads, num_kv_heads, head_dim, scale, spec.windows[layer], softcap=spec.attn_softcap)

    def forward(self, rope, x, kv_cache, md: AttentionMetadata):
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        return self.o_proj(self.attn(q, k, v, kv_cache, md))


def make_mlp(config, spec: DecoderSpec, layer: int) -> nn.Module:
    if layer in spec.moe_layers:
        return SparseMoeBlock(config.hidden_size, spec.moe)
    return GatedMLP(config.hidden_size, config.intermediate_size, config.hidden_act, getattr(config, "mlp_bias", False))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, spec: DecoderSpec, layer: int, num_heads, num_kv_heads, head_dim):
        super().__init__()
        if spec.attention == "mla":
            self.self_attn = MLAAttention(config)
        else:
            self.self_attn = LlamaAttention(config, spec, layer, num_heads, num_kv_heads, head_dim)
        self.mlp = make_mlp(config, spec, layer)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, rope, x, kv_cache, md):
        x = x + self.self_attn(rope, self.input_layernorm(x), kv_cache, md)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    layer_class, norm_class = LlamaDecoderLayer, RMSNorm  # Gemma 2 swaps both

    def __init__(self, config, spec: DecoderSpec, num_heads, num_kv_heads, head_dim):
        super().__init__()
        # MLA rotates only the qk_rope_head_dim part of each head
        rope_dim = config.qk_rope_head_dim if spec.attention == "mla" else head_dim
        self.rotary = RotaryEmbedding.from_config(config, rope_dim)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            self.layer_class(config, spec, i, num_heads, num_kv_heads, head_dim) for i in range(config.num_hidden_layers)
        )
        self.norm = self.norm_class(config.hidden_size, config.rms_norm_eps)

    def embed(self, input_ids):
        return self.embed_tokens(input_ids)

    def forward(self, input_ids, positions, kv_caches, md):
        x = self.embed(input_ids)
        rope = self.rotary.cos_sin(positions, x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(rope, x, kv_cache, md)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    model_class = LlamaModel
    # HF checkpoint projection -> (our merged module, shard)
    packed_modules = {
        "q_proj": ("qkv_proj", "q"),
        "k_proj": ("qkv_proj", "k"),
        "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"),
        "up_proj": ("gate_up_proj", "up"),
    }

    def __init__(self, config):
        super().__init__()
        self.num_layers = config.num_hidden_layers
        num_heads = config.num_attention_heads
        self.spec = spec = decoder_spec(config)
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        self.model = self.model_class(config, spec, num_heads, self.num_kv_heads, self.head_dim)
        # What the KV cache holds per token and layer: K and V per KV head, or for MLA one latent
        # vector (kv_shared: the cache tensor is both the kernels' K and V).
        self.kv_shared = spec.attention == "mla"
        if self.kv_shared:
            self.num_kv_heads, self.head_dim = 1, config.kv_lora_rank + config.qk_rope_head_dim
        self.kv_groups, self.layer_groups = kv_groups(spec)
        for layer, group in zip(self.model.layers, self.layer_groups):
            layer.self_attn.attn.kv_group = group
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tied = getattr(config, "tie_word_embeddings", False)
        self.tie_weights()

    def tie_weights(self):
        """lm_head reuses the embedding matrix; called again after the loader's to_empty, which
        gives every module its own tensor."""
        if self.tied:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def map_hf_name(name: str) -> str | None:
        """HF checkpoint name -> ours (before un-merging); None to skip."""
        if "rotary_emb.inv_freq" in name:  # older checkpoints saved this buffer
            return None
        return name.replace(".block_sparse_moe.", ".mlp.")  # Mixtral checkpoints' name for the MoE

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        """input_ids, positions [num_tokens] -> hidden states [num_tokens, hidden_size]."""
        return self.model(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden, indices=None):
        """fp32 logits for the rows that sample (all rows when indices is None)."""
        if indices is not None:
            hidden = hidden[indices]
        return self.lm_head(hidden).float()
