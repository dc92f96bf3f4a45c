"""OPT decoder (the paper's models): learned positions, LayerNorm before (125m..66b) or after
(350m) each block, ReLU FFN, lm_head tied to the token embedding. Parameter names follow HF's
with q/k/v merged."""

from __future__ import annotations

from torch import nn

from executor.attention import AttentionMetadata, PagedAttention
from executor.models.layers import MergedLinear, activation

# Learned position embeddings start at row 2: fairseq reserved rows 0-1 for padding.
POSITION_OFFSET = 2


class OPTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, heads = config.hidden_size, config.num_attention_heads
        head_dim = hidden // heads
        bias = getattr(config, "enable_bias", True)
        self.qkv_proj = MergedLinear(hidden, {"q": hidden, "k": hidden, "v": hidden}, bias=bias)
        self.out_proj = nn.Linear(hidden, hidden, bias=bias)
        self.attn = PagedAttention(heads, heads, head_dim, head_dim**-0.5)

    def forward(self, x, kv_cache, md):
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))
        return self.out_proj(self.attn(q, k, v, kv_cache, md))


class OPTDecoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        bias = getattr(config, "enable_bias", True)
        self.pre_norm = config.do_layer_norm_before
        self.self_attn = OPTAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.fc1 = nn.Linear(config.hidden_size, config.ffn_dim, bias=bias)
        self.fc2 = nn.Linear(config.ffn_dim, config.hidden_size, bias=bias)
        self.final_layer_norm = nn.LayerNorm(config.hidden_size, elementwise_affine=affine)
        self.act = activation(config.activation_function)

    def forward(self, x, kv_cache, md):
        if self.pre_norm:
            x = x + self.self_attn(self.self_attn_layer_norm(x), kv_cache, md)
            return x + self.fc2(self.act(self.fc1(self.final_layer_norm(x))))
        x = self.self_attn_layer_norm(x + self.self_attn(x, kv_cache, md))
        return self.final_layer_norm(x + self.fc2(self.act(self.fc1(x))))


class OPTDecoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        hidden, embed_dim = config.hidden_size, config.word_embed_proj_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, embed_dim)
        self.embed_positions = nn.Embedding(config.max_position_embeddings + POSITION_OFFSET, hidden)
        # opt-350m embeds in 512 dims and runs the blocks in 1024: project in and out.
        self.project_in = nn.Linear(embed_dim, hidden, bias=False) if embed_dim != hidden else None
        self.project_out = nn.Linear(hidden, embed_dim, bias=False) if embed_dim != hidden else None
        self.layers = nn.ModuleList(OPTDecoderLayer(config) for _ in range(config.num_hidden_layers))
        # Post-LN models (350m) end without a final norm; _remove_final_layer_norm is an old
        # checkpoint flag for the same thing.
        keep_final = config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False)
        affine = getattr(config, "layer_norm_elementwise_affine", True)
        self.final_layer_norm = nn.LayerNorm(hidden, elementwise_affine=affine) if keep_final else None

    def forward(self, input_ids, positions, kv_caches, md):
        x = self.embed_tokens(input_ids)
        if self.project_in is not None:
            x = self.project_in(x)
        x = x + self.embed_positions(positions + POSITION_OFFSET)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, kv_cache, md)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return x


class OPTModel(nn.Module):
    """Only here so parameter names match HF's (model.decoder.*)."""

    def __init__(self, config):
        super().__init__()
        self.decoder = OPTDecoder(config)


class OPTForCausalLM(nn.Module):
    packed_modules = {"q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v")}

    def __init__(self, config):
        super().__init__()
        self.num_layers = config.num_hidden_layers
        self.num_kv_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.model = OPTModel(config)
        self.lm_head = nn.Linear(config.word_embed_proj_dim, config.vocab_size, bias=False)
        self.tied = getattr(config, "tie_word_embeddings", True)
        self.tie_weights()
        # learned position embeddings: no sequence may run past the table (RoPE models have no such limit)
        self.position_limit = config.max_position_embeddings

    def tie_weights(self):
        """lm_head reuses the embedding matrix; called again after the loader's to_empty, which
        gives every module its own tensor."""
        if self.tied:
            self.lm_head.weight = self.model.decoder.embed_tokens.weight

    @staticmethod
    def map_hf_name(name: str) -> str | None:
        """HF checkpoint name -> ours (before un-merging); None to skip. The original facebook/opt
        checkpoints name the decoder without the leading "model."."""
        if name.startswith("decoder."):
            return "model." + name
        return name

    def forward(self, input_ids, positions, kv_caches, attn_metadata: AttentionMetadata):
        """input_ids, positions [num_tokens] -> hidden states [num_tokens, word_embed_proj_dim]."""
        return self.model.decoder(input_ids, positions, kv_caches, attn_metadata)

    def compute_logits(self, hidden, indices=None):
        """fp32 logits for the rows that sample (all rows when indices is None)."""
        if indices is not None:
            hidden = hidden[indices]
        return self.lm_head(hidden).float()
