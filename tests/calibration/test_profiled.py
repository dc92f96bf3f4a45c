"""The profiled cost model without torch: NNLS against brute force, the fit against known
linear truths, file errors, and the decode fast path."""

import itertools
import json
from dataclasses import asdict

import numpy as np
import pytest

from pagesim.sim.cost import BatchShape, make_cost_model
from pagesim.sim.cost.lsq import nnls
from pagesim.sim.cost.profiled import HOLDOUT_EVERY, PROFILE_FORMAT, ProfileError, ProfiledCostModel, load_profile


def brute_force_nnls(a, b):
    """Every support set solved by unconstrained least squares; the best feasible one wins."""
    n = a.shape[1]
    best, best_res = np.zeros(n), np.linalg.norm(b)
    for k in range(1, n + 1):
        for support in itertools.combinations(range(n), k):
            x = np.zeros(n)
            x[list(support)] = np.linalg.lstsq(a[:, support], b, rcond=None)[0]
            if (x >= -1e-12).all():
                res = np.linalg.norm(a @ x - b)
                if res < best_res - 1e-12:
                    best, best_res = x, res
    return best, best_res


@pytest.mark.parametrize("seed", range(12))
def test_nnls_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(15, 5))
    b = rng.normal(size=15)
    x = nnls(a, b)
    ref, ref_res = brute_force_nnls(a, b)
    assert (x >= 0).all()
    assert np.linalg.norm(a @ x - b) == pytest.approx(ref_res, rel=1e-9, abs=1e-12)
    np.testing.assert_allclose(x, ref, atol=1e-8)


TRUE = dict(c0=0.02, ptok=3e-4, pair=2e-8, pseq=1e-3, dseq=2e-3, ctx=5e-6, cap4=0.01)


def true_time(s: BatchShape) -> float:
    tokens = s.num_prefill_tokens + s.num_decode_seqs
    return (TRUE["c0"] + TRUE["ptok"] * s.num_prefill_tokens + TRUE["pair"] * s.prefill_attn_pairs
            + TRUE["pseq"] * s.num_prefill_seqs + TRUE["dseq"] * s.num_decode_seqs + TRUE["ctx"] * s.decode_context_tokens
            + TRUE["cap4"] * min(tokens, 4))


def synthetic_profile(path, noise=0.0, seed=0):
    rng = np.random.default_rng(seed)
    steps = []
    for n, t in [(1, 8), (1, 64), (1, 256), (2, 32), (4, 16), (8, 64), (3, 100), (1, 500), (1, 1), (1, 3)]:
        s = BatchShape(num_prefill_tokens=n * t, num_prefill_seqs=n, prefill_attn_pairs=n * t * (t + 1) // 2)
        steps.append(s)
    for b, c in [(1, 10), (4, 100), (8, 50), (16, 300), (32, 64), (2, 900), (24, 24), (12, 512), (3, 40), (6, 200)]:
        steps.append(BatchShape(num_decode_seqs=b, decode_context_tokens=b * c))
    recs = [{"kind": "x", "shape": asdict(s), "seconds": true_time(s) * (1 + noise * rng.normal())} for s in steps]
    swaps = [{"shape": {"num_swap_blocks": k}, "seconds": 1e-4 + 2e-5 * k} for k in (1, 4, 16)]
    copies = [{"shape": {"num_copy_blocks": k}, "seconds": 5e-5 + 1e-5 * k} for k in (1, 4, 16)]
    data = {"format": PROFILE_FORMAT, "block_size": 16, "clock": "cpu", "model": {"spec": "synthetic"},
            "hardware": {"device": "none"}, "steps": recs, "swaps": swaps, "copies": copies}
    path.write_text(json.dumps(data))
    return steps


def test_fit_recovers_a_linear_truth(tmp_path):
    path = tmp_path / "p.json"
    steps = synthetic_profile(path)
    model = make_cost_model("profiled", "smollm2-135m", "a100-40gb", profile_path=str(path))
    assert isinstance(model, ProfiledCostModel)
    for s in steps:  # held-out shapes included
        assert model.iteration_time(s) == pytest.approx(true_time(s), rel=1e-6)
    # a shape of a kind never measured: prefill and decode mixed, with swaps and copies
    mixed = BatchShape(num_prefill_tokens=40, num_prefill_seqs=1, prefill_attn_pairs=40 * 41 // 2 + 40 * 10,
                       num_decode_seqs=5, decode_context_tokens=600, num_swap_blocks=8, num_copy_blocks=2)
    expected = true_time(mixed) + (1e-4 + 2e-5 * 8) + (5e-5 + 1e-5 * 2)
    assert model.iteration_time(mixed) == pytest.approx(expected, rel=1e-6)
    d = model.describe()
    assert d["held_out_error"]["count"] == len(steps) // HOLDOUT_EVERY and d["held_out_error"]["max_abs"] < 1e-6


def test_noisy_fit_states_its_error_honestly(tmp_path):
    path = tmp_path / "p.json"
    synthetic_profile(path, noise=0.05, seed=3)
    model = ProfiledCostModel.from_profile(path)
    data = json.loads(path.read_text())
    # recompute the training error from the file and the coefficients (dot product, written here)
    c = model.coefficients
    errs = []
    for i, rec in enumerate(data["steps"]):
        if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1:
            continue
        s = rec["shape"]
        tokens = s["num_prefill_tokens"] + s["num_decode_seqs"]
        pred = (c["const"] + c["num_prefill_tokens"] * s["num_prefill_tokens"] + c["prefill_attn_pairs"] * s["prefill_attn_pairs"]
                + c["num_prefill_seqs"] * s["num_prefill_seqs"] + c["num_decode_seqs"] * s["num_decode_seqs"]
                + c["decode_context_tokens"] * s["decode_context_tokens"]
                + sum(c[f"min_tokens_{k}"] * min(tokens, k) for k in (2, 4, 8, 16)))
        errs.append(abs(pred / rec["seconds"] - 1))
    stated = model.describe()["train_error"]
    assert stated["max_abs"] == pytest.approx(max(errs), rel=1e-9)
    assert stated["mean_abs"] == pytest.approx(sum(errs) / len(errs), rel=1e-9)
    assert 0 < stated["max_abs"] < 0.2  # 5 % noise: a few percent, not zero
    assert all(v >= 0 for v in c.values())


def test_decode_run_times_equal_iteration_time(tmp_path):
    path = tmp_path / "p.json"
    synthetic_profile(path, noise=0.03, seed=1)
    model = ProfiledCostModel.from_profile(path)
    for num_seqs, ctx in [(1, 1), (7, 333), (64, 12345)]:
        times = model.decode_run_times(num_seqs, ctx, 16)
        for k in range(50):
            shape = BatchShape(num_decode_seqs=num_seqs, decode_context_tokens=ctx + k * num_seqs, block_size=16)
            assert next(times) == model.iteration_time(shape)  # bit-identical


def test_bad_profiles_name_file_record_and_field(tmp_path):
    path = tmp_path / "p.json"
    synthetic_profile(path)
    data = json.loads(path.read_text())
    data["steps"][3]["seconds"] = -1
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"p\.json: steps\[3\]\.seconds"):
        load_profile(path)
    data["steps"][3]["seconds"] = 0.1
    data["steps"][5]["shape"]["num_decode_tokens"] = 3
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"steps\[5\]\.shape: unknown field"):
        load_profile(path)
    with pytest.raises(ProfileError, match="no such profile"):
        load_profile(tmp_path / "missing.json")
    with pytest.raises(ValueError, match="needs a profile file"):
        make_cost_model("profiled", "smollm2-135m", "a100-40gb")
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(ProfileError, match="'format'"):
        load_profile(path)


def test_block_size_mismatch_is_refused(tmp_path):
    path = tmp_path / "p.json"
    synthetic_profile(path)
    model = ProfiledCostModel.from_profile(path)
    with pytest.raises(ValueError, match="block size 16"):
        model.iteration_time(BatchShape(num_decode_seqs=1, decode_context_tokens=5, block_size=32))


def test_replay_cli_uses_the_profiled_model(tmp_path):
    from typer.testing import CliRunner

    from pagesim.cli import app

    path = tmp_path / "p.json"
    synthetic_profile(path)
    result = CliRunner().invoke(app, ["replay", "traces/alpaca.json", "--model", "smollm2-135m", "--num-requests", "20",
                                      "--num-gpu-blocks", "64", "--max-num-batched-tokens", "8192", "--cost-model", "profiled", "--profile", str(path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["cost_model"]["name"] == "profiled" and summary["num_finished"] == 20
    bad = CliRunner().invoke(app, ["replay", "traces/alpaca.json", "--cost-model", "profiled"])
    assert bad.exit_code == 2 and "needs a profile file" in bad.output
