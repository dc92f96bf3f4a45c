"""The block-size term of paged decode attention (pagesim/sim/cost/paged_blocks.py) against hand
arithmetic and a brute-force walk over block tables, and where it applies."""

from __future__ import annotations

import math

import pytest

from pagesim.models import MODELS
from pagesim.sim.cost.base import BatchShape, CostModel
from pagesim.sim.cost.paged_blocks import PAPER_BLOCK_TERM, PagedBlockTerm, block_term
from pagesim.sim.cost.registry import make_cost_model
from pagesim.sim.specs import get_gpu

K = 16 * 0.23  # slot-reads per block: the paper's Fig. 18(a) 23 % overhead at block 16 (band 20-26 %)


def test_the_fit_reproduces_the_papers_block_16_overhead():
    # at block 16, contexts that fill whole blocks (the paper's 64-256): paged / contiguous = 1 + k / 16
    assert PAPER_BLOCK_TERM.gather_slots_per_block == pytest.approx(3.68)
    assert 1.20 <= 1 + PAPER_BLOCK_TERM.gather_slots_per_block / 16 <= 1.26


@pytest.mark.parametrize("block, factor, partial", [
    (1, 4.68 / 1.23, -7.5),                                 # no partial block at all; 4.68 slot-reads per token
    (8, 1.46 / 1.23, (1.46 / 1.23 * 7 - 15) / 2),
    (16, 1.0, 0.0),                                         # the reference: nothing changes
    (32, 1.115 / 1.23, (1.115 / 1.23 * 31 - 15) / 2),       # = 6.5508...
    (256, 1.014375 / 1.23, (1.014375 / 1.23 * 255 - 15) / 2),  # = 97.65...
])
def test_slot_factor_and_partial_block_by_hand(block, factor, partial):
    term = PagedBlockTerm()
    assert term.slot_factor(block) == pytest.approx(factor, rel=1e-12)
    assert term.partial_block_slots(block) == pytest.approx(partial, rel=1e-12, abs=1e-12)


def brute_force_slot_reads(lengths: list[int], block: int, k: float = K) -> float:
    """Slot reads one layer's kernel does for these sequences, walking each block table: every slot
    of every block visited (the last block's empty ones too), plus k per block gathered."""
    total = 0.0
    for length in lengths:
        blocks = math.ceil(length / block)
        total += blocks * block + k * blocks
    return total


@pytest.mark.parametrize("cost_model", ["calibrated", "roofline"])
@pytest.mark.parametrize("block", [1, 2, 8, 32, 64, 256])
def test_decode_attention_change_equals_a_walk_over_block_tables(cost_model, block):
    """Over lengths spread evenly across every residue of both block sizes, the model's decode
    attention at `block` less that at 16 is the brute-force slot-read difference times one slot's
    contiguous cost (the model's block-16 per-token cost / (1 + k/16))."""
    m = make_cost_model(cost_model, "opt-13b", "a100-80gb")
    period = max(block, 16)
    lengths = list(range(300, 300 + 4 * period))  # every residue mod block and mod 16, equally often
    n, ctx = len(lengths), sum(lengths)
    attention = lambda b: m.iteration_time(BatchShape(num_decode_seqs=n, decode_context_tokens=ctx, block_size=b))  # noqa: E731
    per_token_16 = m.decode_terms(16)[1]
    slot = per_token_16 / (1 + K / 16)
    expected = slot * (brute_force_slot_reads(lengths, block) - brute_force_slot_reads(lengths, 16))
    assert attention(block) - attention(16) == pytest.approx(expected, rel=1e-9)


def test_small_blocks_cost_more_and_large_blocks_read_empty_slots():
    m = make_cost_model("calibrated", "opt-13b", "a100-40gb")
    step = lambda b, ctx: m.iteration_time(BatchShape(num_decode_seqs=32, decode_context_tokens=32 * ctx,  # noqa: E731
                                                      block_size=b))
    times = {b: step(b, 300) for b in (1, 2, 4, 8, 16, 32, 64, 128, 256)}
    assert times[1] > times[2] > times[4] > times[8] > times[16] > times[32]  # the gather dominates
    assert times[256] > times[128] > times[64]  # the partial last block dominates
    # short contexts: the partial last block weighs more, so the cheapest block is smaller
    short = {b: step(b, 40) for b in (16, 32, 64, 128)}
    assert short[16] < short[64] < short[128]
    # a one-token context per sequence stays positive at every block size
    assert all(m.iteration_time(BatchShape(num_decode_seqs=8, decode_context_tokens=8, block_size=b)) > 0
               for b in (1, 16, 256))


@pytest.mark.parametrize("cost_model", ["calibrated", "roofline"])
def test_not_applied_where_the_source_does_not_apply(cost_model):
    # H100 (no kernel measurement by block size): block size does not enter the step time
    m = make_cost_model(cost_model, "llama-2-7b", "h100-80gb")
    shape = lambda b: BatchShape(num_decode_seqs=16, decode_context_tokens=16 * 500, block_size=b)  # noqa: E731
    assert len({m.iteration_time(shape(b)) for b in (1, 8, 16, 256)}) == 1
    assert block_term(get_gpu("h100-80gb")) is None and block_term(get_gpu("a100-40gb")) is PAPER_BLOCK_TERM


def test_engine_profiles_do_not_take_the_term():
    # vLLM 0.15's attention backends are not the paper's kernel: the A100 engine model ignores block size
    m = make_cost_model("calibrated", "llama-2-7b", "a100-80gb", engine="vllm-0.15")
    shape = lambda b: BatchShape(num_decode_seqs=16, decode_context_tokens=16 * 500, block_size=b)  # noqa: E731
    assert len({m.iteration_time(shape(b)) for b in (1, 8, 16, 256)}) == 1


def test_block_16_is_the_measured_model():
    m = make_cost_model("calibrated", "opt-13b", "a100-80gb")
    assert m.decode_terms(16) == (m._dec_per_seq, m._dec_per_ctx, m._dec_per_window_ctx)


@pytest.mark.parametrize("cost_model", ["calibrated", "roofline"])
@pytest.mark.parametrize("model", ["opt-13b", "gemma-2-9b"])  # gemma: sliding-window layers
@pytest.mark.parametrize("block", [1, 8, 16, 128])
def test_decode_runs_equal_single_steps_at_every_block(cost_model, model, block):
    m = make_cost_model(cost_model, MODELS[model], "a100-80gb")
    runs = m.decode_run_durations(8, 8 * 3000, 200, block)  # crosses Gemma's 4096-token window
    assert runs == CostModel.decode_run_durations(m, 8, 8 * 3000, 200, block)


def test_where_block_size_is_said_to_be_modelled():
    from pagesim.sim.cost.paged_blocks import not_modelled_reason

    assert not_modelled_reason("a100-80gb") is None  # calibrated, paper-era engine
    assert not_modelled_reason("a100-40gb", "roofline") is None
    assert "engine profile vllm-0.19" in not_modelled_reason("a100-80gb", "calibrated", "vllm-0.19")
    assert "A100" in not_modelled_reason("h100-80gb")
    assert "profiled cost model" in not_modelled_reason("a100-80gb", "profiled")


def test_plan_notes_split_gpus_by_whether_block_size_is_priced():
    from types import SimpleNamespace

    from pagesim.plan.report_trust import block_size_notes

    point = lambda gpu: SimpleNamespace(point=SimpleNamespace(gpu=gpu))  # noqa: E731
    plan = SimpleNamespace(results=[point("a100-80gb"), point("h200-141gb"), point("a100-40gb")],
                           settings=SimpleNamespace(cost_model="roofline"))
    priced, unpriced = block_size_notes(plan)
    assert priced.startswith("block size on a100-40gb, a100-80gb: decode attention pays a gather per block (3.68")
    assert unpriced.startswith("block size is not modelled in the step time on h200-141gb (the one kernel")
