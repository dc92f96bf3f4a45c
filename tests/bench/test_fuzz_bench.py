"""Fuzz (issue 26, item 8, bench's half): a fake server on 127.0.0.1 answers with Hypothesis-drawn
hostile values (usage counts, chunk shapes, raw bytes, /metrics text, /v1/models fields). bench
never crashes, accounts for every request, and never writes NaN or Infinity. Bounded: a few
dozen examples of three requests each, every request with a short timeout."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.bench.client import BenchConfig, run_bench
from pagesim.bench.server import BenchError
from pagesim.workload.trace import Trace, TraceRequest

from .conftest import strict_json
from .fake_server import MODEL, FakeServer, Script, sse

TRACE = Trace({"source": "fuzz"}, [TraceRequest(4, 3), TraceRequest(6, 2)])

# values a server might put where a number belongs
odd_values = st.one_of(
    st.integers(-10**6, 10**6), st.integers(10**9, 10**40), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.none(), st.text(max_size=6), st.lists(st.integers(0, 9), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
usage = st.one_of(st.none(), odd_values,
                  st.fixed_dictionaries({}, optional={"prompt_tokens": odd_values, "completion_tokens": odd_values}))
choice = st.one_of(odd_values, st.fixed_dictionaries({}, optional={"text": st.one_of(st.text(max_size=4), odd_values),
                                                                   "index": odd_values}))
chunk = st.one_of(
    st.fixed_dictionaries({"choices": st.one_of(st.lists(choice, max_size=3), odd_values)}, optional={"usage": usage}),
    st.fixed_dictionaries({"usage": usage}), odd_values,
    st.fixed_dictionaries({"error": st.one_of(odd_values, st.fixed_dictionaries({"message": odd_values}))}))
event = st.one_of(chunk.map(lambda c: sse(json.dumps(c).encode())),  # json.dumps writes NaN and Infinity as a server may
                  st.binary(max_size=40).map(lambda b: b"data: " + b + b"\n\n"), st.binary(max_size=40),
                  st.just(b"data: [DONE]\n\n"))
stream = st.tuples(st.lists(event, max_size=6), st.booleans()).map(
    lambda t: t[0] + ([b"data: [DONE]\n\n"] if t[1] else []))
answer = st.tuples(st.sampled_from([200, 200, 200, 400, 500]), stream)
metric_line = st.tuples(
    st.sampled_from(["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                     "vllm:num_preemptions_total", "pagesim:engine_steps_total", "x"]),
    st.sampled_from(["", '{a="1"}', '{a="} x"}', "{"]),
    st.one_of(st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "1e308", "1e400", "0.5", "3", "abc", ""]),
              st.floats(allow_nan=True, allow_infinity=True).map(repr))).map(lambda t: f"{t[0]}{t[1]} {t[2]}")
metrics_text = st.lists(st.one_of(metric_line, st.text(max_size=20)), max_size=8).map("\n".join)
model_entry = st.fixed_dictionaries({"id": st.just(MODEL)}, optional={"max_model_len": odd_values,
                                                                     "vocab_size": odd_values})


def finite_everywhere(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite_everywhere(v) for v in value.values())
    if isinstance(value, list):
        return all(finite_everywhere(v) for v in value)
    return True


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                 HealthCheck.function_scoped_fixture])
@given(answers=st.lists(answer, min_size=1, max_size=3), metrics=metrics_text, entry=model_entry,
       clamp=st.booleans())
def test_bench_survives_a_hostile_server(tmp_path, answers, metrics, entry, clamp):
    script = Script(models={"data": [entry]}, metrics=metrics,
                    respond=lambda payload, i: answers[i % len(answers)])
    cfg = BenchConfig(endpoint="", rate=200.0, num_requests=3, timeout_s=5.0, scrape_interval_s=0.01, vocab_size=50,
                      clamp_to_max_model_len=clamp)
    with FakeServer(script) as server:
        cfg.endpoint = server.base
        try:
            summary, metrics_recorder = run_bench(TRACE, cfg)
        except BenchError as e:  # only a server whose model list is unusable stops bench, before any request
            raise AssertionError(f"an entry with the model id must be usable: {e}") from e
    assert summary["num_requests"] == 3
    assert summary["num_finished"] + summary["num_failed"] + summary["num_skipped"] == 3
    assert sum(summary["failure_reasons"].values()) == summary["num_failed"] + summary["num_skipped"]
    assert all(r.output_len >= 0 and r.prompt_len >= 0 for r in metrics_recorder.requests)
    assert finite_everywhere(summary), summary
    text = json.dumps(summary, allow_nan=False, sort_keys=True)  # what `--json` prints
    metrics_recorder.write(tmp_path / "out", summary, steps=False)
    assert strict_json((tmp_path / "out" / "summary.json").read_text()) == json.loads(text)
