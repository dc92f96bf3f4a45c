"""bench_executor_noise's statistics against a synthetic truth: processes whose every step is a
known factor slower must come out at exactly that speed."""

import importlib.util
import statistics
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location(
    "bench_executor_noise", Path(__file__).resolve().parents[1] / "benchmarks" / "bench_executor_noise.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_summary_recovers_known_process_speeds():
    base = {"prefill 1 x 32": [0.2, 0.2, 0.2], "decode 4 x 64": [0.1, 0.11, 0.09]}
    factors = [0.9, 1.0, 1.2]
    procs = [{s: [t * f for t in v] for s, v in base.items()} for f in factors]
    r = bench.summarize(procs)
    assert r["speeds"] == pytest.approx([0.9, 1.0, 1.2])
    assert r["speed_min"] == pytest.approx(0.9) and r["speed_max"] == pytest.approx(1.2)
    assert r["speed_cv"] == pytest.approx(statistics.stdev(factors) / statistics.mean(factors))
    # within a process: the decode shape's CV (0.1 stdev of 0.01 around 0.1) and the constant prefill's 0
    assert r["within_cv_median"] == pytest.approx(0.05)
    assert r["first_over_median"] == pytest.approx(1.0)


def test_labels():
    assert bench.label("prefill", {"num_prefill_seqs": 4, "num_prefill_tokens": 128, "num_decode_seqs": 0,
                                   "decode_context_tokens": 0}) == "prefill 4 x 32"
    assert bench.label("decode", {"num_prefill_seqs": 0, "num_prefill_tokens": 0, "num_decode_seqs": 16,
                                  "decode_context_tokens": 528}) == "decode 16 x 33"
