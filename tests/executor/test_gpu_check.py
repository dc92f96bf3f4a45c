"""pagesim/experiments/gpu_check.py end to end on CPU with --tiny: every section runs, writes its table and
finite, positive numbers, and every correctness row passes."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~20 s alone, about a minute on a loaded 2-core machine

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SECTION_KEYS = ["correctness", "bandwidth", "end_to_end", "profile"]


def _load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "pagesim" / "experiments" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _walk(obj, path=""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, obj


def _positive(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check") / "gpu_check_cpu.md"
    # A generous budget: on a loaded 2-core machine the tiny run must not skip parts for time.
    rc = _load_script().main(["--device", "cpu", "--tiny", "--budget-s", "600", "--out", str(out)])
    return rc, out, json.loads(out.with_suffix(".json").read_text())


def test_report_files_and_sections(run):
    rc, out, data = run
    md = out.read_text()
    assert rc == 0
    assert "torch.set_num_threads(1)" in md and "--device cpu --tiny" in md
    gc = _load_script()
    for key, title in gc.SECTIONS:
        assert f"## {title}" in md
        assert data["sections"][key]["status"] == "ok", (key, data["sections"][key].get("error"))
        assert data["sections"][key]["tables"], key
    assert md.count("| --- |") >= 4  # a table per section at least


def test_numbers_finite(run):
    _, _, data = run
    for path, v in _walk(data):
        if isinstance(v, float):
            assert math.isfinite(v), path
        if isinstance(v, str):
            assert v not in ("nan", "inf", "-inf"), path


def test_correctness_rows_pass(run):
    _, _, data = run
    rows = data["sections"]["correctness"]["data"]["rows"]
    kinds = {r["kernel"] for r in rows}
    assert kinds == {"decode", "prefill", "reshape_and_cache", "copy_blocks"}
    assert all(r["passed"] for r in rows), [r for r in rows if not r["passed"]]
    assert all(math.isfinite(r["max_abs_err"]) and r["max_abs_err"] >= 0 for r in rows)


def test_bandwidth_numbers(run):
    _, _, data = run
    d = data["sections"]["bandwidth"]["data"]
    assert _positive(d["copy_GBps"])
    assert d["decode"] and d["cache_ops"]
    for r in d["decode"]:
        for k in ("kernel_ms", "kernel_GBps", "frac_of_copy", "sdpa_ms", "gather_ms", "sdpa_over_kernel"):
            assert _positive(r[k]), (k, r)
    for r in d["cache_ops"]:
        assert _positive(r["GBps"]) and _positive(r["time_ms"]), r


def test_end_to_end_numbers(run):
    _, _, data = run
    d = data["sections"]["end_to_end"]["data"]
    eng, hf = d["engine"], d["hf"]
    assert eng["complete"] and eng["finished"] == eng["num_requests"]
    assert _positive(eng["output_tok_per_s"]) and _positive(eng["wall_s"])
    assert eng["output_tokens"] > 0 and eng["preemptions"] >= 0
    assert _positive(hf["useful_tok_per_s"]) and _positive(hf["est_full_useful_tok_per_s"])
    assert hf["batches_run"] >= 1
    assert d["engine_step_log"] and all(_positive(s[2]) for s in d["engine_step_log"])


def test_profile_numbers(run):
    _, _, data = run
    shapes = data["sections"]["profile"]["data"]["shapes"]
    assert [(s["kind"], s["prefill_tokens"] or s["decode_seqs"]) for s in shapes] == [
        ("prefill", 128), ("prefill", 512), ("prefill", 2048), ("decode", 1), ("decode", 16), ("decode", 64)]
    for s in shapes:
        assert _positive(s["median_ms"]) and s["step_s"] and all(_positive(t) for t in s["step_s"]), s


def test_calibration_runs_the_repeated_protocol(run):
    from pagesim.experiments.fidelity_cpu import RUNS

    _, out, data = run
    cal = data["sections"]["calibration"]["data"]
    assert cal["repeat"] == 2
    for label, _, _ in RUNS:
        assert len(cal[label]["speed_vs_profile"]) == 2
        assert [b["runs"] for b in cal[label]["bands"]] == [2] * len(cal[label]["bands"])
        assert cal[label]["step_fidelity"]["all"]["count"] > 0
    saved = json.loads((out.with_name(out.stem + "_fidelity") / "compare.json").read_text())
    assert sorted(saved["systems"]) == sorted(label for label, _, _ in RUNS)
