"""Per-iteration cost models: hand-computed roofline values, monotonicity, sanity targets, speed."""

import dataclasses
import math
import random

import pytest

from pagesim.sim.cost import (
    BatchShape, ConstantCostModel, CostModel, make_cost_model, prefill_attn_pairs, register_cost_model, COST_MODELS,
)
from pagesim.sim.cost.roofline import RooflineConstants, RooflineCostModel
from pagesim.sim.specs import GPUSpec, ModelSpec, get_gpu

# A model small enough to do the arithmetic by hand:
# linear params per layer = 4 h^2 + 2 h f = 64 + 64 = 128, two layers -> 256;
# LM head = vocab * h = 40; KV per token = 2 * 2 layers * 2 heads * 2 dim * 2 B = 32 B;
# attention FLOPs per (query, key) pair = 4 * q_size 4 * 2 layers = 32.
TINY = ModelSpec("tiny", num_layers=2, hidden_size=4, num_heads=2, num_kv_heads=2, head_dim=2,
                 ffn_size=8, vocab_size=10, num_params=400, max_model_len=16, dtype_bytes=2)
TINY_GPU = GPUSpec("toy", memory_bytes=10**6, hbm_bandwidth=1000.0, fp16_flops=2000.0,
                   interconnect_bandwidth=100.0, pcie_bandwidth=10.0)
IDEAL = RooflineConstants(
    matmul_efficiency=1.0, hbm_efficiency=1.0, attention_compute_efficiency=1.0,
    kv_read_efficiency=1.0, elementwise_hidden_passes=0, elementwise_ffn_passes=0,
    interconnect_efficiency=1.0, allreduce_latency_s=0.01, step_overhead_s=1.0,
    per_seq_overhead_s=0.1, swap_copy_latency_s=0.5, pcie_efficiency=1.0,
    copy_kernel_latency_s=0.25)


def tiny(tp=1, **overrides):
    return RooflineCostModel(TINY, TINY_GPU, tp, dataclasses.replace(IDEAL, **overrides))


def test_tiny_shapes():
    assert TINY.linear_params == 256
    assert TINY.lm_head_params == 40
    assert TINY.kv_bytes_per_token == 32
    assert TINY.attention_flops_per_pair == 32


def test_hand_computed_decode():
    # overhead 1 + 0.1; linear max(2*256/2000, 256*2/1000) = 0.512 (weights);
    # LM head max(80/2000, 80/1000) = 0.08; decode attention 5 tokens * 32 B / 1000 = 0.16
    # (FLOPs 5 * 32 / 2000 = 0.08 lose).
    t = tiny().iteration_time(BatchShape(num_decode_seqs=1, decode_context_tokens=5))
    assert t == pytest.approx(1.1 + 0.512 + 0.08 + 0.16)


def test_hand_computed_prefill():
    # 10 tokens: linear compute 2*256*10/2000 = 2.56 beats the 0.512 weight read;
    # attention: 55 pairs * 32 / 2000 = 0.88 beats KV write+read 10 * 2 * 32 / 1000 = 0.64.
    shape = BatchShape(num_prefill_tokens=10, num_prefill_seqs=1,
                       prefill_attn_pairs=prefill_attn_pairs(10))
    assert shape.prefill_attn_pairs == 55
    assert tiny().iteration_time(shape) == pytest.approx(1.1 + 2.56 + 0.08 + 0.88)


def test_hand_computed_elementwise():
    # per token: 2 layers * 2 B * (8 passes * h 4 + 2 passes * f 8) = 192 B -> 0.192 s at 1000 B/s.
    m = tiny(elementwise_hidden_passes=8, elementwise_ffn_passes=2)
    assert m.breakdown(BatchShape(num_decode_seqs=3, decode_context_tokens=3))["elementwise"] \
        == pytest.approx(3 * 0.192)


def test_hand_computed_allreduce_and_tp1_zero():
    shape = BatchShape(num_prefill_tokens=10, num_prefill_seqs=1, prefill_attn_pairs=55)
    assert tiny(tp=1).breakdown(shape)["allreduce"] == 0.0
    # tp=2: 2 per layer * 2 layers * ring 2*(1)/2 * 10 tokens * 4 hidden * 2 B / 100 B/s = 3.2,
    # plus 4 all-reduces * 0.01 s latency.
    assert tiny(tp=2).breakdown(shape)["allreduce"] == pytest.approx(3.24)


def test_hand_computed_swap_and_copy():
    # 3 blocks of 4 tokens: each block is 2 layers * K,V = 4 copies of 4 tokens * 8 B = 32 B,
    # each copy 0.5 + 32/10 = 3.7 s -> 3 * 4 * 3.7.
    m = tiny()
    parts = m.breakdown(BatchShape(num_swap_blocks=3, num_copy_blocks=2, block_size=4))
    assert parts["swap"] == pytest.approx(3 * 4 * 3.7)
    # CoW: 2 blocks * 4 tokens * 32 B * (read + write) / 1000 + one launch 0.25.
    assert parts["copy"] == pytest.approx(0.25 + 2 * 4 * 32 * 2 / 1000)


def _random_shape(rng: random.Random) -> BatchShape:
    n_pre = rng.randint(0, 4)
    new = [rng.randint(1, 600) for _ in range(n_pre)]
    ctx = [rng.randint(0, 400) for _ in range(n_pre)]
    n_dec = rng.randint(0, 200)
    return BatchShape(
        num_prefill_tokens=sum(new), num_prefill_seqs=n_pre,
        prefill_attn_pairs=sum(prefill_attn_pairs(n, c) for n, c in zip(new, ctx)),
        num_decode_seqs=n_dec, decode_context_tokens=sum(rng.randint(1, 2048) for _ in range(n_dec)),
        num_swap_blocks=rng.choice([0, 0, rng.randint(1, 100)]),
        num_copy_blocks=rng.choice([0, 0, rng.randint(1, 20)]),
        block_size=rng.choice([8, 16, 32]))


@pytest.mark.parametrize("model,gpu,tp", [("opt-13b", "a100-40gb", 1), ("opt-175b", "a100-80gb", 8),
                                          ("qwen2.5-72b", "h200", 4)])
def test_breakdown_matches_fast_path(model, gpu, tp):
    m = RooflineCostModel(model, gpu, tp)
    rng = random.Random(0)
    for _ in range(500):
        s = _random_shape(rng)
        assert math.isclose(m.iteration_time(s), sum(m.breakdown(s).values()), rel_tol=1e-12)


def test_more_work_never_cheaper():
    m = RooflineCostModel("opt-13b", "a100-40gb", 1)
    rng = random.Random(1)
    fields = ["num_prefill_tokens", "num_prefill_seqs", "prefill_attn_pairs", "num_decode_seqs",
              "decode_context_tokens", "num_swap_blocks", "num_copy_blocks"]
    for _ in range(300):
        s = _random_shape(rng)
        for f in fields:
            bigger = dataclasses.replace(s, **{f: getattr(s, f) + rng.randint(1, 500)})
            assert m.iteration_time(bigger) >= m.iteration_time(s), f


def test_faster_hardware_never_slower():
    base = get_gpu("a100-40gb")
    m0 = RooflineCostModel("opt-66b", base, 4)
    faster = [dataclasses.replace(base, **{f: getattr(base, f) * 2})
              for f in ("hbm_bandwidth", "fp16_flops", "interconnect_bandwidth", "pcie_bandwidth")]
    rng = random.Random(2)
    shapes = [_random_shape(rng) for _ in range(300)]
    for g in faster:
        m1 = RooflineCostModel("opt-66b", g, 4)
        for s in shapes:
            assert m1.iteration_time(s) <= m0.iteration_time(s)
    # And the catalog's newer parts are faster on the same step.
    s = BatchShape(num_decode_seqs=32, decode_context_tokens=32 * 300)
    times = [RooflineCostModel("opt-13b", g).iteration_time(s)
             for g in ("a100-40gb", "a100-80gb", "h100-80gb", "h200-141gb")]
    assert times == sorted(times, reverse=True)


def test_sanity_targets_opt13b_a100():
    m = RooflineCostModel("opt-13b", "a100-40gb")
    b1 = m.iteration_time(BatchShape(num_decode_seqs=1, decode_context_tokens=500))
    b32 = m.iteration_time(BatchShape(num_decode_seqs=32, decode_context_tokens=32 * 500))
    pre = m.iteration_time(BatchShape(num_prefill_tokens=2048, num_prefill_seqs=1,
                                      prefill_attn_pairs=prefill_attn_pairs(2048)))
    print(f"\nOPT-13B / A100-40GB: decode b=1 {b1 * 1e3:.1f} ms, decode b=32 ctx 500 "
          f"{b32 * 1e3:.1f} ms, prefill 2048 {pre * 1e3:.1f} ms")
    assert 0.020 <= b1 <= 0.030
    # 32 x 500 tokens of KV is 13 GB: at least 8.4 ms more at the 1.555 TB/s peak.
    assert b1 + 0.0084 <= b32 <= b1 + 0.020
    assert 0.150 <= pre <= 0.250


def test_swap_per_byte_worse_for_small_blocks():
    # Paper Fig. 19a: many small PCIe copies make swapping slow at small block sizes.
    m = RooflineCostModel("opt-13b", "a100-40gb")
    per_byte = [m.swap_seconds_per_byte(bs) for bs in (1, 2, 4, 8, 16, 32, 64, 128, 256)]
    assert per_byte == sorted(per_byte, reverse=True)
    assert per_byte[0] > 3 * per_byte[-1]
    # Large blocks approach the effective PCIe bandwidth (32 GB/s * 0.8).
    assert 1 / per_byte[-1] == pytest.approx(25.6e9, rel=0.1)


def test_registry():
    r = make_cost_model("roofline", "opt-13b", "a100-40gb", 1)
    assert isinstance(r, CostModel) and r.name == "roofline"
    c = make_cost_model("constant", "opt-13b", "a100-40gb", 1, seconds=0.5)
    assert isinstance(c, ConstantCostModel) and c.iteration_time(BatchShape()) == 0.5
    slow = make_cost_model("roofline", "opt-13b", "a100-40gb", 1, hbm_efficiency=0.5)
    s = BatchShape(num_decode_seqs=1, decode_context_tokens=10)
    assert slow.iteration_time(s) > r.iteration_time(s)
    with pytest.raises(ValueError, match="x.json: no such profile file"):  # ProfileError names the file
        make_cost_model("profiled", "opt-13b", "a100-40gb", 1, profile_path="x.json")
    with pytest.raises(ValueError, match="needs a profile file"):
        make_cost_model("profiled", "opt-13b", "a100-40gb", 1)
    with pytest.raises(ValueError, match="roofline"):
        make_cost_model("magic", "opt-13b", "a100-40gb", 1)
    assert r.describe()["matmul_efficiency"] == RooflineConstants().matmul_efficiency


def test_register_custom_cost_model():
    class Fixed(CostModel):
        name = "fixed"

        def iteration_time(self, shape):
            return 1.0 + shape.num_tokens

    register_cost_model("fixed-test", lambda model, gpu, tp, profile_path=None: Fixed())
    try:
        m = make_cost_model("fixed-test", "opt-125m", "h200", 1)
        assert m.iteration_time(BatchShape(num_decode_seqs=2)) == 3.0
    finally:
        COST_MODELS.pop("fixed-test")


def test_decode_run_times_are_iteration_times_to_the_bit():
    """The simulator's runs time their steps with decode_run_times; any difference in the last
    bit would make a fast replay differ from a step-by-step one."""
    import itertools


    for model in (RooflineCostModel("opt-13b", "a100-40gb"), RooflineCostModel("opt-66b", "a100-40gb", tp=4),
                  ConstantCostModel(0.013)):
        for num_seqs, context in [(1, 7), (23, 4111), (256, 130_000)]:
            got = list(itertools.islice(model.decode_run_times(num_seqs, context, 16), 50))
            want = [model.iteration_time(BatchShape(num_decode_seqs=num_seqs, decode_context_tokens=context + j * num_seqs,
                                                    block_size=16)) for j in range(50)]
            assert got == want
