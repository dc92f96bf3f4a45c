"""The inference-perf / BLIS replay reader on small runs built here, checked against hand-worked
values: the prompt rule (slots, a swapped pair, a failed request), output counts, stages, errors."""

from __future__ import annotations

import gzip

import pytest

from pagesim.realruns import RealRunError, load_real_run
from tests.realruns.conftest import RESOLVED_2x2, blis_run, shared_prefix_profile, write_json

# stage 0: 8 requests, slots j % 4 with lengths 11, 12, 13, 14; requests 5 and 6 swapped (sent out
# of order); stage 1: 4 requests, the first failed (no length recorded)
LENGTHS = [11, 12, 13, 14, 11, 13, 12, 14, 0, 12, 13, 14]
OUTPUTS = [5, 5, 6, 5, 1, 5, 5, 5, 0, 5, 5, 4]
ARRIVALS_US = [i * 1_000_000 for i in range(8)] + [20_000_000 + i * 1_000_000 for i in range(4)]


def requests_and_truth():
    requests, truth = [], []
    for i, (length, out, t) in enumerate(zip(LENGTHS, OUTPUTS, ARRIVALS_US)):
        error = i == 8
        requests.append({"index": i, "arrival_time_us": t, "input_tokens": length, "output_tokens": out,
                         "prefix_group": "", "has_error": error})
        truth.append({"index": i, "has_error": error, "e2e_s": 300.2} if error else
                     {"index": i, "has_error": False, "e2e_s": 0.5, "ttft_s": 0.1})
    return requests, truth


@pytest.fixture
def run_path(tmp_path):
    requests, truth = requests_and_truth()
    return blis_run(tmp_path, requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]),
                    resolved=RESOLVED_2x2, exp="model: meta-llama/Llama-2-7b-hf\ntensor_parallelism: 1\nmax_model_len: 4096\n")


def test_the_prompt_rule_rebuilds_who_shares_what(run_path):
    run = load_real_run(run_path)
    r = run.requests
    assert [x.index for x in r] == list(range(12))
    ids = [x.prompt_token_ids for x in r]
    assert ids[4] is ids[0] and ids[7] is ids[3]  # request j repeats request j - 4's prompt
    assert ids[5] is ids[2] and ids[6] is ids[1]  # the swapped pair: each has its neighbour slot's prompt
    assert ids[9] is ids[1] and ids[10] is ids[2]  # the same prompts in the next stage
    assert r[8].prompt_len == 11 and ids[8] is ids[0]  # the failed request: its slot's prompt and length
    assert [len(x) for x in ids] == [x.prompt_len for x in r]
    assert [x.prefix_group for x in r[:4]] == [0, 0, 1, 1]  # slot s in group s // 2
    assert ids[0][:4] == ids[1][:4] and ids[2][:4] == ids[3][:4]  # a group's system prompt
    assert ids[0][:4] != ids[2][:4] and ids[0][4:] != ids[1][4:]
    assert {x.shared_prefix_len for x in r} == {4}
    assert len({tuple(x) for x in ids}) == 4


def test_lengths_times_and_latencies(run_path):
    run = load_real_run(run_path)
    r = run.requests
    assert [x.arrival_s for x in r] == [t / 1e6 for t in ARRIVALS_US]
    assert [x.output_len for x in r] == OUTPUTS  # as recorded
    assert {x.generated_len for x in r} == {5}  # max_tokens with ignore_eos
    assert r[0].itl_s == pytest.approx((0.5 - 0.1) / 4)
    assert not r[8].ok and r[8].ttft_s is None and "300.2 s" in r[8].error
    assert [(s.num_requests, s.start_s, s.end_s, s.rate) for s in run.stages] == [(8, 0.0, 8.0, 1), (4, 20.0, 24.0, 1)]
    assert [x.stage for x in r] == [0] * 8 + [1] * 4
    text = "\n".join(run.assumptions)
    assert "2 of 11 successful requests (18.2 %) report fewer than 95%" in text  # outputs 1 and 4 of max 5
    assert "2 of 4 successful requests (50.0 %) have the input length of request j - 4" in text
    assert "2 requests have the length of a neighbouring prompt slot" in text
    assert "1 failed requests recorded no input length" in text
    assert "1 requests have has_error" in text
    assert run.server.num_gpu_blocks == 7462 and run.server.max_model_len == 4096
    assert run.server.enable_prefix_caching is None  # not recorded: left to the caller's defaults


def test_to_trace_keeps_arrivals_lengths_and_sharing(run_path):
    run = load_real_run(run_path)
    trace = run.to_trace()
    assert len(trace) == 12  # the failed request loaded the server: it stays
    assert [t.arrival_time for t in trace.requests] == [x.arrival_s for x in run.requests]
    assert trace.output_lens == [5] * 12
    assert trace.prompt_lens == [11, 12, 13, 14, 11, 13, 12, 14, 11, 12, 13, 14]
    assert trace.requests[4].prompt_token_ids is trace.requests[0].prompt_token_ids
    assert trace.metadata["assumptions"] == run.assumptions


def test_measured_summary_over_successful_requests(run_path):
    s = load_real_run(run_path).summary()
    assert (s["num_requests"], s["num_ok"], s["num_failed"]) == (12, 11, 1)
    assert s["ttft_mean"] == pytest.approx(0.1) and s["e2e_p99"] == pytest.approx(0.5)
    assert s["tpot_mean"] == pytest.approx(0.1)
    assert s["duration_s"] == pytest.approx(23.5)  # first arrival to the last successful finish
    assert s["request_throughput"] == pytest.approx(11 / 23.5)


def test_without_a_profile_stages_split_where_the_load_stopped(tmp_path):
    requests, truth = requests_and_truth()
    requests[8]["input_tokens"] = 11
    run = load_real_run(blis_run(tmp_path, requests, truth))
    assert [s.num_requests for s in run.stages] == [8, 4]
    assert run.requests[0].prompt_token_ids is None and run.requests[2].generated_len == 6  # as recorded
    assert any("no load-generator profile" in a for a in run.assumptions)


def test_a_failed_request_without_length_and_no_rule_is_an_error(tmp_path):
    requests, truth = requests_and_truth()
    with pytest.raises(RealRunError, match="input_tokens"):
        load_real_run(blis_run(tmp_path, requests, truth))


@pytest.mark.parametrize("change, record, field", [
    (lambda rq, gt: rq[3].pop("arrival_time_us"), 3, "arrival_time_us"),
    (lambda rq, gt: rq[2].update(input_tokens="12"), 2, "input_tokens"),
    (lambda rq, gt: rq[1].update(has_error="no"), 1, "has_error"),
    (lambda rq, gt: rq[5].update(index=4), 5, "index"),
    (lambda rq, gt: gt[6].pop("ttft_s"), 6, "ttft_s"),
    (lambda rq, gt: gt[7].update(e2e_s=-1.0), 7, "e2e_s"),
    (lambda rq, gt: gt[2].update(has_error=True), 2, "has_error"),
    # (past 2**31 - 1, no token count: it stopped the summary with an internal error after the replay)
    (lambda rq, gt: rq[4].update(output_tokens=2**31), 4, "output_tokens"),
    # (an integer no float holds, in a field of seconds: math.isfinite raised OverflowError)
    (lambda rq, gt: rq[6].update(arrival_time_us=10**400), 6, "arrival_time_us"),
])
def test_malformed_records_name_file_record_and_field(tmp_path, change, record, field):
    requests, truth = requests_and_truth()
    change(requests, truth)
    path = blis_run(tmp_path, requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]), resolved=RESOLVED_2x2)
    with pytest.raises(RealRunError) as err:
        load_real_run(path)
    message = str(err.value)
    assert "\n" not in message and f"record {record}" in message and f"'{field}'" in message
    assert ".json.gz" in message


def test_truncated_and_missing_files(tmp_path):
    requests, truth = requests_and_truth()
    path = blis_run(tmp_path, requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]), resolved=RESOLVED_2x2)
    gt = path.parent / "run-a_ground_truth.json.gz"
    data = gt.read_bytes()
    gt.write_bytes(data[: len(data) // 2])
    with pytest.raises(RealRunError, match="truncated or corrupt gzip"):
        load_real_run(path)
    gt.write_bytes(gzip.compress(b'[{"index": 0, "has_error": false, "e2e_s": 0.5'))
    with pytest.raises(RealRunError, match="invalid JSON"):
        load_real_run(path)
    gt.unlink()
    with pytest.raises(RealRunError, match="no ground truth"):
        load_real_run(path)


def test_plain_json_and_a_default_args_folder_are_read_too(tmp_path):
    requests, truth = requests_and_truth()
    path = blis_run(tmp_path, requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]), resolved=RESOLVED_2x2,
                    exp="max_model_len: 4096\n", gz=False)
    assert len(load_real_run(path).requests) == 12
    assert load_real_run(tmp_path / "default_args" / "run-a").name == "run-a"
    write_json(path.parent / "run-a.json", {"requests": [], "config": {}})
    with pytest.raises(RealRunError, match="has no requests"):
        load_real_run(path)


def test_malformed_profile_and_vllm_arguments(tmp_path):
    requests, truth = requests_and_truth()
    profile = shared_prefix_profile([(1, 8), (1, 4)])
    profile["load"]["stages"][1]["rate"] = "fast"
    path = blis_run(tmp_path, requests, truth, profile=profile, resolved=RESOLVED_2x2)
    with pytest.raises(RealRunError, match=r"profile.yaml: record load.stages\[1\]: field 'rate': must be a number"):
        load_real_run(path)
    path = blis_run(tmp_path / "b", requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]),
                    exp="tensor_parallelism: two\n")
    with pytest.raises(RealRunError, match=r"exp-config.yaml: field 'tensor_parallelism': must be an integer"):
        load_real_run(path)
    path = blis_run(tmp_path / "c", requests, truth, profile=shared_prefix_profile([(1, 8), (1, 4)]),
                    resolved="data: [unclosed\n")
    with pytest.raises(RealRunError, match=r"config.yaml: invalid YAML"):
        load_real_run(path)


def test_the_trace_replays_with_the_runs_arrivals_lengths_and_reuse(run_path):
    import pagesim

    run = load_real_run(run_path)
    result = pagesim.replay(run.to_trace(), model="opt-125m", gpu="a100-40gb", rate=0, num_requests=None,
                            prefix_caching=True, block_size=4)
    records = sorted(result.metrics.requests, key=lambda r: r.request_id)
    assert len(records) == 12 and all(r.status == "finished" for r in records)
    assert [r.arrival_time for r in records] == [x.arrival_s for x in run.requests]
    assert [r.prompt_len for r in records] == [x.prompt_len for x in run.requests]
    assert [r.output_len for r in records] == [x.generated_len for x in run.requests]
    # request 4 repeats request 0's whole prompt: all but its last block is served from the cache
    assert records[4].cached_prompt_tokens == 8 and records[0].cached_prompt_tokens == 0
    assert records[1].cached_prompt_tokens == 4  # slot 1 shares slot 0's system prompt (one full block)
