"""bench_models on a tiny workload: the models alternate within each round, each table median is
the median of the runs it lists, and each ratio is the two medians' (recomputed here from the
table), with the verdict on the CPU ratio against the 1.2 target."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_models_alternate_and_ratios_are_of_the_medians(tmp_path):
    out = tmp_path / "bench.md"
    run = subprocess.run([sys.executable, "-m", "benchmarks.bench_models", "--num-requests", "20", "--repeat", "3",
                          "--models", "llama-3.1-8b,mistral-7b", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    order = [line.split(":")[0] for line in run.stderr.splitlines() if line.startswith("round")]
    assert order == [f"round {r} {m}" for r in (1, 2, 3) for m in ("llama-3.1-8b", "mistral-7b")]
    report = out.read_text()
    assert "python -m benchmarks.bench_models" in report
    table = {}
    for line in report.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("llama-3.1-8b", "mistral-7b"):
            runs = sorted(float(v) for v in cells[2].split(" / "))
            assert len(runs) == 3 and float(cells[3]) == runs[1]
            table[cells[0]] = (float(cells[3]), float(cells[4]))
    assert set(table) == {"llama-3.1-8b", "mistral-7b"}
    ratio_rows = [line for line in report.splitlines() if line.startswith("| mistral-7b / llama-3.1-8b |")]
    assert len(ratio_rows) == 1
    cells = [c.strip() for c in ratio_rows[0].strip("|").split("|")]
    wall, cpu = float(cells[1]), float(cells[2])
    for shown, (top, bottom) in ((wall, (table["mistral-7b"][0], table["llama-3.1-8b"][0])),
                                 (cpu, (table["mistral-7b"][1], table["llama-3.1-8b"][1]))):
        # (medians are rounded to 0.01 s in the table, ratios to 0.01)
        assert (top - 0.005) / (bottom + 0.005) - 0.005 <= shown <= (top + 0.005) / (bottom - 0.005) + 0.005
    assert cells[4] == ("**met**" if cpu <= 1.2 else "**NOT met**") or abs(cpu - 1.2) < 0.01
