"""Mistral (sliding window), Mixtral (MoE), Qwen3 (q/k norm, interleaved windows), Qwen3-MoE
and DeepSeek-V2 (MLA over a paged latent cache, shared experts, group-limited routing) on the
paged cache against transformers' own models (CPU, fp32, random weights):
prompt logits, decode logits step by step, greedy tokens through the engine (scheduler and
paged KV manager), checkpoints, and malformed configs. Block size 4 and windows of 8 tokens, so
every prompt and decode here crosses the window and the block boundaries inside it."""

from __future__ import annotations

import copy
import functools
import json

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from executor import kernels  # noqa: E402
from executor.cache_engine import CacheEngine  # noqa: E402
from executor.engine import EngineConfig, LLMEngine  # noqa: E402
from executor.kernels.reference import NULL_BLOCK  # noqa: E402
from executor.models import loader  # noqa: E402
from pagesim.core import SamplingParams  # noqa: E402
from tests.executor.test_models import Blocks, hf_logits, prompt, randomize, run  # noqa: E402

BS = 4


def new_cache(lm, block_size=BS, num_blocks=96):
    """The model's paged cache: K and V per KV head, or MLA's one latent tensor per layer."""
    return CacheEngine(lm.num_layers, lm.num_kv_heads, lm.head_dim, block_size, num_blocks, 8, torch.float32, "cpu",
                       kv_shared=lm.kv_shared)
VARIANTS = {  # name -> (tiny config, fields changed)
    "mistral-tiny": ("mistral-tiny", {}),
    "mixtral-tiny": ("mixtral-tiny", {}),
    "mixtral-window": ("mixtral-tiny", {"sliding_window": 8}),
    "qwen2-tiny": ("qwen2-tiny", {}),
    "qwen3-tiny": ("qwen3-tiny", {}),
    "qwen3-moe-tiny": ("qwen3-moe-tiny", {}),
    "qwen3-moe-unnormalised-window": ("qwen3-moe-tiny", {"norm_topk_prob": False, "use_sliding_window": True,
                                                         "sliding_window": 8}),
    "gemma2-tiny": ("gemma2-tiny", {}),
    # caps small enough that they bind (scores and logits here reach about 10)
    "gemma2-capped": ("gemma2-tiny", {"attn_logit_softcapping": 2.0, "final_logit_softcapping": 3.0}),
    "deepseek-v2-tiny": ("deepseek-v2-tiny", {}),
    # low-rank queries, experts in 2 groups of which the best 1 is routed to, scaled weights
    "deepseek-v2-grouped": ("deepseek-v2-tiny", {"q_lora_rank": 24, "topk_method": "group_limited_greedy",
                                                 "n_group": 2, "topk_group": 1, "routed_scaling_factor": 1.5}),
}


# Scaled RoPE kinds real checkpoints use: Llama 3.1's llama3, YaRN (Qwen3 long context, DeepSeek-V2
# with its extra softmax mscale); original lengths short enough that the tiny models' frequencies move.
LLAMA3 = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}
ROPE_VARIANTS = {
    "llama-llama3": ("llama-tiny", {"rope_parameters": LLAMA3}),
    "qwen3-yarn": ("qwen3-tiny", {"rope_parameters": YARN}),
    "deepseek-v2-yarn": ("deepseek-v2-tiny", {"rope_parameters": {**YARN, "mscale": 0.707, "mscale_all_dim": 0.707}}),
}


# KV layouts of several tables per kind (tests/executor/test_engine_kv_groups.py): 2 full and 4
# windowed layers make 2-layer tables, one full and two sliding
LAYOUT_VARIANTS = {
    "qwen3-six-layers": ("qwen3-tiny", {"num_hidden_layers": 6, "max_window_layers": 2, "layer_types": None}),
}


def make_config(variant):
    base, changes = {**VARIANTS, **ROPE_VARIANTS, **LAYOUT_VARIANTS}[variant]
    config = loader.tiny_config(base)
    if changes:  # rebuilt, so derived fields (layer_types, qwen's sliding_window) follow
        config = type(config)(**{**config.to_dict(), **changes})
    return config


@functools.cache
def build_pair(variant):
    """(HF model, our LoadedModel with the same weights, variant name)."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make_config(variant)).eval()
    randomize(hf, seed=1)
    hf.generation_config.eos_token_id = None  # greedy runs go the full length
    return hf, loader.from_hf_model(hf), variant


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request):
    return build_pair(request.param)


WINDOWED = [v for v in VARIANTS if "mistral" in v or "window" in v or v in ("qwen2-tiny", "qwen3-tiny") or "gemma2" in v]
MOE = [v for v in VARIANTS if "moe" in v or "mixtral" in v or "deepseek" in v]
MLA = [v for v in VARIANTS if "deepseek" in v]


def test_the_variants_are_what_they_claim():
    """The features under test are switched on: windows, MoE layers, renormalisation."""
    spec = {v: loader.from_config(make_config(v)).model.spec for v in VARIANTS}
    assert spec["mistral-tiny"].windows == (8, 8) and spec["mixtral-tiny"].windows == (None, None)
    assert spec["qwen3-tiny"].windows == (None, 8) and spec["qwen3-tiny"].qk_norm
    assert spec["qwen2-tiny"].windows == (None, 8) and spec["qwen2-tiny"].qkv_bias and not spec["qwen2-tiny"].o_bias
    assert spec["mixtral-tiny"].moe_layers == {0, 1} and spec["mixtral-tiny"].moe.renormalize
    assert spec["qwen3-moe-tiny"].moe_layers == {1} and spec["qwen3-moe-tiny"].moe.renormalize
    assert spec["qwen3-moe-unnormalised-window"].windows == (8, 8)
    assert not spec["qwen3-moe-unnormalised-window"].moe.renormalize
    assert spec["deepseek-v2-tiny"].attention == "mla" and spec["deepseek-v2-tiny"].moe_layers == {1}
    assert spec["deepseek-v2-tiny"].moe.shared_intermediate_size == 32
    assert spec["gemma2-tiny"].windows == (8, None) and spec["gemma2-tiny"].attn_softcap == 50.0
    assert spec["gemma2-tiny"].attn_scale == 16 ** -0.5
    grouped = spec["deepseek-v2-grouped"].moe
    assert (grouped.num_groups, grouped.topk_groups, grouped.routed_scaling) == (2, 1, 1.5)


@pytest.mark.parametrize("variant", MLA)
def test_mla_cache_is_the_latent_transformers_caches(variant):
    """DeepSeek-V2's paged cache holds, per token and layer, exactly the compressed KV and the
    RoPE'd shared key that transformers caches (kv_lora_rank + qk_rope_head_dim values, one tensor
    read as both K and V), not per-head keys and values."""
    hf, lm, _ = build_pair(variant)
    assert (lm.num_kv_heads, lm.head_dim, lm.kv_shared) == (1, 32 + 8, True)
    cache = new_cache(lm)
    assert all(k is v for k, v in cache.kv_caches)
    assert CacheEngine.pool_bytes(2, 1, 40, BS, 96, torch.float32, kv_shared=True) == 2 * 96 * BS * 40 * 4
    p = prompt(13, seed=5)
    table = Blocks(96).grow([], 13, BS)
    run(lm, cache, [(table, 0, p)], BS)
    with torch.no_grad():
        hf_cache = hf(torch.tensor([p]), use_cache=True).past_key_values
    for layer, (latent, _) in enumerate(cache.kv_caches):
        ours = torch.stack([latent[table[t // BS], t % BS, 0] for t in range(13)])
        theirs = torch.cat([hf_cache.layers[layer].keys[0, 0], hf_cache.layers[layer].values[0, 0]], dim=-1)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_prompt_logits_match_hf(pair):
    hf, lm, _ = pair
    prompts = [prompt(n, seed=n) for n in (1, 7, 13, 22)]
    blocks, cache = Blocks(96), new_cache(lm)
    logits, md = run(lm, cache, [(blocks.grow([], len(p), BS), 0, p) for p in prompts], BS)
    starts = md.query_start_loc.tolist()
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[starts[i]:starts[i + 1]], hf_logits(hf, p), atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", WINDOWED)
def test_window_changes_the_logits(variant):
    """The comparison above could not pass with the window ignored: the same weights without it
    give other logits past the window."""
    hf, lm, _ = build_pair(variant)
    assert any(lm.model.spec.windows)
    unwindowed = copy.deepcopy(hf.config)
    unwindowed.sliding_window = None
    if getattr(unwindowed, "layer_types", None):
        unwindowed.layer_types = ["full_attention"] * unwindowed.num_hidden_layers
    full = loader.from_state_dict(unwindowed, hf.state_dict())
    assert not any(full.model.spec.windows)
    p = prompt(22, seed=22)
    logits, _ = run(full, new_cache(full), [(Blocks(96).grow([], 22, BS), 0, p)], BS)
    assert (logits[-1] - hf_logits(hf, p)[-1]).abs().max() > 1e-2


@pytest.mark.parametrize("variant", list(ROPE_VARIANTS))
def test_scaled_rope_matches_hf(variant):
    hf, lm, _ = build_pair(variant)
    prompts = [prompt(n, seed=n) for n in (7, 30)]
    blocks = Blocks(96)
    logits, md = run(lm, new_cache(lm), [(blocks.grow([], len(p), BS), 0, p) for p in prompts], BS)
    starts = md.query_start_loc.tolist()
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[starts[i]:starts[i + 1]], hf_logits(hf, p), atol=1e-4, rtol=0)
    plain = copy.deepcopy(hf.config)
    plain.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    default = loader.from_state_dict(plain, hf.state_dict())
    other, _ = run(default, new_cache(default), [(Blocks(96).grow([], 30, BS), 0, prompts[1])], BS)
    assert (other[-1] - logits[-1]).abs().max() > 1e-2  # the scaling mattered


def test_softcaps_change_the_logits():
    """gemma2-capped's comparison could not pass with the caps ignored."""
    hf, lm, _ = build_pair("gemma2-capped")
    uncapped = copy.deepcopy(hf.config)
    uncapped.attn_logit_softcapping = uncapped.final_logit_softcapping = None
    plain = loader.from_state_dict(uncapped, hf.state_dict())
    assert plain.model.spec.attn_softcap is None and not plain.model.final_softcap
    p = prompt(22, seed=22)
    logits, _ = run(plain, new_cache(plain), [(Blocks(96).grow([], 22, BS), 0, p)], BS)
    assert (logits - hf_logits(hf, p)).abs().max() > 1e-1


def free_outside_window(cache, table, num_tokens, window):
    """What a sliding-window KV manager does once every layer's window has moved past a block:
    the block goes back to the pool (here: poisoned with NaN) and its entry becomes NULL_BLOCK.
    The next query sits at position num_tokens - 1 and sees from num_tokens - window on."""
    for b in range(max(0, num_tokens - window) // BS):
        if table[b] != NULL_BLOCK:
            for k, v in cache.kv_caches:
                k[table[b]], v[table[b]] = float("nan"), float("nan")
            table[b] = NULL_BLOCK


def test_decode_logits_match_hf_step_by_step(pair):
    """Three sequences decode together (decode-only steps through the paged decode kernel); each
    step's logits equal transformers' on the whole sequence. Where every layer has a window,
    blocks that leave it are freed as the sequences grow, and nothing reads them."""
    hf, lm, _ = pair
    windows = lm.model.spec.windows
    can_free = all(windows)
    prompts = [prompt(5, 11), prompt(12, 12), prompt(9, 13)]
    blocks, cache = Blocks(96), new_cache(lm)
    seqs = [{"tokens": list(p), "done": 0, "table": []} for p in prompts]
    freed = 0
    for step in range(10):
        batch = [(blocks.grow(s["table"], len(s["tokens"]), BS), s["done"], s["tokens"][s["done"]:]) for s in seqs]
        logits, md = run(lm, cache, batch, BS)
        assert md.decode_only == (step > 0)
        for s, row in zip(seqs, md.last_token_indices().tolist()):
            torch.testing.assert_close(logits[row], hf_logits(hf, s["tokens"])[-1], atol=1e-4, rtol=0)
            s["done"] = len(s["tokens"])
            s["tokens"].append(int(logits[row].argmax()))
            if can_free:
                free_outside_window(cache, s["table"], len(s["tokens"]), min(windows))
                freed += s["table"].count(NULL_BLOCK)
    assert freed > 0 or not can_free


def test_engine_greedy_equals_hf_generate(pair):
    """The whole executor: scheduler, paged KV manager, batching of mixed lengths."""
    hf, lm, _ = pair
    prompts = [prompt(n, seed=100 + n) for n in (3, 9, 14, 6)]
    engine = LLMEngine(lm, EngineConfig(block_size=BS, num_gpu_blocks=64, max_num_seqs=4))
    ours = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    for p, result in zip(prompts, ours):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p):].tolist()
        assert result.outputs[0] == want


def test_safetensors_checkpoint_round_trip(pair, tmp_path):
    """save_pretrained writes the checkpoint layout (one tensor per expert and projection, and
    Mixtral's block_sparse_moe names); loading it gives the same model as the in-memory weights."""
    hf, lm, variant = pair
    hf.save_pretrained(tmp_path)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as f:
        names = list(f.keys())
    if lm.model.spec.moe is not None:
        assert any(".experts.0." in n for n in names) and not any("gate_up_proj" in n for n in names)
    loaded = loader.load_model(str(tmp_path))
    p = prompt(20, 51)
    want, _ = run(lm, new_cache(lm), [(list(range(5)), 0, p)], BS)
    got, _ = run(loaded, new_cache(loaded), [(list(range(5)), 0, p)], BS)
    torch.testing.assert_close(got, want, atol=0, rtol=0)


@pytest.mark.parametrize("variant", MOE)
def test_missing_expert_tensor_is_named(variant):
    hf, lm, _ = build_pair(variant)
    assert lm.model.spec.moe is not None
    state = {k: v for k, v in hf.state_dict().items() if "layers.1.mlp.experts.down_proj" not in k}
    with pytest.raises(loader.ModelLoadError, match=r"unset: \['model.layers.1.mlp.experts.down_proj'\]"):
        loader.from_state_dict(hf.config, state)


# ---------------------------------------------------------------- random:NAME and bad configs


@pytest.mark.parametrize("name", list(loader.TINY_CONFIGS))
def test_random_tiny_names(name):
    a, b = loader.load_model(f"random:{name}", seed=3), loader.load_model(f"random:{name}", seed=3)
    assert a.config.model_type == name.removesuffix("-tiny").replace("-", "_")
    for (na, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), na
    experts = [p for n, p in a.model.named_parameters() if "experts" in n]
    assert all(p.std() > 0.01 for p in experts)  # filled, not left empty
    assert (a.num_layers, a.num_kv_heads, a.head_dim) == ((2, 1, 40) if a.kv_shared else (2, 2, 16))
    assert a.name == type(AutoModelForCausalLM.from_config(a.config)).__name__  # what reports call it


def write_config(tmp_path, base, **changes):
    fields = {**loader.tiny_config(base).to_dict(), **changes}
    for name, value in changes.items():
        if value is None:
            fields.pop(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(fields))
    return path


@pytest.mark.parametrize("base,changes,message", [
    ("mixtral-tiny", {"num_local_experts": None}, "field 'num_local_experts' is missing"),
    ("mixtral-tiny", {"num_experts_per_tok": 9}, "field 'num_experts_per_tok' is 9, more than the 4 experts"),
    ("qwen3-moe-tiny", {"num_local_experts": None}, "field 'num_experts' is missing"),  # how transformers stores it
    ("qwen3-moe-tiny", {"moe_intermediate_size": 0}, "field 'moe_intermediate_size' must be a positive integer"),
    ("mistral-tiny", {"sliding_window": 512}, "field 'sliding_window' is 512, larger than max_position_embeddings 256"),
    ("mistral-tiny", {"sliding_window": -4}, "field 'sliding_window' must be a positive integer, got -4"),
    ("qwen3-tiny", {"layer_types": ["full_attention"]}, "must be equal to the number of `layer_types` (1)"),
    ("qwen3-tiny", {"layer_types": ["full_attention", "chunked_attention"]}, "field 'layer_types': unsupported ['chunked_attention']"),
    ("llama-tiny", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}},
     "field 'rope_parameters': rope_type 'dynamic' is not supported"),
])
def test_malformed_configs_are_one_line_naming_the_field(tmp_path, base, changes, message):
    path = write_config(tmp_path, base, **changes)
    with pytest.raises(loader.ModelLoadError) as err:
        loader.load_model(f"random:{path}")
    text = str(err.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text



def test_pagesim_run_names_the_field_in_one_line(tmp_path):
    from tests.executor.test_run_inputs import ALPACA, one_error
    from tests.executor.test_run_inputs import run as pagesim_run

    path = write_config(tmp_path, "mixtral-tiny", num_local_experts=None)
    line = one_error(pagesim_run([ALPACA, "--model", f"random:{path}"]))
    assert line == f"error: --model random:{path}: {path}: field 'num_local_experts' is missing (model_type 'mixtral' needs it)"


@pytest.mark.parametrize("variant", ["mistral-tiny", "qwen3-tiny", "deepseek-v2-tiny"])
def test_triton_kernels_run_the_models(variant, monkeypatch):
    """The Triton kernels (interpreted) behind the model: windowed prefill and decode, and MLA's
    multi-query attention of head size 40 over the latent cache, equal to transformers."""
    monkeypatch.setenv("PAGESIM_KERNELS", "triton")
    assert kernels.backend("cpu") == "triton"
    hf, lm, _ = build_pair(variant)
    prompts = [prompt(13, seed=1), prompt(6, seed=2)]
    blocks, cache = Blocks(96), new_cache(lm)
    seqs = [{"tokens": list(p), "done": 0, "table": []} for p in prompts]
    for step in range(3):
        batch = [(blocks.grow(s["table"], len(s["tokens"]), BS), s["done"], s["tokens"][s["done"]:]) for s in seqs]
        logits, md = run(lm, cache, batch, BS)
        assert md.decode_only == (step > 0)
        for s, row in zip(seqs, md.last_token_indices().tolist()):
            torch.testing.assert_close(logits[row], hf_logits(hf, s["tokens"])[-1], atol=1e-4, rtol=0)
            s["done"] = len(s["tokens"])
            s["tokens"].append(int(logits[row].argmax()))


def test_latent_cache_swaps_and_copies_once():
    """MLA's one tensor per layer: swap out, in and copy-on-write move it (K and V are the same)."""
    ce = CacheEngine(2, 1, 40, BS, num_gpu_blocks=6, num_cpu_blocks=4, dtype=torch.float32, device="cpu", kv_shared=True)
    for k, _ in ce.kv_caches:
        k.copy_(torch.randn(k.shape))
    before = [k.clone() for k, _ in ce.kv_caches]
    ce.swap_out({1: 0})
    for k, _ in ce.kv_caches:
        k[1].zero_()
    ce.swap_in([(0, 2)])
    ce.copy([(2, 5)])
    for (k, v), k0 in zip(ce.kv_caches, before):
        assert k is v and torch.equal(k[2], k0[1]) and torch.equal(k[5], k0[1]) and torch.equal(k[3], k0[3])
    assert CacheEngine.bytes_per_block(2, 1, 40, BS, torch.float16, kv_shared=True) == 2 * BS * 40 * 2


@pytest.mark.parametrize("variant", ["mistral-tiny", "qwen3-moe-tiny", "deepseek-v2-tiny"])
@pytest.mark.parametrize("preemption", ["swap", "recompute"])
def test_engine_under_preemption_equals_hf(variant, preemption):
    """A pool too small for every sequence at once: the core preempts (swapping blocks out and in
    through the cache engine, MLA's one latent tensor included, or recomputing) and each output
    is still transformers' greedy continuation; chunked prefill splits the longer prompts."""
    hf, lm, _ = build_pair(variant)
    prompts = [prompt(n, seed=200 + n) for n in (11, 6, 14, 9)]
    # Mistral's window of 8 runs on the hybrid KV manager, which frees the blocks behind it: a
    # sequence holds at most 5 blocks (3 while decoding), so 14 would hold all four at once
    num_blocks = 8 if variant == "mistral-tiny" else 14
    config = EngineConfig(block_size=BS, num_gpu_blocks=num_blocks, num_cpu_blocks=32, max_num_seqs=4,
                          preemption=preemption, chunked_prefill=True, max_num_batched_tokens=8)
    engine = LLMEngine(lm, config)
    swaps = []
    swap_out = engine.cache.swap_out
    engine.cache.swap_out = lambda mapping: (swaps.append(len(mapping)), swap_out(mapping))
    ours = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    assert sum(r.group.num_preemptions for r in ours) > 0
    assert (sum(swaps) > 0) == (preemption == "swap")
    for p, result in zip(prompts, ours):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=10, do_sample=False)[0, len(p):].tolist()
        assert result.outputs[0] == want
