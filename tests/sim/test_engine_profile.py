"""Engine profiles: CUDA-graph padding, the graph/eager split of launch floors, custom all-reduce and
exposed CPU time, each against step times written out by hand for three batch shapes; profile
files and their errors; the profiles' effect on a replay (host time, async output)."""

import json

import pytest

from pagesim.sim.cost import BatchShape, make_cost_model
from pagesim.sim.cost.calibrated import CalibratedCostModel
from pagesim.sim.cost.calibration import AttentionTerms, Calibration, CpuTerms, GemmCurve, Line
from pagesim.sim.cost.engine import (
    EngineCostModel, EngineParams, EngineProfile, EngineProfileError, load_engine_profile,
)
from pagesim.sim.specs import GPUSpec, ModelSpec

# A one-layer model with round shapes: hidden 8, 2 heads of 4 (MHA), ffn 16, vocab 32, llama-shaped.
MODEL = ModelSpec("toy", 1, 8, 2, 2, 4, 16, 32, 1000, 512, architecture="llama")
GPU = GPUSpec("toy-gpu", 80 * 2**30, 1e12, 1e14, 1e9, 1e9)  # interconnect 1 GB/s per direction
# Calibration terms chosen so that a step can be summed by hand: GEMMs cost floor + bytes only
# (p = 1, no FLOP term), elementwise kernels their floors only, attention floor + per sequence.
G_FLOOR, G_BYTE = 4e-6, 1e-12
E_FLOOR = 1e-6
A_DEC_FLOOR, A_PER_SEQ, A_PRE_FLOOR = 10e-6, 2e-6, 20e-6
CAL = Calibration(
    gpu="toy-gpu", gemm=GemmCurve(G_FLOOR, G_BYTE, 0.0, 1.0, 1),
    elementwise={k: Line(E_FLOOR, 0.0) for k in ("norm", "rope", "act", "add", "emb")},
    attention=AttentionTerms(A_DEC_FLOOR, A_PER_SEQ, 0.0, A_PRE_FLOOR, 0.0, 0.0),
    all_reduce={2: Line(50e-6, 0.0)}, cpu=CpuTerms(1e-3, 1e-5, 0.0))
PARAMS = EngineParams(gpu_time_scale=0.5, attention_time_scale=0.8, graph_kernel_s=3e-6, allreduce_latency_s=7e-6, cpu_step_s=2e-4,
                      cpu_per_seq_s=1e-6, request_host_s=0.01)
PROFILE = EngineProfile("test", cuda_graphs=True, params=PARAMS, custom_allreduce_max_bytes=1024)


def gemm_bytes(m: int, tp: int) -> int:
    """Weights and activations (fp16) of the four layer GEMMs and of nothing else, at M = m rows on
    one of tp GPUs: qkv 8 -> 24/tp, o 8/tp -> 8, gate+up 8 -> 32/tp, down 16/tp -> 8."""
    dims = [(8, 24 // tp), (8 // tp, 8), (8, 32 // tp), (16 // tp, 8)]
    return sum(2 * (k * n + m * (k + n)) for k, n in dims)


def lm_bytes(seqs: int, tp: int) -> int:
    return 2 * (8 * (32 // tp) + seqs * (8 + 32 // tp))


def model(tp=1, max_num_seqs=8):
    return EngineCostModel(MODEL, GPU, tp, PROFILE, CAL, max_num_seqs=max_num_seqs)


def test_capture_sizes_are_vllm_defaults():
    p = EngineProfile("x")
    assert p.capture_sizes(8) == [1, 2, 4, 8, 16]
    sizes = p.capture_sizes(128)
    assert sizes[:5] == [1, 2, 4, 8, 16] and sizes[-3:] == [240, 248, 256] and len(sizes) == 3 + 31 + 1
    assert p.capture_sizes(1024)[-1] == 512 and 272 in p.capture_sizes(1024)  # steps of 16 past 256


def test_decode_step_runs_a_full_graph_padded_to_the_next_size():
    # 3 decode sequences -> graph of 4 rows; every kernel (4 GEMMs, 6 elementwise incl. the second
    # residual add, emb, attention) pays the graph kernel time; only the LM head (3 rows) stays eager.
    shape = BatchShape(num_decode_seqs=3, decode_context_tokens=30)
    busy = 0.5 * (gemm_bytes(4, 1) * G_BYTE + lm_bytes(3, 1) * G_BYTE) + 0.8 * 3 * A_PER_SEQ
    graphed = (4 + 6 + 1 + 1) * 3e-6
    eager = G_FLOOR  # the LM head's floor
    cpu = 2e-4 + 3 * 1e-6
    assert model().padded(shape) == (4, "full")
    assert model().iteration_time(shape) == pytest.approx(busy + graphed + eager + cpu, rel=1e-12)


def test_mixed_step_is_piecewise_with_eager_attention_and_custom_all_reduce():
    # 9 prefill tokens + 2 decodes = 11 tokens -> piecewise graph of 16 rows at TP 2. Attention is
    # eager (the prefill floor, once: one varlen kernel per layer), the all-reduces custom (16 rows x
    # 8 x 2 B = 256 B <= 1024): 2 per layer at 7 us + 256 B x 2 (2-1)/2 / 1 GB/s.
    shape = BatchShape(num_prefill_tokens=9, num_prefill_seqs=1, prefill_attn_pairs=45, num_decode_seqs=2,
                       decode_context_tokens=20)
    m = model(tp=2)
    busy = 0.5 * (gemm_bytes(16, 2) * G_BYTE + lm_bytes(3, 2) * G_BYTE) + 0.8 * 2 * A_PER_SEQ
    graphed = (4 + 6 + 1) * 3e-6
    eager = G_FLOOR + A_PRE_FLOOR
    all_reduce = 2 * (7e-6 + 256 * 1.0 / 1e9)
    cpu = 2e-4 + 3 * 1e-6
    assert m.padded(shape) == (16, "piecewise")
    assert m.iteration_time(shape) == pytest.approx(busy + graphed + eager + all_reduce + cpu, rel=1e-12)


def test_large_prefill_runs_eagerly_with_measured_floors_and_nccl():
    # 100 tokens > the largest graph (16 for max_num_seqs 8): eager, every measured floor; 1600 B of
    # all-reduce > 1024: NCCL's measured line (50 us) for each of the 2.
    shape = BatchShape(num_prefill_tokens=100, num_prefill_seqs=2, prefill_attn_pairs=2600)
    m = model(tp=2)
    busy = 0.5 * (gemm_bytes(100, 2) * G_BYTE + lm_bytes(2, 2) * G_BYTE)
    eager = 4 * G_FLOOR + 6 * E_FLOOR + E_FLOOR + G_FLOOR + A_PRE_FLOOR
    assert m.padded(shape) == (100, "eager")
    assert m.iteration_time(shape) == pytest.approx(busy + eager + 2 * 50e-6 + 2e-4 + 2 * 1e-6, rel=1e-12)


def test_decode_runs_give_the_same_floats_as_single_steps():
    m = EngineCostModel("llama-2-7b", "h100-80gb", 1, "vllm-0.15", max_num_seqs=128)
    run = m.decode_run_durations(37, 9000, 20)
    assert run == [m.iteration_time(BatchShape(num_decode_seqs=37, decode_context_tokens=9000 + 37 * k))
                   for k in range(20)]


def test_decode_runs_keep_their_base_per_batch_and_block_size():
    # plain_decode_base keeps each run's base: asked again, in any order, the floats stay iteration_time's
    m = EngineCostModel("llama-2-7b", "h100-80gb", 1, "vllm-0.19", max_num_seqs=256)
    for _ in range(2):
        for num_seqs, block_size in ((37, 16), (5, 16), (37, 32), (256, 8), (1, 16)):
            run = m.decode_run_durations(num_seqs, 9000, 5, block_size)
            assert run == [m.iteration_time(BatchShape(num_decode_seqs=num_seqs, block_size=block_size,
                                                       decode_context_tokens=9000 + num_seqs * k)) for k in range(5)]


def test_features_reproduce_the_step_time():
    m = model(tp=2)
    for shape in (BatchShape(num_decode_seqs=3, decode_context_tokens=30),
                  BatchShape(num_prefill_tokens=100, num_prefill_seqs=2, prefill_attn_pairs=2600)):
        f = m.features(shape)
        assert sum(t * x for t, x in zip(PARAMS.step_vector(), f.linear)) + f.fixed == pytest.approx(
            m.iteration_time(shape), rel=1e-12)


def test_paper_engine_is_the_calibrated_model_unchanged():
    paper = make_cost_model("calibrated", "opt-13b", "a100-40gb", 1, engine="paper")
    assert type(paper) is CalibratedCostModel
    v1 = make_cost_model("calibrated", "opt-13b", "a100-40gb", 1, engine="vllm-0.15")
    assert isinstance(v1, EngineCostModel) and v1.output_delay_steps == 1


def test_shipped_profiles_load_and_say_where_they_come_from():
    for name in ("vllm-0.15", "vllm-0.19", "paper"):
        p = load_engine_profile(name)
        assert p.name == name and p.description and p.provenance


@pytest.mark.parametrize("body, field", [
    ({"format": "pagesim-engine/1", "name": "x", "params": {"gpu_time_scale": "fast"}}, "params.gpu_time_scale"),
    ({"format": "pagesim-engine/1", "name": "x", "params": {"warp_speed": 1}}, "params.warp_speed"),
    ({"format": "pagesim-engine/1", "name": "x", "params": {"cpu_step_s": float("inf")}}, "params.cpu_step_s"),
    ({"format": "pagesim-engine/1", "name": "x", "output_delay_steps": 3}, "output_delay_steps"),
    ({"format": "other", "name": "x"}, "format"),
    ({"format": "pagesim-engine/1"}, "name"),
])
def test_bad_profile_files_name_the_file_and_field(tmp_path, body, field):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(body))
    with pytest.raises(EngineProfileError) as e:
        load_engine_profile(str(path))
    assert str(path) in str(e.value) and field in str(e.value) and "\n" not in str(e.value)


def test_unknown_engine_name_is_one_line():
    with pytest.raises(EngineProfileError, match="unknown engine 'vllm-9'"):
        load_engine_profile("vllm-9")


def test_host_time_and_async_output_in_a_replay():
    """A lone request on an idle engine: it enters after the host time, and its first token and
    last reach the client one step after their own steps (async output)."""
    from pagesim.sim.engine import Replay, ReplayConfig
    from pagesim.workload.trace import Trace, TraceRequest

    trace = Trace({}, [TraceRequest(prompt_len=20, output_len=3, arrival_time=0.0)])
    cfg = ReplayConfig(model="llama-2-7b", gpu="h100-80gb", rate=None, num_requests=None, engine="vllm-0.15")
    sim = Replay(cfg, trace)
    steps = []
    sim.on_step = lambda end, duration, shape: steps.append((end, duration))
    sim.on_decode_run = lambda ends, durations, n, ctx: steps.extend(zip(ends, durations))
    rec = sim.run().metrics.requests[0]
    host = sim.cost.request_host_s
    # steps: prefill (token 1), decode (token 2), decode (token 3); nothing follows the last
    assert len(steps) == 3 and steps[0][0] == pytest.approx(host + steps[0][1])
    assert rec.first_token_time == pytest.approx(steps[1][0])  # delivered when the next step ends
    assert rec.finish_time == pytest.approx(steps[2][0])  # the engine idles after it: at once
