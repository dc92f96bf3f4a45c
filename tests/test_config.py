"""The one serving configuration (pagesim.core.config): both drivers embed it, the CLI takes its
choices and defaults from it, its defaults work for every catalog model, and a bad value is an
error that names the flag to change."""

from __future__ import annotations

import dataclasses

import pytest

from pagesim.core import POLICIES, ServingConfig
from pagesim.core.config import CHOICES, SERVING_FIELDS
from pagesim.core.reservation import ALLOCATORS
from pagesim.core.scheduler import PREEMPTION_MODES
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.specs import MODELS
from pagesim.workload.trace import Trace, TraceRequest


def test_both_drivers_embed_the_same_knobs_with_the_same_defaults():
    pytest.importorskip("torch")
    from executor.engine import EngineConfig

    # (but chunked prefill, which a replay leaves unset, None, to settle per model as vLLM does:
    # on past 32K tokens, tests/sim/test_long_context_chunking.py; the executor's models are short)
    knobs = [f for f in SERVING_FIELDS if f != "chunked_prefill"]
    defaults = {f: getattr(ServingConfig(), f) for f in knobs}
    for driver in (ReplayConfig, EngineConfig):
        assert issubclass(driver, ServingConfig)
        assert {f: getattr(driver(), f) for f in knobs} == defaults, driver.__name__
    assert (ServingConfig().chunked_prefill, EngineConfig().chunked_prefill, ReplayConfig().chunked_prefill) == \
        (False, False, None)
    assert defaults["max_num_seqs"] == 256  # the executor's used to be 64


def test_cli_choices_are_the_cores_names():
    from pagesim.cli.replay import Policy, Preemption

    assert [p.value for p in Policy] == list(POLICIES) == list(CHOICES["policy"])
    assert [p.value for p in Preemption] == list(PREEMPTION_MODES) == list(CHOICES["preemption"])
    assert CHOICES["allocator"] == tuple(ALLOCATORS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_defaults_schedule_every_catalog_model(name):
    model = MODELS[name]
    cfg = ServingConfig()
    sched = cfg.make_scheduler(1000, 0, model.max_model_len)
    # a whole max-length prompt fits one step without chunked prefill
    assert sched.config.max_num_batched_tokens == max(2560, model.max_model_len) >= model.max_model_len
    if model.max_model_len <= 2560:
        assert sched.config.max_num_batched_tokens == 2560  # the paper's setting, as before


def test_the_simulator_runs_a_long_model_on_defaults_and_reports_the_budget_it_used():
    trace = Trace({}, [TraceRequest(prompt_len=3000, output_len=5)])  # longer than 2560 tokens
    cfg = ReplayConfig(model="llama-2-7b", num_requests=3)
    assert cfg.max_num_batched_tokens is None
    summary = Replay(cfg, trace).run().summary
    assert summary["num_finished"] == 3 and summary["config"]["max_num_batched_tokens"] == 4096


def test_a_max_model_len_past_the_models_positions_is_refused():
    """vLLM refuses a max_model_len above the model's derived length (its max_position_embeddings:
    2048 for OPT-13B, 4096 for Llama-2-7B); ReplayConfig took it and simulated positions the model has not."""
    with pytest.raises(ValueError, match=r"^--max-model-len 2049 is greater than opt-13b's maximum length, 2048 tokens"):
        ReplayConfig(max_model_len=2049)
    with pytest.raises(ValueError, match=r"^--max-model-len 4097 is greater than llama-2-7b's maximum length, 4096"):
        ReplayConfig(model="llama-2-7b", max_model_len=4097)
    assert ReplayConfig(model="llama-2-7b", max_model_len=4096).max_model_len == 4096  # its own length is fine


@pytest.mark.parametrize("changes, flag", [
    ({"policy": "orca"}, "--policy"),
    ({"preemption": "evict"}, "--preemption"),
    ({"allocator": "slab"}, "--allocator"),
    ({"block_size": 0}, "--block-size"),
    ({"max_num_seqs": -1}, "--max-num-seqs"),
])
def test_a_bad_value_names_its_flag(changes, flag):
    with pytest.raises(ValueError, match=flag):
        ServingConfig(**changes)


def test_a_budget_below_the_model_length_names_the_flags():
    with pytest.raises(ValueError, match="--max-num-batched-tokens 2560 is below the max model length 4096.*--chunked-prefill"):
        ServingConfig(max_num_batched_tokens=2560).scheduler_config(4096)
    with pytest.raises(ValueError, match="--max-num-batched-tokens 100 is below --max-num-seqs 256"):
        ServingConfig(max_num_batched_tokens=100, chunked_prefill=True).scheduler_config(2048)
    assert dataclasses.replace(ServingConfig(), chunked_prefill=True).scheduler_config(4096).max_num_batched_tokens == 4096
