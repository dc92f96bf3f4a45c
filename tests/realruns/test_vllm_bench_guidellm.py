"""The `vllm bench serve` and guidellm readers on results built here, in the field names of
vllm/benchmarks/serve.py and guidellm 0.8.1's report schema."""

from __future__ import annotations

import re

import numpy as np
import pytest

from pagesim.realruns import RealRunError, load_real_run
from pagesim.workload.arrivals import poisson_arrivals
from tests.realruns.conftest import write_json


def bench_result(**extra):
    doc = {"date": "20260101-000000", "backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B", "num_prompts": 3,
           "request_rate": 2.0, "burstiness": 1.0, "max_concurrency": None, "duration": 3.0, "completed": 2,
           "failed": 1, "input_lens": [30, 40, 50], "output_lens": [4, 3, 0],
           "ttfts": [0.1, 0.2, 0.0], "itls": [[0.05, 0.06, 0.07], [0.10, 0.30], []],
           "latencies": [0.28, 0.6, 0.0], "start_times": [1000.5, 1000.0, 1001.0],
           "errors": ["", "", "HTTP 500: boom"], "generated_texts": ["a", "b", ""]}
    doc.update(extra)
    return doc


def test_vllm_bench_per_request_details(tmp_path):
    run = load_real_run(write_json(tmp_path / "vllm-bench.json", bench_result(tensor_parallel_size="2",
                                                                              enable_prefix_caching="true")))
    r = run.requests
    assert [x.index for x in r] == [1, 0, 2]  # sent at 1000.0, 1000.5, 1001.0
    assert [x.arrival_s for x in r] == [0.0, 0.5, 1.0]
    assert (r[1].ttft_s, r[1].e2e_s, r[1].itl_gaps_s) == (0.1, 0.28, [0.05, 0.06, 0.07])
    assert not r[2].ok and r[2].error == "HTTP 500: boom" and r[2].generated_len == 1
    assert run.server.tensor_parallel_size == 2 and run.server.enable_prefix_caching is True
    assert run.server.model == "meta-llama/Llama-3.1-8B"
    s = run.summary()
    gaps = [0.05, 0.06, 0.07, 0.10, 0.30]  # pooled over tokens, as vLLM's ITL
    assert s["itl_mean"] == pytest.approx(np.mean(gaps)) and s["itl_p90"] == pytest.approx(np.percentile(gaps, 90))
    assert s["itl_source"] == "measured token gaps"
    assert s["tpot_mean"] == pytest.approx(np.mean([(0.28 - 0.1) / 3, (0.6 - 0.2) / 2]))
    assert s["num_failed"] == 1


def test_vllm_bench_a_failure_with_an_empty_error_text(tmp_path):
    doc = bench_result(errors=["", "", ""])  # request 2 failed with an empty reason: no first token
    run = load_real_run(write_json(tmp_path / "r.json", doc))
    failed = [r for r in run.requests if not r.ok]
    assert [r.index for r in failed] == [2] and failed[0].error == "no first token (no error text recorded)"


def test_vllm_bench_without_start_times_says_what_it_assumed(tmp_path):
    doc = bench_result()
    for name in ("start_times", "latencies"):
        doc.pop(name)
    run = load_real_run(write_json(tmp_path / "r.json", doc))
    assert [x.arrival_s for x in run.requests] == pytest.approx(sorted(poisson_arrivals(2.0, count=3, seed=0)))
    assert any("poisson at 2 req/s" in a and "seed 0" in a for a in run.assumptions)
    assert run.requests[0].e2e_s == pytest.approx(0.1 + 0.18)  # TTFT + its gaps
    doc["request_rate"] = "inf"
    assert {x.arrival_s for x in load_real_run(write_json(tmp_path / "r.json", doc)).requests} == {0.0}


@pytest.mark.parametrize("change, message", [
    (lambda d: d.update(ttfts=[0.1, 0.2]), "field 'ttfts': has 2 entries, input_lens has 3"),
    (lambda d: d.update(input_lens=[30, "40", 50]), "record 1: field 'input_lens': must be an integer"),
    (lambda d: d["itls"][0].__setitem__(1, None), "record 0: field 'itls[1]': is null"),
    (lambda d: d.update(max_num_seqs="many"), "field 'max_num_seqs': must be of type int"),
    # accepted before: a request that ended before its first token, and times that made the
    # measured throughput 7e-300 tokens/s
    (lambda d: d.update(ttfts=[0.5, 0.2, 0.0]), "record 0: field 'latencies': 0.28 s is shorter than its TTFT (0.5 s)"),
    (lambda d: d.update(ttfts=[1e300, 0.2, 0.0], latencies=[1e300, 0.6, 0.0]), "record 0: field 'ttfts': must be <= 1e+09"),
    (lambda d: d.update(latencies=[0.28, 1e300, 0.0]), "record 1: field 'latencies': must be <= 1e+09"),
    (lambda d: d.update(start_times=[1e300, 1000.0, 1001.0]), "record 0: field 'start_times': must be <= 1e+11"),
])
def test_vllm_bench_malformed(tmp_path, change, message):
    doc = bench_result()
    change(doc)
    with pytest.raises(RealRunError, match=re.escape(message)) as err:
        load_real_run(write_json(tmp_path / "bad.json", doc))
    assert "bad.json" in str(err.value)


def guidellm_request(rid, start, first, end, prompt, output, error=None, **extra):
    return {"type_": "generative_request_stats", "request_id": rid,
            "info": {"status": "errored" if error else "completed", "error": error,
                     "timings": {"request_start": start, "first_token_iteration": first,
                                 "last_token_iteration": end, "request_end": end}},
            "input_metrics": {"text_tokens": prompt, "total_tokens": prompt},
            "output_metrics": {"text_tokens": output, "total_tokens": output},
            "prompt_tokens": prompt, "output_tokens": output, **extra}


def guidellm_report(successful_total=2):
    t0 = 1_700_000_000.0
    first = {"type_": "generative_benchmark",
             "config": {"strategy": {"type_": "poisson", "rate": 2.0}, "backend": {"model": "Qwen/Qwen3-32B"}},
             "metrics": {"request_totals": {"successful": successful_total, "errored": 1, "incomplete": 0,
                                            "total": successful_total + 1}},
             "requests": {"successful": [guidellm_request("a", t0 + 0.5, t0 + 0.7, t0 + 1.5, 100, 11),
                                         guidellm_request("b", t0, t0 + 0.1, t0 + 0.4, 50, 4)],
                          "errored": [guidellm_request("c", t0 + 0.8, None, t0 + 0.9, 70, 0, error="timeout")],
                          "incomplete": []}}
    second = {"type_": "generative_benchmark", "config": {"strategy": {"type_": "concurrent", "streams": 8}},
              "requests": {"successful": [guidellm_request("d", t0 + 10, t0 + 10.2, t0 + 11.2, 80, 6)],
                           "errored": [], "incomplete": []}}
    return {"metadata": {"version": 2, "guidellm_version": "0.8.1"}, "benchmarks": [first, second]}


def test_guidellm_benchmarks_become_stages(tmp_path):
    run = load_real_run(write_json(tmp_path / "benchmarks.json", guidellm_report()))
    r = run.requests
    assert [x.arrival_s for x in r] == pytest.approx([0.0, 0.5, 0.8, 10.0])
    assert [x.stage for x in r] == [0, 0, 0, 1]
    assert r[1].ttft_s == pytest.approx(0.2) and r[1].e2e_s == pytest.approx(1.0) and r[1].itl_s == pytest.approx(0.08)
    assert not r[2].ok and r[2].error == "timeout" and r[2].generated_len == 1
    assert [(s.rate, s.concurrency, s.num_requests) for s in run.stages] == [(2.0, None, 3), (None, 8, 1)]
    assert run.server.model == "Qwen/Qwen3-32B"
    assert any("one after another" in a for a in run.assumptions)
    assert not any("sampled" in a for a in run.assumptions)
    sampled = load_real_run(write_json(tmp_path / "b2.json", guidellm_report(successful_total=5)))
    assert any("lists 3 of its 6 requests" in a for a in sampled.assumptions)


def test_guidellm_malformed(tmp_path):
    doc = guidellm_report()
    doc["benchmarks"][0]["requests"]["successful"][1]["info"]["timings"]["first_token_iteration"] = "soon"
    with pytest.raises(RealRunError, match=r"record benchmarks\[0\].requests.successful\[1\]: "
                                           r"field 'first_token_iteration': must be a number"):
        load_real_run(write_json(tmp_path / "g.json", doc))
    doc = guidellm_report()
    del doc["benchmarks"][1]["requests"]["successful"][0]["info"]
    with pytest.raises(RealRunError, match=r"successful\[0\]: field 'info': missing"):
        load_real_run(write_json(tmp_path / "g.json", doc))


@pytest.mark.parametrize("doc", [bench_result(), guidellm_report()], ids=["vllm-bench", "guidellm"])
def test_truncated_json_names_the_file_and_where(tmp_path, doc):
    import json

    text = json.dumps(doc)
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(RealRunError, match=r"cut.json: invalid JSON at line 1, column \d+: .*\(truncated file\?\)"):
        load_real_run(path)
