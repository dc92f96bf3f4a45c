"""--num-gpu-blocks beyond what the GPU's memory holds is accepted, as a what-if, with a warning
(a note in the summary, printed by the CLI); at or below it, nothing is said."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from pagesim.cli import app
from pagesim.sim.engine import Replay, ReplayConfig
from pagesim.sim.specs import kv_cache_capacity
from pagesim.workload.trace import load_trace

TRACE = Path(__file__).resolve().parents[2] / "traces" / "sharegpt.json"


def test_a_pool_beyond_memory_is_a_noted_what_if():
    cfg = dict(model="llama-2-7b", gpu="a100-80gb", num_requests=5, rate=1.0)
    fits = Replay(ReplayConfig(**cfg), load_trace(TRACE)).scheduler.kv.num_device_blocks
    at_memory = Replay(ReplayConfig(**cfg, num_gpu_blocks=fits), load_trace(TRACE))
    assert not [n for n in at_memory.notes if n.startswith("what-if")]
    beyond = Replay(ReplayConfig(**cfg, num_gpu_blocks=10 * fits), load_trace(TRACE))
    assert beyond.scheduler.kv.num_device_blocks == 10 * fits  # accepted as asked
    (note,) = [n for n in beyond.notes if n.startswith("what-if")]
    assert f"{10 * fits:,}" in note and f"{fits:,} blocks" in note and "10.0x" in note
    assert beyond.run().summary["notes"].count(note) == 1
    # the comparison is with the pool the capacity model gives the same setup
    assert fits == kv_cache_capacity("llama-2-7b", "a100-80gb", 1, max_num_batched_tokens=4096,
                                     max_num_seqs=256).num_blocks(16)


def test_the_cli_warns():
    result = CliRunner().invoke(app, ["replay", str(TRACE), "--model", "llama-2-7b", "--gpu", "a100-80gb",
                                      "--num-requests", "5", "--num-gpu-blocks", "2000000"], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert "warning: what-if KV pool: --num-gpu-blocks 2,000,000" in result.output
