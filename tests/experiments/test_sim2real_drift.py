"""reports/sim2real.md's over-time table: requests held by the real server, and the measured over
predicted gap per part of a run, against values worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pagesim.experiments.sim2real import drift, excess_by_held, excess_table, short_name
from pagesim.realruns.types import RealRequest, RealRun, ServerConfig


def req(index, arrival, e2e, ttft=0.1, tokens=11, ok=True, abandoned=None):
    return RealRequest(index=index, arrival_s=arrival, prompt_len=10, output_len=tokens, generated_len=tokens,
                       ok=ok, ttft_s=ttft if ok else None, e2e_s=e2e if ok else None, abandoned_after_s=abandoned)


def run_of(requests):
    return RealRun(name="t", source_format="test", path="t.json", server=ServerConfig(), requests=requests, stages=[])


def test_held_requests_are_sent_unfinished_and_not_given_up():
    run = run_of([
        req(0, 0.0, 5.0),  # held over [0, 5]
        req(1, 1.0, 1.0),  # over [1, 2]
        req(2, 3.0, None, ok=False, abandoned=4.0),  # given up at 7
        req(3, 3.5, None, ok=False),  # failed, no end recorded: held to the end
        req(4, 9.0, 1.0),  # not sent before 9
    ])
    assert run.held_at(0.0) == 1
    assert run.held_at(1.5) == 2
    assert run.held_at(4.0) == 3  # 0, 2 and 3; 1 finished at 2
    assert run.held_at(6.0) == 2  # 2 (until 7) and 3
    assert run.held_at(8.0) == 1  # only 3
    assert run.held_at(9.5) == 2  # 3 and 4
    # the most at once: 0, 2 and 3 from 3.5 s (1 left at 2, 0 at 5)
    assert run.peak_held() == (3, 3.5)


def test_drift_is_the_ratio_of_summed_gaps_per_part():
    # 20 requests, 11 tokens each: measured gap (e2e - ttft) / 10; the replay's gap is 10 ms for all.
    # First half measured 10 ms (ratio 1.0), second half 12 ms (ratio 1.2), parts of 2 requests.
    requests = [req(i, float(i), 0.1 + (0.1 if i < 10 else 0.12), tokens=11) for i in range(20)]
    records = [SimpleNamespace(request_id=i, status="finished", total_output_len=11, ttft=0.05, e2e_latency=0.15)
               for i in range(20)]
    validation = SimpleNamespace(run=run_of(requests), replay=SimpleNamespace(metrics=SimpleNamespace(requests=records)))
    parts = drift(validation)
    assert len(parts) == 10
    assert [p[0] for p in parts] == pytest.approx([1.0] * 5 + [1.2] * 5)
    assert [p[1] for p in parts] == pytest.approx([10.0] * 5 + [12.0] * 5)
    # each part's first arrival is 2k; requests last 0.2 / 0.22 s, so only the one sent then is held
    assert [p[2] for p in parts] == [1] * 10


def test_drift_skips_requests_without_a_gap():
    requests = [req(0, 0.0, 0.2, tokens=1), req(1, 1.0, None, ok=False)]
    records = [SimpleNamespace(request_id=0, status="finished", total_output_len=1, ttft=0.1, e2e_latency=0.1)]
    validation = SimpleNamespace(run=run_of(requests), replay=SimpleNamespace(metrics=SimpleNamespace(requests=records)))
    assert drift(validation) == []


def test_held_counts_equal_a_count_at_each_moment():
    run = run_of([req(0, 0.0, 5.0), req(1, 1.0, 1.0), req(2, 3.0, None, ok=False, abandoned=4.0),
                  req(3, 3.5, None, ok=False), req(4, 9.0, 1.0)])
    moments = [0.0, 0.5, 1.0, 2.0, 3.5, 5.0, 6.99, 7.0, 9.0, 10.0, 100.0]
    brute = [sum(1 for sent, end in run.held_spans() if sent <= t < end) for t in moments]
    assert run.held_counts(moments) == brute == [1, 1, 2, 1, 3, 2, 2, 1, 2, 1, 1]


def test_excess_by_held_bins_each_request_by_its_mean_held_count():
    # 150 requests sent at 0, first token at 1 s, last at 11 s, 11 tokens: measured gap 1 s. Held
    # 150 at the 8 moments before 11 s and 0 at 11 s (all gone): 150 * 8 / 9 = 133.3, the 128-200 bin.
    # The replay's gap: (6 - 1) / 10 = 0.5 s.
    requests = [req(i, 0.0, 11.0, ttft=1.0, tokens=11) for i in range(150)]
    records = [SimpleNamespace(request_id=i, status="finished", total_output_len=11, ttft=1.0, e2e_latency=6.0)
               for i in range(150)]
    validation = SimpleNamespace(run=run_of(requests), replay=SimpleNamespace(metrics=SimpleNamespace(requests=records)))
    bins = excess_by_held(validation)
    assert list(bins) == [(128, 200)]
    count, measured, predicted = bins[(128, 200)]
    assert count == 150 and measured == pytest.approx(1000.0) and predicted == pytest.approx(500.0)


def test_excess_table_lists_a_run_only_when_it_held_more_than_all_its_ranks_run():
    # the 150 requests above held at once: over 128 running slots with one rank, under 2 x 128 with two
    requests = [req(i, 0.0, 11.0, ttft=1.0, tokens=11) for i in range(150)]
    records = [SimpleNamespace(request_id=i, status="finished", total_output_len=11, ttft=1.0, e2e_latency=6.0)
               for i in range(150)]
    rows = []
    for name, dp in (("20260217-155451-one-rank", None), ("Two-Ranks", 2)):
        run = RealRun(name=name, source_format="test", path="t.json", server=ServerConfig(data_parallel_size=dp),
                      requests=requests, stages=[])
        rows.append({"run": name, "validation": SimpleNamespace(
            run=run, config=SimpleNamespace(max_num_seqs=128),
            replay=SimpleNamespace(metrics=SimpleNamespace(requests=records)))})
    lines = excess_table(rows)
    assert lines[2:] == ["| one-rank | - | - | +500.0 (150) | - | - | - | - |"]  # 1,000 ms measured, 500 replayed


def test_short_names_drop_only_the_campaigns_date_prefix():
    assert short_name("20260217-155451-llama-2-7b-tp1-codegen") == "llama-2-7b-tp1-codegen"
    assert short_name("Qwen3-30B-A3B-Instruct-2507") == "Qwen3-30B-A3B-Instruct-2507"
