"""pagesim/experiments/fidelity_cpu.py --smoke end to end (tiny random model, K=2, five runs): the report,
its data, and that each run's settings reached the executor."""

import json
import statistics

import pytest

pytest.importorskip("torch")


def test_fidelity_report_smoke(tmp_path, capsys):
    from pagesim.experiments import fidelity_cpu

    out, data_dir = tmp_path / "fidelity_cpu.md", tmp_path / "fidelity"
    notes = tmp_path / "fidelity_cpu_notes.md"
    notes.write_text("the lead's analysis\n")
    argv = ["--smoke", "--out", str(out), "--data-dir", str(data_dir)]
    assert fidelity_cpu.main(argv) == 0
    md = out.read_text()
    assert notes.read_text() == "the lead's analysis\n"  # never overwritten
    head = md.split("## Setup")[0]
    assert f"python -m pagesim.experiments.fidelity_cpu --smoke --out {out} --data-dir {data_dir}" in head
    assert "[fidelity_cpu_notes.md](fidelity_cpu_notes.md)" in head
    labels = [label for label, _, _ in fidelity_cpu.RUNS]
    from pagesim.compare import METRICS

    for label in labels:
        # band rows, step kinds + all, one drift row a round, the three headline rows of the speed check
        assert md.count(f"| {label} | ") == len(METRICS) + 6 + 2 + 3
    data = json.loads((data_dir / "compare.json").read_text())
    assert sorted(data["systems"]) == sorted(labels)
    for label, entry in data["systems"].items():
        assert [run["round"] for run in entry["runs"]] == [1, 2]
        # the band's mean is the mean of the runs' summary.json on disk
        on_disk = [json.loads((data_dir / label / "executor" / f"run{r}" / "summary.json").read_text())
                   for r in (1, 2)]
        band = next(b for b in entry["bands"] if b["key"] == "mean_batched_requests")
        assert band["mean"] == pytest.approx(statistics.mean(s["mean_batched_requests"] for s in on_disk))
        assert entry["step_fidelity"]["all"]["count"] == sum(s["num_steps"] for s in on_disk)
        assert (data_dir / label / "executor" / "run2" / "step_shapes.csv").exists()
    runs = data["systems"]
    chunked = runs["paged-recompute-chunked"]["runs"][0]["summary"]
    assert chunked["engine"]["chunked_prefill"] and not runs["paged-recompute"]["runs"][0]["summary"]["engine"]["chunked_prefill"]
    n4 = runs["paged-auto-n4"]["runs"][0]["summary"]
    assert n4["run"]["n"] == 4 and n4["engine"]["preemption"] == "auto" and n4["num_requests"] == 3
    assert (data_dir / "profiles" / "pooled.json").exists() and (data_dir / "profiles" / "round2.json").exists()
    figure = tmp_path / "figures" / "fidelity_cpu.png"  # beside the report, linked from it
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "](figures/fidelity_cpu.png)" in md
    figure.unlink()
    assert "## The same runs with the cost model's bias removed" in md
    capsys.readouterr()
    assert fidelity_cpu.main(["--speed-check", "--smoke", "--data-dir", str(data_dir)]) == 0
    check = capsys.readouterr().out
    for label in labels:  # one row per headline metric; a speed of 1 would reproduce the simulator's point
        assert check.count(f"| {label} | ") == 3
    assert fidelity_cpu.main(["--plot-only", "--out", str(out), "--data-dir", str(data_dir)]) == 0
    assert figure.stat().st_size > 10_000
